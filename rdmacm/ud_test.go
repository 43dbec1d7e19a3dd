package rdmacm

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/softrnic/softrnic/cm"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/port"
	"github.com/softrnic/softrnic/port/memlink"
	"github.com/softrnic/softrnic/rnic"
	"github.com/softrnic/softrnic/verbs"
)

// udQP creates a UD QP on h prepared as rdma_cm does, with n receives of
// GRH + 64 bytes posted.
func (h *host) udQP(t *testing.T, n int) (verbs.QP, *rnic.MR) {
	t.Helper()
	qp, err := h.pd.CreateQP(&verbs.QPInitAttr{Type: ib.UD, SendCQ: h.cq, RecvCQ: h.cq,
		Cap: ib.QPCaps{MaxSendWR: 16, MaxRecvWR: uint32(max(n, 1)), MaxSendSGE: 1, MaxRecvSGE: 1, MaxInline: 64}})
	if err != nil {
		t.Fatal(err)
	}
	if err := PrepareUD(qp); err != nil {
		t.Fatal(err)
	}
	mr, err := h.pd.RegBytes(make([]byte, (grhLen+64)*max(n, 1)), 0, ib.LocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if _, err := qp.PostRecv([]verbs.RecvWR{{ID: uint64(i), SG: []ib.SGE{{Addr: mr.IOVA() + uint64((grhLen+64)*i), Length: grhLen + 64, LKey: mr.LKey()}}}}); err != nil {
			t.Fatal(err)
		}
	}
	return qp, mr
}

// TestUDResolveAndSend: B looks up A's UD service (SIDR_REQ with the
// rdma_cm header and private data, SIDR_REP with A's QPN and rdma_cm's
// Q_Key), then sends a datagram to it that A receives; a datagram with
// another Q_Key is dropped, as the Q_Key is the only protection UD has.
func TestUDResolveAndSend(t *testing.T) {
	a, b := pair(t, nil)
	ln, err := a.agent.ListenUD(7175, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.agent.ListenUD(7175, 0); !errors.Is(err, ErrListening) {
		t.Fatalf("second ListenUD on the port: %v", err)
	}
	qa, mra := a.udQP(t, 2)
	ctx := ctx10(t)
	type got struct {
		priv []byte
		err  error
	}
	acc := make(chan got, 1)
	go func() {
		r, err := ln.GetRequest(ctx)
		if err != nil {
			acc <- got{err: err}
			return
		}
		if r.Peer() != ipB || r.SrcPort() == 0 {
			acc <- got{err: errors.New("request from " + r.Peer().String())}
			return
		}
		if _, err := r.AV(); err != nil {
			acc <- got{err: err}
			return
		}
		acc <- got{priv: append([]byte(nil), r.PrivateData()...), err: r.Accept(qa, []byte("rep"))}
	}()
	peer, err := b.agent.ResolveUD(ctx, ipA, 7175, []byte("hello"))
	if err != nil {
		t.Fatal(err)
	}
	g := <-acc
	if g.err != nil {
		t.Fatal(g.err)
	}
	if !bytes.HasPrefix(g.priv, []byte("hello")) {
		t.Fatalf("listener saw private data %q", g.priv[:8])
	}
	if peer.QPN != qa.QPN() || peer.QKey != UDPQKey || !bytes.HasPrefix(peer.PrivateData, []byte("rep")) || peer.AV.DMAC != macA {
		t.Fatalf("resolved %+v, want QPN %#x Q_Key %#x", peer, qa.QPN(), UDPQKey)
	}
	qb, _ := b.udQP(t, 0)
	ah, err := b.pd.CreateAH(&peer.AV)
	if err != nil {
		t.Fatal(err)
	}
	send := func(id uint64, qkey uint32, msg string) {
		if _, err := qb.PostSend([]verbs.SendWR{{ID: id, Opcode: ib.Send, Flags: ib.Signaled | ib.Inline,
			InlineData: []byte(msg), AH: ah, RemoteQPN: peer.QPN, RemoteQKey: qkey}}); err != nil {
			t.Fatal(err)
		}
		if wc := waitWC(t, b.cq, qb.QPN()); wc.Status != ib.Success {
			t.Fatalf("send completion %+v", wc)
		}
	}
	send(1, UDPQKey+1, "wrong qkey") // dropped by A's QP: nothing to receive
	send(2, peer.QKey, "datagram")
	wc := waitWC(t, a.cq, qa.QPN())
	if wc.Status != ib.Success || wc.ByteLen != grhLen+8 || wc.SrcQP != qb.QPN() {
		t.Fatalf("receive %+v", wc)
	}
	buf := mra.Bytes()[(grhLen+64)*int(wc.ID):]
	if string(buf[grhLen:grhLen+8]) != "datagram" {
		t.Fatalf("received %q (the wrong Q_Key's datagram was delivered?)", buf[grhLen:grhLen+16])
	}
}

// TestUDRefused: nobody listening answers "unsupported", a listener's
// Reject answers "reject", and both reach ResolveUD as a *SIDRError.
func TestUDRefused(t *testing.T) {
	a, b := pair(t, nil)
	ctx := ctx10(t)
	var se *SIDRError
	if _, err := b.agent.ResolveUD(ctx, ipA, 7176, nil); !errors.As(err, &se) || se.Status != cm.SIDRUnsupported {
		t.Fatalf("no listener: %v", err)
	}
	ln, err := a.agent.ListenUD(7176, 0)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		if r, err := ln.GetRequest(ctx); err == nil {
			if err := r.Reject([]byte("no")); err != nil {
				t.Error(err)
			}
		}
	}()
	if _, err := b.agent.ResolveUD(ctx, ipA, 7176, nil); !errors.As(err, &se) || se.Status != cm.SIDRReject || !bytes.HasPrefix(se.PrivateData, []byte("no")) {
		t.Fatalf("rejected: %v", err)
	}
	ln.Close()
	if _, err := ln.GetRequest(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("GetRequest after Close: %v", err)
	}
}

// TestUDLostSIDR: the first SIDR_REQ and the first SIDR_REP are lost; the
// requester's retransmission gets the answer (the listener's duplicate
// detection re-sends its kept SIDR_REP instead of asking the application
// again), and a resolve nobody answers ends in ErrTimeout.
func TestUDLostSIDR(t *testing.T) {
	var reqs, reps atomic.Int32
	var repsAll atomic.Bool
	var dropB, dropA *dropPort
	a, b := pairCM(t, fastCM, memlink.Impairments{}, func(p port.Port) port.Port {
		dropA = &dropPort{Port: p, drop: func(f []byte) bool { return madAttr(f) == cm.AttrSIDRREP && (repsAll.Load() || reps.Add(1) == 1) }}
		return dropA
	}, func(p port.Port) port.Port {
		dropB = &dropPort{Port: p, drop: func(f []byte) bool { return madAttr(f) == cm.AttrSIDRREQ && reqs.Add(1) == 1 }}
		return dropB
	})
	ln, err := a.agent.ListenUD(7177, 0)
	if err != nil {
		t.Fatal(err)
	}
	qa, _ := a.udQP(t, 0)
	ctx := ctx10(t)
	taken := make(chan int, 4)
	go func() {
		for {
			r, err := ln.GetRequest(ctx)
			if err != nil {
				return
			}
			taken <- 1
			if err := r.Accept(qa, nil); err != nil {
				t.Error(err)
			}
		}
	}()
	peer, err := b.agent.ResolveUD(ctx, ipA, 7177, nil)
	if err != nil {
		t.Fatal(err)
	}
	if peer.QPN != qa.QPN() || dropA.dropped.Load() != 1 || dropB.dropped.Load() != 1 {
		t.Fatalf("resolved %+v; dropped REP %d REQ %d", peer, dropA.dropped.Load(), dropB.dropped.Load())
	}
	if len(taken) != 1 {
		t.Fatalf("the application saw the request %d times", len(taken))
	}
	if _, st := b.agent.Stats(); st.Retransmits < 2 {
		t.Fatalf("requester retransmissions %d, want >= 2", st.Retransmits)
	}
	// Nobody at this address answers at all.
	short, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ln.Close()
	repsAll.Store(true)
	if _, err := b.agent.ResolveUD(short, ipA, 7178, nil); !errors.Is(err, ErrTimeout) {
		t.Fatalf("unanswered: %v", err)
	}
}

package rdmacm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/cm"
	"github.com/softrnic/softrnic/engine"
	"github.com/softrnic/softrnic/frame"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/checker"
	"github.com/softrnic/softrnic/internal/ibtest"
	"github.com/softrnic/softrnic/port"
	"github.com/softrnic/softrnic/port/memlink"
	"github.com/softrnic/softrnic/rnic"
	"github.com/softrnic/softrnic/verbs"
)

// runEngine drives a device on a port until ctx ends. The engine loop may
// move from daemon to engine: this is the one place to change.
func runEngine(ctx context.Context, dev *rnic.Device, p port.Port) error {
	return engine.Run(ctx, dev, p, engine.Options{})
}

// dropPort drops the frames drop says to, as a lossy link would, and
// counts them.
type dropPort struct {
	port.Port
	drop    func(f []byte) bool
	dropped atomic.Int64
}

func (d *dropPort) Submit(frames [][]byte) (int, error) {
	for i, f := range frames {
		if len(f) > 0 && d.drop(f) {
			d.dropped.Add(1)
			frames[i] = f[:0] // its buffer goes back unsent
		}
	}
	return d.Port.Submit(frames)
}

// madAttr returns the CM attribute of a frame carrying a MAD to QP1 (0
// for any other frame).
func madAttr(b []byte) cm.AttrID {
	var f frame.Frame
	if frame.Parse(b, &f) != nil {
		return 0
	}
	p := checker.Decode(checker.TransportOf(&f))
	if p.Op != bth.UDSendOnly || p.DestQP != 1 || len(p.Payload) < cm.MADSize {
		return 0
	}
	return cm.MAD(p.Payload).AttrID()
}

type host struct {
	dev   *rnic.Device
	agent *Agent
	ip    netip.Addr
	pd    *rnic.PD
	cq    *rnic.CQ
}

func newHostObjects(dev *rnic.Device) (*rnic.PD, *rnic.CQ) {
	pd, _ := dev.AllocPD()
	cq, err := dev.CreateCQ(4096)
	if err != nil {
		panic(err)
	}
	return pd.(*rnic.PD), cq.(*rnic.CQ)
}

var (
	ipA, ipB   = netip.MustParseAddr("10.9.0.1"), netip.MustParseAddr("10.9.0.2")
	macA, macB = [6]byte{2, 0, 0, 0, 9, 1}, [6]byte{2, 0, 0, 0, 9, 2}
	ip6A, ip6B = netip.MustParseAddr("fd00:9::1"), netip.MustParseAddr("fd00:9::2")
)

// testCM is the CM of the tests that do not test its timers: timers a
// loaded machine's scheduling delays (every package's tests at once on 2
// CPUs) cannot run out, short enough that a MAD lost now and then costs a
// fraction of a second. Response timeout 268 ms with a packet life time
// of 1 ms, 16 tries (≈ 4.3 s); with rxe's CA ACK delay, a local ACK
// timeout of 134 ms for the RC QPs (8 tries, ≈ 1 s), and about as long a
// time-wait (TestEventCMConnect waits for its end).
var testCM = cm.Config{CMResponseTimeout: 16, PacketLifeTime: 8, MaxCMRetries: 15, TargetACKDelay: 15}

// fastCM shortens the CM's timers so that retransmissions and give-ups
// happen in milliseconds: response timeout 4.2 ms, packet life time 1 ms,
// 7 tries (≈ 44 ms), and with a CA ACK delay of 1 ms a local ACK timeout
// of 4 ms for the RC QPs. Only the tests that wait for a give-up use it: a
// goroutine starved for as long ends a connection.
var fastCM = cm.Config{CMResponseTimeout: 10, PacketLifeTime: 8, MaxCMRetries: 6, TargetACKDelay: 8}

// lossCM is for the tests that lose MADs on purpose but never wait for a
// give-up: fastCM's millisecond retransmissions with the most tries (16,
// ≈ 100 ms), and a local ACK timeout of 67 ms (8 tries, ≈ 0.5 s).
var lossCM = cm.Config{CMResponseTimeout: 10, PacketLifeTime: 8, MaxCMRetries: 15, TargetACKDelay: 14}

// pair starts two devices (A and B) on a real-time memlink, their engines
// and their CM agents, with testCM; wrapB may interpose on B's port.
func pair(t *testing.T, wrapB func(port.Port) port.Port) (a, b *host) {
	return pairCM(t, testCM, memlink.Impairments{}, nil, wrapB)
}

func pairCM(t *testing.T, cmc cm.Config, imp memlink.Impairments, wrapA, wrapB func(port.Port) port.Port) (a, b *host) {
	t.Helper()
	la, lb := memlink.NewPair(memlink.Config{Seed: 7, Impairments: imp})
	pa, pb := port.Port(la), port.Port(lb)
	if wrapA != nil {
		pa = wrapA(pa)
	}
	if wrapB != nil {
		pb = wrapB(pb)
	}
	macs := map[netip.Addr][6]byte{ipA: macA, ipB: macB, ip6A: macA, ip6B: macB}
	resolve := func(_ context.Context, peer netip.Addr) ([6]byte, error) {
		if m, ok := macs[peer]; ok {
			return m, nil
		}
		return [6]byte{}, errors.New("no neighbour")
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	mk := func(mac [6]byte, ip, ip6 netip.Addr, p port.Port, seed uint64) *host {
		dev, err := rnic.NewDevice(rnic.Config{MAC: mac, Addrs: []netip.Addr{ip, ip6}})
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := runEngine(ctx, dev, p); err != nil && !errors.Is(err, context.Canceled) {
				t.Error(err)
			}
		}()
		cfg := cmc
		cfg.Seed = seed
		ag, err := New(Config{Device: dev, Resolve: resolve, CM: cfg})
		if err != nil {
			t.Fatal(err)
		}
		pd, cq := newHostObjects(dev)
		return &host{dev: dev, agent: ag, ip: ip, pd: pd, cq: cq}
	}
	a = mk(macA, ipA, ip6A, pa, 1)
	b = mk(macB, ipB, ip6B, pb, 2)
	t.Cleanup(func() {
		a.agent.Close()
		b.agent.Close()
		cancel()
		wg.Wait()
		la.Close()
		lb.Close()
	})
	return a, b
}

// tconn is one connection's QP to be on h: rdma_conn_param, and n
// receives of 64 bytes posted once the QP is in INIT.
type tconn struct {
	ConnParam
	t    *testing.T
	h    *host
	n    int
	mr   *rnic.MR
	made verbs.QP // the QP newQP made last
}

// params is a connection on h with n receives posted.
func (h *host) params(t *testing.T, n int) (*tconn, *rnic.MR) {
	mr, err := h.pd.RegBytes(make([]byte, 64*max(n, 1)), 0, ib.LocalWrite|ib.RemoteWrite|ib.RemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	return &tconn{ConnParam: ConnParam{Access: ib.LocalWrite | ib.RemoteWrite | ib.RemoteRead, ResponderResources: 4,
		InitiatorDepth: 4}, t: t, h: h, n: n, mr: mr}, mr
}

// newQP makes the connection's RC QP, in INIT with its receives posted.
func (p *tconn) newQP() (verbs.QP, error) {
	q, err := p.h.pd.CreateQP(&verbs.QPInitAttr{Type: ib.RC, SendCQ: p.h.cq, RecvCQ: p.h.cq,
		Cap: ib.QPCaps{MaxSendWR: 16, MaxRecvWR: uint32(max(p.n, 1)), MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		return nil, err
	}
	if err := InitQP(q, &p.ConnParam); err != nil {
		return nil, err
	}
	for i := range p.n {
		wr := []verbs.RecvWR{{ID: uint64(i), SG: []ib.SGE{{Addr: p.mr.IOVA() + uint64(64*i), Length: 64, LKey: p.mr.LKey()}}}}
		if _, err := q.PostRecv(wr); err != nil {
			return nil, err
		}
	}
	p.made = q
	return q, nil
}

// accept takes the next request of l with a QP of p's.
func accept(ctx context.Context, l Listener, p *tconn) (Conn, error) {
	return AcceptNext(ctx, l, p.newQP, &p.ConnParam)
}

// acceptReq accepts r with a QP of p's.
func acceptReq(ctx context.Context, r Request, p *tconn) (Conn, error) {
	q, err := p.newQP()
	if err != nil {
		return nil, err
	}
	return r.Accept(ctx, q, &p.ConnParam)
}

// dial connects a QP of p's to port at peer through a.
func dial(ctx context.Context, a *Agent, peer netip.Addr, port uint16, p *tconn) (Conn, error) {
	q, err := p.newQP()
	if err != nil {
		return nil, err
	}
	return a.Connect(ctx, q, peer, port, &p.ConnParam)
}

// waitWC polls cq until a completion of qp arrives.
func waitWC(t *testing.T, cq *rnic.CQ, qpn uint32) ib.WC {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wc [1]ib.WC
	for {
		if _, err := cq.PollWait(ctx, wc[:]); err != nil {
			t.Fatalf("no completion on QP %#x: %v", qpn, err)
		}
		if wc[0].QPN == qpn {
			return wc[0]
		}
	}
}

func ctx10(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestConnectDataDisconnect: B dials A's listener; a SEND and an RDMA
// WRITE go over the connected QP, private data both ways; B disconnects
// and A's side learns it (DREQ), its QP in the error state.
func TestConnectDataDisconnect(t *testing.T) {
	a, b := pair(t, nil)
	ln, err := a.agent.Listen(7174, 0)
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctx10(t)
	type res struct {
		c   Conn
		err error
	}
	srv := make(chan res, 1)
	pa, mra := a.params(t, 1)
	pa.PrivateData = []byte("rep-data")
	go func() {
		c, err := accept(ctx, ln, pa)
		srv <- res{c, err}
	}()
	pb, mrb := b.params(t, 0)
	pb.PrivateData = []byte("req-data")
	cb, err := dial(ctx, b.agent, ipA, 7174, pb)
	if err != nil {
		t.Fatal(err)
	}
	r := <-srv
	if r.err != nil {
		t.Fatal(r.err)
	}
	ca := r.c
	if !bytes.HasPrefix(cb.PrivateData(), []byte("rep-data")) || !bytes.Equal(ca.PrivateData()[:8], []byte("req-data")) {
		t.Fatalf("private data: client got %q, server got %q", cb.PrivateData()[:8], ca.PrivateData()[:8])
	}
	if ca.Peer() != ipB || cb.Peer() != ipA || cb.QP().State() != ib.RTS {
		t.Fatalf("peers %v %v, client QP %v", ca.Peer(), cb.Peer(), cb.QP().State())
	}
	// SEND B → A.
	copy(mrb.Bytes(), "hello over rdmacm")
	if _, err := cb.QP().PostSend([]verbs.SendWR{{ID: 1, Opcode: ib.Send, Flags: ib.Signaled,
		SG: []ib.SGE{{Addr: mrb.IOVA(), Length: 17, LKey: mrb.LKey()}}}}); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, b.cq, cb.QP().QPN()); wc.Status != ib.Success {
		t.Fatalf("send: %v", wc.Status)
	}
	if wc := waitWC(t, a.cq, ca.QP().QPN()); wc.Status != ib.Success || wc.ByteLen != 17 || string(mra.Bytes()[:17]) != "hello over rdmacm" {
		t.Fatalf("recv: %+v %q", wc, mra.Bytes()[:17])
	}
	// The server's QP is in RTS (RTU or COMM_EST): it can RDMA WRITE back.
	copy(mra.Bytes()[32:], "written back")
	if _, err := ca.QP().PostSend([]verbs.SendWR{{ID: 2, Opcode: ib.RDMAWrite, Flags: ib.Signaled,
		SG: []ib.SGE{{Addr: mra.IOVA() + 32, Length: 12, LKey: mra.LKey()}}, RemoteAddr: mrb.IOVA() + 40, RKey: mrb.RKey()}}); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, a.cq, ca.QP().QPN()); wc.Status != ib.Success || string(mrb.Bytes()[40:52]) != "written back" {
		t.Fatalf("write: %v %q", wc.Status, mrb.Bytes()[40:52])
	}
	if err := cb.Disconnect(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ca.Done():
	case <-ctx.Done():
		t.Fatal("server never saw the disconnection")
	}
	if !errors.Is(ca.Err(), ErrDisconnected) || ca.QP().State() != ib.Err || cb.QP().State() != ib.Err {
		t.Fatalf("after disconnect: %v, QPs %v %v", ca.Err(), ca.QP().State(), cb.QP().State())
	}
	_, sa := a.agent.Stats()
	_, sb := b.agent.Stats()
	// Client sent REQ, RTU, DREQ; server REP, DREP (more than once only if
	// the machine was slow enough for a retransmission).
	if sb.Tx[0] < 1 || sb.Tx[4] < 1 || sb.Tx[5] < 1 || sa.Tx[3] < 1 || sa.Tx[6] < 1 || sa.Rx[0] < 1 || sb.Rx[3] < 1 {
		t.Fatalf("CM stats: client %+v server %+v", sb, sa)
	}
	ca.Close()
	cb.Close()
}

// TestRejectNoListener: a REQ for a port nobody listens on gets REJ with
// reason 8 (invalid service ID), as the kernel CM answers.
func TestRejectNoListener(t *testing.T) {
	a, b := pair(t, nil)
	_ = a
	p, _ := b.params(t, 0)
	_, err := dial(ctx10(t), b.agent, ipA, 4242, p)
	var rej *RejectedError
	if !errors.As(err, &rej) || rej.Reason != cm.RejInvalidServiceID {
		t.Fatalf("dial without listener: %v", err)
	}
	if rej.Reason != 8 {
		t.Fatalf("reason %d", rej.Reason)
	}
}

// TestRejectByApplication: Request.Reject sends REJ consumer defined with
// the application's private data.
func TestRejectByApplication(t *testing.T) {
	a, b := pair(t, nil)
	ln, err := a.agent.Listen(5000, 0)
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctx10(t)
	go func() {
		if r, err := ln.GetRequest(ctx); err == nil {
			if err := r.Reject([]byte("go away")); err != nil {
				t.Error(err)
			}
		}
	}()
	p, _ := b.params(t, 0)
	_, err = dial(ctx, b.agent, ipA, 5000, p)
	var rej *RejectedError
	if !errors.As(err, &rej) || rej.Reason != cm.RejConsumerDefined || !bytes.HasPrefix(rej.PrivateData, []byte("go away")) {
		t.Fatalf("%v", err)
	}
}

// TestREQRetransmittedUnderLoss: the first two REQs are lost on the wire;
// the CM sends the REQ again on its response timeout and the connection
// comes up, and data flows.
func TestREQRetransmittedUnderLoss(t *testing.T) {
	var dp *dropPort
	var lost atomic.Int64
	a, b := pairCM(t, lossCM, memlink.Impairments{}, nil, func(p port.Port) port.Port {
		dp = &dropPort{Port: p, drop: func(f []byte) bool {
			return madAttr(f) == cm.AttrREQ && lost.Add(1) <= 2
		}}
		return dp
	})
	ln, _ := a.agent.Listen(7174, 0)
	ctx := ctx10(t)
	pa, _ := a.params(t, 1)
	accepted := make(chan error, 1)
	go func() { _, err := accept(ctx, ln, pa); accepted <- err }()
	pb, mrb := b.params(t, 0)
	cb, err := dial(ctx, b.agent, ipA, 7174, pb)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-accepted; err != nil {
		t.Fatal(err)
	}
	if dp.dropped.Load() != 2 {
		t.Fatalf("dropped %d REQs", dp.dropped.Load())
	}
	_, sb := b.agent.Stats()
	if sb.Retransmits < 2 || sb.Tx[0] < 3 {
		t.Fatalf("client CM stats %+v", sb)
	}
	if _, err := cb.QP().PostSend([]verbs.SendWR{{ID: 1, Opcode: ib.Send, Flags: ib.Signaled,
		SG: []ib.SGE{{Addr: mrb.IOVA(), Length: 8, LKey: mrb.LKey()}}}}); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, b.cq, cb.QP().QPN()); wc.Status != ib.Success {
		t.Fatalf("send after retransmitted REQ: %v", wc.Status)
	}
}

// TestRTULost: the RTU never arrives; the passive side's QP, left in RTR,
// sees the client's first SEND, raises COMM_EST, and the agent
// establishes the connection from it (IBA 12.9.6).
func TestRTULost(t *testing.T) {
	a, b := pair(t, func(p port.Port) port.Port {
		return &dropPort{Port: p, drop: func(f []byte) bool { return madAttr(f) == cm.AttrRTU }}
	})
	ln, _ := a.agent.Listen(7174, 0)
	ctx := ctx10(t)
	pa, _ := a.params(t, 1)
	srv := make(chan Conn, 1)
	go func() {
		c, err := accept(ctx, ln, pa)
		if err != nil {
			t.Error(err)
		}
		srv <- c
	}()
	pb, mrb := b.params(t, 0)
	cb, err := dial(ctx, b.agent, ipA, 7174, pb)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cb.QP().PostSend([]verbs.SendWR{{ID: 1, Opcode: ib.Send, Flags: ib.Signaled,
		SG: []ib.SGE{{Addr: mrb.IOVA(), Length: 8, LKey: mrb.LKey()}}}}); err != nil {
		t.Fatal(err)
	}
	ca := <-srv
	if ca == nil {
		t.FailNow()
	}
	if ca.QP().State() != ib.RTS {
		t.Fatalf("server QP %v", ca.QP().State())
	}
	if s, _ := a.agent.Stats(); s.CommEstFixes != 1 {
		t.Fatalf("agent stats %+v", s)
	}
}

// TestManyConnections: 24 connections at once between the same two
// devices, each carrying its own message, then all disconnected.
func TestManyConnections(t *testing.T) {
	const n = 24
	// The server accepts one at a time: requests queued behind others get
	// an MRA, which keeps their active side waiting instead of giving up.
	a, b := pair(t, nil)
	ln, _ := a.agent.Listen(7174, n)
	ctx := ctx10(t)
	type side struct {
		c  Conn
		mr *rnic.MR
	}
	srv := make(chan side, n)
	go func() {
		for range n {
			p, mr := a.params(t, 1)
			c, err := accept(ctx, ln, p)
			if err != nil {
				t.Error(err)
				return
			}
			srv <- side{c, mr}
		}
	}()
	cli := make([]side, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, mr := b.params(t, 0)
			c, err := dial(ctx, b.agent, ipA, 7174, p)
			if err != nil {
				errs <- fmt.Errorf("dial %d: %w", i, err)
				return
			}
			cli[i] = side{c, mr}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	byQPN := map[uint32]side{}
	for range n {
		s := <-srv
		byQPN[s.c.QP().QPN()] = s
	}
	if len(byQPN) != n {
		t.Fatalf("%d distinct server QPs", len(byQPN))
	}
	for i, s := range cli {
		msg := fmt.Sprintf("conn %02d", i)
		copy(s.mr.Bytes(), msg)
		if _, err := s.c.QP().PostSend([]verbs.SendWR{{ID: uint64(i), Opcode: ib.Send, Flags: ib.Signaled,
			SG: []ib.SGE{{Addr: s.mr.IOVA(), Length: uint32(len(msg)), LKey: s.mr.LKey()}}}}); err != nil {
			t.Fatal(err)
		}
	}
	// Every server QP receives one message, and every client's message
	// arrives once: the CM paired the QPs right.
	got := 0
	var wc [16]ib.WC
	for got < n {
		k, err := a.cq.PollWait(ctx, wc[:])
		if err != nil {
			t.Fatalf("%d of %d receives: %v", got, n, err)
		}
		for _, w := range wc[:k] {
			if w.Status != ib.Success || byQPN[w.QPN].c == nil || w.ByteLen != 7 {
				t.Fatalf("%+v", w)
			}
			got++
		}
	}
	seen := map[string]bool{}
	for _, s := range byQPN {
		seen[string(s.mr.Bytes()[:7])] = true
	}
	for i := range n {
		if !seen[fmt.Sprintf("conn %02d", i)] {
			t.Fatalf("message of connection %d not received (%v)", i, seen)
		}
	}
	for _, s := range cli {
		if err := s.c.Disconnect(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range byQPN {
		select {
		case <-s.c.Done():
		case <-ctx.Done():
			t.Fatal("a server connection never saw its DREQ")
		}
	}
	if s, _ := a.agent.Stats(); s.MRAs == 0 {
		t.Logf("no request waited behind another (agent %+v)", s)
	}
}

// TestIPv6: a connection between IPv6 GIDs: the rdma_cm header carries
// IPv6 addresses, MADs and the RC QP use the IPv6 GID (index 1).
func TestIPv6(t *testing.T) {
	a, b := pair(t, nil)
	ln, _ := a.agent.Listen(7174, 0)
	ctx := ctx10(t)
	pa, mra := a.params(t, 1)
	type res struct {
		c   Conn
		r   Request
		err error
	}
	srv := make(chan res, 1)
	go func() {
		r, err := ln.GetRequest(ctx)
		if err != nil {
			srv <- res{err: err}
			return
		}
		c, err := acceptReq(ctx, r, pa)
		srv <- res{c, r, err}
	}()
	pb, mrb := b.params(t, 0)
	cb, err := dial(ctx, b.agent, ip6A, 7174, pb)
	if err != nil {
		t.Fatal(err)
	}
	s := <-srv
	if s.err != nil {
		t.Fatal(s.err)
	}
	if s.r.Peer() != ip6B || s.c.Peer() != ip6B || s.r.SrcPort() < 32768 {
		t.Fatalf("request from %v port %d", s.r.Peer(), s.r.SrcPort())
	}
	copy(mrb.Bytes(), "over v6")
	if _, err := cb.QP().PostSend([]verbs.SendWR{{ID: 1, Opcode: ib.Send, Flags: ib.Signaled,
		SG: []ib.SGE{{Addr: mrb.IOVA(), Length: 7, LKey: mrb.LKey()}}}}); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, a.cq, s.c.QP().QPN()); wc.Status != ib.Success || string(mra.Bytes()[:7]) != "over v6" || wc.SrcIP.IsValid() && wc.SrcIP != ip6B {
		t.Fatalf("%+v %q", wc, mra.Bytes()[:7])
	}
	if err := s.c.Disconnect(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-cb.Done():
	case <-ctx.Done():
		t.Fatal("client never saw the server's DREQ")
	}
}

// TestBacklog: with nobody accepting, a second REQ finds the backlog of
// one full and is rejected (no resources); the first expires when the
// active side gives up, and accepting it then says so.
func TestBacklog(t *testing.T) {
	a, b := pairCM(t, fastCM, memlink.Impairments{}, nil, nil)
	ln, _ := a.agent.Listen(7174, 1)
	ctx := ctx10(t)
	first := make(chan error, 1)
	p1, _ := b.params(t, 0)
	go func() {
		_, err := dial(ctx, b.agent, ipA, 7174, p1)
		first <- err
	}()
	// Wait until the first REQ sits in the backlog.
	for i := 0; len(ln.(*listener).backlog) == 0; i++ {
		if i > 5000 {
			t.Fatal("first REQ never reached the backlog")
		}
		time.Sleep(time.Millisecond)
	}
	p2, _ := b.params(t, 0)
	_, err := dial(ctx, b.agent, ipA, 7174, p2)
	var rej *RejectedError
	if !errors.As(err, &rej) || rej.Reason != cm.RejNoResources {
		t.Fatalf("second dial: %v", err)
	}
	err = <-first
	if !errors.Is(err, ErrTimeout) && !(errors.As(err, &rej) && rej.Reason == cm.RejTimeout) {
		t.Fatalf("first dial: %v", err)
	}
	r, err := ln.GetRequest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The passive side expires the request on its own timer, which may
	// run a little after the active side gave up.
	pa, _ := a.params(t, 0)
	for i := 0; ; i++ {
		c, err := acceptReq(ctx, r, pa)
		if errors.Is(err, ErrRequestExpired) {
			break
		}
		if err == nil {
			c.Close()
			t.Fatal("expired request accepted")
		}
		if i > 100 {
			t.Fatalf("accept of an expired request: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The second dial's refusal is counted. Under CPU load the first
	// dial's last REQ retry can reach a (the timers here are milliseconds)
	// after a expired that request on its own deadline; a then sees a new
	// REQ, the stale request still fills the backlog, and it is refused
	// and counted again.
	if s, ms := a.agent.Stats(); s.BacklogFull < 1 || s.BacklogFull > ms.Tx[cm.AttrREJ-cm.AttrREQ] {
		t.Fatalf("%+v\n%+v", s, ms)
	}
}

// TestHostileGSITraffic: datagrams to QP1 that are not CM MADs (short,
// long, not from QP1, garbage of the right size) are counted and dropped;
// the agent goes on and a connection afterwards works.
func TestHostileGSITraffic(t *testing.T) {
	a, b := pair(t, nil)
	pd, cq := newHostObjects(b.dev)
	// A UD QP of our own on B, sending to A's QP1 with the GSI Q_Key.
	q, err := pd.CreateQP(&verbs.QPInitAttr{Type: ib.UD, SendCQ: cq, RecvCQ: cq, Cap: ib.QPCaps{MaxSendWR: 16, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInline: 300}})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []ib.QPState{ib.Init, ib.RTR, ib.RTS} {
		if err := ibtest.Modify(q, s, &ib.QPAttr{QKey: 0x80010000}); err != nil {
			t.Fatal(err)
		}
	}
	ah, err := pd.CreateAH(&ib.AddressVector{DMAC: macA, DGID: ib.GIDFrom(ipA)})
	if err != nil {
		t.Fatal(err)
	}
	garbage := make([]byte, 256)
	for i := range garbage {
		garbage[i] = byte(i * 7)
	}
	for i, n := range []int{0, 1, 100, 255, 256, 257, 300} {
		if _, err := q.PostSend([]verbs.SendWR{{ID: uint64(i), Opcode: ib.Send, Flags: ib.Signaled | ib.Inline,
			InlineData: append(garbage[:0:0], make([]byte, n)...)[:n], AH: ah, RemoteQPN: 1, RemoteQKey: 0x80010000}}); err != nil {
			t.Fatal(err)
		}
	}
	// 256 bytes from a QP other than QP1: not a CM MAD either.
	if _, err := q.PostSend([]verbs.SendWR{{ID: 9, Opcode: ib.Send, Flags: ib.Signaled | ib.Inline,
		InlineData: garbage, AH: ah, RemoteQPN: 1, RemoteQKey: 0x80010000}}); err != nil {
		t.Fatal(err)
	}
	// 256 bytes of garbage from B's QP1: the Manager refuses it.
	b.agent.mu.Lock()
	b.agent.macs[ipA] = macA
	var bad cm.Send
	bad.To = ipA
	copy(bad.MAD[:], garbage)
	b.agent.sendLocked(&bad)
	b.agent.mu.Unlock()
	deadline := time.Now().Add(5 * time.Second)
	for {
		s, ms := a.agent.Stats()
		if s.RxBad+s.RxMADs >= 9 {
			if s.RxMADs != 1 || s.RxBad != 8 || ms.Malformed+ms.Unsupported != 1 {
				t.Fatalf("agent %+v manager %+v", s, ms)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("datagrams not seen: agent %+v manager %+v", s, ms)
		}
		time.Sleep(time.Millisecond)
	}
	ln, _ := a.agent.Listen(7174, 0)
	ctx := ctx10(t)
	pa, _ := a.params(t, 1)
	accepted := make(chan error, 1)
	go func() { _, err := accept(ctx, ln, pa); accepted <- err }()
	pb, _ := b.params(t, 0)
	if _, err := dial(ctx, b.agent, ipA, 7174, pb); err != nil {
		t.Fatal(err)
	}
	if err := <-accepted; err != nil {
		t.Fatal(err)
	}
}

// TestDialCancelled: a Connect whose REQs all vanish returns when its
// context ends, the agent forgets it, and its QP is the application's
// again.
func TestDialCancelled(t *testing.T) {
	// testCM: its first retry is far off, so the context ends the dial
	// and not the CM's give-up, however late this goroutine runs.
	_, b := pair(t, func(p port.Port) port.Port {
		return &dropPort{Port: p, drop: func(f []byte) bool { return madAttr(f) == cm.AttrREQ }}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	p, _ := b.params(t, 0)
	if _, err := dial(ctx, b.agent, ipA, 7174, p); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("%v", err)
	}
	b.agent.mu.Lock()
	_, kept := b.agent.byQPN[p.made.QPN()]
	b.agent.mu.Unlock()
	if kept {
		t.Fatal("the agent still holds the cancelled connection")
	}
	if err := p.made.Destroy(); err != nil {
		t.Fatal(err)
	}
}

// TestAgentCloseDisconnects: closing an agent sends DREQ for its live
// connections; the peer's side ends.
func TestAgentCloseDisconnects(t *testing.T) {
	a, b := pair(t, nil)
	ln, _ := a.agent.Listen(7174, 0)
	ctx := ctx10(t)
	pa, _ := a.params(t, 1)
	srv := make(chan Conn, 1)
	go func() { c, _ := accept(ctx, ln, pa); srv <- c }()
	pb, _ := b.params(t, 0)
	cb, err := dial(ctx, b.agent, ipA, 7174, pb)
	if err != nil {
		t.Fatal(err)
	}
	ca := <-srv
	if ca == nil {
		t.Fatal("accept failed")
	}
	b.agent.Close()
	select {
	case <-ca.Done():
	case <-ctx.Done():
		t.Fatal("peer never saw the DREQ of a closing agent")
	}
	if !errors.Is(cb.Err(), ErrClosed) || !errors.Is(ca.Err(), ErrDisconnected) {
		t.Fatalf("client %v, server %v", cb.Err(), ca.Err())
	}
}

// TestLossyLink: 10 % of the frames lost both ways, CM MADs included:
// connections still come up, carry a message and go down, REQ, REP, RTU,
// DREQ and DREP losses repaired by the CM's retransmissions and duplicate
// answers (and COMM_EST for lost RTUs).
func TestLossyLink(t *testing.T) {
	a, b := pairCM(t, lossCM, memlink.Impairments{Loss: 0.1}, nil, nil)
	ln, _ := a.agent.Listen(7174, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const rounds = 12
	for i := range rounds {
		pa, mra := a.params(t, 1)
		srv := make(chan Conn, 1)
		go func() {
			c, err := accept(ctx, ln, pa)
			if err != nil {
				t.Errorf("accept %d: %v", i, err)
			}
			srv <- c
		}()
		pb, mrb := b.params(t, 0)
		cb, err := dial(ctx, b.agent, ipA, 7174, pb)
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		msg := fmt.Sprintf("round %02d", i)
		copy(mrb.Bytes(), msg)
		if _, err := cb.QP().PostSend([]verbs.SendWR{{ID: 1, Opcode: ib.Send, Flags: ib.Signaled,
			SG: []ib.SGE{{Addr: mrb.IOVA(), Length: uint32(len(msg)), LKey: mrb.LKey()}}}}); err != nil {
			t.Fatal(err)
		}
		if wc := waitWC(t, b.cq, cb.QP().QPN()); wc.Status != ib.Success {
			t.Fatalf("round %d send: %v", i, wc.Status)
		}
		ca := <-srv
		if ca == nil {
			t.FailNow()
		}
		if wc := waitWC(t, a.cq, ca.QP().QPN()); wc.Status != ib.Success || string(mra.Bytes()[:len(msg)]) != msg {
			t.Fatalf("round %d recv: %v %q", i, wc.Status, mra.Bytes()[:len(msg)])
		}
		if err := cb.Disconnect(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case <-ca.Done():
		case <-ctx.Done():
			t.Fatalf("round %d: server never learnt of the disconnection", i)
		}
		ca.Close()
		cb.Close()
	}
	_, sa := a.agent.Stats()
	_, sb := b.agent.Stats()
	if sa.Retransmits+sb.Retransmits+sa.Duplicates+sb.Duplicates == 0 {
		t.Fatalf("no CM repair at 10 %% loss over %d rounds: client %+v server %+v", rounds, sb, sa)
	}
	t.Logf("CM retransmissions: client %d, server %d; duplicates answered: client %d, server %d",
		sb.Retransmits, sa.Retransmits, sb.Duplicates, sa.Duplicates)
}

// TestMRAKeepsQueuedRequest: a REQ queued behind another gets an MRA, so
// its active side keeps waiting while the first one, unanswered, runs out
// of retries; accepting later still connects the second.
func TestMRAKeepsQueuedRequest(t *testing.T) {
	a, b := pairCM(t, fastCM, memlink.Impairments{}, nil, nil)
	ln, _ := a.agent.Listen(7174, 4)
	ctx := ctx10(t)
	first, second := make(chan error, 1), make(chan error, 1)
	p1, _ := b.params(t, 0)
	go func() { _, err := dial(ctx, b.agent, ipA, 7174, p1); first <- err }()
	for i := 0; len(ln.(*listener).backlog) == 0; i++ {
		if i > 5000 {
			t.Fatal("first REQ never reached the backlog")
		}
		time.Sleep(time.Millisecond)
	}
	p2, _ := b.params(t, 0)
	go func() {
		c, err := dial(ctx, b.agent, ipA, 7174, p2)
		if err == nil {
			defer c.Close()
		}
		second <- err
	}()
	// The first gives up after its 7 tries (no MRA: it heads the backlog).
	if err := <-first; err == nil {
		t.Fatal("first dial connected with nobody accepting")
	}
	// One MRA, for the second. A retransmission of the first that arrives
	// after the passive side timed the first out (its timer runs from the
	// first REQ's arrival, the active side's retries from their late
	// wake-ups) is a new request, queued behind the second and MRA'd too.
	if s, ms := a.agent.Stats(); s.MRAs != 1 && (s.MRAs != 2 || ms.Timeouts == 0) {
		t.Fatalf("MRAs: %+v, CM %+v", s, ms)
	}
	pa, _ := a.params(t, 0)
	for i := 0; ; i++ {
		c, err := accept(ctx, ln, pa)
		if err == nil {
			defer c.Close()
			break
		}
		var rej *RejectedError
		if !errors.As(err, &rej) || i > 2 {
			t.Fatalf("accept: %v", err)
		}
		// The REP went to the first, given-up request before its REJ
		// arrived: take the next.
	}
	if err := <-second; err != nil {
		t.Fatalf("queued dial: %v", err)
	}
}

// TestQPOfAnotherDevice: an agent refuses to connect, accept with or
// answer a SIDR request with a QP of another device than its own (it
// would advertise that QP's number on its own device's wire).
func TestQPOfAnotherDevice(t *testing.T) {
	a, b := pair(t, nil)
	pb, _ := b.params(t, 1)
	qb, err := pb.newQP()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.agent.Connect(ctx10(t), qb, ipB, 7180, &pb.ConnParam); !errors.Is(err, verbs.ErrOtherDevice) {
		t.Fatalf("connect with another device's QP: %v", err)
	}
	ln, err := b.agent.ListenUD(7181, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ud, err := a.pd.CreateQP(&verbs.QPInitAttr{Type: ib.UD, SendCQ: a.cq, RecvCQ: a.cq, Cap: ib.QPCaps{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		r, err := ln.GetRequest(ctx10(t))
		if err == nil {
			if err = r.Accept(ud, nil); errors.Is(err, verbs.ErrOtherDevice) {
				err = r.Reject(nil)
			} else {
				err = fmt.Errorf("SIDR answered with another device's QP: %w", err)
			}
		}
		done <- err
	}()
	var se *SIDRError
	if _, err := a.agent.ResolveUD(ctx10(t), ipB, 7181, nil); !errors.As(err, &se) {
		t.Fatalf("lookup: %v, want a refusal", err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

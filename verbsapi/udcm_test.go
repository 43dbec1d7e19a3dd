package verbsapi_test

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/softrnic/softrnic/cm"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/rdmacm"
	"github.com/softrnic/softrnic/rnic"
	"github.com/softrnic/softrnic/verbsapi"
)

// TestDaemonUDCM: SIDR through the daemon with rnic's calls, against an
// rdmacm agent in process on the other device. A lookup of a port nobody
// serves fails with the same *rdmacm.SIDRError (status 1) as in process;
// the daemon's listener answers with its client's UD QP, made ready with
// PrepareUD, and a SEND the peer then addresses with the QPN and Q_Key it
// learnt lands there; the daemon's lookup of the peer's listener names the
// peer's QP. A listener refuses to answer with an RC QP.
func TestDaemonUDCM(t *testing.T) {
	tb := newTestbed(t)
	agent, err := rdmacm.New(rdmacm.Config{Device: tb.vb, Resolve: func(context.Context, netip.Addr) ([6]byte, error) { return macA, nil }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { agent.Close() })
	dcm, err := verbsapi.DaemonCM(tb.d)
	if err != nil {
		t.Fatal(err)
	}
	ud, ok := dcm.(verbsapi.UDCM)
	if !ok {
		t.Fatal("DaemonCM is no UDCM")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	var se *rdmacm.SIDRError
	if _, err := ud.ResolveUD(ctx, addrB, 7000); !errors.As(err, &se) || se.Status != cm.SIDRUnsupported {
		t.Fatalf("lookup of a port nobody serves: %v, want SIDR status 1", err)
	}

	// The daemon's side: a UD QP (PrepareUD) with a receive posted.
	d := newEnd(t, tb.d, ib.RC) // memory, MR and CQ; its RC QP for the refusal
	pdD, _ := tb.d.AllocPD()
	mrD, err := pdD.RegMR(d.mem, 0, 1<<16, 0, ib.LocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	qpD, err := pdD.CreateQP(verbsapi.QPInitAttr{Type: ib.UD, SendCQ: d.cq, RecvCQ: d.cq, MaxSendWR: 4, MaxRecvWR: 4, MaxSGE: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer qpD.Destroy()
	if err := verbsapi.PrepareUD(qpD); err != nil {
		t.Fatal(err)
	}
	base := mrD.IOVA()
	if err := qpD.PostRecv(&verbsapi.RecvWR{ID: 9, SG: []ib.SGE{{Addr: base, Length: 40 + 64, LKey: mrD.LKey()}}}); err != nil {
		t.Fatal(err)
	}
	if rs, ok := qpD.(verbsapi.RecvSyncer); ok {
		if err := rs.SyncRecv(ctx); err != nil {
			t.Fatal(err)
		}
	}

	l, err := ud.ListenUD(7001)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := l.Accept(ctx, d.qp); err == nil {
		t.Fatal("a UD listener answered with an RC QP")
	}
	type resolved struct {
		p   *rdmacm.UDPeer
		err error
	}
	res := make(chan resolved, 1)
	go func() {
		p, err := agent.ResolveUD(ctx, addrA, 7001, nil)
		res <- resolved{p, err}
	}()
	from, err := l.Accept(ctx, qpD)
	if err != nil || from != addrB {
		t.Fatalf("daemon's Accept: %v from %v", err, from)
	}
	got := <-res
	if got.err != nil || got.p.QPN != qpD.QPN() || got.p.QKey != rdmacm.UDPQKey {
		t.Fatalf("peer's lookup: %+v %v, want QPN %#x", got.p, got.err, qpD.QPN())
	}

	// The peer's side: a verbs UD QP it serves port 7002 with, and sends
	// from to what it learnt.
	pdB, _ := tb.b.AllocPD()
	cqB, _ := tb.b.CreateCQ(8)
	vqp, err := verbsapi.VerbsPD(pdB).CreateQP(rnic.QPInitAttr{Type: ib.UD, SendCQ: verbsapi.VerbsCQ(cqB), RecvCQ: verbsapi.VerbsCQ(cqB), MaxSendWR: 4, MaxRecvWR: 4, MaxSGE: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := rdmacm.PrepareUD(vqp); err != nil {
		t.Fatal(err)
	}
	qpB := verbsapi.LocalQP(pdB, vqp)
	ah, err := pdB.CreateAH(ib.AddressVector{DGID: ib.GIDFrom(addrA)})
	if err != nil {
		t.Fatal(err)
	}
	msg := []byte("found through SIDR, through the daemon")
	memB, _ := tb.b.AllocMem(4096)
	mrB, err := pdB.RegMR(memB, 0, 4096, 0, ib.LocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	copy(memB.Bytes(), msg)
	if err := qpB.PostSend(&verbsapi.SendWR{ID: 1, Opcode: ib.Send, Flags: ib.Signaled,
		SG: []ib.SGE{{Addr: mrB.IOVA(), Length: uint32(len(msg)), LKey: mrB.LKey()}},
		AH: ah, RemoteQPN: got.p.QPN, RemoteQKey: got.p.QKey}); err != nil {
		t.Fatal(err)
	}
	wc := d.wait(t)
	if wc.ID != 9 || !wc.IsRecv || string(d.mem.Bytes()[40:40+len(msg)]) != string(msg) {
		t.Fatalf("daemon's receive %+v: %q", wc, d.mem.Bytes()[40:40+len(msg)])
	}

	pl, err := agent.ListenUD(7002, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer pl.Close()
	go func() {
		r, err := pl.GetRequest(ctx)
		if err == nil {
			err = r.Accept(vqp, nil)
		}
		if err != nil {
			t.Errorf("peer's listener: %v", err)
		}
	}()
	svc, err := ud.ResolveUD(ctx, addrB, 7002)
	if err != nil || svc.QPN != vqp.QPN() || svc.QKey != rdmacm.UDPQKey || svc.Addr != addrB {
		t.Fatalf("daemon's lookup: %+v %v, want QPN %#x", svc, err, vqp.QPN())
	}
}

package rnic

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/ibtest"
	"github.com/softrnic/softrnic/port/memlink"
	"github.com/softrnic/softrnic/verbs"
)

// TestCQOverrunIsAnError overflows a receive CQ with SENDs over the link
// and checks the IBA behaviour (rxe's too): the completions queued before
// the overrun are delivered, the CQ reports ErrCQOverrun (Err, and Wait
// once it is drained), the device counts it and reports EventCQErr, the QP
// whose completion overran it goes to ERR with EventQPFatal, and another
// QP that only shares the CQ goes to ERR at the engine's next step. Before,
// the fifth completion was dropped silently and everything carried on.
func TestCQOverrunIsAnError(t *testing.T) {
	const cqDepth, sends = 4, 8
	tb := newTestbed(t, memlink.Impairments{}, 1, 1024)
	qa, qb := tb.connect(ib.RC, 1024, ib.LocalWrite, 16)
	small := tb.b.dev.newCQ(cqDepth)
	// Rebuild B's QP on the small CQ (connect made it on a large one).
	qb2, err := tb.b.pd.newQP(testQP{Type: ib.RC, SendCQ: tb.b.dev.newCQ(64), RecvCQ: small, MaxSendWR: 16, MaxRecvWR: 16, MaxSGE: 1})
	must(t, err)
	// A bystander QP whose send CQ is the small CQ: it never completes
	// anything, yet it must end in ERR too.
	by, err := tb.b.pd.newQP(testQP{Type: ib.RC, SendCQ: small, RecvCQ: tb.b.dev.newCQ(4), MaxSendWR: 4, MaxRecvWR: 4, MaxSGE: 1})
	must(t, err)
	must(t, ibtest.Modify(by, ib.Init, &ib.QPAttr{Access: ib.LocalWrite}))
	must(t, ibtest.Modify(qb, ib.Err, nil))
	pa, pb := uint32(0x100), uint32(0x200)
	must(t, ibtest.Modify(qa, ib.Reset, nil))
	must(t, ibtest.Modify(qa, ib.Init, &ib.QPAttr{Access: ib.LocalWrite}))
	must(t, ibtest.Modify(qa, ib.RTR, &ib.QPAttr{PathMTU: 1024, DestQPN: qb2.QPN(), RQPSN: pb, MinRNRTimer: 1, AV: ib.AddressVector{DMAC: macB, DGID: ib.GIDFrom(addrB)}}))
	must(t, ibtest.Modify(qa, ib.RTS, &ib.QPAttr{SQPSN: pa, Timeout: 6, RetryCnt: 7, RNRRetry: 7}))
	must(t, ibtest.Modify(qb2, ib.Init, &ib.QPAttr{Access: ib.LocalWrite}))
	must(t, ibtest.Modify(qb2, ib.RTR, &ib.QPAttr{PathMTU: 1024, DestQPN: qa.QPN(), RQPSN: pa, MinRNRTimer: 1, AV: ib.AddressVector{DMAC: macA, DGID: ib.GIDFrom(addrA)}}))
	must(t, ibtest.Modify(qb2, ib.RTS, &ib.QPAttr{SQPSN: pb, Timeout: 6, RetryCnt: 7, RNRRetry: 7}))

	src := make([]byte, 64)
	dst := make([]byte, 64*sends)
	mra, err := tb.a.pd.RegBytes(src, 0, ib.LocalWrite)
	must(t, err)
	mrb, err := tb.b.pd.RegBytes(dst, 0, ib.LocalWrite)
	must(t, err)
	for i := 0; i < sends; i++ {
		_, err := qb2.PostRecv([]verbs.RecvWR{{ID: uint64(100 + i), SG: []ib.SGE{{Addr: mrb.IOVA() + uint64(64*i), Length: 64, LKey: mrb.LKey()}}}})
		must(t, err)
	}
	// Drain B's events of the setup (qb's own move to ERR is not one).
	for len(tb.b.dev.Events()) > 0 {
		<-tb.b.dev.Events()
	}
	for i := 0; i < sends; i++ {
		_, err := qa.PostSend([]verbs.SendWR{{ID: uint64(i), Opcode: ib.Send, Flags: ib.Signaled, SG: []ib.SGE{{Addr: mra.IOVA(), Length: 64, LKey: mra.LKey()}}}})
		must(t, err)
	}
	tb.run(func() bool { return qb2.State() == ib.Err && by.State() == ib.Err }, 50*time.Millisecond)

	if err := small.Err(); !errors.Is(err, verbs.ErrCQOverrun) {
		t.Fatalf("CQ.Err after the overrun = %v, want ErrCQOverrun", err)
	}
	got := pollAll(small)
	if len(got) != cqDepth {
		t.Fatalf("polled %d completions after the overrun, want the %d queued before it: %+v", len(got), cqDepth, got)
	}
	for i, w := range got {
		if w.Status != ib.Success || !w.IsRecv || w.ID != uint64(100+i) || w.QPN != qb2.QPN() {
			t.Errorf("completion %d = %+v, want a successful receive of WR %d on QP %#x", i, w, 100+i, qb2.QPN())
		}
	}
	if small.Overflows() == 0 {
		t.Error("Overflows is 0 after an overrun")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var buf [4]ib.WC
	if n, err := small.PollWait(ctx, buf[:]); n != 0 || !errors.Is(err, verbs.ErrCQOverrun) {
		t.Fatalf("Wait on the drained CQ in error = %d, %v; want 0, ErrCQOverrun (it must not block)", n, err)
	}
	if n := tb.b.dev.CQOverruns(); n != 1 {
		t.Errorf("device CQOverruns = %d, want 1", n)
	}
	var cqErr, fatal2, fatalBy bool
	for len(tb.b.dev.Events()) > 0 {
		e := <-tb.b.dev.Events()
		switch {
		case e.Type == ib.EventCQErr && e.CQ == small:
			cqErr = true
		case e.Type == ib.EventQPFatal && e.QPN == qb2.QPN():
			fatal2 = true
		case e.Type == ib.EventQPFatal && e.QPN == by.QPN():
			fatalBy = true
		}
	}
	if !cqErr || !fatal2 || !fatalBy {
		t.Errorf("events: CQ_ERR %v, QP_FATAL of the overrunning QP %v, of the bystander %v; want all", cqErr, fatal2, fatalBy)
	}
	// The peer does not hang either: B's QP in ERR answers nothing, and A
	// ends every SEND, the last ones in error (retry exhaustion, then
	// flushes). The first ones may fail too: B coalesced their ACK, and
	// it was dropped with the rest of B's output when B went to ERR; an
	// overrun leaves the requester's view of the messages that reached
	// the responder's application undefined, as IBA has it.
	var aw []ib.WC
	end := tb.clk.Now().Add(time.Second)
	for len(aw) < sends && tb.clk.Now() < end {
		if !tb.step() {
			next := min(tb.a.port.NextDelivery(), tb.b.port.NextDelivery(), tb.a.dev.NextDeadline(), tb.b.dev.NextDeadline())
			tb.clk.Set(max(next, tb.clk.Now()+1))
		}
		aw = append(aw, pollAll(qa.init.SendCQ)...)
	}
	if len(aw) != sends {
		t.Fatalf("A completed %d of its %d SENDs after B's overrun: %+v", len(aw), sends, aw)
	}
	if aw[sends-1].Status == ib.Success {
		t.Errorf("A's last SEND succeeded although B's QP was in ERR")
	}
}

package rc

import (
	"testing"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/congestion"
	"github.com/softrnic/softrnic/congestion/dcqcn"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/transport"
)

// newCCCtx is newCtx for a QP that runs DCQCN (the paper's profile at
// 40 Gb/s, every CE mark answered at once).
func newCCCtx(t *testing.T, ctr *CCCounters) *tctx {
	cfg := defaultCfg()
	c := &tctx{t: t, mem: &testMem{mrs: map[uint32]*testMR{}}, rq: &testRQ{}}
	np := dcqcn.PaperNP()
	np.MinInterval, np.Defer = 0, false
	c.qp = NewQP(Options{QPN: cfg.QPN, SQDepth: 64, MaxSGE: 4, Mem: c.mem, RQ: c.rq,
		CC: &CCConfig{RP: dcqcn.Paper(40 * congestion.Gbps), NP: np}, Counters: ctr})
	c.qp.Modify(ib.Init, ib.RTR, &ib.QPAttr{DestQPN: cfg.DestQPN, PathMTU: 1024, RQPSN: 500, MaxDestRdAtomic: 16,
		MinRNRTimer: 12, Access: ib.RemoteWrite})
	c.qp.Modify(ib.RTR, ib.RTS, &ib.QPAttr{DestQPN: cfg.DestQPN, PathMTU: 1024, SQPSN: 100, Timeout: 14,
		RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 16, Access: ib.RemoteWrite})
	c.buf = make([]byte, c.qp.MaxPacket())
	return c
}

// TestCCNotificationPoint: a CE-marked request makes the QP owe a CNP,
// which Build sends ahead of the ACK, addressed to the peer's QP; a
// CE-marked ACK is counted and not answered.
func TestCCNotificationPoint(t *testing.T) {
	var ctr CCCounters
	c := newCCCtx(t, &ctr)
	c.addMR(7, 0x1000, 64, ib.RemoteWrite)
	w := req{op: bth.RCRDMAWriteOnly, psn: 500, ackReq: true, va: 0x1000, rkey: 7, dmaLen: 8, payload: fill(8, 1)}
	c.qp.Receive(c.now, w.bytes(0x11), &transport.Meta{ECN: ecnCE})
	got := c.expect(p(bth.CNP, 0), ack(500, 1))
	if h := bth.BTH(got[0].raw); h.DestQP() != 0x22 || !h.BECN() || h.PKey() != bth.DefaultPKey || len(got[0].raw) != cnpLen {
		t.Fatalf("CNP % x", got[0].raw)
	}
	a := req{op: bth.RCAcknowledge, psn: 99, syn: SynACK}
	c.qp.Receive(c.now, a.bytes(0x11), &transport.Meta{ECN: ecnCE})
	c.expect()
	if ctr.NPECNMarkedRoCEPackets != 1 || ctr.NPCNPSent != 1 || ctr.RxCEAck != 1 {
		t.Fatalf("%+v", ctr)
	}
}

// TestCCReactionPointAndPacer: a CNP cuts the rate; the pacer then holds
// the QP between packets (no output, a deadline at the departure time)
// and releases it at that time.
func TestCCReactionPointAndPacer(t *testing.T) {
	var ctr CCCounters
	c := newCCCtx(t, &ctr)
	c.post(ib.SendWQE{ID: 1, Opcode: ib.RDMAWrite, SG: segs(fill(8*1024, 1)), RemoteAddr: 0x100, RKey: 1})
	cnp := make([]byte, cnpLen)
	bth.BTH(cnp).SetOpcode(bth.CNP)
	c.qp.Receive(c.now, cnp, &transport.Meta{})
	st, ok := c.qp.CongestionState()
	if !ok || ctr.RPCNPHandled != 1 || st.Rate >= 40*congestion.Gbps {
		t.Fatalf("after a CNP: %+v %+v", ctr, st)
	}
	n := c.qp.Build(c.now, c.buf)
	if n == 0 {
		t.Fatal("nothing sent")
	}
	c.qp.Sent(c.now, n+70)
	if c.qp.Build(c.now, c.buf) != 0 || c.qp.HasOutput() {
		t.Fatal("the pacer let a second packet go at once")
	}
	dl := c.qp.Deadline()
	if dl == clock.Never || dl <= c.now {
		t.Fatalf("departure %v", dl)
	}
	c.now = dl
	c.qp.Expire(c.now)
	if !c.qp.HasOutput() || c.qp.Build(c.now, c.buf) == 0 {
		t.Fatal("not released at its departure time")
	}
}

// TestCCOffIgnoresCNPs: without a CCConfig a CNP is counted as ignored and
// nothing else changes.
func TestCCOffIgnoresCNPs(t *testing.T) {
	var ctr CCCounters
	c := newCtx(t, defaultCfg())
	c.qp.ccCtr = &ctr
	cnp := make([]byte, cnpLen)
	bth.BTH(cnp).SetOpcode(bth.CNP)
	c.qp.Receive(c.now, cnp, nil)
	if _, ok := c.qp.CongestionState(); ok || ctr.RPCNPIgnored != 1 || c.qp.HasOutput() {
		t.Fatalf("%+v", ctr)
	}
}

package rc

import (
	"testing"
	"time"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/congestion"
	"github.com/softrnic/softrnic/congestion/dcqcn"
	"github.com/softrnic/softrnic/congestion/swift"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/checker"
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
	if h := bth.BTH(got[0].Raw); h.DestQP() != 0x22 || !h.BECN() || h.PKey() != bth.DefaultPKey || len(got[0].Raw) != cnpLen {
		t.Fatalf("CNP % x", got[0].Raw)
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

// newSwiftCtx is newCtx for a QP that runs Swift (recovery as rxe, as the
// device's QPs do): a window of 8 packets to start with.
func newSwiftCtx(t *testing.T, ctr *CCCounters) *tctx {
	cfg := defaultCfg()
	c := &tctx{t: t, mem: &testMem{mrs: map[uint32]*testMR{}}, rq: &testRQ{}}
	sc := swift.Fabric(1000, 40*congestion.Gbps, 4400*time.Nanosecond, 2200*time.Nanosecond)
	sc.InitCwnd = 8
	c.qp = NewQP(Options{QPN: cfg.QPN, SQDepth: 64, MaxSGE: 4, Mem: c.mem, RQ: c.rq, Recovery: ib.RecoveryTimeout,
		CC: &CCConfig{Algorithm: Swift, Swift: sc, Hops: 1, PacketOverhead: 46}, Counters: ctr})
	c.qp.Modify(ib.Init, ib.RTR, &ib.QPAttr{DestQPN: cfg.DestQPN, PathMTU: 1024, RQPSN: 500, MaxDestRdAtomic: 16,
		MinRNRTimer: 12, Access: ib.RemoteWrite})
	c.qp.Modify(ib.RTR, ib.RTS, &ib.QPAttr{DestQPN: cfg.DestQPN, PathMTU: 1024, SQPSN: 100, Timeout: 14,
		RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 16, Access: ib.RemoteWrite})
	c.buf = make([]byte, c.qp.MaxPacket())
	return c
}

// TestCCSwiftWindowSamplesAndLoss: Swift's window gates new packets (and
// is counted full once), AckReq comes every quarter window; an ACK gives
// the RTT of the packet it names from the send records; a sequence NAK's
// go-back-N reaches Swift as a loss and cuts the window; the ACK of a
// retransmitted packet acknowledges bytes but gives no RTT (Karn).
func TestCCSwiftWindowSamplesAndLoss(t *testing.T) {
	var ctr CCCounters
	c := newSwiftCtx(t, &ctr)
	us := clock.Time(time.Microsecond)
	c.post(ib.SendWQE{ID: 1, Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: segs(make([]byte, 40*1024)), RemoteAddr: 0x100, RKey: 1})
	got := c.out()
	if len(got) != 8 || ctr.WindowFull != 1 {
		t.Fatalf("sent %d packets, window full %d; want 8, 1", len(got), ctr.WindowFull)
	}
	for i, g := range got {
		if g.AckReq != (i%2 == 1) {
			t.Fatalf("packet %d AckReq %v, want every second packet", i, g.AckReq)
		}
	}
	c.now += 10 * us
	c.respond(req{op: bth.RCAcknowledge, psn: 101, syn: SynACK})
	st, _ := c.qp.CongestionState()
	if st.RTTSamples != 1 || st.LastRTT != 10*time.Microsecond || ctr.RTTSamples != 1 || st.Decreases != 1 {
		// 10 µs is above the 6.4 µs target of one hop: the window shrinks.
		t.Fatalf("after an ACK 10 µs later: %+v", st)
	}
	cwnd := st.Cwnd
	c.now += 20 * us // past one smoothed RTT: a decrease is allowed again
	c.respond(req{op: bth.RCAcknowledge, psn: 102, syn: SynNAKPSNSeq})
	st, _ = c.qp.CongestionState()
	if st.LossEvents != 1 || ctr.LossEvents != 1 || c.qp.Retransmits != 1 || st.Cwnd != cwnd/2 || st.Decreases != 2 {
		t.Fatalf("after a sequence NAK: %+v (cwnd was %v), retransmits %d", st, cwnd, c.qp.Retransmits)
	}
	resent := c.out()
	if len(resent) == 0 || resent[0].PSN != 102 {
		t.Fatalf("go-back-N resent %v", resent)
	}
	c.now += 10 * us // the minimum RTT after the repeat: either copy may be answered
	c.respond(req{op: bth.RCAcknowledge, psn: 103, syn: SynACK})
	st, _ = c.qp.CongestionState()
	if st.RTTSamples != 1 || st.InFlight != int64(len(resent)-2)*(12+1024+46) {
		t.Fatalf("the ACK of a retransmitted packet: %+v (%d resent)", st, len(resent))
	}
}

// outSent is out with every packet charged to the pacer, as the device
// does after each Build.
func (c *tctx) outSent() []checker.Packet {
	var ps []checker.Packet
	for i := 0; i < 10000; i++ {
		n := c.qp.Build(c.now, c.buf)
		if n == 0 {
			return ps
		}
		c.qp.Sent(c.now, n+46)
		ps = append(ps, checker.Decode(c.buf[:n]))
	}
	c.t.Fatal("Build never stops")
	return nil
}

// TestCCPacedIsNotLost: a Swift window below one packet paces the QP to
// a packet every RTT/cwnd, here longer than its local ACK timeout. With
// nothing unacknowledged on the wire the timeout does not count (no retry
// spent, no loss reported) and the next packet leaves at its pacing time.
func TestCCPacedIsNotLost(t *testing.T) {
	var ctr CCCounters
	c := newSwiftCtx(t, &ctr)
	sc := c.qp.cc.sw.Config()
	sc.InitCwnd = 0.02
	if err := c.qp.cc.sw.Init(sc); err != nil {
		t.Fatal(err)
	}
	c.qp.cc.retuneAcks()
	c.post(ib.SendWQE{ID: 1, Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: segs(make([]byte, 4*1024)), RemoteAddr: 0x100, RKey: 1})
	if got := c.outSent(); len(got) != 1 || !got[0].AckReq {
		t.Fatalf("sent %v, want one packet with AckReq", got)
	}
	c.now += clock.Time(time.Millisecond)
	c.respond(req{op: bth.RCAcknowledge, psn: 100, syn: SynACK})
	// The pacer charged the first packet at the line rate: the second
	// leaves at once, the third one packet's time at the cut rate later.
	if got := c.outSent(); len(got) != 1 {
		t.Fatalf("sent %d packets after the ACK, want 1", len(got))
	}
	c.now += clock.Time(time.Millisecond)
	c.respond(req{op: bth.RCAcknowledge, psn: 101, syn: SynACK})
	st, _ := c.qp.CongestionState()
	gap := time.Duration(float64(c.qp.cc.mss) * 8e9 / float64(st.Rate))
	if got := c.outSent(); len(got) != 0 {
		t.Fatalf("the pacer let %d packets go", len(got))
	}
	if ack := AckTimeout(14); gap <= ack || c.qp.HasOutput() {
		t.Fatalf("pacing gap %v (rate %v), local ACK timeout %v; has output %v", gap, st.Rate, ack, c.qp.HasOutput())
	}
	for i := 0; i < 100 && len(c.outSent()) == 0; i++ {
		c.now = c.qp.Deadline()
		c.qp.Expire(c.now)
	}
	if c.qp.Timeouts != 0 || c.qp.Retransmits != 0 || ctr.LossEvents != 0 {
		t.Fatalf("a paced QP timed out: %d timeouts, %d retransmits, %d loss events", c.qp.Timeouts, c.qp.Retransmits, ctr.LossEvents)
	}
	if st, _ := c.qp.CongestionState(); st.InFlight == 0 {
		t.Fatal("the next packet never left")
	}
}

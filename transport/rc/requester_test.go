package rc

import (
	"bytes"
	"testing"
	"time"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/ib"
)

func (c *tctx) post(w ib.SendWQE) {
	c.t.Helper()
	if w.Length == 0 {
		for _, s := range w.SG {
			w.Length += uint32(s.Len())
		}
	}
	if !c.qp.Post(&w) {
		c.t.Fatal("SQ full")
	}
}

func (c *tctx) respond(r req) { c.inject(r) }

func TestRequesterSegmentsAtMTU(t *testing.T) {
	c := newCtx(t, defaultCfg())
	data := fill(2500, 4)
	c.post(ib.SendWQE{ID: 1, Opcode: ib.Send, Flags: ib.Signaled, SG: segs(data[:100], data[100:])})
	got := c.expect(p(bth.RCSendFirst, 100), p(bth.RCSendMiddle, 101), p(bth.RCSendLast, 102))
	var all []byte
	for i, g := range got {
		all = append(all, g.Payload...)
		if g.AckReq != (i == 2) {
			t.Fatalf("AckReq on packet %d: %v", i, g.AckReq)
		}
		pad := bth.BTH(g.Raw).PadCount()
		if (i < 2 && (len(g.Payload) != 1024 || pad != 0)) || (i == 2 && (len(g.Payload) != 452 || pad != 0)) {
			t.Fatalf("packet %d: %d bytes pad %d", i, len(g.Payload), pad)
		}
	}
	if !bytes.Equal(all, data) {
		t.Fatal("payload")
	}
	// 3-byte WRITE: ONLY with RETH and a pad of 1.
	c.post(ib.SendWQE{ID: 2, Opcode: ib.RDMAWrite, SG: segs([]byte{1, 2, 3}), RemoteAddr: 0x5000, RKey: 0x77})
	g := c.expect(p(bth.RCRDMAWriteOnly, 103))[0]
	r := bth.RETH(g.Raw[12:])
	if bth.BTH(g.Raw).PadCount() != 1 || r.VA() != 0x5000 || r.RKey() != 0x77 || r.DMALen() != 3 || !g.AckReq {
		t.Fatalf("write only %v", g)
	}
	// Zero-length SEND: one ONLY packet.
	c.post(ib.SendWQE{ID: 3, Opcode: ib.Send})
	c.expect(p(bth.RCSendOnly, 104))
}

func TestRequesterAckReqEvery64AndWindow(t *testing.T) {
	cfg := defaultCfg()
	cfg.MTU = 256
	cfg.Recovery = ib.RecoveryTimeout // rxe's window from the first packet on
	c := newCtx(t, cfg)
	c.post(ib.SendWQE{ID: 1, Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: segs(make([]byte, 256*200))})
	got := c.out()
	if len(got) != MaxUnackedPSNs+1 {
		t.Fatalf("sent %d packets, window is %d", len(got), MaxUnackedPSNs)
	}
	for i, g := range got {
		if g.AckReq != ((i+1)%(MaxPktPerAck+2) == 0) {
			t.Fatalf("packet %d AckReq %v", i, g.AckReq)
		}
	}
	c.respond(req{op: bth.RCAcknowledge, psn: 100 + 63, syn: SynACK, msn: 0})
	got = c.out()
	if len(got) != 64 || got[0].PSN != 229 {
		t.Fatalf("after ACK: %d packets from %v", len(got), got[0])
	}
}

func TestCompleterCoalescedACK(t *testing.T) {
	c := newCtx(t, defaultCfg())
	for i := 1; i <= 3; i++ {
		c.post(ib.SendWQE{ID: uint64(i), Opcode: ib.Send, Flags: ib.Signaled, SG: segs(fill(10, 0))})
	}
	c.post(ib.SendWQE{ID: 4, Opcode: ib.Send, SG: segs(fill(10, 0))}) // unsignaled
	c.expect(p(bth.RCSendOnly, 100), p(bth.RCSendOnly, 101), p(bth.RCSendOnly, 102), p(bth.RCSendOnly, 103))
	c.respond(req{op: bth.RCAcknowledge, psn: 103, syn: SynACK, msn: 4})
	w := c.wcs()
	if len(w) != 3 || w[0].ID != 1 || w[2].ID != 3 || w[0].Status != ib.Success || w[0].Opcode != ib.WCSend {
		t.Fatalf("completions %+v", w)
	}
	if c.qp.Deadline() != clock.Never {
		t.Fatal("timer armed with nothing outstanding")
	}
	// A stale duplicate ACK changes nothing.
	c.respond(req{op: bth.RCAcknowledge, psn: 101, syn: SynACK, msn: 2})
	if len(c.wcs()) != 0 || c.qp.Failed() {
		t.Fatal("stale ACK")
	}
}

func TestCompleterReadNeedsItsResponse(t *testing.T) {
	c := newCtx(t, defaultCfg())
	dst := make([]byte, 2100)
	c.post(ib.SendWQE{ID: 1, Opcode: ib.Send, Flags: ib.Signaled, SG: segs(fill(8, 0))})
	c.post(ib.SendWQE{ID: 2, Opcode: ib.RDMARead, Flags: ib.Signaled, SG: segs(dst), RemoteAddr: 0x9000, RKey: 3})
	c.post(ib.SendWQE{ID: 3, Opcode: ib.Send, Flags: ib.Signaled, SG: segs(fill(8, 0))})
	g := c.expect(p(bth.RCSendOnly, 100), p(bth.RCRDMAReadRequest, 101), p(bth.RCSendOnly, 104))
	if r := bth.RETH(g[1].Raw[12:]); r.VA() != 0x9000 || r.DMALen() != 2100 || r.RKey() != 3 {
		t.Fatal("RETH")
	}
	// An ACK beyond the READ means its response was lost: the SEND before
	// it completes, the READ is requested again (go-back-N from 101).
	c.respond(req{op: bth.RCAcknowledge, psn: 104, syn: SynACK, msn: 3})
	w := c.wcs()
	if len(w) != 1 || w[0].ID != 1 {
		t.Fatalf("completions %+v", w)
	}
	c.expect(p(bth.RCRDMAReadRequest, 101), p(bth.RCSendOnly, 104))
	src := fill(2100, 5)
	c.respond(req{op: bth.RCRDMAReadResponseFirst, psn: 101, syn: SynACK, msn: 2, payload: src[:1024]})
	// Lost MIDDLE: the LAST arrives out of order and is dropped, and the
	// gap makes the requester ask again at once for the rest, from the
	// missing PSN (implied NAK), without waiting for the timeout.
	c.respond(req{op: bth.RCRDMAReadResponseLast, psn: 103, syn: SynACK, msn: 2, payload: src[2048:]})
	if len(c.wcs()) != 0 {
		t.Fatal("READ completed without its middle")
	}
	g = c.expect(p(bth.RCRDMAReadRequest, 102), p(bth.RCSendOnly, 104))
	// A second out-of-order packet of the same gap asks nothing more.
	c.respond(req{op: bth.RCRDMAReadResponseLast, psn: 103, syn: SynACK, msn: 2, payload: src[2048:]})
	c.expect()
	if r := bth.RETH(g[0].Raw[12:]); r.VA() != 0x9000+1024 || r.DMALen() != 2100-1024 {
		t.Fatalf("re-request RETH va %#x len %d", r.VA(), r.DMALen())
	}
	c.respond(req{op: bth.RCRDMAReadResponseFirst, psn: 102, syn: SynACK, msn: 2, payload: src[1024:2048]})
	c.respond(req{op: bth.RCRDMAReadResponseLast, psn: 103, syn: SynACK, msn: 2, payload: src[2048:]})
	c.respond(req{op: bth.RCAcknowledge, psn: 104, syn: SynACK, msn: 3})
	w = c.wcs()
	if len(w) != 2 || w[0].ID != 2 || w[0].Opcode != ib.WCRDMARead || w[1].ID != 3 || !bytes.Equal(dst, src) {
		t.Fatalf("completions %+v", w)
	}
}

func TestCompleterNAKSeqGoBackN(t *testing.T) {
	c := newCtx(t, defaultCfg())
	data := fill(3000, 1)
	c.post(ib.SendWQE{ID: 1, Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: segs(data), RemoteAddr: 0x100, RKey: 1})
	c.post(ib.SendWQE{ID: 2, Opcode: ib.Send, Flags: ib.Signaled, SG: segs(fill(5, 0))})
	c.expect(p(bth.RCRDMAWriteFirst, 100), p(bth.RCRDMAWriteMiddle, 101), p(bth.RCRDMAWriteLast, 102), p(bth.RCSendOnly, 103))
	c.respond(req{op: bth.RCAcknowledge, psn: 101, syn: SynNAKPSNSeq, msn: 0})
	g := c.expect(p(bth.RCRDMAWriteMiddle, 101), p(bth.RCRDMAWriteLast, 102), p(bth.RCSendOnly, 103))
	if !bytes.Equal(g[0].Payload, data[1024:2048]) {
		t.Fatal("resent middle payload")
	}
	c.respond(req{op: bth.RCAcknowledge, psn: 103, syn: SynACK, msn: 2})
	if w := c.wcs(); len(w) != 2 {
		t.Fatalf("%+v", w)
	}
	if c.qp.Retransmits != 1 {
		t.Fatal("retransmit count")
	}
}

func TestCompleterRNR(t *testing.T) {
	cfg := defaultCfg()
	cfg.RNRRetry = 2
	c := newCtx(t, cfg)
	c.post(ib.SendWQE{ID: 1, Opcode: ib.Send, Flags: ib.Signaled, SG: segs(fill(5, 0))})
	c.expect(p(bth.RCSendOnly, 100))
	for i := 0; i < 2; i++ {
		c.respond(req{op: bth.RCAcknowledge, psn: 100, syn: SynRNRNAK | 12, msn: 0})
		if d := c.qp.Deadline(); d != c.now.Add(640*time.Microsecond) {
			t.Fatalf("RNR deadline %v, want now+640µs", d)
		}
		c.now = c.now.Add(639 * time.Microsecond)
		c.qp.Expire(c.now)
		c.expect()
		c.now = c.now.Add(time.Microsecond)
		c.qp.Expire(c.now)
		c.expect(p(bth.RCSendOnly, 100))
	}
	c.respond(req{op: bth.RCAcknowledge, psn: 100, syn: SynRNRNAK | 12, msn: 0})
	w := c.wcs()
	if len(w) != 1 || w[0].Status != ib.RNRRetryExcErr || !c.qp.Failed() {
		t.Fatalf("%+v", w)
	}
}

func TestCompleterRNRRetry7IsInfinite(t *testing.T) {
	c := newCtx(t, defaultCfg()) // RNRRetry 7
	c.post(ib.SendWQE{ID: 1, Opcode: ib.Send, Flags: ib.Signaled, SG: segs(fill(5, 0))})
	c.out()
	for i := 0; i < 50; i++ {
		c.respond(req{op: bth.RCAcknowledge, psn: 100, syn: SynRNRNAK | 1, msn: 0})
		c.now = c.qp.Deadline()
		c.qp.Expire(c.now)
		c.expect(p(bth.RCSendOnly, 100))
	}
	if c.qp.Failed() {
		t.Fatal("rnr_retry 7 must be infinite")
	}
}

func TestCompleterTimeoutAndRetryExhaustion(t *testing.T) {
	cfg := defaultCfg() // Timeout 14, RetryCnt 7
	cfg.Recovery = ib.RecoveryTimeout
	c := newCtx(t, cfg)
	c.post(ib.SendWQE{ID: 1, Opcode: ib.Send, Flags: ib.Signaled, SG: segs(fill(5, 0))})
	c.expect(p(bth.RCSendOnly, 100))
	if d := c.qp.Deadline(); d != c.now.Add(4096*(1<<14)*time.Nanosecond) {
		t.Fatalf("deadline %v", d)
	}
	// retry_cnt 7 is seven retries, not infinity.
	for i := 0; i < 7; i++ {
		c.now = c.qp.Deadline()
		c.qp.Expire(c.now)
		c.expect(p(bth.RCSendOnly, 100))
	}
	c.now = c.qp.Deadline()
	c.qp.Expire(c.now)
	w := c.wcs()
	if len(w) != 1 || w[0].Status != ib.RetryExcErr || !c.qp.Failed() {
		t.Fatalf("%+v", w)
	}
	if c.qp.Timeouts != 8 {
		t.Fatalf("timeouts %d", c.qp.Timeouts)
	}
}

func TestCompleterProgressResetsRetries(t *testing.T) {
	cfg := defaultCfg()
	cfg.RetryCnt = 1
	c := newCtx(t, cfg)
	for i := 0; i < 3; i++ {
		c.post(ib.SendWQE{ID: uint64(i), Opcode: ib.Send, Flags: ib.Signaled, SG: segs(fill(5, 0))})
	}
	c.out()
	for i := 0; i < 3; i++ {
		c.now = c.qp.Deadline()
		c.qp.Expire(c.now) // one retry
		c.out()
		c.respond(req{op: bth.RCAcknowledge, psn: bth.PSN(100 + i), syn: SynACK})
	}
	if c.qp.Failed() || len(c.wcs()) != 3 {
		t.Fatal("progress must refill retry_cnt")
	}
}

func TestCompleterNAKCodes(t *testing.T) {
	for syn, st := range map[uint8]ib.WCStatus{SynNAKInvReq: ib.RemInvReqErr, SynNAKRemAccess: ib.RemAccessErr, SynNAKRemOp: ib.RemOpErr, 0x64: ib.RemOpErr} {
		c := newCtx(t, defaultCfg())
		c.post(ib.SendWQE{ID: 1, Opcode: ib.Send, Flags: ib.Signaled, SG: segs(fill(5, 0))})
		c.post(ib.SendWQE{ID: 2, Opcode: ib.RDMAWrite, SG: segs(fill(5, 0))})
		c.post(ib.SendWQE{ID: 3, Opcode: ib.Send, SG: segs(fill(5, 0))})
		c.out()
		c.respond(req{op: bth.RCAcknowledge, psn: 101, syn: syn, msn: 1})
		w := c.wcs()
		if len(w) != 2 || w[0].ID != 1 || w[0].Status != ib.Success || w[1].ID != 2 || w[1].Status != st || !c.qp.Failed() {
			t.Fatalf("syn %#x: %+v", syn, w)
		}
		c.qp.Flush()
		w = c.wcs()
		if len(w) != 1 || w[0].ID != 3 || w[0].Status != ib.WRFlushErr {
			t.Fatalf("flush %+v", w)
		}
	}
}

func TestCompleterAtomicAndRdAtomicLimit(t *testing.T) {
	cfg := defaultCfg()
	cfg.MaxRdAtomic = 2
	c := newCtx(t, cfg)
	res := make([][]byte, 3)
	for i := range res {
		res[i] = make([]byte, 8)
		c.post(ib.SendWQE{ID: uint64(i), Opcode: ib.AtomicFetchAndAdd, Flags: ib.Signaled, SG: segs(res[i]), Length: 8, RemoteAddr: 0x800, RKey: 1, SwapAdd: 1})
	}
	c.post(ib.SendWQE{ID: 9, Opcode: ib.Send, Flags: ib.Signaled | ib.Fence, SG: segs(fill(1, 0))})
	g := c.expect(p(bth.RCFetchAdd, 100), p(bth.RCFetchAdd, 101)) // max_rd_atomic 2
	if a := bth.AtomicETH(g[0].Raw[12:]); a.VA() != 0x800 || a.SwapAdd() != 1 {
		t.Fatal("AtomicETH")
	}
	c.respond(req{op: bth.RCAtomicAcknowledge, psn: 100, syn: SynACK, msn: 1, orig: 41})
	c.expect(p(bth.RCFetchAdd, 102))
	c.respond(req{op: bth.RCAtomicAcknowledge, psn: 101, syn: SynACK, msn: 2, orig: 42})
	c.expect() // the fenced SEND waits for the last atomic
	c.respond(req{op: bth.RCAtomicAcknowledge, psn: 102, syn: SynACK, msn: 3, orig: 43})
	c.expect(p(bth.RCSendOnly, 103))
	for i := range res {
		if le64(res[i]) != uint64(41+i) {
			t.Fatalf("atomic result %d = %d", i, le64(res[i]))
		}
	}
	if w := c.wcs(); len(w) != 3 || w[0].Opcode != ib.WCFetchAdd {
		t.Fatalf("%+v", w)
	}
}

func TestRequesterPSNWrapAndLocalError(t *testing.T) {
	cfg := defaultCfg()
	cfg.SQPSN = bth.PSNMask
	c := newCtx(t, cfg)
	c.post(ib.SendWQE{ID: 1, Opcode: ib.Send, Flags: ib.Signaled, SG: segs(make([]byte, 2048))})
	c.expect(p(bth.RCSendFirst, bth.PSNMask), p(bth.RCSendLast, 0))
	c.respond(req{op: bth.RCAcknowledge, psn: 0, syn: SynACK, msn: 1})
	if w := c.wcs(); len(w) != 1 || w[0].Status != ib.Success {
		t.Fatalf("%+v", w)
	}
	// A WQE whose lkey failed at post completes with its error in order.
	c.post(ib.SendWQE{ID: 2, Opcode: ib.Send, SG: segs(fill(1, 0))})
	c.post(ib.SendWQE{ID: 3, Opcode: ib.Send, Err: ib.LocProtErr})
	c.expect(p(bth.RCSendOnly, 1))
	c.respond(req{op: bth.RCAcknowledge, psn: 1, syn: SynACK, msn: 2})
	c.out()
	if w := c.wcs(); len(w) != 1 || w[0].ID != 3 || w[0].Status != ib.LocProtErr || !c.qp.Failed() {
		t.Fatalf("%+v", w)
	}
}

func TestCompleterIgnoresGhostsAndBadResponses(t *testing.T) {
	c := newCtx(t, defaultCfg())
	c.respond(req{op: bth.RCAcknowledge, psn: 100, syn: SynACK}) // nothing outstanding
	c.respond(req{op: bth.RCRDMAReadResponseOnly, psn: 100, syn: SynACK, payload: fill(4, 0)})
	if c.qp.Failed() || c.qp.GhostResponse != 2 {
		t.Fatal("ghost responses")
	}
	dst := make([]byte, 100)
	c.post(ib.SendWQE{ID: 1, Opcode: ib.RDMARead, Flags: ib.Signaled, SG: segs(dst), RemoteAddr: 1, RKey: 1})
	c.out()
	// A response longer than the READ asked for is a protocol error.
	c.respond(req{op: bth.RCRDMAReadResponseOnly, psn: 100, syn: SynACK, payload: fill(101, 0)})
	if w := c.wcs(); len(w) != 1 || w[0].Status != ib.BadRespErr || !c.qp.Failed() {
		t.Fatalf("%+v", w)
	}
}

func TestCompleterSeqNAKAfterRNRCostsNoRetry(t *testing.T) {
	cfg := defaultCfg()
	cfg.RetryCnt = 0 // any transport retry would fail the QP
	c := newCtx(t, cfg)
	for i := 0; i < 3; i++ {
		c.post(ib.SendWQE{ID: uint64(i), Opcode: ib.Send, Flags: ib.Signaled, SG: segs(fill(64, 0))})
	}
	c.expect(p(bth.RCSendOnly, 100), p(bth.RCSendOnly, 101), p(bth.RCSendOnly, 102))
	// As in rnr_nak.pcap: ACK, RNR NAK, then a sequence NAK for the same PSN.
	c.respond(req{op: bth.RCAcknowledge, psn: 100, syn: SynACK, msn: 1})
	c.respond(req{op: bth.RCAcknowledge, psn: 101, syn: SynRNRNAK | 12, msn: 1})
	c.respond(req{op: bth.RCAcknowledge, psn: 101, syn: SynNAKPSNSeq, msn: 1})
	c.expect()
	if c.qp.Failed() {
		t.Fatal("sequence NAK after RNR NAK spent a transport retry")
	}
	c.now = c.qp.Deadline()
	c.qp.Expire(c.now)
	c.expect(p(bth.RCSendOnly, 101), p(bth.RCSendOnly, 102))
	c.respond(req{op: bth.RCAcknowledge, psn: 102, syn: SynACK, msn: 3})
	if w := c.wcs(); len(w) != 3 || w[2].Status != ib.Success {
		t.Fatalf("%+v", w)
	}
}

func TestCompleterACKBeyondResendPointSkipsAhead(t *testing.T) {
	c := newCtx(t, defaultCfg())
	for i := 0; i < 4; i++ {
		c.post(ib.SendWQE{ID: uint64(i), Opcode: ib.Send, Flags: ib.Signaled, SG: segs(fill(8, 0))})
	}
	c.expect(p(bth.RCSendOnly, 100), p(bth.RCSendOnly, 101), p(bth.RCSendOnly, 102), p(bth.RCSendOnly, 103))
	// A timeout rewinds to 100, but before anything is resent the ACK for
	// 102 (delayed) arrives: 100-102 are done, only 103 is resent.
	c.now = c.qp.Deadline()
	c.qp.Expire(c.now)
	c.respond(req{op: bth.RCAcknowledge, psn: 102, syn: SynACK, msn: 3})
	if w := c.wcs(); len(w) != 3 {
		t.Fatalf("%+v", w)
	}
	c.expect(p(bth.RCSendOnly, 103))
	c.respond(req{op: bth.RCAcknowledge, psn: 103, syn: SynACK, msn: 4})
	if w := c.wcs(); len(w) != 1 || w[0].ID != 3 || c.qp.Deadline() != neverTime() {
		t.Fatalf("%+v", w)
	}
}

// Progress moves with every in-order READ response, before the READ
// completes, and not with a gap or its stale repeats: it is what a
// CQ-moderated application watches to tell slow recovery from a dead peer
// (lab: a READ run under 5 % loss moved for 17 s without a completion).
func TestCompleterProgressCountsInOrderResponses(t *testing.T) {
	c := newCtx(t, defaultCfg())
	dst := make([]byte, 3072)
	c.post(ib.SendWQE{ID: 1, Opcode: ib.RDMARead, Flags: ib.Signaled, SG: segs(dst), RemoteAddr: 0x9000, RKey: 3})
	c.expect(p(bth.RCRDMAReadRequest, 100))
	src := fill(3072, 7)
	if c.qp.Progress != 0 {
		t.Fatalf("progress %d before any response", c.qp.Progress)
	}
	c.respond(req{op: bth.RCRDMAReadResponseFirst, psn: 100, syn: SynACK, msn: 1, payload: src[:1024]})
	if c.qp.Progress != 1 {
		t.Fatalf("progress %d after the FIRST", c.qp.Progress)
	}
	// The MIDDLE is lost: the LAST is a gap, twice; no progress.
	c.respond(req{op: bth.RCRDMAReadResponseLast, psn: 102, syn: SynACK, msn: 1, payload: src[2048:]})
	c.respond(req{op: bth.RCRDMAReadResponseLast, psn: 102, syn: SynACK, msn: 1, payload: src[2048:]})
	if c.qp.Progress != 1 || len(c.wcs()) != 0 {
		t.Fatalf("progress %d after a gap", c.qp.Progress)
	}
	c.expect(p(bth.RCRDMAReadRequest, 101))
	c.respond(req{op: bth.RCRDMAReadResponseFirst, psn: 101, syn: SynACK, msn: 1, payload: src[1024:2048]})
	if c.qp.Progress != 2 || len(c.wcs()) != 0 {
		t.Fatalf("progress %d mid-READ", c.qp.Progress)
	}
	c.respond(req{op: bth.RCRDMAReadResponseLast, psn: 102, syn: SynACK, msn: 1, payload: src[2048:]})
	if w := c.wcs(); len(w) != 1 || !bytes.Equal(dst, src) || c.qp.Progress < 3 {
		t.Fatalf("completions %+v progress %d", w, c.qp.Progress)
	}
}

// TestInitialWindow: a requester with adaptive retransmission sends
// InitialWindow packets before its peer's first answer, then the full
// window; with selective repeat, never more than the responder's receive
// window from its SACKETH.
func TestInitialWindow(t *testing.T) {
	cfg := defaultCfg()
	cfg.MTU = 256
	c := newCtx(t, cfg)
	c.post(ib.SendWQE{ID: 1, Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: segs(make([]byte, 256*300))})
	if got := c.out(); len(got) != InitialWindow || !got[InitialWindow-1].AckReq {
		t.Fatalf("%d packets before any answer, want %d, the last asking for an ACK: %v", len(got), InitialWindow, got)
	}
	c.respond(req{op: bth.RCAcknowledge, psn: 100, syn: SynACK})
	if got := c.out(); len(got) != MaxUnackedPSNs+1-(InitialWindow-1) {
		t.Fatalf("%d more packets after the first ACK, want the window's %d", len(got), MaxUnackedPSNs+1-(InitialWindow-1))
	}

	s := srRequester(t, srCfg()) // answered, selective repeat agreed
	s.post(ib.SendWQE{ID: 1, Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: segs(make([]byte, 1024*300))})
	g := s.out()
	if len(g) != MaxUnackedPSNs {
		t.Fatalf("%d packets, want the BDP window's floor %d", len(g), MaxUnackedPSNs)
	}
	head := g[0].PSN
	// The responder grants 20 PSNs past the one it acknowledges.
	s.respond(req{op: bth.RCAcknowledge, psn: head, syn: SynACK, sr: true, payload: sackWin(head.Next(), 20)})
	if got := s.out(); len(got) != 0 {
		t.Fatalf("%d packets sent beyond the receive window", len(got))
	}
	s.respond(req{op: bth.RCAcknowledge, psn: head.Add(MaxUnackedPSNs - 1), syn: SynACK, sr: true, payload: sackWin(head.Add(MaxUnackedPSNs), 20)})
	if got := s.out(); len(got) != 20 {
		t.Fatalf("%d packets after the window moved, want 20", len(got))
	}
}

// TestInitialWindowWithCongestionControl: DCQCN starts at line rate, so a
// requester running it keeps to InitialWindow before its peer's first
// answer too: the host-congestion CNPs of a receiver many QPs start toward
// at once come a round trip too late for the first windows.
func TestInitialWindowWithCongestionControl(t *testing.T) {
	c := newCCCtx(t, nil)
	c.post(ib.SendWQE{ID: 1, Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: segs(make([]byte, 1024*300))})
	if got := c.out(); len(got) != InitialWindow || !got[InitialWindow-1].AckReq {
		t.Fatalf("%d packets before any answer, want %d, the last asking for an ACK", len(got), InitialWindow)
	}
	c.respond(req{op: bth.RCAcknowledge, psn: 100, syn: SynACK})
	if got := c.out(); len(got) <= 1 {
		t.Fatalf("%d more packets after the first ACK", len(got))
	}
}

package rc

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/checker"
)

func TestRTTEstimatorRFC6298(t *testing.T) {
	var e rttEstimator
	if e.rto(time.Second) != InitialRTO || e.rto(time.Millisecond) != time.Millisecond {
		t.Fatalf("before samples: rto %v", e.rto(time.Second))
	}
	e.sample(0, 2*time.Millisecond)
	if e.srtt != 2*time.Millisecond || e.rttvar != time.Millisecond || e.rto(time.Second) != 6*time.Millisecond {
		t.Fatalf("first sample: srtt %v rttvar %v rto %v", e.srtt, e.rttvar, e.rto(time.Second))
	}
	e.sample(0, 4*time.Millisecond)
	// RTTVAR = 3/4·1 + 1/4·|2-4| = 1.25 ms, SRTT = 7/8·2 + 1/8·4 = 2.25 ms.
	if e.srtt != 2250*time.Microsecond || e.rttvar != 1250*time.Microsecond || e.rto(time.Second) != 7250*time.Microsecond {
		t.Fatalf("second sample: srtt %v rttvar %v rto %v", e.srtt, e.rttvar, e.rto(time.Second))
	}
	if e.rto(5*time.Millisecond) != 5*time.Millisecond || e.minRTT != 2*time.Millisecond {
		t.Fatalf("cap or minimum: rto %v min %v", e.rto(5*time.Millisecond), e.minRTT)
	}
	// A short path: the RTO is floored, the probe at two SRTTs (floored too).
	var f rttEstimator
	for i := 0; i < 20; i++ {
		f.sample(0, 30*time.Microsecond)
	}
	if f.rto(time.Second) != RTOMin || f.pto(RTOMin) != PTOMin {
		t.Fatalf("short path: rto %v pto %v", f.rto(time.Second), f.pto(RTOMin))
	}
	for i := 0; i < 40; i++ {
		f.sample(0, 400*time.Microsecond)
	}
	if p := f.pto(f.rto(time.Second)); p < 790*time.Microsecond || p > 800*time.Microsecond {
		t.Fatalf("pto %v, want about two SRTTs (srtt %v)", p, f.srtt)
	}
	// The minimum is kept for minRTTWindow, then a larger sample replaces it.
	if f.minRTT != 30*time.Microsecond {
		t.Fatalf("min %v", f.minRTT)
	}
	f.sample(clock.Time(minRTTWindow)+1, 400*time.Microsecond)
	if f.minRTT != 400*time.Microsecond {
		t.Fatalf("min %v after the window", f.minRTT)
	}
}

// fourPacketSend is a requester in recovery mode rec, its local ACK
// timeout 2^8 · 4.096 µs, with an RTT sample of 50 µs and a signaled
// 4000-byte SEND posted: PSNs 101-104, none built yet.
func fourPacketSend(t *testing.T, rec ib.Recovery) *tctx {
	cfg := defaultCfg()
	cfg.Recovery, cfg.Timeout = rec, 8
	c := newCtx(t, cfg)
	c.sampled(50 * time.Microsecond)
	c.post(ib.SendWQE{ID: 1, Opcode: ib.Send, Flags: ib.Signaled, SG: segs(fill(4000, 0))})
	return c
}

// sampled gives the QP an RTT sample of d: one SEND answered d later.
func (c *tctx) sampled(d time.Duration) {
	c.t.Helper()
	c.post(ib.SendWQE{ID: 999, Opcode: ib.Send, SG: segs(fill(4, 0))})
	g := c.out()
	c.now = c.now.Add(d)
	c.respond(req{op: bth.RCAcknowledge, psn: g[len(g)-1].PSN, syn: SynACK})
	c.wcs()
}

// TestAdaptiveRTTSamples: an ACK, the first packet of a READ reply and an
// atomic ACK each give one sample; a repeated ACK and the answer to a
// retransmitted packet give none (Karn), unless the answer came too soon
// to be the repeat's.
func TestAdaptiveRTTSamples(t *testing.T) {
	c := newCtx(t, defaultCfg())
	c.sampled(40 * time.Microsecond)
	if srtt, _, _ := c.qp.RTT(); srtt != 40*time.Microsecond || c.qp.req.rtt.samples != 1 {
		t.Fatalf("srtt %v after one ACK", srtt)
	}
	c.respond(req{op: bth.RCAcknowledge, psn: 100, syn: SynACK}) // stale repeat
	dst := make([]byte, 2048)
	c.post(ib.SendWQE{ID: 1, Opcode: ib.RDMARead, Flags: ib.Signaled, SG: segs(dst), RemoteAddr: 0x1000, RKey: 1})
	c.post(ib.SendWQE{ID: 2, Opcode: ib.AtomicFetchAndAdd, Flags: ib.Signaled, SG: segs(make([]byte, 8)), Length: 8, RemoteAddr: 0x8, RKey: 1})
	c.expect(p(bth.RCRDMAReadRequest, 101), p(bth.RCFetchAdd, 103))
	c.now = c.now.Add(80 * time.Microsecond)
	c.respond(req{op: bth.RCRDMAReadResponseFirst, psn: 101, syn: SynACK, payload: make([]byte, 1024)})
	c.respond(req{op: bth.RCRDMAReadResponseLast, psn: 102, syn: SynACK, payload: make([]byte, 1024)})
	c.respond(req{op: bth.RCAtomicAcknowledge, psn: 103, syn: SynACK})
	if n := c.qp.req.rtt.samples; n != 3 {
		t.Fatalf("%d samples, want 3 (ACK, READ FIRST, atomic ACK)", n)
	}
	if w := c.wcs(); len(w) != 2 {
		t.Fatalf("%+v", w)
	}
	// A packet sent twice gives no sample when either copy may have been
	// answered: the answer comes at least the minimum RTT after the
	// repeat.
	c.post(ib.SendWQE{ID: 3, Opcode: ib.Send, SG: segs(fill(4, 0))})
	c.expect(p(bth.RCSendOnly, 104))
	c.now = c.qp.Deadline()
	c.qp.Expire(c.now)
	c.expect(p(bth.RCSendOnly, 104)) // the tail-loss probe
	_, _, minRTT := c.qp.RTT()
	c.now = c.now.Add(minRTT)
	c.respond(req{op: bth.RCAcknowledge, psn: 104, syn: SynACK})
	if n := c.qp.req.rtt.samples; n != 3 {
		t.Fatalf("%d samples after a retransmitted packet's ambiguous ACK", n)
	}
	// An answer sooner than that can only be the first copy's: the peer
	// was slow, not the packet lost, and the sample is the whole wait.
	c.post(ib.SendWQE{ID: 4, Opcode: ib.Send, SG: segs(fill(4, 0))})
	c.expect(p(bth.RCSendOnly, 105))
	sent := c.now
	c.now = c.qp.Deadline()
	c.qp.Expire(c.now)
	c.expect(p(bth.RCSendOnly, 105))
	c.now = c.now.Add(minRTT / 2)
	c.respond(req{op: bth.RCAcknowledge, psn: 105, syn: SynACK})
	if n, last := c.qp.req.rtt.samples, c.now.Sub(sent); n != 4 || c.qp.req.rtt.srtt <= 40*time.Microsecond || last <= c.qp.adpPTO()/2 {
		t.Fatalf("after a spurious probe: %d samples, srtt %v (the wait was %v)", n, c.qp.req.rtt.srtt, last)
	}
}

// TestAdaptiveProbeThenRTO: with nothing acknowledged the requester first
// sends one tail-loss probe (the oldest packet, AckReq), then at each RTO
// that packet again, the RTO doubling each time; no retry is spent, and no
// window is sent again until an answer shows what the peer lacks. The
// backoff lasts until a fresh RTT sample: progress made of answers to
// repeated packets does not end it (Karn).
func TestAdaptiveProbeThenRTO(t *testing.T) {
	c := newCtx(t, defaultCfg())
	c.sampled(50 * time.Microsecond) // PTO 100 µs, RTO 1 ms
	for i := 0; i < 3; i++ {
		c.post(ib.SendWQE{ID: uint64(i), Opcode: ib.Send, Flags: ib.Signaled, SG: segs(fill(8, 0))})
	}
	c.expect(p(bth.RCSendOnly, 101), p(bth.RCSendOnly, 102), p(bth.RCSendOnly, 103))
	t0 := c.now
	if d := c.qp.Deadline(); d != t0.Add(PTOMin) {
		t.Fatalf("first deadline %v, want the probe at %v", d, t0.Add(PTOMin))
	}
	c.now = c.qp.Deadline()
	c.qp.Expire(c.now)
	g := c.expect(p(bth.RCSendOnly, 101))
	if !g[0].AckReq || c.qp.TLPProbes != 1 || c.qp.AdpRetrans != 1 || c.qp.req.retryLeft != 7 {
		t.Fatalf("probe %v: counters %+v retries left %d", g[0], c.qp.Counters, c.qp.req.retryLeft)
	}
	want := RTOMin
	for i := 1; i <= 4; i++ {
		if d := c.qp.Deadline(); d != t0.Add(want) {
			t.Fatalf("RTO %d at %v, want %v", i, d, t0.Add(want))
		}
		c.now = c.qp.Deadline()
		t0 = c.now
		c.qp.Expire(c.now)
		g := c.expect(p(bth.RCSendOnly, 101))
		if !g[0].AckReq || c.qp.AdpRetransTO != uint64(i) || c.qp.Retransmits != 0 || c.qp.req.retryLeft != 7 || c.qp.Timeouts != 0 {
			t.Fatalf("after RTO %d: %v %+v, retries left %d", i, g[0], c.qp.Counters, c.qp.req.retryLeft)
		}
		want *= 2
	}
	// The answer: the peer had lost 101, and so dropped what followed;
	// the requester goes back (101 asked for an ACK when first sent, so
	// half an SRTT later: the ACK might have been that copy's). Progress
	// ends the backoff.
	c.now = c.now.Add(time.Millisecond)
	c.respond(req{op: bth.RCAcknowledge, psn: 101, syn: SynACK})
	c.fastDue()
	c.expect(p(bth.RCSendOnly, 102), p(bth.RCSendOnly, 103))
	if c.qp.req.backoff != 0 || c.qp.FastRetrans != 1 || c.qp.Retransmits != 1 {
		t.Fatalf("after the answer: backoff %d, %+v", c.qp.req.backoff, c.qp.Counters)
	}
}

// TestSelectiveRTOResendsHead: with selective repeat agreed, an RTO
// resends the oldest unacknowledged packet alone (AckReq), doubling as
// before, since the responder keeps what it got and the SACK that answers
// tells RACK the rest: a peer that was only slow to answer costs one
// packet per expiry, not the window.
func TestSelectiveRTOResendsHead(t *testing.T) {
	c := srRequester(t, srCfg())
	for i := 0; i < 3; i++ {
		c.post(ib.SendWQE{ID: uint64(i), Opcode: ib.Send, Flags: ib.Signaled, SG: segs(fill(8, 0))})
	}
	g := c.out()
	if len(g) != 3 {
		t.Fatalf("%v", g)
	}
	head := g[0].PSN
	c.now = c.qp.Deadline()
	c.qp.Expire(c.now) // the tail-loss probe
	c.expect(p(bth.RCSendOnly, head))
	rto := c.qp.adpRTO()
	for i := 1; i <= 3; i++ {
		c.now = c.qp.Deadline()
		c.qp.Expire(c.now)
		g := c.expect(p(bth.RCSendOnly, head))
		if !g[0].AckReq || c.qp.AdpRetransTO != uint64(i) || c.qp.Retransmits != 0 || c.qp.TLPProbes != 1 || c.qp.AdpRetrans != uint64(i+1) {
			t.Fatalf("after RTO %d: %v %+v", i, g[0], c.qp.Counters)
		}
		if d := c.qp.Deadline(); d != c.now.Add(rto<<i) {
			t.Fatalf("RTO %d: next at %v, want %v", i, d, c.now.Add(rto<<i))
		}
	}
	// The answer: the head and the last came, the middle was lost.
	c.respond(req{op: bth.RCAcknowledge, psn: head, syn: SynACK, sr: true, payload: sack(head.Next(), head.Add(2))})
	c.expect(p(bth.RCSendOnly, head.Next()))
}

// TestSelectiveLocalAckTimeoutResendsHead: with selective repeat the local
// ACK timeout spends its retries as ever, and gives up on time, but each
// expiry resends the oldest unacknowledged packet alone.
func TestSelectiveLocalAckTimeoutResendsHead(t *testing.T) {
	cfg := srCfg()
	cfg.Timeout, cfg.RetryCnt = 8, 2 // 1.05 ms
	c := srRequester(t, cfg)
	for i := 0; i < 3; i++ {
		c.post(ib.SendWQE{ID: uint64(i), Opcode: ib.Send, Flags: ib.Signaled, SG: segs(fill(8, 0))})
	}
	head := c.out()[0].PSN
	for c.qp.Timeouts < 3 && !c.qp.Failed() {
		c.now = c.qp.Deadline()
		timeouts := c.qp.Timeouts
		c.qp.Expire(c.now)
		g := c.out()
		if c.qp.Timeouts > timeouts && !c.qp.Failed() && (len(g) != 1 || g[0].PSN != head) {
			t.Fatalf("local ACK timeout %d resent %v, want %d alone", c.qp.Timeouts, g, head)
		}
	}
	if w := c.wcs(); c.qp.Timeouts != 3 || len(w) == 0 || w[0].Status != ib.RetryExcErr {
		t.Fatalf("after %d timeouts: %+v", c.qp.Timeouts, w)
	}
}

// TestSelectiveSACKIsProgress: packets newly selectively acknowledged are
// forward progress for the local ACK timer and the retry budget: a hole
// whose retransmissions keep being lost does not end in RETRY_EXC_ERR
// while the responder takes everything else.
func TestSelectiveSACKIsProgress(t *testing.T) {
	cfg := srCfg()
	cfg.Timeout, cfg.RetryCnt = 8, 1 // 1.05 ms, one retry: given up after about 2 ms of silence
	c := srRequester(t, cfg)
	head := bth.PSN(0)
	var have []bth.PSN
	for i := 0; i < 20; i++ { // 20 × 0.5 ms, far beyond the budget
		c.post(ib.SendWQE{ID: uint64(i), Opcode: ib.Send, Flags: ib.Signaled, SG: segs(fill(8, 0))})
		g := c.out()
		if i == 0 {
			head = g[0].PSN // lost, and every repeat of it too
		}
		for _, x := range g {
			if x.PSN != head {
				have = append(have, x.PSN)
			}
		}
		c.now = c.now.Add(500 * time.Microsecond)
		c.qp.Expire(c.now)
		c.respond(srAck(head.Prev(), have...))
		if c.qp.Failed() {
			t.Fatalf("gave up after %d SACKs of new packets: %+v", i+1, c.qp.Counters)
		}
	}
}

// gbnPeer answers as a go-back-N responder (rxe) would: it holds nothing
// beyond a hole and answers a duplicate with an ACK of the last PSN it has.
type gbnCase struct {
	name      string
	peerHas   bth.PSN // the peer has every PSN before this one
	answer    bth.PSN // its ACK to the probe of 101
	wantAgain []bth.PSN
}

// TestAdaptiveProbeAnswerFastRetransmit: four packets 101..104, none
// acknowledged. The probe of 101 is answered with an ACK of the last PSN
// the peer has in order; everything after it was sent before the probe,
// so the requester resends it at once, without a retry or a timeout.
func TestAdaptiveProbeAnswerFastRetransmit(t *testing.T) {
	for _, k := range []gbnCase{
		{"ACK lost, peer has all", 105, 104, nil},
		{"head lost, the probe fills it", 101, 101, []bth.PSN{102, 103, 104}},
	} {
		t.Run(k.name, func(t *testing.T) {
			c := probedFour(t)
			c.respond(req{op: bth.RCAcknowledge, psn: k.answer, syn: SynACK})
			c.fastDue()
			var want []checker.Want
			for _, q := range k.wantAgain {
				want = append(want, p(bth.RCSendOnly, q))
			}
			c.expect(want...)
			fast := uint64(0)
			if len(k.wantAgain) > 0 {
				fast = 1
			}
			if c.qp.FastRetrans != fast || c.qp.req.retryLeft != 7 || c.qp.Timeouts != 0 {
				t.Fatalf("fast %d retries left %d timeouts %d", c.qp.FastRetrans, c.qp.req.retryLeft, c.qp.Timeouts)
			}
			if w := c.wcs(); len(w) != int(k.answer-100) {
				t.Fatalf("%d completions, want %d", len(w), k.answer-100)
			}
		})
	}
	// An ACK beyond the probed PSN may have left the peer before the probe
	// came (a peer that stalled answers its backlog late): nothing is
	// resent at once; the next probe, of the first PSN the peer lacks,
	// finds the tail lost.
	c := probedFour(t)
	c.respond(req{op: bth.RCAcknowledge, psn: 102, syn: SynACK})
	c.expect()
	if c.qp.req.fastAt != clock.Never {
		t.Fatal("an ACK beyond the probe set a fast retransmission")
	}
	c.now = c.qp.Deadline()
	c.qp.Expire(c.now)
	c.expect(p(bth.RCSendOnly, 103))
	c.now = c.now.Add(50 * time.Microsecond)
	c.respond(req{op: bth.RCAcknowledge, psn: 103, syn: SynACK})
	c.fastDue()
	c.expect(p(bth.RCSendOnly, 104))
	if c.qp.FastRetrans != 1 || c.qp.TLPProbes != 2 || c.qp.Timeouts != 0 {
		t.Fatalf("tail lost: %+v", c.qp.Counters)
	}
	// A packet sent after the probe may still be on its way: an answer
	// that stops before it calls for no resend.
	c = newCtx(t, defaultCfg())
	c.sampled(50 * time.Microsecond)
	c.post(ib.SendWQE{ID: 1, Opcode: ib.Send, SG: segs(fill(8, 0))})
	c.out()
	c.now = c.qp.Deadline()
	c.qp.Expire(c.now)
	c.expect(p(bth.RCSendOnly, 101))
	c.now = c.now.Add(time.Microsecond)
	c.post(ib.SendWQE{ID: 2, Opcode: ib.Send, SG: segs(fill(8, 0))})
	c.expect(p(bth.RCSendOnly, 102))
	c.respond(req{op: bth.RCAcknowledge, psn: 101, syn: SynACK})
	c.expect()
	if c.qp.FastRetrans != 0 {
		t.Fatal("went back over a packet sent after the probe")
	}
}

// probedFour sends four signaled SENDs (PSNs 101–104) with an RTT
// sampled, lets the tail-loss probe of 101 go out, and answers nothing:
// the probe's answer is the caller's, 50 µs later.
func probedFour(t *testing.T) *tctx {
	t.Helper()
	c := newCtx(t, defaultCfg())
	c.sampled(50 * time.Microsecond)
	for i := 0; i < 4; i++ {
		c.post(ib.SendWQE{ID: uint64(i), Opcode: ib.Send, Flags: ib.Signaled, SG: segs(fill(8, 0))})
	}
	c.out()
	c.now = c.qp.Deadline()
	c.qp.Expire(c.now)
	c.expect(p(bth.RCSendOnly, 101))
	c.now = c.now.Add(50 * time.Microsecond)
	return c
}

// fastDue runs a fast retransmission the QP put off (a probe's answer
// that may have been a late ACK of the probed packet's first copy).
func (c *tctx) fastDue() {
	c.t.Helper()
	if c.qp.req.fastAt == clock.Never {
		return
	}
	if d := c.qp.Deadline(); d != c.qp.req.fastAt || d > c.now.Add(c.qp.req.rtt.srtt) {
		c.t.Fatalf("deadline %v, want the fast retransmission at %v, within an SRTT of %v", d, c.qp.req.fastAt, c.now)
	}
	c.now = c.qp.Deadline()
	c.qp.Expire(c.now)
}

// TestProbeAnswerOrLateACK: an ACK of the probed PSN is the probe's answer
// (the probe filled a hole, and what followed was dropped) unless an
// earlier copy of that packet asked for an ACK too: then it may be that
// copy's, late (a peer that stalled answers its backlog), and the ACKs of
// what followed come right behind it. The requester goes back at once in
// the first case, half an SRTT later in the second unless progress comes.
func TestProbeAnswerOrLateACK(t *testing.T) {
	// A three-packet SEND: AckReq on its last packet only.
	start := func(t *testing.T) *tctx {
		c := newCtx(t, defaultCfg())
		c.sampled(50 * time.Microsecond)
		c.post(ib.SendWQE{ID: 1, Opcode: ib.Send, Flags: ib.Signaled, SG: segs(fill(3000, 0))})
		c.post(ib.SendWQE{ID: 2, Opcode: ib.Send, Flags: ib.Signaled, SG: segs(fill(8, 0))})
		c.expect(p(bth.RCSendFirst, 101), p(bth.RCSendMiddle, 102), p(bth.RCSendLast, 103), p(bth.RCSendOnly, 104))
		c.now = c.qp.Deadline()
		c.qp.Expire(c.now)
		c.expect(p(bth.RCSendFirst, 101))
		c.now = c.now.Add(50 * time.Microsecond)
		return c
	}
	// 101 never asked for an ACK: its ACK answers the probe.
	c := start(t)
	c.respond(req{op: bth.RCAcknowledge, psn: 101, syn: SynACK})
	c.expect(p(bth.RCSendMiddle, 102), p(bth.RCSendLast, 103), p(bth.RCSendOnly, 104))
	if c.qp.FastRetrans != 1 {
		t.Fatalf("%+v", c.qp.Counters)
	}
	// 103 did: probed after 101 and 102 were acknowledged, an ACK of 103
	// may be its first copy's, and the ACK of 104 follows: no resend.
	acked102 := func(t *testing.T) *tctx {
		c := newCtx(t, defaultCfg())
		c.sampled(50 * time.Microsecond)
		c.post(ib.SendWQE{ID: 1, Opcode: ib.Send, Flags: ib.Signaled, SG: segs(fill(3000, 0))})
		c.post(ib.SendWQE{ID: 2, Opcode: ib.Send, Flags: ib.Signaled, SG: segs(fill(8, 0))})
		c.out()
		c.now = c.now.Add(50 * time.Microsecond)
		c.respond(req{op: bth.RCAcknowledge, psn: 102, syn: SynACK})
		c.now = c.qp.Deadline()
		c.qp.Expire(c.now)
		c.expect(p(bth.RCSendLast, 103))
		return c
	}
	c = acked102(t)
	c.now = c.now.Add(50 * time.Microsecond)
	c.respond(req{op: bth.RCAcknowledge, psn: 103, syn: SynACK})
	c.expect()
	c.now = c.now.Add(5 * time.Microsecond)
	c.respond(req{op: bth.RCAcknowledge, psn: 104, syn: SynACK})
	c.expect()
	if c.qp.FastRetrans != 0 || len(c.wcs()) != 2 {
		t.Fatalf("went back over a late ACK: %+v", c.qp.Counters)
	}
	// The same answer with nothing behind it: 104 was lost.
	c = acked102(t)
	c.now = c.now.Add(50 * time.Microsecond)
	c.respond(req{op: bth.RCAcknowledge, psn: 103, syn: SynACK})
	c.fastDue()
	c.expect(p(bth.RCSendOnly, 104))
	if c.qp.FastRetrans != 1 {
		t.Fatalf("%+v", c.qp.Counters)
	}
}

// TestGiveUpPatienceSameInEveryMode: a peer that stops answering is given
// up on (RETRY_EXC_ERR) exactly (retry_cnt+1) local ACK timeouts after
// the last forward progress, whatever the recovery mode retransmitted in
// between: adaptive retransmissions spend no retry.
func TestGiveUpPatienceSameInEveryMode(t *testing.T) {
	for _, m := range recoveryModes {
		for _, retry := range []uint8{0, 3, 7} {
			for _, progress := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s_retry%d_progress%v", m.name, retry, progress), func(t *testing.T) {
					c := m.ctx(t, retry)
					tack := AckTimeout(8)
					c.sampled(50 * time.Microsecond)
					for i := 0; i < 3; i++ {
						c.post(ib.SendWQE{ID: uint64(i), Opcode: ib.Send, Flags: ib.Signaled, SG: segs(fill(8, 0))})
					}
					c.out()
					last, timeouts := c.now, uint64(0)
					if progress {
						// Whatever is due before half a local ACK timeout,
						// then an ACK of the first packet.
						mid := c.now.Add(tack / 2)
						for c.qp.Deadline() <= mid {
							c.now = c.qp.Deadline()
							c.qp.Expire(c.now)
							c.out()
						}
						c.now = mid
						c.respond(req{op: bth.RCAcknowledge, psn: 101, syn: SynACK})
						last = c.now
						c.out()
					}
					for step := 0; !c.qp.Failed(); step++ {
						if step > 1000 {
							t.Fatal("never gave up")
						}
						c.now = c.qp.Deadline()
						c.qp.Expire(c.now)
						c.out()
					}
					if want := last.Add(time.Duration(retry+1) * tack); c.now != want {
						t.Fatalf("gave up at %v, want %v (last progress %v + %d × %v)", c.now, want, last, retry+1, tack)
					}
					w := c.wcs()
					if len(w) == 0 || w[len(w)-1].Status != ib.RetryExcErr {
						t.Fatalf("completions %+v", w)
					}
					if m.rec != ib.RecoveryTimeout && c.qp.AdpRetrans == 0 {
						t.Fatal("no adaptive retransmission before giving up")
					}
					if c.qp.Timeouts-timeouts != uint64(retry)+1 {
						t.Fatalf("%d local ACK timeouts after the last progress, want %d", c.qp.Timeouts-timeouts, retry+1)
					}
				})
			}
		}
	}
}

// TestAdaptiveRNRWaitHasNoProbe: during an RNR wait the requester waits as
// told; the adaptive timers restart with the resend.
func TestAdaptiveRNRWaitHasNoProbe(t *testing.T) {
	c := newCtx(t, defaultCfg())
	c.sampled(50 * time.Microsecond)
	c.post(ib.SendWQE{ID: 1, Opcode: ib.Send, Flags: ib.Signaled, SG: segs(fill(8, 0))})
	c.out()
	c.respond(req{op: bth.RCAcknowledge, psn: 101, syn: SynRNRNAK | 14}) // 1.28 ms
	if d := c.qp.Deadline(); d != c.now.Add(1280*time.Microsecond) {
		t.Fatalf("deadline %v during the RNR wait", d)
	}
	c.now = c.qp.Deadline()
	c.qp.Expire(c.now)
	c.expect(p(bth.RCSendOnly, 101))
	if d := c.qp.Deadline(); d != c.now.Add(c.qp.adpPTO()) || c.qp.TLPProbes != 0 {
		t.Fatalf("after the resend: deadline %v probes %d", d, c.qp.TLPProbes)
	}
}

// TestRecoveryTimeoutIsRxeTiming: ib.RecoveryTimeout keeps only the local ACK
// timer, and UC has no timer at all.
func TestRecoveryTimeoutIsRxeTiming(t *testing.T) {
	cfg := defaultCfg()
	cfg.Recovery = ib.RecoveryTimeout
	c := newCtx(t, cfg)
	c.post(ib.SendWQE{ID: 1, Opcode: ib.Send, SG: segs(fill(8, 0))})
	c.out()
	if d := c.qp.Deadline(); d != c.now.Add(AckTimeout(14)) {
		t.Fatalf("deadline %v", d)
	}
	cfg = defaultCfg()
	cfg.UC = true
	c = newCtx(t, cfg)
	c.post(ib.SendWQE{ID: 1, Opcode: ib.Send, SG: segs(fill(8, 0))})
	c.out()
	if d := c.qp.Deadline(); d != clock.Never {
		t.Fatalf("UC deadline %v", d)
	}
}

// TestDefaultRecoveryByPeer: the default mode runs the adaptive timers
// toward every peer, as ConnectX does (a tail-loss probe two SRTTs after
// the request, long before the local ACK timeout), and selective repeat
// only with a softrnic QP number that agrees; RecoveryTimeout keeps the
// local ACK timer alone.
func TestDefaultRecoveryByPeer(t *testing.T) {
	for _, tc := range []struct {
		name  string
		dest  uint32
		rec   ib.Recovery
		probe bool
	}{
		{"rxe peer", 0x22, ib.RecoveryDefault, true},
		{"softrnic peer", SoftQPNTag | 0x22, ib.RecoveryDefault, true},
		{"rxe peer, timeout", 0x22, ib.RecoveryTimeout, false},
	} {
		cfg := defaultCfg()
		cfg.Recovery, cfg.DestQPN = tc.rec, tc.dest
		c := newSRCtx(t, cfg)
		c.post(ib.SendWQE{ID: 1, Opcode: ib.Send, SG: segs(fill(8, 0))})
		g := c.out()
		want := c.now.Add(AckTimeout(14))
		if tc.probe {
			want = c.now.Add(c.qp.adpPTO())
		}
		if d := c.qp.Deadline(); d != want {
			t.Fatalf("%s: deadline %v, want %v", tc.name, d, want)
		}
		if sr := g[0].Raw[8]&0x40 != 0; sr != (tc.dest&SoftQPNTag == SoftQPNTag && tc.rec == ib.RecoveryDefault) {
			t.Fatalf("%s: selective-repeat mark %v", tc.name, sr)
		}
	}
}

// TestRequestsByteIdenticalWithoutAgreement: toward a peer whose QP number
// is not softrnic's, a QP asking for selective repeat sends exactly the
// bytes of one that never heard of it; toward a softrnic QP number it
// marks its requests, and a peer that does not mark its answers (one
// that ignores the bit) keeps it on go-back-N.
func TestRequestsByteIdenticalWithoutAgreement(t *testing.T) {
	run := func(cfg Config, pool bool) ([]checker.Packet, *tctx) {
		c := newCtx(t, cfg)
		if pool {
			c = newSRCtx(t, cfg)
		}
		c.post(ib.SendWQE{ID: 1, Opcode: ib.RDMAWrite, SG: segs(fill(3000, 1)), RemoteAddr: 0x100, RKey: 1})
		c.post(ib.SendWQE{ID: 2, Opcode: ib.RDMARead, SG: segs(make([]byte, 100)), RemoteAddr: 0x100, RKey: 1})
		c.post(ib.SendWQE{ID: 3, Opcode: ib.AtomicFetchAndAdd, SG: segs(make([]byte, 8)), Length: 8, RemoteAddr: 0x8, RKey: 1})
		return c.out(), c
	}
	old := defaultCfg()
	old.Recovery = ib.RecoveryTimeout
	want, _ := run(old, false)
	sel := defaultCfg()
	sel.Recovery = ib.RecoveryDefault
	got, _ := run(sel, true) // selective by default, pool, rxe-style QPN
	for i := range want {
		if !bytes.Equal(got[i].Raw, want[i].Raw) {
			t.Fatalf("packet %d differs:\n% x\n% x", i, got[i].Raw, want[i].Raw)
		}
	}
	marked, c := run(srCfg(), true)
	for i := range marked {
		if !marked[i].SR || !bytes.Equal(marked[i].Raw[9:], want[i].Raw[9:]) {
			t.Fatalf("packet %d toward a softrnic QPN: % x", i, marked[i].Raw)
		}
	}
	// The peer answers like rxe: unmarked, a sequence NAK at 101.
	c.respond(req{op: bth.RCAcknowledge, psn: 101, syn: SynNAKPSNSeq})
	if r, _ := c.qp.SelectiveRepeat(); r {
		t.Fatal("selective repeat without the peer's agreement")
	}
	c.expect(p(bth.RCRDMAWriteMiddle, 101), p(bth.RCRDMAWriteLast, 102), p(bth.RCRDMAReadRequest, 103), p(bth.RCFetchAdd, 104))
}

// recoveryMode is a recovery mode the give-up tests run in.
type recoveryMode struct {
	name string
	rec  ib.Recovery
	sr   bool // the peer agreed to selective repeat
}

var recoveryModes = []recoveryMode{{"timeout", ib.RecoveryTimeout, false}, {"adaptive", ib.RecoveryAdaptive, false}, {"selective", ib.RecoverySelective, true}}

// ctx is a requester in mode m with retry_cnt retry and a local ACK
// timeout of 2^8 · 4.096 µs (1.048576 ms).
func (m recoveryMode) ctx(t *testing.T, retry uint8) *tctx {
	cfg := defaultCfg()
	if m.sr {
		cfg = srCfg()
	}
	cfg.Recovery, cfg.RetryCnt, cfg.Timeout = m.rec, retry, 8
	if m.sr {
		return newSRCtx(t, cfg)
	}
	return newCtx(t, cfg)
}

// TestWaitingPacketsAreNotLate: once everything on the wire is
// acknowledged, the rest of a message that waits its turn to be sent
// (behind other QPs, a window, a pacer) runs neither the local ACK timer
// nor the RTO, as rxe's completer restarts its timer only while a packet
// is outstanding; the next packet sent starts them again. Before, such a
// QP met RTO after RTO with nothing to resend (backing off the next real
// one), and local ACK timeouts that spent its retries.
func TestWaitingPacketsAreNotLate(t *testing.T) {
	for _, rec := range []ib.Recovery{ib.RecoveryAdaptive, ib.RecoveryTimeout} {
		t.Run(rec.String(), func(t *testing.T) {
			c := fourPacketSend(t, rec)
			for want := bth.PSN(101); want <= 102; want++ {
				if n := c.qp.Build(c.now, c.buf); n == 0 || checker.Decode(c.buf[:n]).PSN != want {
					t.Fatalf("PSN %d was not built", want)
				}
			}
			c.now = c.now.Add(50 * time.Microsecond)
			c.respond(req{op: bth.RCAcknowledge, psn: 102, syn: SynACK})
			// 103 and 104 wait; time passes far beyond every timeout.
			if d := c.qp.Deadline(); d != clock.Never {
				t.Fatalf("a timer is armed at %v with nothing on the wire", d)
			}
			c.now = c.now.Add(AckTimeout(c.qp.Config().Timeout) * 20)
			c.qp.Expire(c.now)
			if c.qp.Timeouts != 0 || c.qp.AdpRetransTO != 0 || c.qp.AdpRetrans != 0 {
				t.Fatalf("with nothing on the wire: %+v", c.qp.Counters)
			}
			c.expect(p(bth.RCSendMiddle, 103), p(bth.RCSendLast, 104))
			if d := c.qp.Deadline(); d == clock.Never || d > c.now.Add(AckTimeout(c.qp.Config().Timeout)) {
				t.Fatalf("after the next packets the timer is at %v (now %v)", d, c.now)
			}
			c.respond(req{op: bth.RCAcknowledge, psn: 104, syn: SynACK})
			if w := c.wcs(); len(w) != 1 || w[0].ID != 1 || w[0].Status != ib.Success {
				t.Fatalf("completions %+v", w)
			}
		})
	}
}

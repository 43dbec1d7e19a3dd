package rc

import (
	"bytes"
	"testing"
	"time"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/ib"
)

// stalls is a peer that goes silent now and then, as rxe in the lab's
// guest under emulation does: from start, windows of the given durations
// (in turn, again and again) separated by gap, during which what the peer
// sends waits and leaves when the window ends.
func stalls(start, gap time.Duration, durs ...time.Duration) func(clock.Time) clock.Time {
	return func(at clock.Time) clock.Time {
		s := clock.Time(0).Add(start)
		for i := 0; ; i++ {
			e := s.Add(durs[i%len(durs)])
			if at < s {
				return at
			}
			if at < e {
				return e
			}
			s = e.Add(gap)
		}
	}
}

// labStalls are pauses of 2 to 15 ms every millisecond or so: longer than
// any RTO the peer's usual RTT gives, as the lab's rxe shows.
var labStalls = stalls(time.Millisecond, time.Millisecond, 3*time.Millisecond, 8*time.Millisecond, 2*time.Millisecond, 15*time.Millisecond, 5*time.Millisecond)

// gbnStalling is the lab's rxe: a go-back-N peer (its QP number is not
// softrnic's) that stalls, toward a requester in the default mode.
func gbnStalling(loss float64) pairOpts {
	o := streamLink
	o.mtu, o.timeout, o.stallB, o.loss = 1024, 14, labStalls, loss
	return o
}

// TestStalledPeerWriteStream: a WRITE stream toward a go-back-N peer whose
// answers stall for milliseconds, nothing lost. Adaptive retransmission
// runs (the default mode, toward any peer), and what it costs the peer is
// the packets its timers repeat, one per expiry: no window is sent again,
// and the backoff holds until a fresh RTT sample, so a stall meets a few
// expiries, not one per RTO. (Before, each RTO went back N: the peer got
// tens of windows again.)
func TestStalledPeerWriteStream(t *testing.T) {
	_, p := runStream(t, gbnStalling(0), 65536, 200)
	a, b := &p.a.Counters, &p.b.Counters
	t.Logf("%v: A repeated %d packets (%d go-back-N, %d RTOs, %d probes), B counted %d duplicates",
		p.now, a.RetransPkts, a.Retransmits, a.AdpRetransTO, a.TLPProbes, b.RxDuplicate)
	if a.AdpRetrans == 0 {
		t.Fatal("no adaptive retransmission: the stalls did not exercise the timers")
	}
	if a.Retransmits != 0 || a.FastRetrans != 0 || a.RetransPkts != a.AdpRetrans || b.RxDuplicate != a.RetransPkts {
		t.Fatalf("nothing was lost, yet A went back N or repeated more than one packet per expiry: %+v; B %d duplicates", *a, b.RxDuplicate)
	}
	if a.AdpRetrans > 40 {
		t.Fatalf("%d adaptive retransmissions over 11 stalls: the backoff did not hold", a.AdpRetrans)
	}
}

// runReads reads n regions of size bytes from B with depth READs
// outstanding (read_bw's tx depth), checks every completion and byte, and
// returns the pair.
func runReads(t *testing.T, o pairOpts, size, n, depth int) *pair {
	t.Helper()
	p := newPairOpts(o)
	src := &testMR{va: 0x100000, buf: fill(size, 3), access: ib.RemoteRead, valid: true}
	p.memB.mrs[0x77] = src
	dsts := make([][]byte, n)
	posted, done := 0, 0
	for done < n {
		for posted < n && posted-done < depth {
			dsts[posted] = make([]byte, size)
			w := ib.SendWQE{ID: uint64(posted), Opcode: ib.RDMARead, Flags: ib.Signaled, SG: segs(dsts[posted]), Length: uint32(size),
				RemoteAddr: src.va, RKey: 0x77}
			if !p.a.Post(&w) {
				t.Fatal("post")
			}
			posted++
		}
		progressed := p.step()
		p.b.TakeCompletions()
		wcs := p.a.TakeCompletions()
		for _, c := range wcs {
			if c.Status != ib.Success || c.ID != uint64(done) {
				t.Fatalf("completion %+v, want WR %d successful (now %v)", c, done, p.now)
			}
			if !bytes.Equal(dsts[done], src.buf) {
				t.Fatalf("READ %d: wrong bytes", done)
			}
			done++
		}
		if !progressed && len(wcs) == 0 && done < n {
			r := &p.a.req
			t.Fatalf("stalled after %d of %d READs at %v: comp %d psn %d head %d next %d tail %d; B ePSN %d; deadlines %v %v; wires %d %d; %+v", done, n, p.now, r.compPSN, r.psn, r.head, r.next, r.tail, p.b.resp.ePSN, p.a.Deadline(), p.b.Deadline(), len(p.ab.q), len(p.ba.q), p.a.Counters)
		}
		if p.now > clock.Time(time.Hour) {
			t.Fatal("virtual time ran away")
		}
	}
	return p
}

// TestStalledPeerReadStream: 1 MiB READs from a go-back-N peer whose
// replies stall for milliseconds, nothing lost. A READ asked again costs
// such a peer the whole rest of the reply, sent after the one it already
// queued: the requester lets a reply in progress stream (no tail-loss
// probe between its responses, and an RTO of at least twice the longest
// pause seen between them), so the peer sends few responses beyond the
// data. (Before, every pause longer than two SRTTs asked again: the peer
// sent several times the data, as rxe did in the lab.)
func TestStalledPeerReadStream(t *testing.T) {
	const size, n = 1 << 20, 12
	for _, depth := range []int{1, 4} {
		p := runReads(t, gbnStalling(0), size, n, depth)
		a, b := &p.a.Counters, &p.b.Counters
		need := n * size / 1024
		extra := p.ba.sent - need
		t.Logf("depth %d, %v: B sent %d responses for %d (%d more), A asked again %d times (%d RTOs, %d probes)",
			depth, p.now, p.ba.sent, need, extra, a.RetransPkts, a.AdpRetransTO, a.TLPProbes)
		if a.AdpRetrans == 0 {
			t.Fatal("no adaptive retransmission: the stalls did not exercise the timers")
		}
		if extra > need/10 || b.RxDuplicate > 8 {
			t.Fatalf("depth %d: B sent %d responses beyond the %d the data needs, %d duplicate READs", depth, extra, need, b.RxDuplicate)
		}
	}
}

// TestStalledPeerLossRecovers: the same stalls with 1 % of the packets lost
// each way: every WRITE and READ completes with its bytes, without giving
// up, and what was lost is retransmitted by the adaptive timers.
func TestStalledPeerLossRecovers(t *testing.T) {
	_, p := runStream(t, gbnStalling(0.01), 65536, 100)
	if p.ab.lost+p.ba.lost == 0 || p.a.AdpRetrans == 0 {
		t.Fatalf("WRITE: lost %d+%d, adaptive retransmissions %d", p.ab.lost, p.ba.lost, p.a.AdpRetrans)
	}
	p = runReads(t, gbnStalling(0.01), 65536, 100, 4)
	if p.ab.lost+p.ba.lost == 0 || p.a.AdpRetrans+p.a.ImpliedNAKs == 0 {
		t.Fatalf("READ: lost %d+%d, %+v", p.ab.lost, p.ba.lost, p.a.Counters)
	}
}

// TestStreamingReadProbe: once a READ's reply streams, a pause in it meets
// no tail-loss probe, only the RTO (at least twice the longest pause seen
// between its responses), which asks for one response: rxe replays a READ
// asked again after the reply in progress, so a paused reply costs one
// response more, and a reply whose tail was lost shows it by answering in
// order (rxe answers a replay with MIDDLE…LAST, softrnic with ONLY), after
// which the rest is asked for at once.
func TestStreamingReadProbe(t *testing.T) {
	for _, tc := range []struct {
		name     string
		answerOp bth.Opcode
		lost     bool // the reply's tail was lost: the answer comes in order
	}{
		{"paused reply", bth.RCRDMAReadResponseLast, false},
		{"tail lost, rxe's answer", bth.RCRDMAReadResponseLast, true},
		{"tail lost, softrnic's answer", bth.RCRDMAReadResponseOnly, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCtx(t, defaultCfg())
			c.sampled(50 * time.Microsecond)
			dst := make([]byte, 8*1024) // PSNs 101..108
			c.post(ib.SendWQE{ID: 1, Opcode: ib.RDMARead, Flags: ib.Signaled, SG: segs(dst), RemoteAddr: 0x1000, RKey: 1})
			c.expect(p(bth.RCRDMAReadRequest, 101))
			resp := func(op bth.Opcode, psn bth.PSN) {
				c.respond(req{op: op, psn: psn, syn: SynACK, payload: fill(1024, byte(psn))})
			}
			c.now = c.now.Add(50 * time.Microsecond)
			resp(bth.RCRDMAReadResponseFirst, 101)
			c.now = c.now.Add(3 * time.Millisecond) // a pause the reply resumes from
			resp(bth.RCRDMAReadResponseMiddle, 102)
			c.now = c.now.Add(time.Microsecond)
			resp(bth.RCRDMAReadResponseMiddle, 103)
			if d, want := c.qp.Deadline(), c.now.Add(6*time.Millisecond); d != want || c.qp.req.ptoAt != clock.Never {
				t.Fatalf("deadline %v, want the RTO at twice the pause (%v) and no probe", d, want)
			}
			c.now = c.qp.Deadline()
			c.qp.Expire(c.now)
			g := c.expect(p(bth.RCRDMAReadRequest, 104))
			reth := bth.RETH(g[0].Raw[bth.BTHLen:])
			if reth.VA() != 0x1000+3*1024 || reth.DMALen() != 1024 || !g[0].AckReq {
				t.Fatalf("the RTO asked for %d bytes at %#x, want one response at 104", reth.DMALen(), reth.VA())
			}
			if tc.lost {
				// The reply stopped at 103: the probe's answer comes in
				// order, and the rest is asked for at once.
				resp(tc.answerOp, 104)
				g := c.expect(p(bth.RCRDMAReadRequest, 105))
				if reth := bth.RETH(g[0].Raw[bth.BTHLen:]); reth.VA() != 0x1000+4*1024 || reth.DMALen() != 4*1024 {
					t.Fatalf("asked again for %d bytes at %#x, want the rest from 105", reth.DMALen(), reth.VA())
				}
				for psn := bth.PSN(105); psn <= 108; psn++ {
					op := bth.RCRDMAReadResponseMiddle
					switch psn {
					case 105:
						op = bth.RCRDMAReadResponseFirst
					case 108:
						op = bth.RCRDMAReadResponseLast
					}
					resp(op, psn)
				}
			} else {
				// The reply resumes; the probe's answer comes after it
				// and is stale.
				for psn := bth.PSN(104); psn <= 108; psn++ {
					op := bth.RCRDMAReadResponseMiddle
					if psn == 108 {
						op = bth.RCRDMAReadResponseLast
					}
					resp(op, psn)
				}
				resp(tc.answerOp, 104)
				c.expect()
			}
			w := c.wcs()
			if len(w) != 1 || w[0].Status != ib.Success {
				t.Fatalf("completions %+v", w)
			}
			for i := 0; i < 8; i++ {
				if !bytes.Equal(dst[i*1024:(i+1)*1024], fill(1024, byte(101+i))) {
					t.Fatalf("response %d misplaced", 101+i)
				}
			}
			fast := uint64(0)
			if tc.lost {
				fast = 1
			}
			if c.qp.FastRetrans != fast || c.qp.Timeouts != 0 || c.qp.req.retryLeft != 7 {
				t.Fatalf("%+v, retries left %d", c.qp.Counters, c.qp.req.retryLeft)
			}
		})
	}
	// The probe's answer may come after a local ACK timeout has asked for
	// the whole rest again (a peer answers in order: the probe's one
	// response first): it is still the probe's answer.
	c := newCtx(t, defaultCfg())
	c.qp.cfg.Timeout, c.qp.req.rto = 12, clock.Time(AckTimeout(12)) // 16.8 ms
	c.sampled(50 * time.Microsecond)
	dst := make([]byte, 4*1024) // PSNs 101..104
	c.post(ib.SendWQE{ID: 1, Opcode: ib.RDMARead, Flags: ib.Signaled, SG: segs(dst), RemoteAddr: 0x1000, RKey: 1})
	c.expect(p(bth.RCRDMAReadRequest, 101))
	c.now = c.now.Add(50 * time.Microsecond)
	c.respond(req{op: bth.RCRDMAReadResponseFirst, psn: 101, syn: SynACK, payload: fill(1024, 1)})
	for c.qp.Timeouts == 0 {
		c.now = c.qp.Deadline()
		c.qp.Expire(c.now)
		c.out()
	}
	c.respond(req{op: bth.RCRDMAReadResponseLast, psn: 102, syn: SynACK, payload: fill(1024, 2)})
	g := c.expect(p(bth.RCRDMAReadRequest, 103))
	if reth := bth.RETH(g[0].Raw[bth.BTHLen:]); reth.DMALen() != 2*1024 {
		t.Fatalf("asked again for %d bytes from 103", reth.DMALen())
	}
	c.respond(req{op: bth.RCRDMAReadResponseFirst, psn: 103, syn: SynACK, payload: fill(1024, 3)})
	c.respond(req{op: bth.RCRDMAReadResponseLast, psn: 104, syn: SynACK, payload: fill(1024, 4)})
	if w := c.wcs(); len(w) != 1 || w[0].Status != ib.Success || !bytes.Equal(dst[3072:], fill(1024, 4)) {
		t.Fatalf("after a local ACK timeout behind the probe: %+v", w)
	}

	// A LAST before a READ's last PSN that no probe asked for is still a
	// bad response.
	c = newCtx(t, defaultCfg())
	c.post(ib.SendWQE{ID: 1, Opcode: ib.RDMARead, Flags: ib.Signaled, SG: segs(make([]byte, 4096)), RemoteAddr: 0x1000, RKey: 1})
	c.out()
	c.respond(req{op: bth.RCRDMAReadResponseFirst, psn: 100, syn: SynACK, payload: make([]byte, 1024)})
	c.respond(req{op: bth.RCRDMAReadResponseLast, psn: 101, syn: SynACK, payload: make([]byte, 1024)})
	if w := c.wcs(); len(w) != 1 || w[0].Status != ib.BadRespErr {
		t.Fatalf("unsolicited LAST: %+v", w)
	}
}

package rc

import (
	"fmt"
	"testing"
	"time"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/ib"
)

// TestHeardPeerStretchesPatience: a local ACK timeout that expires after
// the peer's device was heard from (on another QP) spends no retry, at
// most excuseFactor·(retry_cnt+1) times; a peer heard from only before
// the timer started is given up on exactly on time.
func TestHeardPeerStretchesPatience(t *testing.T) {
	for _, m := range recoveryModes {
		for _, retry := range []uint8{0, 3, 7} {
			for _, alive := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s_retry%d_alive%v", m.name, retry, alive), func(t *testing.T) {
					c := m.ctx(t, retry)
					var heard clock.Time
					c.qp.HeardFrom(&heard)
					tack := AckTimeout(8)
					c.sampled(50 * time.Microsecond)
					heard = c.now // before the timer starts: no excuse
					for i := 0; i < 3; i++ {
						c.post(ib.SendWQE{ID: uint64(i), Opcode: ib.Send, Flags: ib.Signaled, SG: segs(fill(8, 0))})
					}
					c.out()
					last := c.now
					for step := 0; !c.qp.Failed(); step++ {
						if step > 1000 {
							t.Fatal("never gave up")
						}
						c.now = c.qp.Deadline()
						if alive {
							heard = c.now - 1 // another QP's ACK, just now
						}
						c.qp.Expire(c.now)
						c.out()
					}
					n := uint64(retry) + 1
					want := n
					if alive {
						want = (1 + excuseFactor) * n
					}
					if at := last.Add(time.Duration(want) * tack); c.now != at {
						t.Fatalf("gave up at %v, want %v (%d local ACK timeouts of %v)", c.now, at, want, tack)
					}
					if c.qp.Timeouts != want || c.qp.TimeoutsExcused != want-n {
						t.Fatalf("%d timeouts, %d excused; want %d, %d", c.qp.Timeouts, c.qp.TimeoutsExcused, want, want-n)
					}
					if w := c.wcs(); len(w) == 0 || w[len(w)-1].Status != ib.RetryExcErr {
						t.Fatalf("completions %+v", w)
					}
				})
			}
		}
	}
}

// TestProgressRenewsExcuses: forward progress gives the excuses back, as it
// does the retries, and so do new retry counts (Update).
func TestProgressRenewsExcuses(t *testing.T) {
	cfg := defaultCfg()
	cfg.RetryCnt, cfg.Timeout = 0, 8
	c := newCtx(t, cfg)
	var heard clock.Time
	c.qp.HeardFrom(&heard)
	c.sampled(50 * time.Microsecond)
	for i := 0; i < 2; i++ {
		c.post(ib.SendWQE{ID: uint64(i), Opcode: ib.Send, Flags: ib.Signaled, SG: segs(fill(8, 0))})
	}
	c.out()
	timeouts := func(k int) {
		t.Helper()
		for c.qp.Timeouts < uint64(k) {
			c.now = c.qp.Deadline()
			heard = c.now - 1
			c.qp.Expire(c.now)
			c.out()
			if c.qp.Failed() {
				t.Fatalf("gave up after %d timeouts, %d excused", c.qp.Timeouts, c.qp.TimeoutsExcused)
			}
		}
	}
	timeouts(excuseFactor)
	c.now = c.now.Add(10 * time.Microsecond)
	c.respond(req{op: bth.RCAcknowledge, psn: 101, syn: SynACK}) // the first SEND
	timeouts(2 * excuseFactor)
	if c.qp.TimeoutsExcused != 2*excuseFactor {
		t.Fatalf("%+v", c.qp.Counters)
	}
	// The excuses are spent again; new retry counts (SQD→RTS) restart
	// them with the retries.
	cf := c.qp.Config()
	c.qp.Update(cf.Timeout, cf.RetryCnt, cf.RNRRetry, cf.MinRNRTimer, cf.Access, cf.MaxRdAtomic)
	timeouts(3 * excuseFactor)
	if c.qp.TimeoutsExcused != 3*excuseFactor {
		t.Fatalf("%+v", c.qp.Counters)
	}
}

// TestLocalAckTimeoutProbes: with adaptive retransmission, a local ACK
// timeout toward a go-back-N peer resends the oldest unacknowledged packet
// alone, as the RTO does, and goes back N when the answer shows the rest
// lost; a peer only slow to answer costs one packet per timeout, not a
// window. With the ACK timer alone (rxe's behaviour) it goes back N.
func TestLocalAckTimeoutProbes(t *testing.T) {
	for _, rec := range []ib.Recovery{ib.RecoveryAdaptive, ib.RecoveryTimeout} {
		t.Run(rec.String(), func(t *testing.T) {
			c := fourPacketSend(t, rec)
			if g := c.out(); len(g) != 4 {
				t.Fatalf("%d packets", len(g))
			}
			for c.qp.Timeouts == 0 {
				c.now = c.qp.Deadline()
				c.qp.Expire(c.now)
				g := c.out()
				want := 1
				if rec == ib.RecoveryTimeout && c.qp.Timeouts == 1 {
					want = 4
				}
				if len(g) != want || g[0].PSN != 101 {
					t.Fatalf("timeouts %d: resent %+v, want %d from 101", c.qp.Timeouts, g, want)
				}
			}
			if rec == ib.RecoveryTimeout {
				return
			}
			// The probe filled the hole: the go-back-N peer acknowledges 101
			// and has dropped 102-104.
			c.now = c.now.Add(50 * time.Microsecond)
			c.respond(req{op: bth.RCAcknowledge, psn: 101, syn: SynACK})
			c.expect(p(bth.RCSendMiddle, 102), p(bth.RCSendMiddle, 103), p(bth.RCSendLast, 104))
		})
	}
}

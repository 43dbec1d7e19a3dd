package rnic

import (
	"testing"
	"time"

	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/port/memlink"
	"github.com/softrnic/softrnic/verbs"
)

// pingPong runs perftest's send_lat pattern on a testbed: one receive
// posted on each side, reposted when it completes; A sends SEND i
// (unsignaled, as send_lat does), B answers it with SEND i once its receive
// completed, A sends i+1 once that answer arrived. It returns how many round
// trips completed before iters or the virtual time limit, and fails the
// test on an error completion.
func pingPong(t *testing.T, tb *testbed, qa, qb *QP, iters int, limit time.Duration) int {
	t.Helper()
	bufA, bufB := make([]byte, 128), make([]byte, 128)
	mra, err := tb.a.pd.RegBytes(bufA, 0, ib.LocalWrite)
	must(t, err)
	mrb, err := tb.b.pd.RegBytes(bufB, 0, ib.LocalWrite)
	must(t, err)
	recv := func(q *QP, mr *MR) {
		_, err := q.PostRecv([]verbs.RecvWR{{ID: 7, SG: []ib.SGE{{Addr: mr.IOVA() + 64, Length: 64, LKey: mr.LKey()}}}})
		must(t, err)
	}
	send := func(q *QP, mr *MR, i int) {
		_, err := q.PostSend([]verbs.SendWR{{ID: uint64(i), Opcode: ib.Send, SG: []ib.SGE{{Addr: mr.IOVA(), Length: 64, LKey: mr.LKey()}}}})
		must(t, err)
	}
	recv(qa, mra)
	recv(qb, mrb)
	send(qa, mra, 0)
	done, answered := 0, 0
	end := tb.clk.Now().Add(limit)
	var wcs [8]ib.WC
	for done < iters && tb.clk.Now() < end {
		before := tb.bytes
		if tb.step() {
			if d := tb.bytes - before; d > 0 {
				tb.clk.Advance(time.Duration(float64(d) * nsPerByte))
			}
		} else {
			next := clock.Min(clock.Min(tb.a.port.NextDelivery(), tb.b.port.NextDelivery()),
				clock.Min(tb.a.dev.NextDeadline(), tb.b.dev.NextDeadline()))
			if next == clock.Never {
				t.Logf("round trip %d: nothing in flight and no timer armed at %v", done, tb.clk.Now())
				return done
			}
			tb.clk.Set(max(next, tb.clk.Now()+1))
		}
		for _, w := range wcs[:qb.init.RecvCQ.Poll(wcs[:])] {
			if w.Status != ib.Success {
				t.Fatalf("B: completion %+v", w)
			}
			if w.IsRecv {
				recv(qb, mrb)
				send(qb, mrb, answered)
				answered++
			}
		}
		for _, w := range wcs[:qa.init.RecvCQ.Poll(wcs[:])] {
			if w.Status != ib.Success {
				t.Fatalf("A: completion %+v", w)
			}
			if w.IsRecv {
				done++
				recv(qa, mra)
				if done < iters {
					send(qa, mra, done)
				}
			}
		}
		for _, q := range []*QP{qa, qb} {
			for _, w := range wcs[:q.init.SendCQ.Poll(wcs[:])] {
				if w.Status != ib.Success {
					t.Fatalf("QP %#x: send completion %+v", q.QPN(), w)
				}
			}
		}
	}
	return done
}

// TestPingPongNeverLosesACompletion runs send_lat's ping-pong with one
// receive per side over a link that loses, duplicates, reorders and delays
// frames: every SEND a responder accepts must complete at its receiver,
// or both ends wait forever (the veth-stall hang: both ends in waitRecv
// at the same iteration).
func TestPingPongNeverLosesACompletion(t *testing.T) {
	const iters = 2000
	for seed := uint64(1); seed <= 6; seed++ {
		imp := memlink.Impairments{Loss: 0.03, Duplicate: 0.03, Reorder: 0.03, Jitter: 3 * time.Microsecond}
		tb := newTestbed(t, imp, seed, 1024)
		tb.timeout = 4
		qa, qb := tb.connect(ib.RC, 1024, ib.LocalWrite, 16)
		if got := pingPong(t, tb, qa, qb, iters, 20*time.Second); got != iters {
			t.Fatalf("seed %d: %d of %d round trips; A %v %+v, B %v %+v", seed, got, iters, qa.State(), qa.rcQP().Counters, qb.State(), qb.rcQP().Counters)
		}
	}
}

package sim

import (
	"math/rand/v2"
	"testing"

	"github.com/softrnic/softrnic/clock"
)

// The wheel fires events in exactly the (time, sequence) order of a heap,
// whatever the mix of near events, far events (beyond the horizon, which
// move into the wheel later) and events at the current instant.
func TestWheelMatchesHeap(t *testing.T) {
	for seed := uint64(1); seed <= 20; seed++ {
		r := rand.New(rand.NewPCG(seed, 7))
		q := newEvq()
		var ref eventHeap
		var seq uint64
		now := clock.Time(0)
		push := func(at clock.Time, id int32) {
			seq++
			q.push(event{at: at, obj: id})
			ref.push(event{at: at, seq: seq, obj: id})
		}
		id := int32(0)
		for step := 0; step < 20000; step++ {
			// Push a few: mostly near, some at now, some far, some very far.
			for k := r.IntN(4); k > 0; k-- {
				var d clock.Time
				switch r.IntN(10) {
				case 0:
					d = 0
				case 1:
					d = clock.Time(wheelSize + r.IntN(3*wheelSize))
				case 2:
					d = clock.Time(r.IntN(1 << 30))
				default:
					d = clock.Time(r.IntN(3000))
				}
				id++
				push(now+d, id)
			}
			if q.len() != ref.len() {
				t.Fatalf("seed %d: lengths %d vs %d", seed, q.len(), ref.len())
			}
			if ref.len() == 0 {
				continue
			}
			end := now + clock.Time(r.IntN(5000))
			e, ok := q.pop(end)
			want := ref.ev[0]
			if !ok {
				if want.at <= end {
					t.Fatalf("seed %d: wheel has nothing due by %d, heap has %d at %d", seed, end, want.obj, want.at)
				}
				continue
			}
			ref.pop()
			if e.at != want.at || e.obj != want.obj {
				t.Fatalf("seed %d step %d: wheel fired %d at %d, heap %d at %d", seed, step, e.obj, e.at, want.obj, want.at)
			}
			now = e.at
		}
		if q.late != 0 {
			t.Fatalf("%d events scheduled in the past", q.late)
		}
	}
}

// The simulator never schedules an event before the current time (the
// wheel would fire it at the current time, out of heap order).
func TestNoLateEvents(t *testing.T) {
	for _, a := range Algorithms {
		for _, sc := range []string{TwoFlow, Incast} {
			o := Options{Scenario: sc, Algorithm: a, Seed: 1, Duration: 5 * 1e6}
			if err := o.Defaults(); err != nil {
				t.Fatal(err)
			}
			n, err := build(&o)
			if err != nil {
				t.Fatal(err)
			}
			n.setWindow(&o)
			n.startSampler(clock.Time(o.TraceInterval))
			n.run()
			if n.q.late != 0 {
				t.Errorf("%s %s: %d events scheduled in the past", a, sc, n.q.late)
			}
		}
	}
}

// BenchmarkWheel is the event queue alone: 4096 pending events, each pop
// followed by a push 0.1–2.1 µs ahead (the shape of the simulator's
// traffic), a million per iteration.
func BenchmarkWheel(b *testing.B) {
	q := newEvq()
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 4096; i++ {
		q.push(event{at: clock.Time(r.IntN(4000))})
	}
	const perOp = 1 << 20
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for k := 0; k < perOp; k++ {
			e, _ := q.pop(clock.Never)
			q.push(event{at: e.at + clock.Time(100+r.IntN(2000))})
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*perOp), "ns/event")
}

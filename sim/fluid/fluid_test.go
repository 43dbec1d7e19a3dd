package fluid

import (
	"testing"
)

// The §5.4 table of dcqcn-anchors.md (an independent, preliminary Python
// integration of the same equations, window 30–60 ms): where the model is
// stable the Go integrator must give the same window mean queue (±5 %) and
// per-flow rate (±1 %). The min/max there depend on how far the start-up
// transient has decayed by 30 ms, which depends on integrator details; the
// range is only checked loosely (±25 %).
func TestFluidMatchesAnchorTable(t *testing.T) {
	cases := []struct {
		n                       int
		tauStar                 float64
		qMin, qMean, qMax, rate float64
		tolMean                 float64
	}{
		{2, 50e-6, 19.0, 19.6, 20.0, 20.00, 0.05},
		{2, 85e-6, 17.3, 19.7, 21.1, 20.00, 0.05},
		{4, 50e-6, 36.3, 39.0, 40.7, 10.00, 0.05},
		{10, 50e-6, 107, 118, 121, 4.00, 0.05},
		{10, 85e-6, 82.9, 119.0, 156.9, 4.00, 0.05},
	}
	for _, c := range cases {
		p := Paper(c.n)
		p.TauStar = c.tauStar
		r, err := Run(p)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("N=%d τ*=%.0fµs: queue %.1f/%.1f/%.1f KB, rate %.3f Gb/s, util %.4f, α %.4f",
			c.n, c.tauStar*1e6, r.QueueMinKB, r.QueueMeanKB, r.QueueMaxKB, r.RateGbps, r.Utilization, r.Alpha)
		if d := r.QueueMeanKB/c.qMean - 1; d < -c.tolMean || d > c.tolMean {
			t.Errorf("N=%d τ*=%v: queue mean %.2f KB, want %.1f ± %.0f%%", c.n, c.tauStar, r.QueueMeanKB, c.qMean, c.tolMean*100)
		}
		if r.QueueMinKB < c.qMin*0.75 || r.QueueMaxKB > c.qMax*1.25 {
			t.Errorf("N=%d τ*=%v: queue range %.1f–%.1f KB, want within ~%.1f–%.1f", c.n, c.tauStar, r.QueueMinKB, r.QueueMaxKB, c.qMin, c.qMax)
		}
		if d := r.RateGbps - c.rate; d < -0.01*c.rate || d > 0.01*c.rate {
			t.Errorf("N=%d: per-flow rate %.3f Gb/s, want %.2f", c.n, r.RateGbps, c.rate)
		}
	}
}

// With τ* = 120 µs two flows oscillate: the queue empties at times while
// the link stays almost fully used (table: 0 / 17.4 / 42.2 KB, util 0.999).
func TestFluidOscillatesAtLongDelay(t *testing.T) {
	p := Paper(2)
	p.TauStar = 120e-6
	r, err := Run(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("τ*=120µs: queue %.1f/%.1f/%.1f KB util %.4f", r.QueueMinKB, r.QueueMeanKB, r.QueueMaxKB, r.Utilization)
	if r.QueueMinKB > 1 || r.QueueMaxKB < 30 || r.Utilization < 0.99 {
		t.Errorf("expected a limit cycle reaching an empty queue with util ≥ 0.99")
	}
}

func TestFluidRejectsBadParams(t *testing.T) {
	p := Paper(2)
	p.Dt = 0
	if _, err := Run(p); err == nil {
		t.Fatal("Dt = 0 accepted")
	}
	p = Paper(0)
	if _, err := Run(p); err == nil {
		t.Fatal("N = 0 accepted")
	}
}

// Run long enough, the stable cases settle on their fixed point: a constant
// queue that grows with N (ECN-or-Delay's observation).
func TestFluidFixedPointGrowsWithN(t *testing.T) {
	prev := 0.0
	for _, n := range []int{2, 4, 10} {
		p := Paper(n)
		// A 1 µs step gives the same fixed point as 0.25 µs (checked) at
		// a quarter of the cost.
		p.Duration, p.Window, p.Dt = 400e-3, [2]float64{350e-3, 400e-3}, 1e-6
		r, err := Run(p)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("N=%d fixed point: queue %.2f KB, rate %.4f Gb/s", n, r.QueueMeanKB, r.RateGbps)
		if r.QueueMaxKB-r.QueueMinKB > 0.01*r.QueueMeanKB {
			t.Errorf("N=%d not settled: %.2f–%.2f KB", n, r.QueueMinKB, r.QueueMaxKB)
		}
		if r.QueueMeanKB <= prev {
			t.Errorf("N=%d: fixed-point queue %.2f KB not above N's predecessor %.2f", n, r.QueueMeanKB, prev)
		}
		prev = r.QueueMeanKB
	}
}

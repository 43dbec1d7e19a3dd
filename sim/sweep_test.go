package sim

import (
	"math"
	"testing"
	"time"
)

// A sweep's figures are those of the runs it is made of.
func TestSweepMatchesRuns(t *testing.T) {
	o := Options{Scenario: TwoFlow, Duration: 15 * time.Millisecond}
	sw, err := Sweep(o, 3, 3, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(sw.Seeds) != 3 || sw.Seeds[0] != 3 || sw.Seeds[2] != 5 || sw.FairGbps != 20 || len(sw.AllRates) != 6 {
		t.Fatalf("sweep %+v", sw)
	}
	var f1 []float64
	var q float64
	for seed := uint64(3); seed <= 5; seed++ {
		oo := o
		oo.Seed = seed
		s := mustRun(t, oo).Summary
		f1 = append(f1, s.Flows[1].MeanGbps)
		q += s.QueueMeanKB / 3
	}
	want := spreadOf(f1)
	if got := sw.Flows[1].Gbps; math.Abs(got.Mean-want.Mean) > 1e-12 || got.Min != want.Min || got.Max != want.Max || math.Abs(got.Stdev-want.Stdev) > 1e-12 {
		t.Fatalf("flow 1 spread %+v, runs give %+v", got, want)
	}
	if math.Abs(sw.QueueMeanKB.Mean-q) > 1e-9 {
		t.Fatalf("queue mean %v, runs give %v", sw.QueueMeanKB.Mean, q)
	}
	out := 0
	for _, x := range f1 {
		if math.Abs(x-20) > 1 {
			out++
		}
	}
	if sw.Flows[1].Outside != out {
		t.Fatalf("outside %d, runs give %d", sw.Flows[1].Outside, out)
	}
	if _, err := Sweep(o, 1, 0, 1); err == nil {
		t.Fatal("a sweep of 0 seeds was accepted")
	}
}

func TestSpreadAndHistogram(t *testing.T) {
	s := spreadOf([]float64{1, 2, 3, 4})
	if s.Mean != 2.5 || s.Min != 1 || s.Max != 4 || math.Abs(s.Stdev-math.Sqrt(5.0/3)) > 1e-12 {
		t.Fatalf("spread %+v", s)
	}
	h := Histogram([]float64{-5, 0, 0.5, 1, 1.99, 2, 9}, 0, 1, 3)
	if h[0] != 3 || h[1] != 2 || h[2] != 2 {
		t.Fatalf("histogram %v, want [3 2 2]", h)
	}
}

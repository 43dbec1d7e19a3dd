package sim

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/congestion"
	"github.com/softrnic/softrnic/congestion/dcqcn"
)

func mustRun(t testing.TB, o Options) *Result {
	t.Helper()
	r, err := Run(o)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func hashFiles(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, name := range TraceFiles {
		f, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.New()
		if _, err := io.Copy(h, f); err != nil {
			t.Fatal(err)
		}
		f.Close()
		out[name] = hex.EncodeToString(h.Sum(nil))
	}
	return out
}

// Same seed ⇒ byte-identical trace files; another seed ⇒ different ones.
func TestDeterministicTraces(t *testing.T) {
	o := Options{Scenario: TwoFlow, Seed: 7, Duration: 25 * time.Millisecond}
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	for i, d := range dirs {
		oo := o
		if i == 2 {
			oo.Seed = 8
		}
		if err := mustRun(t, oo).WriteDir(d); err != nil {
			t.Fatal(err)
		}
	}
	a, b, c := hashFiles(t, dirs[0]), hashFiles(t, dirs[1]), hashFiles(t, dirs[2])
	for _, name := range TraceFiles {
		if a[name] != b[name] {
			t.Errorf("%s differs between two runs with seed 7: %s vs %s", name, a[name], b[name])
		}
	}
	if a[FlowsFile] == c[FlowsFile] || a[QueuesFile] == c[QueuesFile] {
		t.Error("seeds 7 and 8 gave identical traces: the seed does not reach the marking")
	}
	// The summaries agree too, apart from the wall-clock fields.
	r1, r2 := mustRun(t, o), mustRun(t, o)
	s1, s2 := r1.Summary, r2.Summary
	s1.EventsPerSec, s1.WallSeconds, s2.EventsPerSec, s2.WallSeconds = 0, 0, 0, 0
	if s1.Events != s2.Events || s1.QueueMeanKB != s2.QueueMeanKB || s1.CNPCount != s2.CNPCount || s1.Flows[1].MeanGbps != s2.Flows[1].MeanGbps {
		t.Error("summaries differ between identical runs")
	}
}

// The targets for two-flow paper over 90–110 ms. A single 20 ms
// window of one seed is a noisy sample: over a long run the window mean of
// one flow has an RMS deviation of ~1.15 Gb/s from 20 (measured), so a
// single seed lands outside 20 ± 1 about 40 % of the time. The test
// therefore asserts the targets on an ensemble of 6 seeds (the estimate of
// the expected window mean), and per seed what holds per seed:
// utilisation, queue mean within ±30 % of the fluid model's 19.6 KB, no
// drops, and Jain ≥ 0.98.
func TestTwoFlowPaperTargets(t *testing.T) {
	const seeds = 6
	var f0, f1, jain, util, q float64
	for seed := uint64(1); seed <= seeds; seed++ {
		s := mustRun(t, Options{Scenario: TwoFlow, Seed: seed}).Summary
		t.Logf("seed %d: flows %.3f / %.3f Gb/s, Jain %.4f, util %.4f, queue %.1f KB (p5 %.1f p95 %.1f), conv %v ms, CNPs %d, %d events",
			seed, s.Flows[0].MeanGbps, s.Flows[1].MeanGbps, s.Jain, s.Utilization, s.QueueMeanKB, s.QueueP5KB, s.QueueP95KB, deref(s.ConvergenceMs), s.CNPCount, s.Events)
		if s.WindowMs != [2]float64{90, 110} {
			t.Fatalf("window %v, want 90–110 ms", s.WindowMs)
		}
		if s.Utilization < 0.98 {
			t.Errorf("seed %d: utilisation %.4f < 0.98", seed, s.Utilization)
		}
		if s.QueueMeanKB < 0.7*19.6 || s.QueueMeanKB > 1.3*19.6 {
			t.Errorf("seed %d: queue mean %.1f KB outside 19.6 ± 30 %%", seed, s.QueueMeanKB)
		}
		if s.Jain < 0.98 {
			t.Errorf("seed %d: Jain %.4f < 0.98", seed, s.Jain)
		}
		if s.Drops != 0 {
			t.Errorf("seed %d: %d drops", seed, s.Drops)
		}
		if s.ConvergenceMs == nil {
			t.Errorf("seed %d: never converged", seed)
		}
		f0 += s.Flows[0].MeanGbps / seeds
		f1 += s.Flows[1].MeanGbps / seeds
		jain += s.Jain / seeds
		util += s.Utilization / seeds
		q += s.QueueMeanKB / seeds
	}
	t.Logf("ensemble of %d seeds: flows %.3f / %.3f Gb/s, Jain %.4f, util %.4f, queue %.1f KB", seeds, f0, f1, jain, util, q)
	if math.Abs(f0-20) > 1 || math.Abs(f1-20) > 1 {
		t.Errorf("ensemble flow means %.3f / %.3f Gb/s, want 20 ± 1", f0, f1)
	}
	if jain < 0.99 || util < 0.98 {
		t.Errorf("ensemble Jain %.4f (≥ 0.99), utilisation %.4f (≥ 0.98)", jain, util)
	}
	if q < 0.7*19.6 || q > 1.3*19.6 {
		t.Errorf("ensemble queue mean %.1f KB outside 19.6 ± 30 %%", q)
	}
}

func deref(p *float64) float64 {
	if p == nil {
		return math.NaN()
	}
	return *p
}

// N-flow: staggered starts 1 ms apart (dcqcn-anchors D3). Asserted:
//   - N = 4 (default run): the fluid model is stable here, and the DES must
//     sit on it: queue mean within ±30 % of the fluid model's 39 KB,
//     utilisation ≥ 0.98, Jain ≥ 0.99, every flow within ±15 % of C/N.
//   - N = 10, 16, 64 (only with SOFTRNIC_SIM_LONG=1): no drops, Jain ≥ 0.98,
//     utilisation ≥ 0.98 (N = 10) or ≥ 0.85 (N ≥ 16, where even the
//     synchronised fluid model is a limit cycle reaching p = 1 with
//     utilisation 0.88–0.97). With the paper's deferred NP the N = 10 DES
//     runs a 0 ↔ Kmax limit cycle that the fluid model does not have (a
//     deferred CNP reports marks up to N = 50 µs old); with a drop-style NP
//     it sits on the fluid fixed point, which is asserted (±30 %).
func TestNFlow(t *testing.T) {
	ns := []int{4}
	if os.Getenv("SOFTRNIC_SIM_LONG") != "" {
		ns = []int{4, 10, 16, 64}
	} else if testing.Short() {
		t.Skip("n-flow skipped in -short mode")
	}
	type variant struct {
		name string
		np   *dcqcn.NPConfig
	}
	dropNP := dcqcn.PaperNP()
	dropNP.Defer = false
	for _, n := range ns {
		vs := []variant{{"paper NP", nil}}
		if n == 10 {
			vs = append(vs, variant{"drop-style NP", &dropNP})
		}
		for _, v := range vs {
			s := mustRun(t, Options{Scenario: NFlow, Flows: n, Seed: 1, NP: v.np}).Summary
			lo, hi := math.Inf(1), 0.0
			for _, f := range s.Flows {
				lo, hi = math.Min(lo, f.MeanGbps), math.Max(hi, f.MeanGbps)
			}
			fl := fluidRef(&Options{Scenario: NFlow, Flows: n, Profile: "paper", LinkRate: 40 * congestion.Gbps,
				PacketSize: 1000, RED: RED{Kmin: 5000, Kmax: 200000, Pmax: 0.01}})
			t.Logf("N=%d %s: per-flow %.3f–%.3f Gb/s (C/N %.3f), Jain %.4f, util %.4f, queue %.1f KB (p5 %.1f p95 %.1f; fluid %.1f), CNPs %d, drops %d, %d events, %.2f M events/s (%.2f M per CPU-s)",
				n, v.name, lo, hi, 40/float64(n), s.Jain, s.Utilization, s.QueueMeanKB, s.QueueP5KB, s.QueueP95KB, fl.QueueMeanKB,
				s.CNPCount, s.Drops, s.Events, s.EventsPerSec/1e6, s.EventsPerCPUSec/1e6)
			minUtil := 0.98
			if n >= 16 {
				minUtil = 0.85
			}
			if s.Utilization < minUtil || s.Jain < 0.98 || s.Drops != 0 {
				t.Errorf("N=%d %s: utilisation %.4f (≥ %.2f), Jain %.4f (≥ 0.98), drops %d", n, v.name, s.Utilization, minUtil, s.Jain, s.Drops)
			}
			checkFluid := n == 4 || (n == 10 && v.np != nil)
			if checkFluid && (s.QueueMeanKB < 0.7*fl.QueueMeanKB || s.QueueMeanKB > 1.3*fl.QueueMeanKB) {
				t.Errorf("N=%d %s: queue mean %.1f KB outside the fluid model's %.1f KB ± 30 %%", n, v.name, s.QueueMeanKB, fl.QueueMeanKB)
			}
			if n == 4 && (lo < 0.85*10 || hi > 1.15*10 || s.Jain < 0.99) {
				t.Errorf("N=4: per-flow rates %.3f–%.3f Gb/s outside 10 ± 15 %%, or Jain %.4f < 0.99", lo, hi, s.Jain)
			}
		}
	}
}

// Incast with a victim: PFC keeps the incast lossless but pauses the cable
// the victim shares with one incast sender, so the victim loses rate to a
// congestion it does not cross (the paper's §2 motivation); without PFC the
// victim keeps its line rate and DCQCN with a 12 MB buffer still loses
// nothing.
func TestIncastVictim(t *testing.T) {
	with := mustRun(t, Options{Scenario: Incast, Seed: 1}).Summary
	without := mustRun(t, Options{Scenario: Incast, Seed: 1, NoPFC: true}).Summary
	for _, s := range []Summary{with, without} {
		done := 0
		for _, f := range s.Flows[1:] {
			if f.FCTUs != nil {
				done++
			}
		}
		t.Logf("PFC %v: victim %.3f Gb/s, pauses %d, drops %d, queue max %.0f KB, incast flows done %d/%d, CNPs %d",
			s.PFC, *s.VictimGbps, s.Pauses, s.Drops, s.QueueMaxKB, done, len(s.Flows)-1, s.CNPCount)
		if done != len(s.Flows)-1 || s.Drops != 0 {
			t.Errorf("PFC %v: %d of %d incast flows finished, %d drops", s.PFC, done, len(s.Flows)-1, s.Drops)
		}
	}
	if with.Pauses == 0 {
		t.Error("incast with PFC sent no PAUSE")
	}
	if without.Pauses != 0 {
		t.Error("PAUSE sent with PFC off")
	}
	if *without.VictimGbps < 0.95*40 {
		t.Errorf("victim without PFC %.3f Gb/s, want its line rate (the congested port is not on its path)", *without.VictimGbps)
	}
	if !(*with.VictimGbps < 0.9**without.VictimGbps) {
		t.Errorf("victim not hurt by PFC: %.3f vs %.3f Gb/s", *with.VictimGbps, *without.VictimGbps)
	}
}

// The ConnectX and HPCC profiles run through the same simulator.
func TestOtherProfilesRun(t *testing.T) {
	for _, p := range []string{"connectx", "hpcc-mlx"} {
		s := mustRun(t, Options{Scenario: TwoFlow, Profile: p, Seed: 1, Duration: 30 * time.Millisecond}).Summary
		t.Logf("%s: flows %.3f / %.3f Gb/s, util %.4f, queue %.1f KB, CNPs %d, handled %d ignored %d",
			p, s.Flows[0].MeanGbps, s.Flows[1].MeanGbps, s.Utilization, s.QueueMeanKB, s.CNPCount,
			s.Flows[0].CNPHandled+s.Flows[1].CNPHandled, s.Flows[0].CNPIgnored+s.Flows[1].CNPIgnored)
		if s.Utilization < 0.9 || s.CNPCount == 0 || s.Fluid != nil {
			t.Errorf("%s: util %.4f, CNPs %d, fluid %v", p, s.Utilization, s.CNPCount, s.Fluid)
		}
	}
}

func TestOptionsRejected(t *testing.T) {
	bad := []Options{
		{Scenario: "ring"},
		{Scenario: NFlow, Flows: -1},
		{Profile: "timely"},
		{Duration: time.Nanosecond},
		{PacketSize: 10},
		{RED: RED{Kmin: 10, Kmax: 5, Pmax: 0.1}},
		{TraceInterval: 1500 * time.Nanosecond},
	}
	for i, o := range bad {
		if _, err := Run(o); err == nil {
			t.Errorf("options %d accepted: %+v", i, o)
		}
	}
}

// BenchmarkTwoFlow reports simulator speed in events per second.
func BenchmarkTwoFlow(b *testing.B) {
	var ev uint64
	for i := 0; i < b.N; i++ {
		r, err := Run(Options{Scenario: TwoFlow, Seed: 1, Duration: 30 * time.Millisecond})
		if err != nil {
			b.Fatal(err)
		}
		ev += r.Summary.Events
	}
	b.ReportMetric(float64(ev)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkNFlow16 exercises many flows and CNPs.
func BenchmarkNFlow16(b *testing.B) {
	var ev uint64
	for i := 0; i < b.N; i++ {
		r, err := Run(Options{Scenario: NFlow, Flows: 16, Seed: 1, Duration: 30 * time.Millisecond})
		if err != nil {
			b.Fatal(err)
		}
		ev += r.Summary.Events
	}
	b.ReportMetric(float64(ev)/b.Elapsed().Seconds(), "events/s")
}

// Regression lock (dcqcn-anchors D5: "regression-lock the value"): the
// two-flow paper run with seed 1 is a fixed function of the code. A change
// to any of these numbers means the simulated behaviour changed: if that
// was intended, re-measure, explain it in the commit, and update them.
func TestTwoFlowRegressionLock(t *testing.T) {
	s := mustRun(t, Options{Scenario: TwoFlow, Seed: 1}).Summary
	got := []any{s.Events, s.CNPCount, deref(s.ConvergenceMs), s.Flows[0].Bytes, s.Flows[1].Bytes}
	want := []any{uint64(2767978), uint64(290), 15.0, int64(300997000), int64(239678000)}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("seed-1 two-flow run changed: events, CNPs, convergence ms, bytes = %v, locked %v", got, want)
		}
	}
}

// dcqcn-anchors D2: two flows under HPCC ns-3's Mellanox DCQCN at 100 Gb/s
// with its ECN map (400 KB / 1600 KB / 20 %): Jain ≥ 0.99, utilisation ≥
// 0.95. Shortened to 50 ms (window 30–50 ms); the second flow joins at 10 ms.
func TestTwoFlowHPCCMellanox100G(t *testing.T) {
	s := mustRun(t, Options{Scenario: TwoFlow, Seed: 1, Profile: "hpcc-mlx", LinkRate: 100 * congestion.Gbps,
		RED: RED{Kmin: 400_000, Kmax: 1_600_000, Pmax: 0.2}, Duration: 50 * time.Millisecond}).Summary
	t.Logf("hpcc-mlx @100G: flows %.3f / %.3f Gb/s, Jain %.4f, util %.4f, queue %.1f KB (p5 %.1f p95 %.1f), convergence %v ms, CNPs %d (RP handled %d, ignored %d)",
		s.Flows[0].MeanGbps, s.Flows[1].MeanGbps, s.Jain, s.Utilization, s.QueueMeanKB, s.QueueP5KB, s.QueueP95KB, deref(s.ConvergenceMs),
		s.CNPCount, s.Flows[0].CNPHandled+s.Flows[1].CNPHandled, s.Flows[0].CNPIgnored+s.Flows[1].CNPIgnored)
	if s.Jain < 0.99 || s.Utilization < 0.95 || s.Drops != 0 {
		t.Errorf("Jain %.4f (≥ 0.99), utilisation %.4f (≥ 0.95), drops %d", s.Jain, s.Utilization, s.Drops)
	}
	if s.Flows[0].CNPIgnored == 0 {
		t.Error("a per-packet NP with a 4 µs monitor period must coalesce some CNPs (rp_cnp_ignored)")
	}
}

// The event loop allocates nothing per packet once warm: the packet slab,
// the event heap and the FIFOs recycle their slots. Only the per-ms
// throughput bins and trace rows grow (amortised), so a millisecond of two
// saturated 40 Gb/s flows (~25,000 events) may allocate at most a few times.
func TestEventLoopAllocations(t *testing.T) {
	o := Options{Scenario: TwoFlow, Seed: 1, Duration: time.Hour, TraceInterval: time.Second}
	if err := o.Defaults(); err != nil {
		t.Fatal(err)
	}
	n, err := build(&o)
	if err != nil {
		t.Fatal(err)
	}
	n.startSampler(clock.Time(o.TraceInterval))
	ms := clock.Time(time.Millisecond)
	n.end = 20 * ms // both flows running, heap and slab at working size
	n.runUntil()
	before := n.events
	allocs := testing.AllocsPerRun(20, func() {
		n.end += ms
		n.runUntil()
	})
	perMs := float64(n.events-before) / 21
	t.Logf("%.0f events per simulated ms, %.2f allocations per ms", perMs, allocs)
	if perMs < 10000 {
		t.Fatalf("only %.0f events per ms: the flows are not running", perMs)
	}
	if allocs > 4 {
		t.Fatalf("%.2f allocations per simulated ms (%.0f events): something allocates per packet", allocs, perMs)
	}
}

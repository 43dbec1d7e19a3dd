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

// The targets for two-flow paper over 90–110 ms, and why they can
// only hold on an ensemble of seeds.
//
// One seed's 20 ms window mean is one sample of a random process: RED marks
// each packet with p ≈ 6·10⁻⁴ at the ~17 KB queue, so each flow is cut at
// random instants, ≈1.7 times per ms, each cut taking α/2 ≈ 4.5 % off its
// rate. A cut shrinks the gap between the flows by that 4.5 %, so the gap
// forgets itself only after ≈22 cuts: the 1 ms rate difference A−B has an
// autocorrelation of 0.51 at 10 ms and 0.24 at 20 ms (2 s run). The model
// was checked against the reference configuration D1 and the published
// implementations' semantics (dequeue marking on the queue left behind,
// the NP's first-CNP rule and ns3-rdma's CNP grid, timer and byte counter
// reset on each cut, a rate change applying from the next packet, α
// order); none of the faithful variants narrows the spread (20 seeds:
// per-flow stdev 1.0–1.55 Gb/s in every one). Measured over 20 seeds the
// per-flow stdev of a 20 ms window mean is 1.36 Gb/s and 9 of 20 seeds
// have a flow outside 20 ± 1; over a 200 ms window it is 0.58 Gb/s
// (TestTwoFlowPaperLongWindow).
//
// The test therefore asserts the rate targets on the 20-seed
// ensemble (the estimate of the expected window mean, standard error
// ≈0.3 Gb/s) together with a bound on the spread itself, and per seed what
// holds per seed: utilisation ≥ 0.98, queue mean within ±30 % of the fluid
// model's 19.6 KB, no drops, convergence, Jain ≥ 0.98.
func TestTwoFlowPaperTargets(t *testing.T) {
	const seeds = 20
	var jain, util, q float64
	var rates [2][]float64
	for seed := uint64(1); seed <= seeds; seed++ {
		s := mustRun(t, Options{Scenario: TwoFlow, Seed: seed}).Summary
		t.Logf("seed %2d: flows %.3f / %.3f Gb/s, Jain %.4f, util %.4f, queue %.1f KB (p5 %.1f p95 %.1f), conv %v ms, CNPs %d",
			seed, s.Flows[0].MeanGbps, s.Flows[1].MeanGbps, s.Jain, s.Utilization, s.QueueMeanKB, s.QueueP5KB, s.QueueP95KB, deref(s.ConvergenceMs), s.CNPCount)
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
		for i := range rates {
			rates[i] = append(rates[i], s.Flows[i].MeanGbps)
		}
		jain += s.Jain / seeds
		util += s.Utilization / seeds
		q += s.QueueMeanKB / seeds
	}
	for i, r := range rates {
		sp := spreadOf(r)
		t.Logf("flow %d over %d seeds: mean %.3f, min %.3f, max %.3f, stdev %.3f Gb/s", i, seeds, sp.Mean, sp.Min, sp.Max, sp.Stdev)
		if math.Abs(sp.Mean-20) > 1 {
			t.Errorf("flow %d: ensemble mean %.3f Gb/s, want 20 ± 1", i, sp.Mean)
		}
		// The spread is the process's own (1.36 Gb/s measured); a model
		// change that widens it markedly is a regression to look at.
		if sp.Stdev > 2 {
			t.Errorf("flow %d: per-seed stdev %.3f Gb/s > 2", i, sp.Stdev)
		}
	}
	t.Logf("ensemble: Jain %.4f, util %.4f, queue %.1f KB", jain, util, q)
	if jain < 0.99 || util < 0.98 {
		t.Errorf("ensemble Jain %.4f (≥ 0.99), utilisation %.4f (≥ 0.98)", jain, util)
	}
	if q < 0.7*19.6 || q > 1.3*19.6 {
		t.Errorf("ensemble queue mean %.1f KB outside 19.6 ± 30 %%", q)
	}
}

// Over a window ten times longer (110–310 ms) the per-seed spread of a
// flow's mean shrinks from 1.36 to 0.58 Gb/s (20 seeds; less than √10
// because the gap between the flows is correlated over ~10–20 ms), and
// per seed each flow is within 20 ± 2 Gb/s (20 seeds: 18.36–21.38) with
// Jain ≥ 0.99 (20 seeds: ≥ 0.9943).
func TestTwoFlowPaperLongWindow(t *testing.T) {
	if testing.Short() {
		t.Skip("310 ms runs; skipped with -short")
	}
	for seed := uint64(1); seed <= 4; seed++ {
		s := mustRun(t, Options{Scenario: TwoFlow, Seed: seed, Duration: 310 * time.Millisecond, WindowStart: 110 * time.Millisecond}).Summary
		t.Logf("seed %d, 110–310 ms: flows %.3f / %.3f Gb/s, Jain %.4f, util %.4f, queue %.1f KB",
			seed, s.Flows[0].MeanGbps, s.Flows[1].MeanGbps, s.Jain, s.Utilization, s.QueueMeanKB)
		if s.WindowMs != [2]float64{110, 310} {
			t.Fatalf("window %v, want 110–310 ms", s.WindowMs)
		}
		for _, f := range s.Flows {
			if math.Abs(f.MeanGbps-20) > 2 {
				t.Errorf("seed %d: flow %d %.3f Gb/s outside 20 ± 2", seed, f.ID, f.MeanGbps)
			}
		}
		if s.Jain < 0.99 || s.Utilization < 0.98 || s.Drops != 0 {
			t.Errorf("seed %d: Jain %.4f (≥ 0.99), utilisation %.4f (≥ 0.98), %d drops", seed, s.Jain, s.Utilization, s.Drops)
		}
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

// summary.json says what ran: the profile, its ConnectX knobs by name and
// the RP/NP parameters they became, and the marking.
func TestSummaryRecordsConfig(t *testing.T) {
	cx := dcqcn.DefaultConnectX()
	if err := cx.Set("rpg_time_reset", 150); err != nil {
		t.Fatal(err)
	}
	s := mustRun(t, Options{Scenario: TwoFlow, Profile: "connectx", ConnectX: &cx, Duration: 12 * time.Millisecond,
		RED: RED{Kmin: 160_000, Kmax: 640_000, Pmax: 0.2}}).Summary
	c := s.Config
	if c.Profile != "connectx" || c.Knobs["rpg_time_reset"] != 150 || c.Knobs["min_time_between_cnps"] != 4 || len(c.Knobs) != len(dcqcn.KnobNames()) {
		t.Fatalf("knobs %v", c.Knobs)
	}
	if c.RP.TimerUs != 150 || c.RP.Alpha != "periodic" || c.RP.F != 1 || c.NP.MinIntervalUs != 4 || c.NP.Defer || c.Custom {
		t.Fatalf("RP/NP %+v %+v", c.RP, c.NP)
	}
	if c.KminKB != 160 || c.KmaxKB != 640 || c.Pmax != 0.2 || c.Marking != "dequeue" || c.LinkGbps != 40 {
		t.Fatalf("switch %+v", c)
	}
	p := mustRun(t, Options{Scenario: TwoFlow, Duration: 12 * time.Millisecond}).Summary.Config
	if p.Profile != "paper" || p.Knobs != nil || p.RP.TimerUs != 55 || p.RP.Alpha != "on-cnp" || p.NP.MinIntervalUs != 50 || !p.NP.Defer || p.KmaxKB != 200 {
		t.Fatalf("paper config %+v", p)
	}
	if _, err := Run(Options{Profile: "paper", ConnectX: &cx}); err == nil {
		t.Fatal("ConnectX knobs were accepted for the paper profile")
	}
}

// The connectx profile (firmware defaults) at scale, beside paper, with the
// paper's marking (5/200 KB/1 %) on a 40 G bottleneck, n-flow seed 1 (only
// with SOFTRNIC_SIM_LONG=1). Measured (seeds 1–3):
//   - N = 64 without PFC the defaults are unstable: a CNP burst cuts every
//     4 µs with the timer and byte stages at 0, so clamp_tgt_rate = 0
//     never lowers R_T from the line rate, and one rpg_time_reset (300 µs)
//     after a flow's last CNP fast recovery puts it at (R_T + R_C)/2 ≈ 20
//     Gb/s; 64 flows doing so overrun the queue, whose delay then delays
//     the CNPs: 2 of 3 seeds fill the 12 MB buffer (Jain 0.27–0.97).
//     With clamp_tgt_rate = 1 the same run is fair (Jain 0.9994, util
//     0.977, queue 40 KB); with PFC (as HPCC's ns-3 runs it) Jain 0.990.
//   - N = 16: utilisation 1.0 but Jain ≈ 0.71: the cuts are proportional
//     and rpg_ai_rate = 5 Mb/s per 300 µs equalises rates far too slowly
//     to undo the start-up spread in 100 ms (paper: Jain 0.995).
//
// Asserted: the mechanism, not a target: N = 64 with the defaults
// overruns (drops), with clamp_tgt_rate = 1 it does not and is fair.
func TestConnectXAtScale(t *testing.T) {
	if os.Getenv("SOFTRNIC_SIM_LONG") == "" {
		t.Skip("set SOFTRNIC_SIM_LONG=1: 64-flow connectx runs")
	}
	clamp := dcqcn.DefaultConnectX()
	if err := clamp.Set("clamp_tgt_rate", 1); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		cx   *dcqcn.ConnectX
	}{{"defaults", nil}, {"clamp_tgt_rate=1", &clamp}} {
		s := mustRun(t, Options{Scenario: NFlow, Flows: 64, Profile: "connectx", ConnectX: c.cx, Seed: 1}).Summary
		t.Logf("connectx %s, N=64: Jain %.4f, util %.4f, queue %.1f KB (max %.1f), drops %d, CNPs %d",
			c.name, s.Jain, s.Utilization, s.QueueMeanKB, s.QueueMaxKB, s.Drops, s.CNPCount)
		if c.cx == nil && s.Drops == 0 {
			t.Errorf("connectx defaults at N=64 no longer overrun the buffer: the note above is stale")
		}
		if c.cx != nil && (s.Drops != 0 || s.Jain < 0.99 || s.Utilization < 0.95) {
			t.Errorf("connectx clamp_tgt_rate=1 at N=64: Jain %.4f, util %.4f, drops %d", s.Jain, s.Utilization, s.Drops)
		}
	}
}

// Options.Retime reaches the pacer: the same seed gives another run (a cut
// now lengthens the gap in progress), still deterministic, and it is
// recorded in the summary.
func TestRetimeWired(t *testing.T) {
	o := Options{Scenario: TwoFlow, Seed: 3, Duration: 20 * time.Millisecond}
	a := mustRun(t, o).Summary
	o.Retime = true
	b, c := mustRun(t, o).Summary, mustRun(t, o).Summary
	if a.Events == b.Events && a.Flows[1].Bytes == b.Flows[1].Bytes {
		t.Fatal("Retime changed nothing")
	}
	if b.Events != c.Events || b.Flows[1].Bytes != c.Flows[1].Bytes {
		t.Fatal("Retime runs are not deterministic")
	}
	if !b.Config.Retime || a.Config.Retime {
		t.Fatalf("config retime %v / %v", a.Config.Retime, b.Config.Retime)
	}
}

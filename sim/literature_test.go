package sim

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// The checks against the literature. Each logs the table it is made of, so
// `go test -run Literature -v ./sim` prints the figures the README quotes.

// twoFlowRun is one algorithm on the two-flow scenario (40 Gb/s, 1 µs
// links, flow B joining at 10 ms) measured over the long window 110–310 ms.
func twoFlowRun(t *testing.T, alg, profile string) Summary {
	t.Helper()
	s := mustRun(t, Options{Scenario: TwoFlow, Algorithm: alg, Profile: profile, Seed: 1,
		Duration: 310 * time.Millisecond, WindowStart: 110 * time.Millisecond}).Summary
	t.Logf("%-6s %-8s  %6.3f %6.3f Gb/s  Jain %.4f  util %.4f  queue mean %6.2f KB (p95 %6.1f, peak %6.1f)  drops %d",
		alg, s.Profile, s.Flows[0].MeanGbps, s.Flows[1].MeanGbps, s.Jain, s.Utilization, s.QueueMeanKB, s.QueueP95KB, s.QueuePeakKB, s.Drops)
	if s.Drops != 0 {
		t.Errorf("%s %s: %d drops", alg, s.Profile, s.Drops)
	}
	return s
}

// Two flows, one bottleneck (HPCC §5, DCQCN §6, Swift §4, Zhu et al.
// CoNEXT'16 §4):
//   - DCQCN, HPCC and Swift share it fairly: Jain ≥ 0.99 over 200 ms;
//   - HPCC leaves almost no queue (η < 1: it aims at 95 % of the link, so
//     the mean queue is ≤ 5 KB) where DCQCN's sits on its ECN ramp (~17
//     KB; the fluid model says 19.6);
//   - TIMELY as the paper specifies it (an update per completed segment)
//     is not fair: its rate changes are proportional to the rate both
//     ways, so the flow that holds the link keeps it (Zhu et al. prove
//     TIMELY's fixed points are not unique; here the newcomer is starved).
//
// HPCC with the artifact's run.py settings (maxStage 0: every update
// multiplicative) is fair only through W_AI, 8.8 bytes per RTT at 40 Gb/s:
// the gap between two flows shrinks by 2·W_AI/W ≈ 8·10⁻⁴ per update. In
// this model that restoring force is matched by a bias of 2·10⁻⁴ in the U
// each flow samples at its per-RTT update (measured: 0.950913 against
// 0.950715): the two pacers interleave deterministically and each flow's
// update falls on the same phase of the pattern, so the 16.9/21.1 Gb/s
// split of the first milliseconds stays (Jain 0.988). A few ns of host
// jitter, a larger W_AI (×10) or maxStage 5 (five additive rounds between
// multiplicative ones: the paper's profile) make it converge; the paper's
// profile is what the fairness check asserts, and the artifact's split is
// locked here so that a change to it is noticed.
func TestLiteratureTwoFlow(t *testing.T) {
	if testing.Short() {
		t.Skip("310 ms runs; skipped with -short")
	}
	dcqcn := twoFlowRun(t, DCQCN, "paper")
	hpccPaper := twoFlowRun(t, HPCC, "paper")
	hpccArt := twoFlowRun(t, HPCC, "artifact")
	swift := twoFlowRun(t, Swift, "")
	timelyPaper := twoFlowRun(t, TIMELY, "paper")
	timelyArt := twoFlowRun(t, TIMELY, "artifact")

	for _, c := range []struct {
		name string
		s    Summary
	}{{"dcqcn", dcqcn}, {"hpcc paper", hpccPaper}, {"swift", swift}} {
		if c.s.Jain < 0.99 {
			t.Errorf("%s: Jain %.4f < 0.99", c.name, c.s.Jain)
		}
	}
	if hpccPaper.QueueMeanKB > 5 || hpccArt.QueueMeanKB > 5 {
		t.Errorf("HPCC mean queue %.2f / %.2f KB, want ≤ 5", hpccPaper.QueueMeanKB, hpccArt.QueueMeanKB)
	}
	if dcqcn.QueueMeanKB < 12 || dcqcn.QueueMeanKB > 26 {
		t.Errorf("DCQCN mean queue %.2f KB, want ~17 (12–26)", dcqcn.QueueMeanKB)
	}
	for _, s := range []Summary{hpccPaper, hpccArt} {
		if s.Utilization < 0.93 || s.Utilization > 0.97 {
			t.Errorf("HPCC %s utilisation %.4f, want η = 0.95 ± 0.02", s.Profile, s.Utilization)
		}
	}
	if swift.Utilization < 0.98 || dcqcn.Utilization < 0.98 {
		t.Errorf("utilisation: swift %.4f, dcqcn %.4f, want ≥ 0.98", swift.Utilization, dcqcn.Utilization)
	}
	if hpccArt.Jain < 0.98 || hpccArt.Jain >= 0.99 {
		t.Errorf("HPCC artifact Jain %.4f: the locked split (0.988) changed; see the comment", hpccArt.Jain)
	}
	if timelyPaper.Jain > 0.9 || timelyPaper.Flows[1].MeanGbps > 0.1*40 {
		t.Errorf("TIMELY (paper) Jain %.4f, newcomer %.3f Gb/s: no longer unfair", timelyPaper.Jain, timelyPaper.Flows[1].MeanGbps)
	}
	// With HPCC ns-3's per-RTT updates every flow updates equally often,
	// which makes TIMELY's additive increase fair again.
	if timelyArt.Jain < 0.99 {
		t.Errorf("TIMELY (artifact) Jain %.4f", timelyArt.Jain)
	}
}

// workloadRow runs one algorithm on a workload and logs its line.
func workloadRow(t *testing.T, o Options) Summary {
	t.Helper()
	s := mustRun(t, o).Summary
	w := s.Workload
	row := func(x *SlowdownStats) string {
		if x == nil {
			return "      -"
		}
		return fmt.Sprintf("%5.2f %5.2f %5.2f", x.P50, x.P95, x.P99)
	}
	t.Logf("%-6s %5d/%5d flows | ≤100KB %s | 100KB–1MB %s | >1MB %s | delivered %.3f of offered %.3f, drops %d, pauses %d, queue p99 %.0f KB | %.1f M events/CPU-s, %.1f s",
		s.Algorithm, w.FlowsFinished, w.FlowsArrived, row(w.Small), row(w.Medium), row(w.Large), w.DeliveredLoad, w.OfferedLoad,
		s.Drops, s.Pauses, w.QueueP99KB, s.EventsPerCPUSec/1e6, s.WallSeconds)
	return s
}

// WebSearch at 30 % load (HPCC Fig. 11a): HPCC's 95th-percentile FCT
// slowdown of the flows of ≤ 100 KB is below DCQCN's. The default run
// samples it on the default leaf-spine (32 hosts, 100 Gb/s, 8 ms; seeds
// 1–4 give DCQCN 3.6–4.1 against HPCC 1.8–1.9); SOFTRNIC_SIM_LONG=1 runs
// the HPCC paper's 320-server fat-tree for 10 ms, every algorithm.
func TestLiteratureWebSearch(t *testing.T) {
	if testing.Short() {
		t.Skip("workload runs; skipped with -short")
	}
	o := Options{Scenario: Workload, CDF: "websearch", Load: 0.3, Seed: 1, Duration: 8 * time.Millisecond}
	algs := []string{DCQCN, HPCC}
	if os.Getenv("SOFTRNIC_SIM_LONG") != "" {
		o.Topology, o.Duration = HPCCTopo, 10*time.Millisecond
		algs = Algorithms
	}
	res := map[string]Summary{}
	for _, a := range algs {
		oo := o
		oo.Algorithm = a
		res[a] = workloadRow(t, oo)
	}
	d, h := res[DCQCN].Workload, res[HPCC].Workload
	if d.Small == nil || h.Small == nil || d.Small.Count < 100 {
		t.Fatal("too few small flows finished")
	}
	if !(h.Small.P95 < d.Small.P95) {
		t.Errorf("≤ 100 KB p95 slowdown: HPCC %.2f, DCQCN %.2f: HPCC is not lower", h.Small.P95, d.Small.P95)
	}
	for a, s := range res {
		if s.Drops != 0 {
			t.Errorf("%s: %d drops", a, s.Drops)
		}
	}
}

// Incast 16:1 with a victim (the incast scenario: 16 senders × 1 MB into
// one 40 Gb/s port at 1 ms, a victim sharing the sw1→sw2 cable with one of
// them, PFC on): the queue peak and the victim's throughput per algorithm.
// HPCC and Swift start at one BDP each, so the queue peaks at about 16
// windows and then drains; they never reach the PFC threshold and the
// victim keeps its rate (HPCC 95 % of it, its target). DCQCN and TIMELY
// start at line rate with no window: the queue grows into PFC, whose
// PAUSEs stop the cable the victim shares.
func TestLiteratureIncast(t *testing.T) {
	res := map[string]Summary{}
	var b strings.Builder
	for _, a := range Algorithms {
		s := mustRun(t, Options{Scenario: Incast, Algorithm: a, Seed: 1}).Summary
		res[a] = s
		last := 0.0
		done := 0
		for _, f := range s.Flows[1:] {
			if f.FCTUs != nil {
				done++
				last = max(last, *f.FCTUs)
			}
		}
		fmt.Fprintf(&b, "\n  %-6s queue peak %7.1f KB, mean %6.1f KB; victim %6.3f Gb/s; PFC pauses %3d; incast done %d/16, last at %5.0f µs; drops %d",
			a, s.QueuePeakKB, s.QueueMeanKB, *s.VictimGbps, s.Pauses, done, last, s.Drops)
		if done != 16 || s.Drops != 0 {
			t.Errorf("%s: %d of 16 incast flows finished, %d drops", a, done, s.Drops)
		}
	}
	t.Log("incast 16:1 + victim, 40 Gb/s, PFC on:" + b.String())
	for _, a := range []string{HPCC, Swift} {
		s := res[a]
		if s.QueuePeakKB > 0.5*res[DCQCN].QueuePeakKB || s.Pauses != 0 {
			t.Errorf("%s: queue peak %.1f KB (DCQCN %.1f), %d pauses", a, s.QueuePeakKB, res[DCQCN].QueuePeakKB, s.Pauses)
		}
		if *s.VictimGbps < 0.9*40 {
			t.Errorf("%s: victim %.3f Gb/s, want ≥ 36", a, *s.VictimGbps)
		}
	}
	if res[DCQCN].Pauses == 0 || *res[DCQCN].VictimGbps > 0.9*40 {
		t.Errorf("DCQCN: %d pauses, victim %.3f Gb/s: PFC no longer hurts the victim", res[DCQCN].Pauses, *res[DCQCN].VictimGbps)
	}
}

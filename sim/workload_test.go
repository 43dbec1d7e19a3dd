package sim

import (
	"bytes"
	"math"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/congestion"
)

// The shipped CDFs parse, and their means are custom_rand.py's getAvg, by
// hand (trapezoids: Σ (x_i + x_{i−1})/2 · (y_i − y_{i−1}) / 100):
//
//	WebSearch: 75,000 + 75,000 + 250,000 + 400,000 + 845,000 + 980,000 +
//	6,000,000 + 15,000,000 + 35,000,000 + 52,500,000 + 60,000,000
//	= 171,125,000 → 1,711,250 bytes.
//	FB_Hadoop: 50 + 150 + 750 + 3,250 + 1,875 + 4,500 + 5,500 + 6,500 +
//	8,500 + 10,500 + 13,500 + 37,000 + 400,000 + 325,000 + 300,000 +
//	1,050,000 + 1,625,000 + 2,250,000 + 6,000,000 = 12,042,075 →
//	120,420.75 bytes.
func TestCDF(t *testing.T) {
	ws, err := LoadCDF("websearch")
	if err != nil {
		t.Fatal(err)
	}
	if ws.Mean() != 1_711_250 || len(ws.X) != 12 {
		t.Fatalf("websearch mean %v (%d points)", ws.Mean(), len(ws.X))
	}
	fb, err := LoadCDF("fbhadoop")
	if err != nil {
		t.Fatal(err)
	}
	if fb.Mean() != 120_420.75 {
		t.Fatalf("fbhadoop mean %v", fb.Mean())
	}
	// Linear interpolation: 15 % is 10 KB; 50 % lies 10/13 of the way
	// from 50 KB (40 %) to 80 KB (53 %).
	if ws.At(15) != 10000 || !near(ws.At(50), 50000+30000.0*10/13, 1e-9) || ws.At(100) != 30e6 {
		t.Fatalf("At: %v %v %v", ws.At(15), ws.At(50), ws.At(100))
	}
	// Draws follow the distribution: the mean of many is the mean, and
	// 15 % fall at or below 10 KB.
	r := rand.New(rand.NewPCG(1, 1))
	var sum float64
	small := 0
	const k = 200_000
	for i := 0; i < k; i++ {
		x := ws.Draw(r)
		sum += float64(x)
		if x <= 10000 {
			small++
		}
	}
	if m := sum / k; math.Abs(m-ws.Mean())/ws.Mean() > 0.03 {
		t.Fatalf("mean of draws %v, want %v ± 3 %%", m, ws.Mean())
	}
	if f := float64(small) / k; math.Abs(f-0.15) > 0.005 {
		t.Fatalf("%.4f of draws ≤ 10 KB, want 0.15", f)
	}
	for _, bad := range []string{"", "0 0\n", "0 1\n10 100\n", "0 0\n10 50\n5 100\n", "0 0\n10 50\n20 50\n30 100\n", "0 0 0\n10 100\n", "0 0\n10 99\n"} {
		if _, err := ParseCDF(strings.NewReader(bad)); err == nil {
			t.Errorf("CDF %q accepted", bad)
		}
	}
	if _, err := LoadCDF("no-such-cdf"); err == nil {
		t.Error("unknown CDF accepted")
	}
}

// Routes and base RTTs of the Clos fabrics, and the HPCC paper's topology:
// 320 servers, 56 switches, 160 switch-to-switch links at 400 Gb/s.
func TestClosTopologies(t *testing.T) {
	o := Options{Scenario: Workload, Algorithm: HPCC, Topology: HPCCTopo}
	if err := o.Defaults(); err != nil {
		t.Fatal(err)
	}
	n, b, _, fb, err := configure(&o)
	if err != nil {
		t.Fatal(err)
	}
	hosts, switches, fabricLinks := 0, 0, 0
	for i := range n.nodes {
		if n.nodes[i].kind == hostNode {
			hosts++
		} else {
			switches++
		}
	}
	for i := range n.ports {
		p := &n.ports[i]
		if n.nodes[p.node].kind == switchNode && n.nodes[p.peer].kind == switchNode {
			fabricLinks++
			if p.rate != 400*congestion.Gbps {
				t.Fatalf("fabric link %s at %v", p.name, p.rate)
			}
		}
	}
	if hosts != 320 || switches != 56 || fabricLinks/2 != 160 {
		t.Fatalf("hpcc topology: %d hosts, %d switches, %d fabric links", hosts, switches, fabricLinks/2)
	}
	// Base RTTs (HPCC ns-3's pairRtt: 2·propagation + one 1000-byte
	// payload's serialisation per link): same ToR 2 links: 4 µs + 2·80 ns;
	// same pod 4 links: 8 µs + 2·80 + 2·20 ns; across pods 6 links:
	// 12 µs + 2·80 + 4·20 ns = 12.24 µs, the largest (T of HPCC).
	for _, c := range []struct {
		dst  int32
		want clock.Time
		sw   int
	}{{1, 4160, 1}, {16, 8200, 3}, {64, 12240, 5}, {319, 12240, 5}} {
		p := n.path(b.hosts[0], b.hosts[c.dst], 1000)
		if p.baseRTT() != c.want || p.switches != c.sw || p.bw != 100*congestion.Gbps {
			t.Errorf("h0→h%d: base RTT %v, %d switches, bottleneck %v; want %v, %d", c.dst, p.baseRTT(), p.switches, p.bw, c.want, c.sw)
		}
	}
	if fb.baseRTT != 12240*time.Nanosecond || n.intStride != 5 || n.cfg.HPCC.BaseRTTUs != 12.24 {
		t.Fatalf("fabric base RTT %v, INT hops %d, HPCC T %v", fb.baseRTT, n.intStride, n.cfg.HPCC.BaseRTTUs)
	}
	// ECMP: a ToR reaches another pod over all 4 aggregation switches, an
	// aggregation switch over its 4 cores; flows spread over them.
	tor := int32(320) // tor0
	if r := n.nodes[tor].route[b.hosts[319]]; r.cnt != 4 {
		t.Fatalf("tor0 has %d next hops to another pod, want 4", r.cnt)
	}
	if r := n.nodes[tor].route[b.hosts[1]]; r.cnt != 1 {
		t.Fatalf("tor0 has %d next hops to its own host, want 1", r.cnt)
	}
	used := map[int32]int{}
	for f := 0; f < 400; f++ {
		used[n.egress(tor, b.hosts[319], flowHash(1, f))]++
	}
	if len(used) != 4 {
		t.Fatalf("400 flows used %d of 4 uplinks", len(used))
	}
	for p, c := range used {
		if c < 60 {
			t.Errorf("uplink %s got %d of 400 flows", n.ports[p].name, c)
		}
	}

	// A k=4 fat-tree with 2:1 oversubscription has 4 hosts per ToR; a
	// leaf-spine's uplink rate follows from its oversubscription.
	o = Options{Scenario: Workload, Topology: FatTree, K: 4, Oversub: 2}
	if err := o.Defaults(); err != nil {
		t.Fatal(err)
	}
	if o.HostsPerToR != 4 || o.UplinkRate != 100*congestion.Gbps {
		t.Fatalf("fat-tree: %d hosts per ToR, uplinks %v", o.HostsPerToR, o.UplinkRate)
	}
	o = Options{Scenario: Workload, Topology: LeafSpine, Leaves: 2, Spines: 2, HostsPerLeaf: 8, Oversub: 4}
	if err := o.Defaults(); err != nil {
		t.Fatal(err)
	}
	if o.UplinkRate != 100*congestion.Gbps { // 8·100 / (2·4)
		t.Fatalf("leaf-spine uplinks %v", o.UplinkRate)
	}
}

// The workload's arrivals: Poisson at the offered load, to other hosts,
// source ports counting from 10000 per pair; fct.txt is HPCC ns-3's format
// and its standalone FCT its formula.
func TestWorkloadFlowsAndFCT(t *testing.T) {
	o := Options{Scenario: Workload, Algorithm: HPCC, CDF: "fbhadoop", Duration: 2 * time.Millisecond, Drain: time.Millisecond, Seed: 3}
	r := mustRun(t, o)
	w := r.Summary.Workload
	t.Logf("%d flows arrived, %d finished, offered load %.3f, delivered %.3f, small p95 %.3f", w.FlowsArrived, w.FlowsFinished, w.OfferedLoad, w.DeliveredLoad, w.Small.P95)
	// 32 hosts × 2 ms / (120,421 B·8/(100 Gb/s·0.3) = 32.1 µs) ≈ 1990 flows.
	if w.FlowsArrived < 1750 || w.FlowsArrived > 2250 {
		t.Fatalf("%d flows arrived, want about 1990", w.FlowsArrived)
	}
	if math.Abs(w.OfferedLoad-0.3) > 0.06 {
		t.Fatalf("offered load %.3f, want 0.3", w.OfferedLoad)
	}
	if w.FlowsFinished < w.FlowsArrived*9/10 || r.Summary.Drops != 0 {
		t.Fatalf("%d of %d flows finished, %d drops", w.FlowsFinished, w.FlowsArrived, r.Summary.Drops)
	}
	lines := strings.Split(strings.TrimSuffix(string(r.FCT), "\n"), "\n")
	if len(lines) != w.FlowsFinished {
		t.Fatalf("fct.txt has %d lines for %d finished flows", len(lines), w.FlowsFinished)
	}
	sports := map[string]bool{}
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) != 8 || len(f[0]) != 8 || len(f[1]) != 8 || f[3] != "100" {
			t.Fatalf("fct.txt line %q", l)
		}
		sip, _ := strconv.ParseUint(f[0], 16, 32)
		dip, _ := strconv.ParseUint(f[1], 16, 32)
		src, dst := int32(sip-0x0b000001)>>8, int32(dip-0x0b000001)>>8
		if sip&0xff != 1 || src == dst || src < 0 || src >= 32 || dst < 0 || dst >= 32 {
			t.Fatalf("fct.txt addresses %q → hosts %d, %d", l, src, dst)
		}
		if k := f[0] + f[1] + f[2]; sports[k] {
			t.Fatalf("source port reused for a pair: %q", l)
		} else {
			sports[k] = true
		}
		size, _ := strconv.ParseInt(f[4], 10, 64)
		fct, _ := strconv.ParseInt(f[6], 10, 64)
		alone, _ := strconv.ParseInt(f[7], 10, 64)
		// standalone = base RTT + (size + packets·48)·8/100 Gb/s; base RTT
		// is 4.16 µs under one leaf, 8.24 µs (2 more links at 200 Gb/s:
		// +4 µs + 2·40 ns) across.
		pkts := (size-1)/1000 + 1
		ser := (size + pkts*48) * 8 / 100
		base := alone - ser
		if base != 4160 && base != 8240 {
			t.Fatalf("standalone %d for %d bytes: base RTT %d ns, want 4160 or 8240", alone, size, base)
		}
		if (src/8 == dst/8) != (base == 4160) {
			t.Fatalf("hosts %d→%d: base RTT %d", src, dst, base)
		}
		if fct <= 0 || float64(fct) < 0.95*float64(alone) {
			t.Fatalf("fct %d below standalone %d: %q", fct, alone, l)
		}
	}
	if !strings.Contains(string(r.FCT), " 10000 100 ") || !strings.Contains(string(r.FCT), " 10001 100 ") {
		t.Fatal("source ports do not count from 10000")
	}
}

// Same seed ⇒ byte-identical fct.txt and summary figures, also with another
// GOMAXPROCS; another seed ⇒ another fct.txt.
func TestWorkloadDeterministic(t *testing.T) {
	o := Options{Scenario: Workload, Algorithm: DCQCN, Topology: FatTree, K: 4, Duration: 2 * time.Millisecond, Seed: 5, IncastFanIn: 4}
	a := mustRun(t, o)
	old := runtime.GOMAXPROCS(1)
	b := mustRun(t, o)
	runtime.GOMAXPROCS(old)
	o.Seed = 6
	c := mustRun(t, o)
	if len(a.FCT) == 0 || !bytes.Equal(a.FCT, b.FCT) {
		t.Fatal("two runs with seed 5 wrote different fct.txt")
	}
	if bytes.Equal(a.FCT, c.FCT) {
		t.Fatal("seeds 5 and 6 wrote the same fct.txt")
	}
	if a.Summary.Events != b.Summary.Events || a.Summary.Workload.QueueMaxKB != b.Summary.Workload.QueueMaxKB {
		t.Fatal("summaries differ between identical runs")
	}
	if !strings.Contains(string(a.FCT), " 200 ") || a.Summary.Workload.Incasts != 1 || a.Summary.Workload.Incast == nil {
		t.Fatalf("incast flows missing: %d bursts", a.Summary.Workload.Incasts)
	}
}

// fct_analysis.py's buckets: flows sorted by size, bucket i holding
// [i·5·n/100, (i+1)·5·n/100), each reporting its largest size and
// a[int(len·p)] of its sorted slowdowns; incast flows (dport 200) apart.
func TestSlowdownTable(t *testing.T) {
	var done []flowDone
	// 40 background flows of sizes 1..40 KB with slowdown = size in KB
	// for odd sizes and 1 for even ones, plus incast flows that must not
	// count.
	for i := 40; i >= 1; i-- {
		alone := clock.Time(1000)
		fct := alone
		if i%2 == 1 {
			fct = alone * clock.Time(i)
		}
		done = append(done, flowDone{size: int64(i) * 1000, fct: fct, alone: alone})
		done = append(done, flowDone{size: 1, fct: 1e6, alone: 1, incast: true})
	}
	tab := SlowdownTable(done, 5)
	if len(tab) != 20 {
		t.Fatalf("%d buckets", len(tab))
	}
	// Bucket 3 holds sizes 7 and 8 KB: slowdowns {7, 1} sorted {1, 7}:
	// p50 = a[int(2·0.5)] = a[1] = 7, p95 and p99 the same.
	b := tab[3]
	if b.Pct != 15 || b.MaxBytes != 8000 || b.Count != 2 || b.P50 != 7 || b.P95 != 7 || b.P99 != 7 {
		t.Fatalf("bucket 3: %+v", b)
	}
	// Sizes 1..10 KB: slowdowns {1,1,3,1,5,1,7,1,9,1}, sorted six 1s then
	// 3, 5, 7, 9: p50 = a[5] = 1, p95 = a[9] = 9, mean 30/10 = 3.
	s := SlowdownOf(done, 0, 10_000)
	if s.Count != 10 || s.P50 != 1 || s.P95 != 9 || s.Mean != 3 {
		t.Fatalf("≤ 10 KB: %+v", s)
	}
	// Slowdown is floored at 1.
	if (flowDone{fct: 5, alone: 10}).Slowdown() != 1 {
		t.Fatal("slowdown below 1")
	}
	// A merge of two runs is the table of their flows together.
	o := Options{Scenario: Workload, Algorithm: Swift, CDF: "fbhadoop", Duration: time.Millisecond}
	var sums []Summary
	var fcts [][]byte
	var all []flowDone
	for seed := uint64(1); seed <= 2; seed++ {
		o.Seed = seed
		r := mustRun(t, o)
		sums, fcts = append(sums, r.Summary), append(fcts, r.FCT)
		all = append(all, r.done...)
	}
	m, fct, err := MergeWorkload(sums, fcts)
	if err != nil {
		t.Fatal(err)
	}
	want := SlowdownTable(all, 5)
	if len(m.Workload.Slowdown) != len(want) || m.Workload.Slowdown[7] != want[7] || m.Workload.FlowsFinished != len(all) || len(m.Seeds) != 2 {
		t.Fatalf("merged table differs from the table of all flows")
	}
	if !bytes.Equal(fct, append(append([]byte{}, fcts[0]...), fcts[1]...)) {
		t.Fatal("merged fct.txt is not the concatenation")
	}
	back, err := ParseFCT(bytes.NewReader(fct))
	if err != nil || len(back) != len(all) || back[3] != all[3] {
		t.Fatalf("fct.txt does not read back: %v", err)
	}
}

// Every algorithm runs the workload (fat-tree, FB_Hadoop with an incast):
// flows finish and nothing is dropped.
func TestWorkloadAllAlgorithms(t *testing.T) {
	for _, a := range Algorithms {
		s := mustRun(t, Options{Scenario: Workload, Algorithm: a, Topology: FatTree, CDF: "fbhadoop", Duration: time.Millisecond,
			Drain: time.Millisecond, IncastFanIn: 8, IncastEvery: 500 * time.Microsecond, Seed: 1}).Summary
		w := s.Workload
		t.Logf("%-6s %d/%d flows, small p95 %.2f, incast p95 %.2f, queue max %.0f KB, drops %d, pauses %d, %.1f M events per CPU-s",
			a, w.FlowsFinished, w.FlowsArrived, w.Small.P95, w.Incast.P95, w.QueueMaxKB, s.Drops, s.Pauses, s.EventsPerCPUSec/1e6)
		if w.FlowsFinished < w.FlowsArrived*9/10 || s.Drops != 0 {
			t.Errorf("%s: %d of %d flows finished, %d drops", a, w.FlowsFinished, w.FlowsArrived, s.Drops)
		}
	}
}

// BenchmarkWorkload measures the simulator on the workload scenario (the
// default leaf-spine, 32 hosts at 100 Gb/s, WebSearch at 30 % for 5 ms)
// in events per CPU-second: the process's CPU time, not wall time, so that
// a loaded machine does not understate it.
func BenchmarkWorkload(b *testing.B) {
	for _, a := range Algorithms {
		b.Run(a, func(b *testing.B) {
			var ev uint64
			c0 := cpuTime()
			for i := 0; i < b.N; i++ {
				r, err := Run(Options{Scenario: Workload, Algorithm: a, Seed: 1, Duration: 5 * time.Millisecond})
				if err != nil {
					b.Fatal(err)
				}
				ev += r.Summary.Events
			}
			b.ReportMetric(float64(ev)/(cpuTime()-c0)/1e6, "Mevents/CPU-s")
			b.ReportMetric(float64(ev)/b.Elapsed().Seconds()/1e6, "Mevents/s")
		})
	}
}

// BenchmarkWorkloadFatTree is the same on a k = 8 fat-tree (128 hosts, 80
// switches) for 2 ms: a larger working set.
func BenchmarkWorkloadFatTree(b *testing.B) {
	var ev uint64
	c0 := cpuTime()
	for i := 0; i < b.N; i++ {
		r, err := Run(Options{Scenario: Workload, Algorithm: HPCC, Topology: FatTree, K: 8, Seed: 1, Duration: 2 * time.Millisecond})
		if err != nil {
			b.Fatal(err)
		}
		ev += r.Summary.Events
	}
	b.ReportMetric(float64(ev)/(cpuTime()-c0)/1e6, "Mevents/CPU-s")
	b.ReportMetric(float64(ev)/b.Elapsed().Seconds()/1e6, "Mevents/s")
}

func near(got, want, tol float64) bool { return math.Abs(got-want) <= tol }

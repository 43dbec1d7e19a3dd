package main

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"strings"
	"testing"

	"github.com/softrnic/softrnic/bench/internal/iobench"
)

// The client's report of a real `sockperf ping-pong -m 64 -t 2` over veth
// (sockperf 3.7, colour escapes included).
func TestParseSockperf(t *testing.T) {
	b, err := os.ReadFile("testdata/sockperf-pingpong.txt")
	if err != nil {
		t.Fatal(err)
	}
	s, err := ParseSockperf(string(b))
	if err != nil {
		t.Fatal(err)
	}
	want := Sockperf{Observations: 113538, AvgUs: 6.814, P50Us: 6.514, P99Us: 8.472, MaxUs: 1182.248}
	if s.Observations != want.Observations || s.AvgUs != want.AvgUs || s.P50Us != want.P50Us || s.P99Us != want.P99Us || s.MaxUs != want.MaxUs {
		t.Fatalf("got %+v, want %+v", s, want)
	}
}

func TestParseSockperfRefusesIncompleteOutput(t *testing.T) {
	b, err := os.ReadFile("testdata/sockperf-pingpong.txt")
	if err != nil {
		t.Fatal(err)
	}
	full := string(b)
	for name, out := range map[string]string{
		"empty":      "",
		"no p50":     strings.Replace(full, "percentile 50.000", "percentile 51.000", 1),
		"no p99":     strings.Replace(full, "percentile 99.000 =", "percentile 99.000 = x", 1),
		"no samples": strings.Replace(full, "Total 113538 observations", "Total 0 observations", 1),
		"server hung": "sockperf: Warmup stage (sending a few dummy messages)...\nsockperf: Starting test...\n" +
			"sockperf: ---> percentile 50.000 =", // cut short
	} {
		if s, err := ParseSockperf(out); err == nil {
			t.Errorf("%s: parsed %+v, want an error", name, s)
		}
	}
}

func TestParseLoadavg(t *testing.T) {
	l, err := ParseLoadavg("3.86 3.92 5.12 2/135 32115\n")
	if err != nil || l != [3]float64{3.86, 3.92, 5.12} {
		t.Fatalf("got %v, %v", l, err)
	}
	for _, bad := range []string{"", "1.0 2.0", "a b c d e"} {
		if _, err := ParseLoadavg(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// sample is a report with every figure present: raw 4 KiB rx 300 000
// frames/s = 1.2288e9 B/s; WRITE 1 QP 8 Gbit/s = 1e9 B/s (ratio 0.8138),
// 4 QPs 6 Gbit/s = 0.75e9 B/s (ratio 0.6104), 1 QP with one process per
// end 1 Gbit/s (0.1017); send_lat p50 12 µs against sockperf's 10 µs
// (ratio 1.2), with one process per end 8 µs (0.8).
func sample() *Report {
	return &Report{
		MTU: MTU, XDPMode: "XDP driver, copy",
		Raw: []iobench.Result{
			{Port: "afxdp", Test: "tx-only", Size: 64, FramesPerSec: 1e6, Gbps: 0.512},
			{Port: "afxdp", Test: "rx-only", Size: 64, FramesPerSec: 8e5, Gbps: 0.4096},
			{Port: "afxdp", Test: "tx-only", Size: 4096, FramesPerSec: 4e5, Gbps: 13.1},
			{Port: "afxdp", Test: "rx-only", Size: 4096, FramesPerSec: 3e5, Gbps: 9.83},
		},
		RNIC: []Perf{
			{Name: Write1QP, Test: Write1QP, Ends: EndsInProcess, Size: 65536, QPs: 1, GoodputGbps: 8, MsgRateMpps: 0.0153},
			{Name: Write4QP, Test: Write4QP, Ends: EndsInProcess, Size: 65536, QPs: 4, GoodputGbps: 6, MsgRateMpps: 0.0114},
			{Name: SendBW64, Test: SendBW64, Ends: EndsInProcess, Size: 64, MsgRateMpps: 0.5, GoodputGbps: 0.256},
			{Name: SendLat, Test: SendLat, Ends: EndsInProcess, Size: 64, LatP50Us: 12, LatP99Us: 30},
			// Measured with one process per end: held against the same
			// raw rate and sockperf.
			{Name: Write1QP + ProcsSuffix, Test: Write1QP, Ends: EndsProcs, Size: 65536, QPs: 1, GoodputGbps: 1},
			{Name: SendLat + ProcsSuffix, Test: SendLat, Ends: EndsProcs, Size: 64, LatP50Us: 8, LatP99Us: 40},
		},
		Sockperf: Sockperf{Observations: 1000, P50Us: 10, P99Us: 20},
	}
}

func TestComputeRatios(t *testing.T) {
	r := sample()
	r.ComputeRatios()
	want := []struct {
		v   float64
		met bool
	}{{8e9 / 8 / 1.2288e9, true}, {6e9 / 8 / 1.2288e9, false}, {1e9 / 8 / 1.2288e9, false}, {1.2, false}, {0.8, true}}
	if len(r.Ratios) != len(want) {
		t.Fatalf("ratios %+v", r.Ratios)
	}
	for i, w := range want {
		if q := r.Ratios[i]; math.Abs(q.Value-w.v) > 1e-9 || q.Met != w.met {
			t.Errorf("ratio %d %q = %v met %v, want %v met %v", i, q.Name, q.Value, q.Met, w.v, w.met)
		}
	}
	// Faster than sockperf meets the latency goal; again is idempotent.
	r.RNIC[3].LatP50Us = 9
	r.ComputeRatios()
	if len(r.Ratios) != 5 || !r.Ratios[3].Met {
		t.Errorf("latency 9 µs vs 10 µs: %+v", r.Ratios)
	}
}

// The daemon's rows are held against the rows with one process per end,
// and only the rows run through the daemon give a ratio.
func TestDaemonRatios(t *testing.T) {
	r := sample()
	r.RNIC = append(r.RNIC,
		Perf{Name: Write1QP + DaemonSuffix, Test: Write1QP, Ends: EndsDaemon, Size: 65536, QPs: 1, GoodputGbps: 0.95},
		Perf{Name: SendLat + DaemonSuffix, Test: SendLat, Ends: EndsDaemon, Size: 64, LatP50Us: 16, LatP99Us: 200})
	r.ComputeRatios()
	want := []struct {
		v   float64
		met bool
	}{{0.95, true}, {2, false}, {5, false}}
	if len(r.Ratios) < len(want) {
		t.Fatalf("ratios %+v", r.Ratios)
	}
	got := r.Ratios[len(r.Ratios)-len(want):]
	if len(got) != len(want) || strings.Contains(r.Ratios[len(r.Ratios)-len(want)-1].Name, "÷ (2 procs)") {
		t.Fatalf("daemon ratios %+v", got)
	}
	for i, w := range want {
		if q := got[i]; math.Abs(q.Value-w.v) > 1e-9 || q.Met != w.met || !strings.Contains(q.Name, DaemonSuffix) {
			t.Errorf("daemon ratio %d %q = %v met %v, want %v met %v", i, q.Name, q.Value, q.Met, w.v, w.met)
		}
	}
	r.RNIC[len(r.RNIC)-2].Error = "daemon: exit status 1"
	r.ComputeRatios()
	if q := r.Ratios[len(r.Ratios)-len(want)]; !math.IsNaN(q.Value) || q.Met || !strings.Contains(q.Name, Write1QP) {
		t.Errorf("failed daemon row: %+v", q)
	}
}

// A figure that failed gives a ratio of NaN that is not met, never a goal
// met by default.
func TestComputeRatiosMissingFigures(t *testing.T) {
	r := sample()
	r.Raw[3].Error = "no frames"
	r.RNIC[3].Error = "client: timeout"
	r.RNIC[5].Error = "client: timeout"
	r.ComputeRatios()
	for _, q := range r.Ratios {
		if !math.IsNaN(q.Value) || q.Met {
			t.Errorf("%q = %v met %v, want NaN, not met", q.Name, q.Value, q.Met)
		}
	}
	r = sample()
	r.Sockperf = Sockperf{Error: "sockperf not installed"}
	r.ComputeRatios()
	for _, q := range r.Ratios[3:] {
		if !math.IsNaN(q.Value) || q.Met {
			t.Errorf("without sockperf: %+v", q)
		}
	}
}

func TestReportJSON(t *testing.T) {
	r := sample()
	r.LoadStart, r.LoadEnd = [3]float64{1, 2, 3}, [3]float64{4, 5, 6}
	r.RNIC[0].Error = "failed" // one ratio NaN: still valid JSON
	r.ComputeRatios()
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var back map[string]any
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	for _, k := range []string{"loadavg_start", "loadavg_end", "xdp_mode", "raw_afxdp", "softrnic", "sockperf", "ratios", "mtu"} {
		if _, ok := back[k]; !ok {
			t.Errorf("JSON has no %q: %s", k, b)
		}
	}
	ratios := back["ratios"].([]any)
	if v := ratios[0].(map[string]any)["value"]; v != nil {
		t.Errorf("NaN ratio written as %v, want null", v)
	}
	if v := ratios[1].(map[string]any)["value"].(float64); math.Abs(v-0.6104) > 1e-4 {
		t.Errorf("ratio 1 = %v", v)
	}
	if back["xdp_mode"] != "XDP driver, copy" || back["sockperf"].(map[string]any)["p50_us"] != 10.0 {
		t.Errorf("JSON: %s", b)
	}
	if ls := back["loadavg_end"].([]any); ls[2] != 6.0 {
		t.Errorf("loadavg_end %v", ls)
	}
}

func TestPrintTable(t *testing.T) {
	r := sample()
	r.RNIC[2].Error = "client: timeout"
	r.RNIC[5].Error = "server: exit status 1 " + strings.Repeat("long error ", 20)
	r.ComputeRatios()
	var out bytes.Buffer
	PrintTable(&out, r)
	s := out.String()
	for _, want := range []string{
		"raw AF_XDP rx-only", "9.83", "softrnic " + Write4QP, "6.00",
		"softrnic " + SendBW64, "error: client: timeout", "12.00", "30.00",
		"sockperf UDP ping-pong", "10.00", "20.00",
		"0.814", "met", "0.610", "1.200", "MISSED", "XDP driver, copy",
		"softrnic " + SendLat + ProcsSuffix, "error: server: exit status 1 long error", "…", "n/a",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("table lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, strings.Repeat("long error ", 10)) {
		t.Errorf("error not shortened:\n%s", s)
	}
	if n := strings.Count(s, "MISSED"); n != 4 {
		t.Errorf("%d MISSED, want 4:\n%s", n, s)
	}
}

// TestPerCPURatios: the WRITE rows' payload per CPU-second over the raw
// receiver's bytes per CPU-second, computed only where both were measured,
// and shown as a cost view beside the ratios.
func TestPerCPURatios(t *testing.T) {
	r := sample()
	r.Raw[3].FramesPerCPUSec = 1e5 // 409.6 MB per CPU-s
	p := &r.RNIC[0]
	p.Iters = 5000
	p.setCPU(2) // 5000 × 64 KiB in 2 CPU-s: 1.31 Gbit per CPU-s
	if want := 5000 * 65536 * 8 / 1e9 / 2; math.Abs(p.GbitPerCPUSec-want) > 1e-9 || p.CPUSeconds != 2 {
		t.Fatalf("setCPU: %+v", p)
	}
	r.RNIC[3].setCPU(1) // latency rows get CPU time but no rate
	if r.RNIC[3].GbitPerCPUSec != 0 {
		t.Errorf("latency row has a rate: %+v", r.RNIC[3])
	}
	r.ComputeRatios()
	if len(r.PerCPU) != 3 {
		t.Fatalf("per-CPU ratios %+v", r.PerCPU)
	}
	if v := r.PerCPU[0].Value; math.Abs(v-0.4) > 1e-9 || r.PerCPU[0].Met {
		t.Errorf("1 QP per CPU-s ratio %+v", r.PerCPU[0])
	}
	if !math.IsNaN(r.PerCPU[1].Value) || r.PerCPU[1].Met {
		t.Errorf("4 QPs had no CPU figure: %+v", r.PerCPU[1])
	}
	var out bytes.Buffer
	PrintTable(&out, r)
	if s := out.String(); !strings.Contains(s, "0.400") || strings.Count(s, "(cost view)") != 1 {
		t.Errorf("table:\n%s", s)
	}
}

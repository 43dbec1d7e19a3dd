package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/softrnic/softrnic/sim"
)

// softrnic sim dcqcn says what it ran, on stdout and in summary.json, and
// --seeds writes the spread (sweep.json) and every seed's rates (sweep.csv).
func TestSimCommand(t *testing.T) {
	dir := t.TempDir()
	var out, errb bytes.Buffer
	if err := simDCQCN([]string{"--duration", "12ms", "--set", "rpg_time_reset=150", "--out", dir}, &out, &errb); err != nil {
		t.Fatal(err, errb.String())
	}
	if s := out.String(); !strings.Contains(s, "profile connectx") || !strings.Contains(s, "rpg_time_reset=150") || !strings.Contains(s, "RED 5/200 KB/1 %") {
		t.Fatalf("the run does not say what it ran:\n%s", s)
	}
	var sum struct {
		Config struct {
			Profile string            `json:"profile"`
			Knobs   map[string]uint32 `json:"knobs"`
		} `json:"config"`
	}
	b, err := os.ReadFile(filepath.Join(dir, "summary.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &sum); err != nil || sum.Config.Profile != "connectx" || sum.Config.Knobs["rpg_time_reset"] != 150 {
		t.Fatalf("summary.json config %+v (%v)", sum.Config, err)
	}

	dir = t.TempDir()
	out.Reset()
	if err := simDCQCN([]string{"--duration", "12ms", "--seeds", "2", "--np", "grid", "--order", "alpha-then-cut", "--out", dir}, &out, &errb); err != nil {
		t.Fatal(err, errb.String())
	}
	if s := out.String(); !strings.Contains(s, "seeds 1–2") || !strings.Contains(s, "grid true") || !strings.Contains(s, "alpha-then-cut") {
		t.Fatalf("sweep output:\n%s", s)
	}
	var sw struct {
		Seeds  []uint64 `json:"seeds"`
		Config struct {
			NP struct {
				Grid bool `json:"grid"`
			} `json:"np"`
		} `json:"config"`
	}
	if b, err = os.ReadFile(filepath.Join(dir, "sweep.json")); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &sw); err != nil || len(sw.Seeds) != 2 || !sw.Config.NP.Grid {
		t.Fatalf("sweep.json %+v (%v)", sw, err)
	}
	if b, err = os.ReadFile(filepath.Join(dir, "sweep.csv")); err != nil || strings.Count(string(b), "\n") != 5 {
		t.Fatalf("sweep.csv %q (%v): want a header and 4 rows", b, err)
	}
	if b, err = os.ReadFile(filepath.Join(dir, "sweep.svg")); err != nil || !bytes.Contains(b, []byte("<svg")) || !bytes.Contains(b, []byte("window mean per seed")) {
		t.Fatalf("sweep.svg: %v", err)
	}

	for _, bad := range [][]string{{"--np", "bogus"}, {"--order", "x"}, {"--profile", "connectx", "--np", "grid"}} {
		if err := simDCQCN(append(bad, "--out", t.TempDir()), &out, &errb); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}

// TestMain lets the test binary stand in for softrnic when a test spawns
// --parallel worker processes (they run os.Executable, which is the test
// binary here, with the worker environment variable set).
func TestMain(m *testing.M) {
	if os.Getenv(simWorkerEnv) != "" {
		main()
	}
	if sock := os.Getenv(streamChildEnv); sock != "" {
		os.Exit(streamChild(sock))
	}
	os.Exit(m.Run())
}

// softrnic sim hpcc|timely|swift on the small scenarios: the traces carry
// each algorithm's own columns.
func TestSimAlgorithms(t *testing.T) {
	for _, c := range []struct{ alg, cols, fig string }{
		{"hpcc", "window_kb,u", "hpcc.svg"}, {"timely", "gradient,rtt_us", "timely.svg"}, {"swift", "target_us,cwnd_pkts", "swift.svg"},
	} {
		dir := t.TempDir()
		var out, errb bytes.Buffer
		if err := simRun(c.alg, []string{"--duration", "12ms", "--out", dir}, &out, &errb); err != nil {
			t.Fatal(err, errb.String())
		}
		b, err := os.ReadFile(filepath.Join(dir, "flows.csv"))
		if err != nil || !strings.HasPrefix(string(b), "t_us,flow,rate_gbps,"+c.cols+"\n") {
			t.Fatalf("%s flows.csv header: %.60q (%v)", c.alg, b, err)
		}
		if _, err := os.Stat(filepath.Join(dir, c.fig)); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out.String(), c.alg+" two-flow") {
			t.Fatalf("%s output:\n%s", c.alg, out.String())
		}
	}
	// An hpcc parameter on top of its profile, T from the topology.
	dir := t.TempDir()
	var out, errb bytes.Buffer
	if err := simRun("hpcc", []string{"--duration", "12ms", "--hpcc-max-stage", "5", "--hpcc-eta", "0.9", "--out", dir}, &out, &errb); err != nil {
		t.Fatal(err, errb.String())
	}
	if s := out.String(); !strings.Contains(s, "η 0.9, maxStage 5") || !strings.Contains(s, "T 4.4 µs") || !strings.Contains(s, "(replaced by the caller)") {
		t.Fatalf("hpcc flags:\n%s", s)
	}
	for _, bad := range [][]string{{"--hpcc-eta", "0.9"}, {"--np", "grid"}, {"--set", "rpg_ai_rate=5"}} {
		if err := simRun("swift", append(bad, "--out", t.TempDir()), &out, &errb); err == nil {
			t.Errorf("swift %v accepted", bad)
		}
	}
}

// The workload from the command line: fct.txt, summary.json with the
// slowdown table, slowdown.svg; --seeds with --parallel runs worker
// processes and merges them; sim compare overlays runs.
func TestSimWorkload(t *testing.T) {
	root := t.TempDir()
	args := []string{"--scenario", "workload", "--cdf", "fbhadoop", "--duration", "1ms", "--drain", "1ms", "--topology", "fat-tree", "--k", "4"}
	var out, errb bytes.Buffer
	one := filepath.Join(root, "one")
	if err := simRun("swift", append(args, "--seed", "2", "--out", one), &out, &errb); err != nil {
		t.Fatal(err, errb.String())
	}
	if s := out.String(); !strings.Contains(s, "fat-tree: 16 hosts at 100 Gb/s") || !strings.Contains(s, "FCT slowdown") || !strings.Contains(s, "≤ 100 KB") {
		t.Fatalf("workload output:\n%s", s)
	}
	for _, f := range []string{"summary.json", "fct.txt", "slowdown.svg"} {
		if _, err := os.Stat(filepath.Join(one, f)); err != nil {
			t.Fatal(err)
		}
	}
	sum, err := readSummary(one)
	if err != nil || sum.Workload == nil || len(sum.Workload.Slowdown) != 20 || sum.Workload.Slowdown[0].Count == 0 {
		t.Fatalf("summary.json slowdown table: %+v (%v)", sum.Workload, err)
	}

	merged := filepath.Join(root, "merged")
	out.Reset()
	if err := simRun("swift", append(args, "--seeds", "2", "--parallel", "2", "--out", merged), &out, &errb); err != nil {
		t.Fatal(err, errb.String())
	}
	m, err := readSummary(merged)
	if err != nil || len(m.Seeds) != 2 || m.Seeds[1] != 2 || len(m.Runs) != 2 {
		t.Fatalf("merged summary: seeds %v runs %d (%v)", m.Seeds, len(m.Runs), err)
	}
	// Seed 2's worker wrote exactly what the single run with seed 2 did.
	a, _ := os.ReadFile(filepath.Join(one, "fct.txt"))
	b, _ := os.ReadFile(filepath.Join(merged, "seed-2", "fct.txt"))
	all, _ := os.ReadFile(filepath.Join(merged, "fct.txt"))
	s1, _ := os.ReadFile(filepath.Join(merged, "seed-1", "fct.txt"))
	if len(a) == 0 || !bytes.Equal(a, b) || !bytes.Equal(all, append(s1, b...)) {
		t.Fatal("worker fct.txt differs from the single run's, or the merge is not their concatenation")
	}
	if m.Workload.FlowsFinished != m.Runs[0].FlowsFinished+m.Runs[1].FlowsFinished {
		t.Fatal("merged flow count")
	}

	hp := filepath.Join(root, "hpcc")
	if err := simRun("hpcc", append(args, "--quiet", "--out", hp), &out, &errb); err != nil {
		t.Fatal(err, errb.String())
	}
	cmp := filepath.Join(root, "cmp")
	out.Reset()
	if err := simCompare([]string{"--out", cmp, merged, hp}, &out, &errb); err != nil {
		t.Fatal(err)
	}
	if s := out.String(); !strings.Contains(s, "swift default") || !strings.Contains(s, "hpcc artifact") {
		t.Fatalf("compare output:\n%s", s)
	}
	if b, err := os.ReadFile(filepath.Join(cmp, "compare.svg")); err != nil || bytes.Count(b, []byte("swift default")) < 3 {
		t.Fatalf("compare.svg: %v", err)
	}

	// A sweep of the small scenarios in worker processes matches the
	// in-process one.
	sw1, sw2 := filepath.Join(root, "sw1"), filepath.Join(root, "sw2")
	if err := simRun("hpcc", []string{"--duration", "12ms", "--seeds", "2", "--quiet", "--out", sw1}, &out, &errb); err != nil {
		t.Fatal(err)
	}
	if err := simRun("hpcc", []string{"--duration", "12ms", "--seeds", "2", "--parallel", "2", "--quiet", "--out", sw2}, &out, &errb); err != nil {
		t.Fatal(err)
	}
	j1, _ := os.ReadFile(filepath.Join(sw1, "sweep.json"))
	j2, _ := os.ReadFile(filepath.Join(sw2, "sweep.json"))
	if len(j1) == 0 || !bytes.Equal(j1, j2) {
		t.Fatal("sweep.json of worker processes differs from the in-process sweep")
	}
}

// --preset hpcc is the HPCC paper's fabric (checked without running it:
// the run takes about 20 s).
func TestSimPreset(t *testing.T) {
	o := sim.Options{Algorithm: sim.HPCC}
	f := simFlags{preset: "hpcc", marking: "dequeue", set: map[string]bool{}}
	if err := f.apply(&o); err != nil || o.Scenario != sim.Workload || o.Topology != sim.HPCCTopo {
		t.Fatalf("preset: %+v %v", o, err)
	}
	r, err := sim.Configure(o)
	if err != nil || r.HPCC.BaseRTT != 12240 || r.Config.INTHops != 5 || r.Config.PacketBytes != 1090 || r.Config.KminKB != 400 {
		t.Fatalf("preset config: %+v %v", r.Config, err)
	}
	if got := workerArgs([]string{"--seeds", "4", "--parallel=2", "--out", "x", "--quiet", "--load", "0.5", "--seed=3"}); strings.Join(got, " ") != "--load 0.5" {
		t.Fatalf("worker args %q", got)
	}
}

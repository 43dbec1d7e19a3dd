package main

import (
	"bytes"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/softrnic/softrnic/bench/internal/iobench"
	"github.com/softrnic/softrnic/internal/netnstest"
)

// TestMain lets the test binary serve as the child process of each
// softrnic end, as the bench program does.
func TestMain(m *testing.M) {
	if childMain() {
		return
	}
	os.Exit(m.Run())
}

// TestRunSmoke runs the whole bench end to end with short durations: the
// namespaces and veth, raw AF_XDP, the four softrnic perf runs, sockperf,
// the table and the JSON. It checks that every figure was measured (no
// row failed, every ratio computed) and that the namespaces are gone
// afterwards; it asserts nothing about speed. Root only.
func TestRunSmoke(t *testing.T) {
	for _, inproc := range []bool{false, true} {
		name := "processes"
		if inproc {
			name = "inprocess"
		}
		t.Run(name, func(t *testing.T) { runSmoke(t, inproc) })
	}
}

func runSmoke(t *testing.T, inproc bool) {
	netnstest.SkipUnlessRoot(t)
	if _, err := exec.LookPath("sockperf"); err != nil {
		t.Skip("needs Debian's sockperf")
	}
	before := ourNamespaces(t)
	o := Options{RawDuration: 200 * time.Millisecond, WriteIters1: 100, WriteIters4: 100, SendIters: 2000,
		LatIters: 200, SockperfSecs: 1, PerfTimeout: 60 * time.Second, Procs: ProcsAll}
	if inproc {
		o.Procs = ProcsNone
	} else {
		o.ProfDir = t.TempDir()
		o.Rounds = 2
		o.Daemon = true
	}
	var log bytes.Buffer
	rep, err := Run(o, &log)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(log.String())
	if after := ourNamespaces(t); after != before {
		t.Errorf("namespaces left behind: before %q, after %q", before, after)
	}
	rows := 12 // in process, with one process per end, through the daemon
	if inproc {
		rows = 4
	}
	if len(rep.Raw) != 5 || len(rep.RNIC) != rows {
		t.Fatalf("rows: %d raw, %d softrnic", len(rep.Raw), len(rep.RNIC))
	}
	for _, r := range rep.Raw {
		if r.Error != "" || r.FramesPerSec <= 0 || r.Mode == "" {
			t.Errorf("raw %s %d B: %+v", r.Test, r.Size, r)
		}
	}
	for _, p := range rep.RNIC {
		if p.Error != "" {
			t.Errorf("%s: %s", p.Name, p.Error)
		} else if (p.Test == SendLat) != (p.LatP50Us > 0 && p.LatP99Us >= p.LatP50Us) || (p.Test != SendLat && p.GoodputGbps <= 0) {
			t.Errorf("%s: %+v", p.Name, p)
		}
	}
	if want := max(o.Rounds, 1); len(rep.RawRounds) != want || len(rep.RawFrameRounds) != want {
		t.Errorf("%d and %d raw rx rounds, want %d", len(rep.RawRounds), len(rep.RawFrameRounds), want)
	}
	if len(rep.SameFrame) != rows/4*2 {
		t.Errorf("same-frame ratios %+v", rep.SameFrame)
	}
	for _, q := range rep.SameFrame {
		if math.IsNaN(q.Value) || q.Value <= 0 {
			t.Errorf("ratio %q = %v", q.Name, q.Value)
		}
	}
	for _, p := range rep.RNIC {
		if w := p.Test == Write1QP || p.Test == Write4QP; w != (len(p.RoundsGbps) == max(o.Rounds, 1)) {
			t.Errorf("%s: rounds %v", p.Name, p.RoundsGbps)
		}
	}
	if s := rep.Sockperf; s.Error != "" || s.P50Us <= 0 || s.P99Us < s.P50Us {
		t.Errorf("sockperf: %+v", s)
	}
	// One per WRITE and send_lat row, and the daemon's five.
	if want := rows/4*3 + (rows/12)*5; len(rep.Ratios) != want {
		t.Errorf("%d ratios, want %d: %+v", len(rep.Ratios), want, rep.Ratios)
	}
	for _, q := range rep.Ratios {
		if math.IsNaN(q.Value) || q.Value <= 0 {
			t.Errorf("ratio %q = %v", q.Name, q.Value)
		}
	}
	if !inproc {
		profs, _ := filepath.Glob(filepath.Join(o.ProfDir, "*.prof"))
		if len(profs) != 8 {
			t.Errorf("profiles of the children: %v", profs)
		}
	}
	if rep.XDPMode == "" || rep.LoadStart == [3]float64{} {
		t.Errorf("mode %q, load %v", rep.XDPMode, rep.LoadStart)
	}
	var table bytes.Buffer
	PrintTable(&table, rep)
	t.Log("\n" + table.String())
	path := t.TempDir() + "/bench-rnic.json"
	if err := writeJSON(path, rep); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(path); err != nil || !bytes.Contains(b, []byte(`"ratios"`)) {
		t.Errorf("JSON %v: %s", err, b)
	}
}

// ourNamespaces lists this process's netnstest namespaces.
func ourNamespaces(t *testing.T) string {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		t.Fatal(err)
	}
	var mine []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "srn-"+strconv.Itoa(os.Getpid())+"-") {
			mine = append(mine, strings.Fields(l)[0])
		}
	}
	return strings.Join(mine, ",")
}

// TestMedianRound: a row is its median round, a failed round counts as the
// slowest, and every round's goodput is kept in order.
func TestMedianRound(t *testing.T) {
	ps := []Perf{{GoodputGbps: 9}, {Error: "timeout"}, {GoodputGbps: 11}, {GoodputGbps: 10}, {GoodputGbps: 12}}
	m := medianPerf(ps)
	if m.GoodputGbps != 10 || !slices.Equal(m.RoundsGbps, []float64{9, -1, 11, 10, 12}) {
		t.Errorf("median %+v", m)
	}
	if m := medianPerf(ps[:2]); m.Error == "" { // of two, the lower
		t.Errorf("median of 9 and a failure: %+v", m)
	}
	rs := []iobench.Result{{FramesPerSec: 3}, {FramesPerSec: 1}, {FramesPerSec: 2}}
	if r := median(rs, rawRate); r.FramesPerSec != 2 || rs[0].FramesPerSec != 3 {
		t.Errorf("raw median %+v (input %+v)", r, rs)
	}
}

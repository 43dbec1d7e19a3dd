package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/softrnic/softrnic/internal/netnstest"
)

// perfOut is what `softrnic perf write_bw --json` printed on a client.
const perfOut = `{
  "test_info": {
    "test": "RDMA_Write_BW_Test",
    "Device": "va",
    "Number_of_qps": 1,
    "Connection_type": "RC",
    "Mtu": 1024,
    "Link_type": "Ethernet",
    "BW_units": "MiB/sec",
    "verified": true
  },
  "results_bw": [
    {
      "MsgSize": 65536,
      "n_iterations": 8600,
      "BW_peak": 241.44569142505674,
      "BW_average": 131.95070975566264,
      "MsgRate": 0.0021112113560906023
    }
  ]
}
`

func TestParsePerfJSON(t *testing.T) {
	j, err := parsePerfJSON([]byte("a line first\n" + perfOut))
	if err != nil {
		t.Fatal(err)
	}
	if j.TestInfo.MTU != 1024 || j.TestInfo.Verified == nil || !*j.TestInfo.Verified || len(j.BW) != 1 ||
		j.BW[0].Iters != 8600 || j.BW[0].BWAverage < 131.9 || j.BW[0].BWAverage > 132 {
		t.Errorf("parsed %+v", j)
	}
	if _, err := parsePerfJSON([]byte("softrnic perf write_bw: failed\n")); err == nil {
		t.Error("no JSON accepted")
	}
}

func TestClassify(t *testing.T) {
	for in, want := range map[string]string{
		"softrnic perf write_bw: perf: QP 0x34: work request 1 completed with status RETRY_EXC_ERR\nperftest: key exchange: EOF": "RETRY_EXC_ERR",
		"perf: QP 0x11: work request 3 completed with status RNR_RETRY_EXC_ERR":                                                  "RNR_RETRY_EXC_ERR",
		"perf: QP 0x11: work request 3 completed with status REM_ACCESS_ERR\n":                                                   "REM_ACCESS_ERR",
		"perf: no progress for 5s: the peer stopped answering":                                                                   "stalled",
		"perftest: key exchange: EOF": "error",
	} {
		if got := classify(in); got != want {
			t.Errorf("classify(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestParseEthtoolAndDelta(t *testing.T) {
	const before = `NIC statistics:
     peer_ifindex: 3
     rx_queue_0_xdp_packets: 100
     rx_queue_0_drops: 5
     rx_queue_1_drops: 2
     rx_queue_0_xdp_redirect: 90
     tx_queue_0_xdp_xmit: 0
`
	const after = `NIC statistics:
     peer_ifindex: 3
     rx_queue_0_xdp_packets: 250
     rx_queue_0_drops: 45
     rx_queue_1_drops: 2
     rx_queue_0_xdp_redirect: 190
     tx_queue_0_xdp_xmit: 0
`
	b, a := parseEthtool(before), parseEthtool(after)
	if b["rx_drops"] != 7 || b["rx_xdp_redirect"] != 90 || b["peer_ifindex"] != 0 {
		t.Errorf("parsed %v", b)
	}
	d := delta(b, a)
	if d["rx_drops"] != 40 || d["rx_xdp_packets"] != 150 || d["rx_xdp_redirect"] != 100 || d["tx_xdp_xmit"] != 0 {
		t.Errorf("delta %v", d)
	}
	// A counter that went backwards (the device was made again) counts
	// from zero.
	if d := delta(map[string]uint64{"x": 10}, map[string]uint64{"x": 3}); d["x"] != 3 {
		t.Errorf("backwards: %v", d)
	}
}

// TestModes: flags are found in perf --help as whole words only, and a mode
// whose flags are missing is marked with the first missing one.
func TestModes(t *testing.T) {
	ms, err := ParseModes(DefaultModes)
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 3 || ms[0].Name != DefaultMode || len(ms[0].Args) != 0 || ms[1].Name != GoBackNMode ||
		ms[2].Name != TimerMode || len(ms[2].Args) != 1 {
		t.Fatalf("parsed %+v", ms)
	}
	help := "      --verify           fill buffers\n      --recovery-x=on|off  not it\n"
	checkSupport(ms, help)
	if ms[0].Unsupported != "" || ms[1].Unsupported != "the binary has no --recovery" || ms[2].Unsupported == "" {
		t.Errorf("support %+v", ms)
	}
	ms, _ = ParseModes(DefaultModes + "; both = --recovery=adaptive --bdp-cap=off")
	checkSupport(ms, help+"      --recovery=selective|adaptive|timeout   loss recovery\n")
	if ms[1].Unsupported != "" || ms[2].Unsupported != "" || ms[3].Name != "both" || ms[3].Unsupported != "the binary has no --bdp-cap" {
		t.Errorf("support %+v", ms)
	}
	for _, bad := range []string{"", ";", "=--x", "noequals"} {
		if _, err := ParseModes(bad); err == nil {
			t.Errorf("ParseModes(%q) accepted", bad)
		}
	}
}

func ok(mibps float64) Run { return Run{MiBps: mibps, Iters: 100, PathMTU: 1024} }

func failed(why string) Run { return Run{Failure: why} }

// sampleReport is a run with every kind of cell: figures, failures, a mode
// the binary lacks.
func sampleReport() *Report {
	rep := &Report{Kernel: "6.18", CPUs: 2, Binary: "bin/softrnic"}
	modes := []Mode{{Name: DefaultMode}, {Name: GoBackNMode, Args: []string{"--recovery=adaptive"}, Unsupported: "the binary has no --recovery"}}
	br := &netnstest.PathCounters{AtoB: netnstest.DirCounters{Frames: 9500}}
	withBridge := func(r Run) Run { r.Bridge = br; return r }
	rep.Loss = &LossTable{MTU: 1500, Args: []string{"-s", "65536", "--verify"}, Duration: "4s", Rounds: 3, Modes: modes,
		Losses: []int{0, 10, 30}, Timeouts: []int{14, 8}, Cells: []LossCell{
			{Mode: DefaultMode, LossPerMille: 0, QPTimeout: 14, Runs: []Run{ok(400), ok(440), ok(420)}},
			{Mode: DefaultMode, LossPerMille: 0, QPTimeout: 8, Runs: []Run{ok(410), failed("RETRY_EXC_ERR"), ok(430)}},
			{Mode: DefaultMode, LossPerMille: 10, QPTimeout: 14, Runs: []Run{withBridge(ok(84)), withBridge(ok(90)), withBridge(ok(80))}},
			{Mode: DefaultMode, LossPerMille: 10, QPTimeout: 8, Runs: []Run{ok(300), ok(290), failed("timeout")}},
			{Mode: DefaultMode, LossPerMille: 30, QPTimeout: 14, Runs: []Run{ok(380), ok(390), ok(400)}},
			{Mode: DefaultMode, LossPerMille: 30, QPTimeout: 8, Runs: []Run{failed("RETRY_EXC_ERR"), failed("RETRY_EXC_ERR"), failed("timeout")}},
		}}
	xsk := func(r Run, drops uint64) Run {
		r.XSK = &XSKStats{Sockets: 1, RxDropped: drops, RxFillRingEmpty: drops}
		r.Veth = map[string]uint64{"rx_xdp_redirect": 1000 - drops}
		return r
	}
	rep.QPs = &QPTable{Args: []string{"-s", "65536"}, Duration: "4s", Rounds: 1, Cells: []QPCell{
		{MTU: 1500, QPs: 1, Runs: []Run{xsk(ok(455), 0)}},
		{MTU: 1500, QPs: 64, Runs: []Run{xsk(failed("RETRY_EXC_ERR"), 550)}},
		{MTU: 1500, QPs: 128, Runs: []Run{xsk(ok(400), 0)}},
		{MTU: 4200, QPs: 1, Runs: []Run{xsk(ok(779), 0)}},
		{MTU: 4200, QPs: 64, Runs: []Run{xsk(ok(387), 10)}},
	}}
	rep.Daemon = &DaemonRun{MTU: 1500, QPs: 64, Run: Run{MiBps: 274, Daemon: map[string]uint64{"xdp_steered": 329762, "xsk_rx_fill_ring_empty_descs": 49821}}}
	return rep
}

// TestSummarize: medians over the rounds that completed, ratios to the
// same mode and timeout without loss (or to 1 QP), failures counted, and
// the goals judged from them.
func TestSummarize(t *testing.T) {
	rep := sampleReport()
	rep.Summarize()
	l := rep.Loss
	for _, c := range []struct {
		loss, u      int
		mibps, ratio float64
		failed       int
	}{
		{0, 14, 420, 1, 0}, {0, 8, 410, 1, 1}, {10, 14, 84, 0.2, 0}, {10, 8, 290, 290.0 / 410, 1},
		{30, 14, 390, 390.0 / 420, 0}, {30, 8, 0, 0, 3},
	} {
		got := l.Cell(DefaultMode, c.loss, c.u)
		if got.MiBps != c.mibps || got.Failed != c.failed || diff(got.Ratio, c.ratio) > 1e-9 {
			t.Errorf("loss %d -u %d: %+v, want %v MiB/s ratio %v failed %d", c.loss, c.u, got, c.mibps, c.ratio, c.failed)
		}
	}
	q := rep.QPs.Cells
	if q[2].Ratio != 400.0/455 || q[1].Ratio != 0 || q[1].Failed != 1 || q[4].Ratio != 387.0/779 {
		t.Errorf("QP cells %+v", q)
	}
	goals := map[string]Goal{}
	for _, g := range rep.Goals {
		goals[g.Name] = g
	}
	g1 := goals["default, 1 % loss each way, -u 14: goodput ÷ lossless"]
	g3 := goals["default, 3 % loss each way, -u 14: goodput ÷ lossless"]
	if g1.Met || g1.Value != "0.20" || !g3.Met || g3.Value != "0.93" {
		t.Errorf("loss goals %+v %+v", g1, g3)
	}
	if _, ok := goals["go-back-N peer, 1 % loss each way, -u 14: goodput ÷ lossless"]; ok {
		t.Error("a goal judged for a mode that did not run")
	}
	q64, q128 := goals["write_bw -q 64, MTU 1500"], goals["write_bw -q 128, MTU 1500"]
	if q64.Met || !strings.Contains(q64.Value, "0 of 1 runs completed") || !strings.Contains(q64.Value, "550 frames dropped") {
		t.Errorf("64 QPs %+v", q64)
	}
	if !q128.Met {
		t.Errorf("128 QPs %+v", q128)
	}
	if len(rep.Goals) != 4 {
		t.Errorf("goals %+v", rep.Goals)
	}
}

func diff(a, b float64) float64 {
	if a > b {
		return a - b
	}
	return b - a
}

// TestPrintTable: the tables say what the summary holds, n/a for a mode
// the binary lacks, failures by kind, the receiver's drops; the JSON
// round-trips.
func TestPrintTable(t *testing.T) {
	rep := sampleReport()
	rep.Summarize()
	var b bytes.Buffer
	PrintTable(&b, rep)
	// Compare with runs of blanks as one: the columns' widths are
	// tabwriter's business.
	out := strings.Join(strings.Fields(b.String()), " ")
	for _, want := range []string{
		"MTU 1500 (path MTU 1024)",
		"-u 14 (67 ms)", "-u 8 (1 ms)",
		"84.0 MiB/s  0.20",
		"410.0 MiB/s  1.00  (1/3 failed: RETRY_EXC_ERR)",
		"failed (3/3: RETRY_EXC_ERR, timeout)",
		"go-back-N peer   n/a: the binary has no --recovery",
		"frames per 64 KiB message delivered (minimum 64)",
		"95.0", // 9500 frames for 100 messages
		"failed (1/1: RETRY_EXC_ERR)   1000   550 (55.0 %)   550",
		"xdp_steered 329762, xsk_rx_fill_ring_empty_descs 49821 (15.1 % of steered)",
		"not met",
	} {
		if want = strings.Join(strings.Fields(want), " "); !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
	js, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(js, &back); err != nil || back.Loss.Cell(DefaultMode, 10, 14).Ratio != 0.2 {
		t.Errorf("JSON round trip: %v", err)
	}
}

func TestParseLoadavg(t *testing.T) {
	l, err := ParseLoadavg("2.05 2.17 1.62 5/120 32347\n")
	if err != nil || l != [3]float64{2.05, 2.17, 1.62} {
		t.Errorf("%v %v", l, err)
	}
	if _, err := ParseLoadavg("2.05"); err == nil {
		t.Error("short loadavg accepted")
	}
}

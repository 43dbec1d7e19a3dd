package perftest

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/softrnic/softrnic/ib"
)

func TestParseArgs(t *testing.T) {
	p, err := ParseArgs(Write, BW, []string{"-d", "veth0", "-s4096", "--iters=100", "10.0.0.2", "-q", "4", "-m", "1024",
		"-p", "18600", "-c", "rc", "-x", "1", "-F", "--report_gbits", "--json", "--verify", "-t", "64", "--tclass", "106", "-u", "18"})
	if err != nil {
		t.Fatal(err)
	}
	want := Params{Test: Test{Verb: Write, Measure: BW, Transport: RC, QPs: 4, Size: 4096, SizeGiven: true},
		Host: "10.0.0.2", Device: "veth0", Port: 18600, Iters: 100, MTU: 3, GIDIndex: 1, TxDepth: 64, RxDepth: 512,
		CQMod: 64, OutReads: 1, TClass: 106, HopLimit: 64, QPTimeout: 18, ReportGbits: true, JSON: true, Verify: true,
		CCScale: 1, Clients: 1}
	if p != want {
		t.Fatalf("got  %+v\nwant %+v", p, want)
	}

	// Defaults as perftest's.
	for _, c := range []struct {
		verb    Verb
		m       Measure
		size    uint64
		iters   uint64
		tx      int
		outs    int
		trans   Transport
		extra   []string
		wantErr bool
	}{
		{Write, BW, 65536, 5000, 128, 1, RC, nil, false},
		{Read, BW, 65536, 1000, 128, 16, RC, nil, false},
		{Send, BW, 65536, 1000, 128, 1, UD, []string{"-c", "UD"}, false},
		{Send, Latency, 2, 1000, 1, 1, RC, nil, false},
		{Atomic, Latency, 8, 1000, 1, 16, RC, []string{"-s", "64"}, false},
		{Write, BW, 0, 0, 0, 0, UD, []string{"-c", "UD"}, true},
		{Read, BW, 0, 0, 0, 0, UC, []string{"--connection", "UC"}, true},
		{Write, BW, 0, 0, 0, 0, RC, []string{"-a", "-D", "3"}, true},
		{Write, BW, 0, 0, 0, 0, RC, []string{"-m", "1500"}, true},
		{Write, BW, 0, 0, 0, 0, RC, []string{"-s", "0"}, true},
		{Write, BW, 0, 0, 0, 0, RC, []string{"-s"}, true},
		{Write, BW, 0, 0, 0, 0, RC, []string{"--bogus"}, true},
		{Write, BW, 0, 0, 0, 0, RC, []string{"-a5"}, true},
		{Write, BW, 0, 0, 0, 0, RC, []string{"host1", "host2"}, true},
		{Write, BW, 0, 0, 0, 0, RC, []string{"-c", "XRC"}, true},
	} {
		p, err := ParseArgs(c.verb, c.m, c.extra)
		if c.wantErr {
			if err == nil {
				t.Errorf("%v %v %v: accepted: %+v", c.verb, c.m, c.extra, p)
			}
			continue
		}
		if err != nil || p.Size != c.size || p.Iters != c.iters || p.TxDepth != c.tx || p.OutReads != c.outs ||
			p.Transport != c.trans || p.Port != 18515 || p.Host != "" || p.GIDIndex != -1 || p.QPTimeout != 14 {
			t.Errorf("%v %v %v: %+v %v", c.verb, c.m, c.extra, p, err)
		}
	}
	if _, err := ParseArgs(Write, BW, []string{"-h"}); !errors.Is(err, ErrHelp) {
		t.Errorf("-h: %v", err)
	}
	if p, _ := ParseArgs(Write, BW, []string{"-D", "2", "-n", "10"}); p.Duration != 2*time.Second || p.TxDepth != 128 {
		t.Errorf("-D: %+v", p)
	}
}

// TestParseDCQCN checks --cc, --cc-scale, --dcqcn, --dcqcn-scale,
// --host-cc and --clients: values in both getopt spellings, defaults, and every refusal.
func TestParseDCQCN(t *testing.T) {
	p, err := ParseArgs(Write, BW, []string{"-d", "v0", "--dcqcn", "Paper", "--dcqcn-scale=400", "--clients", "2"})
	if err != nil {
		t.Fatal(err)
	}
	if p.DCQCN != "paper" || p.CC != "" || p.CCScale != 400 || p.Clients != 2 {
		t.Fatalf("got dcqcn %q cc %q scale %v clients %d, want paper, none, 400 2", p.DCQCN, p.CC, p.CCScale, p.Clients)
	}
	p, err = ParseArgs(Write, BW, []string{"-d", "v0", "--dcqcn=connectx", "--dcqcn-scale", "2.5", "10.0.0.1"})
	if err != nil || p.DCQCN != "connectx" || p.CCScale != 2.5 || p.Clients != 1 {
		t.Fatalf("got %q %v %d, %v; want connectx 2.5 1", p.DCQCN, p.CCScale, p.Clients, err)
	}
	p, err = ParseArgs(Write, BW, []string{"-d", "v0", "--cc", "Swift", "--cc-scale=400"})
	if err != nil || p.CC != "swift" || p.DCQCN != "" || p.CCScale != 400 {
		t.Fatalf("got cc %q dcqcn %q scale %v, %v; want swift, none, 400", p.CC, p.DCQCN, p.CCScale, err)
	}
	p, err = ParseArgs(Write, BW, []string{"-d", "v0", "--cc", "dcqcn", "--host-cc", "fill=1"})
	if err != nil || p.CC != "dcqcn" || p.HostCC != "fill=1" {
		t.Fatalf("got cc %q host-cc %q, %v; want dcqcn, fill=1", p.CC, p.HostCC, err)
	}
	p, err = ParseArgs(Write, BW, []string{"-d", "v0", "--cc=timely:paper"})
	if err != nil || p.CC != "timely:paper" {
		t.Fatalf("got cc %q, %v; want timely:paper", p.CC, err)
	}
	p, err = ParseArgs(Write, BW, []string{"-d", "v0"})
	if err != nil || p.DCQCN != "" || p.CC != "" || p.CCScale != 1 || p.Clients != 1 {
		t.Fatalf("defaults: got %q %q %v %d, %v; want none none 1 1", p.DCQCN, p.CC, p.CCScale, p.Clients, err)
	}
	for _, bad := range [][]string{
		{"--dcqcn", "timely"}, {"--dcqcn"}, {"--dcqcn-scale", "0.5"}, {"--dcqcn-scale=NaN"}, {"--dcqcn-scale=-3"},
		{"--dcqcn-scale", "x"}, {"--dcqcn-scale=+Inf"}, {"--clients", "0"}, {"--clients=65"}, {"--clients", "2", "10.0.0.1"},
		{"--cc", "hpcc"}, {"--cc"}, {"--cc", "swift:"}, {"--cc", "off:x"}, {"--cc-scale", "0"},
		{"--host-cc", "fill=0"}, {"--host-cc=sometimes"},
	} {
		if _, err := ParseArgs(Write, BW, append([]string{"-d", "v0"}, bad...)); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestComputeBW(t *testing.T) {
	// 200 messages of 4 KiB, each posted 1 µs after the previous and
	// completed 10 µs after being posted.
	const n = 200
	posted := make([]int64, n)
	completed := make([]int64, n)
	for i := range posted {
		posted[i] = int64(i) * 1000
		completed[i] = posted[i] + 10000
	}
	r := ComputeBW(4096, posted, completed, 100, false)
	if r.Iters != n || r.Size != 4096 {
		t.Fatalf("%+v", r)
	}
	// whole run: 200 messages in 209 µs
	wantAvg := 4096.0 * n / 209e-6 / (1 << 20)
	if math.Abs(r.AvgBW-wantAvg) > 1e-6*wantAvg || math.Abs(r.MsgRate-n/209e-6/1e6) > 1e-9 {
		t.Errorf("avg %v msgrate %v, want %v", r.AvgBW, r.MsgRate, wantAvg)
	}
	// spans start at 0 or 100 and end at 99 or 199: 0..99 and 100..199
	// take 1.09 µs per message, 0..199 takes 209/200 = 1.045 µs: the peak.
	wantPeak := 4096 / 1.045e-6 / (1 << 20)
	if math.Abs(r.PeakBW-wantPeak) > 1e-6*wantPeak {
		t.Errorf("peak %v, want %v", r.PeakBW, wantPeak)
	}
	g := ComputeBW(4096, posted, completed, 100, true)
	if math.Abs(g.AvgBW-4096*8*n/209e-6/1e9) > 1e-9 {
		t.Errorf("Gb/s %v", g.AvgBW)
	}
	if z := ComputeBW(1, nil, nil, 100, false); z.AvgBW != 0 || z.Iters != 0 {
		t.Errorf("empty %+v", z)
	}
}

func TestFormat(t *testing.T) {
	got := FormatBW(BWReport{Size: 4096, Iters: 100, PeakBW: 11.176, AvgBW: 10.21, MsgRate: 0.002614}, false)
	want := " 4096       100              11.18              10.21  \t\t     0.002614\n"
	if got != want {
		t.Errorf("BW row\n got %q\nwant %q", got, want)
	}
	got = FormatBW(BWReport{Size: 2, Iters: 100, PeakBW: 0.05, AvgBW: 0.04, MsgRate: 2.5}, true)
	if !strings.HasPrefix(got, " 2          100           0.050000") {
		t.Errorf("small Gb/s row %q", got)
	}
	var b bytes.Buffer
	WriteDest(&b, "local", Dest{QPN: 0x11, PSN: 0xf172ab, RKey: 0x2be, VAddr: 0x55cc0763f000, OutReads: 1,
		GID: [16]byte{10: 0xff, 11: 0xff, 12: 10, 13: 77, 14: 0, 15: 10}}, Read)
	wantDest := " local address: LID 0000 QPN 0x0011 PSN 0xf172ab OUT 0x01 RKey 0x0002be VAddr 0x0055cc0763f000\n" +
		" GID: 00:00:00:00:00:00:00:00:00:00:255:255:10:77:00:10\n"
	if b.String() != wantDest {
		t.Errorf("dest\n got %q\nwant %q", b.String(), wantDest)
	}
}

func TestComputeLat(t *testing.T) {
	// 1001 iterations → 1000 samples: 1..1000 µs round trips, two huge.
	d := make([]time.Duration, 1000)
	for i := range d {
		d[i] = time.Duration(i+1) * time.Microsecond
	}
	d[0], d[1] = time.Second, time.Second
	r := ComputeLat(64, d, true)
	// sorted: 3..1000 µs then two 1 s; 998 kept; halved.
	if r.Iters != 1001 || r.Min != 1.5 || r.Typical != (float64(3+499)+float64(3+498))/2/2 {
		t.Errorf("%+v", r)
	}
	if r.P99 != float64(3+989)/2 || r.Max != 500000 {
		t.Errorf("p99 %v max %v", r.P99, r.Max)
	}
	if r.Avg != float64(3+1000)/2/2 {
		t.Errorf("avg %v", r.Avg)
	}
	if z := ComputeLat(2, []time.Duration{time.Microsecond}, false); z.Avg != 0 {
		t.Errorf("too few samples %+v", z)
	}
	row := FormatLat(r)
	if !strings.HasPrefix(row, " 64      1001          1.50   ") {
		t.Errorf("lat row %q", row)
	}
	j := NewJSONResult(Info{Test: Test{Verb: Send, Measure: Latency, QPs: 1}, Device: "veth0", MTU: 3})
	j.Lat = append(j.Lat, r)
	var b bytes.Buffer
	if err := j.Write(&b); err != nil {
		t.Fatal(err)
	}
	var back map[string]any
	if err := json.Unmarshal(b.Bytes(), &back); err != nil || back["test_info"].(map[string]any)["Mtu"].(float64) != 1024 {
		t.Errorf("json %s %v", b.String(), err)
	}
}

// TestParseRecovery checks --recovery: the three modes in both getopt
// spellings, the device's by default, anything else refused.
func TestParseRecovery(t *testing.T) {
	for _, c := range []struct {
		args []string
		want ib.Recovery
	}{
		{nil, ib.RecoveryDefault},
		{[]string{"--recovery", "selective"}, ib.RecoverySelective},
		{[]string{"--recovery=adaptive"}, ib.RecoveryAdaptive},
		{[]string{"--recovery", "Timeout"}, ib.RecoveryTimeout},
	} {
		p, err := ParseArgs(Write, BW, append([]string{"-d", "v0"}, c.args...))
		if err != nil || p.Recovery != c.want {
			t.Errorf("%v: %v %v, want %v", c.args, p.Recovery, err, c.want)
		}
	}
	for _, bad := range [][]string{{"--recovery", "fast"}, {"--recovery"}, {"--recovery="}} {
		if _, err := ParseArgs(Write, BW, bad); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}

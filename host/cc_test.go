package host

import (
	"flag"
	"io"
	"testing"
	"time"

	"github.com/softrnic/softrnic/congestion"
	"github.com/softrnic/softrnic/congestion/dcqcn"
)

// ParseCC: --cc ALGORITHM[:PROFILE], and --dcqcn PROFILE as it always was
// (alone: DCQCN with that profile; off: none), the two together only when
// they agree.
func TestParseCC(t *testing.T) {
	for _, c := range []struct{ cc, dcqcn, algo, profile string }{
		{"", "", "off", ""}, {"", "off", "off", ""}, {"off", "", "off", ""}, {"off", "off", "off", ""},
		{"", "paper", "dcqcn", "paper"}, {"dcqcn", "", "dcqcn", ""}, {"dcqcn", "connectx", "dcqcn", "connectx"},
		{"dcqcn:paper", "paper", "dcqcn", "paper"}, {"swift", "", "swift", ""}, {"timely:paper", "", "timely", "paper"},
	} {
		a, p, err := ParseCC(c.cc, c.dcqcn)
		if err != nil || a != c.algo || p != c.profile {
			t.Errorf("ParseCC(%q, %q) = %q %q %v, want %q %q", c.cc, c.dcqcn, a, p, err, c.algo, c.profile)
		}
	}
	for _, c := range [][2]string{{"swift", "paper"}, {"off", "paper"}, {"dcqcn", "off"}, {"dcqcn:paper", "connectx"}, {"hpcc", ""}} {
		if _, _, err := ParseCC(c[0], c[1]); err == nil {
			t.Errorf("ParseCC(%q, %q) accepted", c[0], c[1])
		}
	}
}

// Congestion: each algorithm's default profile at its line rate, dilated;
// Swift's knobs applied (dilated too); the pacer's burst from the dilated
// line rate; errors for what cannot run.
func TestCongestion(t *testing.T) {
	us := time.Microsecond
	cc, err := Congestion(CC{Algorithm: "swift", Scale: 400})
	if err != nil {
		t.Fatal(err)
	}
	// The simulator's two-flow fabric: 40 Gb/s, hop RTT 2.2 µs, base target
	// 4.2 µs, flow scaling up to 21 µs, one hop; all × 400.
	if cc.Algorithm != "swift" || cc.Profile != "default" || cc.Swift.LineRate != 100*congestion.Mbps || cc.Hops != 1 ||
		cc.Swift.BaseTarget != 1680*us || cc.Swift.HopScale != 880*us || cc.Swift.FSRange != 8400*us || cc.PacerBurst != 25000 {
		t.Fatalf("swift at S=400: %+v", cc)
	}
	cc, err = Congestion(CC{Algorithm: "swift", Scale: 2, Swift: SwiftKnobs{BaseTarget: 25 * us, EndpointTarget: 100 * us, Hops: 3}})
	if err != nil || cc.Swift.BaseTarget != 50*us || cc.Swift.EndpointTarget != 200*us || cc.Hops != 3 || cc.Swift.HopScale != 4400*time.Nanosecond {
		t.Fatalf("swift knobs: %+v %v", cc.Swift, err)
	}
	cc, err = Congestion(CC{Algorithm: "timely", Profile: "paper", LineRate: 10 * congestion.Gbps})
	if err != nil || cc.TIMELY.LineRate != 10*congestion.Gbps || cc.TIMELY.Segment != 16<<10 || cc.PacerBurst != 64<<10 {
		t.Fatalf("timely paper at 10 Gb/s: %+v %v", cc, err)
	}
	if cc, err := Congestion(CC{}); err != nil || cc.On() || cc.PacerBurst != 0 {
		t.Fatalf("off: %+v %v", cc, err)
	}
	for _, bad := range []CC{{Algorithm: "swift", Profile: "paper"}, {Algorithm: "dcqcn", Scale: 0.5}, {Algorithm: "bbr"}} {
		if _, err := Congestion(bad); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

// The tools' flags: --dcqcn-scale is --cc-scale, and they reach
// Congestion.
func TestCCFlags(t *testing.T) {
	var f CCFlags
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	f.Register(fs)
	if err := fs.Parse([]string{"--cc", "timely", "--dcqcn-scale", "4"}); err != nil {
		t.Fatal(err)
	}
	cc, err := f.Congestion()
	if err != nil || cc.Algorithm != "timely" || cc.Profile != "artifact" || cc.Scale != 4 || cc.HostCC != (dcqcn.HostCCConfig{}) {
		t.Fatalf("%+v %v", cc, err)
	}
	f = CCFlags{}
	if err := fs.Parse([]string{"--cc", "dcqcn", "--host-cc", "rx=0.25,hold=1ms"}); err != nil {
		t.Fatal(err)
	}
	cc, err = f.Congestion()
	if err != nil || cc.HostCC != (dcqcn.HostCCConfig{RxHigh: 0.25, Hold: time.Millisecond}) {
		t.Fatalf("--host-cc: %+v %v", cc.HostCC, err)
	}
	f = CCFlags{}
	if err := fs.Parse([]string{"--cc", "dcqcn", "--host-cc", "rx=2"}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Congestion(); err == nil {
		t.Fatal("--host-cc rx=2 accepted")
	}
}

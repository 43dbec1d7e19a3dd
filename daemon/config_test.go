package daemon

import (
	"bytes"
	"errors"
	"flag"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/softrnic/softrnic/congestion/dcqcn"
	"github.com/softrnic/softrnic/ib"
)

const sampleConfig = `
# a full configuration
interface = veth0
queues = 2
umem-size = 32MiB
frame-size = 4096
rx-qps = 256
mtu = 2048            # path MTU
gid = 192.0.2.1
gid = 2001:db8::1
metrics = "127.0.0.1:9464"
port = afpacket
recovery = adaptive
control = /run/softrnic/test.sock
control-mode = 0660
control-group = root
log-level = debug
log-format = json

[dcqcn]
profile = connectx
rpg_ai_rate = 40
clamp_tgt_rate = 1
host_cc = fill=0.5,hold=1ms
`

func TestParseFullFile(t *testing.T) {
	c := DefaultConfig()
	if err := c.ParseFile("test.conf", strings.NewReader(sampleConfig)); err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	want := []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2001:db8::1")}
	if c.Interface != "veth0" || c.Queues != 2 || c.UMEMSize != 32<<20 || c.FrameSize != 4096 || c.RxQPs != 256 || c.MTU != 2048 ||
		len(c.GIDs) != 2 || c.GIDs[0] != want[0] || c.GIDs[1] != want[1] || c.Metrics != "127.0.0.1:9464" || c.Port != "afpacket" ||
		c.Recovery != ib.RecoveryAdaptive || c.Control != "/run/softrnic/test.sock" || c.ControlMode != 0o660 || c.ControlGroup != "root" ||
		c.LogLevel != "debug" || c.LogFormat != "json" || c.DCQCN.Profile != "connectx" ||
		c.DCQCN.Knobs["rpg_ai_rate"] != 40 || c.DCQCN.Knobs["clamp_tgt_rate"] != 1 || len(c.DCQCN.Knobs) != 2 ||
		c.DCQCN.HostCC != (dcqcn.HostCCConfig{FillLow: 0.5, Hold: time.Millisecond}) {
		t.Fatalf("parsed %+v", c)
	}
	cx, err := c.DCQCN.ConnectX()
	if err != nil || cx.RPGAIRate != 40 || cx.ClampTgtRate != 1 || cx.RPGTimeReset != dcqcn.DefaultConnectX().RPGTimeReset {
		t.Fatalf("ConnectX knobs %+v, %v", cx, err)
	}
}

// Every error names the key (and line) to fix.
func TestFileErrorsNameTheKey(t *testing.T) {
	for _, tc := range []struct{ file, want string }{
		{"interface = eth0\nmtu = 1500\n", "x.conf:2: mtu:"},
		{"interface = eth0\nqueus = 2\n", "x.conf:2: queus: unknown key"},
		{"log_level = info\n", `did you mean "log-level"`},
		{"rpg_ai_rate = 5\n", `did you mean "dcqcn.rpg_ai_rate"`},
		{"[dcqcn]\nrpg_gd = 12\n", "x.conf:2: dcqcn.rpg_gd:"},
		{"[dcqcn]\nrpg_ai_rate = 2.5\n", "x.conf:2: dcqcn.rpg_ai_rate:"},
		{"[dcqcn]\nprofile = fast\n", "dcqcn.profile: \"fast\" is not a DCQCN profile"},
		{"[dcqcn]\nhost_cc = fill=2\n", "dcqcn.host_cc: host congestion fill="},
		{"[nope]\n", "unknown section"},
		{"interface eth0\n", `not "key = value"`},
		{"mtu = 1024\nmtu = 2048\n", "x.conf:2: mtu: set twice (first on line 1)"},
		{"control-mode = 0666\n", "control-mode: \"0666\" must be octal owner/group bits only"},
		{"control = relative.sock\n", "control:"},
		{"umem-size = 12XB\n", "umem-size:"},
		{"rx-qps = 0\n", "rx-qps:"},
		{"rx-qps = 4097\n", "rx-qps:"},
		{"frame-size = 3000\n", "frame-size: 3000 is not a power of two"},
		{"gid = fe80::1%eth0\n", "gid:"},
		{"metrics = 9464\n", "metrics:"},
		{"control-group = no-such-group-softrnic\n", "control-group: no group"},
		{"interface = a/b\n", "interface:"},
		{"log-format = xml\n", "log-format:"},
		{"port = dpdk\n", "port:"},
		{"recovery = fast\n", "recovery: \"fast\" is not selective, adaptive or timeout"},
		{"recovery = default\n", "recovery:"},
	} {
		c := DefaultConfig()
		err := c.ParseFile("x.conf", strings.NewReader(tc.file))
		var ke *KeyError
		if err == nil || !errors.As(err, &ke) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want an error containing %q", tc.file, err, tc.want)
		}
	}
}

func TestValidateRelations(t *testing.T) {
	for _, tc := range []struct {
		mod  func(*Config)
		want string
	}{
		{func(c *Config) { c.Interface = "" }, "interface: required"},
		{func(c *Config) { c.MTU, c.FrameSize = 4096, 4096 }, "mtu: mtu 4096 plus"},
		{func(c *Config) { c.UMEMSize = 4096*256 + 1 }, "umem-size:"},
		{func(c *Config) { c.UMEMSize = 4096 * 10 }, "umem-size:"},
		{func(c *Config) { c.DCQCN.Profile, c.DCQCN.Knobs = "paper", map[string]uint32{"rpg_gd": 10} }, "dcqcn.rpg_gd: knobs apply to dcqcn.profile connectx"},
		{func(c *Config) { c.CC.Algorithm, c.DCQCN.Knobs = "swift", map[string]uint32{"rpg_gd": 10} }, "dcqcn.rpg_gd: knobs apply to cc dcqcn"},
		{func(c *Config) { c.CC.SwiftHops = 2 }, "swift keys apply to cc swift"},
	} {
		c := DefaultConfig()
		c.Interface = "eth0"
		tc.mod(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("got %v, want %q", err, tc.want)
		}
	}
	c := DefaultConfig()
	c.Interface, c.MTU, c.FrameSize, c.UMEMSize = "eth0", 4096, 8192, 8192*256
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestFlagsOverrideFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "softrnic.conf")
	if err := os.WriteFile(path, []byte(sampleConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	fs := flag.NewFlagSet("daemon", flag.ContinueOnError)
	fs.SetOutput(new(bytes.Buffer))
	f := RegisterFlags(fs)
	err := fs.Parse([]string{"--config", path, "-d", "veth9", "--mtu", "1024", "--gid", "198.51.100.7", "--dcqcn.rpg_ai_rate", "7"})
	if err != nil {
		t.Fatal(err)
	}
	c, err := f.Load()
	if err != nil {
		t.Fatal(err)
	}
	if c.Interface != "veth9" || c.MTU != 1024 || c.Queues != 2 || len(c.GIDs) != 1 ||
		c.GIDs[0] != netip.MustParseAddr("198.51.100.7") || c.DCQCN.Knobs["rpg_ai_rate"] != 7 || c.DCQCN.Profile != "connectx" {
		t.Fatalf("got %+v", c)
	}

	// A bad flag value is refused by the flag package, naming the flag.
	fs2 := flag.NewFlagSet("daemon", flag.ContinueOnError)
	fs2.SetOutput(new(bytes.Buffer))
	RegisterFlags(fs2)
	if err := fs2.Parse([]string{"--mtu", "9000"}); err == nil || !strings.Contains(err.Error(), "-mtu") {
		t.Fatalf("bad flag: %v", err)
	}

	// Without -d and without a file, the interface is missing.
	fs3 := flag.NewFlagSet("daemon", flag.ContinueOnError)
	f3 := RegisterFlags(fs3)
	if err := fs3.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if _, err := f3.Load(); err == nil || !strings.Contains(err.Error(), "interface") {
		t.Fatalf("missing interface: %v", err)
	}
}

// The example shipped in contrib/ must parse and validate.
func TestContribExample(t *testing.T) {
	fh, err := os.Open("../contrib/softrnic.conf.example")
	if err != nil {
		t.Skip("contrib example not present:", err)
	}
	defer fh.Close()
	c := DefaultConfig()
	if err := c.ParseFile("softrnic.conf.example", fh); err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestLogger(t *testing.T) {
	var buf bytes.Buffer
	c := DefaultConfig()
	c.Interface, c.LogLevel, c.LogFormat = "veth0", "warn", "json"
	l, err := NewLogger(&buf, &c)
	if err != nil {
		t.Fatal(err)
	}
	l.Info("hidden")
	l.Warn("shown", "qpn", 17)
	out := buf.String()
	if strings.Contains(out, "hidden") || !strings.Contains(out, `"msg":"shown"`) || !strings.Contains(out, `"dev":"veth0"`) || !strings.Contains(out, `"qpn":17`) {
		t.Fatalf("log output %q", out)
	}
	c.LogLevel = "loud"
	if _, err := NewLogger(&buf, &c); err == nil {
		t.Fatal("accepted a bad level")
	}
	_ = slog.LevelInfo
}

// The cc keys: the algorithm (a Swift or TIMELY profile after a colon),
// its dilation and line rate, and Swift's knobs in a [swift] section.
func TestCCKeys(t *testing.T) {
	c := DefaultConfig()
	if c.CC.Algorithm != "dcqcn" || c.CC.Scale != 1 {
		t.Fatalf("defaults %+v", c.CC)
	}
	file := "interface = eth0\ncc = swift\ncc-scale = 400\ncc-line-gbps = 10\n[swift]\nbase_target = 25us\nhop_scale = 2us\nfs_range = 1ms\nendpoint_target = 50us\nhops = 3\n"
	if err := c.ParseFile("cc.conf", strings.NewReader(file)); err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	w := CCConfig{Algorithm: "swift", Scale: 400, LineGbps: 10, SwiftBaseTarget: 25 * time.Microsecond, SwiftHopScale: 2 * time.Microsecond,
		SwiftFSRange: time.Millisecond, SwiftEndpointTarget: 50 * time.Microsecond, SwiftHops: 3}
	if c.CC != w {
		t.Fatalf("got %+v, want %+v", c.CC, w)
	}
	for _, bad := range []string{"cc = hpcc", "cc = dcqcn:paper", "cc = off:x", "cc = swift:", "cc-scale = 0.5", "cc-line-gbps = -1",
		"[swift]\nbase_target = 10", "[swift]\nhops = 65", "[timely]\nprofile = paper"} {
		c := DefaultConfig()
		if err := c.ParseFile("bad.conf", strings.NewReader(bad)); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	c = DefaultConfig()
	if err := c.ParseFile("t.conf", strings.NewReader("cc = timely:paper\n")); err != nil || c.CC.Algorithm != "timely:paper" {
		t.Fatalf("timely:paper: %+v %v", c.CC, err)
	}
}

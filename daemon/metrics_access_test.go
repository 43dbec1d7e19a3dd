package daemon

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/softrnic/softrnic/daemon/proto"
)

const testToken = "0123456789abcdef0123456789abcdef"

func testCollector() *Collector {
	var c Counters
	c.Name = "lo-test"
	c.Valid = 1 << proto.CtrTxPackets
	c.Device[proto.CtrTxPackets] = 42
	return NewCollector(func() Counters { return c })
}

// scrape GETs /metrics with the Authorization header auth (none if empty)
// and returns the status and WWW-Authenticate header.
func scrape(t *testing.T, m *MetricsServer, auth string) (int, string, string) {
	t.Helper()
	req, err := http.NewRequest("GET", "http://"+m.Addr().String()+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("WWW-Authenticate"), string(b)
}

func writeToken(t *testing.T, content string, mode os.FileMode) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "metrics.token")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
	return path
}

// Loopback needs no token: what a local Prometheus or curl scrapes.
func TestMetricsLoopbackWithoutToken(t *testing.T) {
	for _, addr := range []string{"127.0.0.1:0", "localhost:0"} {
		m, err := ServeMetrics(addr, testCollector())
		if err != nil {
			t.Fatalf("%s: %v", addr, err)
		}
		code, _, body := scrape(t, m, "")
		m.Close()
		if code != 200 || !strings.Contains(body, `softrnic_tx_packets_total{device="lo-test"} 42`) {
			t.Fatalf("%s: %d %.300s", addr, code, body)
		}
	}
	c := DefaultConfig()
	c.Interface = "eth0"
	for _, addr := range []string{"127.0.0.1:9464", "[::1]:9464", "localhost:9464", "127.7.7.7:1"} {
		c.Metrics = addr
		if err := c.Validate(); err != nil {
			t.Errorf("%s: %v", addr, err)
		}
	}
}

// A non-loopback address without access control is refused by the config,
// naming the key and the two ways out, and by ServeMetrics before it binds.
func TestMetricsPublicAddressRefused(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:9464", ":9464", "[::]:9464", "192.0.2.1:9464", "metrics.example:9464", "[::ffff:10.0.0.1]:9464"} {
		c := DefaultConfig()
		c.Interface = "eth0"
		c.Metrics = addr
		err := c.Validate()
		var ke *KeyError
		if err == nil || !errors.As(err, &ke) || ke.Key != "metrics" || !errors.Is(err, ErrMetricsPublic) ||
			!strings.Contains(err.Error(), "metrics-token-file") || !strings.Contains(err.Error(), "metrics-allow-public") {
			t.Errorf("%s: %v", addr, err)
		}
		// Either way out is accepted.
		c.MetricsTokenFile = "/etc/softrnic/metrics.token"
		if err := c.Validate(); err != nil {
			t.Errorf("%s with a token file: %v", addr, err)
		}
		c.MetricsTokenFile, c.MetricsAllowPublic = "", true
		if err := c.Validate(); err != nil {
			t.Errorf("%s allowed public: %v", addr, err)
		}
	}
	// Literal addresses are refused without binding (no listener is left).
	for _, addr := range []string{"0.0.0.0:0", ":0", "[::]:0", "192.0.2.1:0"} {
		if m, err := ServeMetrics(addr, testCollector()); err == nil || !errors.Is(err, ErrMetricsPublic) {
			if m != nil {
				m.Close()
			}
			t.Errorf("ServeMetrics(%s): %v", addr, err)
		}
	}
	// The same through a config file: the error names file, line-less key.
	c := DefaultConfig()
	if err := c.ParseFile("x.conf", strings.NewReader("interface = eth0\nmetrics = 0.0.0.0:9464\n")); err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err == nil || !strings.HasPrefix(err.Error(), `metrics: "0.0.0.0:9464": not a loopback address`) {
		t.Errorf("file: %v", err)
	}
}

// The decision on the address actually bound (for host names): loopback,
// or any address with a token or with allow-public.
func TestMetricsAccessCheck(t *testing.T) {
	pub, lo := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("::1")
	var none, tok, open metricsAccess
	WithBearerToken([]byte(testToken))(&tok)
	AllowPublic()(&open)
	if none.check(lo) != nil || none.check(netip.MustParseAddr("::ffff:127.0.0.1")) != nil || tok.check(pub) != nil || open.check(pub) != nil {
		t.Fatal("refused an allowed address")
	}
	if err := none.check(pub); !errors.Is(err, ErrMetricsPublic) {
		t.Fatalf("public without access control: %v", err)
	}
}

// With a token, every scrape must bring it (on loopback too): none, a
// wrong one, a prefix or another scheme get 401 and a Bearer challenge.
func TestMetricsBearerToken(t *testing.T) {
	c := DefaultConfig()
	c.Interface = "eth0"
	c.Metrics = "127.0.0.1:0"
	c.MetricsTokenFile = writeToken(t, testToken+"\n", 0o640)
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	opts, err := c.MetricsOptions()
	if err != nil {
		t.Fatal(err)
	}
	m, err := ServeMetrics(c.Metrics, testCollector(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for _, auth := range []string{"", "Bearer", "Bearer ", "Bearer wrong-token-wrong-token", "Bearer " + testToken[:31],
		"Bearer " + testToken + "x", "Basic " + testToken, testToken, "Bearer " + strings.ToUpper(testToken)} {
		code, challenge, body := scrape(t, m, auth)
		if code != http.StatusUnauthorized || !strings.HasPrefix(challenge, "Bearer") || strings.Contains(body, "softrnic_") {
			t.Errorf("Authorization %q: %d %q %.200s", auth, code, challenge, body)
		}
	}
	for _, auth := range []string{"Bearer " + testToken, "bearer " + testToken} {
		if code, _, body := scrape(t, m, auth); code != 200 || !strings.Contains(body, "softrnic_tx_packets_total") {
			t.Errorf("Authorization %q: %d %.200s", auth, code, body)
		}
	}
}

// The token file must hold a real secret: others may not read it, and
// it is neither empty nor short nor binary; the errors name the key.
func TestMetricsTokenFileChecked(t *testing.T) {
	for _, tc := range []struct {
		content string
		mode    os.FileMode
		want    string
	}{
		{testToken, 0o644, "accessible by others"},
		{testToken, 0o602, "accessible by others"},
		{"", 0o600, "fewer than 16"},
		{"  short\n", 0o600, "fewer than 16"},
		{"0123456789 abcdef0123", 0o600, "printable ASCII without spaces"},
		{"0123456789abcdef\x00", 0o600, "printable ASCII"},
		{strings.Repeat("a", 5000), 0o600, "not a token"},
	} {
		c := DefaultConfig()
		c.MetricsTokenFile = writeToken(t, tc.content, tc.mode)
		_, err := c.MetricsOptions()
		var ke *KeyError
		if err == nil || !errors.As(err, &ke) || ke.Key != "metrics-token-file" || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q mode %#o: %v, want %q", tc.content, tc.mode, err, tc.want)
		}
	}
	c := DefaultConfig()
	c.MetricsTokenFile = filepath.Join(t.TempDir(), "missing")
	if _, err := c.MetricsOptions(); err == nil || !strings.Contains(err.Error(), "metrics-token-file") {
		t.Errorf("missing file: %v", err)
	}
	c.MetricsTokenFile = t.TempDir()
	if _, err := c.MetricsOptions(); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("directory: %v", err)
	}
	tok, err := ReadMetricsToken(writeToken(t, "\n  "+testToken+"\r\n", 0o600))
	if err != nil || string(tok) != testToken {
		t.Fatalf("token %q, %v", tok, err)
	}
}

// The keys parse from the file, and bad values name the key.
func TestMetricsKeys(t *testing.T) {
	c := DefaultConfig()
	err := c.ParseFile("x.conf", strings.NewReader("interface = eth0\nmetrics = 0.0.0.0:9464\nmetrics-token-file = /etc/softrnic/metrics.token\nmetrics-allow-public = false\n"))
	if err != nil || c.MetricsTokenFile != "/etc/softrnic/metrics.token" || c.MetricsAllowPublic || c.Validate() != nil {
		t.Fatalf("%+v: %v / %v", c, err, c.Validate())
	}
	c = DefaultConfig()
	if err := c.ParseFile("x.conf", strings.NewReader("metrics-allow-public = yes\n")); err == nil || !strings.Contains(err.Error(), "x.conf:1: metrics-allow-public:") {
		t.Fatalf("bad bool: %v", err)
	}
	if err := c.ParseFile("x.conf", strings.NewReader("metrics_token_file = /x\n")); err == nil || !strings.Contains(err.Error(), `did you mean "metrics-token-file"`) {
		t.Fatalf("underscore key: %v", err)
	}
}

// --metrics-allow-public may stand alone, like any boolean flag, and lets
// a public metrics address validate.
func TestMetricsAllowPublicFlag(t *testing.T) {
	for _, args := range [][]string{{"--metrics-allow-public"}, {"--metrics-allow-public=true"}} {
		fs := flag.NewFlagSet("daemon", flag.ContinueOnError)
		fs.SetOutput(new(bytes.Buffer))
		f := RegisterFlags(fs)
		if err := fs.Parse(append([]string{"-d", "eth0", "--metrics", ":9464"}, args...)); err != nil {
			t.Fatal(err)
		}
		c, err := f.Load()
		if err != nil || !c.MetricsAllowPublic {
			t.Fatalf("%v: %+v, %v", args, c, err)
		}
	}
	fs := flag.NewFlagSet("daemon", flag.ContinueOnError)
	fs.SetOutput(new(bytes.Buffer))
	f := RegisterFlags(fs)
	if err := fs.Parse([]string{"-d", "eth0", "--metrics", ":9464", "--mtu", "1024"}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Load(); !errors.Is(err, ErrMetricsPublic) {
		t.Fatalf("public metrics without access control from flags: %v", err)
	}
}

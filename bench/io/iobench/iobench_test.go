package iobench

import (
	"strings"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/netnstest"
)

// TestRunSmoke runs every test through both ports briefly between two
// namespaces: each must measure something and report its mode; nothing is
// asserted about speed. Root only.
func TestRunSmoke(t *testing.T) {
	pair := netnstest.NewTestPair(t, netnstest.PairOptions{})
	for _, kind := range []string{"afxdp", "afpacket"} {
		for _, test := range []string{"tx-only", "rx-only", "rx-gen", "ping-pong"} {
			if test == "rx-gen" && kind != "afxdp" {
				continue
			}
			r := Run(pair, Config{}, kind, test, 64, 100*time.Millisecond, 200)
			if r.Error != "" {
				t.Errorf("%s %s: %s", kind, test, r.Error)
				continue
			}
			if r.Frames == 0 || r.Mode == "" || r.Port != kind || r.Test != test || r.Size != 64 {
				t.Errorf("%s %s: %+v", kind, test, r)
			}
			if test == "ping-pong" && (r.RTTP50Us <= 0 || r.RTTP99Us < r.RTTP50Us) {
				t.Errorf("%s ping-pong: %+v", kind, r)
			}
			if test != "ping-pong" && (r.FramesPerSec <= 0 || r.Gbps <= 0) {
				t.Errorf("%s %s: %+v", kind, test, r)
			}
			// Nothing is lost between a sender and the XDP sink on veth
			// unless its ring of 256 overflows, which the sink's count
			// would show; the count can never exceed what was sent.
			if test == "tx-only" && (r.Delivered == 0 || r.Delivered > r.Frames) {
				t.Errorf("%s tx-only: sink counted %d of %d frames", kind, r.Delivered, r.Frames)
			}
		}
	}
	// The generator feeds only an XDP receive path, and frames that fit
	// its page.
	if r := Run(pair, Config{}, "afpacket", "rx-gen", 64, time.Millisecond, 1); !strings.Contains(r.Error, "AF_XDP") {
		t.Errorf("rx-gen into AF_PACKET: %+v", r)
	}
	if r := Run(pair, Config{}, "afxdp", "rx-gen", 4096, time.Millisecond, 1); r.Error == "" {
		t.Errorf("rx-gen of 4096 B: %+v", r)
	}
	// The old tx-only peer: a port that does not read.
	if r := Run(pair, Config{TxPort: true}, "afxdp", "tx-only", 64, 50*time.Millisecond, 1); r.Error != "" || r.Frames == 0 || r.Delivered != 0 {
		t.Errorf("tx-only with a port as peer: %+v", r)
	}
	if r := Run(pair, Config{}, "afxdp", "no-such-test", 64, time.Millisecond, 1); r.Error == "" {
		t.Errorf("unknown test: %+v", r)
	}
	if r := Run(pair, Config{}, "no-such-port", "tx-only", 64, time.Millisecond, 1); !strings.Contains(r.Error, "unknown port") {
		t.Errorf("unknown port: %+v", r)
	}
}

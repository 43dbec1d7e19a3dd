package iobench

import (
	"strings"
	"testing"
	"time"

	"github.com/softrnic/softrnic/bpf"
	"github.com/softrnic/softrnic/internal/netnstest"
)

// TestRunSmoke runs every test through both ports briefly between two
// namespaces: each must measure something and report its mode; nothing is
// asserted about speed. Root only.
func TestRunSmoke(t *testing.T) {
	pair := netnstest.NewTestPair(t, netnstest.PairOptions{})
	for _, kind := range []string{"afxdp", "afpacket"} {
		for _, test := range []string{"tx-only", "tx-threaded", "rx-only", "rx-gen", "ping-pong"} {
			if test == "rx-gen" && kind != "afxdp" {
				continue
			}
			r := Run(pair, Config{}, kind, test, 64, 100*time.Millisecond, 200)
			if test == "rx-gen" && strings.Contains(r.Error, bpf.ErrLiveFramesRefused.Error()) {
				t.Logf("%s %s not run: %s", kind, test, r.Error)
				continue
			}
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
			if (test == "tx-only" || test == "tx-threaded") && (r.Delivered == 0 || r.Delivered > r.Frames) {
				t.Errorf("%s %s: sink counted %d of %d frames", kind, test, r.Delivered, r.Frames)
			}
			if (test == "tx-threaded") != strings.Contains(r.Mode, "threaded NAPI") {
				t.Errorf("%s %s: mode %q", kind, test, r.Mode)
			}
			// tx-threaded turns it off again for the tests after it.
			if on, err := pair.B.ThreadedNAPI(); err != nil || on {
				t.Errorf("%s %s: peer's threaded NAPI left %v (%v)", kind, test, on, err)
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

// TestThreadedNAPI: the peer's veth NAPI that tx-threaded relies on turns
// on while an XDP program gives the veth NAPI, and off again. Root only.
func TestThreadedNAPI(t *testing.T) {
	pair := netnstest.NewTestPair(t, netnstest.PairOptions{})
	var sink *bpf.Sink
	if err := pair.B.NS.Do(func() (err error) { sink, err = bpf.AttachSink(pair.B.Index); return err }); err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	for _, on := range []bool{true, false} {
		if err := pair.B.SetThreadedNAPI(on); err != nil {
			t.Fatal(err)
		}
		if got, err := pair.B.ThreadedNAPI(); err != nil || got != on {
			t.Fatalf("threaded NAPI %v after setting %v (%v)", got, on, err)
		}
	}
}

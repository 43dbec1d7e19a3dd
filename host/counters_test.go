package host

import (
	"bufio"
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/softrnic/softrnic/rnic"
)

// TestWriteCounters: each host that closes appends one JSON line to the
// counters file, which the interop lab reads back.
func TestWriteCounters(t *testing.T) {
	path := filepath.Join(t.TempDir(), "counters")
	for i := 0; i < 2; i++ {
		d, err := rnic.NewDevice(rnic.Config{Name: "v0", Addrs: []netip.Addr{netip.MustParseAddr("10.9.0.1")}})
		if err != nil {
			t.Fatal(err)
		}
		h := &Host{Iface: Interface{Name: "v0"}, Device: d, ctrFile: path}
		if err := h.writeCounters(); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := 0
	for sc := bufio.NewScanner(f); sc.Scan(); n++ {
		var c Counters
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil || c.Interface != "v0" || c.PID != os.Getpid() {
			t.Fatalf("line %d: %s (%v)", n, sc.Text(), err)
		}
	}
	if n != 2 {
		t.Fatalf("%d lines, want 2", n)
	}
}

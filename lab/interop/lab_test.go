package main

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestLabTopology builds each mode's namespace, bridge, taps and veth pair
// without booting guests, switches the interop MTU, and checks that Close
// removes everything. Root only.
func TestLabTopology(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces, taps, bridges")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("iproute2 not installed")
	}
	for _, mode := range []string{"interop", "selfcheck"} {
		t.Run(mode, func(t *testing.T) {
			l, err := newLab(options{out: t.TempDir(), softrnic: "bin/softrnic"}, mode)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(l.Close)
			links, err := exec.Command("ip", "-n", l.ns, "-o", "link", "show").CombinedOutput()
			if err != nil {
				t.Fatalf("%v: %s", err, links)
			}
			want := []string{"lb0", "lt0", "lt1"}
			if mode == "interop" {
				want = []string{"lb0", "lt0", "lv0", "lv1"}
			}
			for _, dev := range want {
				if !strings.Contains(string(links), " "+dev+":") && !strings.Contains(string(links), " "+dev+"@") {
					t.Errorf("no %s in the lab namespace:\n%s", dev, links)
				}
			}
			if mode == "interop" {
				if dst, err := os.Readlink(l.softPath + "/softrnic"); err != nil || !strings.HasSuffix(dst, "/bin/softrnic") {
					t.Errorf("host PATH's softrnic -> %q (%v), want the -softrnic binary", dst, err)
				}
				if err := l.setHostMTU(4200); err != nil {
					t.Fatal(err)
				}
				out, _ := exec.Command("ip", "-n", l.ns, "-o", "link", "show", "lv0").CombinedOutput()
				if !strings.Contains(string(out), "mtu 4200") {
					t.Errorf("lv0 MTU not switched: %s", out)
				}
				// The tap's deep queue and the drop counters the
				// retry gate reads.
				tq, _ := exec.Command("ip", "-n", l.ns, "-o", "link", "show", "lt0").CombinedOutput()
				if !strings.Contains(string(tq), fmt.Sprintf("qlen %d", tapQueueLen)) {
					t.Errorf("lt0 queue not %d: %s", tapQueueLen, tq)
				}
				if n, err := l.pathDrops(); err != nil || n != 0 {
					t.Errorf("pathDrops = %d, %v on an idle lab", n, err)
				}
				if _, err := l.linkDrops(l.hostIf, "rx"); err != nil {
					t.Errorf("lv0 drops: %v", err)
				}
				addrs, _ := exec.Command("ip", "-n", l.ns, "-o", "addr", "show", "dev", "lv0").CombinedOutput()
				for _, a := range []string{hostIP4 + "/24", hostIP6 + "/64"} {
					if !strings.Contains(string(addrs), a) {
						t.Errorf("lv0 lacks %s: %s", a, addrs)
					}
				}
			}
			l.Close()
			if out, err := exec.Command("ip", "netns", "list").CombinedOutput(); err != nil || strings.Contains(string(out), l.ns) {
				t.Errorf("namespace %s left behind (%v): %s", l.ns, err, out)
			}
		})
	}
}

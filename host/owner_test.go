package host

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/softrnic/softrnic/internal/netnstest"
)

// One owner per interface and network namespace: a second claim is
// refused with a message naming the first (and, for a tool finding the
// daemon, how to use the daemon instead); a released claim, or a claim in
// another namespace, is free.
func TestClaimInterface(t *testing.T) {
	OwnerDir = t.TempDir()
	daemon := Owner{Name: "softrnic daemon", Control: "/run/x/ctl.sock"}
	perf := Owner{Name: "softrnic perf"}
	pid := fmt.Sprintf("pid %d", os.Getpid())

	c, err := claimInterface("veth7", daemon)
	if err != nil {
		t.Fatal(err)
	}
	_, err = claimInterface("veth7", perf)
	if err == nil || !strings.Contains(err.Error(), "served by the softrnic daemon ("+pid+", control socket /run/x/ctl.sock)") ||
		!strings.Contains(err.Error(), "--daemon /run/x/ctl.sock") {
		t.Fatalf("tool beside the daemon: %v", err)
	}
	if _, err = claimInterface("veth7", daemon); err == nil || !strings.Contains(err.Error(), "already serves veth7") {
		t.Fatalf("second daemon: %v", err)
	}
	other, err := claimInterface("veth8", perf)
	if err != nil {
		t.Fatalf("another interface: %v", err)
	}
	if err := errors.Join(other.release(), c.release()); err != nil {
		t.Fatal(err)
	}

	c, err = claimInterface("veth7", perf)
	if err != nil {
		t.Fatalf("after release: %v", err)
	}
	defer func() {
		if err := c.release(); err != nil {
			t.Error(err)
		}
	}()
	if _, err = claimInterface("veth7", daemon); err == nil || !strings.Contains(err.Error(), "veth7 is in use by softrnic perf ("+pid+")") {
		t.Fatalf("daemon beside a tool: %v", err)
	}
	if os.Geteuid() == 0 {
		ns := netnstest.NewTestPair(t, netnstest.PairOptions{})
		if err := ns.A.NS.Do(func() error {
			c, err := claimInterface("veth7", daemon)
			if err == nil {
				err = c.release()
			}
			return err
		}); err != nil {
			t.Fatalf("same name in another namespace: %v", err)
		}
	}
}

package netnstest

import (
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

func TestPairPingTCPAndCleanup(t *testing.T) {
	SkipUnlessRoot(t)
	p, err := NewPair(PairOptions{})
	if err != nil {
		t.Fatal(err)
	}
	names := []string{p.A.NS.Name, p.B.NS.Name}
	func() {
		defer p.Close()
		if p.A.Index == 0 || len(p.B.MAC) != 6 {
			t.Fatalf("links not filled in: %+v %+v", p.A, p.B)
		}
		got, err := p.A.NS.Ping(p.B.Addr, 3, 5*time.Second)
		if err != nil || got != 3 {
			t.Fatalf("ping: %d/3 replies, %v", got, err)
		}
		if err := TCPCheck(p.A.NS, p.B.NS, p.B.Addr.String()); err != nil {
			t.Fatal(err)
		}
	}()
	out, err := ip("netns", "list")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if strings.Contains(out, n) {
			t.Errorf("namespace %s still exists after Close", n)
		}
	}
}

// TCPCheck is exercised here; it is also what the port tests call.
func TestTCPCheckFailsWithoutListener(t *testing.T) {
	p := NewTestPair(t, PairOptions{})
	var c net.Conn
	err := p.A.NS.Do(func() (err error) {
		c, err = net.DialTimeout("tcp", net.JoinHostPort(p.B.Addr.String(), "9"), time.Second)
		return err
	})
	if err == nil {
		if _, err := io.WriteString(c, "x"); err != nil {
			t.Fatal(err)
		}
		c.Close()
		t.Fatal("dial to a port nobody listens on succeeded")
	}
}

// TestSweep: a namespace left by a dead process is removed by the next
// process's first Create; one of a live process is not.
func TestSweep(t *testing.T) {
	SkipUnlessRoot(t)
	// pid 2^22+1 is above the kernel's pid_max limit: never alive.
	dead := fmt.Sprintf("%s%d-x-%s", nsPrefix, 1<<22+1, Unique("t"))
	live := fmt.Sprintf("%s%d-x-%s", nsPrefix, 1, Unique("t")) // init
	for _, n := range []string{dead, live} {
		if _, err := ip("netns", "add", n); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		// The sweep removed dead; live must go now.
		if _, err := ip("netns", "del", live); err != nil {
			t.Error(err)
		}
		_, _ = ip("netns", "del", dead)
	})
	sweep()
	out, err := ip("netns", "list")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, dead) {
		t.Errorf("namespace of a dead process %s not swept", dead)
	}
	if !strings.Contains(out, live) {
		t.Errorf("namespace of a live process %s swept", live)
	}
}

package netnstest

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// udpDatagrams is how many datagrams udpCount sends.
const udpDatagrams = 10000

// udpCount sends udpDatagrams datagrams from namespace from to dst:port
// and returns how many a socket in namespace to received; it reads until
// nothing more has come for a while (all delivery on this path is
// synchronous with the send, so that wait is ample).
func udpCount(t *testing.T, from, to *NS, dst netip.Addr, port int) int {
	t.Helper()
	var rc *net.UDPConn
	if err := to.Do(func() (err error) {
		rc, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(dst, uint16(port))))
		if err != nil {
			return err
		}
		// Room for every datagram: the count must not depend on how fast
		// this goroutine reads.
		raw, err := rc.SyscallConn()
		if err != nil {
			return err
		}
		var serr error
		if err := raw.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 64<<20)
		}); err != nil {
			return err
		}
		return serr
	}); err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var sc *net.UDPConn
	if err := from.Do(func() (err error) {
		sc, err = net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(dst, uint16(port))))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	msg := make([]byte, 64)
	for i := 0; i < udpDatagrams; i++ {
		if _, err := sc.Write(msg); err != nil && !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatal(err)
		}
	}
	got := 0
	buf := make([]byte, 256)
	for {
		if err := rc.SetReadDeadline(time.Now().Add(500 * time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		if _, err := rc.Read(buf); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return got
			}
			t.Fatal(err)
		}
		got++
	}
}

// TestLossyPathDropsRoCEOnly: at 10 % the bridge drops about a tenth of the
// UDP/4791 datagrams in each direction (IPv4 one way, IPv6 the other), the
// receiver gets exactly what the counters say left the bridge, and other
// UDP goes through whole; then duplication at 10 % delivers that many
// extra, and at 0 % nothing is touched.
func TestLossyPathDropsRoCEOnly(t *testing.T) {
	p := NewTestLossyPath(t, LossyOptions{Impairment: Impairment{LossPerMille: 100}})
	// Binomial(10000, 0.1): standard deviation 30 frames, so 8-12 % is
	// more than six of them either side.
	inRange := func(what string, k uint64) {
		if k < udpDatagrams*8/100 || k > udpDatagrams*12/100 {
			t.Errorf("%s: %d of %d, want about 10 %%", what, k, udpDatagrams)
		}
	}
	dirs := []struct {
		name     string
		from, to *NS
		dst      netip.Addr
		counters func(PathCounters) DirCounters
	}{
		{"A→B IPv4", p.A.NS, p.B.NS, p.B.Addr, func(c PathCounters) DirCounters { return c.AtoB }},
		{"B→A IPv6", p.B.NS, p.A.NS, p.A.Addr6, func(c PathCounters) DirCounters { return c.BtoA }},
	}
	for _, d := range dirs {
		got := udpCount(t, d.from, d.to, d.dst, RoCEv2Port)
		c, err := p.Counters()
		if err != nil {
			t.Fatal(err)
		}
		dc := d.counters(c)
		if dc.Frames != udpDatagrams {
			t.Errorf("%s: bridge saw %d RoCEv2 frames, sent %d", d.name, dc.Frames, udpDatagrams)
		}
		inRange(d.name+" dropped by the bridge", dc.Dropped)
		inRange(d.name+" lost end to end", uint64(udpDatagrams-got))
		if uint64(got) != dc.Delivered() {
			t.Errorf("%s: received %d, the bridge delivered %d", d.name, got, dc.Delivered())
		}
		if other := udpCount(t, d.from, d.to, d.dst, RoCEv2Port+1); other != udpDatagrams {
			t.Errorf("%s: UDP to port %d: %d of %d arrived, want all", d.name, RoCEv2Port+1, other, udpDatagrams)
		}
	}
	if c, _ := p.Counters(); c.AtoB.Frames != udpDatagrams || c.BtoA.Frames != udpDatagrams {
		t.Errorf("counters count other traffic than RoCEv2: %+v", c)
	}

	if err := p.Set(Impairment{DupPerMille: 100}); err != nil {
		t.Fatal(err)
	}
	got := udpCount(t, p.A.NS, p.B.NS, p.B.Addr, RoCEv2Port)
	c, err := p.Counters()
	if err != nil {
		t.Fatal(err)
	}
	inRange("duplicated", c.AtoB.Duplicated)
	if c.AtoB.Dropped != 0 || uint64(got) != udpDatagrams+c.AtoB.Duplicated {
		t.Errorf("duplication: received %d of %d sent, counters %+v", got, udpDatagrams, c.AtoB)
	}

	if err := p.Set(Impairment{}); err != nil {
		t.Fatal(err)
	}
	if got := udpCount(t, p.B.NS, p.A.NS, p.A.Addr, RoCEv2Port); got != udpDatagrams {
		t.Errorf("no impairment: %d of %d arrived", got, udpDatagrams)
	}
}

// TestLossyPathCleanup: the MTU is applied, Close removes all three
// namespaces, and a bad impairment is refused before anything is made.
func TestLossyPathCleanup(t *testing.T) {
	SkipUnlessRoot(t)
	if _, err := NewLossyPath(LossyOptions{Impairment: Impairment{LossPerMille: 1001}}); err == nil {
		t.Fatal("loss of 1001 per mille accepted")
	}
	p := NewTestLossyPath(t, LossyOptions{MTU: 4200})
	for _, l := range []Link{p.A, p.B} {
		out, err := l.NS.IP("link", "show", l.Name)
		if err != nil || !strings.Contains(out, "mtu 4200") {
			t.Errorf("%s: %v %s", l.Name, err, out)
		}
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if live, err := Live(); err != nil || len(live) != 0 {
		t.Errorf("namespaces left after Close: %v %v", live, err)
	}
}

package route

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/netnstest"
)

func resolverIn(t *testing.T, ns *netnstest.NS) *Resolver {
	t.Helper()
	var r *Resolver
	if err := ns.Do(func() (err error) {
		r, err = New()
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func resolve(t *testing.T, r *Resolver, peer netip.Addr) Next {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := r.Resolve(ctx, peer)
	if err != nil {
		t.Fatalf("Resolve(%v): %v", peer, err)
	}
	return n
}

// TestOnLink: a peer on the same subnet is reached directly; the missing
// neighbour entry is resolved by the kernel when asked (IPv4 and IPv6).
func TestOnLink(t *testing.T) {
	p := netnstest.NewTestPair(t, netnstest.PairOptions{})
	r := resolverIn(t, p.A.NS)
	for _, c := range []struct{ peer, src netip.Addr }{{p.B.Addr, p.A.Addr}, {p.B.Addr6, p.A.Addr6}} {
		// Nothing has been sent yet: the first Lookup cannot know the MAC.
		if _, err := r.Lookup(c.peer); !errors.Is(err, ErrUnresolved) {
			t.Errorf("first Lookup(%v): %v, want ErrUnresolved", c.peer, err)
		}
		n := resolve(t, r, c.peer)
		if n.IfIndex != p.A.Index || n.Src != c.src || n.Gateway.IsValid() ||
			!bytes.Equal(n.DstMAC, p.B.MAC) || !bytes.Equal(n.SrcMAC, p.A.MAC) || n.MTU != 1500 {
			t.Errorf("Resolve(%v) = %+v; want if %d src %v dst MAC %v", c.peer, n, p.A.Index, c.src, p.B.MAC)
		}
	}
}

// TestRouted: a peer behind a router is reached through the gateway's MAC,
// from the address facing the router.
func TestRouted(t *testing.T) {
	rt := netnstest.NewTestRouted(t, 7)
	r := resolverIn(t, rt.Client.NS)
	for _, c := range []struct{ peer, src, gw netip.Addr }{
		{rt.Server.Addr, rt.Client.Addr, rt.ClientGW.Addr},
		{rt.Server.Addr6, rt.Client.Addr6, rt.ClientGW.Addr6},
	} {
		n := resolve(t, r, c.peer)
		if n.Gateway != c.gw || n.Src != c.src || !bytes.Equal(n.DstMAC, rt.ClientGW.MAC) || n.IfIndex != rt.Client.Index {
			t.Errorf("Resolve(%v) = %+v; want gateway %v (MAC %v), src %v", c.peer, n, c.gw, rt.ClientGW.MAC, c.src)
		}
		if n.NextHop() != c.gw {
			t.Errorf("NextHop %v, want %v", n.NextHop(), c.gw)
		}
	}
	// The route really works end to end.
	if got, err := rt.Client.NS.Ping(rt.Server.Addr, 2, 5*time.Second); err != nil || got != 2 {
		t.Errorf("ping through the router: %d/2, %v", got, err)
	}
}

func TestErrors(t *testing.T) {
	p := netnstest.NewTestPair(t, netnstest.PairOptions{})
	r := resolverIn(t, p.A.NS)
	// No default route in the namespace.
	if _, err := r.Lookup(netip.MustParseAddr("192.0.2.1")); !errors.Is(err, ErrNoRoute) {
		t.Errorf("off-subnet peer without a route: %v, want ErrNoRoute", err)
	}
	if _, err := r.Lookup(p.A.Addr); err == nil {
		t.Error("own address accepted as a peer")
	}
	// On-link but nobody answers: bounded by the context.
	ghost := netip.AddrFrom4([4]byte{p.B.Addr.As4()[0], p.B.Addr.As4()[1], p.B.Addr.As4()[2], 77})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := r.Resolve(ctx, ghost); !errors.Is(err, ErrUnresolved) {
		t.Errorf("absent peer: %v, want ErrUnresolved", err)
	}
}

// TestWatch: when the next hop's MAC changes the change is reported with
// the new answer.
func TestWatch(t *testing.T) {
	p := netnstest.NewTestPair(t, netnstest.PairOptions{})
	r := resolverIn(t, p.A.NS)
	first := resolve(t, r, p.B.Addr)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan Next, 16)
	werr := make(chan error, 1)
	go func() {
		werr <- r.Watch(ctx, func(n Next, err error) {
			if err == nil {
				got <- n
			}
		})
	}()
	time.Sleep(50 * time.Millisecond) // let the subscriptions start
	newMAC := net.HardwareAddr{0x02, 0x5e, 0, 0, 0, 0x42}
	if _, err := p.A.NS.IP("neigh", "replace", p.B.Addr.String(), "lladdr", newMAC.String(), "dev", p.A.Name, "nud", "permanent"); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-got:
		if !bytes.Equal(n.DstMAC, newMAC) || n.Peer != first.Peer {
			t.Errorf("change reported as %+v, want MAC %v", n, newMAC)
		}
	case err := <-werr:
		t.Fatalf("Watch ended: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("no change reported within 5s")
	}
	cancel()
	if err := <-werr; err != nil {
		t.Errorf("Watch: %v", err)
	}
}

// TestVLAN: a peer reached through an 802.1Q device is sent on the parent
// with the VLAN ID.
func TestVLAN(t *testing.T) {
	p := netnstest.NewTestPair(t, netnstest.PairOptions{})
	for i, l := range []*netnstest.Link{&p.A, &p.B} {
		cmds := [][]string{
			{"link", "add", "link", l.Name, "name", "vl100", "type", "vlan", "id", "100"},
			{"addr", "add", "10.96.1." + string(rune('1'+i)) + "/24", "dev", "vl100"},
			{"link", "set", "vl100", "up"},
		}
		for _, c := range cmds {
			if out, err := l.NS.IP(c...); err != nil {
				if strings.Contains(out+err.Error(), "Unknown device type") {
					t.Skip("this kernel has no 802.1Q VLAN support (CONFIG_VLAN_8021Q)")
				}
				t.Fatal(err)
			}
		}
	}
	r := resolverIn(t, p.A.NS)
	n := resolve(t, r, netip.MustParseAddr("10.96.1.2"))
	if n.VLAN != 100 || n.PortIfIndex != p.A.Index || n.IfName != "vl100" || !bytes.Equal(n.DstMAC, p.B.MAC) ||
		n.Src != netip.MustParseAddr("10.96.1.1") {
		t.Errorf("Resolve through VLAN = %+v; want VLAN 100 on ifindex %d to %v", n, p.A.Index, p.B.MAC)
	}
	// Untagged peers on the same parent stay untagged.
	if n := resolve(t, r, p.B.Addr); n.VLAN != 0 || n.PortIfIndex != p.A.Index {
		t.Errorf("untagged peer: %+v", n)
	}
}

// TestLinkLocal: an IPv6 link-local peer (a common RoCE GID) resolves with
// its zone and is refused without one.
func TestLinkLocal(t *testing.T) {
	p := netnstest.NewTestPair(t, netnstest.PairOptions{})
	// The kernel adds the link-local address shortly after the link comes
	// up: look for it, bounded.
	var ll netip.Addr
	for try := 0; try < 100 && !ll.IsValid(); try++ {
		if err := p.B.NS.Do(func() error {
			ifc, err := net.InterfaceByName(p.B.Name)
			if err != nil {
				return err
			}
			addrs, err := ifc.Addrs()
			if err != nil {
				return err
			}
			for _, a := range addrs {
				if pfx, err := netip.ParsePrefix(a.String()); err == nil && pfx.Addr().IsLinkLocalUnicast() {
					ll = pfx.Addr()
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if !ll.IsValid() {
			time.Sleep(20 * time.Millisecond)
		}
	}
	if !ll.IsValid() {
		t.Fatalf("no link-local address on %s", p.B.Name)
	}
	r := resolverIn(t, p.A.NS)
	if _, err := r.Lookup(ll); err == nil {
		t.Error("link-local peer without a zone accepted")
	}
	n := resolve(t, r, ll.WithZone(p.A.Name))
	if n.IfIndex != p.A.Index || !bytes.Equal(n.DstMAC, p.B.MAC) || !n.Src.IsLinkLocalUnicast() {
		t.Errorf("Resolve(%v%%%s) = %+v", ll, p.A.Name, n)
	}
}

// noLinkLocal sets addrgenmode none on l and removes its link-local
// addresses and IPv6 neighbours, as on the lab's veth and tap: the kernel
// then cannot send a neighbour solicitation on its own.
func noLinkLocal(t *testing.T, l *netnstest.Link) {
	t.Helper()
	for _, c := range [][]string{
		{"link", "set", "dev", l.Name, "addrgenmode", "none"},
		{"-6", "addr", "flush", "dev", l.Name, "scope", "link"},
		{"-6", "neigh", "flush", "dev", l.Name},
	} {
		if out, err := l.NS.IP(c...); err != nil {
			t.Fatalf("ip %v: %v %s", c, err, out)
		}
	}
	if err := l.NS.Do(func() error {
		ifc, err := net.InterfaceByName(l.Name)
		if err != nil {
			return err
		}
		addrs, err := ifc.Addrs()
		if err != nil {
			return err
		}
		for _, a := range addrs {
			if pfx, err := netip.ParsePrefix(a.String()); err == nil && pfx.Addr().IsLinkLocalUnicast() {
				t.Fatalf("%s still has link-local %v", l.Name, pfx)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestIPv6WithoutLinkLocal: on a link with addrgenmode none at both ends,
// asking the kernel (NTF_USE) never resolves an IPv6 peer; Resolve's probe,
// a datagram to the peer's port 9 from the route's source address, sent in
// the Resolver's namespace, does. The probe is sent only while the entry is
// missing or failed, never for IPv4.
func TestIPv6WithoutLinkLocal(t *testing.T) {
	p := netnstest.NewTestPair(t, netnstest.PairOptions{})
	noLinkLocal(t, &p.A)
	noLinkLocal(t, &p.B)
	r := resolverIn(t, p.A.NS)

	// The datagram must reach the peer from our routable address.
	var sink *net.UDPConn
	if err := p.B.NS.Do(func() (err error) {
		sink, err = net.ListenUDP("udp6", &net.UDPAddr{IP: net.IPv6unspecified, Port: 9})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sink.Close() })

	// Control: the kernel's own attempt goes nowhere. Its first
	// solicitation is immediate and the next 1 s later; look for longer
	// than that (bounded), then remove the incomplete entry.
	for try := 0; try < 15; try++ {
		if n, err := r.Lookup(p.B.Addr6); err == nil {
			t.Fatalf("resolved %v without a probe (%v): the kernel solicits without a link-local address now", p.B.Addr6, n.DstMAC)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := p.A.NS.IP("-6", "neigh", "del", p.B.Addr6.String(), "dev", p.A.Name); err != nil {
		t.Fatal(err)
	}
	if r.probes.Load() != 0 {
		t.Fatalf("Lookup probed (%d)", r.probes.Load())
	}

	n := resolve(t, r, p.B.Addr6)
	if n.IfIndex != p.A.Index || n.Src != p.A.Addr6 || !bytes.Equal(n.DstMAC, p.B.MAC) {
		t.Errorf("Resolve(%v) = %+v; want src %v, dst MAC %v", p.B.Addr6, n, p.A.Addr6, p.B.MAC)
	}
	if k := r.probes.Load(); k < 1 || k > maxProbes {
		t.Fatalf("%d probes, want 1..%d", k, maxProbes)
	}
	if err := sink.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	k, from, err := sink.ReadFromUDPAddrPort(buf)
	if err != nil {
		t.Fatalf("no probe at the peer: %v", err)
	}
	if from.Addr().Unmap() != p.A.Addr6 || k != 1 || buf[0] != 0 {
		t.Errorf("probe from %v, % x; want one zero byte from %v", from, buf[:k], p.A.Addr6)
	}

	// Resolved: no more probes, and none for IPv4.
	before := r.probes.Load()
	if n := resolve(t, r, p.B.Addr6); !bytes.Equal(n.DstMAC, p.B.MAC) {
		t.Errorf("second Resolve: %+v", n)
	}
	if n := resolve(t, r, p.B.Addr); !bytes.Equal(n.DstMAC, p.B.MAC) {
		t.Errorf("IPv4 Resolve: %+v", n)
	}
	if got := r.probes.Load(); got != before {
		t.Errorf("%d probes after the neighbour was resolved (IPv4 or IPv6), want %d", got, before)
	}
}

package route

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/netip"
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

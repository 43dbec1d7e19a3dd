package netnstest

import (
	"fmt"
	"net"
	"net/netip"
	"testing"
)

// Connect joins a and b with a new veth pair and gives the ends the addresses
// pa and pb (any number of IPv4 or IPv6 prefixes, possibly none), MTU mtu (0:
// default), both up. The ends disappear with their namespaces.
func Connect(a, b *NS, pa, pb []netip.Prefix, mtu int) (la, lb Link, err error) {
	la = Link{NS: a, Name: Unique("va")}
	lb = Link{NS: b, Name: Unique("vb")}
	if _, err := ip("link", "add", la.Name, "netns", a.Name, "type", "veth", "peer", "name", lb.Name, "netns", b.Name); err != nil {
		return la, lb, err
	}
	for _, e := range []struct {
		l  *Link
		ps []netip.Prefix
	}{{&la, pa}, {&lb, pb}} {
		l := e.l
		if mtu != 0 {
			if _, err := l.NS.IP("link", "set", l.Name, "mtu", fmt.Sprint(mtu)); err != nil {
				return la, lb, err
			}
		}
		for _, p := range e.ps {
			args := []string{"addr", "add", p.String(), "dev", l.Name}
			if p.Addr().Is6() {
				args = append(args, "nodad")
				if !l.Addr6.IsValid() {
					l.Addr6 = p.Addr()
				}
			} else if !l.Addr.IsValid() {
				l.Addr, l.Netmask = p.Addr(), p.Bits()
			}
			if _, err := l.NS.IP(args...); err != nil {
				return la, lb, err
			}
		}
		if _, err := l.NS.IP("link", "set", l.Name, "up"); err != nil {
			return la, lb, err
		}
		if err := l.NS.Do(func() error {
			ifc, err := net.InterfaceByName(l.Name)
			if err != nil {
				return err
			}
			l.Index, l.MAC = ifc.Index, ifc.HardwareAddr
			return nil
		}); err != nil {
			return la, lb, err
		}
	}
	return la, lb, nil
}

// Routed is a client and a server namespace with a router namespace between
// them: Client.Addr reaches Server.Addr only through the router, whose
// addresses on the two links are ClientGW and ServerGW.
type Routed struct {
	Client, Server     Link // the end hosts' interfaces
	ClientGW, ServerGW Link // the router's interfaces facing them
	Router             *NS
}

// NewTestRouted builds the three namespaces for a test (skipping when not
// root) and removes them in a Cleanup.
func NewTestRouted(tb testing.TB, sub int) *Routed {
	tb.Helper()
	c, s, r := NewTestNS(tb), NewTestNS(tb), NewTestNS(tb)
	pf := func(f string) []netip.Prefix {
		return []netip.Prefix{netip.MustParsePrefix(fmt.Sprintf(f, sub))}
	}
	var rt Routed
	var err error
	rt.Router = r
	if rt.Client, rt.ClientGW, err = Connect(c, r, append(pf("10.98.%d.2/24"), pf("fd00:98:%x::2/64")...), append(pf("10.98.%d.1/24"), pf("fd00:98:%x::1/64")...), 0); err != nil {
		tb.Fatal(err)
	}
	if rt.Server, rt.ServerGW, err = Connect(s, r, append(pf("10.97.%d.2/24"), pf("fd00:97:%x::2/64")...), append(pf("10.97.%d.1/24"), pf("fd00:97:%x::1/64")...), 0); err != nil {
		tb.Fatal(err)
	}
	for _, k := range []string{"net.ipv4.ip_forward", "net.ipv6.conf.all.forwarding"} {
		if err := r.Sysctl(k, "1"); err != nil {
			tb.Fatal(err)
		}
	}
	steps := []struct {
		ns   *NS
		args []string
	}{
		{c, []string{"route", "add", "default", "via", rt.ClientGW.Addr.String()}},
		{c, []string{"-6", "route", "add", "default", "via", rt.ClientGW.Addr6.String()}},
		{s, []string{"route", "add", "default", "via", rt.ServerGW.Addr.String()}},
		{s, []string{"-6", "route", "add", "default", "via", rt.ServerGW.Addr6.String()}},
	}
	for _, st := range steps {
		if _, err := st.ns.IP(st.args...); err != nil {
			tb.Fatal(err)
		}
	}
	return &rt
}

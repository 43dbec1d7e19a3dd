package host

import (
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/softrnic/softrnic/internal/route"
	"github.com/softrnic/softrnic/port"
	"github.com/softrnic/softrnic/port/afpacket"
	"github.com/softrnic/softrnic/port/afxdp"
)

// Interface is a network interface as a RoCE device sees it: where frames
// go, and which GIDs (its IP addresses) the device answers to.
type Interface struct {
	Name  string
	Index int
	MAC   [6]byte
	MTU   int // the netdev MTU
	// GIDs is the GID table: the IPv4 addresses first (IPv4-mapped GIDs,
	// shown here unmapped), then the routable IPv6 addresses, then the
	// IPv6 link-local ones, which RoCEv2 cannot route and perftest never
	// picks by itself. perftest's -x indexes it: with one address of each
	// family, 0 is IPv4 and 1 is IPv6 (rxe puts link-local first instead,
	// so the same -x means different addresses on the two ends).
	GIDs []netip.Addr
}

// LookupInterface reads an interface's MAC, MTU and addresses in the
// calling thread's network namespace.
func LookupInterface(name string) (Interface, error) {
	ifi, err := net.InterfaceByName(name)
	if err != nil {
		if strings.Contains(err.Error(), "no such network interface") {
			return Interface{}, fmt.Errorf("interface %s not found", name)
		}
		return Interface{}, fmt.Errorf("interface %s: %w", name, err)
	}
	in := Interface{Name: ifi.Name, Index: ifi.Index, MTU: ifi.MTU}
	if len(ifi.HardwareAddr) != 6 {
		return in, fmt.Errorf("interface %s is not an Ethernet interface", name)
	}
	copy(in.MAC[:], ifi.HardwareAddr)
	addrs, err := ifi.Addrs()
	if err != nil {
		return in, err
	}
	var ll, v4, v6 []netip.Addr
	for _, a := range addrs {
		pfx, err := netip.ParsePrefix(a.String())
		if err != nil {
			continue
		}
		ip := pfx.Addr().Unmap()
		switch {
		case ip.Is4():
			v4 = append(v4, ip)
		case ip.IsLinkLocalUnicast():
			ll = append(ll, ip.WithZone(""))
		default:
			v6 = append(v6, ip)
		}
	}
	in.GIDs = append(append(append(in.GIDs, v4...), v6...), ll...)
	if len(in.GIDs) == 0 {
		return in, fmt.Errorf("interface %s has no IP address, hence no GID", name)
	}
	return in, nil
}

// GID returns GID index i, or with i < 0 the one perftest would pick: the
// first IPv4-mapped GID, else the first routable IPv6 one.
func (in Interface) GID(i int) (netip.Addr, error) {
	if i >= 0 {
		if i >= len(in.GIDs) {
			return netip.Addr{}, fmt.Errorf("host: %s has %d GIDs, no index %d", in.Name, len(in.GIDs), i)
		}
		return in.GIDs[i], nil
	}
	for _, g := range in.GIDs {
		if g.Is4() {
			return g, nil
		}
	}
	for _, g := range in.GIDs {
		if !g.IsLinkLocalUnicast() {
			return g, nil
		}
	}
	return in.GIDs[0], nil
}

// maxRoCEOverhead is what rxe subtracts from the netdev MTU to get the
// largest RoCE path MTU (RXE_MAX_HDR_LENGTH): 1500 gives 1024, 4200 gives
// 4096, the same as a kernel peer on the same link.
const maxRoCEOverhead = 80

// ActiveMTU returns the largest IB path MTU in bytes (256…4096) that fits
// the interface, 0 if none does.
func (in Interface) ActiveMTU() int {
	for m := 4096; m >= 256; m /= 2 {
		if m <= in.MTU-maxRoCEOverhead {
			return m
		}
	}
	return 0
}

// PortKind chooses a port implementation.
type PortKind string

const (
	AFXDP    PortKind = "afxdp"
	AFPacket PortKind = "afpacket"
	// Auto tries AF_XDP and falls back to AF_PACKET.
	Auto PortKind = "auto"
)

// OpenPort opens a port of the given kind on the interface, in the calling
// thread's network namespace: an AF_XDP port serves receive queue 0 only
// (Open serves them all), its steering program restricted to the
// interface's GIDs.
func OpenPort(in Interface, kind PortKind) (port.Port, error) {
	p, _, err := openPort(&Config{Port: kind, Queues: 1}, in)
	return p, err
}

// openXDP opens an AF_XDP port on receive queues 0..queues-1 (0: all of
// the interface's), one socket each, all fed to the one engine goroutine
// that owns the port (afxdp.Multi): a NIC's RSS spreads RoCEv2 over its
// queues by UDP source port, and a queue without a socket would leave its
// share to the kernel. Each QP transmits on the queue of its UDP source
// port.
//
// Each branch returns an untyped nil on error: returning the
// constructors' (*T, error) directly would give the caller a non-nil
// port.Port holding a nil pointer.
func openXDP(c afxdp.Config, queues int) (port.Port, error) {
	if queues == 1 {
		p, err := afxdp.Open(c)
		if err != nil {
			return nil, err
		}
		return p, nil
	}
	m, err := afxdp.OpenMulti(afxdp.MultiConfig{Config: c, Queues: queues, SpreadTx: true})
	if err != nil {
		return nil, err
	}
	return m, nil
}

// openPacket opens an AF_PACKET port, which sees every queue anyway.
func openPacket(in Interface) (port.Port, error) {
	p, err := afpacket.Open(afpacket.Config{IfIndex: in.Index})
	if err != nil {
		return nil, err
	}
	return p, nil
}

// InterfaceToward names the interface the kernel routes peer through: a
// client tool's default when no interface is given.
func InterfaceToward(peer netip.Addr) (string, error) {
	res, err := route.New()
	if err != nil {
		return "", err
	}
	defer res.Close()
	n, err := res.Lookup(peer)
	if n.IfName == "" {
		return "", fmt.Errorf("no interface routes to %v (%w)", peer, err)
	}
	return n.IfName, nil
}

// InterfaceHolding names the interface that has addr: a server tool's
// default when it is given the address to serve on.
func InterfaceHolding(addr netip.Addr) (string, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return "", err
	}
	for _, ifi := range ifs {
		addrs, _ := ifi.Addrs()
		for _, a := range addrs {
			if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Unmap() == addr.Unmap() {
				return ifi.Name, nil
			}
		}
	}
	return "", fmt.Errorf("no interface has %v", addr)
}

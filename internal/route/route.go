package route

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Next is how to reach a peer.
type Next struct {
	Peer    netip.Addr
	IfIndex int
	IfName  string
	MTU     int
	Src     netip.Addr       // source address the kernel would use
	SrcMAC  net.HardwareAddr // the egress interface's MAC
	Gateway netip.Addr       // next-hop router; invalid when the peer is on-link
	DstMAC  net.HardwareAddr // the next hop's MAC (peer or gateway)

	// When the egress interface is an 802.1Q VLAN device, frames go out
	// on its parent (the interface the port is opened on) tagged with VLAN.
	// Otherwise VLAN is 0 and PortIfIndex equals IfIndex.
	VLAN        int
	PortIfIndex int
}

// NextHop is the address whose MAC DstMAC is: the gateway or the peer.
func (n Next) NextHop() netip.Addr {
	if n.Gateway.IsValid() {
		return n.Gateway
	}
	return n.Peer
}

// Equal reports whether two answers would produce the same frames.
func (n Next) Equal(o Next) bool {
	return n.Peer == o.Peer && n.IfIndex == o.IfIndex && n.Src == o.Src && n.Gateway == o.Gateway &&
		n.MTU == o.MTU && n.VLAN == o.VLAN && n.PortIfIndex == o.PortIfIndex &&
		bytes.Equal(n.SrcMAC, o.SrcMAC) && bytes.Equal(n.DstMAC, o.DstMAC)
}

var (
	// ErrNoRoute: the routing table has no usable route to the peer.
	ErrNoRoute = errors.New("route: no route to peer")
	// ErrUnresolved: the next hop's MAC is not (yet) known; resolution has
	// been asked of the kernel.
	ErrUnresolved = errors.New("route: next hop not resolved")
)

// Resolver looks up peers in one network namespace.
type Resolver struct {
	ns netns.NsHandle
	h  *netlink.Handle

	mu    sync.Mutex
	known map[netip.Addr]Next // peers looked up, for Watch

	probes atomic.Uint64 // datagrams sent by probe, for tests
}

// New makes a Resolver for the calling thread's network namespace.
func New() (*Resolver, error) {
	ns, err := netns.Get()
	if err != nil {
		return nil, fmt.Errorf("route: current namespace: %w", err)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		ns.Close()
		return nil, fmt.Errorf("route: netlink: %w", err)
	}
	return &Resolver{ns: ns, h: h, known: map[netip.Addr]Next{}}, nil
}

// Close releases the netlink handle.
func (r *Resolver) Close() error {
	r.h.Close()
	return r.ns.Close()
}

// usable neighbour states: the kernel itself would send to these.
const usable = netlink.NUD_REACHABLE | netlink.NUD_STALE | netlink.NUD_DELAY | netlink.NUD_PROBE |
	netlink.NUD_PERMANENT | netlink.NUD_NOARP

// Lookup answers at once from the kernel's tables. If the next hop's MAC is
// not known it asks the kernel to resolve it and returns ErrUnresolved (with
// the rest of Next filled in); a stale entry is returned and revalidated.
//
// An IPv6 link-local peer (RoCE GIDs are often fe80::) needs its zone, the
// interface name, as in fe80::1%eth0: the address alone names no link.
func (r *Resolver) Lookup(peer netip.Addr) (Next, error) {
	n, _, err := r.lookup(peer)
	if errors.Is(err, ErrUnresolved) {
		r.solicit(n.IfIndex, n.NextHop().WithZone(""))
	}
	return n, err
}

// lookup is Lookup without the request to resolve a missing neighbour; it
// also returns the state of the next hop's neighbour entry when that is not
// usable (0: there is none, or it is NUD_NONE), for Resolve to decide
// whether to probe.
func (r *Resolver) lookup(peer netip.Addr) (Next, int, error) {
	n, err := r.route(peer)
	if err != nil {
		return n, 0, err
	}
	hop := n.NextHop().WithZone("")
	family := unix.AF_INET
	if hop.Is6() {
		family = unix.AF_INET6
	}
	neighs, err := r.h.NeighList(n.IfIndex, family)
	if err != nil {
		return n, 0, fmt.Errorf("route: neighbours of %s: %w", n.IfName, err)
	}
	state := 0
	for _, ne := range neighs {
		ip, ok := netip.AddrFromSlice(ne.IP)
		if !ok || ip.Unmap() != hop {
			continue
		}
		if ne.State&usable != 0 && len(ne.HardwareAddr) == 6 {
			n.DstMAC = append(net.HardwareAddr(nil), ne.HardwareAddr...)
			if ne.State&netlink.NUD_STALE != 0 {
				r.solicit(n.IfIndex, hop) // revalidate, as sending would
			}
			r.remember(n)
			return n, ne.State, nil
		}
		state = ne.State
		break
	}
	r.remember(n)
	return n, state, fmt.Errorf("%w: %v via %s", ErrUnresolved, hop, n.IfName)
}

// route fills in everything of Next but DstMAC from the routing table and
// the egress link.
func (r *Resolver) route(peer netip.Addr) (Next, error) {
	peer = peer.Unmap()
	var opts *netlink.RouteGetOptions
	if peer.Is6() && peer.IsLinkLocalUnicast() {
		if peer.Zone() == "" {
			return Next{Peer: peer}, fmt.Errorf("route: link-local %v needs a zone (fe80::x%%ifname)", peer)
		}
		opts = &netlink.RouteGetOptions{Oif: peer.Zone()}
	}
	routes, err := r.h.RouteGetWithOptions(peer.WithZone("").AsSlice(), opts)
	if err != nil {
		return Next{Peer: peer}, fmt.Errorf("%w %v: %w", ErrNoRoute, peer, err)
	}
	if len(routes) == 0 || routes[0].LinkIndex == 0 {
		return Next{Peer: peer}, fmt.Errorf("%w %v", ErrNoRoute, peer)
	}
	rt := routes[0]
	if rt.Type == unix.RTN_LOCAL {
		return Next{Peer: peer}, fmt.Errorf("route: %v is a local address", peer)
	}
	link, err := r.h.LinkByIndex(rt.LinkIndex)
	if err != nil {
		return Next{Peer: peer}, fmt.Errorf("route: link %d: %w", rt.LinkIndex, err)
	}
	a := link.Attrs()
	n := Next{Peer: peer, IfIndex: a.Index, IfName: a.Name, MTU: a.MTU, SrcMAC: a.HardwareAddr, PortIfIndex: a.Index}
	if v, ok := link.(*netlink.Vlan); ok && a.ParentIndex != 0 {
		n.VLAN, n.PortIfIndex = v.VlanId, a.ParentIndex
	}
	if src, ok := netip.AddrFromSlice(rt.Src); ok {
		n.Src = src.Unmap()
	}
	if gw, ok := netip.AddrFromSlice(rt.Gw); ok && !gw.IsUnspecified() {
		n.Gateway = gw.Unmap()
	}
	if rt.MTU != 0 && rt.MTU < n.MTU {
		n.MTU = rt.MTU
	}
	if !n.Src.IsValid() {
		return n, fmt.Errorf("route: no source address for %v on %s", peer, a.Name)
	}
	if a.Flags&net.FlagLoopback != 0 || len(a.HardwareAddr) == 0 {
		return n, fmt.Errorf("route: %v is reached through %s, which has no Ethernet address", peer, a.Name)
	}
	return n, nil
}

// solicit asks the kernel to resolve hop on the link, as if a packet were
// waiting for it (NTF_USE): it sends ARP or neighbour solicitations with its
// own timers and retries.
func (r *Resolver) solicit(ifindex int, hop netip.Addr) {
	_ = r.h.NeighSet(&netlink.Neigh{
		LinkIndex: ifindex,
		IP:        hop.AsSlice(),
		Flags:     netlink.NTF_USE,
	})
}

func (r *Resolver) remember(n Next) {
	r.mu.Lock()
	r.known[n.Peer] = n
	r.mu.Unlock()
}

// Forget stops Watch reporting on peer.
func (r *Resolver) Forget(peer netip.Addr) {
	r.mu.Lock()
	delete(r.known, peer.Unmap())
	r.mu.Unlock()
}

// Resolution bounds: at most maxProbes datagrams per Resolve, and a
// Resolve whose ctx has no deadline gives up after defaultResolveTimeout
// (the kernel itself gives up on a neighbour after 3 solicitations 1 s
// apart).
const (
	maxProbes             = 3
	defaultResolveTimeout = 10 * time.Second
)

// Resolve is Lookup that waits, until ctx ends (or defaultResolveTimeout
// if ctx has no deadline), for a missing neighbour to be resolved. For an
// IPv6 next hop on a link without a link-local address it probes (see
// probe) whenever the neighbour entry is missing or failed, up to
// maxProbes times.
func (r *Resolver) Resolve(ctx context.Context, peer netip.Addr) (Next, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, defaultResolveTimeout)
		defer cancel()
	}
	wait := time.Millisecond
	probes := 0
	for {
		n, state, err := r.lookup(peer)
		if !errors.Is(err, ErrUnresolved) {
			return n, err
		}
		// Missing, NUD_NONE or failed: the kernel is not soliciting, and
		// on a link without a link-local address asking it to would not
		// make it. The probe comes first: a datagram that finds no entry
		// makes the kernel solicit at once, with its source; one queued
		// behind an NTF_USE waits for the next retransmission (1 s).
		if state&^netlink.NUD_FAILED == 0 && probes < maxProbes && r.needsProbe(n) {
			probes++
			r.probe(n)
		} else {
			r.solicit(n.IfIndex, n.NextHop().WithZone(""))
		}
		select {
		case <-ctx.Done():
			return n, fmt.Errorf("%w (%w)", err, ctx.Err())
		case <-time.After(wait):
		}
		wait = min(wait*2, 100*time.Millisecond)
	}
}

// Watch follows the kernel's route, address and neighbour changes until ctx
// ends and calls changed for each remembered peer whose answer changed
// (err non-nil when it no longer resolves). It re-resolves a peer whose
// neighbour entry failed. changed runs on Watch's goroutine.
func (r *Resolver) Watch(ctx context.Context, changed func(Next, error)) error {
	done := make(chan struct{})
	defer close(done)
	neighCh := make(chan netlink.NeighUpdate, 64)
	routeCh := make(chan netlink.RouteUpdate, 64)
	addrCh := make(chan netlink.AddrUpdate, 64)
	errCb := func(error) {}
	if err := netlink.NeighSubscribeWithOptions(neighCh, done, netlink.NeighSubscribeOptions{Namespace: &r.ns, ErrorCallback: errCb}); err != nil {
		return fmt.Errorf("route: subscribe to neighbours: %w", err)
	}
	if err := netlink.RouteSubscribeWithOptions(routeCh, done, netlink.RouteSubscribeOptions{Namespace: &r.ns, ErrorCallback: errCb}); err != nil {
		return fmt.Errorf("route: subscribe to routes: %w", err)
	}
	if err := netlink.AddrSubscribeWithOptions(addrCh, done, netlink.AddrSubscribeOptions{Namespace: &r.ns, ErrorCallback: errCb}); err != nil {
		return fmt.Errorf("route: subscribe to addresses: %w", err)
	}
	// Several events usually come together: re-check after a short quiet
	// period rather than once per message.
	var pending <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case _, ok := <-neighCh:
			if !ok {
				return errors.New("route: neighbour subscription ended")
			}
		case _, ok := <-routeCh:
			if !ok {
				return errors.New("route: route subscription ended")
			}
		case _, ok := <-addrCh:
			if !ok {
				return errors.New("route: address subscription ended")
			}
		case <-pending:
			pending = nil
			r.recheck(changed)
			continue
		}
		if pending == nil {
			pending = time.After(10 * time.Millisecond)
		}
	}
}

func (r *Resolver) recheck(changed func(Next, error)) {
	r.mu.Lock()
	old := make([]Next, 0, len(r.known))
	for _, n := range r.known {
		old = append(old, n)
	}
	r.mu.Unlock()
	for _, o := range old {
		n, err := r.Lookup(o.Peer)
		if err != nil {
			if errors.Is(err, ErrUnresolved) && o.DstMAC == nil {
				continue // still resolving: nothing new to say
			}
			changed(n, err)
			continue
		}
		if !n.Equal(o) {
			changed(n, nil)
		}
	}
}

// needsProbe reports whether the kernel cannot solicit n's next hop on
// its own: an IPv6 hop on a link with no usable link-local address
// (ndisc_send_ns takes its source from the link-local address, tentative
// ones excluded, when no packet is waiting).
func (r *Resolver) needsProbe(n Next) bool {
	if !n.NextHop().Is6() || !n.Src.Is6() {
		return false
	}
	link, err := r.h.LinkByIndex(n.IfIndex)
	if err != nil {
		return false
	}
	addrs, err := r.h.AddrList(link, unix.AF_INET6)
	if err != nil {
		return false
	}
	for _, a := range addrs {
		if a.IP.IsLinkLocalUnicast() && a.Flags&(unix.IFA_F_TENTATIVE|unix.IFA_F_DADFAILED) == 0 {
			return false
		}
	}
	return true
}

// probe sends one UDP datagram, one zero byte, to the peer's discard port
// (9) from n.Src, in the Resolver's namespace. The kernel queues it on the
// next hop's neighbour entry and solicits with the datagram's source
// address, which needs no link-local address; once resolved the datagram
// goes out and the peer drops it (or answers with an ICMP port
// unreachable). Errors are ignored: Resolve still ends at its deadline.
func (r *Resolver) probe(n Next) {
	fd, err := r.socketIn(unix.AF_INET6, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	if unix.Bind(fd, &unix.SockaddrInet6{Addr: n.Src.As16(), ZoneId: zoneID(n.Src, n.IfIndex)}) != nil {
		return
	}
	peer := n.Peer.WithZone("")
	if unix.Sendto(fd, []byte{0}, 0, &unix.SockaddrInet6{Port: 9, Addr: peer.As16(), ZoneId: zoneID(peer, n.IfIndex)}) == nil {
		r.probes.Add(1)
	}
}

// zoneID is the scope of a link-local address: the egress interface.
func zoneID(a netip.Addr, ifindex int) uint32 {
	if a.IsLinkLocalUnicast() {
		return uint32(ifindex)
	}
	return 0
}

// socketIn opens a socket in the Resolver's namespace, which need not be
// the calling thread's: a socket belongs to the namespace of the thread
// that made it. The switch happens on a locked thread of its own; if that
// thread cannot be switched back it is left locked, so that it ends with
// its goroutine instead of running other goroutines in the wrong
// namespace.
func (r *Resolver) socketIn(domain, typ int) (int, error) {
	type result struct {
		fd  int
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		cur, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			done <- result{-1, err}
			return
		}
		defer cur.Close()
		if cur.Equal(r.ns) {
			fd, err := unix.Socket(domain, typ, 0)
			runtime.UnlockOSThread()
			done <- result{fd, err}
			return
		}
		if err := netns.Set(r.ns); err != nil {
			runtime.UnlockOSThread()
			done <- result{-1, err}
			return
		}
		fd, err := unix.Socket(domain, typ, 0)
		done <- result{fd, err}
		if netns.Set(cur) == nil {
			runtime.UnlockOSThread()
		}
	}()
	res := <-done
	return res.fd, res.err
}

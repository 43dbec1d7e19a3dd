package bpf

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// XDP verdicts, as returned by the program.
const (
	XDPAborted  = 0
	XDPDrop     = 1
	XDPPass     = 2
	XDPTX       = 3
	XDPRedirect = 4
)

// AttachMode says where the program runs.
type AttachMode int

const (
	// NotAttached: Attach has not succeeded.
	NotAttached AttachMode = iota
	// DriverMode: the program runs in the driver's receive path (native XDP).
	DriverMode
	// GenericMode: the program runs on the skb after allocation (slower; used
	// when the driver has no XDP support).
	GenericMode
)

func (m AttachMode) String() string {
	switch m {
	case DriverMode:
		return "driver"
	case GenericMode:
		return "generic"
	default:
		return "none"
	}
}

// Options configure Load.
type Options struct {
	// Queues is the number of XSKMAP slots, one per receive queue; 0 means 64.
	Queues int
	// FilterLocal steers only RoCEv2 addressed to an address added with
	// AddLocal; other RoCEv2 (for example routed through this host) is passed.
	FilterLocal bool

	// missAction replaces XDP_PASS as the verdict for RoCEv2 on a queue without
	// a socket. Tests set XDP_DROP so that BPF_PROG_TEST_RUN, where no socket
	// can be bound, shows which frames would have been steered.
	missAction uint32
}

// Counters are the program's counters summed over all CPUs.
type Counters struct {
	Steered   uint64 // redirected to an AF_XDP socket
	Passed    uint64 // not RoCEv2: left to the kernel
	Malformed uint64 // an IP or UDP header was truncated or invalid: passed
	Unbound   uint64 // RoCEv2 on a queue with no socket bound: passed
	Foreign   uint64 // RoCEv2 to a non-local address with FilterLocal: passed
}

// counters mirrors struct counters in steer.c.
type counters struct {
	Steered, Passed, Malformed, Unbound, Foreign uint64
}

// Program is the loaded steering program for one interface. Register,
// Unregister, AddLocal, RemoveLocal and Counters may be called from any
// goroutine (the kernel synchronises map updates); Attach and Close belong
// to the owner.
type Program struct {
	objs    steerObjects
	link    link.Link
	mode    AttachMode
	ifindex int
	queues  int
}

// Load loads the program and its maps into the kernel (needs CAP_BPF and
// CAP_NET_ADMIN). A verifier rejection is returned as an error wrapping
// *ebpf.VerifierError.
func Load(opts Options) (*Program, error) {
	if opts.Queues <= 0 {
		opts.Queues = 64
	}
	if opts.missAction == 0 {
		opts.missAction = XDPPass
	}
	spec, err := loadSteer()
	if err != nil {
		return nil, err
	}
	spec.Maps[steerMapXsks].MaxEntries = uint32(opts.Queues)
	var filter uint32
	if opts.FilterLocal {
		filter = 1
	}
	if err := spec.Variables[steerVarFilterLocal].Set(filter); err != nil {
		return nil, fmt.Errorf("bpf: set filter_local: %w", err)
	}
	if err := spec.Variables[steerVarMissAction].Set(opts.missAction); err != nil {
		return nil, fmt.Errorf("bpf: set miss_action: %w", err)
	}
	p := &Program{queues: opts.Queues}
	if err := spec.LoadAndAssign(&p.objs, nil); err != nil {
		return nil, fmt.Errorf("bpf: load steering program: %w", err)
	}
	return p, nil
}

// Attach attaches the program to the interface, in driver mode when the
// driver supports XDP and in generic mode otherwise. A Program is attached to
// at most one interface, because its XSKMAP is indexed by queue alone.
func (p *Program) Attach(ifindex int) (AttachMode, error) {
	return p.AttachWith(ifindex, NotAttached)
}

// AttachWith is Attach with a required mode: DriverMode or GenericMode, or
// NotAttached for driver mode with a generic fallback.
func (p *Program) AttachWith(ifindex int, want AttachMode) (AttachMode, error) {
	if p.link != nil {
		return p.mode, errors.New("bpf: program already attached")
	}
	try := func(m AttachMode) (link.Link, error) {
		f := link.XDPDriverMode
		if m == GenericMode {
			f = link.XDPGenericMode
		}
		return link.AttachXDP(link.XDPOptions{Program: p.objs.Steer, Interface: ifindex, Flags: f})
	}
	var l link.Link
	var err error
	mode := want
	switch want {
	case DriverMode, GenericMode:
		if l, err = try(want); err != nil {
			return NotAttached, fmt.Errorf("bpf: attach XDP to ifindex %d in %v mode: %w", ifindex, want, err)
		}
	default:
		mode = DriverMode
		if l, err = try(DriverMode); err != nil {
			var gerr error
			mode = GenericMode
			if l, gerr = try(GenericMode); gerr != nil {
				return NotAttached, fmt.Errorf("bpf: attach XDP to ifindex %d: driver mode: %w; generic mode: %w", ifindex, err, gerr)
			}
		}
	}
	p.link, p.mode, p.ifindex = l, mode, ifindex
	return mode, nil
}

// Mode reports how the program is attached.
func (p *Program) Mode() AttachMode { return p.mode }

// Queues is the number of XSKMAP slots.
func (p *Program) Queues() int { return p.queues }

// Register steers RoCEv2 received on queue to the AF_XDP socket fd, which must
// be bound to the same interface and queue (the kernel drops it otherwise).
func (p *Program) Register(queue int, fd int) error {
	if queue < 0 || queue >= p.queues {
		return fmt.Errorf("bpf: queue %d outside the %d XSKMAP slots", queue, p.queues)
	}
	if err := p.objs.Xsks.Put(uint32(queue), uint32(fd)); err != nil {
		return fmt.Errorf("bpf: register socket for queue %d: %w", queue, err)
	}
	return nil
}

// Unregister stops steering queue; its RoCEv2 goes to the kernel again.
func (p *Program) Unregister(queue int) error {
	if err := p.objs.Xsks.Delete(uint32(queue)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("bpf: unregister queue %d: %w", queue, err)
	}
	return nil
}

// AddLocal adds a local address for FilterLocal.
func (p *Program) AddLocal(a netip.Addr) error {
	var one uint8 = 1
	a = a.Unmap()
	if a.Is4() {
		b := a.As4()
		return p.objs.LocalV4.Put(b, one)
	}
	b := a.As16()
	return p.objs.LocalV6.Put(b, one)
}

// RemoveLocal removes an address added with AddLocal.
func (p *Program) RemoveLocal(a netip.Addr) error {
	a = a.Unmap()
	var err error
	if a.Is4() {
		b := a.As4()
		err = p.objs.LocalV4.Delete(b)
	} else {
		b := a.As16()
		err = p.objs.LocalV6.Delete(b)
	}
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return nil
	}
	return err
}

// Counters sums the per-CPU counters. It is a slow-path call (one map
// lookup) and safe for concurrent use: the ports of several queues share
// one Program.
func (p *Program) Counters() (Counters, error) {
	var percpu []counters
	if err := p.objs.Stats.Lookup(uint32(0), &percpu); err != nil {
		return Counters{}, fmt.Errorf("bpf: read counters: %w", err)
	}
	var c Counters
	for _, v := range percpu {
		c.Steered += v.Steered
		c.Passed += v.Passed
		c.Malformed += v.Malformed
		c.Unbound += v.Unbound
		c.Foreign += v.Foreign
	}
	return c, nil
}

// Close detaches the program and frees its maps.
func (p *Program) Close() error {
	var err error
	if p.link != nil {
		err = p.link.Close()
		p.link = nil
		p.mode = NotAttached
	}
	return errors.Join(err, p.objs.Close())
}

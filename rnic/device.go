package rnic

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/congestion/dcqcn"
	"github.com/softrnic/softrnic/frame"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/transport"
	"github.com/softrnic/softrnic/transport/rc"
	"github.com/softrnic/softrnic/verbs"
)

// Config describes a device's port.
type Config struct {
	// Name is the network interface the device runs on.
	Name string
	MAC  [6]byte
	// Addrs is the GID table as addresses: index i is sgid_index i. A
	// frame is accepted only if addressed to one of them.
	Addrs []netip.Addr
	// PortMTU is the active path MTU of the port (default 1024, what rxe
	// uses on a 1500-byte Ethernet link).
	PortMTU int
	// Congestion is the congestion control of the RC/UC QPs (zero: off);
	// see NewCongestion.
	Congestion Congestion
	// Recovery is the loss recovery of the device's RC QPs that do not
	// choose their own (verbs.QPInitAttr.Recovery); RecoveryDefault is
	// RecoverySelective.
	Recovery ib.Recovery
	// ReorderBytes bounds the memory of the reorder pool in which
	// selective-repeat QPs hold packets that came out of order (0:
	// DefaultReorderBytes). The pool is shared by the device's QPs and
	// taken as it is first needed.
	ReorderBytes int
	// RxFrames is how many frames the port holds for the device before it
	// must drop (an AF_XDP socket's FILL ring, over every queue); 0: not
	// known. The device grants the peers of its selective-repeat QPs
	// receive windows that share half of them (recv.go).
	RxFrames int
	// PollFresh is how recently an application must have polled
	// (Device.Poll) for a post to leave the doorbell alone (0:
	// DefaultPollFresh; see Device.Poll). Tests widen it to make the
	// skipped doorbells independent of how fast their goroutine runs.
	PollFresh time.Duration
	// Resolve, if set, finds the next hop's MAC for a destination (the
	// neighbour table): address vectors without a DMAC (RTR of a connected
	// QP, address handles) need it. It may block; the device never calls
	// it with a lock held.
	Resolve func(ctx context.Context, dst netip.Addr) ([6]byte, error)
}

// Device is one software RNIC port.
type Device struct {
	cfg Config

	mu      sync.Mutex // control path: QPs
	qps     *table[QP] // by QPN
	nextQPN uint32
	keyMu   sync.Mutex // control path: MRs
	keys    *table[MR] // by lkey and rkey

	doorbell chan struct{}
	events   chan verbs.AsyncEvent
	subMu    sync.Mutex                              // serialises Subscribe's writers
	subs     atomic.Pointer[[]chan verbs.AsyncEvent] // more consumers of the events (Subscribe)
	lostEv   atomic.Uint64
	portDown atomic.Bool // the interface's link is down (SetPortActive)

	cqOverruns atomic.Uint64 // CQs that overflowed (CQOverruns)
	// completions counts the CQ pushes that added a completion: each may
	// give the application back memory the read-ahead holds (dma.go).
	completions atomic.Uint64

	// The counters of destroyed QPs (QPCounterTotals); retireGen counts
	// retirements.
	retMu      sync.Mutex
	retiredQPs RetiredQPs
	retireGen  uint64

	// Busy polling (Poll): the engine's inline step while its loop runs,
	// when an application last polled through it, and the doorbells that
	// were not rung because it had.
	poller       atomic.Pointer[func() (moved, ran bool)]
	polledAt     atomic.Int64 // clock.Time
	ringsSkipped atomic.Uint64

	// Queues outside the device (queues.go), and how to wake an engine
	// asleep in its port.
	queues atomic.Pointer[Queues]
	waker  atomic.Pointer[func()]
	asleep atomic.Bool

	// QPs with work for the engine, handed over by application goroutines
	// (a QP is queued at most once: QP.queued / QP.timed).
	handMu     sync.Mutex
	handReady  []*QP
	handTimed  []*QP
	handedOver atomic.Bool

	// engine-only state
	ready []*QP // QPs that may have frames to send
	timed []*QP // QPs that may have a timer armed
	rxf   frame.Frame
	share rxShare
	grh   [transport.GRHLen]byte
	dma   dmaBatch // writes to external memory (dma.go)
	// frames for the device itself, delivered after Transmit (loop.go)
	loop    [][]byte
	loopBuf []byte
	meta    transport.Meta
	pay     transport.Payload // the payload of the frame being built
	// rr rotates where Transmit starts in the ready list, while its
	// calls leave QPs unserved (rotate, sched.go).
	rr     int
	rotate bool
	ipID   uint16
	cc     *rc.CCConfig  // what every RC/UC QP's transport runs, nil for none
	rxAway time.Duration // SetRxAway: for the frames of the next Receive
	// heard is when a connected QP last received a packet from its peer,
	// by a hash of the peer's address (peerSlot): the peer's device is
	// alive (rc.QP.HeardFrom).
	heard  [peerSlots]clock.Time
	hostCC dcqcn.HostCC // SetRxLevel's readings and the host marks (recv.go)
	// hostMarks: the QPs run DCQCN and HostCC is on.
	hostMarks bool
	// reorder holds the out-of-order packets of selective-repeat QPs
	// (rc.ReorderPool; its own lock).
	reorder *rc.ReorderPool
	// retired sums the transport counters of the RC and UC QPs destroyed
	// or reset so far (RCCounters).
	retiredMu sync.Mutex
	retired   rc.Counters
	Stats     Stats

	// Stats as of the last PublishStats: seen by the step's owner, pub
	// for everyone (under pubMu).
	seen  Stats
	pubMu sync.Mutex
	pub   Stats
}

// NewDevice creates a device.
func NewDevice(cfg Config) (*Device, error) {
	if len(cfg.Addrs) == 0 {
		return nil, fmt.Errorf("rnic: device: no address (Config.Addrs): %w", verbs.ErrInvalid)
	}
	if cfg.PortMTU == 0 {
		cfg.PortMTU = 1024
	}
	if !validMTU(cfg.PortMTU) {
		return nil, fmt.Errorf("rnic: device: port MTU %d is not an IB MTU (256, 512, 1024, 2048, 4096): %w", cfg.PortMTU, verbs.ErrInvalid)
	}
	if err := cfg.Congestion.validate(); err != nil {
		return nil, err
	}
	if !cfg.Recovery.Valid() || cfg.ReorderBytes < 0 {
		return nil, fmt.Errorf("rnic: recovery %v, reorder pool of %d bytes: %w", cfg.Recovery, cfg.ReorderBytes, verbs.ErrInvalid)
	}
	cfg.Recovery = cfg.Recovery.Or(ib.RecoverySelective)
	if cfg.ReorderBytes == 0 {
		cfg.ReorderBytes = DefaultReorderBytes
	}
	if cfg.PollFresh <= 0 {
		cfg.PollFresh = DefaultPollFresh
	}
	for i, a := range cfg.Addrs {
		cfg.Addrs[i] = a.Unmap()
	}
	pkt := rc.PacketLen(cfg.PortMTU)
	d := &Device{cfg: cfg, doorbell: make(chan struct{}, 1), events: make(chan verbs.AsyncEvent, 256), nextQPN: 0x10,
		cc: cfg.Congestion.ccConfig(), reorder: rc.NewReorderPool(pkt, max(cfg.ReorderBytes/pkt, 1))}
	d.qps, d.keys = newTable[QP](), newTable[MR]()
	d.hostCC.Init(cfg.Congestion.HostCC)
	d.hostMarks = cfg.Congestion.Algorithm == "dcqcn" && !cfg.Congestion.HostCC.Off
	d.subs.Store(new([]chan verbs.AsyncEvent))
	return d, nil
}

// Config returns the device's configuration.
func (d *Device) Config() Config { return d.cfg }

// Limits of the device, as an RNIC reports them in ibv_query_device.
const (
	MaxMsgSize   = 1 << 31
	MaxCQE       = 1 << 20
	MaxSGE       = 32
	MaxQPWR      = 16384
	MaxInline    = 400
	MaxRdAtomic  = 128
	DefaultDepth = 256
	// MaxUnackedPSNs is the RC window of a requester (as rxe's).
	MaxUnackedPSNs = 128
	// DefaultReorderBytes is the reorder pool's default bound
	// (Config.ReorderBytes): 16 MiB, about 15 000 packets at path MTU
	// 1024 and 4 000 at 4096, enough for a selective-repeat window of
	// every one of tens of QPs at once.
	DefaultReorderBytes = 16 << 20
)

var _ verbs.Device = (*Device)(nil)

// Name is the network interface the device runs on (Config.Name).
func (d *Device) Name() string { return d.cfg.Name }

// GIDs is the GID table as addresses.
func (d *Device) GIDs() []netip.Addr { return slices.Clone(d.cfg.Addrs) }

// Query returns the device's and its port's attributes (ibv_query_device,
// ibv_query_port).
func (d *Device) Query() ib.DeviceAttr {
	return ib.DeviceAttr{NodeGUID: ib.NodeGUID(d.cfg.MAC), MaxMRSize: MaxMsgSize, MaxQP: 1 << 16, MaxQPWR: MaxQPWR,
		MaxSGE: MaxSGE, MaxCQ: 1 << 16, MaxCQE: MaxCQE, MaxMR: 1 << 20, MaxPD: 1 << 16, MaxSRQ: 1 << 16,
		MaxSRQWR: MaxQPWR, MaxInline: MaxInline, MaxQPRdAtom: MaxRdAtomic, ActiveMTU: uint32(d.cfg.PortMTU),
		PortActive: !d.portDown.Load()}
}

// heapMem is memory in this process: an ordinary slice.
type heapMem []byte

func (m heapMem) Bytes() []byte { return m }
func (m heapMem) Free() error   { return nil }

// AllocMem allocates n bytes of memory to register (the Go heap).
func (d *Device) AllocMem(n int) (verbs.Mem, error) {
	if n <= 0 {
		return nil, fmt.Errorf("rnic: memory of %d bytes: %w", n, verbs.ErrInvalid)
	}
	return heapMem(make([]byte, n)), nil
}

// Resources counts the device's live QPs (its GSI QP among them, if one was
// created) and registered MRs: what a leak check, or a status report,
// wants to know.
func (d *Device) Resources() (qps, mrs int) {
	d.qps.each(func(*QP) { qps++ })
	d.keys.each(func(*MR) { mrs++ })
	return qps, mrs / 2 // an MR is in the key table under its lkey and its rkey
}

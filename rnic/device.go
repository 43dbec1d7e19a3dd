package rnic

import (
	"context"
	"encoding/binary"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/frame"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/icrc"
	"github.com/softrnic/softrnic/transport"
	"github.com/softrnic/softrnic/transport/rc"
)

// Config describes a device's port.
type Config struct {
	MAC [6]byte
	// Addrs is the GID table as addresses: index i is sgid_index i. A
	// frame is accepted only if addressed to one of them.
	Addrs []netip.Addr
	// PortMTU is the active path MTU of the port (default 1024, what rxe
	// uses on a 1500-byte Ethernet link).
	PortMTU int
	// Congestion is the DCQCN setting of the RC/UC QPs (zero: off); see
	// NewCongestion.
	Congestion Congestion
	// Resolve, if set, finds the next hop's MAC for a destination (the
	// neighbour table): address vectors without a DMAC (RTR of a connected
	// QP, address handles) need it. It may block; the device never calls
	// it with a lock held.
	Resolve func(ctx context.Context, dst netip.Addr) ([6]byte, error)
}

// Stats counts what the step functions dropped and moved. The engine
// goroutine owns them; read them from it (or after it stopped).
type Stats struct {
	RxFrames    uint64
	RxParseErr  uint64 // not RoCEv2 or malformed
	RxNotLocal  uint64 // destination address not ours
	RxBadHeader uint64 // TVer or P_Key
	RxNoQP      uint64 // unknown destination QP
	RxBadICRC   uint64
	RxBadType   uint64 // opcode of another transport than the QP's
	RxBadSrc    uint64 // RC/UC source address is not the connected peer
	RxBadState  uint64 // QP not in a state that receives
	TxFrames    uint64
	CongestionStats
}

// Device is one software RNIC port.
type Device struct {
	cfg Config

	mu      sync.Mutex // control path only
	keys    atomic.Pointer[map[uint32]*MR]
	qps     atomic.Pointer[map[uint32]*QP]
	list    atomic.Pointer[[]*QP]
	nextQPN uint32

	doorbell chan struct{}
	events   chan AsyncEvent
	lostEv   atomic.Uint64

	cqOverruns atomic.Uint64 // CQs that overflowed (CQOverruns)

	// Busy polling (Poll): the engine's inline step while its loop runs,
	// when an application last polled through it, and the doorbells that
	// were not rung because it had.
	poller       atomic.Pointer[func() (moved, ran bool)]
	polledAt     atomic.Int64 // clock.Time
	ringsSkipped atomic.Uint64

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
	grh   [transport.GRHLen]byte
	meta  transport.Meta
	rr    int
	ipID  uint16
	cc    *rc.CCConfig // what every RC/UC QP's transport runs, nil for none
	Stats Stats
}

// NewDevice creates a device.
func NewDevice(cfg Config) (*Device, error) {
	if len(cfg.Addrs) == 0 {
		return nil, ErrInvalid
	}
	if cfg.PortMTU == 0 {
		cfg.PortMTU = 1024
	}
	if !validMTU(cfg.PortMTU) {
		return nil, ErrInvalid
	}
	if err := cfg.Congestion.validate(); err != nil {
		return nil, err
	}
	for i, a := range cfg.Addrs {
		cfg.Addrs[i] = a.Unmap()
	}
	d := &Device{cfg: cfg, doorbell: make(chan struct{}, 1), events: make(chan AsyncEvent, 256), nextQPN: 0x10,
		cc: cfg.Congestion.ccConfig()}
	k := map[uint32]*MR{}
	d.keys.Store(&k)
	q := map[uint32]*QP{}
	d.qps.Store(&q)
	var l []*QP
	d.list.Store(&l)
	return d, nil
}

// Config returns the device's configuration.
func (d *Device) Config() Config { return d.cfg }

// Doorbell receives a value when applications post work (coalescing: one
// value may stand for many posts). An idle engine waits on it together
// with its port and its next deadline.
func (d *Device) Doorbell() <-chan struct{} { return d.doorbell }

// SetPoller installs step as the device's inline step, which Poll runs;
// nil removes it. engine.Loop.Run installs its own for as long as it
// runs: step must try to run the step functions in the caller's goroutine
// and give up at once when another goroutine is running them (a try-lock
// per call, never a lock per packet), reporting whether it ran and
// whether it moved anything.
func (d *Device) SetPoller(step func() (moved, ran bool)) {
	if step == nil {
		d.poller.Store(nil)
		return
	}
	d.poller.Store(&step)
}

// Poll drives the device from the calling goroutine, as ibv_poll_cq on an
// mlx5 or rxe device processes the rings in the caller's context: when no
// other goroutine is running the step functions, it receives one batch,
// runs due timers and sends what the QPs have, and reports whether any
// frame moved. An application that busy-polls its CQ calls it whenever
// the CQ is empty: a ping-pong then needs no hand-off to the engine
// goroutine in either direction (see also pollFresh). While its steps move
// nothing it keeps stepping for up to pollSpin, so that a caller that
// yields between calls yields less often; it returns at once when a step
// moved something, when the engine goroutine holds the step, and when no
// engine loop runs the device.
func (d *Device) Poll() bool {
	p := d.poller.Load()
	if p == nil {
		return false
	}
	start := clock.Now()
	d.polledAt.Store(int64(start))
	for {
		moved, ran := (*p)()
		if moved || !ran {
			return moved
		}
		if t := clock.Now(); t.Sub(start) >= pollSpin {
			d.polledAt.Store(int64(t)) // still polling: posts need no doorbell
			return false
		}
	}
}

// pollSpin bounds Poll's busy polling while nothing moves (as
// SO_BUSY_POLL bounds a socket's). A goroutine locked to its OS thread,
// as perf's are in their network namespaces, pays for each
// runtime.Gosched with two thread hand-offs (futex calls, several µs):
// polling the port for a few µs first catches the answer of a ping-pong
// or the ACK that reopens a WRITE window before yielding.
const pollSpin = 5 * time.Microsecond

// PolledAt is when an application last called Poll (0: never); the
// engine naps longer while applications poll for it.
func (d *Device) PolledAt() clock.Time { return clock.Time(d.polledAt.Load()) }

// RingsSkipped counts posts that left the doorbell alone because the
// application was polling (safe from any goroutine).
func (d *Device) RingsSkipped() uint64 { return d.ringsSkipped.Load() }

// AsyncEvent is an asynchronous event of a QP.
type AsyncEvent struct {
	Type ib.EventType
	QPN  uint32
	CQ   *CQ // EventCQErr only
}

// Events delivers asynchronous events (ibv_get_async_event). Events are
// dropped, and counted by LostEvents, when nobody reads them.
func (d *Device) Events() <-chan AsyncEvent { return d.events }

// LostEvents counts events dropped because Events was full.
func (d *Device) LostEvents() uint64 { return d.lostEv.Load() }

func (d *Device) event(t ib.EventType, qpn uint32) {
	d.asyncEvent(AsyncEvent{Type: t, QPN: qpn})
}

func (d *Device) asyncEvent(e AsyncEvent) {
	select {
	case d.events <- e:
	default:
		d.lostEv.Add(1)
	}
}

// pollFresh is how recently an application must have polled (Poll) for
// a post to leave the doorbell alone: the poster is then spinning on its
// CQ and its next Poll transmits the WQE in its own goroutine, batched
// with whatever else it posts meanwhile, where a doorbell would wake the
// engine goroutine (a futex wake-up on an idle core, and a goroutine that
// takes the CPU the other end of a ping-pong needs on a small machine).
// If the application stops polling instead, the engine finds the WQE at
// the end of its nap (engine.Options.PolledWait).
const pollFresh = 10 * time.Microsecond

func (d *Device) ring() {
	if d.poller.Load() != nil && clock.Now().Sub(clock.Time(d.polledAt.Load())) < pollFresh {
		d.ringsSkipped.Add(1)
		return
	}
	select {
	case d.doorbell <- struct{}{}:
	default:
	}
}

// hdrTmpl is a prepared Ethernet/IP/UDP header; lengths, IP ID and
// checksum are filled per frame.
type hdrTmpl struct {
	b  [frame.EthernetLen + 40 + frame.UDPLen]byte
	n  int
	v6 bool
}

// udpSport is rdma_get_udp_sport: entropy for ECMP from the flow label, or
// from the two QPNs when it is 0, in 0xC000..0xFFFF.
func udpSport(fl uint32, lqpn, rqpn uint32) uint16 {
	if fl == 0 {
		v := uint64(lqpn) * uint64(rqpn)
		v ^= v >> 20
		v ^= v >> 40
		fl = uint32(v & 0xFFFFF)
	}
	return uint16((fl&0x3FFF)^((fl&0xFC000)>>14)) | 0xC000
}

// makeHdr prepares the frame header of packets along av (checked with
// checkAV) to the next hop mac.
func (d *Device) makeHdr(av *ib.AddressVector, mac [6]byte, lqpn, rqpn uint32) hdrTmpl {
	var h hdrTmpl
	src, dst := d.cfg.Addrs[av.SGIDIndex], av.DGID.Addr()
	b := h.b[:]
	copy(b[0:6], mac[:])
	copy(b[6:12], d.cfg.MAC[:])
	ttl := av.HopLimit
	if ttl == 0 {
		ttl = 64
	}
	ip := b[frame.EthernetLen:]
	var udp []byte
	if src.Is4() {
		binary.BigEndian.PutUint16(b[12:], frame.EtherTypeIPv4)
		ip[0], ip[1] = 0x45, av.TrafficClass
		binary.BigEndian.PutUint16(ip[6:], 0x4000) // DF, as rxe sends
		ip[8], ip[9] = ttl, frame.ProtocolUDP
		s, t := src.As4(), dst.As4()
		copy(ip[12:16], s[:])
		copy(ip[16:20], t[:])
		udp = ip[20:]
		h.n = frame.EthernetLen + 20 + frame.UDPLen
	} else {
		binary.BigEndian.PutUint16(b[12:], frame.EtherTypeIPv6)
		binary.BigEndian.PutUint32(ip[0:], 6<<28|uint32(av.TrafficClass)<<20|av.FlowLabel&0xFFFFF)
		ip[6], ip[7] = frame.ProtocolUDP, ttl
		s, t := src.As16(), dst.As16()
		copy(ip[8:24], s[:])
		copy(ip[24:40], t[:])
		udp = ip[40:]
		h.n = frame.EthernetLen + 40 + frame.UDPLen
		h.v6 = true
	}
	sp := av.UDPSrcPort
	if sp == 0 {
		sp = udpSport(av.FlowLabel, lqpn, rqpn)
	}
	binary.BigEndian.PutUint16(udp[0:], sp)
	binary.BigEndian.PutUint16(udp[2:], frame.RoCEv2Port)
	return h
}

// bytes is the prepared header.
func (h *hdrTmpl) bytes() []byte { return h.b[:h.n] }

// finish writes the header h in front of a transport packet of tlen
// bytes already at buf[len(h):], fills lengths and checksums, stamps the
// ICRC and returns the frame length.
func (d *Device) finish(buf []byte, h []byte, tlen int) int {
	copy(buf, h)
	total := len(h) + tlen + icrc.Len
	ip := buf[frame.EthernetLen:]
	udpLen := total - len(h) + frame.UDPLen
	if len(h) == frame.EthernetLen+frame.IPv6Len+frame.UDPLen {
		binary.BigEndian.PutUint16(ip[4:], uint16(udpLen))
		binary.BigEndian.PutUint16(ip[40+4:], uint16(udpLen))
	} else {
		binary.BigEndian.PutUint16(ip[2:], uint16(total-frame.EthernetLen))
		d.ipID++
		binary.BigEndian.PutUint16(ip[4:], d.ipID)
		frame.IPv4(ip[:frame.IPv4Len]).SetChecksum()
		binary.BigEndian.PutUint16(ip[20+4:], uint16(udpLen))
	}
	_ = icrc.Stamp(buf[frame.EthernetLen:total])
	return total
}

func (d *Device) isLocal(a netip.Addr) bool {
	a = a.Unmap()
	for _, l := range d.cfg.Addrs {
		if l == a {
			return true
		}
	}
	return false
}

// Receive processes a batch of received frames (engine goroutine). The
// frames are not retained. Frames for the same QP in a row are handled
// under one acquisition of its lock.
func (d *Device) Receive(now clock.Time, frames [][]byte) {
	tbl := *d.qps.Load()
	var cur *QP
	f := &d.rxf
	for _, b := range frames {
		d.Stats.RxFrames++
		if frame.Parse(b, f) != nil {
			d.Stats.RxParseErr++
			continue
		}
		if !d.isLocal(f.Dst()) {
			d.Stats.RxNotLocal++
			continue
		}
		h := f.BTH()
		if h.TVer() != 0 || h.PKey()&0x7FFF != 0x7FFF {
			d.Stats.RxBadHeader++
			continue
		}
		q := tbl[h.DestQP()]
		if q == nil {
			d.Stats.RxNoQP++
			continue
		}
		if !f.VerifyICRC() {
			d.Stats.RxBadICRC++
			continue
		}
		if q != cur {
			if cur != nil {
				cur.releaseEngine()
			}
			q.mu.Lock()
			cur = q
		}
		d.deliver(now, q, f)
	}
	if cur != nil {
		cur.releaseEngine()
	}
}

// deliver hands a checked frame to q's transport; q.mu is held.
func (d *Device) deliver(now clock.Time, q *QP, f *frame.Frame) {
	pkt := f.Packet()
	ipLen := 20
	if f.IsIPv6() {
		ipLen = 40
	}
	tp := pkt[ipLen+frame.UDPLen : len(pkt)-icrc.Len]
	op := f.Opcode()
	m := &d.meta // the device's, not a local: the transport call would move a local to the heap
	*m = transport.Meta{Src: f.Src(), ECN: f.ECN()}
	src := m.Src.Unmap()
	if op == bth.CNP {
		// A CNP is for a connected QP's reaction point, from its peer.
		d.Stats.RxCNP++
		if !q.init.Type.Connected() || !q.state.Sending() {
			d.Stats.RPCNPIgnored++
			return
		}
		if src != q.peer {
			d.Stats.RxBadSrc++
			return
		}
		q.tr.Receive(now, tp, m)
		return
	}
	want := bth.TransportRC
	switch q.init.Type {
	case ib.UC:
		want = bth.TransportUC
	case ib.UD, ib.GSI:
		want = bth.TransportUD
	}
	if op.Transport() != want {
		d.Stats.RxBadType++
		return
	}
	if !q.state.Receiving() {
		d.Stats.RxBadState++
		return
	}
	if want == bth.TransportUD {
		if f.IsIPv6() {
			copy(d.grh[:], f.IPv6())
		} else {
			clear(d.grh[:20])
			copy(d.grh[20:], f.IPv4())
		}
		m.GRH = &d.grh
	} else {
		if src != q.peer {
			d.Stats.RxBadSrc++
			return
		}
		if q.state == ib.RTR && !q.commEst {
			q.commEst = true
			d.event(ib.EventCommEst, q.qpn)
		}
	}
	q.tr.Receive(now, tp, m)
}

// txBudget bounds the packets one QP may send per Transmit call so that
// QPs share the link round-robin.
const txBudget = 16

// Transmit builds up to len(out) frames into the caller's buffers and
// returns how many; out[i] is resliced to the frame (its capacity must
// hold the port's largest frame: 14+40+8+BTH+headers+MTU+3+4 bytes).
// Only QPs with something to send are visited, round-robin, at most
// txBudget frames each per visit; the rounds go on while some QP used its
// whole budget and out has room, so that one busy QP fills the batch (one
// sendto(2) per batch on AF_XDP: a single 64 KiB WRITE stream sent 16
// frames per call with a single round).
func (d *Device) Transmit(now clock.Time, out [][]byte) int {
	d.takeHandover()
	n := 0
	if len(d.ready) == 0 {
		return 0
	}
	start := d.rr % len(d.ready)
	d.rr++
	for more := true; more && n < len(out); {
		more = false
		for visited := 0; visited < len(d.ready) && n < len(out); visited++ {
			q := d.ready[(start+visited)%len(d.ready)]
			q.mu.Lock()
			b := 0
			for ; b < txBudget && n < len(out); b++ {
				m := d.buildFrame(now, q, out[n][:cap(out[n])])
				if m == 0 {
					break
				}
				out[n] = out[n][:m]
				n++
			}
			q.releaseEngine()
			more = more || b == txBudget
		}
	}
	// Forget the QPs that have nothing more to send.
	keep := d.ready[:0]
	for _, q := range d.ready {
		if q.stillPending() {
			keep = append(keep, q)
		}
	}
	clear(d.ready[len(keep):])
	d.ready = keep
	d.Stats.TxFrames += uint64(n)
	return n
}

// stillPending reports whether q stays in the ready list; when it leaves,
// a post racing with the decision re-queues it through the handover.
func (q *QP) stillPending() bool {
	if q.txPending.Load() && !q.destroyed.Load() {
		return true
	}
	q.queued.Store(false)
	return q.txPending.Load() && !q.destroyed.Load() && q.queued.CompareAndSwap(false, true)
}

// stillTimed is stillPending for the timer list.
func (q *QP) stillTimed() bool {
	if clock.Time(q.deadline.Load()) != clock.Never && !q.destroyed.Load() {
		return true
	}
	q.timed.Store(false)
	return clock.Time(q.deadline.Load()) != clock.Never && !q.destroyed.Load() && q.timed.CompareAndSwap(false, true)
}

// handOver queues q for the engine (from any goroutine).
func (d *Device) handOver(q *QP, ready, timed bool) {
	d.handMu.Lock()
	if ready {
		d.handReady = append(d.handReady, q)
	}
	if timed {
		d.handTimed = append(d.handTimed, q)
	}
	d.handMu.Unlock()
	d.handedOver.Store(true)
}

// takeHandover moves handed-over QPs into the engine's lists.
func (d *Device) takeHandover() {
	if !d.handedOver.Load() {
		return
	}
	d.handMu.Lock()
	d.handedOver.Store(false)
	d.ready = append(d.ready, d.handReady...)
	d.timed = append(d.timed, d.handTimed...)
	clear(d.handReady)
	clear(d.handTimed)
	d.handReady, d.handTimed = d.handReady[:0], d.handTimed[:0]
	d.handMu.Unlock()
}

// buildFrame writes q's next frame into buf; q.mu is held. The frame
// header is the QP's (connected), its CNP header for a CNP, or the one of
// the next WQE's address handle (datagrams).
func (d *Device) buildFrame(now clock.Time, q *QP, buf []byte) int {
	if q.state == ib.Reset || q.state == ib.Init {
		return 0
	}
	for {
		h := q.hdr.bytes()
		if q.dest != nil {
			w := q.dest.Peek()
			if w == nil {
				return 0
			}
			h = nil // no address handle: the transport completes the WQE in error
			if w.AH != nil {
				h = w.AH.Header
			}
		}
		if len(buf) < len(h)+q.tr.MaxPacket()+icrc.Len {
			return 0
		}
		m := q.tr.Build(now, buf[len(h):])
		if m == 0 {
			if q.dest != nil {
				continue // a WQE completed in error: try the next
			}
			return 0
		}
		if q.dest == nil && bth.BTH(buf[len(h):]).Opcode() == bth.CNP {
			h = q.cnpHdr.bytes()
		}
		n := d.finish(buf, h, m)
		q.tr.Sent(now, n)
		return n
	}
}

// NextDeadline is the earliest timer deadline of any QP (clock.Never if
// none): the engine sleeps until then unless frames or the doorbell wake
// it. Only QPs with a timer armed are looked at.
func (d *Device) NextDeadline() clock.Time {
	d.takeHandover()
	t := clock.Never
	keep := d.timed[:0]
	for _, q := range d.timed {
		if q.stillTimed() {
			keep = append(keep, q)
			t = clock.Min(t, clock.Time(q.deadline.Load()))
		}
	}
	clear(d.timed[len(keep):])
	d.timed = keep
	return t
}

// Expire runs the timers of every QP whose deadline is at or before now.
func (d *Device) Expire(now clock.Time) {
	d.takeHandover()
	for _, q := range d.timed {
		if clock.Time(q.deadline.Load()) > now {
			continue
		}
		q.mu.Lock()
		q.tr.Expire(now)
		q.releaseEngine()
	}
}

// HasOutput reports whether some QP may have frames to send.
func (d *Device) HasOutput() bool {
	return len(d.ready) > 0 || d.handedOver.Load()
}

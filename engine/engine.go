// Package engine moves RoCEv2 frames between a port.Port and the queue
// pairs of a device: it is the one place where frames are checked on the
// way in and wrapped on the way out.
//
// Receive: a batch from the port; each frame is parsed (frame.Parse, which
// drops TVer ≠ 0 and anything malformed), dropped and counted when its
// P_Key is not 0xFFFF, its DestQP is 0 or unknown, it is not addressed to
// the QP's own address, its source is not the connected peer of an RC/UC
// QP, or its ICRC is wrong (checked last, as it is the dearest), and
// otherwise handed to its QP as a transport packet (BTH to pad). QPs are
// found by BTH DestQP alone, never by UDP port, which is only entropy.
//
// Transmit: QPs with something to send are served round robin, a few
// packets per visit, until a batch is full; each transport packet is built
// straight into the frame buffer after room for Ethernet, IP and UDP, which
// are then written in front of it (DF set, the QP's traffic class and hop
// limit, UDP checksum 0 and a source port derived from the QPNs as rxe
// does), and the ICRC is stamped. A batch the port cannot take at once is
// kept and sent first next time, since the QPs consider it sent.
//
// Timers: each loop runs the QPs' expired deadlines and sleeps in the port
// no longer than until the earliest one.
//
// Concurrency: one engine (one goroutine running Run) per port queue owns
// the port and the frame buffers. Applications post and poll their QPs
// from their own goroutines; the Locker given with each QP serialises them
// with the engine, which takes it once per run of consecutive frames for
// that QP and once per transmit visit, not per packet. Attach and Detach
// publish a new QP table with an atomic pointer, so the per-packet lookup
// takes no lock either.
package engine

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/frame"
	"github.com/softrnic/softrnic/icrc"
	"github.com/softrnic/softrnic/port"
)

// QP is the transport side of one queue pair as the engine drives it; the
// connected transports (transport/rc.QP) implement it as they are. Packets
// are transport packets: BTH through pad, without the ICRC.
type QP interface {
	// Receive processes one checked packet addressed to this QP.
	Receive(now clock.Time, pkt []byte)
	// Build writes the next packet to send into buf and returns its length,
	// 0 when there is nothing to send.
	Build(now clock.Time, buf []byte) int
	// HasOutput reports whether Build would produce a packet now.
	HasOutput() bool
	// Deadline is when Expire must next be called (clock.Never: no timer).
	Deadline() clock.Time
	// Expire runs the timers due at now.
	Expire(now clock.Time)
}

// DatagramQP is a UD QP: every packet it sends names its own destination,
// and every packet it receives comes with its source, which the receive
// completion reports.
type DatagramQP interface {
	QP
	// BuildTo is Build that also returns where the packet goes (the address
	// handle of its work request). The engine does not keep the pointer.
	BuildTo(now clock.Time, buf []byte) (int, *Path)
	// ReceiveFrom is Receive with the packet's source address.
	ReceiveFrom(now clock.Time, pkt []byte, src netip.Addr)
}

// Type is a QP's transport service.
type Type uint8

const (
	RC Type = iota
	UC
	UD
)

// Path is how frames of a QP (or, for UD, of one packet) are addressed.
type Path struct {
	SrcMAC, DstMAC [6]byte
	Src, Dst       netip.Addr // both IPv4 or both IPv6; Dst unused on a UD QP's own Path
	TrafficClass   uint8      // IPv4 TOS / IPv6 traffic class
	HopLimit       uint8      // IPv4 TTL / IPv6 hop limit; 0 means 64
	UDPSrcPort     uint16     // see UDPSourcePort
}

// Attachment is a QP as the engine serves it.
type Attachment struct {
	QPN  uint32
	Type Type
	// Path: for RC and UC the connected peer (only frames from Path.Dst to
	// Path.Src are accepted); for UD the local half (Src, SrcMAC, traffic
	// class, hop limit, source port), the rest coming with each packet.
	Path Path
	QP   QP
	// Lock serialises the engine's calls on QP with the application's.
	// Nil when the QP is only ever touched by the engine goroutine.
	Lock sync.Locker
}

// Counters count what the engine did with frames. Drops are by first
// reason found, in the order checked.
type Counters struct {
	RxFrames    uint64 // frames received from the port
	RxDelivered uint64 // transport packets handed to a QP
	RxNotRoCE   uint64 // not RoCEv2 at all (the steering should not let these in)
	RxMalformed uint64 // RoCEv2 with inconsistent lengths or an unknown opcode
	RxBadTVer   uint64 // BTH transport version not 0
	RxBadPKey   uint64 // P_Key other than 0xFFFF
	RxQP0       uint64 // DestQP 0: no SMI on RoCE
	RxUnknownQP uint64 // no QP with that number
	RxWrongDst  uint64 // not addressed to the QP's own address
	RxWrongPeer uint64 // RC/UC frame from someone other than the connected peer
	RxBadICRC   uint64 // ICRC mismatch
	TxFrames    uint64 // frames the port took
	TxBackPress uint64 // times the port took fewer than offered
	TxErrors    uint64 // packets dropped because they could not be framed
	Loops       uint64 // engine loop iterations
}

// Config configures an engine.
type Config struct {
	Port port.Port
	// Batch is the receive and transmit batch (0: port.BatchSize).
	Batch int
	// Quantum is how many packets one QP may send per round-robin visit
	// (0: 8): large enough to amortise its lock, small enough to be fair.
	Quantum int
	// IdleWait is how long Run naps between polls of the port when there is
	// nothing to do (0: 10 µs): how late an idle engine sees a frame.
	IdleWait time.Duration
	// SpinFor is how long Run keeps polling without napping after the last
	// work it did (0: 2 µs). Spinning longer starves the application and
	// the peer on a small machine: with two cores, 1 ms of spinning made
	// the 64 B SEND half round trip over veth ten times slower, and 50 µs
	// four times slower, than this.
	SpinFor time.Duration
	// DeepIdleAfter is how long without work before Run sleeps in the
	// port instead of napping (0: 10 ms).
	DeepIdleAfter time.Duration
	// Now is the clock (nil: clock.Now).
	Now func() clock.Time
}

type entry struct {
	Attachment
	dgram DatagramQP // nil unless UD
}

// table is an immutable snapshot of the attached QPs.
type table struct {
	byQPN map[uint32]*entry
	list  []*entry
}

// Engine moves frames between one port queue and its QPs.
type Engine struct {
	cfg  Config
	port port.Port

	mu  sync.Mutex // Attach/Detach only
	tbl atomic.Pointer[table]

	kicked   atomic.Bool
	sleeping atomic.Bool
	kickCh   chan struct{}

	// Owned by the engine goroutine.
	f       frame.Frame
	rx      [][]byte
	bufs    [][]byte // transmit buffers, MaxFrame each
	out     [][]byte // frames ready for the port; out[i] is a prefix of bufs[i]
	pending int      // frames in out[:pending] the port has not taken yet
	rr      int      // round-robin position
	ipID    uint16
	c       Counters

	statsMu sync.Mutex
	stats   Counters
}

// New returns an engine for cfg.Port. It allocates all its buffers here.
func New(cfg Config) (*Engine, error) {
	if cfg.Port == nil {
		return nil, errors.New("engine: no port")
	}
	if cfg.Batch <= 0 {
		cfg.Batch = port.BatchSize
	}
	if cfg.Quantum <= 0 {
		cfg.Quantum = 8
	}
	if cfg.IdleWait <= 0 {
		cfg.IdleWait = 10 * time.Microsecond
	}
	if cfg.DeepIdleAfter <= 0 {
		cfg.DeepIdleAfter = 10 * time.Millisecond
	}
	if cfg.SpinFor <= 0 {
		cfg.SpinFor = 2 * time.Microsecond
	}
	if cfg.Now == nil {
		cfg.Now = clock.Now
	}
	mf := cfg.Port.MaxFrame()
	if mf < minFrame {
		return nil, fmt.Errorf("engine: port frames of %d bytes are too small for RoCEv2", mf)
	}
	e := &Engine{cfg: cfg, port: cfg.Port, rx: make([][]byte, cfg.Batch), kickCh: make(chan struct{}, 1),
		bufs: make([][]byte, cfg.Batch), out: make([][]byte, cfg.Batch)}
	for i := range e.bufs {
		e.bufs[i] = make([]byte, mf)
	}
	e.tbl.Store(&table{byQPN: map[uint32]*entry{}})
	return e, nil
}

// minFrame is the smallest useful frame: IPv6 headers, a BTH and an ICRC.
const minFrame = frame.EthernetLen + frame.IPv6Len + frame.UDPLen + 12 + icrc.Len

// Attach starts serving a QP. Its Path must be complete for RC/UC.
func (e *Engine) Attach(a Attachment) error {
	if a.QP == nil || a.QPN == 0 || a.QPN > bth.QPNMask {
		return fmt.Errorf("engine: bad QP %#x", a.QPN)
	}
	if !a.Path.Src.IsValid() {
		return fmt.Errorf("engine: QP %#x has no source address", a.QPN)
	}
	ent := &entry{Attachment: a}
	ent.Path.Src = a.Path.Src.Unmap()
	ent.Path.Dst = a.Path.Dst.Unmap()
	if a.Type == UD {
		d, ok := a.QP.(DatagramQP)
		if !ok {
			return fmt.Errorf("engine: UD QP %#x does not implement DatagramQP", a.QPN)
		}
		ent.dgram = d
	} else if !ent.Path.Dst.IsValid() || ent.Path.Dst.Is4() != ent.Path.Src.Is4() {
		return fmt.Errorf("engine: connected QP %#x needs a peer address of the same family as %v", a.QPN, a.Path.Src)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	old := e.tbl.Load()
	if _, dup := old.byQPN[a.QPN]; dup {
		return fmt.Errorf("engine: QP %#x already attached", a.QPN)
	}
	nt := &table{byQPN: make(map[uint32]*entry, len(old.byQPN)+1), list: make([]*entry, 0, len(old.list)+1)}
	for k, v := range old.byQPN {
		nt.byQPN[k] = v
	}
	nt.byQPN[a.QPN] = ent
	nt.list = append(append(nt.list, old.list...), ent)
	e.tbl.Store(nt)
	e.Kick()
	return nil
}

// Detach stops serving a QP. Frames for it are counted as unknown from the
// next batch on; a batch in progress may still reach it.
func (e *Engine) Detach(qpn uint32) {
	e.mu.Lock()
	defer e.mu.Unlock()
	old := e.tbl.Load()
	if _, ok := old.byQPN[qpn]; !ok {
		return
	}
	nt := &table{byQPN: make(map[uint32]*entry, len(old.byQPN)), list: make([]*entry, 0, len(old.list))}
	for k, v := range old.byQPN {
		if k != qpn {
			nt.byQPN[k] = v
		}
	}
	for _, v := range old.list {
		if v.QPN != qpn {
			nt.list = append(nt.list, v)
		}
	}
	e.tbl.Store(nt)
}

// Kick tells the engine that a QP has new work (a post): a napping engine
// wakes at once. Safe from any goroutine; costs an atomic store, and a
// channel send only when the engine naps.
func (e *Engine) Kick() {
	e.kicked.Store(true)
	if e.sleeping.Load() {
		select {
		case e.kickCh <- struct{}{}:
		default:
		}
	}
}

// Counters returns the counters as of the last loop iteration.
func (e *Engine) Counters() Counters {
	e.statsMu.Lock()
	defer e.statsMu.Unlock()
	return e.stats
}

// Run drives the engine until ctx ends or the port fails. It is the one
// goroutine that owns the port.
//
// Idle policy: after work it keeps polling for SpinFor; then it naps for
// IdleWait at a time on a timer that a Kick cuts short, polling the port
// between naps, so that a post is served at once and a frame within
// IdleWait; after DeepIdleAfter without work it sleeps in the port itself
// (which only a frame wakes, and AF_XDP's poll(2) only to the millisecond),
// which costs a Kick up to that long but no CPU.
func (e *Engine) Run(ctx context.Context) error {
	lastWork := e.cfg.Now()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for ctx.Err() == nil {
		now := e.cfg.Now()
		wait := time.Duration(0)
		if !e.kicked.Swap(false) && e.pending == 0 && now.Sub(lastWork) > e.cfg.SpinFor {
			nap := e.cfg.IdleWait
			if dl := e.nextDeadline(); dl != clock.Never {
				nap = max(0, min(nap, dl.Sub(now)))
			}
			if now.Sub(lastWork) > e.cfg.DeepIdleAfter {
				wait = nap * 20 // the port's own sleep; rounded up to 1 ms by AF_XDP
			} else if nap > 0 {
				e.sleeping.Store(true)
				if !e.kicked.Load() {
					timer.Reset(nap)
					select {
					case <-e.kickCh:
					case <-timer.C:
					case <-ctx.Done():
					}
					timer.Stop()
				}
				e.sleeping.Store(false)
				now = e.cfg.Now()
			}
		}
		worked, err := e.Step(now, wait)
		if err != nil {
			if errors.Is(err, port.ErrClosed) && ctx.Err() != nil {
				return nil
			}
			return err
		}
		if worked {
			lastWork = now
		}
	}
	return nil
}

// Step runs one loop iteration at time now: receive one batch (waiting at
// most wait for it), run expired timers, transmit one batch. It reports
// whether anything was received or sent. Tests and the simulator call it
// directly with virtual time; Run calls it with clock.Now.
func (e *Engine) Step(now clock.Time, wait time.Duration) (bool, error) {
	e.c.Loops++
	tbl := e.tbl.Load()
	n, err := e.port.Recv(e.rx, wait)
	if err != nil {
		return false, err
	}
	if n > 0 {
		// The receive wait may have been long: timestamps of what arrived
		// and of what it triggers are taken after it.
		if wait > 0 {
			now = e.cfg.Now()
		}
		e.receiveBatch(now, tbl, e.rx[:n])
	}
	e.expire(now, tbl)
	sent, err := e.transmit(now, tbl)
	e.publish()
	return n > 0 || sent > 0, err
}

func (e *Engine) publish() {
	e.statsMu.Lock()
	e.stats = e.c
	e.statsMu.Unlock()
}

// receiveBatch checks and delivers a batch, holding each QP's lock across
// a run of consecutive frames for it.
func (e *Engine) receiveBatch(now clock.Time, tbl *table, frames [][]byte) {
	var held *entry
	for _, b := range frames {
		e.c.RxFrames++
		ent, pkt := e.check(tbl, b)
		if ent == nil {
			continue
		}
		if held != ent {
			if held != nil && held.Lock != nil {
				held.Lock.Unlock()
			}
			held = ent
			if held.Lock != nil {
				held.Lock.Lock()
			}
		}
		e.c.RxDelivered++
		if ent.dgram != nil {
			ent.dgram.ReceiveFrom(now, pkt, e.f.Src())
		} else {
			ent.QP.Receive(now, pkt)
		}
	}
	if held != nil && held.Lock != nil {
		held.Lock.Unlock()
	}
}

// check applies every per-frame check, cheapest first, and returns the QP
// and transport packet of an acceptable frame, or nil after counting why not.
func (e *Engine) check(tbl *table, b []byte) (*entry, []byte) {
	if err := frame.Parse(b, &e.f); err != nil {
		switch {
		case frame.IsNotRoCE(err):
			e.c.RxNotRoCE++
		case errors.Is(err, frame.ErrTVer):
			e.c.RxBadTVer++
		default:
			e.c.RxMalformed++
		}
		return nil, nil
	}
	h := e.f.BTH()
	if h.PKey() != bth.DefaultPKey {
		e.c.RxBadPKey++
		return nil, nil
	}
	qpn := h.DestQP()
	if qpn == 0 {
		e.c.RxQP0++
		return nil, nil
	}
	ent := tbl.byQPN[qpn]
	if ent == nil {
		e.c.RxUnknownQP++
		return nil, nil
	}
	if e.f.Dst() != ent.Path.Src {
		e.c.RxWrongDst++
		return nil, nil
	}
	if ent.Type != UD && e.f.Src() != ent.Path.Dst {
		e.c.RxWrongPeer++
		return nil, nil
	}
	if !e.f.VerifyICRC() {
		e.c.RxBadICRC++
		return nil, nil
	}
	ip := e.f.Packet()
	hl := frame.IPv4Len
	if e.f.IsIPv6() {
		hl = frame.IPv6Len
	}
	return ent, ip[hl+frame.UDPLen : len(ip)-icrc.Len]
}

// expire runs the timers that are due.
func (e *Engine) expire(now clock.Time, tbl *table) {
	for _, ent := range tbl.list {
		if ent.Lock != nil {
			ent.Lock.Lock()
		}
		if dl := ent.QP.Deadline(); dl != clock.Never && !now.Before(dl) {
			ent.QP.Expire(now)
		}
		if ent.Lock != nil {
			ent.Lock.Unlock()
		}
	}
}

// nextDeadline is the earliest QP deadline.
func (e *Engine) nextDeadline() clock.Time {
	dl := clock.Never
	for _, ent := range e.tbl.Load().list {
		if ent.Lock != nil {
			ent.Lock.Lock()
		}
		dl = clock.Min(dl, ent.QP.Deadline())
		if ent.Lock != nil {
			ent.Lock.Unlock()
		}
	}
	return dl
}

// transmit sends what the port did not take last time, first, topped up
// to a full batch round robin across the QPs with output.
func (e *Engine) transmit(now clock.Time, tbl *table) (int, error) {
	k := e.pending
	if k < len(e.bufs) && len(tbl.list) > 0 {
		k = e.fill(now, tbl, k)
	}
	if k == 0 {
		return 0, nil
	}
	sent, err := e.port.Send(e.out[:k])
	e.c.TxFrames += uint64(sent)
	if sent < k {
		e.c.TxBackPress++
		// Keep the rest, moved to the front with their buffers.
		for i := 0; i < k-sent; i++ {
			e.bufs[i], e.bufs[sent+i] = e.bufs[sent+i], e.bufs[i]
			e.out[i] = e.bufs[i][:len(e.out[sent+i])]
		}
	}
	e.pending = k - sent
	return sent, err
}

// fill builds frames into bufs[k:] up to a full batch, visiting QPs round
// robin and taking up to Quantum packets from each per visit. It returns
// the number of frames now in out.
func (e *Engine) fill(now clock.Time, tbl *table, k int) int {
	nq := len(tbl.list)
	idle := 0 // consecutive QPs visited without output
	for k < len(e.bufs) && idle < nq {
		e.rr %= nq
		ent := tbl.list[e.rr]
		e.rr++
		got := e.visit(now, ent, k)
		k += got
		if got == 0 {
			idle++
		} else {
			idle = 0
		}
	}
	return k
}

// visit builds up to Quantum frames from one QP into bufs[k:].
func (e *Engine) visit(now clock.Time, ent *entry, k int) int {
	if ent.Lock != nil {
		ent.Lock.Lock()
		defer ent.Lock.Unlock()
	}
	got := 0
	var udPath Path // a UD packet's own path, on the stack
	for got < e.cfg.Quantum && k+got < len(e.bufs) && ent.QP.HasOutput() {
		buf := e.bufs[k+got]
		path := &ent.Path
		hl := headerLen(path.Src)
		var n int
		if ent.dgram != nil {
			var to *Path
			n, to = ent.dgram.BuildTo(now, buf[hl:len(buf)-icrc.Len])
			if n > 0 {
				if to == nil || !to.Dst.IsValid() || to.Dst.Unmap().Is4() != path.Src.Is4() {
					e.c.TxErrors++
					continue
				}
				udPath = Path{SrcMAC: path.SrcMAC, DstMAC: to.DstMAC, Src: path.Src, Dst: to.Dst.Unmap(),
					TrafficClass: to.TrafficClass, HopLimit: to.HopLimit, UDPSrcPort: path.UDPSrcPort}
				path = &udPath
			}
		} else {
			n = ent.QP.Build(now, buf[hl:len(buf)-icrc.Len])
		}
		if n <= 0 {
			break
		}
		size, err := e.wrap(buf, path, n)
		if err != nil {
			e.c.TxErrors++
			continue
		}
		e.out[k+got] = buf[:size]
		got++
	}
	return got
}

// headerLen is the Ethernet, IP and UDP header length for a source address.
func headerLen(src netip.Addr) int {
	if src.Is4() {
		return frame.EthernetLen + frame.IPv4Len + frame.UDPLen
	}
	return frame.EthernetLen + frame.IPv6Len + frame.UDPLen
}

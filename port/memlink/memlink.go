package memlink

import (
	"github.com/softrnic/softrnic/frame"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/port"
)

// Defaults used when a Config field is zero.
const (
	// DefaultMaxFrame holds a 4096-byte RoCE MTU packet with Ethernet, one
	// VLAN tag, IPv6, UDP, BTH, RETH/AtomicETH and ICRC headers, with room.
	DefaultMaxFrame = 4096 + 512
	// DefaultFrames is the number of frame buffers per direction: frames in
	// flight on the wire plus the batch the receiver currently holds.
	DefaultFrames = 1024
	// DefaultReorderDelay is how long a reordered frame is held back beyond
	// its normal delivery time when Impairments.ReorderDelay is zero: long
	// enough for frames sent just after it to overtake it.
	DefaultReorderDelay = 10 * time.Microsecond
)

// Impairments is what a wire does to the frames sent on it. Probabilities are
// per frame, in [0, 1] (values outside are clamped).
type Impairments struct {
	// Loss is the probability that a frame is dropped.
	Loss float64
	// Duplicate is the probability that a delivered frame is delivered twice
	// (the copy gets its own delay, reordering and corruption draws).
	Duplicate float64
	// Reorder is the probability that a frame is held back by ReorderDelay so
	// that later frames overtake it. A reordered frame is never lost by it.
	Reorder float64
	// ReorderDelay is the extra delay of a reordered frame
	// (DefaultReorderDelay if zero).
	ReorderDelay time.Duration
	// Corrupt is the probability that one bit of a frame is flipped: exactly
	// one byte, at an offset in [CorruptSkip, len), changes.
	Corrupt float64
	// CorruptSkip protects the first CorruptSkip bytes of a frame from
	// corruption (e.g. 14 to keep the Ethernet header intact so that the
	// damage lands where a checksum such as the ICRC must catch it).
	CorruptSkip int
	// Delay is the one-way propagation delay.
	Delay time.Duration
	// Jitter spreads each frame's delay uniformly over
	// [Delay-Jitter, Delay+Jitter] (never below zero). Jitter larger than the
	// gap between two frames reorders them, as on a real network.
	Jitter time.Duration

	// CEMark is the probability that an ECN-capable frame (IPv4 or IPv6,
	// ECN field ECT(0) or ECT(1)) is marked CE, as a RED queue between
	// Kmin and Kmax would. Frames that are not ECN-capable, or not IP, are
	// never marked. The IPv4 header checksum is fixed up; the RoCEv2 ICRC
	// masks the TOS byte, so a marked frame stays valid.
	CEMark float64
	// CEQueueRate, when > 0, runs a virtual queue of a bottleneck of this
	// many bits per second: every frame sent adds its length, the queue
	// drains at the rate in the link's time, and an ECN-capable frame that
	// finds more than CEQueueBytes queued is marked CE (a step marker,
	// DCTCP's K). Frames are not delayed by it: the queue is virtual.
	CEQueueRate  float64
	CEQueueBytes int
}

// Config describes a link. The Impairments apply to both directions;
// SetImpairments on a Port changes one direction later.
type Config struct {
	Impairments
	// Seed seeds the random sources of both wires.
	Seed uint64
	// MaxFrame is the largest frame in bytes (DefaultMaxFrame if zero).
	MaxFrame int
	// Frames is the number of buffers per direction (DefaultFrames if
	// zero). When all are in use, Send takes fewer frames than offered:
	// back-pressure, as a full transmit ring would give.
	Frames int
	// Clock, when set, puts the link in virtual time: the link reads the
	// current time from it and Recv never blocks. When nil the link runs in
	// real time on clock.Now.
	Clock func() clock.Time
}

// Stats counts what a wire did. Every counter is cumulative.
type Stats struct {
	Sent       uint64 // frames taken by Send (including lost ones)
	Lost       uint64 // frames dropped by the Loss knob
	Duplicated uint64 // extra copies queued by the Duplicate knob
	Reordered  uint64 // frames (or copies) held back by the Reorder knob
	Corrupted  uint64 // frames (or copies) with one bit flipped
	Delivered  uint64 // frames handed to the receiver by Recv
	Full       uint64 // Lend calls that found fewer free buffers than asked for
	DupNoRoom  uint64 // duplicates not made because no buffer was free
	NotLent    uint64 // frames Submit refused with ErrNotLent
	PeerClosed uint64 // frames discarded because the receiving end was closed
	Marked     uint64 // frames (or copies) marked CE by CEMark or the virtual queue
}

// slot is one frame buffer of a wire.
type slot struct {
	buf  []byte     // full-capacity buffer, MaxFrame bytes
	n    int        // frame length
	at   clock.Time // when the frame becomes deliverable
	seq  uint64     // enqueue order, to keep equal-time frames FIFO
	lent bool       // lent to the sending end, not yet submitted
}

// wire is one direction of the link. Its mutex is taken once per Send or
// Recv batch, never per frame; in virtual time it is uncontended.
type wire struct {
	mu        sync.Mutex
	imp       Impairments
	rng       *rand.Rand
	slots     []slot
	slab      []byte  // every slot's buffer, in order
	free      []int32 // stack of free slot indexes
	due       []int32 // min-heap of queued slots by (at, seq)
	seq       uint64
	stats     Stats
	rxClosed  bool          // receiving end closed: discard what is sent
	kick      chan struct{} // capacity 1: "something was queued"
	maxFrame  int
	virtual   bool
	clockFunc func() clock.Time
	vqBytes   float64    // the CE marker's virtual queue
	vqLast    clock.Time // when vqBytes was last drained
}

// Port is one end of a memlink pair. It implements port.Port: Lend, Submit and Recv
// belong to one goroutine per end; Stats, NextDelivery and SetImpairments
// may be called from any goroutine.
type Port struct {
	tx, rx *wire
	lent   []int32 // slots of the rx wire held by the caller since last Recv
	timer  *time.Timer
	closed atomic.Bool
	done   chan struct{}
	wake   chan struct{} // capacity 1: Wake
	once   sync.Once
}

var (
	_ port.Port  = (*Port)(nil)
	_ port.Waker = (*Port)(nil)
)

// Wake implements port.Waker.
func (p *Port) Wake() error {
	select {
	case p.wake <- struct{}{}:
	default:
	}
	return nil
}

// NewPair returns the two ends of a new link: what a sends, b receives, and
// the other way round.
func NewPair(cfg Config) (a, b *Port) {
	if cfg.MaxFrame <= 0 {
		cfg.MaxFrame = DefaultMaxFrame
	}
	if cfg.Frames <= 0 {
		cfg.Frames = DefaultFrames
	}
	ab := newWire(cfg, 0x6d656d6c696e6b01) // "memlink" + direction
	ba := newWire(cfg, 0x6d656d6c696e6b02)
	return newPort(ab, ba), newPort(ba, ab)
}

// NewLoop returns a port wired to itself: what it sends, it receives, as
// through an RNIC's internal loopback. A device on it reaches its own QPs
// (two applications of one host, a daemon's clients), with the link's
// impairments if configured.
func NewLoop(cfg Config) *Port {
	if cfg.MaxFrame <= 0 {
		cfg.MaxFrame = DefaultMaxFrame
	}
	if cfg.Frames <= 0 {
		cfg.Frames = DefaultFrames
	}
	w := newWire(cfg, 0x6d656d6c696e6b03)
	return newPort(w, w)
}

func newWire(cfg Config, stream uint64) *wire {
	w := &wire{
		imp:       normalise(cfg.Impairments),
		rng:       rand.New(rand.NewPCG(cfg.Seed, stream)),
		slots:     make([]slot, cfg.Frames),
		free:      make([]int32, cfg.Frames),
		due:       make([]int32, 0, cfg.Frames),
		kick:      make(chan struct{}, 1),
		maxFrame:  cfg.MaxFrame,
		virtual:   cfg.Clock != nil,
		clockFunc: cfg.Clock,
	}
	if w.clockFunc == nil {
		w.clockFunc = clock.Now
	}
	// One slab for all buffers: one allocation, good locality.
	slab := make([]byte, cfg.Frames*cfg.MaxFrame)
	w.slab = slab
	for i := range w.slots {
		w.slots[i].buf = slab[i*cfg.MaxFrame : (i+1)*cfg.MaxFrame : (i+1)*cfg.MaxFrame]
		w.free[i] = int32(cfg.Frames - 1 - i) // pop order 0, 1, 2…
	}
	return w
}

func newPort(tx, rx *wire) *Port {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &Port{
		tx:    tx,
		rx:    rx,
		lent:  make([]int32, 0, len(rx.slots)),
		timer: t,
		done:  make(chan struct{}),
		wake:  make(chan struct{}, 1),
	}
}

func clamp01(p float64) float64 {
	if !(p > 0) { // also NaN
		return 0
	}
	if p > 1 {
		return 1
	}
	return p
}

func normalise(imp Impairments) Impairments {
	imp.Loss = clamp01(imp.Loss)
	imp.Duplicate = clamp01(imp.Duplicate)
	imp.Reorder = clamp01(imp.Reorder)
	imp.Corrupt = clamp01(imp.Corrupt)
	if imp.ReorderDelay <= 0 {
		imp.ReorderDelay = DefaultReorderDelay
	}
	imp.CorruptSkip = max(imp.CorruptSkip, 0)
	imp.Delay = max(imp.Delay, 0)
	imp.Jitter = max(imp.Jitter, 0)
	imp.CEMark = clamp01(imp.CEMark)
	if !(imp.CEQueueRate > 0) {
		imp.CEQueueRate = 0
	}
	imp.CEQueueBytes = max(imp.CEQueueBytes, 0)
	return imp
}

// SetImpairments changes what the link does to frames this end sends from
// now on; frames already in flight keep their fate.
func (p *Port) SetImpairments(imp Impairments) {
	p.tx.mu.Lock()
	p.tx.imp = normalise(imp)
	p.tx.mu.Unlock()
}

// Stats returns the counters of the direction this end sends on.
func (p *Port) Stats() Stats {
	p.tx.mu.Lock()
	defer p.tx.mu.Unlock()
	return p.tx.stats
}

// NextDelivery returns when the earliest frame queued towards this end
// becomes deliverable (it may be in the past), or clock.Never if none is
// queued. A virtual-time driver advances its clock to the minimum of this
// and its devices' timer deadlines.
func (p *Port) NextDelivery() clock.Time {
	w := p.rx
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.due) == 0 {
		return clock.Never
	}
	return w.slots[w.due[0]].at
}

// InFlight returns how many frames are queued towards this end and not yet
// received.
func (p *Port) InFlight() int {
	w := p.rx
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.due)
}

// MaxFrame implements port.Port.
func (p *Port) MaxFrame() int { return p.tx.maxFrame }

// Lend implements port.Port: the buffers are free frame buffers of the
// wire this end sends on, so that a frame is built where the link keeps
// it. When all are lent or in flight, Lend lends fewer: back-pressure, as
// a full transmit ring gives.
func (p *Port) Lend(bufs [][]byte) int {
	if p.closed.Load() {
		return 0
	}
	w := p.tx
	w.mu.Lock()
	n := min(len(bufs), len(w.free))
	for i := 0; i < n; i++ {
		k := w.free[len(w.free)-1]
		w.free = w.free[:len(w.free)-1]
		s := &w.slots[k]
		s.lent = true
		bufs[i] = s.buf
	}
	if n < len(bufs) {
		w.stats.Full++
	}
	w.mu.Unlock()
	return n
}

// Submit implements port.Port: it takes every frame, in place. Lost
// frames count as taken, as a real NIC cannot tell that the wire lost
// them.
func (p *Port) Submit(frames [][]byte) (int, error) {
	if p.closed.Load() {
		return 0, port.ErrClosed
	}
	w := p.tx
	w.mu.Lock()
	now := w.clockFunc()
	queued := false
	n := 0
	var err error
	for _, f := range frames {
		k, ok := w.slotOf(f)
		if !ok || !w.slots[k].lent {
			w.stats.NotLent++
			err = port.ErrNotLent
			break
		}
		s := &w.slots[k]
		s.lent = false
		n++
		if len(f) == 0 {
			w.free = append(w.free, k)
			continue
		}
		w.stats.Sent++
		if w.rxClosed {
			w.stats.PeerClosed++
			w.free = append(w.free, k)
			continue
		}
		if w.imp.Loss > 0 && w.rng.Float64() < w.imp.Loss {
			w.stats.Lost++
			w.free = append(w.free, k)
			continue
		}
		s.n = len(f)
		// A duplicate is a copy of the frame as sent, taken before the
		// original is marked or corrupted in place; whether there is one
		// is drawn after the original's draws, as it always was.
		var dup int32 = -1
		if w.imp.Duplicate > 0 && len(w.free) > 0 {
			dup = w.free[len(w.free)-1]
			w.free = w.free[:len(w.free)-1]
			d := &w.slots[dup]
			d.n = copy(d.buf, f)
		}
		w.enqueue(k, now)
		queued = true
		if w.imp.Duplicate > 0 && w.rng.Float64() < w.imp.Duplicate {
			if dup < 0 {
				w.stats.DupNoRoom++
				continue
			}
			w.enqueue(dup, now)
			w.stats.Duplicated++
		} else if dup >= 0 {
			w.free = append(w.free, dup)
		}
	}
	w.mu.Unlock()
	if queued && !w.virtual {
		select {
		case w.kick <- struct{}{}:
		default:
		}
	}
	return n, err
}

// enqueue queues slot i, whose frame is in place, after applying
// corruption, delay and reordering. The caller holds w.mu.
func (w *wire) enqueue(i int32, now clock.Time) {
	s := &w.slots[i]
	imp := &w.imp
	if imp.CEMark > 0 || imp.CEQueueRate > 0 {
		w.mark(s.buf[:s.n], now)
	}
	if imp.Corrupt > 0 && w.rng.Float64() < imp.Corrupt && s.n > imp.CorruptSkip {
		off := imp.CorruptSkip + w.rng.IntN(s.n-imp.CorruptSkip)
		s.buf[off] ^= 1 << w.rng.IntN(8)
		w.stats.Corrupted++
	}
	d := imp.Delay
	if imp.Jitter > 0 {
		d += time.Duration(w.rng.Int64N(2*int64(imp.Jitter)+1)) - imp.Jitter
		d = max(d, 0)
	}
	if imp.Reorder > 0 && w.rng.Float64() < imp.Reorder {
		d += imp.ReorderDelay
		w.stats.Reordered++
	}
	s.at = now.Add(d)
	s.seq = w.seq
	w.seq++
	w.push(i)
}

// mark applies the ECN marker to a frame being queued (w.mu held).
func (w *wire) mark(b []byte, now clock.Time) {
	imp := &w.imp
	over := false
	if imp.CEQueueRate > 0 {
		if now > w.vqLast {
			w.vqBytes = max(0, w.vqBytes-float64(now-w.vqLast)*imp.CEQueueRate/8e9)
			w.vqLast = now
		}
		over = w.vqBytes > float64(imp.CEQueueBytes)
		w.vqBytes += float64(len(b))
	}
	if !frame.ECNCapable(b) {
		return // not ECN-capable, or marked already
	}
	if !over && !(imp.CEMark > 0 && w.rng.Float64() < imp.CEMark) {
		return
	}
	frame.MarkCE(b)
	w.stats.Marked++
}

// less orders the heap by delivery time, then by enqueue order.
func (w *wire) less(a, b int32) bool {
	sa, sb := &w.slots[a], &w.slots[b]
	if sa.at != sb.at {
		return sa.at < sb.at
	}
	return sa.seq < sb.seq
}

func (w *wire) push(i int32) {
	w.due = append(w.due, i) // capacity is len(slots): never grows
	h := w.due
	c := len(h) - 1
	for c > 0 {
		p := (c - 1) / 2
		if !w.less(h[c], h[p]) {
			break
		}
		h[c], h[p] = h[p], h[c]
		c = p
	}
}

func (w *wire) pop() int32 {
	h := w.due
	top := h[0]
	last := len(h) - 1
	h[0] = h[last]
	h = h[:last]
	w.due = h
	p := 0
	for {
		l := 2*p + 1
		if l >= len(h) {
			break
		}
		c := l
		if r := l + 1; r < len(h) && w.less(h[r], h[l]) {
			c = r
		}
		if !w.less(h[c], h[p]) {
			break
		}
		h[c], h[p] = h[p], h[c]
		p = c
	}
	return top
}

// Recv implements port.Port. In virtual time it returns at once with the
// frames due at the clock's current time; in real time it waits up to
// timeout for the first due frame.
func (p *Port) Recv(frames [][]byte, timeout time.Duration) (int, error) {
	if p.closed.Load() {
		return 0, port.ErrClosed
	}
	w := p.rx
	var deadline clock.Time
	first := true
	for {
		w.mu.Lock()
		if first {
			// The previous batch's views expire now: recycle their slots.
			w.free = append(w.free, p.lent...)
			p.lent = p.lent[:0]
		}
		now := w.clockFunc()
		if first {
			deadline = now.Add(timeout)
			first = false
		}
		n := 0
		for n < len(frames) && len(w.due) > 0 && w.slots[w.due[0]].at <= now {
			i := w.pop()
			s := &w.slots[i]
			frames[n] = s.buf[:s.n:s.n]
			p.lent = append(p.lent, i)
			n++
		}
		w.stats.Delivered += uint64(n)
		next := clock.Never
		if len(w.due) > 0 {
			next = w.slots[w.due[0]].at
		}
		w.mu.Unlock()
		if n > 0 || w.virtual || len(frames) == 0 || !now.Before(deadline) {
			return n, nil
		}
		wait := min(deadline, next).Sub(now)
		p.timer.Reset(wait)
		select {
		case <-w.kick:
			p.timer.Stop()
		case <-p.wake:
			p.timer.Stop()
			return 0, nil
		case <-p.timer.C:
		case <-p.done:
			p.timer.Stop()
			return 0, port.ErrClosed
		}
	}
}

// Close implements port.Port. Frames queued towards this end are discarded,
// and frames the peer sends afterwards are counted as PeerClosed and dropped,
// as a cable to a powered-off host would. A blocked Recv returns ErrClosed.
func (p *Port) Close() error {
	p.once.Do(func() {
		p.closed.Store(true)
		close(p.done)
		w := p.rx
		w.mu.Lock()
		w.rxClosed = true
		w.free = append(w.free, p.lent...)
		p.lent = p.lent[:0]
		w.free = append(w.free, w.due...)
		w.due = w.due[:0]
		w.mu.Unlock()
	})
	return nil
}

// VirtualClock is a settable clock for virtual-time links and tests. Its
// Now method is what Config.Clock wants. It is safe for concurrent use.
type VirtualClock struct{ t atomic.Int64 }

// Now returns the clock's current time.
func (c *VirtualClock) Now() clock.Time { return clock.Time(c.t.Load()) }

// Set moves the clock to t.
func (c *VirtualClock) Set(t clock.Time) { c.t.Store(int64(t)) }

// Advance moves the clock forward by d.
func (c *VirtualClock) Advance(d time.Duration) { c.t.Add(int64(d)) }

package rnic

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/softrnic/softrnic/ib"
)

// Errors returned by the verbs.
var (
	ErrInvalid      = errors.New("rnic: invalid argument")
	ErrState        = errors.New("rnic: illegal QP state transition")
	ErrQPState      = errors.New("rnic: QP state does not allow this")
	ErrQueueFull    = errors.New("rnic: work queue full")
	ErrTooManySGE   = errors.New("rnic: too many scatter/gather entries")
	ErrInlineSize   = errors.New("rnic: inline data larger than max_inline_data")
	ErrBadOpcode    = errors.New("rnic: opcode not supported by this QP type")
	ErrAccess       = errors.New("rnic: invalid access flags")
	ErrDestroyed    = errors.New("rnic: object destroyed")
	ErrNoRecvQueue  = errors.New("rnic: QP uses an SRQ; post receives there")
	ErrKeySpace     = errors.New("rnic: could not draw a fresh key")
	ErrNotSupported = errors.New("rnic: not supported")
)

// Limits of the device, as an RNIC reports them in ibv_query_device.
const (
	MaxMsgSize   = 1 << 31
	MaxSGE       = 32
	MaxQPWR      = 16384
	MaxInline    = 400
	MaxRdAtomic  = 128
	DefaultDepth = 256
	// MaxUnackedPSNs is the RC window of a requester (as rxe's).
	MaxUnackedPSNs = 128
)

// PD is a protection domain: MRs and QPs of different PDs cannot touch
// each other.
type PD struct {
	dev *Device
}

// AllocPD creates a protection domain.
func (d *Device) AllocPD() *PD { return &PD{dev: d} }

// MR is a memory region over caller memory.
type MR struct {
	pd     *PD
	buf    []byte
	iova   uint64
	access ib.Access
	lkey   uint32
	rkey   uint32
	valid  atomic.Bool
}

// LKey is the local key used in scatter/gather entries.
func (m *MR) LKey() uint32 { return m.lkey }

// RKey is the key a peer names the MR with.
func (m *MR) RKey() uint32 { return m.rkey }

// IOVA is the virtual address of the MR's first byte.
func (m *MR) IOVA() uint64 { return m.iova }

// Len is the MR's length in bytes.
func (m *MR) Len() int { return len(m.buf) }

// Bytes returns the registered memory.
func (m *MR) Bytes() []byte { return m.buf }

// Valid reports whether the MR may still be used (not deregistered or
// invalidated by a SEND_WITH_INV).
func (m *MR) Valid() bool { return m.valid.Load() }

// RegMR registers buf with the given access; its IOVA is buf's address, as
// ibv_reg_mr uses the virtual address.
func (pd *PD) RegMR(buf []byte, access ib.Access) (*MR, error) {
	var iova uint64
	if len(buf) > 0 {
		iova = uint64(uintptr(unsafe.Pointer(&buf[0])))
	}
	return pd.RegMRIOVA(buf, iova, access)
}

// RegMRIOVA registers buf at a chosen virtual address (ibv_reg_mr_iova).
func (pd *PD) RegMRIOVA(buf []byte, iova uint64, access ib.Access) (*MR, error) {
	// IBA: remote write or atomic access requires local write.
	if !access.ValidForMR() {
		return nil, ErrAccess
	}
	if iova+uint64(len(buf)) < iova {
		return nil, ErrInvalid
	}
	m := &MR{pd: pd, buf: buf, iova: iova, access: access}
	m.valid.Store(true)
	d := pd.dev
	d.mu.Lock()
	defer d.mu.Unlock()
	old := *d.keys.Load()
	var err error
	if m.lkey, err = freshKey(old); err != nil {
		return nil, err
	}
	nk := make(map[uint32]*MR, len(old)+2)
	for k, v := range old {
		nk[k] = v
	}
	nk[m.lkey] = m
	if m.rkey, err = freshKey(nk); err != nil {
		return nil, err
	}
	nk[m.rkey] = m
	d.keys.Store(&nk)
	return m, nil
}

// freshKey draws 32 random bits not in use (and not 0): keys must not be
// guessable from earlier ones, which a counter would be.
func freshKey(used map[uint32]*MR) (uint32, error) {
	var b [4]byte
	for i := 0; i < 64; i++ {
		if _, err := rand.Read(b[:]); err != nil {
			return 0, err
		}
		k := binary.LittleEndian.Uint32(b[:])
		if _, dup := used[k]; k != 0 && !dup {
			return k, nil
		}
	}
	return 0, ErrKeySpace
}

// Dereg deregisters the MR: its keys stop working at once.
func (m *MR) Dereg() {
	m.valid.Store(false)
	d := m.pd.dev
	d.mu.Lock()
	defer d.mu.Unlock()
	old := *d.keys.Load()
	nk := make(map[uint32]*MR, len(old))
	for k, v := range old {
		if v != m {
			nk[k] = v
		}
	}
	d.keys.Store(&nk)
}

// lookup returns the MR named by key if it is valid and in pd.
func (d *Device) lookup(key uint32, pd *PD) *MR {
	m := (*d.keys.Load())[key]
	if m == nil || m.pd != pd || !m.valid.Load() {
		return nil
	}
	return m
}

// slice returns [va, va+n) of m when it lies inside the MR.
func (m *MR) slice(va, n uint64) ([]byte, bool) {
	if va < m.iova || va+n < va || va+n > m.iova+uint64(len(m.buf)) {
		return nil, false
	}
	off := va - m.iova
	return m.buf[off : off+n : off+n], true
}

// CQ is a completion queue.
//
// A CQ that is full when a completion arrives is overrun. As on an IBA
// RNIC (and rxe), that is an error, never a silent drop: the CQ enters
// the error state (Err reports ErrCQOverrun, Wait returns it once the
// completions queued before the overrun have been polled), the device
// counts it (CQOverruns) and reports EventCQErr, and every QP using the
// CQ moves to ERR (EventQPFatal) so that its peer and its application stop
// instead of waiting for a completion that was lost. Completions already
// queued stay valid and can be polled; later ones are counted (Overflows)
// and discarded. An application avoids this by sizing its CQ for every
// WR it may have outstanding on the QPs that share it.
type CQ struct {
	dev      *Device
	mu       sync.Mutex
	ring     []ib.WC
	head, n  int
	overflow uint64
	notify   chan struct{}
	// overrun is set once, under mu, and read without it by the QPs
	// using the CQ (QP.unlock), which then move to ERR.
	overrun atomic.Bool
}

// ErrCQOverrun is the error of a CQ that overflowed (IBV_EVENT_CQ_ERR):
// completions were lost, the CQ is unusable and its QPs are in ERR.
var ErrCQOverrun = errors.New("rnic: CQ overrun: completions were lost; the CQ and its QPs are in error")

// CreateCQ creates a CQ holding up to depth completions.
func (d *Device) CreateCQ(depth int) *CQ {
	if depth < 1 {
		depth = DefaultDepth
	}
	return &CQ{dev: d, ring: make([]ib.WC, depth), notify: make(chan struct{}, 1)}
}

// Poll moves up to len(out) completions into out, oldest first, and
// returns how many. After an overrun it still returns the completions
// queued before it; Err tells the application that others were lost.
func (c *CQ) Poll(out []ib.WC) int {
	c.mu.Lock()
	k := 0
	for k < len(out) && c.n > 0 {
		out[k] = c.ring[c.head]
		c.head = (c.head + 1) % len(c.ring)
		c.n--
		k++
	}
	c.mu.Unlock()
	return k
}

// Err is ErrCQOverrun once the CQ has overflowed, nil before.
func (c *CQ) Err() error {
	if c.overrun.Load() {
		return ErrCQOverrun
	}
	return nil
}

// Notify returns a channel that receives a value whenever completions
// arrive (a coalescing doorbell: one value may stand for many), and when
// the CQ is overrun.
func (c *CQ) Notify() <-chan struct{} { return c.notify }

// Wait polls, blocking until at least one completion is there or ctx ends.
// A CQ in error returns ErrCQOverrun once its queued completions are
// polled, rather than blocking for completions that will never come.
func (c *CQ) Wait(ctx context.Context, out []ib.WC) (int, error) {
	for {
		if n := c.Poll(out); n > 0 {
			return n, nil
		}
		if err := c.Err(); err != nil {
			return 0, err
		}
		select {
		case <-c.notify:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// Overflows counts completions lost because the CQ was full or already in
// error (each one is part of an overrun, see CQ).
func (c *CQ) Overflows() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.overflow
}

// push appends the completions of wcs whose IsRecv equals recv. The first
// one that finds the CQ full puts it in error (see CQ) and reports it.
func (c *CQ) push(wcs []ib.WC, recv bool) {
	added, overran := false, false
	c.mu.Lock()
	for i := range wcs {
		if wcs[i].IsRecv != recv {
			continue
		}
		if c.n == len(c.ring) || c.overrun.Load() {
			c.overflow++
			if !c.overrun.Load() {
				c.overrun.Store(true)
				overran = true
			}
			continue
		}
		c.ring[(c.head+c.n)%len(c.ring)] = wcs[i]
		c.n++
		added = true
	}
	c.mu.Unlock()
	if overran && c.dev != nil {
		c.dev.cqOverrun(c)
	}
	if added || overran {
		select {
		case c.notify <- struct{}{}:
		default:
		}
	}
}

// CQOverruns counts the CQs of the device that overflowed (safe from any
// goroutine).
func (d *Device) CQOverruns() uint64 { return d.cqOverruns.Load() }

// cqOverrun reports c's overrun (EventCQErr) and hands every QP using c to
// the engine, whose next visit (QP.unlock) moves it to ERR; the QP whose
// completion overran c is moved there by the same unlock that pushed it.
// It may run under that QP's lock: it takes no QP lock itself.
func (d *Device) cqOverrun(c *CQ) {
	d.cqOverruns.Add(1)
	d.asyncEvent(AsyncEvent{Type: ib.EventCQErr, CQ: c})
	for _, q := range *d.list.Load() {
		if q.init.SendCQ != c && q.init.RecvCQ != c || q.destroyed.Load() {
			continue
		}
		if q.queued.CompareAndSwap(false, true) {
			d.handOver(q, true, false)
		}
	}
	d.ring()
}

// recvRing is a QP's receive queue; guarded by the QP's mutex.
type recvRing struct {
	ring       []ib.RecvWQE
	head, tail uint32
}

func newRecvRing(depth, maxSGE int) recvRing {
	r := recvRing{ring: make([]ib.RecvWQE, depth)}
	for i := range r.ring {
		r.ring[i].SG = make([]ib.Seg, 0, maxSGE)
	}
	return r
}

func (r *recvRing) full() bool { return r.tail-r.head >= uint32(len(r.ring)) }

func (r *recvRing) put(w *ib.RecvWQE) {
	e := &r.ring[r.tail%uint32(len(r.ring))]
	sg := append(e.SG[:0], w.SG...)
	*e = *w
	e.SG = sg
	r.tail++
}

// Take implements ib.RecvQueue.
func (r *recvRing) Take(dst *ib.RecvWQE) bool {
	if r.head == r.tail {
		return false
	}
	e := &r.ring[r.head%uint32(len(r.ring))]
	sg := append(dst.SG[:0], e.SG...)
	*dst = *e
	dst.SG = sg
	e.SG = e.SG[:0]
	r.head++
	return true
}

// SRQ is a shared receive queue: QPs attached to it take their receive
// WQEs from it in posting order.
type SRQ struct {
	pd     *PD
	maxSGE int
	mu     sync.Mutex
	rq     recvRing
	post   ib.RecvWQE // PostRecv scratch, guarded by mu
	postSG [MaxSGE]ib.Seg
}

// CreateSRQ creates a shared receive queue.
func (pd *PD) CreateSRQ(depth, maxSGE int) (*SRQ, error) {
	if depth < 1 || depth > MaxQPWR || maxSGE < 1 || maxSGE > MaxSGE {
		return nil, ErrInvalid
	}
	return &SRQ{pd: pd, maxSGE: maxSGE, rq: newRecvRing(depth, maxSGE)}, nil
}

// Take implements ib.RecvQueue (called by the engine under the QP lock).
func (s *SRQ) Take(dst *ib.RecvWQE) bool {
	s.mu.Lock()
	ok := s.rq.Take(dst)
	s.mu.Unlock()
	return ok
}

// PostRecv posts receive WRs to the SRQ and returns how many it took.
func (s *SRQ) PostRecv(wrs ...RecvWR) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w, sg := &s.post, s.postSG[:0]
	for i := range wrs {
		if len(wrs[i].SG) > s.maxSGE {
			return i, ErrTooManySGE
		}
		if s.rq.full() {
			return i, ErrQueueFull
		}
		s.pd.dev.resolveRecv(s.pd, &wrs[i], w, sg)
		s.rq.put(w)
	}
	return len(wrs), nil
}

// RecvWR is a receive work request.
type RecvWR struct {
	ID uint64
	SG []ib.SGE
}

// resolveRecv turns a receive WR's SGEs into memory, checking lkey, PD,
// bounds and local write access; a failure is recorded in the WQE and
// reported when a message uses it (LOC_PROT_ERR), as an RNIC does.
func (d *Device) resolveRecv(pd *PD, r *RecvWR, w *ib.RecvWQE, sg []ib.Seg) {
	w.ID, w.Err, w.Length = r.ID, ib.Success, 0
	for _, s := range r.SG {
		m := d.lookup(s.LKey, pd)
		var b []byte
		ok := m != nil && m.access&ib.LocalWrite != 0
		if ok {
			b, ok = m.slice(s.Addr, uint64(s.Length))
		}
		if !ok {
			w.Err = ib.LocProtErr
			continue
		}
		sg = append(sg, ib.LocalSeg(b))
		w.Length += s.Length
	}
	w.SG = sg
}

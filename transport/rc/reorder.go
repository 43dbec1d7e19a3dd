package rc

import (
	"sync"

	"github.com/softrnic/softrnic/bth"
)

// SRWindow is the selective-repeat window in PSNs, a constant of the
// protocol between two softrnic QPs: a selective-repeat responder holds
// requests up to SRWindow-1 PSNs beyond the one it expects, and a
// selective-repeat requester never has more than SRWindow PSNs
// unacknowledged, so whatever it sends fits what the responder may hold.
// A requester holds READ responses within the same distance of the oldest
// PSN it waits for.
const SRWindow = 512

// ReorderPool is the per-device budget of packet buffers in which
// selective-repeat QPs hold packets that arrived out of order until the
// missing ones come. Holding, rather than placing a WRITE's payload at once,
// keeps data placement in PSN order (an application polling the last byte
// of a WRITE still sees the bytes before it) and lets every check (rkey,
// bounds, opcode sequence, receive WQE) run on the in-order path that also
// serves go-back-N peers. A packet that finds the pool empty is dropped and
// retransmitted later, as on any loss.
//
// The pool is shared by the QPs of a device, which the device may drive
// from different goroutines, so it takes a lock; it is touched only when a
// packet arrives out of order and when a held one is released, never on
// the in-order path.
type ReorderPool struct {
	mu    sync.Mutex
	size  int // bytes per buffer
	limit int // buffers at most
	n     int // buffers allocated so far
	free  [][]byte
	inUse int
}

// reorderChunk is how many buffers the pool allocates at a time: it grows
// to its peak once and then reuses, so a steady loss rate allocates nothing.
const reorderChunk = 64

// NewReorderPool returns a pool of up to buffers packets of at most
// packetLen bytes each (PacketLen of the largest path MTU its QPs use).
// Memory is taken as the pool first needs it.
func NewReorderPool(packetLen, buffers int) *ReorderPool {
	return &ReorderPool{size: packetLen, limit: buffers}
}

// PacketLen is the largest packet a buffer holds.
func (p *ReorderPool) PacketLen() int { return p.size }

// InUse is the number of buffers holding a packet now.
func (p *ReorderPool) InUse() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.inUse
}

func (p *ReorderPool) get() []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.free) == 0 {
		k := min(reorderChunk, p.limit-p.n)
		if k <= 0 {
			return nil
		}
		chunk := make([]byte, k*p.size)
		for i := 0; i < k; i++ {
			p.free = append(p.free, chunk[i*p.size:(i+1)*p.size:(i+1)*p.size])
		}
		p.n += k
	}
	b := p.free[len(p.free)-1]
	p.free = p.free[:len(p.free)-1]
	p.inUse++
	return b
}

func (p *ReorderPool) put(b []byte) {
	p.mu.Lock()
	p.free = append(p.free, b[:cap(b)])
	p.inUse--
	p.mu.Unlock()
}

// putAll hands back every buffer of bs under one acquisition of the lock.
func (p *ReorderPool) putAll(bs [][]byte) {
	p.mu.Lock()
	for _, b := range bs {
		p.free = append(p.free, b[:cap(b)])
	}
	p.inUse -= len(bs)
	p.mu.Unlock()
}

// heldPkt is one packet held out of order.
type heldPkt struct {
	psn bth.PSN
	buf []byte // pool buffer, nil when the slot is empty
	n   int    // packet length
}

// holdRing is one QP side's held packets, indexed by PSN modulo SRWindow:
// the window keeps every held PSN within SRWindow of the oldest missing
// one, so two never share a slot.
type holdRing struct {
	slots []heldPkt
	n     int     // packets held
	high  bth.PSN // highest PSN held (valid while n > 0)
}

func (h *holdRing) init() {
	if h.slots == nil {
		h.slots = make([]heldPkt, SRWindow)
	}
}

func (h *holdRing) slot(p bth.PSN) *heldPkt { return &h.slots[uint32(p)%SRWindow] }

// has reports whether p is held.
func (h *holdRing) has(p bth.PSN) bool {
	if h.n == 0 {
		return false
	}
	s := h.slot(p)
	return s.buf != nil && s.psn == p
}

// hold copies pkt in as PSN p from the pool. It reports false, keeping
// nothing, when the pool is exhausted or p's slot is taken.
func (h *holdRing) hold(pool *ReorderPool, p bth.PSN, pkt []byte) bool {
	if pool == nil || len(pkt) > pool.size {
		return false
	}
	s := h.slot(p)
	if s.buf != nil {
		return false
	}
	b := pool.get()
	if b == nil {
		return false
	}
	s.psn, s.buf, s.n = p, b, copy(b, pkt)
	if h.n == 0 || h.high.Less(p) {
		h.high = p
	}
	h.n++
	return true
}

// take returns the packet held as p (nil if none); the caller hands the
// buffer back with QP.spend once it has processed it.
func (h *holdRing) take(p bth.PSN) []byte {
	if !h.has(p) {
		return nil
	}
	s := h.slot(p)
	b := s.buf[:s.n]
	s.buf = nil
	h.n--
	return b
}

// drop releases every held packet before end (all of them when all).
func (h *holdRing) dropBefore(pool *ReorderPool, end bth.PSN, all bool) {
	if h.n == 0 {
		return
	}
	for i := range h.slots {
		s := &h.slots[i]
		if s.buf != nil && (all || s.psn.Less(end)) {
			pool.put(s.buf)
			s.buf = nil
			h.n--
		}
	}
}

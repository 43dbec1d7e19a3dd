package rnic

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/verbs"
)

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
	destroyed atomic.Bool
	users     atomic.Int32 // QPs attached and not destroyed
	pd        *PD
	maxSGE    int
	mu        sync.Mutex
	rq        recvRing
	limit     uint32     // armed low watermark, 0: none (guarded by mu)
	backlog   func() int // receives posted that have not reached it yet (SetBacklog)
	post      ib.RecvWQE // PostRecv scratch, guarded by mu
	postSG    [MaxSGE]ib.Seg
}

// SetBacklog tells the SRQ where receives posted to it wait before they
// reach it (the daemon's SRQ ring): backlog says how many, from any
// goroutine, and the limit counts them with those the SRQ holds. Call it
// before any QP uses the SRQ.
func (s *SRQ) SetBacklog(backlog func() int) { s.backlog = backlog }

var _ verbs.SRQ = (*SRQ)(nil)

// CreateSRQ creates a shared receive queue of maxWR receives of at most
// maxSGE entries each (ibv_create_srq).
func (pd *PD) CreateSRQ(maxWR, maxSGE int) (verbs.SRQ, error) {
	if maxWR < 1 || maxWR > MaxQPWR || maxSGE < 1 || maxSGE > MaxSGE {
		return nil, fmt.Errorf("rnic: create SRQ: max_wr %d (1 to %d), max_sge %d (1 to %d): %w",
			maxWR, MaxQPWR, maxSGE, MaxSGE, verbs.ErrInvalid)
	}
	return &SRQ{pd: pd, maxSGE: maxSGE, rq: newRecvRing(maxWR, maxSGE)}, nil
}

// Destroy destroys the SRQ (ibv_destroy_srq): refused while QPs use it.
// Receives still posted are dropped.
func (s *SRQ) Destroy() error {
	if n := s.users.Load(); n > 0 {
		return fmt.Errorf("rnic: destroy SRQ: %d QPs use it: %w", n, verbs.ErrBusy)
	}
	s.destroyed.Store(true)
	return nil
}

// Modify arms (or, with 0, disarms) the SRQ's limit (ibv_modify_srq).
// Resizing is not supported: the device does not report
// IBV_DEVICE_SRQ_RESIZE, and refuses it as mlx5 does.
func (s *SRQ) Modify(attr *ib.SRQAttr, mask ib.SRQAttrMask) error {
	if s.destroyed.Load() {
		return verbs.ErrDestroyed
	}
	if mask&^(ib.SRQMaxWR|ib.SRQLimit) != 0 {
		return fmt.Errorf("rnic: modify SRQ: unknown attribute mask %#x: %w", uint32(mask), verbs.ErrInvalid)
	}
	if mask&ib.SRQMaxWR != 0 {
		return fmt.Errorf("rnic: modify SRQ: resizing an SRQ is not supported: %w", verbs.ErrInvalid)
	}
	if mask&ib.SRQLimit == 0 {
		return nil
	}
	if attr.Limit > uint32(len(s.rq.ring)) {
		return fmt.Errorf("rnic: modify SRQ: limit %d above its %d WRs: %w", attr.Limit, len(s.rq.ring), verbs.ErrInvalid)
	}
	s.mu.Lock()
	s.limit = attr.Limit
	s.mu.Unlock()
	return nil
}

// Query returns the SRQ's size and armed limit (ibv_query_srq).
func (s *SRQ) Query() (ib.SRQAttr, error) {
	if s.destroyed.Load() {
		return ib.SRQAttr{}, verbs.ErrDestroyed
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return ib.SRQAttr{MaxWR: uint32(len(s.rq.ring)), MaxSGE: uint32(s.maxSGE), Limit: s.limit}, nil
}

// Take implements ib.RecvQueue (called by the engine under the QP lock).
// Taking the receive that leaves fewer than the armed limit reports
// EventSRQLimitReached and disarms the limit, as IBA and rxe do.
func (s *SRQ) Take(dst *ib.RecvWQE) bool {
	s.mu.Lock()
	ok := s.rq.Take(dst)
	fire := false
	if ok && s.limit != 0 {
		left := s.rq.tail - s.rq.head
		if s.backlog != nil {
			left += uint32(s.backlog())
		}
		if fire = left < s.limit; fire {
			s.limit = 0
		}
	}
	s.mu.Unlock()
	if fire {
		s.pd.dev.asyncEvent(verbs.AsyncEvent{Type: ib.EventSRQLimitReached, SRQ: s})
	}
	return ok
}

// PostRecv posts receive WRs to the SRQ and returns how many it took.
func (s *SRQ) PostRecv(wrs []verbs.RecvWR) (int, error) {
	if s.destroyed.Load() && len(wrs) > 0 {
		return 0, &verbs.WRError{Queue: verbs.QueueSRQ, ID: wrs[0].ID, Detail: "the SRQ is destroyed", Err: verbs.ErrDestroyed}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	w, sg := &s.post, s.postSG[:0]
	for i := range wrs {
		if len(wrs[i].SG) > s.maxSGE {
			return i, &verbs.WRError{Queue: verbs.QueueSRQ, Index: i, ID: wrs[i].ID,
				Detail: fmt.Sprintf("%d SGEs, max_sge %d", len(wrs[i].SG), s.maxSGE), Err: verbs.ErrTooManySGE}
		}
		if s.rq.full() {
			return i, verbs.ErrQueueFull
		}
		s.pd.dev.resolveRecv(s.pd, &wrs[i], w, sg)
		s.rq.put(w)
	}
	return len(wrs), nil
}

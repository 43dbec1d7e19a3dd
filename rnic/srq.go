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
	pd        *PD
	maxSGE    int
	mu        sync.Mutex
	rq        recvRing
	post      ib.RecvWQE // PostRecv scratch, guarded by mu
	postSG    [MaxSGE]ib.Seg
}

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

// Destroy destroys the SRQ; QPs using it must be destroyed first
// (ibv_destroy_srq). Receives still posted are dropped.
func (s *SRQ) Destroy() error {
	s.destroyed.Store(true)
	return nil
}

// Take implements ib.RecvQueue (called by the engine under the QP lock).
func (s *SRQ) Take(dst *ib.RecvWQE) bool {
	s.mu.Lock()
	ok := s.rq.Take(dst)
	s.mu.Unlock()
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

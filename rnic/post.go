package rnic

import (
	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/ib"
)

// SendWR is a send work request (ibv_send_wr).
type SendWR struct {
	ID     uint64
	Opcode ib.WROpcode
	Flags  ib.SendFlags
	SG     []ib.SGE
	// InlineData, with the Inline flag, is copied at post time instead of
	// SG (up to MaxInline bytes); the buffer may be reused at once.
	InlineData []byte
	Imm        uint32 // immediate data (the value the receiver sees)
	InvRKey    uint32 // SEND_WITH_INV
	RemoteAddr uint64 // RDMA and atomics
	RKey       uint32
	CompareAdd uint64 // CMP_AND_SWP compare value, FETCH_AND_ADD addend
	Swap       uint64 // CMP_AND_SWP swap value
	// UD
	AH         *AH
	RemoteQPN  uint32
	RemoteQKey uint32 // high bit set: use the QP's Q_Key
}

// PostSend posts send WRs and returns how many it took; on error the rest
// were not posted (ibv_post_send's bad_wr).
func (q *QP) PostSend(wrs ...SendWR) (int, error) {
	n, err := func() (int, error) {
		q.mu.Lock()
		defer q.release()
		return q.postSend(wrs)
	}()
	if n > 0 {
		// Only now: release has handed the QP over, so the engine the
		// doorbell wakes finds it. Rung before (from inside the locked
		// section), the engine could step, find nothing, and nap again
		// while the handover was still to come.
		q.dev.ring()
	}
	return n, err
}

// postSend is PostSend's work under q.mu.
func (q *QP) postSend(wrs []SendWR) (int, error) {
	w, sg := &q.postWQE, q.postSG[:0]
	if q.destroyed.Load() {
		return 0, ErrDestroyed
	}
	for i := range wrs {
		s := &wrs[i]
		if q.state != ib.RTS && q.state != ib.SQD && q.state != ib.SQE && q.state != ib.Err {
			return i, ErrQPState
		}
		if err := q.checkSend(s); err != nil {
			return i, err
		}
		if q.tr.SendQueueFree() == 0 {
			return i, ErrQueueFull
		}
		if q.state == ib.Err || q.state == ib.SQE {
			q.pushWC(ib.WC{ID: s.ID, Status: ib.WRFlushErr, Opcode: wcOpcode(s.Opcode), QPN: q.qpn})
			continue
		}
		q.resolveSend(s, w, sg)
		q.tr.Post(w)
	}
	q.txPending.Store(true)
	return len(wrs), nil
}

func wcOpcode(o ib.WROpcode) ib.WCOpcode {
	switch o {
	case ib.RDMAWrite, ib.RDMAWriteWithImm:
		return ib.WCRDMAWrite
	case ib.RDMARead:
		return ib.WCRDMARead
	case ib.AtomicCmpAndSwp:
		return ib.WCCompSwap
	case ib.AtomicFetchAndAdd:
		return ib.WCFetchAdd
	}
	return ib.WCSend
}

func (q *QP) checkSend(s *SendWR) error {
	t := q.init.Type
	switch {
	case !s.Opcode.Valid():
		return ErrBadOpcode
	case t.Datagram() && s.Opcode != ib.Send && s.Opcode != ib.SendWithImm:
		return ErrBadOpcode
	case t == ib.UC && (s.Opcode == ib.RDMARead || s.Opcode.IsAtomic()):
		return ErrBadOpcode
	case t.Datagram() && s.AH == nil:
		return ErrInvalid
	case len(s.SG) > q.init.MaxSGE:
		return ErrTooManySGE
	case s.Flags&ib.Inline != 0 && (len(s.InlineData) > q.init.MaxInline || s.Opcode == ib.RDMARead || s.Opcode.IsAtomic()):
		return ErrInlineSize
	}
	if s.Opcode.IsAtomic() {
		n := uint32(0)
		for _, g := range s.SG {
			n += g.Length
		}
		if n != 8 {
			return ErrInvalid
		}
	}
	return nil
}

// resolveSend turns a send WR into a WQE, resolving the SGEs against the
// QP's PD. A bad lkey or bound is not an error of the post (an RNIC finds
// it when it processes the WQE): the WQE carries LOC_PROT_ERR and
// completes with it in order, and the QP goes to ERR.
func (q *QP) resolveSend(s *SendWR, w *ib.SendWQE, sg []ib.Seg) {
	*w = ib.SendWQE{ID: s.ID, Opcode: s.Opcode, Flags: s.Flags, Imm: s.Imm, InvRKey: s.InvRKey,
		RemoteAddr: s.RemoteAddr, RKey: s.RKey, RemoteQPN: s.RemoteQPN & bth.QPNMask, RemoteQKey: s.RemoteQKey}
	if q.init.SigAll {
		w.Flags |= ib.Signaled
	}
	switch s.Opcode {
	case ib.AtomicCmpAndSwp:
		w.Compare, w.SwapAdd = s.CompareAdd, s.Swap
	case ib.AtomicFetchAndAdd:
		w.SwapAdd = s.CompareAdd
	}
	if s.AH != nil {
		w.AH = &s.AH.ah
	}
	if s.Flags&ib.Inline != 0 {
		// Inline data is copied now so the caller may reuse its buffer,
		// into the QP's arena of MaxSendWR slots: a slot comes round again
		// only MaxSendWR posts later, when the SQ can no longer hold the
		// WQE that used it.
		n := q.init.MaxInline
		k := q.inlineNext % q.init.MaxSendWR
		q.inlineNext++
		b := q.inline[k*n : k*n+len(s.InlineData)]
		copy(b, s.InlineData)
		w.SG = append(sg, ib.LocalSeg(b))
		w.Length = uint32(len(b))
		return
	}
	needWrite := s.Opcode == ib.RDMARead || s.Opcode.IsAtomic()
	var total uint64
	for _, g := range s.SG {
		m := q.dev.lookup(g.LKey, q.pd)
		var b []byte
		ok := m != nil && m.lkey == g.LKey && (!needWrite || m.access&ib.LocalWrite != 0)
		if ok {
			b, ok = m.slice(g.Addr, uint64(g.Length))
		}
		if !ok {
			w.Err = ib.LocProtErr
			continue
		}
		sg = append(sg, ib.LocalSeg(b))
		total += uint64(g.Length)
	}
	if total > MaxMsgSize && w.Err == ib.Success {
		w.Err = ib.LocLenErr
	}
	w.SG = sg
	w.Length = uint32(total)
}

// PostRecv posts receive WRs and returns how many it took.
func (q *QP) PostRecv(wrs ...RecvWR) (int, error) {
	if q.init.SRQ != nil {
		return 0, ErrNoRecvQueue
	}
	q.mu.Lock()
	defer q.release()
	w, sg := &q.postRecv, q.postSG[:0]
	if q.destroyed.Load() {
		return 0, ErrDestroyed
	}
	for i := range wrs {
		if q.state == ib.Reset {
			return i, ErrQPState
		}
		if len(wrs[i].SG) > q.init.MaxSGE {
			return i, ErrTooManySGE
		}
		if q.rq.full() {
			return i, ErrQueueFull
		}
		if q.state == ib.Err {
			q.pushWC(ib.WC{ID: wrs[i].ID, Status: ib.WRFlushErr, Opcode: ib.WCRecv, IsRecv: true, QPN: q.qpn})
			continue
		}
		q.dev.resolveRecv(q.pd, &wrs[i], w, sg)
		q.rq.put(w)
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

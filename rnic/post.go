package rnic

import (
	"fmt"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/verbs"
)

// PostSend posts send WRs and returns how many it took; on error the rest
// were not posted (ibv_post_send's bad_wr).
func (q *QP) PostSend(wrs []verbs.SendWR) (int, error) {
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
func (q *QP) postSend(wrs []verbs.SendWR) (int, error) {
	w, sg := &q.postWQE, q.postSG[:0]
	if q.destroyed.Load() && len(wrs) > 0 {
		return 0, q.wrError(verbs.QueueSQ, 0, wrs[0].ID, verbs.ErrDestroyed, "the QP is destroyed")
	}
	for i := range wrs {
		s := &wrs[i]
		if q.state != ib.RTS && q.state != ib.SQD && q.state != ib.SQE && q.state != ib.Err {
			return i, q.wrError(verbs.QueueSQ, i, s.ID, verbs.ErrQPState, "the QP is in %v; sends need RTS, SQD, SQE or ERR", q.state)
		}
		ah, err := q.checkSend(i, s)
		if err != nil {
			return i, err
		}
		if q.tr.SendQueueFree() == 0 {
			return i, verbs.ErrQueueFull
		}
		if q.state == ib.Err || q.state == ib.SQE {
			q.pushWC(ib.WC{ID: s.ID, Status: ib.WRFlushErr, Opcode: s.Opcode.WCOpcode(), QPN: q.qpn})
			continue
		}
		q.resolveSend(s, ah, w, sg)
		q.tr.Post(w)
	}
	q.txPending.Store(true)
	return len(wrs), nil
}

// PostSendInError posts, in place of a send WR that failed PostSend's
// checks, a WQE that completes with st in order, after the WRs before it,
// and then stops the send queue: ERR for RC, SQE for UC and UD (IBA
// 10.3.1), so that the WRs posted after it are flushed, as an RNIC treats
// a bad WQE it finds in its queue. The daemon posts these for WRs of its
// clients' rings, which no library checked. The opcode only names the
// completion's. A QP in SQE or ERR flushes the WR; one whose state takes
// no sends (RESET, INIT, RTR), where ibv_post_send would have refused the
// WR, completes it with st at once and stays as it is.
func (q *QP) PostSendInError(id uint64, op ib.WROpcode, st ib.WCStatus) error {
	if !op.Valid() {
		op = ib.Send
	}
	n, err := func() (int, error) {
		q.mu.Lock()
		defer q.release()
		switch {
		case q.destroyed.Load():
			return 0, verbs.ErrDestroyed
		case q.state != ib.RTS && q.state != ib.SQD && q.state != ib.SQE && q.state != ib.Err:
			q.pushWC(ib.WC{ID: id, Status: st, Opcode: op.WCOpcode(), QPN: q.qpn})
			return 0, nil
		case q.tr.SendQueueFree() == 0:
			return 0, verbs.ErrQueueFull
		case q.state == ib.Err || q.state == ib.SQE:
			q.pushWC(ib.WC{ID: id, Status: ib.WRFlushErr, Opcode: op.WCOpcode(), QPN: q.qpn})
			return 0, nil
		}
		q.postWQE = ib.SendWQE{ID: id, Opcode: op, Flags: ib.Signaled, Err: st, SG: q.postSG[:0]}
		q.tr.Post(&q.postWQE)
		q.txPending.Store(true)
		return 1, nil
	}()
	if n > 0 {
		q.dev.ring()
	}
	return err
}

// checkSend checks send WR i against the QP; a UD WR's address handle
// comes back as this device's.
func (q *QP) checkSend(i int, s *verbs.SendWR) (*AH, error) {
	t := q.init.Type
	fail := func(kind error, format string, args ...any) (*AH, error) {
		return nil, q.wrError(verbs.QueueSQ, i, s.ID, kind, format, args...)
	}
	switch {
	case !s.Opcode.Valid():
		return fail(verbs.ErrBadOpcode, "opcode %v", s.Opcode)
	case s.Flags&^ib.KnownSendFlags != 0:
		return fail(verbs.ErrInvalid, "send flags %#x the device does not implement", uint8(s.Flags&^ib.KnownSendFlags))
	case t.Datagram() && s.Opcode != ib.Send && s.Opcode != ib.SendWithImm:
		return fail(verbs.ErrBadOpcode, "%v on a %v QP", s.Opcode, t)
	case t == ib.UC && (s.Opcode == ib.RDMARead || s.Opcode.IsAtomic()):
		return fail(verbs.ErrBadOpcode, "%v on a UC QP", s.Opcode)
	case len(s.SG) > q.init.MaxSendSGE:
		return fail(verbs.ErrTooManySGE, "%d SGEs, max_send_sge %d", len(s.SG), q.init.MaxSendSGE)
	case s.Flags&ib.Inline != 0 && len(s.InlineData) > q.init.MaxInline:
		return fail(verbs.ErrInlineSize, "%d bytes inline, max_inline_data %d", len(s.InlineData), q.init.MaxInline)
	case s.Flags&ib.Inline != 0 && (s.Opcode == ib.RDMARead || s.Opcode.IsAtomic()):
		return fail(verbs.ErrInlineSize, "%v has no inline data", s.Opcode)
	}
	if s.Opcode.IsAtomic() {
		n := uint32(0)
		for _, g := range s.SG {
			n += g.Length
		}
		if n != 8 {
			return fail(verbs.ErrInvalid, "%v on %d bytes; atomics take 8", s.Opcode, n)
		}
	}
	if !t.Datagram() {
		return nil, nil
	}
	ah, ok := s.AH.(*AH)
	if !ok || ah.pd != q.pd {
		return fail(verbs.ErrInvalid, "no address handle of the QP's PD")
	}
	return ah, nil
}

// wrError is the WRError of WR i (wr_id id) of a post to queue qu of q.
func (q *QP) wrError(qu verbs.Queue, i int, id uint64, kind error, format string, args ...any) error {
	return &verbs.WRError{QPN: q.qpn, Queue: qu, Index: i, ID: id, Detail: fmt.Sprintf(format, args...), Err: kind}
}

// resolveSend turns a send WR into a WQE, resolving the SGEs against the
// QP's PD. A bad lkey or bound is not an error of the post (an RNIC finds
// it when it processes the WQE): the WQE carries LOC_PROT_ERR and
// completes with it in order, and the QP goes to ERR.
func (q *QP) resolveSend(s *verbs.SendWR, ah *AH, w *ib.SendWQE, sg []ib.Seg) {
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
	default:
		// No atomic operands.
	}
	if ah != nil {
		w.AH = &ah.ah
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
		var b ib.Seg
		ok := m != nil && m.lkey == g.LKey && (!needWrite || m.access&ib.LocalWrite != 0)
		if ok {
			b, ok = m.slice(g.Addr, uint64(g.Length))
		}
		if !ok {
			w.Err = ib.LocProtErr
			continue
		}
		sg = append(sg, b)
		total += uint64(g.Length)
	}
	if total > MaxMsgSize && w.Err == ib.Success {
		w.Err = ib.LocLenErr
	}
	w.SG = sg
	w.Length = uint32(total)
}

// PostRecv posts receive WRs and returns how many it took.
func (q *QP) PostRecv(wrs []verbs.RecvWR) (int, error) {
	if q.init.SRQ != nil && len(wrs) > 0 {
		return 0, q.wrError(verbs.QueueRQ, 0, wrs[0].ID, verbs.ErrNoRecvQueue, "the QP receives from an SRQ")
	}
	q.mu.Lock()
	defer q.release()
	w, sg := &q.postRecv, q.postSG[:0]
	if q.destroyed.Load() && len(wrs) > 0 {
		return 0, q.wrError(verbs.QueueRQ, 0, wrs[0].ID, verbs.ErrDestroyed, "the QP is destroyed")
	}
	for i := range wrs {
		if q.state == ib.Reset {
			return i, q.wrError(verbs.QueueRQ, i, wrs[i].ID, verbs.ErrQPState, "the QP is in RESET")
		}
		if len(wrs[i].SG) > q.init.MaxRecvSGE {
			return i, q.wrError(verbs.QueueRQ, i, wrs[i].ID, verbs.ErrTooManySGE, "%d SGEs, max_recv_sge %d", len(wrs[i].SG), q.init.MaxRecvSGE)
		}
		if q.rq.full() {
			return i, verbs.ErrQueueFull
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

// resolveRecv turns a receive WR's SGEs into memory, checking lkey, PD,
// bounds and local write access; a failure is recorded in the WQE and
// reported when a message uses it (LOC_PROT_ERR), as an RNIC does.
func (d *Device) resolveRecv(pd *PD, r *verbs.RecvWR, w *ib.RecvWQE, sg []ib.Seg) {
	w.ID, w.Err, w.Length = r.ID, ib.Success, 0
	for _, s := range r.SG {
		m := d.lookup(s.LKey, pd)
		var b ib.Seg
		ok := m != nil && m.lkey == s.LKey && m.access&ib.LocalWrite != 0
		if ok {
			b, ok = m.slice(s.Addr, uint64(s.Length))
		}
		if !ok {
			w.Err = ib.LocProtErr
			continue
		}
		sg = append(sg, b)
		w.Length += s.Length
	}
	w.SG = sg
}

// PostRecvInError is PostSendInError for a receive WR that failed
// PostRecv's checks: an error of the receive queue takes the QP to ERR
// whatever its type (IBA 10.3.1), with QP_FATAL, so the receives posted
// before it are flushed, it completes with st after them, and the WRs
// posted after it are flushed. A QP in ERR flushes it; one in RESET, where
// ibv_post_recv would have refused it, completes it with st at once and
// stays there.
func (q *QP) PostRecvInError(id uint64, st ib.WCStatus) error {
	wc := ib.WC{ID: id, Status: st, Opcode: ib.WCRecv, IsRecv: true, QPN: q.qpn}
	q.mu.Lock()
	switch {
	case q.destroyed.Load():
		q.mu.Unlock()
		return verbs.ErrDestroyed
	case q.state == ib.Err:
		wc.Status = ib.WRFlushErr
	case q.state != ib.Reset:
		q.toErrLocked()
		q.dev.event(ib.EventQPFatal, q.qpn)
		// The receive the transport holds is flushed as its lock is
		// released: before this one.
		q.release()
		q.mu.Lock()
	}
	q.pushWC(wc)
	q.release()
	return nil
}

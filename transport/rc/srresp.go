package rc

import (
	"github.com/softrnic/softrnic/bth"
)

// The responder's half of selective repeat. Once a request carrying the SR
// bit has arrived (and this QP may use selective repeat), requests up to
// SRWindow-1 PSNs beyond the expected one are held instead of answered by
// a sequence NAK and dropped; each is executed, with every check, when the
// packets before it have been, so data lands and completions come in PSN
// order. Every response carries the SR bit, and every ACK a SACKETH
// saying which PSNs after the acknowledged one the responder has.

func (q *QP) srRespStart() {
	q.resp.sr = true
	q.resp.held.init()
	q.resp.granted = 0
}

// srGrant is the receive window the next SACKETH grants: the device's
// share for this QP, but at most twice the last one granted, from
// InitialWindow on. Windows that open in steps leave the first QPs of a
// crowd starting at once no more than their share of the frames the rest
// are about to need (the device's count of QPs receiving catches up as
// their first packets arrive).
func (q *QP) srGrant() int {
	s := &q.resp
	if s.win == 0 {
		return 0
	}
	g := min(s.win, 2*max(s.granted, InitialWindow))
	s.granted = g
	return g
}

// srRespStop forgets the responder's selective-repeat state and hands held
// buffers back.
func (q *QP) srRespStop() {
	s := &q.resp
	if q.pool != nil {
		s.held.dropBefore(q.pool, 0, true)
	}
	s.sr = false
}

// srAckHeld is how many requests held in a row, each right after the one
// before, may go without an ACK of their own.
const srAckHeld = 8

// srHoldRequest keeps a request that came d PSNs early and acknowledges
// what the requester must learn at once: a new hole (the first request
// held after the expected PSN, or one that does not follow the highest
// held), a request asking for an ACK, a duplicate or one that could not be
// held. Requests that only extend the run held after a hole are
// acknowledged every srAckHeld: one SACK per packet that followed a loss
// cost the responder a frame to send and the requester one to read for
// every packet held, and told the requester nothing RACK needs sooner.
func (q *QP) srHoldRequest(pkt []byte, pp bth.PSN, d int32) {
	s := &q.resp
	now := true
	switch {
	case d >= SRWindow:
		q.RxDropped++ // beyond any window the requester may use
	case s.held.has(pp):
		q.RxDuplicate++
	default:
		run := s.held.n > 0 && pp == s.held.high.Next()
		if !s.held.hold(q.pool, pp, pkt) {
			q.SRDropped++
			break
		}
		q.SRHeld++
		s.heldQuiet++
		now = !run || bth.BTH(pkt).AckReq() || s.heldQuiet >= srAckHeld
	}
	if now {
		s.pushAck(SynACK, s.ePSN.Prev(), s.msn)
	}
}

// srDrain executes the held requests that are now in order.
func (q *QP) srDrain() {
	s := &q.resp
	for s.held.n > 0 && q.respOn {
		b := s.held.take(s.ePSN)
		if b == nil {
			break
		}
		before := s.ePSN
		h := bth.BTH(b)
		op := h.Opcode()
		q.execRequest(b, op, op.HeaderLen(), len(b)-h.PadCount(), before)
		q.spend(b)
		if s.ePSN == before {
			// RNR NAK: the requester goes back to this PSN and resends
			// everything after it.
			break
		}
	}
	if s.held.n > 0 {
		s.held.dropBefore(q.pool, s.ePSN, false)
	}
}

// writeSACK writes into b the SACKETH for the PSNs from base: the responder
// has a PSN if it is before the expected one or held.
func (q *QP) writeSACK(b []byte, base bth.PSN) int {
	s := &q.resp
	hi := s.ePSN // one past the last PSN worth describing
	if s.held.n > 0 && !s.held.high.Less(hi) {
		hi = s.held.high.Next()
	}
	words := 0
	if base.Less(hi) {
		words = min((int(hi.Diff(base))+31)/32, bth.MaxSACKWords)
	}
	sk := bth.SACKETH(b)
	for k := 0; k < words; k++ {
		var w uint32
		for i := 0; i < 32; i++ {
			p := base.Add(uint32(32*k + i))
			if p.Less(s.ePSN) || s.held.has(p) {
				w |= 1 << (31 - i)
			}
		}
		sk.SetWord(k, w)
	}
	sk.SetHeader(words, base, q.srGrant())
	q.TxSACKs++
	return bth.SACKLen(words)
}

// srReplayRead queues the reply to a READ range a selective-repeat
// requester asked for again, in front of the replies in progress: it fills
// a hole the requester waits on. The part of the range that a queued reply
// of the same READ has yet to send is left to that reply, since it was
// not lost, only not sent yet: a requester whose tail-loss probe or local
// ACK timeout fires while the replies are merely slow (paced, or queued
// behind others) would otherwise have the same bytes sent twice, the
// replay holding back the reply it repeats, again at every expiry.
func (q *QP) srReplayRead(it respItem) {
	s := &q.resp
	if it.remain == 0 {
		s.pushFront(it)
		return
	}
	mtu := uint32(q.cfg.MTU)
	lo, hi := it.psn, it.psn.Add(pktsFor(it.remain, q.cfg.MTU))
	for k := 0; k < s.qlen; k++ {
		o := &s.q[(s.qhead+k)%len(s.q)]
		if o.kind != itemRead || o.res != it.res || o.remain == 0 {
			continue
		}
		oHi := o.psn.Add(pktsFor(o.remain, q.cfg.MTU))
		if !o.psn.Less(hi) || !lo.Less(oHi) {
			continue // no overlap
		}
		if o.psn.LessEq(lo) {
			if !oHi.Less(hi) {
				return // all of it still to come
			}
			// The queued reply sends the start: ask only for the rest.
			d := uint32(oHi.Diff(lo))
			it.psn, it.off, it.remain = oHi, it.off+d*mtu, it.remain-d*mtu
			lo = oHi
			continue
		}
		// The queued reply has passed lo: replay only up to it.
		it.remain = min(it.remain, uint32(o.psn.Diff(lo))*mtu)
		hi = o.psn
	}
	s.pushFront(it)
}

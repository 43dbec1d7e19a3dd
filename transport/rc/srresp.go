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

// srHoldRequest keeps a request that came d PSNs early and acknowledges,
// so that the requester learns of the hole before it at once.
func (q *QP) srHoldRequest(pkt []byte, pp bth.PSN, d int32) {
	s := &q.resp
	switch {
	case d >= SRWindow:
		q.RxDropped++ // beyond any window the requester may use
	case s.held.has(pp):
		q.RxDuplicate++
	case s.held.hold(q.pool, pp, pkt):
		q.SRHeld++
	default:
		q.SRDropped++
	}
	s.pushAck(SynACK, s.ePSN.Prev(), s.msn)
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
		s.held.release(q.pool, b)
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
	sk.SetHeader(words, base)
	q.TxSACKs++
	return bth.SACKLen(words)
}

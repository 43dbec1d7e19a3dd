package rc

import (
	"math/bits"
	"time"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/ib"
)

// psnRange is n PSNs from lo.
type psnRange struct {
	lo bth.PSN
	n  uint32
}

// srReadQueue bounds the READ sub-ranges waiting to be asked again; a gap
// that finds it full is left to the tail-loss probe.
const srReadQueue = 8

// srReq is the requester's half of selective repeat.
type srReq struct {
	on       bool
	win      int      // BDP window, PSNs
	peerWin  int      // the responder's receive window (0: none stated)
	held     holdRing // READ responses and atomic ACKs that came out of order
	lost     int      // records marked txLost
	retxFrom bth.PSN  // no record before it is marked lost
	// RACK (RFC 8985): the transmission time and PSN of the most recently
	// sent packet known delivered, and whether the path has reordered.
	rackAt     clock.Time
	rackPSN    bth.PSN
	rackRTT    time.Duration // the RTT of that packet's delivery
	reordering bool
	// reoAt is RACK's reordering timer: when a packet sent before the
	// one last delivered, and spared only by the reordering window, is
	// declared lost if nothing has come for it (RFC 8985, 6.2 step 5).
	reoAt clock.Time
	// An ACK beyond a READ or atomic whose response is missing also
	// acknowledges the SEND/WRITE packets after it: pendAck keeps it until
	// the response comes.
	pendAck bth.PSN
	hasPend bool
	// rdNext: every READ response and atomic ACK before it has come or has
	// been asked for again.
	rdNext bth.PSN
	// dropAt is the first response that could not be held (beyond the
	// window, or the pool empty): once everything before it has come, the
	// rest of its READ is asked for again at once.
	dropAt  bth.PSN
	hasDrop bool
	rdq     [srReadQueue]psnRange
	rdn     int
	bdp     bdpEst
}

// srAllowed reports whether this QP may use selective repeat at all: the
// mode asks for it, the device gave it a reorder pool, and the peer's QP
// number is softrnic's.
func (q *QP) srAllowed() bool {
	return q.pool != nil && q.cfg.Recovery.Or(ib.RecoverySelective) == ib.RecoverySelective && !q.cfg.UC && SoftQPN(q.cfg.DestQPN)
}

// SetReorderPool gives the QP the device's reorder pool, whose buffers hold
// the QP's largest packet (PacketLen of its path MTU), before the QP is
// connected; without one it never agrees to selective repeat.
func (q *QP) SetReorderPool(p *ReorderPool) {
	q.pool = p
	q.req.mark = q.reqOn && q.srAllowed()
}

// SelectiveRepeat reports whether selective repeat is in use for the
// requests this QP sends (req) and for those it receives (resp).
func (q *QP) SelectiveRepeat() (req, resp bool) { return q.req.sr.on, q.resp.sr }

// srStart turns selective repeat on for the requester: the peer's
// responder has answered a marked request with a marked response.
func (q *QP) srStart(now clock.Time) {
	r := &q.req
	s := &r.sr
	s.on = true
	s.win = MaxUnackedPSNs
	s.held.init()
	r.tx.grow(2 * SRWindow)
	s.retxFrom, s.rdNext = r.compPSN, r.compPSN
	s.bdp = bdpEst{deliveredAt: now, winStart: now}
	s.reoAt = clock.Never
}

// srStop forgets the requester's selective-repeat state and hands held
// buffers back.
func (q *QP) srStop() {
	s := &q.req.sr
	if q.pool != nil {
		s.held.dropBefore(q.pool, 0, true)
	}
	*s = srReq{held: s.held}
}

func (q *QP) srMarkLost(rec *txRec) {
	s := &q.req.sr
	if rec.flags&(txLost|txDelivered) != 0 {
		return
	}
	rec.flags |= txLost
	s.lost++
	if rec.psn.Less(s.retxFrom) {
		s.retxFrom = rec.psn
	}
}

func (q *QP) srUnmarkLost(rec *txRec) {
	if rec.flags&txLost != 0 {
		rec.flags &^= txLost
		q.req.sr.lost--
	}
}

// sentBefore orders transmissions: by time, then (a batch built at one
// instant goes out in the order it was built) by PSN.
func sentBefore(at clock.Time, p bth.PSN, at2 clock.Time, p2 bth.PSN) bool {
	return at < at2 || at == at2 && p.Less(p2)
}

// srNewest keeps in *newest whichever of it and rec was sent last. A
// retransmitted packet acknowledged sooner than the minimum RTT after its
// last transmission was acknowledged for an earlier one, whose time is
// unknown: it cannot serve (RFC 8985, step 2).
func (q *QP) srNewest(now clock.Time, newest **txRec, rec *txRec) {
	if rec.flags&txRetx != 0 && now.Sub(rec.at) < q.req.rtt.minRTT {
		return
	}
	if *newest == nil || sentBefore((*newest).at, (*newest).psn, rec.at, rec.psn) {
		*newest = rec
	}
}

// srDelivering notes that rec, never delivered before, now is: a packet
// sent before one already delivered, and never retransmitted, shows that
// the path reorders.
func (q *QP) srDelivering(rec *txRec) {
	s := &q.req.sr
	if rec.flags&txRetx == 0 && sentBefore(rec.at, rec.psn, s.rackAt, s.rackPSN) {
		s.reordering = true
	}
}

// srDelivered counts n packets newly delivered, newest being the most
// recently sent among them: the BDP estimate takes a sample, RACK's
// reference moves, and undelivered packets sent before it (by more than
// the reordering window, once the path has shown reordering) are declared
// lost.
func (q *QP) srDelivered(now clock.Time, n uint64, newest *txRec) {
	r := &q.req
	s := &r.sr
	s.bdp.deliver(now, n, newest, max(8*r.rtt.srtt, PTOMin))
	s.win = s.bdp.window(r.rtt.minRTT, s.win)
	if sentBefore(s.rackAt, s.rackPSN, newest.at, newest.psn) {
		s.rackAt, s.rackPSN, s.rackRTT = newest.at, newest.psn, now.Sub(newest.at)
		q.srDetectLoss(now)
	}
}

// srReoWindow is RACK's reordering allowance: none until the path has
// reordered, then a quarter of the minimum RTT.
func (q *QP) srReoWindow() clock.Time {
	if !q.req.sr.reordering {
		return 0
	}
	return clock.Time(q.req.rtt.minRTT / 4)
}

// srDetectLoss marks lost every packet not yet delivered that was sent
// before the most recently sent packet known delivered (RACK), by more than
// the reordering window, or as long before now as that packet's RTT and
// the window; for those it spares, it arms the reordering timer.
func (q *QP) srDetectLoss(now clock.Time) {
	r := &q.req
	s := &r.sr
	reo := q.srReoWindow()
	s.reoAt = clock.Never
	end := r.compPSN.Add(SRWindow)
	if r.psn.Less(end) {
		end = r.psn
	}
	p := r.compPSN
	if s.hasPend && p.LessEq(s.pendAck) {
		p = s.pendAck.Next() // acknowledged, behind a missing response
	}
	for ; p.Less(end); p = p.Next() {
		rec := r.tx.get(p)
		if rec == nil || rec.flags&(txLost|txDelivered) != 0 || !sentBefore(rec.at, rec.psn, s.rackAt, s.rackPSN) {
			continue
		}
		due := rec.at.Add(s.rackRTT) + reo
		if sentBefore(rec.at+reo, rec.psn, s.rackAt, s.rackPSN) || now >= due {
			q.srMarkLost(rec)
		} else {
			s.reoAt = clock.Min(s.reoAt, due)
		}
	}
}

// srSACK reads a selective acknowledgement.
func (q *QP) srSACK(now clock.Time, sk bth.SACKETH) {
	r := &q.req
	q.RxSACKs++
	r.sr.peerWin = sk.Window()
	var newest *txRec
	n := uint64(0)
	for k := 0; k < sk.Words(); k++ {
		w := sk.Word(k)
		for w != 0 {
			i := bits.LeadingZeros32(w)
			w &^= 1 << (31 - i)
			p := sk.Base().Add(uint32(32*k + i))
			if p.Less(r.compPSN) || !p.Less(r.maxPSN) {
				continue
			}
			rec := r.tx.get(p)
			if rec == nil || rec.flags&txDelivered != 0 {
				continue
			}
			q.srUnmarkLost(rec)
			q.srDelivering(rec)
			rec.flags |= txDelivered
			n++
			q.srNewest(now, &newest, rec)
		}
	}
	if newest != nil {
		q.srDelivered(now, n, newest)
	}
	if n > 0 && r.compPSN.Less(r.psn) {
		// Packets newly received are forward progress too, though the
		// cumulative acknowledgement waits on a hole: the responder is
		// alive and taking what is sent, and the local ACK timer and the
		// retry budget start afresh, as on an ACK. The hole is RACK's to
		// resend; a run of losses of one hole's retransmissions must not
		// add up to RETRY_EXC_ERR while everything else flows.
		r.retryLeft = q.cfg.RetryCnt
		if r.rto != 0 {
			r.timer = now + r.rto
		}
	}
}

// srRewound clears the selective-repeat marks at and after the PSN a
// go-back-N restarted from: everything there is sent again in order, and
// the responder may have dropped what it held (an RNR NAK), so earlier
// SACKs no longer count.
func (q *QP) srRewound() {
	r := &q.req
	s := &r.sr
	if !s.on {
		return
	}
	for i := range r.tx.recs {
		rec := &r.tx.recs[i]
		if rec.flags&txSent != 0 && !rec.psn.Less(r.psn) {
			q.srUnmarkLost(rec)
			rec.flags &^= txDelivered
		}
	}
	s.rdn = 0
	s.rdNext = r.psn
	s.retxFrom = r.psn
}

// buildSelective emits the next READ range asked again, or the next hole.
func (q *QP) buildSelective(now clock.Time, buf []byte) int {
	r := &q.req
	s := &r.sr
	for s.rdn > 0 {
		g := s.rdq[0]
		copy(s.rdq[:], s.rdq[1:s.rdn])
		s.rdn--
		lo, hi := g.lo, g.lo.Add(g.n)
		for lo.Less(hi) && (lo.Less(r.compPSN) || s.held.has(lo)) {
			lo = lo.Next()
		}
		e := r.entryAt(lo)
		if !lo.Less(hi) || !lo.Less(r.psn) || e == nil || e.Opcode != ib.RDMARead {
			continue
		}
		n := q.writeRequest(buf, e, lo, true, uint32(hi.Diff(lo)))
		q.sentPkt(now, lo, true)
		q.SelRetrans++
		q.RetransPkts++
		return n
	}
	if s.lost <= 0 {
		s.lost = 0
		return 0
	}
	end := r.compPSN.Add(SRWindow)
	if r.psn.Less(end) {
		end = r.psn
	}
	p := s.retxFrom
	if p.Less(r.compPSN) {
		p = r.compPSN
	}
	for ; p.Less(end); p = p.Next() {
		rec := r.tx.get(p)
		if rec == nil || rec.flags&txLost == 0 {
			continue
		}
		s.retxFrom = p.Next()
		if n := q.buildAt(now, buf, p, 0); n > 0 {
			q.SelRetrans++
			return n
		}
		q.srUnmarkLost(rec)
	}
	// Nothing left to retransmit: the count must agree.
	for i := range r.tx.recs {
		q.srUnmarkLost(&r.tx.recs[i])
	}
	s.lost = 0
	return 0
}

// readSpan is how many PSNs of READ e to ask for again from p: up to the
// first response already held, or to the end of the READ.
func (q *QP) readSpan(e *sendEntry, p bth.PSN) uint32 {
	n := uint32(e.lastPSN.Diff(p)) + 1
	s := &q.req.sr
	if !s.on || s.held.n == 0 {
		return n
	}
	for i := uint32(1); i < n && i < SRWindow; i++ {
		if s.held.has(p.Add(i)) {
			return i
		}
	}
	return n
}

// srAskAgain asks again for the responses with PSNs in [lo, hi) that have
// not come: READ sub-ranges, and atomics, whose request is resent.
func (q *QP) srAskAgain(lo, hi bth.PSN) {
	r := &q.req
	s := &r.sr
	if lo.Less(r.compPSN) {
		lo = r.compPSN
	}
	for i := r.head; i != r.end() && lo.Less(hi); i++ {
		e := r.entry(i)
		if e.state == wqePosted || hi.LessEq(e.firstPSN) {
			break
		}
		if e.lastPSN.Less(lo) {
			continue
		}
		a, b := lo, hi
		if a.Less(e.firstPSN) {
			a = e.firstPSN
		}
		if e.lastPSN.Less(b) {
			b = e.lastPSN.Next()
		}
		switch {
		case e.Opcode == ib.RDMARead:
			q.ImpliedNAKs++
			if s.rdn < srReadQueue {
				s.rdq[s.rdn] = psnRange{a, uint32(b.Diff(a))}
				s.rdn++
			}
		case e.Opcode.IsAtomic():
			if rec := r.tx.get(e.firstPSN); rec != nil {
				rec.flags &^= txDelivered
				q.srMarkLost(rec)
			}
		}
	}
}

// srResponsesBefore notes that the responder has sent every response with
// a PSN before x (it answers in order): those that have not come are lost.
func (q *QP) srResponsesBefore(x bth.PSN) {
	s := &q.req.sr
	if s.rdNext.Less(q.req.compPSN) {
		s.rdNext = q.req.compPSN
	}
	if s.rdNext.Less(x) {
		q.srAskAgain(s.rdNext, x)
		s.rdNext = x
	}
}

// srHoldResponse keeps a READ response or atomic ACK that came before the
// one the requester waits for, and asks again for those it skipped.
func (q *QP) srHoldResponse(pkt []byte, op bth.Opcode, pp bth.PSN) {
	r := &q.req
	s := &r.sr
	e := r.entryAt(pp)
	if e == nil || (op.IsReadResponse() && e.Opcode != ib.RDMARead) || (op.IsAtomicAck() && (!e.Opcode.IsAtomic() || pp != e.firstPSN)) {
		q.RxDropped++
		return
	}
	q.RxOutOfSeq++
	if rec := r.tx.get(e.firstPSN); rec != nil && op.IsReadResponse() {
		rec.flags |= txDelivered // the READ request arrived
		q.srUnmarkLost(rec)
	}
	if s.held.has(pp) {
		q.RxDropped++
		return
	}
	if pp.Diff(r.compPSN) >= SRWindow || !s.held.hold(q.pool, pp, pkt) {
		q.SRDropped++
		if !s.hasDrop || pp.Less(s.dropAt) {
			s.dropAt, s.hasDrop = pp, true
		}
		return
	}
	q.SRHeld++
	q.srResponsesBefore(pp)
	if !pp.Less(s.rdNext) {
		s.rdNext = pp.Next()
	}
}

// srAckBeyond handles an ACK (or NAK) that acknowledges PSNs beyond a READ
// or atomic still waiting for its response: the responses before it are
// lost, and the ACK is kept for the SEND/WRITE WQEs after it.
func (q *QP) srAckBeyond(e *sendEntry, acked bth.PSN) {
	r := &q.req
	s := &r.sr
	if rec := r.tx.get(e.firstPSN); rec != nil && e.Opcode == ib.RDMARead {
		rec.flags |= txDelivered
		q.srUnmarkLost(rec)
	}
	if !s.hasPend || s.pendAck.Less(acked) {
		s.pendAck, s.hasPend = acked, true
		for p := e.lastPSN.Next(); p.LessEq(acked) && p.Diff(r.compPSN) < SRWindow; p = p.Next() {
			if rec := r.tx.get(p); rec != nil {
				q.srUnmarkLost(rec)
				rec.flags |= txDelivered
			}
		}
	}
	q.srResponsesBefore(acked.Next())
}

// srApplyPending applies a kept ACK once the READ or atomic before it has
// completed.
func (q *QP) srApplyPending(now clock.Time) {
	r := &q.req
	s := &r.sr
	if !s.hasPend {
		return
	}
	if s.pendAck.Less(r.compPSN) || r.head == r.sentEnd() {
		s.hasPend = false
		return
	}
	if blocked := q.completeBefore(now, s.pendAck.Next()); blocked != nil {
		q.srAckBeyond(blocked, s.pendAck)
		return
	}
	s.hasPend = false
	if r.head == r.sentEnd() {
		q.idle()
		return
	}
	if e := r.entry(r.head); !e.Opcode.IsReadOrAtomic() && !s.pendAck.Less(e.firstPSN) && !s.pendAck.Less(r.compPSN) {
		q.ackPartial(now, e, s.pendAck)
	}
}

// srDrainResponses processes the held responses that are now in order.
func (q *QP) srDrainResponses(now clock.Time) {
	r := &q.req
	s := &r.sr
	for s.held.n > 0 && q.reqOn && !q.failed {
		b := s.held.take(r.compPSN)
		if b == nil {
			break
		}
		h := bth.BTH(b)
		op := h.Opcode()
		q.completer(now, b, op, op.HeaderLen(), len(b)-h.PadCount(), h.PSN())
		q.spend(b)
		if !s.rdNext.Less(h.PSN().Next()) {
			continue
		}
		s.rdNext = h.PSN().Next()
	}
	if s.held.n > 0 {
		s.held.dropBefore(q.pool, r.compPSN, false)
	}
	if s.hasDrop && !r.compPSN.Less(s.dropAt) && q.reqOn {
		s.hasDrop = false
		if e := r.entryAt(r.compPSN); e != nil && e.Opcode == ib.RDMARead {
			q.srAskAgain(r.compPSN, e.lastPSN.Next())
			if s.rdNext.Less(e.lastPSN.Next()) {
				s.rdNext = e.lastPSN.Next()
			}
		}
	}
}

package rc

import (
	"encoding/binary"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/ib"
)

// receiveResponse is the completer: it consumes ACKs, NAKs, READ responses
// and ATOMIC ACKs. end is where the payload ends (pad excluded).
func (q *QP) receiveResponse(now clock.Time, pkt []byte, op bth.Opcode, hl, end int) {
	r := &q.req
	h := bth.BTH(pkt)
	pp := h.PSN()
	// A response must be for a PSN we sent: [compPSN-1, maxPSN). After a
	// go-back-N, ACKs for PSNs beyond the resend point are still news.
	if r.head == r.sentEnd() || !pp.Less(r.maxPSN) || pp.Less(r.compPSN.Prev()) {
		q.GhostResponse++
		return
	}
	r.answered = true
	var syn uint8
	if o := op.Offset(bth.ExtAETH); o >= 0 {
		syn = bth.AETH(pkt[o:]).Syndrome()
	}
	if h.SR() && r.mark && !r.sr.on {
		q.srStart(now) // the peer's responder agreed
	}
	if q.records() {
		q.sampleRTT(now, op, pp, syn)
	}
	probe, probeAt := r.answersProbe(op, pp, syn), r.probeAt
	late := probe && r.ackAsked(pp)
	if r.sr.on && (op.IsReadResponse() || op.IsAtomicAck()) && pp.Diff(r.compPSN) > 0 {
		q.srHoldResponse(pkt, op, pp)
		return
	}
	q.completer(now, pkt, op, hl, end, pp)
	if r.sr.on && !q.failed {
		if op.IsAck() && h.SR() && end > hl { // Receive checked the SACKETH
			q.srSACK(now, bth.SACKETH(pkt[hl:end]))
		}
		if (op.IsReadResponse() || op.IsAtomicAck()) && !pp.Less(r.sr.rdNext) {
			r.sr.rdNext = pp.Next()
		}
		q.srDrainResponses(now)
	}
	if probe {
		q.probeAnswered(now, probeAt, late)
	}
}

// completer processes one response in PSN order.
func (q *QP) completer(now clock.Time, pkt []byte, op bth.Opcode, hl, end int, pp bth.PSN) {
	r := &q.req
	if r.head == r.sentEnd() {
		return
	}
	var syn uint8
	if o := op.Offset(bth.ExtAETH); o >= 0 {
		syn = bth.AETH(pkt[o:]).Syndrome()
	}
	nakLike := op.IsAck() && syn&0xE0 != 0
	// Implicit completion: every SEND/WRITE ending before pp is done. A
	// READ/ATOMIC ending before pp lost its response: go back to it (with
	// selective repeat, ask for the missing responses only).
	if blocked := q.completeBefore(now, pp); blocked != nil {
		if r.sr.on {
			acked := pp
			if nakLike || !op.IsAck() {
				acked = pp.Prev()
			}
			q.srAckBeyond(blocked, acked)
		} else if !r.retrying {
			q.retry(now, r.compPSN)
		}
		return
	}
	if r.head == r.sentEnd() {
		q.idle()
		return
	}
	e := r.entry(r.head)
	switch {
	case op.IsAck():
		q.handleAck(now, e, pp, syn)
	case op.IsReadResponse():
		if op != bth.RCRDMAReadResponseMiddle && bth.AETH(pkt[op.Offset(bth.ExtAETH):]).Syndrome()&0xE0 != 0 {
			q.RxDropped++
			return
		}
		q.handleReadResponse(now, e, pp, op, pkt[hl:end])
	case op.IsAtomicAck():
		if syn&0xE0 != 0 || e.state != wqeSent || !e.Opcode.IsAtomic() || pp != e.firstPSN || pp != r.compPSN {
			q.RxDropped++
			return
		}
		orig := bth.AtomicAckETH(pkt[op.Offset(bth.ExtAtomicAckETH):]).Orig()
		var b [8]byte
		binary.NativeEndian.PutUint64(b[:], orig)
		ib.CopyOut(e.SG, 0, b[:])
		q.finishHead(now, e)
	default:
		q.RxDropped++
	}
}

// completeBefore completes, in order, the SEND/WRITE WQEs on the wire that
// end before pp. It returns the READ or atomic it stopped at because its
// response is missing, if any.
func (q *QP) completeBefore(now clock.Time, pp bth.PSN) *sendEntry {
	r := &q.req
	progress := false
	for limit := r.sentEnd(); r.head != limit; {
		e := r.entry(r.head)
		if !e.onWire || !e.lastPSN.Less(pp) {
			break
		}
		if e.Opcode.IsReadOrAtomic() {
			break
		}
		r.compPSN = e.lastPSN.Next()
		q.completeSend(e, ib.Success)
		r.head++
		progress = true
	}
	if progress {
		q.progress(now)
		if r.psn.Less(r.compPSN) {
			q.seek(r.compPSN) // skip what the peer already has
		}
	}
	if r.head != r.sentEnd() {
		if e := r.entry(r.head); e.onWire && e.Opcode.IsReadOrAtomic() && e.lastPSN.Less(pp) {
			return e
		}
	}
	return nil
}

// ackPartial applies an ACK of PSN pp inside the SEND/WRITE WQE e at the
// head: a partial acknowledgement, or the last packet's while a go-back-N
// is resending it.
func (q *QP) ackPartial(now clock.Time, e *sendEntry, pp bth.PSN) {
	r := &q.req
	r.compPSN = pp.Next()
	q.progress(now)
	if r.psn.Less(r.compPSN) {
		q.seek(r.compPSN)
	}
	if pp == e.lastPSN {
		q.finishHead(now, e)
	}
}

func (q *QP) handleAck(now clock.Time, e *sendEntry, pp bth.PSN, syn uint8) {
	r := &q.req
	switch {
	case syn&0xE0 == 0x00: // ACK
		if pp.Less(r.compPSN) || e.Opcode.IsReadOrAtomic() || pp.Less(e.firstPSN) {
			// Stale, or an ACK inside a READ/ATOMIC range (only its
			// response completes it): nothing to learn.
			return
		}
		// Partial ACK of a multi-packet SEND/WRITE, or the ACK of its
		// last packet while a go-back-N is resending it.
		q.ackPartial(now, e, pp)
	case syn&0xE0 == SynRNRNAK:
		if pp.Less(r.compPSN) {
			return
		}
		if pp.Diff(r.compPSN) > 0 {
			r.compPSN = pp
			q.settle(now)
		}
		if r.rnrLeft == 0 {
			q.completeSend(e, ib.RNRRetryExcErr)
			r.head++
			q.fail(ib.RNRRetryExcErr)
			return
		}
		if r.rnrLeft != 7 {
			r.rnrLeft--
		}
		// An RNR NAK proves the path and the responder alive: the
		// transport retry budget (lost packets) starts afresh, so that
		// RNR NAKs lost over a long not-ready period do not add up to
		// RETRY_EXC_ERR.
		r.retryLeft = q.cfg.RetryCnt
		q.RNRWaits++
		r.rnrWait = true
		r.rnrAt = now.Add(RNRDelay(syn & 31))
		r.timer = clock.Never
		q.disarmAdaptive()
		r.rnrPSN = pp
	case syn == SynNAKPSNSeq:
		q.RxNAKSeqErr++
		if pp.Less(r.compPSN) || (r.rnrWait && pp == r.rnrPSN) {
			// Stale, or the sequence NAK a responder sends for the packets
			// that followed the one it RNR-NAKed (rnr_nak.pcap): the RNR
			// wait already resends from there.
			return
		}
		// Everything before pp was received: the NAK acknowledges it.
		if pp.Diff(r.compPSN) > 0 && !e.Opcode.IsReadOrAtomic() {
			r.compPSN = pp
			q.progress(now)
		}
		if !r.retrying {
			q.retry(now, pp)
		}
	default:
		st := ib.RemOpErr
		switch syn {
		case SynNAKInvReq:
			st = ib.RemInvReqErr
		case SynNAKRemAccess:
			st = ib.RemAccessErr
		}
		if pp.Less(r.compPSN) {
			return
		}
		switch syn {
		case SynNAKInvReq:
			q.RxNAKInvReq++
		case SynNAKRemAccess:
			q.RxNAKRemAccess++
		}
		q.completeSend(e, st)
		r.head++
		q.fail(st)
	}
}

func (q *QP) handleReadResponse(now clock.Time, e *sendEntry, pp bth.PSN, op bth.Opcode, pay []byte) {
	r := &q.req
	if e.Opcode != ib.RDMARead || e.state == wqePosted || pp.Less(e.firstPSN) || e.lastPSN.Less(pp) || pp.Less(r.compPSN) {
		q.RxDropped++
		return
	}
	if pp != r.compPSN {
		// A gap in a READ reply: the responder never NAKs responses, so
		// the requester re-requests from the first missing PSN at once
		// (an implied sequence NAK, IBA 9.9.2) instead of waiting for the
		// local ACK timeout, once per gap.
		q.RxDropped++
		q.RxOutOfSeq++
		if !r.retrying || r.gapPSN != r.compPSN {
			q.ImpliedNAKs++
			r.gapPSN = r.compPSN
			r.retrying = false
			q.retry(now, r.compPSN)
		}
		return
	}
	off := uint32(pp.Diff(e.firstPSN)) * uint32(q.cfg.MTU)
	remain := e.Length - off
	last := pp == e.lastPSN
	probed := false
	if last {
		if !(op.IsLast() || op.IsOnly()) || uint32(len(pay)) != remain {
			q.badResponse(e)
			return
		}
	} else if !(op.IsFirst() || op.IsMiddle()) {
		// A selective-repeat requester asks for READ sub-ranges, and a
		// probe for one response: their replies end with a LAST or ONLY
		// before the READ's last PSN.
		probed = r.readProbeAnswers(pp)
		if !r.sr.on && !probed || len(pay) != q.cfg.MTU {
			q.badResponse(e)
			return
		}
	} else if len(pay) != q.cfg.MTU {
		q.badResponse(e)
		return
	}
	ib.CopyOut(e.SG, off, pay)
	e.got = off + uint32(len(pay))
	r.compPSN = pp.Next()
	q.readProgress(now)
	q.progress(now)
	if !last && r.psn.Less(r.compPSN) {
		q.seek(r.compPSN) // a pending re-request now starts after this packet
	}
	if probed {
		q.readProbeAnswered()
	}
	if last {
		q.finishHead(now, e)
	}
}

// badResponse: a response that cannot belong to the request (wrong length
// or opcode at its PSN) is a fatal protocol error (BAD_RESP_ERR).
func (q *QP) badResponse(e *sendEntry) {
	q.completeSend(e, ib.BadRespErr)
	q.req.head++
	q.fail(ib.BadRespErr)
}

// finishHead completes the WQE at head successfully.
func (q *QP) finishHead(now clock.Time, e *sendEntry) {
	r := &q.req
	if e.Opcode.IsReadOrAtomic() {
		r.rdAtomic--
	}
	r.compPSN = e.lastPSN.Next()
	q.completeSend(e, ib.Success)
	r.head++
	q.progress(now)
	if r.psn.Less(r.compPSN) {
		// The response overtook a go-back-N that had not resent this
		// far yet: carry on after it.
		q.seek(r.compPSN)
	}
	if r.sr.on {
		q.srApplyPending(now)
	}
	q.idle()
}

// progress notes forward progress: fresh retry budgets, timer restarted.
func (q *QP) progress(now clock.Time) {
	r := &q.req
	q.Progress++
	r.retryLeft = q.cfg.RetryCnt
	r.rnrLeft = q.cfg.RNRRetry
	r.retrying = false
	r.excused = 0
	// As rxe's completer: the timer runs again only while a packet is
	// on the wire. WQEs still waiting their turn (behind other QPs, a
	// window, a pacer) are not late; the next packet sent starts it.
	r.timer = clock.Never
	if r.rto != 0 && r.compPSN.Less(r.psn) {
		r.timer = now + r.rto
	}
	q.armAfterProgress(now)
}

// idle disarms the timers when nothing is outstanding.
func (q *QP) idle() {
	if q.req.head == q.req.end() {
		q.req.timer = clock.Never
		q.disarmAdaptive()
	}
}

// HeardFrom tells the requester where the device keeps when it last
// received a packet from this QP's peer, on any QP. A local ACK timeout
// that expires after the peer was heard from since the timer started
// resends as ever but spends no retry, excuseFactor·(retry_cnt+1) times at
// most between two steps of progress. A peer that answers nothing at all
// is given up on exactly on time, (retry_cnt+1) local ACK timeouts after
// the last progress; one that answers other QPs of this host, at most
// 1+excuseFactor times as late. The device writes *t and the transport
// reads it from the engine goroutine alone.
func (q *QP) HeardFrom(t *clock.Time) { q.req.heard = t }

// excuseFactor bounds how much longer than the local ACK timeout and
// retry_cnt allow a requester waits for a peer heard from meanwhile.
const excuseFactor = 3

// excused reports whether the local ACK timeout expiring now spends no
// retry (HeardFrom).
func (q *QP) excused() bool {
	r := &q.req
	return r.heard != nil && *r.heard > r.timer-r.rto &&
		int(r.excused) < excuseFactor*(int(q.cfg.RetryCnt)+1)
}

// retry spends one transport retry and goes back to PSN p, or fails the
// head WQE with RETRY_EXC_ERR when the budget is gone. Once a retry has
// started, responses still in flight from before it (stale ACKs beyond a
// READ, repeated sequence NAKs) would each trigger another; like rxe's
// started_retry, only forward progress or a timeout re-arms that path.
func (q *QP) retry(now clock.Time, p bth.PSN) {
	if q.spendRetry() {
		q.goBackRetry(now, p)
	}
}

// spendRetry takes one transport retry, or fails the head WQE with
// RETRY_EXC_ERR when none is left. retry_cnt 7 is 7 retries, not infinity
// (IBA C9-130); only rnr_retry 7 is infinite.
func (q *QP) spendRetry() bool {
	r := &q.req
	if r.retryLeft == 0 {
		e := r.entry(r.head)
		q.completeSend(e, ib.RetryExcErr)
		r.head++
		q.fail(ib.RetryExcErr)
		return false
	}
	r.retryLeft--
	return true
}

// goBackRetry goes back to PSN p as a retry does.
func (q *QP) goBackRetry(now clock.Time, p bth.PSN) {
	r := &q.req
	r.retrying = true
	q.rewind(p)
	if r.rto != 0 {
		r.timer = now + r.rto
	}
}

func (q *QP) expire(now clock.Time) {
	r := &q.req
	if r.rnrWait {
		if now < r.rnrAt {
			return
		}
		r.rnrWait = false
		// Resume at the oldest unacknowledged PSN, as rxe does, not at the
		// PSN the RNR NAK named: ACKs that came during the wait may have
		// passed it (a copy sent before the NAK arrived, a probe or a
		// hole's retransmission, found a receive WQE, and a
		// selective-repeat responder then executed what it held). With
		// nothing left on the wire, going back to the NAK's PSN would give
		// the next WQEs PSNs the responder has already executed: it would
		// acknowledge them as duplicates, and they would complete without
		// ever being delivered.
		q.rewind(r.compPSN)
		if r.rto != 0 {
			r.timer = now + r.rto
		}
		return
	}
	if now < r.timer {
		if q.adaptive() {
			q.expireAdaptive(now)
		}
		return
	}
	if r.head == r.end() {
		r.timer = clock.Never
		q.disarmAdaptive()
		return
	}
	if !r.compPSN.Less(r.psn) {
		r.timer = clock.Never // nothing on the wire (a rewind not yet resent): the next packet starts it
		return
	}
	q.Timeouts++
	if q.excused() {
		// The peer's device answered this host since the timer started:
		// it is alive, only slow (a software RNIC's engine descheduled on
		// a loaded host, this QP's packets queued there behind other
		// QPs'), or this QP's packets alone were lost (HeardFrom).
		r.excused++
		q.TimeoutsExcused++
	} else if !q.spendRetry() {
		return // RETRY_EXC_ERR
	}
	if !q.adaptive() {
		q.goBackRetry(now, r.compPSN)
		return
	}
	// Adaptive retransmission resends only the oldest unacknowledged
	// packet, as its RTO does: a selective-repeat responder keeps what it
	// received, and its SACK tells RACK what else is missing; a go-back-N
	// responder answers with the last PSN it has in order, from which the
	// requester goes back N at once if packets were lost (probeAnswered).
	// Going back N here would put whole windows on the wire again behind
	// the first copies when the peer was only slow: with many QPs, that
	// peer then spends itself on duplicates, falls further behind, and
	// every QP gives up with no frame lost.
	r.timer = now + r.rto
	r.backOff()
	r.rtoAt, r.ptoAt = now.Add(q.adpRTO()), clock.Never
	r.probe, r.probeOut, r.probeRTO = true, false, true
}

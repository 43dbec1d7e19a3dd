package rc

import (
	"time"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/ib"
)

// Adaptive retransmission runs beside the IBA local ACK timer, which it
// leaves exactly as it was: armed a local ACK timeout after the last
// forward progress, each expiry without progress spends one of retry_cnt
// and goes back N, and the expiry that finds none left completes the head
// WQE with RETRY_EXC_ERR. A peer that stops answering is therefore given up
// on at the same moment in every mode: (retry_cnt+1) local ACK timeouts
// after the last progress. (Sequence NAKs and READ response gaps spend
// retries too, as IBA says; in selective repeat, holes are retransmitted
// without spending any.)
//
// What adaptive retransmission adds, none of it spending retries:
//   - an RTO of SRTT+4·RTTVAR (RFC 6298, Karn's rule), at least RTOMin,
//     doubling on each expiry without progress, never beyond the local ACK
//     timeout: it goes back N from the oldest unacknowledged PSN (with
//     selective repeat it resends that packet alone, as a probe);
//   - a tail-loss probe two SRTTs after the last transmission when nothing
//     was acknowledged: the packet at the oldest unacknowledged PSN again,
//     with AckReq;
//   - fast retransmission from a probe's answer: a go-back-N responder
//     answers a probe with an ACK of the last PSN it has in order (C9-105
//     for a duplicate, or the probe itself if it filled the hole), and
//     keeps nothing beyond a hole, so every unacknowledged packet sent
//     before the probe is lost; the requester goes back to the first one
//     at once (RACK's rule for a peer without SACK).
//
// A go-back-N peer sees only retransmissions of packets it already handles
// as duplicates or as the expected packet.

// adaptive reports whether the QP retransmits on its own timers: in every
// mode but RecoveryTimeout, toward any peer, as ConnectX's adaptive
// retransmission is on by default. A go-back-N peer (rxe, ConnectX) sees
// only packets it handles as duplicates, and the timers keep what a
// spurious expiry costs such a peer small: an RTO resends one packet, a
// late ACK does not send back N at once, and a READ reply in progress is
// left to stream (see streamingRead).
func (q *QP) adaptive() bool { return q.cfg.Recovery != ib.RecoveryTimeout && !q.cfg.UC }

// ackLimit is the longest the adaptive timers wait: the local ACK timeout,
// or MaxRTO when there is none.
func (q *QP) ackLimit() time.Duration {
	if d := AckTimeout(q.cfg.Timeout); d > 0 {
		return d
	}
	return MaxRTO
}

// adpRTO is the current retransmission timeout, backoff included. While a
// READ reply streams it is at least twice the longest silence seen between
// two of its responses: asking a go-back-N responder again for a READ
// costs the whole rest of the reply, which it sends after the one already
// queued, and a software peer (rxe in a guest) pauses its replies for
// milliseconds.
func (q *QP) adpRTO() time.Duration {
	lim := q.ackLimit()
	d := q.req.rtt.rto(lim)
	if q.streamingRead() {
		d = min(max(d, 2*q.req.readGap), lim)
	}
	for i := uint8(0); i < q.req.backoff && d < lim; i++ {
		d *= 2
	}
	return min(d, lim)
}

func (q *QP) adpPTO() time.Duration { return q.req.rtt.pto(q.req.rtt.rto(q.ackLimit())) }

// sentPkt records a transmission of PSN p (retx: known to repeat an earlier
// one, such as a READ asked again from an offset) and arms the adaptive
// timers.
func (q *QP) sentPkt(now clock.Time, p bth.PSN, retx bool) {
	if !q.records() {
		return
	}
	r := &q.req
	if rec := r.tx.get(p); rec != nil {
		q.srUnmarkLost(rec)
	}
	rec := r.tx.sent(p, now, r.sr.bdp.delivered, r.sr.bdp.deliveredAt)
	if retx {
		rec.flags |= txRetx
	}
	if !q.adaptive() {
		return // records for congestion control only
	}
	if r.rtoAt == clock.Never {
		r.rtoAt = now.Add(q.adpRTO())
	}
	if !r.probeOut && r.backoff == 0 && !q.streamingRead() { // no probe in an RTO's recovery
		r.ptoAt = now.Add(q.adpPTO())
	}
}

// streamingRead reports whether the last forward progress was a response
// of the READ at the head, which has more to come: the request arrived,
// and a tail-loss probe (a request asked again) would only double the
// reply. Its end, if lost, is the RTO's.
func (q *QP) streamingRead() bool {
	r := &q.req
	if r.sr.on || r.readAt == clock.Never || r.readAt != r.progressAt || r.head == r.end() {
		return false
	}
	e := r.entry(r.head)
	return e.Opcode == ib.RDMARead && e.onWire
}

// readProgress notes an in-order READ response at now, and the silence
// since the previous one when it followed it.
func (q *QP) readProgress(now clock.Time) {
	r := &q.req
	if r.readProbeOn && r.readProbe.Less(r.compPSN) {
		r.readProbeOn = false // answered, or passed by the reply
	}
	if r.readAt != clock.Never && r.readAt == r.progressAt {
		if g := now.Sub(r.readAt); g > r.readGap || now.Sub(r.readGapAt) > minRTTWindow {
			r.readGap, r.readGapAt = g, now
		}
	}
	r.readAt = now
}

// sampleRTT takes an RTT sample from a response that acknowledges the
// packet it names for the first time: an ACK (not a NAK), the first packet
// of a READ reply, an atomic ACK. A retransmitted packet gives none
// (Karn), unless its answer came sooner than the minimum RTT after the
// retransmission: then it answers the first transmission, and the time
// since that one is the sample. That is how the estimator learns of a
// peer that stalls (a software host's engine descheduled for
// milliseconds): the timeout that fired was spurious, and without the
// sample SRTT and RTTVAR would never see the stall, and the next one would
// be spurious again.
func (q *QP) sampleRTT(now clock.Time, op bth.Opcode, pp bth.PSN, syn uint8) {
	r := &q.req
	switch {
	case op.IsAck() && syn&0xE0 == 0, op.IsAtomicAck(), op == bth.RCRDMAReadResponseFirst, op == bth.RCRDMAReadResponseOnly:
	default:
		return
	}
	if pp.Less(r.compPSN) {
		return
	}
	rec := r.tx.get(pp)
	if rec == nil || rec.flags&txSampled != 0 {
		return
	}
	at := rec.at
	if rec.flags&txRetx != 0 {
		if r.rtt.samples == 0 || now.Sub(rec.at) >= r.rtt.minRTT {
			return // ambiguous: either transmission may have been answered
		}
		at = rec.first
	}
	rec.flags |= txSampled
	r.rtt.sample(now, now.Sub(at))
}

// settle retires the records of the PSNs the cumulative acknowledgement has
// passed since the last call.
func (q *QP) settle(now clock.Time) {
	r := &q.req
	gap := r.compPSN.Diff(r.settled)
	if gap <= 0 || !q.records() {
		r.settled = r.compPSN // no records
		return
	}
	var newest *txRec
	already := 0
	retire := func(rec *txRec) {
		if rec.flags&txDelivered != 0 {
			already++
		} else if r.sr.on {
			q.srDelivering(rec)
		}
		q.srUnmarkLost(rec)
		q.srNewest(now, &newest, rec)
	}
	if int(gap) > len(r.tx.recs) {
		for i := range r.tx.recs {
			rec := &r.tx.recs[i]
			if rec.flags&txSent != 0 && !rec.psn.Less(r.settled) && rec.psn.Less(r.compPSN) {
				retire(rec)
				rec.flags = 0
			}
		}
	} else {
		for p := r.settled; p.Less(r.compPSN); p = p.Next() {
			if rec := r.tx.get(p); rec != nil {
				retire(rec)
			}
		}
	}
	if r.sr.on && newest != nil {
		q.srDelivered(now, uint64(int(gap)-already), newest)
	}
	if int(gap) <= len(r.tx.recs) {
		for p := r.settled; p.Less(r.compPSN); p = p.Next() {
			r.tx.clear(p)
		}
	}
	r.settled = r.compPSN
}

// armAfterProgress restarts the adaptive timers once the cumulative
// acknowledgement moved. (Keeping the backoff until a fresh RTT sample,
// as Karn's rule would, spared a stalling peer nothing an RTO of one
// packet costs, and slowed recovery from real loss: adaptive go-back-N at
// 3 % loss fell from 0.36 to 0.32 of lossless in the goodput model.)
func (q *QP) armAfterProgress(now clock.Time) {
	r := &q.req
	r.probeOut, r.fastAt = false, clock.Never
	r.progressAt = now
	r.backoff = 0
	q.settle(now)
	if !q.adaptive() {
		return
	}
	r.rtoAt, r.ptoAt = clock.Never, clock.Never
	if !r.compPSN.Less(r.psn) {
		// Nothing on the wire: WQEs waiting their turn behind other QPs
		// or a window are not late. sentPkt arms the timers again.
		return
	}
	r.rtoAt = now.Add(q.adpRTO())
	if r.backoff == 0 && !q.streamingRead() {
		r.ptoAt = now.Add(q.adpPTO())
	}
}

// backOff doubles the next RTO until progress.
func (r *requester) backOff() {
	if r.backoff < 16 {
		r.backoff++
	}
}

// disarmAdaptive stops the adaptive timers (nothing outstanding, or the
// peer asked for an RNR wait).
func (q *QP) disarmAdaptive() {
	r := &q.req
	r.rtoAt, r.ptoAt, r.sr.reoAt, r.fastAt = clock.Never, clock.Never, clock.Never, clock.Never
	r.probe, r.probeOut, r.probeRTO = false, false, false
}

// expireAdaptive runs the RTO, the tail-loss probe and RACK's reordering
// timer when due.
func (q *QP) expireAdaptive(now clock.Time) {
	r := &q.req
	if r.head == r.end() {
		q.disarmAdaptive()
		return
	}
	if r.sr.on && now >= r.sr.reoAt {
		q.srDetectLoss(now)
	}
	if now >= r.fastAt {
		r.fastAt = clock.Never
		q.fastRetransmit()
		return
	}
	if now >= r.rtoAt && !r.compPSN.Less(r.psn) {
		r.rtoAt = clock.Never // nothing on the wire (a go-back-N rewind): sentPkt arms it
	}
	if now >= r.rtoAt {
		q.AdpRetrans++
		q.AdpRetransTO++
		r.backOff()
		// The RTO resends the oldest unacknowledged packet alone, AckReq
		// (a READ is asked again from there), as a probe: a
		// selective-repeat responder keeps what it received and its SACK
		// tells RACK what else was lost; a go-back-N responder answers
		// with an ACK of the last PSN it has in order, from which the
		// requester goes back N at once if packets were lost
		// (probeAnswered). An RTO that only met a peer slow to answer (a
		// software host's engine descheduled, a guest under emulation)
		// then costs one packet, not a window.
		r.probe, r.probeRTO = true, true
		r.rtoAt = now.Add(q.adpRTO())
		r.ptoAt = clock.Never
		return
	}
	if now >= r.ptoAt {
		r.ptoAt = clock.Never
		if r.compPSN.Less(r.psn) && !q.streamingRead() {
			r.probe = true
		}
	}
}

// goBack is an adaptive go-back-N to p: no retry is spent, and stale NAKs
// for the same gap are ignored until progress, as after a retry.
func (q *QP) goBack(p bth.PSN) {
	r := &q.req
	q.rewind(p)
	r.retrying = true
	r.probe, r.probeOut, r.probeRTO = false, false, false
}

// buildRetransmit emits a packet that repeats an earlier one out of the
// sequential order: the tail-loss probe, then (selective repeat) READ
// ranges asked again and holes.
func (q *QP) buildRetransmit(now clock.Time, buf []byte) int {
	r := &q.req
	if r.rnrWait {
		return 0
	}
	if r.probe {
		r.probe = false
		rto := r.probeRTO
		r.probeRTO = false
		if r.compPSN.Less(r.psn) {
			r.probeOut, r.probePSN, r.probeAt = true, r.compPSN, now
			// A READ whose reply was streaming is asked for one response:
			// a go-back-N responder sends a READ asked again after the
			// reply it is sending, all of it, so that a reply only paused
			// would come twice; one response costs one packet, and when it
			// comes in order the reply had stopped (its tail was lost),
			// and the rest is asked for at once (readProbeAnswered).
			var nRead uint32
			if !r.sr.on && q.streamingRead() {
				nRead = 1
				r.readProbe, r.readProbeOn = r.compPSN, true
			}
			if n := q.buildAt(now, buf, r.compPSN, nRead); n > 0 {
				if !rto { // an RTO's resend was counted when it expired
					q.TLPProbes++
					q.AdpRetrans++
				}
				return n
			}
			r.probeOut = false
		}
	}
	if r.sr.on {
		return q.buildSelective(now, buf)
	}
	return 0
}

// hasRetransmit reports whether buildRetransmit may emit a packet.
func (r *requester) hasRetransmit() bool {
	return !r.rnrWait && (r.probe || r.sr.on && (r.sr.rdn > 0 || r.sr.lost > 0))
}

// entryAt returns the WQE on the wire whose PSN range holds p, or nil.
func (r *requester) entryAt(p bth.PSN) *sendEntry {
	for i := r.head; i != r.end(); i++ {
		e := r.entry(i)
		if e.state == wqePosted {
			return nil
		}
		if !p.Less(e.firstPSN) && p.LessEq(e.lastPSN) {
			return e
		}
	}
	return nil
}

// buildAt writes the request packet that carries PSN p again, with AckReq
// so that the answer comes at once: a SEND/WRITE packet, an atomic, or a
// READ asked again from p (nRead PSNs of it, 0: as far as is missing).
func (q *QP) buildAt(now clock.Time, buf []byte, p bth.PSN, nRead uint32) int {
	r := &q.req
	if !p.Less(r.psn) {
		return 0
	}
	e := r.entryAt(p)
	if e == nil || (e.Opcode.IsAtomic() && p != e.firstPSN) {
		return 0
	}
	if e.Opcode == ib.RDMARead && nRead == 0 {
		nRead = q.readSpan(e, p)
	}
	n := q.writeRequest(buf, e, p, true, nRead)
	q.sentPkt(now, p, true)
	q.RetransPkts++
	return n
}

// answersProbe reports whether a response answers the outstanding probe
// of a go-back-N peer: an ACK of the probed PSN itself. Such a peer answers
// a probe it already had with an ACK of the last PSN it has in order, so
// an ACK that stops at the probe says the probe filled a hole and what
// followed it was dropped. An ACK beyond the probed PSN may be one the
// peer sent before it saw the probe, late because the peer stalled: the
// peer is alive and has more, and the timers restart from it (a tail still
// missing meets the next probe) rather than send back a window the peer
// may already have. (Going back half an SRTT after such an ACK unless more
// progress came, as for a late-looking ACK of the probed PSN, resent
// thousands of packets rxe had in the lab: its ACKs after a stall come
// further apart than that.)
func (r *requester) answersProbe(op bth.Opcode, pp bth.PSN, syn uint8) bool {
	return r.probeOut && !r.sr.on && op.IsAck() && syn&0xE0 == 0 && pp == r.probePSN
}

// ackAsked reports whether a transmission of p other than a probe asked
// for an ACK (with the window full, most do): an ACK of p may then be that
// one's, late.
func (r *requester) ackAsked(p bth.PSN) bool {
	rec := r.tx.get(p)
	return rec != nil && rec.flags&txAckReq != 0
}

// readProbeAnswers reports whether the READ response at pp, a LAST or
// ONLY before its READ's last PSN, is the answer to a one-response probe.
func (r *requester) readProbeAnswers(pp bth.PSN) bool {
	return r.readProbeOn && pp == r.readProbe && !r.sr.on
}

// readProbeAnswered: the one response a probe asked for came in order, so
// the reply had stopped before it. The rest of the READ is asked for at
// once, without a retry spent, as a probe's answer does for SEND/WRITE.
func (q *QP) readProbeAnswered() { q.fastRetransmit() }

// probeAnswered is called once the answer to a probe was processed: every
// packet sent before the probe and still unacknowledged is lost. When the
// probed packet's first copy asked for an ACK too (late), the answer may
// be that copy's, with the ACKs of what followed it right behind: the
// requester waits half an SRTT for them (any progress calls it off)
// before it goes back.
func (q *QP) probeAnswered(now clock.Time, probeAt clock.Time, late bool) {
	r := &q.req
	r.probeOut = false
	if q.failed || !q.reqOn || r.rnrWait || !r.compPSN.Less(r.psn) {
		return
	}
	if rec := r.tx.get(r.compPSN); rec != nil && rec.at >= probeAt {
		return // sent after the probe: may still be on its way
	}
	if late {
		r.fastAt = now.Add(max(r.rtt.srtt/2, time.Microsecond))
		return
	}
	q.fastRetransmit()
}

// fastRetransmit goes back N at once, without a retry spent.
func (q *QP) fastRetransmit() {
	q.FastRetrans++
	q.AdpRetrans++
	q.goBack(q.req.compPSN)
}

// RTT returns the smoothed RTT, its variation and the minimum RTT the QP
// has measured (zero before the first sample).
func (q *QP) RTT() (srtt, rttvar, minRTT time.Duration) {
	e := &q.req.rtt
	return e.srtt, e.rttvar, e.minRTT
}

package rc

import (
	"time"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/ib"
)

type wqeState uint8

const (
	wqePosted  wqeState = iota // not started
	wqeSending                 // some packets (or the READ request) still to send
	wqeSent                    // every packet sent, waiting for the ACK/response
)

// sendEntry is a send WQE in the SQ ring with its progress.
type sendEntry struct {
	ib.SendWQE
	state    wqeState
	firstPSN bth.PSN
	lastPSN  bth.PSN
	sent     uint32 // bytes sent (SEND/WRITE) or READ offset to request from
	got      uint32 // READ: bytes of response placed
	onWire   bool   // some packet of it was sent: firstPSN/lastPSN are valid
}

// requester is the send half: the SQ ring, PSN numbering, the window and
// the retransmission state the completer drives.
type requester struct {
	sq        []sendEntry
	head      uint32 // oldest WQE not completed
	next      uint32 // WQE being sent or to send next
	tail      uint32 // next free slot
	psn       bth.PSN
	maxPSN    bth.PSN // one past the highest PSN ever sent
	compPSN   bth.PSN // oldest PSN not yet acknowledged
	rdAtomic  int     // READ/ATOMIC WQEs in [head, next)
	noAck     int     // packets sent since the last AckReq
	retryLeft uint8
	rnrLeft   uint8
	excused   uint8       // local ACK timeouts since progress that spent no retry
	heard     *clock.Time // when the peer's device was last heard from (HeardFrom)
	timer     clock.Time  // local ACK timeout deadline
	rnrWait   bool
	rnrAt     clock.Time
	rto       clock.Time // timeout duration in ns (0 = none)
	draining  bool
	rnrPSN    bth.PSN // where to resume after the RNR wait
	retrying  bool    // a NAK/lost-response retry is under way, no progress since
	gapPSN    bth.PSN // compPSN when a READ reply gap last triggered a retry

	// Adaptive retransmission (rto.go).
	tx       txRing
	settled  bth.PSN // records before it have been retired
	rtt      rttEstimator
	rtoAt    clock.Time // adaptive retransmission timeout
	ptoAt    clock.Time // tail-loss probe
	backoff  uint8      // RTO expiries in a row without progress
	probe    bool       // a tail-loss probe is due: BuildHeader sends it
	probeRTO bool       // the probe is an RTO's, counted when it expired
	// readProbe is the PSN a one-response READ probe asked for, while
	// readProbeOn: its answer, a LAST or ONLY before the READ's last PSN,
	// may come whatever else was sent since (a local ACK timeout's resend
	// behind it).
	readProbe   bth.PSN
	readProbeOn bool
	probeOut    bool // a probe went out and has not been answered
	probePSN    bth.PSN
	probeAt     clock.Time
	fastAt      clock.Time // a probe's answer that may be late: go back N then
	// A READ reply in progress: progressAt is the last forward progress,
	// readAt the last in-order READ response, and readGap the longest
	// silence between two of them within minRTTWindow (since readGapAt).
	progressAt, readAt, readGapAt clock.Time
	readGap                       time.Duration
	mark                          bool // requests carry the selective-repeat bit
	sr                            srReq
	answered                      bool // a response came from the peer since RTS
}

func (r *requester) init(cfg *Config) {
	r.psn = cfg.SQPSN
	r.maxPSN = cfg.SQPSN
	r.compPSN = cfg.SQPSN
	r.retryLeft = cfg.RetryCnt
	r.rnrLeft = cfg.RNRRetry
	r.timer = clock.Never
	r.rto = clock.Time(AckTimeout(cfg.Timeout))
	r.noAck = 0
	if r.tx.recs == nil {
		r.tx = newTxRing(2 * MaxUnackedPSNs)
	} else {
		clear(r.tx.recs)
	}
	r.settled = cfg.SQPSN
	r.rtt = rttEstimator{}
	r.rtoAt, r.ptoAt, r.fastAt = clock.Never, clock.Never, clock.Never
	r.backoff, r.probe, r.probeOut, r.probeRTO, r.readProbeOn = 0, false, false, false, false
	r.progressAt, r.readAt, r.readGapAt, r.readGap = clock.Never, clock.Never, clock.Never, 0
	r.answered = false
}

// end is one past the last WQE with packets on the wire: next, or next+1
// while the WQE at next is partly sent.
func (r *requester) end() uint32 {
	if r.next != r.tail && r.entry(r.next).state == wqeSending {
		return r.next + 1
	}
	return r.next
}

// sentEnd is one past the last WQE that has been on the wire: beyond
// end(), a go-back-N may have reset WQEs whose PSNs the peer has already
// acknowledged in flight.
func (r *requester) sentEnd() uint32 {
	i := r.end()
	for i != r.tail && r.entry(i).onWire {
		i++
	}
	return i
}

func (r *requester) entry(i uint32) *sendEntry { return &r.sq[i%uint32(len(r.sq))] }

// canSend reports whether buildRequest would emit a packet.
func (r *requester) canSend(q *QP) bool {
	if r.rnrWait || r.next == r.tail {
		return false
	}
	e := r.entry(r.next)
	if e.state == wqePosted {
		if r.draining {
			return false
		}
		if e.Err != ib.Success {
			return r.next == r.head
		}
		if e.Opcode.IsReadOrAtomic() && r.rdAtomic >= q.cfg.MaxRdAtomic {
			return false
		}
		if e.Flags&ib.Fence != 0 && r.rdAtomic > 0 {
			return false
		}
	}
	if !q.cfg.UC && r.psn.Diff(r.compPSN) >= int32(r.window(q)) {
		return false
	}
	return q.ccWindowOpen()
}

// InitialWindow is how many PSNs an adaptive requester has outstanding
// before its peer's first answer: when many QPs start toward one host at
// once, each full window at once overflows its receive buffers before any
// of them can have heard back (64 QPs × 129 PSNs is 8256 packets, against
// the 2048 frames of an AF_XDP socket's default ring).
const InitialWindow = 8

// window is how many PSNs may be outstanding (from compPSN) before a new
// packet starts: as rxe, MaxUnackedPSNs+1 (a packet may start while its
// PSN is at most MaxUnackedPSNs past the oldest unacknowledged); with
// selective repeat the BDP window, within the responder's receive window;
// InitialWindow before any answer, with adaptive retransmission and no
// congestion control or DCQCN: DCQCN starts at line rate, and the
// host-congestion CNPs of a receiver that many QPs start toward at once
// come a round trip too late for the first windows. Swift paces its start
// with its own window, and TIMELY reads its first RTTs from the start as
// it is (its rate steers on their gradient).
func (r *requester) window(q *QP) int {
	w := MaxUnackedPSNs + 1
	if r.sr.on {
		w = r.sr.win
		if r.sr.peerWin > 0 {
			w = min(w, r.sr.peerWin)
		}
	}
	if !r.answered && q.adaptive() && (q.cc == nil || q.cc.algo == DCQCN) {
		w = min(w, InitialWindow)
	}
	return w
}

// buildRequest emits the next request packet of the WQE at next.
func (q *QP) buildRequest(now clock.Time, buf []byte) int {
	r := &q.req
	if !r.canSend(q) {
		return 0
	}
	e := r.entry(r.next)
	if e.state == wqePosted {
		if e.Err != ib.Success {
			// A local error found at post: complete it in order, then ERR
			// (RC) or SQE (UC: the send queue stops, receiving goes on).
			q.complete(ib.WC{ID: e.ID, Status: e.Err, Opcode: e.Opcode.WCOpcode()})
			e.SG = e.SG[:0]
			r.head++
			r.next++
			if q.cfg.UC {
				q.sqErr, q.reqOn = true, false
				return 0
			}
			q.fail(e.Err)
			return 0
		}
		e.firstPSN = r.psn
		e.sent, e.got = 0, 0
		e.onWire = true
		switch {
		case e.Opcode.IsAtomic():
			e.lastPSN = r.psn
		default:
			e.lastPSN = r.psn.Add(pktsFor(e.Length, q.cfg.MTU) - 1)
		}
		e.state = wqeSending
		if e.Opcode.IsReadOrAtomic() {
			r.rdAtomic++
		}
	}
	p := r.psn
	retx := false
	if p.Less(r.maxPSN) {
		q.RetransPkts++ // a go-back-N resending what went out before
	}
	var n int
	ackReq := false // a SEND/WRITE packet asking for an ACK
	switch e.Opcode {
	case ib.RDMARead:
		retx = e.sent > 0 // asked again from an offset after a go-back-N
		n = q.writeRequest(buf, e, p, true, 0)
		r.psn = r.psn.Add(pktsFor(e.Length-e.sent, q.cfg.MTU))
		r.noAck = 0
		e.state = wqeSent
		r.next++
	case ib.AtomicCmpAndSwp, ib.AtomicFetchAndAdd:
		n = q.writeRequest(buf, e, p, true, 0)
		r.psn = r.psn.Next()
		r.noAck = 0
		e.state = wqeSent
		r.next++
	default:
		remain := e.Length - e.sent
		last := remain <= uint32(q.cfg.MTU)
		// AckReq on every message's last packet and, exactly as rxe
		// counts (noack_pkts++ > RXE_MAX_PKT_PER_ACK), on the 66th packet
		// in a row without one, so that long messages are acknowledged
		// as they go (with selective repeat, four times per window).
		ackReq = last
		if !last {
			// With adaptive retransmission a packet that fills the
			// window asks too: nothing more can be sent, hence nothing
			// else would ask, until it is acknowledged (the initial
			// window, a small receive window). rxe does not.
			ackReq = r.noAck > q.ackSpacing() || q.adaptive() && r.psn.Next().Diff(r.compPSN) >= int32(r.window(q))
			r.noAck++
		}
		if ackReq {
			r.noAck = 0
		}
		n = q.writeRequest(buf, e, p, ackReq, 0)
		r.psn = r.psn.Next()
		e.sent += min(remain, uint32(q.cfg.MTU))
		if last {
			e.state = wqeSent
			r.next++
			if q.cfg.UC {
				// UC has no acknowledgement: the WQE is done once sent.
				q.completeSend(e, ib.Success)
				r.head++
				r.compPSN = r.psn
			}
		}
	}
	if r.psn.Diff(r.maxPSN) > 0 {
		r.maxPSN = r.psn
	}
	if !q.cfg.UC {
		q.sentPkt(now, p, retx)
		if rec := r.tx.get(p); rec != nil && ackReq {
			rec.flags |= txAckReq
		}
		if r.timer == clock.Never && r.rto != 0 {
			r.timer = now + r.rto
		}
	}
	return n
}

// ackEvery is how many packets in a row may go without AckReq.
func (r *requester) ackEvery(q *QP) int {
	if r.sr.on {
		return min(MaxPktPerAck, max(r.window(q)/4, 1))
	}
	return MaxPktPerAck
}

// writeRequest writes into buf the headers of the request packet of e at
// PSN p, describes its payload in q.pay and returns the headers' length;
// it changes no requester state. A READ asks for nRead
// PSNs of the reply from p (0: to the end of the READ). The last packet of
// a SEND/WRITE always has AckReq (RC).
func (q *QP) writeRequest(buf []byte, e *sendEntry, p bth.PSN, ackReq bool, nRead uint32) int {
	mtu := uint32(q.cfg.MTU)
	off := uint32(p.Diff(e.firstPSN)) * mtu
	var n int
	switch e.Opcode {
	case ib.RDMARead:
		remain := e.Length - off
		if nRead > 0 {
			remain = min(remain, nRead*mtu)
		}
		h := bth.RCRDMAReadRequest
		q.encodeBTH(buf, h, p, true, false, 0)
		bth.RETH(buf[bth.BTHLen:]).Encode(e.RemoteAddr+uint64(off), e.RKey, remain)
		n = h.HeaderLen()
	case ib.AtomicCmpAndSwp, ib.AtomicFetchAndAdd:
		h := bth.RCFetchAdd
		swap, cmp := e.SwapAdd, uint64(0)
		if e.Opcode == ib.AtomicCmpAndSwp {
			h, cmp = bth.RCCompareSwap, e.Compare
		}
		q.encodeBTH(buf, h, p, true, false, 0)
		bth.AtomicETH(buf[bth.BTHLen:]).Encode(e.RemoteAddr, e.RKey, swap, cmp)
		n = h.HeaderLen()
	default:
		remain := e.Length - off
		first := off == 0
		last := remain <= mtu
		pay := remain
		if !last {
			pay = mtu
		}
		op := requestOpcode(e.Opcode, first, last, q.cfg.UC)
		ackReq = (ackReq || last) && !q.cfg.UC
		pad := int(-pay & 3)
		q.encodeBTH(buf, op, p, ackReq, last && e.Flags&ib.Solicited != 0, pad)
		if o := op.Offset(bth.ExtRETH); o >= 0 {
			bth.RETH(buf[o:]).Encode(e.RemoteAddr, e.RKey, e.Length)
		}
		if o := op.Offset(bth.ExtImmDt); o >= 0 {
			bth.ImmDt(buf[o:]).SetImm(e.Imm)
		}
		if o := op.Offset(bth.ExtIETH); o >= 0 {
			bth.IETH(buf[o:]).SetRKey(e.InvRKey)
		}
		q.pay.Set(e.SG, off, pay)
		n = op.HeaderLen()
	}
	if q.req.mark {
		bth.BTH(buf).SetSR(true)
	}
	return n
}

// requestOpcode picks the wire opcode for a SEND/WRITE packet.
func requestOpcode(o ib.WROpcode, first, last, uc bool) bth.Opcode {
	var op bth.Opcode
	switch o {
	case ib.RDMAWrite, ib.RDMAWriteWithImm:
		switch {
		case first && last:
			op = bth.RCRDMAWriteOnly
			if o == ib.RDMAWriteWithImm {
				op = bth.RCRDMAWriteOnlyImm
			}
		case first:
			op = bth.RCRDMAWriteFirst
		case last:
			op = bth.RCRDMAWriteLast
			if o == ib.RDMAWriteWithImm {
				op = bth.RCRDMAWriteLastImm
			}
		default:
			op = bth.RCRDMAWriteMiddle
		}
	default:
		switch {
		case first && last:
			switch o {
			case ib.SendWithImm:
				op = bth.RCSendOnlyImm
			case ib.SendWithInv:
				op = bth.RCSendOnlyInv
			default:
				op = bth.RCSendOnly
			}
		case first:
			op = bth.RCSendFirst
		case last:
			switch o {
			case ib.SendWithImm:
				op = bth.RCSendLastImm
			case ib.SendWithInv:
				op = bth.RCSendLastInv
			default:
				op = bth.RCSendLast
			}
		default:
			op = bth.RCSendMiddle
		}
	}
	if uc {
		op += 0x20
	}
	return op
}

// completeSend posts the completion of a send WQE: always on error, on
// success only if signaled.
func (q *QP) completeSend(e *sendEntry, st ib.WCStatus) {
	if st != ib.Success || e.Flags&ib.Signaled != 0 {
		bl := e.Length
		if st != ib.Success {
			bl = 0
		}
		q.complete(ib.WC{ID: e.ID, Status: st, Opcode: e.Opcode.WCOpcode(), ByteLen: bl})
	}
	e.SG = e.SG[:0]
}

// rewind restarts sending at PSN p (go-back-N): the WQE holding p resumes
// at that packet, every later WQE starts over with the same PSNs.
func (q *QP) rewind(p bth.PSN) {
	q.Retransmits++
	q.seek(p)
	q.srRewound()
}

// seek makes p the next PSN to send, backwards (go-back-N) or forwards
// (an ACK showed the peer already has what a go-back-N was about to
// resend). The WQE holding p resumes at its packet; WQEs after it start
// over with the PSNs they had.
func (q *QP) seek(p bth.PSN) {
	r := &q.req
	i := r.head
	limit := r.sentEnd()
	for ; i != limit; i++ {
		if p.LessEq(r.entry(i).lastPSN) {
			break
		}
	}
	r.rdAtomic = 0
	for j := r.head; j != i; j++ {
		e := r.entry(j)
		if e.state == wqePosted {
			e.state = wqeSent // on the wire before, awaiting its ACK
		}
		if e.Opcode.IsReadOrAtomic() {
			r.rdAtomic++
		}
	}
	for j := i; j != limit; j++ {
		e := r.entry(j)
		if j == i && e.firstPSN.Less(p) && p.LessEq(e.lastPSN) {
			e.sent = uint32(p.Diff(e.firstPSN)) * uint32(q.cfg.MTU)
			e.state = wqeSending
			if e.Opcode.IsReadOrAtomic() {
				r.rdAtomic++
			}
			r.psn = p
			continue
		}
		if j == i {
			r.psn = e.firstPSN
		}
		e.state = wqePosted
	}
	if i == limit {
		r.psn = p
	}
	r.next = i
	r.noAck = 0
}

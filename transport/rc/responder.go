package rc

import (
	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/ib"
)

type resKind uint8

const (
	resFree resKind = iota
	resRead
	resAtomic
)

// resource remembers one READ or ATOMIC the responder executed, so that a
// duplicate request is answered again instead of re-executed (IBA C9-148,
// rxe's responder resources). The table is a ring sized from
// max_dest_rd_atomic; the oldest entry is reused first.
type resource struct {
	kind   resKind
	first  bth.PSN
	last   bth.PSN
	va     uint64
	rkey   uint32
	length uint32
	mem    ib.Seg // the whole READ range, resolved when first executed
	orig   uint64 // ATOMIC: the value before the operation
}

type itemKind uint8

const (
	itemAck itemKind = iota
	itemRead
	itemAtomic
	itemCancelled // a replay whose resource was reused; skipped
)

// respItem is one queued response: an ACK/NAK, a READ reply stream or an
// ATOMIC ACK. Responses leave in the order their requests arrived.
type respItem struct {
	kind   itemKind
	syn    uint8
	psn    bth.PSN
	msn    uint32
	res    int
	off    uint32 // READ: offset in res.mem of the next packet
	remain uint32 // READ: bytes still to send
	start  bool   // READ: the next packet opens the reply (FIRST/ONLY)
	orig   uint64 // ATOMIC
}

const (
	msgNone uint8 = iota
	msgSend
	msgWrite
)

type responder struct {
	ePSN    bth.PSN // expected PSN
	msn     uint32  // messages completed (24 bits)
	nakSent bool    // a PSN sequence NAK went out for the current gap
	inMsg   uint8   // inside a multi-packet SEND or WRITE
	dropMsg bool    // UC: drop until the next FIRST/ONLY

	cur      ib.RecvWQE // receive WQE being filled
	haveRecv bool
	recvOff  uint32

	wmem ib.Seg // WRITE target
	woff uint32
	wlen uint32

	res     []resource
	resHead int

	q        []respItem
	qhead    int
	qlen     int
	final    respItem // the NAK of a fatal error, sent even after ERR
	hasFinal bool

	sr   bool     // selective repeat agreed with the requester (srresp.go)
	held holdRing // requests that came out of order
	// win is the receive window the device last granted the requester
	// (transport.Meta.RecvWindow), which the SACKETH carries; acked is the
	// PSN of the last ACK queued.
	win     int
	granted int // the window the last SACKETH granted
	acked   bth.PSN
	// heldQuiet counts requests held since the last ACK queued that went
	// unacknowledged (srHoldRequest).
	heldQuiet int

	ctr *Counters // the QP's
}

func (s *responder) init(cfg Config) {
	s.ePSN = cfg.RQPSN
	s.acked = cfg.RQPSN.Prev()
	s.msn = 0
	s.nakSent = false
	s.inMsg = msgNone
	n := 1
	for n < cfg.MaxDestRdAtomic {
		n <<= 1
	}
	if len(s.res) != n {
		s.res = make([]resource, n)
		s.q = make([]respItem, 2*n+8)
	}
	s.qhead, s.qlen, s.resHead = 0, 0, 0
}

// pushFront queues it before everything else: a READ range a
// selective-repeat requester asks for again fills a hole it waits on,
// while the reply in progress only adds to what it holds.
func (s *responder) pushFront(it respItem) {
	if s.qlen == len(s.q) {
		s.ctr.RespQueueFull++
		return
	}
	s.qhead = (s.qhead + len(s.q) - 1) % len(s.q)
	s.q[s.qhead] = it
	s.qlen++
}

// push queues it last. A full queue drops it, as if the response were
// lost: the requester asks again.
func (s *responder) push(it respItem) {
	if s.qlen == len(s.q) {
		s.ctr.RespQueueFull++
		return
	}
	s.q[(s.qhead+s.qlen)%len(s.q)] = it
	s.qlen++
}

// pushAck queues an ACK, merging it into a queued ACK right before it:
// the later one covers everything the earlier one did (coalescing).
func (s *responder) pushAck(syn uint8, psn bth.PSN, msn uint32) {
	if syn == SynACK {
		s.acked = psn
		s.heldQuiet = 0
	}
	if s.qlen > 0 {
		t := &s.q[(s.qhead+s.qlen-1)%len(s.q)]
		if t.kind == itemAck && t.syn == SynACK && syn == SynACK {
			t.psn, t.msn = psn, msn
			return
		}
	}
	s.push(respItem{kind: itemAck, syn: syn, psn: psn, msn: msn})
}

// owedAck is the last positive ACK queued before the first queued reply
// that carries data (a READ response, an atomic acknowledgement, which an
// ACK must not overtake): the acknowledgement of requests executed here
// whose completions the application may already have seen.
func (s *responder) owedAck() (respItem, bool) {
	var ack respItem
	found := false
	for k := 0; k < s.qlen; k++ {
		it := s.q[(s.qhead+k)%len(s.q)]
		switch {
		case it.kind == itemCancelled:
		case it.kind == itemAck && it.syn == SynACK:
			ack, found = it, true
		case it.kind == itemAck:
		default:
			return ack, found
		}
	}
	return ack, found
}

// receiveRequest is the responder. pay is pkt[hl:end].
func (q *QP) receiveRequest(pkt []byte, op bth.Opcode, hl, end int) {
	s := &q.resp
	h := bth.BTH(pkt)
	pp := h.PSN()
	if q.cfg.UC {
		if s.dropMsg || pp != s.ePSN {
			if !op.StartsMessage() {
				s.dropMsg = true
				q.RxOutOfSeq++
				return
			}
			// A new message after a gap: resynchronise on it and reuse a
			// partly filled receive WQE from the lost message.
			s.dropMsg = false
			s.inMsg = msgNone
			s.recvOff = 0
			s.ePSN = pp
		}
	} else {
		if h.SR() && !s.sr && q.srAllowed() {
			q.srRespStart() // the requester asked for selective repeat
		}
		d := pp.Diff(s.ePSN)
		if d > 0 {
			q.RxOutOfSeq++
			if s.sr {
				q.srHoldRequest(pkt, pp, d)
				return
			}
			if !s.nakSent {
				s.nakSent = true
				s.pushAck(SynNAKPSNSeq, s.ePSN, s.msn)
				q.TxNAKs++
			}
			return
		}
		if d < 0 {
			q.duplicate(pkt, op, pp)
			return
		}
		s.nakSent = false
	}
	q.execRequest(pkt, op, hl, end, pp)
	if s.sr && s.held.n > 0 {
		q.srDrain()
	}
}

// execRequest executes the request packet with the expected PSN.
func (q *QP) execRequest(pkt []byte, op bth.Opcode, hl, end int, pp bth.PSN) {
	s := &q.resp
	// Opcode sequence (IBA 9.7.5.1.4 / C9-92): a message in progress must
	// go on with MIDDLE or LAST of its own kind; otherwise only a new
	// message may start.
	switch s.inMsg {
	case msgSend:
		if !op.IsSend() || !(op.IsMiddle() || op.IsLast()) {
			q.reject(pp, SynNAKInvReq, ib.RemInvReqErr)
			return
		}
	case msgWrite:
		if !op.IsWrite() || !(op.IsMiddle() || op.IsLast()) {
			q.reject(pp, SynNAKInvReq, ib.RemInvReqErr)
			return
		}
	default:
		if !op.StartsMessage() {
			q.reject(pp, SynNAKInvReq, ib.RemInvReqErr)
			return
		}
	}
	// The QP's access flags decide which remote operations it serves.
	acc := q.cfg.Access
	if (op.IsWrite() && acc&ib.RemoteWrite == 0) || (op.IsReadRequest() && acc&ib.RemoteRead == 0) ||
		(op.IsAtomic() && acc&ib.RemoteAtomic == 0) || op.IsFlush() || op.IsAtomicWrite() {
		q.reject(pp, SynNAKInvReq, ib.RemInvReqErr)
		return
	}
	pay := pkt[hl:end]
	if op.HasPayload() {
		// Segmentation: FIRST/MIDDLE exactly one MTU, LAST 1..MTU,
		// ONLY 0..MTU (C9-26, rxe check_length).
		n, mtu := len(pay), q.cfg.MTU
		bad := false
		switch {
		case op.IsFirst(), op.IsMiddle():
			bad = n != mtu
		case op.IsLast():
			bad = n == 0 || n > mtu
		default:
			bad = n > mtu
		}
		if bad {
			q.reject(pp, SynNAKInvReq, ib.RemInvReqErr)
			return
		}
	}
	switch {
	case op.IsSend():
		q.execSend(pkt, op, pay, pp)
	case op.IsWrite():
		if op.StartsMessage() {
			q.RxWriteReqs++
		}
		q.execWrite(pkt, op, pay, pp)
	case op.IsReadRequest():
		q.RxReadReqs++
		q.execRead(pkt, op, pp)
	case op.IsAtomic():
		q.RxAtomicReqs++
		q.execAtomic(pkt, op, pp)
	default:
		q.reject(pp, SynNAKInvReq, ib.RemInvReqErr)
	}
}

// takeRecv makes sure a receive WQE is held, sending an RNR NAK (RC) or
// dropping the message (UC) when none is posted.
func (q *QP) takeRecv(pp bth.PSN) bool {
	s := &q.resp
	if s.haveRecv {
		return true
	}
	if q.rq == nil || !q.rq.Take(&s.cur) {
		if q.cfg.UC {
			s.dropMsg = true
			q.RxDropped++
			return false
		}
		// Receiver not ready: the requester waits min_rnr_timer and
		// resends from this PSN; nothing is executed.
		s.pushAck(SynRNRNAK|q.cfg.MinRNRTimer&31, pp, s.msn)
		q.TxRNRNAKs++
		return false
	}
	s.haveRecv = true
	s.recvOff = 0
	if s.cur.Err != ib.Success {
		// A receive WQE whose scatter list failed its lkey checks: class A
		// (remote operational error), the WQE completes with its error.
		q.reject(pp, SynNAKRemOp, s.cur.Err)
		return false
	}
	return true
}

func (q *QP) execSend(pkt []byte, op bth.Opcode, pay []byte, pp bth.PSN) {
	s := &q.resp
	if op.StartsMessage() && !q.takeRecv(pp) {
		return
	}
	if !s.haveRecv {
		q.reject(pp, SynNAKInvReq, ib.RemInvReqErr)
		return
	}
	if uint64(s.recvOff)+uint64(len(pay)) > uint64(s.cur.Length) {
		q.reject(pp, SynNAKInvReq, ib.LocLenErr)
		return
	}
	ib.CopyOut(s.cur.SG, s.recvOff, pay)
	s.recvOff += uint32(len(pay))
	if op.IsLast() || op.IsOnly() {
		wc := ib.WC{ID: s.cur.ID, Opcode: ib.WCRecv, ByteLen: s.recvOff, IsRecv: true}
		if bth.BTH(pkt).SE() {
			wc.Flags |= ib.WCSolicited
		}
		if o := op.Offset(bth.ExtImmDt); o >= 0 {
			wc.Flags |= ib.WCWithImm
			wc.Imm = bth.ImmDt(pkt[o:]).Imm()
		}
		if o := op.Offset(bth.ExtIETH); o >= 0 {
			rk := bth.IETH(pkt[o:]).RKey()
			if q.mem == nil || !q.mem.Invalidate(rk) {
				q.reject(pp, SynNAKInvReq, ib.RemInvReqErr)
				return
			}
			wc.Flags |= ib.WCWithInv
			wc.InvRKey = rk
		}
		q.complete(wc)
		s.haveRecv = false
		s.cur.SG = s.cur.SG[:0]
		s.inMsg = msgNone
		s.msn = (s.msn + 1) & bth.PSNMask
	} else {
		s.inMsg = msgSend
	}
	q.accepted(pkt, pp)
}

func (q *QP) execWrite(pkt []byte, op bth.Opcode, pay []byte, pp bth.PSN) {
	s := &q.resp
	imm := op.HasImm()
	if imm && !q.takeRecv(pp) {
		return
	}
	if op.StartsMessage() {
		reth := bth.RETH(pkt[op.Offset(bth.ExtRETH):])
		n := reth.DMALen()
		if uint64(n) > MaxReadLen || (op.IsOnly() && int(n) != len(pay)) || (op.IsFirst() && int(n) <= len(pay)) {
			q.reject(pp, SynNAKInvReq, ib.RemInvReqErr)
			return
		}
		s.wmem = ib.Seg{}
		if n > 0 {
			m, ok := q.resolve(reth.RKey(), reth.VA(), uint64(n), ib.RemoteWrite)
			if !ok {
				q.reject(pp, SynNAKRemAccess, ib.RemAccessErr)
				return
			}
			s.wmem = m
		}
		s.woff, s.wlen = 0, n
	}
	if uint64(s.woff)+uint64(len(pay)) > uint64(s.wlen) {
		q.reject(pp, SynNAKInvReq, ib.RemInvReqErr)
		return
	}
	end := op.IsLast() || op.IsOnly()
	if end && s.woff+uint32(len(pay)) != s.wlen {
		q.reject(pp, SynNAKInvReq, ib.RemInvReqErr)
		return
	}
	s.wmem.WriteAt(s.woff, pay)
	s.woff += uint32(len(pay))
	if end {
		if imm {
			wc := ib.WC{ID: s.cur.ID, Opcode: ib.WCRecvRDMAWithImm, Flags: ib.WCWithImm, ByteLen: s.wlen,
				Imm: bth.ImmDt(pkt[op.Offset(bth.ExtImmDt):]).Imm(), IsRecv: true}
			if bth.BTH(pkt).SE() {
				wc.Flags |= ib.WCSolicited
			}
			q.complete(wc)
			s.haveRecv = false
			s.cur.SG = s.cur.SG[:0]
		}
		s.inMsg = msgNone
		s.wmem = ib.Seg{}
		s.msn = (s.msn + 1) & bth.PSNMask
	} else {
		s.inMsg = msgWrite
	}
	q.accepted(pkt, pp)
}

func (q *QP) resolve(rkey uint32, va, n uint64, acc ib.Access) (ib.Seg, bool) {
	if q.mem == nil {
		return ib.Seg{}, false
	}
	m, ok := q.mem.Resolve(rkey, va, n, acc)
	if !ok || uint64(m.Len()) != n {
		return ib.Seg{}, false
	}
	return m, true
}

// accepted moves past an executed SEND/WRITE packet and ACKs it when asked.
func (q *QP) accepted(pkt []byte, pp bth.PSN) {
	s := &q.resp
	s.ePSN = pp.Next()
	if !q.cfg.UC && (bth.BTH(pkt).AckReq() || s.sr && s.win > 0 && pp.Diff(s.acked) >= int32(max(s.win/4, 1))) {
		// With selective repeat the responder also acknowledges every
		// quarter of the receive window it granted: a window that shrank
		// while packets were on their way may leave the requester unable
		// to send, with none of the packets it did send asking for an
		// ACK.
		s.pushAck(SynACK, pp, s.msn)
	}
}

// cancelReads cancels every queued reply that reads resource i.
func (s *responder) cancelReads(i int) {
	for k := 0; k < s.qlen; k++ {
		it := &s.q[(s.qhead+k)%len(s.q)]
		if it.kind == itemRead && it.res == i {
			it.kind = itemCancelled
		}
	}
}

// newResource takes the next slot of the resource ring (the oldest), or -1
// when the response queue is full. A reply still queued on the reused slot
// can only be a replay for a stale duplicate (a peer honouring
// max_rd_atomic has completed the original by now), so it is cancelled,
// as rxe overwrites its oldest resource.
func (s *responder) newResource() int {
	if s.qlen >= len(s.q)-1 {
		return -1
	}
	i := s.resHead
	s.cancelReads(i)
	s.resHead = (s.resHead + 1) % len(s.res)
	return i
}

func (q *QP) execRead(pkt []byte, op bth.Opcode, pp bth.PSN) {
	s := &q.resp
	reth := bth.RETH(pkt[op.Offset(bth.ExtRETH):])
	n := reth.DMALen()
	if uint64(n) > MaxReadLen {
		q.reject(pp, SynNAKInvReq, ib.RemInvReqErr)
		return
	}
	var m ib.Seg
	if n > 0 { // a zero-length READ names no memory (C9-88)
		var ok bool
		if m, ok = q.resolve(reth.RKey(), reth.VA(), uint64(n), ib.RemoteRead); !ok {
			q.reject(pp, SynNAKRemAccess, ib.RemAccessErr)
			return
		}
	}
	i := s.newResource()
	if i < 0 {
		q.RxDropped++ // no room to answer: as if lost, the requester resends
		return
	}
	npk := pktsFor(n, q.cfg.MTU)
	s.res[i] = resource{kind: resRead, first: pp, last: pp.Add(npk - 1), va: reth.VA(), rkey: reth.RKey(), length: n, mem: m}
	s.msn = (s.msn + 1) & bth.PSNMask
	s.ePSN = pp.Add(npk)
	s.push(respItem{kind: itemRead, psn: pp, msn: s.msn, res: i, remain: n, start: true})
}

func (q *QP) execAtomic(pkt []byte, op bth.Opcode, pp bth.PSN) {
	s := &q.resp
	a := bth.AtomicETH(pkt[op.Offset(bth.ExtAtomicETH):])
	if a.VA()%8 != 0 {
		q.reject(pp, SynNAKInvReq, ib.RemInvReqErr)
		return
	}
	m, ok := q.resolve(a.RKey(), a.VA(), 8, ib.RemoteAtomic)
	if !ok {
		q.reject(pp, SynNAKRemAccess, ib.RemAccessErr)
		return
	}
	i := s.newResource()
	if i < 0 {
		q.RxDropped++
		return
	}
	var orig uint64
	if op == bth.RCCompareSwap {
		orig = m.CmpSwap(a.Compare(), a.SwapAdd())
	} else {
		orig = m.FetchAdd(a.SwapAdd())
	}
	s.res[i] = resource{kind: resAtomic, first: pp, last: pp, va: a.VA(), rkey: a.RKey(), length: 8, orig: orig}
	s.msn = (s.msn + 1) & bth.PSNMask
	s.ePSN = pp.Next()
	s.push(respItem{kind: itemAtomic, psn: pp, msn: s.msn, orig: orig})
}

// duplicate answers a request whose PSN is before the expected one (C9-105
// and following): SEND/WRITE are ACKed again without being executed,
// READs are replayed from the resource table (re-reading memory), ATOMICs
// get their stored result; anything not in the table is dropped.
func (q *QP) duplicate(pkt []byte, op bth.Opcode, pp bth.PSN) {
	s := &q.resp
	q.RxDuplicate++
	switch {
	case op.IsSend() || op.IsWrite():
		s.pushAck(SynACK, s.ePSN.Prev(), s.msn)
	case op.IsReadRequest():
		reth := bth.RETH(pkt[op.Offset(bth.ExtRETH):])
		for i := range s.res {
			r := &s.res[i]
			if r.kind != resRead || pp.Less(r.first) || r.last.Less(pp) {
				continue
			}
			va, n := reth.VA(), uint64(reth.DMALen())
			if reth.RKey() != r.rkey || va < r.va || va+n > r.va+uint64(r.length) || va+n < va {
				q.RxDropped++
				return
			}
			off := uint32(va - r.va)
			if uint32(pp.Diff(r.first))*uint32(q.cfg.MTU) != off && n > 0 {
				q.RxDropped++
				return
			}
			it := respItem{kind: itemRead, psn: pp, msn: s.msn, res: i, off: off, remain: uint32(n), start: true}
			if s.sr {
				q.srReplayRead(it)
				return
			}
			// A reply to this READ still queued or half sent is what the
			// requester gave up on: replace it rather than queue the
			// replay behind it (an 8 MiB reply takes longer than a
			// requester's timeout, which would fire again and again).
			s.cancelReads(i)
			s.push(it)
			return
		}
		q.RxDropped++
	case op.IsAtomic():
		for i := range s.res {
			r := &s.res[i]
			if r.kind == resAtomic && r.first == pp {
				s.push(respItem{kind: itemAtomic, psn: pp, msn: s.msn, orig: r.orig})
				return
			}
		}
		q.RxDropped++
	default:
		q.RxDropped++
	}
}

// reject handles a request that fails a check. RC: class C error (NAK with
// syn, the receive WQE in progress completes with recvSt, QP to ERR). UC:
// the message is silently dropped; a receive WQE in progress is kept for
// the next message unless the error is its own (length).
func (q *QP) reject(pp bth.PSN, syn uint8, recvSt ib.WCStatus) {
	s := &q.resp
	switch {
	case syn == SynNAKRemAccess:
		q.RemAccessErrs++
	case recvSt == ib.LocLenErr:
		q.LocalLengthErrs++
	}
	if q.cfg.UC {
		s.dropMsg = true
		s.inMsg = msgNone
		if s.haveRecv && (recvSt == ib.LocLenErr || s.cur.Err != ib.Success) {
			q.complete(ib.WC{ID: s.cur.ID, Status: recvSt, Opcode: ib.WCRecv, IsRecv: true})
			s.haveRecv = false
		}
		s.recvOff = 0
		q.RxDropped++
		return
	}
	if s.haveRecv {
		q.complete(ib.WC{ID: s.cur.ID, Status: recvSt, Opcode: ib.WCRecv, IsRecv: true})
		s.haveRecv = false
	}
	s.final = respItem{kind: itemAck, syn: syn, psn: pp, msn: s.msn}
	s.hasFinal = true
	s.qhead, s.qlen = 0, 0
	q.TxNAKs++
	// IBA's affiliated errors of a responder: an access violation (class
	// C) and an invalid request (class B) each have their event.
	ev := ib.EventQPFatal
	switch syn {
	case SynNAKRemAccess:
		ev = ib.EventQPAccessErr
	case SynNAKInvReq:
		ev = ib.EventQPReqErr
	}
	q.failAs(recvSt, ev)
}

// buildResponse emits the packet at the head of the response queue (a
// READ response's payload in q.pay).
func (q *QP) buildResponse(buf []byte) int {
	s := &q.resp
	if s.qlen == 0 {
		if s.hasFinal {
			s.hasFinal = false
			return q.writeAck(buf, s.final.psn, s.final.syn, s.final.msn)
		}
		return 0
	}
	it := &s.q[s.qhead]
	for it.kind == itemCancelled {
		s.pop()
		if s.qlen == 0 {
			return q.buildResponse(buf)
		}
		it = &s.q[s.qhead]
	}
	switch it.kind {
	case itemAck:
		n := q.writeAck(buf, it.psn, it.syn, it.msn)
		s.pop()
		return n
	case itemAtomic:
		op := bth.RCAtomicAcknowledge
		q.encodeBTH(buf, op, it.psn, false, false, 0)
		bth.BTH(buf).SetSR(s.sr)
		bth.AETH(buf[op.Offset(bth.ExtAETH):]).Encode(SynACK, it.msn)
		bth.AtomicAckETH(buf[op.Offset(bth.ExtAtomicAckETH):]).SetOrig(it.orig)
		s.pop()
		return op.HeaderLen()
	default:
		// itemRead: the reply's next packet, below. (Cancelled items
		// were skipped above.)
	}
	mtu := uint32(q.cfg.MTU)
	pay := it.remain
	last := pay <= mtu
	if !last {
		pay = mtu
	}
	var op bth.Opcode
	switch {
	case it.start && last:
		op = bth.RCRDMAReadResponseOnly
	case it.start:
		op = bth.RCRDMAReadResponseFirst
	case last:
		op = bth.RCRDMAReadResponseLast
	default:
		op = bth.RCRDMAReadResponseMiddle
	}
	pad := int(-pay & 3)
	q.encodeBTH(buf, op, it.psn, false, false, pad)
	bth.BTH(buf).SetSR(s.sr)
	if o := op.Offset(bth.ExtAETH); o >= 0 {
		bth.AETH(buf[o:]).Encode(SynACK, it.msn)
	}
	q.pay.SetSeg(s.res[it.res].mem, it.off, pay)
	it.psn = it.psn.Next()
	it.off += pay
	it.remain -= pay
	it.start = false
	if last {
		s.pop()
	}
	return op.HeaderLen()
}

func (s *responder) pop() {
	s.qhead = (s.qhead + 1) % len(s.q)
	s.qlen--
}

// writeAck writes an ACK or NAK; with selective repeat it carries the SR
// bit and a SACKETH from the PSN after the one it acknowledges.
func (q *QP) writeAck(buf []byte, psn bth.PSN, syn uint8, msn uint32) int {
	q.encodeBTH(buf, bth.RCAcknowledge, psn, false, false, 0)
	bth.AETH(buf[bth.BTHLen:]).Encode(syn, msn)
	n := bth.BTHLen + bth.AETHLen
	if q.resp.sr {
		bth.BTH(buf).SetSR(true)
		n += q.writeSACK(buf[n:], psn.Next())
	}
	return n
}

package ud

import (
	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/transport"
)

// Config holds a UD QP's attributes.
type Config struct {
	QPN   uint32
	QKey  uint32 // checked on receive; used when a WR's Q_Key has its high bit set
	PKey  uint16
	MTU   int
	SQPSN bth.PSN
}

// Counters count drops.
type Counters struct {
	RxBadQKey  uint64
	RxNoRecv   uint64
	RxDropped  uint64
	TxTooLong  uint64
	RxTooLong  uint64
	RxReceived uint64
}

// QP is one UD queue pair's transport state.
type QP struct {
	cfg            Config
	rq             ib.RecvQueue
	sq             []ib.SendWQE
	head, tail     uint32
	psn            bth.PSN
	sendOn, recvOn bool
	draining       bool // SQD: no new WQE starts
	sqErr          bool // a send WQE failed locally: the SQ stopped (SQE)
	cur            ib.RecvWQE
	wcs            []ib.WC
	Counters
}

// New returns a UD QP that neither sends nor receives until Receiver and
// Sender are called.
func New(qpn uint32, sqDepth, maxSGE int, rq ib.RecvQueue) *QP {
	if sqDepth < 1 {
		sqDepth = 1
	}
	q := &QP{rq: rq, sq: make([]ib.SendWQE, sqDepth), wcs: make([]ib.WC, 0, sqDepth+64)}
	q.cfg.QPN = qpn
	for i := range q.sq {
		q.sq[i].SG = make([]ib.Seg, 0, maxSGE)
	}
	q.cur.SG = make([]ib.Seg, 0, maxSGE)
	return q
}

var (
	_ transport.Transport = (*QP)(nil)
	_ transport.Addressed = (*QP)(nil)
)

// Modify implements transport.Transport: RTR enables receiving with the
// QP's Q_Key, RTS sending from its SQ PSN; a Q_Key changed later applies
// at once; SQD stops new sends, and leaving SQE resumes them.
func (q *QP) Modify(from, to ib.QPState, a *ib.QPAttr) {
	switch {
	case from == ib.Init && to == ib.RTR:
		q.Receiver(Config{QKey: a.QKey, PKey: bth.DefaultPKey, MTU: int(a.PathMTU)})
		return
	case from == ib.RTR && to == ib.RTS:
		q.Sender(bth.PSN(a.SQPSN))
	case from == ib.SQE:
		q.Resume()
	}
	q.cfg.QKey = a.QKey
	q.draining = to == ib.SQD
}

// Receiver sets the Q_Key/P_Key (INIT) and enables receiving (RTR).
func (q *QP) Receiver(cfg Config) {
	cfg.QPN = q.cfg.QPN
	if cfg.PKey == 0 {
		cfg.PKey = bth.DefaultPKey
	}
	q.cfg = cfg
	q.recvOn = true
}

// Sender enables sending from PSN cfg.SQPSN (RTS).
func (q *QP) Sender(psn bth.PSN) {
	q.psn = psn
	q.sendOn = true
}

// Config returns the attributes.
func (q *QP) Config() Config { return q.cfg }

// SendQueueFree is how many more WQEs Post accepts.
func (q *QP) SendQueueFree() int { return len(q.sq) - int(q.tail-q.head) }

// Outstanding is how many WQEs are posted and not yet sent.
func (q *QP) Outstanding() int { return int(q.tail - q.head) }

// Post appends a send WQE; false when the SQ is full.
func (q *QP) Post(w *ib.SendWQE) bool {
	if q.tail-q.head >= uint32(len(q.sq)) {
		return false
	}
	e := &q.sq[q.tail%uint32(len(q.sq))]
	sg := append(e.SG[:0], w.SG...)
	*e = *w
	e.SG = sg
	q.tail++
	return true
}

// TakeCompletions returns and forgets the completions produced so far.
func (q *QP) TakeCompletions() []ib.WC {
	w := q.wcs
	q.wcs = q.wcs[:0]
	return w
}

// HasOutput reports whether BuildHeader has a packet to send.
func (q *QP) HasOutput() bool { return q.sending() && q.head != q.tail }

// sending reports whether new WQEs may start.
func (q *QP) sending() bool { return q.sendOn && !q.draining }

// Deadline is clock.Never: UD has no timers.
func (q *QP) Deadline() clock.Time { return clock.Never }

// Expire does nothing: UD has no timers.
func (q *QP) Expire(clock.Time) {}

// Sent does nothing: UD sends are not rate-controlled.
func (q *QP) Sent(clock.Time, int) {}

// Failed is false: a UD QP never fails by itself (its errors stop the SQ
// only).
func (q *QP) Failed() bool { return false }

// Failure is never asked: a UD QP does not fail.
func (q *QP) Failure() ib.EventType { return ib.EventQPFatal }

// Drained is true: a UD send completes as its only packet is built, so
// none is ever in progress.
func (q *QP) Drained() bool { return true }

// MaxPacket is the largest packet BuildHeader describes.
func (q *QP) MaxPacket() int { return bth.BTHLen + bth.DETHLen + bth.ImmDtLen + q.cfg.MTU + 3 }

// Peek returns the WQE BuildHeader will handle next (nil if none), so that the
// device can choose the frame layout from its address handle first.
func (q *QP) Peek() *ib.SendWQE {
	if !q.sending() || q.head == q.tail {
		return nil
	}
	return &q.sq[q.head%uint32(len(q.sq))]
}

// BuildHeader handles the WQE at the head of the SQ: it writes the headers
// of its datagram into buf, describes its payload in p and returns the
// headers' length, or 0 when there is nothing to send or the WQE completed
// in error instead (a WQE longer than the path MTU completes with
// LOC_LEN_ERR without being sent).
func (q *QP) BuildHeader(now clock.Time, buf []byte, p *transport.Payload) int {
	if !q.sending() || q.head == q.tail {
		return 0
	}
	{
		e := &q.sq[q.head%uint32(len(q.sq))]
		if e.Err != ib.Success || e.AH == nil || e.Length > uint32(q.cfg.MTU) || e.Opcode != ib.Send && e.Opcode != ib.SendWithImm {
			q.head++
			st := e.Err
			switch {
			case st != ib.Success:
			case e.AH == nil: // no destination
				st = ib.LocQPOpErr
			default:
				st = ib.LocLenErr
				if e.Opcode != ib.Send && e.Opcode != ib.SendWithImm {
					st = ib.LocQPOpErr
				}
				q.TxTooLong++
			}
			q.wcs = append(q.wcs, ib.WC{ID: e.ID, Status: st, Opcode: ib.WCSend, QPN: q.cfg.QPN})
			e.SG = e.SG[:0]
			// A local error stops the send queue (the SQE state, IBA
			// 10.3.1.2); receiving goes on.
			q.sqErr, q.sendOn = true, false
			return 0
		}
		if len(buf) < q.MaxPacket() {
			return 0
		}
		q.head++
		op := bth.UDSendOnly
		if e.Opcode == ib.SendWithImm {
			op = bth.UDSendOnlyImm
		}
		pay := int(e.Length)
		pad := -pay & 3
		bth.BTH(buf).Encode(&bth.BTHFields{Opcode: op, PKey: q.cfg.PKey, DestQP: e.RemoteQPN, PSN: q.psn, PadCount: pad,
			SE: e.Flags&ib.Solicited != 0})
		qkey := e.RemoteQKey
		if qkey&0x80000000 != 0 {
			// IBA 10.2.5: a Q_Key with the high bit set in the WR means
			// "use the QP's own Q_Key" (which is how QP1 and privileged
			// Q_Keys are protected from ordinary senders).
			qkey = q.cfg.QKey
		}
		bth.DETH(buf[bth.BTHLen:]).Encode(qkey, q.cfg.QPN)
		if o := op.Offset(bth.ExtImmDt); o >= 0 {
			bth.ImmDt(buf[o:]).SetImm(e.Imm)
		}
		p.Set(e.SG, 0, e.Length)
		q.psn = q.psn.Next()
		if e.Flags&ib.Signaled != 0 {
			q.wcs = append(q.wcs, ib.WC{ID: e.ID, Opcode: ib.WCSend, ByteLen: e.Length, QPN: q.cfg.QPN})
		}
		e.SG = e.SG[:0] // p keeps its own slice of the list
		return op.HeaderLen()
	}
}

// Receive delivers one datagram (BTH to end of pad); m carries the GRH slot
// the device built from the IP header and the sender's address.
func (q *QP) Receive(now clock.Time, pkt []byte, m *transport.Meta) {
	if !q.recvOn || len(pkt) < bth.BTHLen {
		q.RxDropped++
		return
	}
	h := bth.BTH(pkt)
	op := h.Opcode()
	hl := op.HeaderLen()
	pad := h.PadCount()
	if op.Transport() != bth.TransportUD || hl == 0 || len(pkt) < hl+pad {
		q.RxDropped++
		return
	}
	d := bth.DETH(pkt[bth.BTHLen:])
	if d.QKey() != q.cfg.QKey {
		q.RxBadQKey++
		return
	}
	pay := pkt[hl : len(pkt)-pad]
	if len(pay) > q.cfg.MTU {
		q.RxTooLong++
		return
	}
	if q.rq == nil || !q.rq.Take(&q.cur) {
		// No receive posted: UD drops silently (no RNR on datagrams).
		q.RxNoRecv++
		return
	}
	wc := ib.WC{ID: q.cur.ID, Opcode: ib.WCRecv, QPN: q.cfg.QPN, SrcQP: d.SrcQP(), SrcIP: m.Src, IsRecv: true, Flags: ib.WCGRH}
	switch {
	case q.cur.Err != ib.Success:
		wc.Status = q.cur.Err
	case uint64(transport.GRHLen+len(pay)) > uint64(q.cur.Length):
		wc.Status = ib.LocLenErr
	default:
		ib.CopyOut(q.cur.SG, 0, m.GRH[:])
		ib.CopyOut(q.cur.SG, transport.GRHLen, pay)
		wc.ByteLen = uint32(transport.GRHLen + len(pay))
		if h.SE() {
			wc.Flags |= ib.WCSolicited
		}
		if o := op.Offset(bth.ExtImmDt); o >= 0 {
			wc.Flags |= ib.WCWithImm
			wc.Imm = bth.ImmDt(pkt[o:]).Imm()
		}
		q.RxReceived++
	}
	q.cur.SG = q.cur.SG[:0]
	q.wcs = append(q.wcs, wc)
}

// SendError reports whether a send WQE failed locally and stopped the SQ
// (the device moves the QP to SQE).
func (q *QP) SendError() bool { return q.sqErr }

// Resume restarts a send queue stopped by an error (SQE → RTS).
func (q *QP) Resume() { q.sqErr, q.sendOn = false, true }

// FlushSend completes every unsent WQE with WR_FLUSH_ERR (SQE), leaving
// the receive side running.
func (q *QP) FlushSend() {
	for q.head != q.tail {
		e := &q.sq[q.head%uint32(len(q.sq))]
		q.wcs = append(q.wcs, ib.WC{ID: e.ID, Status: ib.WRFlushErr, Opcode: ib.WCSend, QPN: q.cfg.QPN})
		e.SG = e.SG[:0]
		q.head++
	}
}

// Flush completes every unsent WQE with WR_FLUSH_ERR (ERR state).
func (q *QP) Flush() {
	q.sendOn, q.recvOn = false, false
	for q.head != q.tail {
		e := &q.sq[q.head%uint32(len(q.sq))]
		q.wcs = append(q.wcs, ib.WC{ID: e.ID, Status: ib.WRFlushErr, Opcode: ib.WCSend, QPN: q.cfg.QPN})
		e.SG = e.SG[:0]
		q.head++
	}
}

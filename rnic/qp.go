package rnic

import (
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/congestion/dcqcn"
	"github.com/softrnic/softrnic/frame"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/transport"
	"github.com/softrnic/softrnic/transport/rc"
	"github.com/softrnic/softrnic/transport/ud"
	"github.com/softrnic/softrnic/verbs"
)

// qpInit is a QP's verbs.QPInitAttr, its objects this device's.
type qpInit struct {
	Type       ib.QPType
	SendCQ     *CQ
	RecvCQ     *CQ
	SRQ        *SRQ // receives come from here instead of the QP's RQ
	MaxSendWR  int
	MaxRecvWR  int
	MaxSendSGE int
	MaxRecvSGE int
	MaxInline  int
	SigAll     bool // every send WR is signaled
	// Recovery is an RC QP's loss recovery, the device's unless the
	// application chose.
	Recovery ib.Recovery
}

// QP is a queue pair.
type QP struct {
	dev  *Device
	pd   *PD
	qpn  uint32
	init qpInit

	mu    sync.Mutex // see the package doc
	state ib.QPState
	attr  ib.QPAttr
	tr    transport.Transport
	dest  transport.Addressed // UD: where each WQE goes; nil for connected QPs
	rq    recvRing
	hdr   frame.Template // RC/UC frame header template, built at RTR
	// cnpHdr is hdr with the CNP DSCP, for the CNPs a QP running DCQCN
	// owes its peer (congestion.go).
	cnpHdr frame.Template
	peer   netip.Addr
	slot   int // the peer's entry in Device.heard
	mem    qpMem

	// scratch of the post verbs (guarded by mu), so posting allocates nothing
	postWQE  ib.SendWQE
	postRecv ib.RecvWQE
	postSG   [MaxSGE]ib.Seg

	inline     []byte // MaxSendWR slots of MaxInline bytes
	inlineNext int

	// refill, if set, moves receives posted but not yet handed to the
	// device into the RQ (SetRecvRefill; guarded by mu).
	refill    func(post func(*verbs.RecvWR) bool)
	rxLast    clock.Time     // when it last received a request (engine-owned, recv.go)
	hostMark  dcqcn.HostMark // its last host-congestion mark (engine-owned, recv.go)
	commEst   bool           // EventCommEst was raised (guarded by mu)
	dmaFault  bool           // a copy of external memory failed (guarded by mu; dma.go)
	sqdNotify bool           // raise EventSQDrained once the SQ drains in SQD (guarded by mu)
	cqe       CQECounters    // error completions (guarded by mu)
	deadline  atomic.Int64   // transport deadline, published after each step
	txPending atomic.Bool    // the transport may have packets to send
	queued    atomic.Bool    // in the engine's ready list (or handed over to it)
	timed     atomic.Bool    // in the engine's timer list (or handed over to it)
	destroyed atomic.Bool
}

// Device is the device the QP belongs to (verbs.DeviceObject).
func (q *QP) Device() verbs.Device { return q.dev }

// QPN is the QP number.
func (q *QP) QPN() uint32 { return q.qpn }

// Type is the QP's transport service.
func (q *QP) Type() ib.QPType { return q.init.Type }

// State returns the current state.
func (q *QP) State() ib.QPState {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.state
}

var _ verbs.QP = (*QP)(nil)

// CreateQP creates a QP in the RESET state (ibv_create_qp). Queue sizes of
// 0 take DefaultDepth WRs and one SGE.
func (pd *PD) CreateQP(attr *verbs.QPInitAttr) (verbs.QP, error) {
	a, err := pd.qpInit(attr)
	if err != nil {
		return nil, err
	}
	d := pd.dev
	q := &QP{dev: d, pd: pd, init: a, inline: make([]byte, a.MaxSendWR*a.MaxInline)}
	q.mem = qpMem{q}
	q.deadline.Store(int64(clock.Never))
	d.mu.Lock()
	defer d.mu.Unlock()
	if a.Type == ib.GSI {
		if d.qps.get(1) != nil {
			return nil, fmt.Errorf("rnic: create QP: the device's GSI QP (QP1) exists: %w", verbs.ErrBusy)
		}
		q.qpn = 1
	} else {
		// QP numbers are in softrnic's range (rc.SoftQPN), so that two
		// softrnic QPs recognise each other from the numbers they were
		// connected with and may agree on selective repeat, from 0x11 in
		// it as rxe starts at 0x11.
		for {
			d.nextQPN = (d.nextQPN + 1) &^ rc.SoftQPNMask
			if d.nextQPN < 0x11 {
				d.nextQPN = 0x11
			}
			if d.qps.get(rc.SoftQPNTag|d.nextQPN) == nil {
				break
			}
		}
		q.qpn = rc.SoftQPNTag | d.nextQPN
	}
	q.resetLocked()
	d.qps.put(q.qpn, q)
	if a.SRQ != nil {
		a.SRQ.users.Add(1)
	}
	return q, nil
}

// qpInit checks a QP's creation attributes against the device's limits
// and finds its CQs and SRQ among this PD's objects.
func (pd *PD) qpInit(attr *verbs.QPInitAttr) (qpInit, error) {
	c := attr.Cap
	a := qpInit{Type: attr.Type, MaxSendWR: int(c.MaxSendWR), MaxRecvWR: int(c.MaxRecvWR), MaxSendSGE: int(c.MaxSendSGE),
		MaxRecvSGE: int(c.MaxRecvSGE), MaxInline: int(c.MaxInline), SigAll: attr.SigAll,
		Recovery: attr.Recovery.Or(pd.dev.cfg.Recovery)}
	fail := func(format string, args ...any) (qpInit, error) {
		return a, fmt.Errorf("rnic: create %v QP: "+format+": %w", append(append([]any{attr.Type}, args...), verbs.ErrInvalid)...)
	}
	if a.Type < ib.GSI || a.Type > ib.UD {
		return fail("unknown QP type %d", uint8(a.Type))
	}
	if !attr.Recovery.Valid() {
		return fail("unknown recovery mode %d", uint8(attr.Recovery))
	}
	var ok bool
	if a.SendCQ, ok = attr.SendCQ.(*CQ); !ok || a.SendCQ.dev != pd.dev {
		return fail("send_cq is not one of this device's")
	}
	if a.RecvCQ, ok = attr.RecvCQ.(*CQ); !ok || a.RecvCQ.dev != pd.dev {
		return fail("recv_cq is not one of this device's")
	}
	if attr.SRQ != nil {
		if a.SRQ, ok = attr.SRQ.(*SRQ); !ok || a.SRQ.pd != pd {
			return fail("srq is not one of this PD's")
		}
		if a.SRQ.destroyed.Load() {
			return fail("the SRQ is destroyed")
		}
		if a.Type == ib.GSI {
			return fail("the GSI QP has its own receive queue")
		}
	}
	if a.MaxSendWR == 0 {
		a.MaxSendWR = DefaultDepth
	}
	if a.MaxRecvWR == 0 {
		a.MaxRecvWR = DefaultDepth
	}
	a.MaxSendSGE, a.MaxRecvSGE = max(a.MaxSendSGE, 1), max(a.MaxRecvSGE, 1)
	switch {
	case a.MaxSendWR > MaxQPWR:
		return fail("max_send_wr %d, at most %d", a.MaxSendWR, MaxQPWR)
	case a.MaxRecvWR > MaxQPWR:
		return fail("max_recv_wr %d, at most %d", a.MaxRecvWR, MaxQPWR)
	case a.MaxSendSGE > MaxSGE:
		return fail("max_send_sge %d, at most %d", a.MaxSendSGE, MaxSGE)
	case a.MaxRecvSGE > MaxSGE:
		return fail("max_recv_sge %d, at most %d", a.MaxRecvSGE, MaxSGE)
	case a.MaxInline > MaxInline:
		return fail("max_inline_data %d, at most %d", a.MaxInline, MaxInline)
	}
	return a, nil
}

// resetLocked returns the QP to a fresh RESET state.
func (q *QP) resetLocked() {
	a := q.init
	q.releaseHeld()
	q.state = ib.Reset
	q.attr = ib.QPAttr{}
	q.commEst, q.sqdNotify = false, false
	q.rq = newRecvRing(a.MaxRecvWR, a.MaxRecvSGE)
	var rq ib.RecvQueue = (*qpRecvQueue)(q)
	if a.SRQ != nil {
		rq = a.SRQ
	}
	if a.Type.Datagram() {
		u := ud.New(q.qpn, a.MaxSendWR, a.MaxSendSGE, rq)
		q.tr, q.dest = u, u
	} else {
		d := q.dev
		t := rc.NewQP(rc.Options{QPN: q.qpn, UC: a.Type == ib.UC, SQDepth: a.MaxSendWR, MaxSGE: max(a.MaxSendSGE, a.MaxRecvSGE),
			Mem: q.mem, RQ: rq, CC: d.cc, Counters: &d.Stats.CCCounters, Recovery: a.Recovery})
		if a.Type == ib.RC && a.Recovery == ib.RecoverySelective {
			t.SetReorderPool(d.reorder)
		}
		q.tr, q.dest = t, nil
	}
	q.deadline.Store(int64(clock.Never))
	q.txPending.Store(false)
}

// Destroy removes the QP from the device; outstanding work is dropped
// without completions (ibv_destroy_qp).
func (q *QP) Destroy() error {
	d := q.dev
	// Its counts stay in the device's totals; the first Destroy also
	// marks it destroyed.
	if d.retire(q) && q.init.SRQ != nil {
		q.init.SRQ.users.Add(-1)
	}
	d.mu.Lock()
	if d.qps.get(q.qpn) == q {
		d.qps.remove(q.qpn)
	}
	d.mu.Unlock()
	q.mu.Lock()
	q.discardLocked()
	q.releaseHeld()
	q.mu.Unlock()
	return nil
}

// discardLocked drops the work of a QP being destroyed: its WRs leave
// without completions, as ibv_destroy_qp's do, and a QP still on the
// engine's ready list sends nothing more (no request reading memory its
// application may already have deregistered), except an RC responder's
// owed ACK, as at the move to ERR (toErrLocked): the peer's message
// completed here, and its sender must not flush it.
func (q *QP) discardLocked() {
	q.flushKeepAckLocked()
	_ = q.tr.TakeCompletions()
}

// flushKeepAckLocked flushes every outstanding WR of the transport; an RC
// QP's owed ACK still goes out (rc.QP.FlushKeepAck).
func (q *QP) flushKeepAckLocked() {
	if t, ok := q.tr.(*rc.QP); ok {
		t.FlushKeepAck()
	} else {
		q.tr.Flush()
	}
}

// releaseHeld hands the packets an RC QP holds out of order back to the
// device's reorder pool and adds its counters to the device's lifetime
// totals, as the transport is about to go (q.mu held, or the QP not yet
// shared).
func (q *QP) releaseHeld() {
	if t, ok := q.tr.(*rc.QP); ok {
		t.ReleaseHeld()
		d := q.dev
		d.retiredMu.Lock()
		d.retired.Add(&t.Counters)
		d.retiredMu.Unlock()
	}
}

// toErrLocked moves the QP to ERR and flushes every outstanding WR, at
// the application's request: an RC QP's owed ACK still goes out
// (rc.QP.FlushKeepAck).
func (q *QP) toErrLocked() {
	q.state = ib.Err
	q.flushKeepAckLocked()
	q.lastWQELocked()
	var w ib.RecvWQE
	if q.init.SRQ == nil {
		for q.rq.Take(&w) {
			q.pushWC(ib.WC{ID: w.ID, Status: ib.WRFlushErr, Opcode: ib.WCRecv, IsRecv: true, QPN: q.qpn})
		}
	}
}

// lastWQELocked reports, for a QP attached to an SRQ that has just gone
// to ERR, that it will take no more receives from the SRQ (IBA's Last WQE
// Reached): the application may then destroy it without losing a receive
// of the SRQ to it.
func (q *QP) lastWQELocked() {
	if q.init.SRQ != nil {
		q.dev.event(ib.EventQPLastWQEReached, q.qpn)
	}
}

// pushWC delivers a completion produced outside the transport.
func (q *QP) pushWC(wc ib.WC) {
	q.cqe.add(&wc)
	if wc.IsRecv {
		q.init.RecvCQ.push([]ib.WC{wc}, true)
	} else {
		q.init.SendCQ.push([]ib.WC{wc}, false)
	}
}

// release publishes the transport's completions, moves a failed QP to
// ERR, publishes deadline and pending output, and unlocks the QP; if the
// QP now has work it is handed to the engine. Application goroutines use
// it; the step functions use releaseEngine.
func (q *QP) release() {
	ready, timed := q.unlock()
	if (ready || timed) && !q.destroyed.Load() {
		q.dev.handOver(q, ready, timed)
	}
}

// releaseEngine is release for the engine goroutine: it puts the QP on the
// engine's own lists directly instead of through the handover, so that a
// paced QP, which goes from the timer list back to the ready list once per
// packet, costs no device lock.
func (q *QP) releaseEngine() {
	if q.dev.dmaSettle() {
		q.dmaFault = true
	}
	ready, timed := q.unlock()
	if (ready || timed) && !q.destroyed.Load() {
		d := q.dev
		if ready {
			d.ready = append(d.ready, q)
		}
		if timed {
			d.timed = append(d.timed, q)
		}
	}
}

// unlock is the common part of release and releaseEngine; it reports
// whether the QP must join the ready list and the timer list (the flags
// queued and timed are already set for it).
func (q *QP) unlock() (ready, timed bool) {
	tr := q.tr
	if tr.Failed() && q.state != ib.Err && q.state != ib.Reset {
		q.state = ib.Err
		ev := tr.Failure()
		tr.Flush()
		q.dev.event(ev, q.qpn)
		q.lastWQELocked()
	}
	if tr.SendError() && q.state != ib.Err && q.state != ib.Reset {
		q.state = ib.SQE
		tr.FlushSend()
	}
	fault := q.dmaFault && q.state != ib.Err && q.state != ib.Reset
	q.dmaFault = false
	if fault {
		// A copy of external memory failed (its MR deregistered, the
		// memory unmapped): a DMA error. The QP goes to ERR and its
		// work is flushed (dmaFaulted).
		q.state = ib.Err
		tr.Flush()
		q.dev.event(ib.EventQPFatal, q.qpn)
	}
	wcs := tr.TakeCompletions()
	if fault {
		dmaFaulted(wcs)
	}
	if len(wcs) > 0 {
		var send, recv bool
		for i := range wcs {
			if wcs[i].IsRecv {
				recv = true
			} else {
				send = true
			}
			if wcs[i].Status != ib.Success {
				q.cqe.add(&wcs[i])
			}
		}
		if send {
			q.init.SendCQ.push(wcs, false)
		}
		if recv {
			q.init.RecvCQ.push(wcs, true)
		}
	}
	if q.state != ib.Err && q.state != ib.Reset && (q.init.SendCQ.overrun.Load() || q.init.RecvCQ.overrun.Load()) {
		// A CQ of this QP overflowed (see CQ): the QP goes to ERR, as a
		// transport error would take it, and what it flushes is counted
		// as lost on the CQ in error.
		q.state = ib.Err
		tr.Flush()
		wcs = tr.TakeCompletions()
		for i := range wcs {
			q.cqe.add(&wcs[i])
		}
		q.init.SendCQ.push(wcs, false)
		q.init.RecvCQ.push(wcs, true)
		q.dev.event(ib.EventQPFatal, q.qpn)
		q.lastWQELocked()
	}
	if q.state == ib.Err && q.init.SRQ == nil && q.rq.head != q.rq.tail {
		var w ib.RecvWQE
		for q.rq.Take(&w) {
			q.pushWC(ib.WC{ID: w.ID, Status: ib.WRFlushErr, Opcode: ib.WCRecv, IsRecv: true, QPN: q.qpn})
		}
	}
	if q.sqdNotify && q.state == ib.SQD && tr.Drained() {
		q.sqdNotify = false
		q.dev.event(ib.EventSQDrained, q.qpn)
	}
	pending := tr.HasOutput()
	dl := tr.Deadline()
	q.deadline.Store(int64(dl))
	q.txPending.Store(pending)
	q.mu.Unlock()
	// Hand the QP to the engine if it has work and is not already queued
	// (store first, then test: see stillPending for the other side).
	ready = pending && q.queued.CompareAndSwap(false, true)
	timed = dl != clock.Never && q.timed.CompareAndSwap(false, true)
	return ready, timed
}

// qpRecvQueue is the RQ as the QP's transport takes from it: the ring,
// refilled (SetRecvRefill) when a message finds it empty.
type qpRecvQueue QP

// Take implements ib.RecvQueue (the engine, under the QP's lock).
func (r *qpRecvQueue) Take(dst *ib.RecvWQE) bool {
	q := (*QP)(r)
	if q.rq.Take(dst) {
		return true
	}
	if q.refill == nil {
		return false
	}
	q.refill(q.postRecvLocked)
	return q.rq.Take(dst)
}

// SetRecvRefill installs fn, which the engine calls under q's lock when a
// message finds q's receive queue empty: a caller that queues receives
// before posting them (the daemon, which moves its clients' receives from
// their rings to the device asynchronously) posts with post those that
// are already queued, so that a receive its application posted before the
// message came is there to take, as it would be on an RNIC. post reports
// false when the RQ is full. fn must not block, nor call q's verbs.
func (q *QP) SetRecvRefill(fn func(post func(*verbs.RecvWR) bool)) {
	q.mu.Lock()
	q.refill = fn
	q.mu.Unlock()
}

// postRecvLocked posts one receive WR; q.mu is held and the QP receives.
func (q *QP) postRecvLocked(r *verbs.RecvWR) bool {
	if q.rq.full() || len(r.SG) > q.init.MaxRecvSGE {
		return false
	}
	q.dev.resolveRecv(q.pd, r, &q.postRecv, q.postSG[:0])
	q.rq.put(&q.postRecv)
	return true
}

// WithLock runs fn while holding q's lock: the lock under which the engine
// lets q's transport write memory (a peer's RDMA WRITE landing in an MR, a
// READ response or an atomic result being copied in) and read it (the
// payload of a SEND or WRITE being segmented, possibly again for a
// retransmission). An application that watches memory for a peer's WRITE
// without a completion to tell it (perftest's write_lat polls the last
// byte of the message), or that changes a buffer an unacknowledged WRITE
// may still be resent from, does so in fn: it then sees each packet's
// bytes whole, and the race detector sees the order.
//
// fn must be short and must not call q's verbs (it would deadlock).
func (q *QP) WithLock(fn func()) {
	q.mu.Lock()
	defer q.release()
	fn()
}

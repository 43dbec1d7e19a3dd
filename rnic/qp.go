package rnic

import (
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/transport"
	"github.com/softrnic/softrnic/transport/rc"
	"github.com/softrnic/softrnic/transport/ud"
)

// QPInitAttr describes a QP at creation (ibv_qp_init_attr).
type QPInitAttr struct {
	Type      ib.QPType
	SendCQ    *CQ
	RecvCQ    *CQ
	SRQ       *SRQ // receives come from here instead of the QP's RQ
	MaxSendWR int
	MaxRecvWR int
	MaxSGE    int
	MaxInline int
	SigAll    bool // every send WR is signaled
}

// QP is a queue pair.
type QP struct {
	dev  *Device
	pd   *PD
	qpn  uint32
	init QPInitAttr

	mu    sync.Mutex // see the package doc
	state ib.QPState
	attr  ib.QPAttr
	tr    transport.Transport
	dest  transport.Addressed // UD: where each WQE goes; nil for connected QPs
	rq    recvRing
	hdr   hdrTmpl // RC/UC frame header template, built at RTR
	// cnpHdr is hdr with the CNP DSCP, for the CNPs a QP running DCQCN
	// owes its peer (congestion.go).
	cnpHdr hdrTmpl
	peer   netip.Addr
	mem    qpMem

	// scratch of the post verbs (guarded by mu), so posting allocates nothing
	postWQE  ib.SendWQE
	postRecv ib.RecvWQE
	postSG   [MaxSGE]ib.Seg

	inline     []byte // MaxSendWR slots of MaxInline bytes
	inlineNext int

	commEst   bool         // EventCommEst was raised (guarded by mu)
	sqdNotify bool         // raise EventSQDrained once the SQ drains in SQD (guarded by mu)
	cqe       CQECounters  // error completions (guarded by mu)
	deadline  atomic.Int64 // transport deadline, published after each step
	txPending atomic.Bool  // the transport may have packets to send
	queued    atomic.Bool  // in the engine's ready list (or handed over to it)
	timed     atomic.Bool  // in the engine's timer list (or handed over to it)
	destroyed atomic.Bool
}

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

// qpMem is the transports' view of remote-accessible memory, bound to the
// QP's PD.
type qpMem struct{ q *QP }

// Resolve implements ib.Memory.
func (m qpMem) Resolve(rkey uint32, va, n uint64, access ib.Access) (ib.Seg, bool) {
	mr := m.q.dev.lookup(rkey, m.q.pd)
	if mr == nil || mr.rkey != rkey || mr.access&access != access {
		return ib.Seg{}, false
	}
	b, ok := mr.slice(va, n)
	return ib.LocalSeg(b), ok
}

// Invalidate implements ib.Memory.
func (m qpMem) Invalidate(rkey uint32) bool {
	mr := m.q.dev.lookup(rkey, m.q.pd)
	if mr == nil || mr.rkey != rkey {
		return false
	}
	mr.valid.Store(false)
	return true
}

// CreateQP creates a QP in the RESET state.
func (pd *PD) CreateQP(a QPInitAttr) (*QP, error) {
	if a.SendCQ == nil || a.RecvCQ == nil || a.Type < ib.GSI || a.Type > ib.UD {
		return nil, ErrInvalid
	}
	if a.MaxSendWR == 0 {
		a.MaxSendWR = DefaultDepth
	}
	if a.MaxRecvWR == 0 {
		a.MaxRecvWR = DefaultDepth
	}
	if a.MaxSGE == 0 {
		a.MaxSGE = 1
	}
	if a.MaxSendWR > MaxQPWR || a.MaxRecvWR > MaxQPWR || a.MaxSGE > MaxSGE || a.MaxInline > MaxInline || a.MaxSendWR < 0 || a.MaxRecvWR < 0 {
		return nil, ErrInvalid
	}
	if a.SRQ != nil && a.SRQ.pd != pd {
		return nil, ErrInvalid
	}
	d := pd.dev
	q := &QP{dev: d, pd: pd, init: a, inline: make([]byte, a.MaxSendWR*a.MaxInline)}
	q.mem = qpMem{q}
	q.deadline.Store(int64(clock.Never))
	d.mu.Lock()
	defer d.mu.Unlock()
	old := *d.qps.Load()
	if a.Type == ib.GSI {
		if old[1] != nil {
			return nil, ErrInvalid // one GSI QP per device
		}
		q.qpn = 1
	} else {
		for {
			d.nextQPN = (d.nextQPN + 1) & bth.QPNMask
			if d.nextQPN < 0x11 {
				d.nextQPN = 0x11 // 0 and 1 are SMI/GSI; rxe starts at 0x11 too
			}
			if _, used := old[d.nextQPN]; !used {
				break
			}
		}
		q.qpn = d.nextQPN
	}
	q.resetLocked()
	nm := make(map[uint32]*QP, len(old)+1)
	for k, v := range old {
		nm[k] = v
	}
	nm[q.qpn] = q
	d.qps.Store(&nm)
	nl := append(append([]*QP(nil), *d.list.Load()...), q)
	d.list.Store(&nl)
	return q, nil
}

// resetLocked returns the QP to a fresh RESET state.
func (q *QP) resetLocked() {
	a := q.init
	q.state = ib.Reset
	q.attr = ib.QPAttr{}
	q.commEst, q.sqdNotify = false, false
	q.rq = newRecvRing(a.MaxRecvWR, a.MaxSGE)
	var rq ib.RecvQueue = &q.rq
	if a.SRQ != nil {
		rq = a.SRQ
	}
	if a.Type.Datagram() {
		u := ud.New(q.qpn, a.MaxSendWR, a.MaxSGE, rq)
		q.tr, q.dest = u, u
	} else {
		d := q.dev
		q.tr, q.dest = rc.NewQP(rc.Options{QPN: q.qpn, UC: a.Type == ib.UC, SQDepth: a.MaxSendWR, MaxSGE: a.MaxSGE,
			Mem: q.mem, RQ: rq, CC: d.cc, Counters: &d.Stats.CCCounters}), nil
	}
	q.deadline.Store(int64(clock.Never))
	q.txPending.Store(false)
}

// Destroy removes the QP from the device; outstanding work is dropped
// without completions (ibv_destroy_qp).
func (q *QP) Destroy() {
	d := q.dev
	q.destroyed.Store(true)
	d.mu.Lock()
	defer d.mu.Unlock()
	old := *d.qps.Load()
	nm := make(map[uint32]*QP, len(old))
	for k, v := range old {
		if v != q {
			nm[k] = v
		}
	}
	d.qps.Store(&nm)
	var nl []*QP
	for _, v := range *d.list.Load() {
		if v != q {
			nl = append(nl, v)
		}
	}
	d.list.Store(&nl)
}

// toErrLocked moves the QP to ERR and flushes every outstanding WR.
func (q *QP) toErrLocked() {
	q.state = ib.Err
	q.tr.Flush()
	var w ib.RecvWQE
	if q.init.SRQ == nil {
		for q.rq.Take(&w) {
			q.pushWC(ib.WC{ID: w.ID, Status: ib.WRFlushErr, Opcode: ib.WCRecv, IsRecv: true, QPN: q.qpn})
		}
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
		tr.Flush()
		q.dev.event(ib.EventQPFatal, q.qpn)
	}
	if tr.SendError() && q.state != ib.Err && q.state != ib.Reset {
		q.state = ib.SQE
		tr.FlushSend()
	}
	wcs := tr.TakeCompletions()
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

// SendWR is a send work request (ibv_send_wr).
type SendWR struct {
	ID     uint64
	Opcode ib.WROpcode
	Flags  ib.SendFlags
	SG     []ib.SGE
	// InlineData, with the Inline flag, is copied at post time instead of
	// SG (up to MaxInline bytes); the buffer may be reused at once.
	InlineData []byte
	Imm        uint32 // immediate data (the value the receiver sees)
	InvRKey    uint32 // SEND_WITH_INV
	RemoteAddr uint64 // RDMA and atomics
	RKey       uint32
	CompareAdd uint64 // CMP_AND_SWP compare value, FETCH_AND_ADD addend
	Swap       uint64 // CMP_AND_SWP swap value
	// UD
	AH         *AH
	RemoteQPN  uint32
	RemoteQKey uint32 // high bit set: use the QP's Q_Key
}

// PostSend posts send WRs and returns how many it took; on error the rest
// were not posted (ibv_post_send's bad_wr).
func (q *QP) PostSend(wrs ...SendWR) (int, error) {
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
func (q *QP) postSend(wrs []SendWR) (int, error) {
	w, sg := &q.postWQE, q.postSG[:0]
	if q.destroyed.Load() {
		return 0, ErrDestroyed
	}
	for i := range wrs {
		s := &wrs[i]
		if q.state != ib.RTS && q.state != ib.SQD && q.state != ib.SQE && q.state != ib.Err {
			return i, ErrQPState
		}
		if err := q.checkSend(s); err != nil {
			return i, err
		}
		if q.tr.SendQueueFree() == 0 {
			return i, ErrQueueFull
		}
		if q.state == ib.Err || q.state == ib.SQE {
			q.pushWC(ib.WC{ID: s.ID, Status: ib.WRFlushErr, Opcode: wcOpcode(s.Opcode), QPN: q.qpn})
			continue
		}
		q.resolveSend(s, w, sg)
		q.tr.Post(w)
	}
	q.txPending.Store(true)
	return len(wrs), nil
}

func wcOpcode(o ib.WROpcode) ib.WCOpcode {
	switch o {
	case ib.RDMAWrite, ib.RDMAWriteWithImm:
		return ib.WCRDMAWrite
	case ib.RDMARead:
		return ib.WCRDMARead
	case ib.AtomicCmpAndSwp:
		return ib.WCCompSwap
	case ib.AtomicFetchAndAdd:
		return ib.WCFetchAdd
	}
	return ib.WCSend
}

func (q *QP) checkSend(s *SendWR) error {
	t := q.init.Type
	switch {
	case !s.Opcode.Valid():
		return ErrBadOpcode
	case t.Datagram() && s.Opcode != ib.Send && s.Opcode != ib.SendWithImm:
		return ErrBadOpcode
	case t == ib.UC && (s.Opcode == ib.RDMARead || s.Opcode.IsAtomic()):
		return ErrBadOpcode
	case t.Datagram() && s.AH == nil:
		return ErrInvalid
	case len(s.SG) > q.init.MaxSGE:
		return ErrTooManySGE
	case s.Flags&ib.Inline != 0 && (len(s.InlineData) > q.init.MaxInline || s.Opcode == ib.RDMARead || s.Opcode.IsAtomic()):
		return ErrInlineSize
	}
	if s.Opcode.IsAtomic() {
		n := uint32(0)
		for _, g := range s.SG {
			n += g.Length
		}
		if n != 8 {
			return ErrInvalid
		}
	}
	return nil
}

// resolveSend turns a send WR into a WQE, resolving the SGEs against the
// QP's PD. A bad lkey or bound is not an error of the post (an RNIC finds
// it when it processes the WQE): the WQE carries LOC_PROT_ERR and
// completes with it in order, and the QP goes to ERR.
func (q *QP) resolveSend(s *SendWR, w *ib.SendWQE, sg []ib.Seg) {
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
	}
	if s.AH != nil {
		w.AH = &s.AH.ah
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
		var b []byte
		ok := m != nil && m.lkey == g.LKey && (!needWrite || m.access&ib.LocalWrite != 0)
		if ok {
			b, ok = m.slice(g.Addr, uint64(g.Length))
		}
		if !ok {
			w.Err = ib.LocProtErr
			continue
		}
		sg = append(sg, ib.LocalSeg(b))
		total += uint64(g.Length)
	}
	if total > MaxMsgSize && w.Err == ib.Success {
		w.Err = ib.LocLenErr
	}
	w.SG = sg
	w.Length = uint32(total)
}

// PostRecv posts receive WRs and returns how many it took.
func (q *QP) PostRecv(wrs ...RecvWR) (int, error) {
	if q.init.SRQ != nil {
		return 0, ErrNoRecvQueue
	}
	q.mu.Lock()
	defer q.release()
	w, sg := &q.postRecv, q.postSG[:0]
	if q.destroyed.Load() {
		return 0, ErrDestroyed
	}
	for i := range wrs {
		if q.state == ib.Reset {
			return i, ErrQPState
		}
		if len(wrs[i].SG) > q.init.MaxSGE {
			return i, ErrTooManySGE
		}
		if q.rq.full() {
			return i, ErrQueueFull
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

// AH is an address handle for UD sends (ibv_ah), with its frame header
// prepared once.
type AH struct {
	ah  ib.AH
	hdr hdrTmpl
}

// AV is the address vector the AH was made from, its DMAC resolved.
func (a *AH) AV() ib.AddressVector { return a.ah.AV }

// CreateAH creates an address handle (ibv_create_ah). Without a DMAC in
// av, the device's resolver finds the next hop.
func (pd *PD) CreateAH(av ib.AddressVector) (*AH, error) {
	if err := pd.dev.checkAV(&av); err != nil {
		return nil, fmt.Errorf("rnic: address handle: %v: %w", err, ErrInvalid)
	}
	mac, err := pd.dev.destMAC(&av)
	if err != nil {
		return nil, fmt.Errorf("rnic: address handle: %v: %w", err, ErrInvalid)
	}
	av.DMAC = mac
	a := &AH{hdr: pd.dev.makeHdr(&av, mac, 0, 0)}
	a.ah = ib.AH{AV: av, Header: a.hdr.bytes()}
	return a, nil
}

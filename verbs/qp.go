package verbs

import (
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/transport/rc"
	"github.com/softrnic/softrnic/transport/ud"
	"github.com/softrnic/softrnic/verbs/wr"
)

// QPType is the transport service of a QP.
type QPType uint8

// QP types softrnic implements.
const (
	RC QPType = iota
	UC
	UD
	// GSI is the General Services Interface QP, QP1: a UD QP whose QPN is
	// 1 and whose Q_Key is 0x80010000, which carries the CM's MADs. One
	// per device.
	GSI
)

func (t QPType) String() string { return [...]string{"RC", "UC", "UD", "GSI"}[t&3] }

// datagram reports whether QPs of type t are unreliable datagram QPs.
func (t QPType) datagram() bool { return t == UD || t == GSI }

// State is the IB QP state (IBA 10.3.1).
type State uint8

// QP states.
const (
	Reset State = iota
	Init
	RTR
	RTS
	SQD
	SQE
	Err
)

func (s State) String() string {
	return [...]string{"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"}[s%7]
}

// legal[from][to] is the transition table of IBA Figure 130 (modify QP);
// any state may go to RESET or ERR.
var legal = [7][7]bool{
	Reset: {Init: true},
	Init:  {Init: true, RTR: true},
	RTR:   {RTS: true},
	RTS:   {RTS: true, SQD: true},
	SQD:   {RTS: true, SQD: true},
	SQE:   {RTS: true},
}

// QPInitAttr describes a QP at creation (ibv_qp_init_attr).
type QPInitAttr struct {
	Type      QPType
	SendCQ    *CQ
	RecvCQ    *CQ
	SRQ       *SRQ // receives come from here instead of the QP's RQ
	MaxSendWR int
	MaxRecvWR int
	MaxSGE    int
	MaxInline int
	SigAll    bool // every send WR is signaled
}

// AddressVector says where a QP's (or a UD WR's) packets go
// (ibv_ah_attr with its GRH).
type AddressVector struct {
	DestMAC      [6]byte
	DestIP       netip.Addr // the destination GID as an address
	SGIDIndex    int        // index into Config.Addrs: the source address
	TrafficClass uint8      // IPv4 TOS / IPv6 traffic class, as given
	HopLimit     uint8      // TTL; 0 means 64
	FlowLabel    uint32
	UDPSrcPort   uint16 // 0: derived from the QPNs as rdma_get_udp_sport does
}

// Attr carries the attributes of Modify (ibv_qp_attr). Which fields matter
// depends on the transition: INIT takes Access/QKey/PKey, RTR the path and
// receive side, RTS the send side.
type Attr struct {
	// INIT
	Access Access // remote operations the QP serves
	QKey   uint32 // UD
	PKey   uint16 // 0 means the default 0xFFFF

	// RTR
	PathMTU         int // 256, 512, 1024, 2048 or 4096 (RC/UC; UD uses the port MTU if 0)
	DestQPN         uint32
	RQPSN           uint32
	MaxDestRdAtomic int
	MinRNRTimer     uint8
	AV              AddressVector

	// RTS
	SQPSN       uint32
	Timeout     uint8 // local ACK timeout: 4.096 µs × 2^Timeout, 0 = infinite
	RetryCnt    uint8
	RNRRetry    uint8 // 7 = infinite
	MaxRdAtomic int

	// Mask says which of the attributes above an RTS→RTS or SQD→RTS
	// transition changes.
	Mask AttrMask
}

// AttrMask selects the attributes an RTS→RTS or SQD→RTS Modify changes
// (ibv_qp_attr_mask); other transitions take every attribute they need.
type AttrMask uint16

// Attributes changeable in RTS.
const (
	MaskTimeout AttrMask = 1 << iota
	MaskRetryCnt
	MaskRNRRetry
	MaskMinRNRTimer
	MaskAccess
	MaskMaxRdAtomic
)

// QP is a queue pair.
type QP struct {
	dev  *Device
	pd   *PD
	qpn  uint32
	init QPInitAttr

	mu    sync.Mutex // see the package doc
	state State
	attr  Attr
	rc    *rc.QP
	ud    *ud.QP
	rq    recvRing
	hdr   hdrTmpl // RC/UC frame header template, built at RTR
	peer  netip.Addr
	cc    *qpCC // DCQCN state, nil when the device runs none (congestion.go)
	mem   qpMem

	// scratch of the post verbs (guarded by mu), so posting allocates nothing
	postWQE  wr.SendWQE
	postRecv wr.RecvWQE
	postSG   [MaxSGE][]byte

	inline     []byte // MaxSendWR slots of MaxInline bytes
	inlineNext int

	commEst   bool         // EventCommEst was raised (guarded by mu)
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
func (q *QP) Type() QPType { return q.init.Type }

// State returns the current state.
func (q *QP) State() State {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.state
}

// qpMem is the transports' view of remote-accessible memory, bound to the
// QP's PD.
type qpMem struct{ q *QP }

// Resolve implements wr.Memory.
func (m qpMem) Resolve(rkey uint32, va, n uint64, access wr.Access) ([]byte, bool) {
	mr := m.q.dev.lookup(rkey, m.q.pd)
	if mr == nil || mr.rkey != rkey || mr.access&access != access {
		return nil, false
	}
	return mr.slice(va, n)
}

// Invalidate implements wr.Memory.
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
	if a.SendCQ == nil || a.RecvCQ == nil || a.Type > GSI {
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
	if a.Type == GSI {
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
	q.state = Reset
	q.commEst = false
	q.cc = nil
	q.rq = newRecvRing(a.MaxRecvWR, a.MaxSGE)
	var rq wr.RecvQueue = &q.rq
	if a.SRQ != nil {
		rq = a.SRQ
	}
	switch a.Type {
	case UD, GSI:
		q.ud = ud.New(q.qpn, a.MaxSendWR, a.MaxSGE, rq)
	default:
		q.rc = rc.New(q.qpn, a.MaxSendWR, a.MaxSGE, q.mem, rq)
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

func validMTU(m int) bool {
	return m == 256 || m == 512 || m == 1024 || m == 2048 || m == 4096
}

// Modify moves the QP to state to with the attributes that transition
// takes, refusing transitions IBA does not allow.
func (q *QP) Modify(to State, a *Attr) error {
	if a == nil {
		a = &Attr{}
	}
	q.mu.Lock()
	defer q.release()
	if q.destroyed.Load() {
		return ErrDestroyed
	}
	from := q.state
	if to == Reset {
		q.resetLocked()
		return nil
	}
	if to == Err {
		q.toErrLocked()
		return nil
	}
	if to > Err || !legal[from][to] {
		return ErrState
	}
	t := q.init.Type
	switch to {
	case Init:
		if t == UC && a.Access&(RemoteRead|RemoteAtomic) != 0 {
			return ErrAccess
		}
		q.attr.Access, q.attr.QKey, q.attr.PKey = a.Access, a.QKey, a.PKey
		if t == GSI {
			q.attr.QKey = bth.GSIQKey // fixed by IBA for QP1
		}
	case RTR:
		mtu := a.PathMTU
		if t.datagram() && mtu == 0 {
			mtu = q.dev.cfg.PortMTU
		}
		if !validMTU(mtu) || mtu > q.dev.cfg.PortMTU || a.MaxDestRdAtomic > MaxRdAtomic || a.MinRNRTimer > 31 {
			return ErrInvalid
		}
		if !t.datagram() {
			h, err := q.dev.makeHdr(&a.AV, q.qpn, a.DestQPN)
			if err != nil {
				return err
			}
			q.hdr = h
			q.peer = a.AV.DestIP.Unmap()
		}
		q.attr.PathMTU, q.attr.DestQPN, q.attr.RQPSN = mtu, a.DestQPN&bth.QPNMask, a.RQPSN&bth.PSNMask
		q.attr.MaxDestRdAtomic, q.attr.MinRNRTimer, q.attr.AV = a.MaxDestRdAtomic, a.MinRNRTimer, a.AV
		if t.datagram() {
			q.ud.Receiver(ud.Config{QKey: q.attr.QKey, PKey: q.attr.PKey, MTU: mtu})
		} else {
			q.rc.Receiver(q.rcConfig())
			q.ccStart()
		}
	case RTS:
		if from == SQE {
			if q.ud != nil {
				q.ud.Resume()
			} else {
				q.rc.Resume()
			}
		}
		if from == RTR {
			if a.RetryCnt > 7 || a.RNRRetry > 7 || a.Timeout > 31 || a.MaxRdAtomic > MaxRdAtomic {
				return ErrInvalid
			}
			q.attr.SQPSN, q.attr.Timeout, q.attr.RetryCnt, q.attr.RNRRetry = a.SQPSN&bth.PSNMask, a.Timeout, a.RetryCnt, a.RNRRetry
			q.attr.MaxRdAtomic = a.MaxRdAtomic
			if t.datagram() {
				q.ud.Sender(bth.PSN(q.attr.SQPSN))
			} else {
				q.rc.Sender(q.rcConfig())
			}
		}
		if from != RTR && !t.datagram() && a.Mask != 0 {
			if a.RetryCnt > 7 || a.RNRRetry > 7 || a.Timeout > 31 || a.MinRNRTimer > 31 || a.MaxRdAtomic > MaxRdAtomic {
				return ErrInvalid
			}
			if t == UC && a.Access&(RemoteRead|RemoteAtomic) != 0 {
				return ErrAccess
			}
			m, at := a.Mask, &q.attr
			if m&MaskTimeout != 0 {
				at.Timeout = a.Timeout
			}
			if m&MaskRetryCnt != 0 {
				at.RetryCnt = a.RetryCnt
			}
			if m&MaskRNRRetry != 0 {
				at.RNRRetry = a.RNRRetry
			}
			if m&MaskMinRNRTimer != 0 {
				at.MinRNRTimer = a.MinRNRTimer
			}
			if m&MaskAccess != 0 {
				at.Access = a.Access
			}
			if m&MaskMaxRdAtomic != 0 {
				at.MaxRdAtomic = a.MaxRdAtomic
			}
			q.rc.Update(at.Timeout, at.RetryCnt, at.RNRRetry, at.MinRNRTimer, at.Access, at.MaxRdAtomic)
		}
		if !t.datagram() {
			q.rc.Drain(false)
		}
	case SQD:
		if !t.datagram() {
			q.rc.Drain(true)
		}
	}
	q.state = to
	q.txPending.Store(true)
	return nil
}

func (q *QP) rcConfig() rc.Config {
	a := &q.attr
	return rc.Config{
		UC: q.init.Type == UC, DestQPN: a.DestQPN, PKey: a.PKey, MTU: a.PathMTU,
		SQPSN: bth.PSN(a.SQPSN), RQPSN: bth.PSN(a.RQPSN), Timeout: a.Timeout, RetryCnt: a.RetryCnt,
		RNRRetry: a.RNRRetry, MinRNRTimer: a.MinRNRTimer, MaxRdAtomic: a.MaxRdAtomic,
		MaxDestRdAtomic: a.MaxDestRdAtomic, Access: a.Access,
		// rxe's recovery until the device has its knob and wakes on
		// frames precisely: today a napping peer answers up to a Go
		// timer's granularity late, and the adaptive probe then fires
		// spuriously (a duplicate on the wire).
		Recovery: rc.RecoveryTimeout,
	}
}

// toErrLocked moves the QP to ERR and flushes every outstanding WR.
func (q *QP) toErrLocked() {
	q.state = Err
	if q.ud != nil {
		q.ud.Flush()
	} else {
		q.rc.Flush()
	}
	var w wr.RecvWQE
	if q.init.SRQ == nil {
		for q.rq.Take(&w) {
			q.pushWC(wr.WC{ID: w.ID, Status: wr.WRFlushErr, Opcode: wr.WCRecv, IsRecv: true, QPN: q.qpn})
		}
	}
}

// pushWC delivers a completion produced outside the transport.
func (q *QP) pushWC(wc wr.WC) {
	q.cqe.add(&wc)
	if wc.IsRecv {
		q.init.RecvCQ.push([]wr.WC{wc}, true)
	} else {
		q.init.SendCQ.push([]wr.WC{wc}, false)
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
	var wcs []wr.WC
	if q.ud != nil {
		if q.ud.SendError() && q.state != Err && q.state != SQE {
			q.state = SQE
		}
		if q.state == SQE {
			q.ud.FlushSend()
		}
		wcs = q.ud.TakeCompletions()
	} else {
		if q.rc.Failed() && q.state != Err && q.state != Reset {
			q.state = Err
			q.rc.Flush()
			q.dev.event(EventQPFatal, q.qpn)
		}
		if q.rc.SendError() && q.state != Err && q.state != Reset {
			q.state = SQE
			q.rc.FlushSend()
		}
		wcs = q.rc.TakeCompletions()
	}
	if len(wcs) > 0 {
		var send, recv bool
		for i := range wcs {
			if wcs[i].IsRecv {
				recv = true
			} else {
				send = true
			}
			if wcs[i].Status != wr.Success {
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
	if q.state != Err && q.state != Reset && (q.init.SendCQ.overrun.Load() || q.init.RecvCQ.overrun.Load()) {
		// A CQ of this QP overflowed (see CQ): the QP goes to ERR, as a
		// transport error would take it, and what it flushes is counted
		// as lost on the CQ in error.
		q.state = Err
		if q.ud != nil {
			q.ud.Flush()
			wcs = q.ud.TakeCompletions()
		} else {
			q.rc.Flush()
			wcs = q.rc.TakeCompletions()
		}
		for i := range wcs {
			q.cqe.add(&wcs[i])
		}
		q.init.SendCQ.push(wcs, false)
		q.init.RecvCQ.push(wcs, true)
		q.dev.event(EventQPFatal, q.qpn)
	}
	if q.state == Err && q.init.SRQ == nil && q.rq.head != q.rq.tail {
		var w wr.RecvWQE
		for q.rq.Take(&w) {
			q.pushWC(wr.WC{ID: w.ID, Status: wr.WRFlushErr, Opcode: wr.WCRecv, IsRecv: true, QPN: q.qpn})
		}
	}
	var pending bool
	dl := clock.Never
	if q.ud != nil {
		pending = q.ud.HasOutput()
	} else {
		pending, dl = q.rc.HasOutput(), q.rc.Deadline()
		if q.cc != nil {
			pending, dl = q.cc.ccRelease(pending, dl)
		}
	}
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
	Opcode Opcode
	Flags  Flags
	SG     []SGE
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
		if q.state != RTS && q.state != SQD && q.state != SQE && q.state != Err {
			return i, ErrQPState
		}
		if err := q.checkSend(s); err != nil {
			return i, err
		}
		free := 0
		if q.ud != nil {
			free = q.ud.SendQueueFree()
		} else {
			free = q.rc.SendQueueFree()
		}
		if free == 0 {
			return i, ErrQueueFull
		}
		if q.state == Err || q.state == SQE {
			q.pushWC(wr.WC{ID: s.ID, Status: wr.WRFlushErr, Opcode: wcOpcode(s.Opcode), QPN: q.qpn})
			continue
		}
		q.resolveSend(s, w, sg)
		if q.ud != nil {
			q.ud.Post(w)
		} else {
			q.rc.Post(w)
		}
	}
	q.txPending.Store(true)
	return len(wrs), nil
}

func wcOpcode(o Opcode) WCOpcode {
	switch o {
	case RDMAWrite, RDMAWriteWithImm:
		return wr.WCRDMAWrite
	case RDMARead:
		return wr.WCRDMARead
	case AtomicCmpAndSwp:
		return wr.WCCompSwap
	case AtomicFetchAndAdd:
		return wr.WCFetchAdd
	}
	return wr.WCSend
}

func (q *QP) checkSend(s *SendWR) error {
	t := q.init.Type
	switch {
	case s.Opcode > AtomicFetchAndAdd:
		return ErrBadOpcode
	case t.datagram() && s.Opcode != Send && s.Opcode != SendWithImm:
		return ErrBadOpcode
	case t == UC && (s.Opcode == RDMARead || s.Opcode.IsAtomic()):
		return ErrBadOpcode
	case t.datagram() && s.AH == nil:
		return ErrInvalid
	case len(s.SG) > q.init.MaxSGE:
		return ErrTooManySGE
	case s.Flags&Inline != 0 && (len(s.InlineData) > q.init.MaxInline || s.Opcode == RDMARead || s.Opcode.IsAtomic()):
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
func (q *QP) resolveSend(s *SendWR, w *wr.SendWQE, sg [][]byte) {
	*w = wr.SendWQE{ID: s.ID, Opcode: s.Opcode, Flags: s.Flags, Imm: s.Imm, InvRKey: s.InvRKey,
		RemoteAddr: s.RemoteAddr, RKey: s.RKey, RemoteQPN: s.RemoteQPN & bth.QPNMask, RemoteQKey: s.RemoteQKey}
	if q.init.SigAll {
		w.Flags |= Signaled
	}
	switch s.Opcode {
	case AtomicCmpAndSwp:
		w.Compare, w.SwapAdd = s.CompareAdd, s.Swap
	case AtomicFetchAndAdd:
		w.SwapAdd = s.CompareAdd
	}
	if s.AH != nil {
		w.AH = s.AH
	}
	if s.Flags&Inline != 0 {
		// Inline data is copied now so the caller may reuse its buffer,
		// into the QP's arena of MaxSendWR slots: a slot comes round again
		// only MaxSendWR posts later, when the SQ can no longer hold the
		// WQE that used it.
		n := q.init.MaxInline
		k := q.inlineNext % q.init.MaxSendWR
		q.inlineNext++
		b := q.inline[k*n : k*n+len(s.InlineData)]
		copy(b, s.InlineData)
		w.SG = append(sg, b)
		w.Length = uint32(len(b))
		return
	}
	needWrite := s.Opcode == RDMARead || s.Opcode.IsAtomic()
	var total uint64
	for _, g := range s.SG {
		m := q.dev.lookup(g.LKey, q.pd)
		var b []byte
		ok := m != nil && m.lkey == g.LKey && (!needWrite || m.access&LocalWrite != 0)
		if ok {
			b, ok = m.slice(g.Addr, uint64(g.Length))
		}
		if !ok {
			w.Err = wr.LocProtErr
			continue
		}
		sg = append(sg, b)
		total += uint64(g.Length)
	}
	if total > MaxMsgSize && w.Err == wr.Success {
		w.Err = wr.LocLenErr
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
		if q.state == Reset {
			return i, ErrQPState
		}
		if len(wrs[i].SG) > q.init.MaxSGE {
			return i, ErrTooManySGE
		}
		if q.rq.full() {
			return i, ErrQueueFull
		}
		if q.state == Err {
			q.pushWC(wr.WC{ID: wrs[i].ID, Status: wr.WRFlushErr, Opcode: wr.WCRecv, IsRecv: true, QPN: q.qpn})
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
	av  AddressVector
	hdr hdrTmpl
}

// CreateAH creates an address handle.
func (pd *PD) CreateAH(av AddressVector) (*AH, error) {
	h, err := pd.dev.makeHdr(&av, 0, 0)
	if err != nil {
		return nil, err
	}
	return &AH{av: av, hdr: h}, nil
}

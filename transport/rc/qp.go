package rc

import (
	"time"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/transport"
)

// Limits mirrored from rxe so that a peer sees the same pacing.
const (
	// MaxUnackedPSNs bounds the PSNs in flight (rxe RXE_MAX_UNACKED_PSNS).
	MaxUnackedPSNs = 128
	// MaxPktPerAck bounds the packets sent without AckReq (rxe's
	// RXE_MAX_PKT_PER_ACK, with rxe's count: AckReq falls on the
	// MaxPktPerAck+2nd packet).
	MaxPktPerAck = 64
	// MaxReadLen is the largest RDMA length a RETH may carry (2^31).
	MaxReadLen = 1 << 31
)

// AETH syndromes (IBA 9.7.5.2.2).
const (
	SynACK          = 0x1F // ACK, credits "unlimited" as rxe sends
	SynRNRNAK       = 0x20 // | RNR timer code
	SynNAKPSNSeq    = 0x60
	SynNAKInvReq    = 0x61
	SynNAKRemAccess = 0x62
	SynNAKRemOp     = 0x63
)

// rnrTimerNS is the RNR NAK timer table (IBA Table 45) in nanoseconds,
// indexed by the 5-bit code.
var rnrTimerNS = [32]int64{
	655360000, 10000, 20000, 30000, 40000, 60000, 80000, 120000,
	160000, 240000, 320000, 480000, 640000, 960000, 1280000, 1920000,
	2560000, 3840000, 5120000, 7680000, 10240000, 15360000, 20480000, 30720000,
	40960000, 61440000, 81920000, 122880000, 163840000, 245760000, 327680000, 491520000,
}

// RNRDelay returns the wait an RNR NAK with timer code c asks for.
func RNRDelay(c uint8) time.Duration { return time.Duration(rnrTimerNS[c&31]) }

// AckTimeout returns the local ACK timeout 4.096 µs × 2^t (0: none), kept
// to the nanosecond instead of being rounded to a scheduler tick as rxe does.
func AckTimeout(t uint8) time.Duration {
	if t == 0 || t > 31 {
		return 0
	}
	return time.Duration(int64(4096) << t)
}

// Config is what the QP attributes (ibv_modify_qp to RTR and RTS) give a
// connected QP.
type Config struct {
	UC          bool   // unreliable connected: no ACKs, no READ/ATOMIC
	QPN         uint32 // local QP number
	DestQPN     uint32
	PKey        uint16 // 0 means bth.DefaultPKey
	MTU         int    // path MTU in bytes: 256, 512, 1024, 2048 or 4096
	SQPSN       bth.PSN
	RQPSN       bth.PSN
	Timeout     uint8 // local ACK timeout exponent (0: wait forever)
	RetryCnt    uint8 // transport retries, 0-7 (7 means 7)
	RNRRetry    uint8 // RNR retries, 0-7 (7 means forever)
	MinRNRTimer uint8 // code sent in our RNR NAKs
	// MaxRdAtomic bounds the READ/ATOMICs this QP has outstanding as a
	// requester; MaxDestRdAtomic is how many the responder remembers for
	// duplicate replay.
	MaxRdAtomic     int
	MaxDestRdAtomic int
	Access          ib.Access // remote operations the responder accepts
	SQDepth         int       // max outstanding send WQEs
	MaxSGE          int
	// Recovery chooses how the requester recovers lost packets;
	// RecoveryDefault (the zero value) is RecoverySelective, as ConnectX
	// enables adaptive retransmission by default.
	Recovery ib.Recovery
}

// Selective repeat is offered only toward QPs whose number is in softrnic's
// range: QPN & SoftQPNMask == SoftQPNTag. A device that wants selective
// repeat allocates its RC QP numbers there, so two softrnic QPs recognise
// each other from the QP numbers they were connected with, however that was
// done (perftest's side channel, rdma_cm, an application's own exchange),
// while rxe (QP numbers below 0x100000) never sees a reserved bit set.
const (
	SoftQPNMask = 0xF00000
	SoftQPNTag  = 0xA00000
)

// SoftQPN reports whether qpn is in softrnic's selective-repeat range.
func SoftQPN(qpn uint32) bool { return qpn&SoftQPNMask == SoftQPNTag }

// Counters count what the QP dropped or retried, for diagnostics.
type Counters struct {
	RxDropped     uint64 // malformed, unexpected or out-of-state packets
	RxDuplicate   uint64 // duplicate requests answered or dropped
	RxOutOfSeq    uint64 // requests beyond the expected PSN
	TxNAKs        uint64
	TxRNRNAKs     uint64
	Retransmits   uint64 // go-back-N restarts (NAK, timeout, RNR, lost response)
	Timeouts      uint64
	RNRWaits      uint64
	GhostResponse uint64 // responses for nothing outstanding
	// Requester, by NAK received (mlx5: packet_seq_err,
	// req_remote_access_errors, req_remote_invalid_request), and READ
	// response gaps that restarted a READ (implied_nak_seq_err).
	RxNAKSeqErr    uint64
	RxNAKRemAccess uint64
	RxNAKInvReq    uint64
	ImpliedNAKs    uint64
	// Responder: request messages received in sequence, by kind (counted
	// at their first or only packet; duplicates are in RxDuplicate), and
	// requests refused for an rkey, range or access right
	// (resp_remote_access_errors) or for a receive WQE too small
	// (resp_local_length_error).
	RxWriteReqs     uint64
	RxReadReqs      uint64
	RxAtomicReqs    uint64
	RemAccessErrs   uint64
	LocalLengthErrs uint64
	// Progress counts the requester's forward steps: in-order responses
	// and ACKs that moved the completion PSN. A CQ-moderated application
	// sees one completion per many messages; this is how it tells a slow
	// recovery on a lossy path from a peer that stopped answering.
	Progress uint64
	// Adaptive retransmission (requester). AdpRetrans counts its
	// retransmission events (tail-loss probes, fast retransmissions,
	// RTO expiries; mlx5 roce_adp_retrans), AdpRetransTO the RTO expiries
	// among them (roce_adp_retrans_to); Timeouts above stays the local
	// ACK timeout (local_ack_timeout_err).
	AdpRetrans   uint64
	AdpRetransTO uint64
	// TimeoutsExcused counts local ACK timeouts that spent no retry: the
	// peer's device was heard from meanwhile (HeardFrom). Timeouts counts
	// them too.
	TimeoutsExcused uint64
	TLPProbes       uint64 // tail-loss probes sent
	FastRetrans     uint64 // go-back-N restarts a probe's answer called for
	// Selective repeat. Requester: SACKs received, packets retransmitted
	// selectively (holes and READ sub-ranges asked again). Responder:
	// SACKs sent. Both: packets held out of order, and packets that could
	// not be held (the device's reorder pool was empty).
	RxSACKs    uint64
	SelRetrans uint64
	TxSACKs    uint64
	SRHeld     uint64
	SRDropped  uint64
	// RetransPkts counts the request packets the requester sent more than
	// once, whatever the reason (go-back-N, probe, RTO, hole): the most a
	// peer can have counted as duplicates (rxe's duplicate_request).
	RetransPkts uint64
	// Responses (ACKs, NAKs, READ replies, atomic results) dropped because
	// the response queue was full: the requester retries as for a loss.
	RespQueueFull uint64
}

// Add adds every counter of o to c (a device's totals over its QPs).
func (c *Counters) Add(o *Counters) {
	c.RxDropped += o.RxDropped
	c.RxDuplicate += o.RxDuplicate
	c.RxOutOfSeq += o.RxOutOfSeq
	c.TxNAKs += o.TxNAKs
	c.TxRNRNAKs += o.TxRNRNAKs
	c.Retransmits += o.Retransmits
	c.Timeouts += o.Timeouts
	c.RNRWaits += o.RNRWaits
	c.GhostResponse += o.GhostResponse
	c.RxNAKSeqErr += o.RxNAKSeqErr
	c.RxNAKRemAccess += o.RxNAKRemAccess
	c.RxNAKInvReq += o.RxNAKInvReq
	c.ImpliedNAKs += o.ImpliedNAKs
	c.RxWriteReqs += o.RxWriteReqs
	c.RxReadReqs += o.RxReadReqs
	c.RxAtomicReqs += o.RxAtomicReqs
	c.RemAccessErrs += o.RemAccessErrs
	c.LocalLengthErrs += o.LocalLengthErrs
	c.Progress += o.Progress
	c.AdpRetrans += o.AdpRetrans
	c.AdpRetransTO += o.AdpRetransTO
	c.TimeoutsExcused += o.TimeoutsExcused
	c.TLPProbes += o.TLPProbes
	c.FastRetrans += o.FastRetrans
	c.RxSACKs += o.RxSACKs
	c.SelRetrans += o.SelRetrans
	c.TxSACKs += o.TxSACKs
	c.SRHeld += o.SRHeld
	c.SRDropped += o.SRDropped
	c.RetransPkts += o.RetransPkts
	c.RespQueueFull += o.RespQueueFull
}

// QP is one RC or UC queue pair's transport state.
type QP struct {
	cfg    Config
	mem    ib.Memory
	rq     ib.RecvQueue
	reqOn  bool // requester may send (RTS)
	respOn bool // responder accepts requests (RTR or later)
	failed bool // a fatal error happened; the device must move the QP to ERR
	sqErr  bool // UC: a local send error stopped the SQ (SQE)
	errSt  ib.WCStatus
	failEv ib.EventType // the event of the fatal error (Failure)

	req  requester
	resp responder
	pool *ReorderPool // where selective repeat holds packets; nil: no selective repeat
	// spent are held packets executed since the last TakeCompletions: the
	// memory copies they made may still be under way (see spend).
	spent [][]byte

	wcs []ib.WC           // completions produced since the last TakeCompletions
	pay transport.Payload // the payload of the packet being built
	Counters

	ccCfg *CCConfig   // congestion control from RTR on, nil for none
	cc    *qpCC       // its state (cc.go), nil when the QP runs none
	ccCtr *CCCounters // shared with the QP's device
}

var _ transport.Transport = (*QP)(nil)

// Options say how to make a QP.
type Options struct {
	QPN     uint32
	UC      bool // unreliable connected: no ACKs, no READ/ATOMIC
	SQDepth int  // max outstanding send WQEs (at least 1)
	MaxSGE  int
	Mem     ib.Memory    // remote accesses of the responder (nil: none allowed)
	RQ      ib.RecvQueue // the QP's RQ or its SRQ
	// CC, if set, is the congestion control the QP runs from RTR on;
	// Counters, if set, is where it counts (CCCounters of the device).
	CC       *CCConfig
	Counters *CCCounters
	// Recovery is the QP's loss recovery mode (Config.Recovery).
	Recovery ib.Recovery
}

// New returns an RC QP in the state "created, not yet connected": it
// neither sends nor accepts anything until Receiver and Sender.
func New(qpn uint32, sqDepth, maxSGE int, mem ib.Memory, rq ib.RecvQueue) *QP {
	return NewQP(Options{QPN: qpn, SQDepth: sqDepth, MaxSGE: maxSGE, Mem: mem, RQ: rq})
}

// NewQP returns a QP made as o says, created and not yet connected.
func NewQP(o Options) *QP {
	sqDepth, maxSGE := max(o.SQDepth, 1), o.MaxSGE
	q := &QP{mem: o.Mem, rq: o.RQ, ccCfg: o.CC, ccCtr: o.Counters}
	if q.ccCtr == nil {
		q.ccCtr = new(CCCounters)
	}
	q.cfg.QPN = o.QPN
	q.cfg.UC = o.UC
	q.cfg.Recovery = o.Recovery
	q.cfg.SQDepth = sqDepth
	q.cfg.MaxSGE = maxSGE
	q.req.sq = make([]sendEntry, sqDepth)
	for i := range q.req.sq {
		q.req.sq[i].SG = make([]ib.Seg, 0, maxSGE)
	}
	q.resp.cur.SG = make([]ib.Seg, 0, maxSGE)
	q.resp.ctr = &q.Counters
	q.wcs = make([]ib.WC, 0, sqDepth+64)
	return q
}

// Config returns the QP's current attributes.
func (q *QP) Config() Config { return q.cfg }

// Receiver arms the responder with cfg (the RTR transition): PSN, MTU,
// destination QP, access flags and responder resources.
func (q *QP) Receiver(cfg Config) {
	cfg.QPN, cfg.SQDepth, cfg.MaxSGE = q.cfg.QPN, q.cfg.SQDepth, q.cfg.MaxSGE
	if cfg.PKey == 0 {
		cfg.PKey = bth.DefaultPKey
	}
	if cfg.MaxDestRdAtomic < 1 {
		cfg.MaxDestRdAtomic = 1
	}
	q.cfg = cfg
	q.srRespStop()
	q.resp.init(cfg)
	q.respOn = true
}

// Sender arms the requester (the RTS transition): SQ PSN, timeout, retry
// counts and the initiator depth; the responder keeps running.
func (q *QP) Sender(cfg Config) {
	if !q.respOn {
		q.Receiver(cfg)
	}
	q.cfg.SQPSN, q.cfg.Timeout, q.cfg.RetryCnt, q.cfg.RNRRetry = cfg.SQPSN, cfg.Timeout, cfg.RetryCnt&7, cfg.RNRRetry&7
	q.cfg.MaxRdAtomic = cfg.MaxRdAtomic
	if q.cfg.MaxRdAtomic < 1 {
		q.cfg.MaxRdAtomic = 1
	}
	q.req.init(&q.cfg)
	q.srStop()
	q.req.mark = q.srAllowed()
	q.reqOn = true
}

// Update changes, in RTS, the attributes IBA lets a QP change there
// (RTS→RTS / SQD→RTS): local ACK timeout, retry counts, min RNR timer,
// access flags and max_rd_atomic. Retry budgets restart from the new
// counts, and so does the patience a heard peer earns (HeardFrom).
func (q *QP) Update(timeout, retryCnt, rnrRetry, minRNRTimer uint8, access ib.Access, maxRdAtomic int) {
	q.cfg.Timeout, q.cfg.RetryCnt, q.cfg.RNRRetry, q.cfg.MinRNRTimer = timeout, retryCnt&7, rnrRetry&7, minRNRTimer&31
	q.cfg.Access = access
	if maxRdAtomic > 0 {
		q.cfg.MaxRdAtomic = maxRdAtomic
	}
	q.req.rto = clock.Time(AckTimeout(timeout))
	q.req.retryLeft, q.req.rnrLeft, q.req.excused = q.cfg.RetryCnt, q.cfg.RNRRetry, 0
	if q.req.rto == 0 {
		q.req.timer = clock.Never
	}
}

// Drain stops the requester from starting new WQEs (SQD) or lets it go on.
func (q *QP) Drain(on bool) { q.req.draining = on }

// Modify implements transport.Transport: the attributes of RTR arm the
// responder (and start congestion control), those of RTS the requester;
// SQD drains the send queue, leaving SQE resumes it.
func (q *QP) Modify(from, to ib.QPState, a *ib.QPAttr) {
	switch {
	case from == ib.Init && to == ib.RTR:
		q.Receiver(q.configOf(a))
		q.ccStart()
		return
	case from == ib.RTR && to == ib.RTS:
		q.Sender(q.configOf(a))
	case from == ib.SQE:
		q.Resume()
	}
	if to == ib.RTS || to == ib.SQD {
		q.Update(a.Timeout, a.RetryCnt, a.RNRRetry, a.MinRNRTimer, a.Access, int(a.MaxRdAtomic))
		q.Drain(to == ib.SQD)
	}
}

// configOf is the Config of a QP with attributes a.
func (q *QP) configOf(a *ib.QPAttr) Config {
	return Config{UC: q.cfg.UC, DestQPN: a.DestQPN, PKey: bth.DefaultPKey, MTU: int(a.PathMTU),
		SQPSN: bth.PSN(a.SQPSN), RQPSN: bth.PSN(a.RQPSN), Timeout: a.Timeout, RetryCnt: a.RetryCnt,
		RNRRetry: a.RNRRetry, MinRNRTimer: a.MinRNRTimer, MaxRdAtomic: int(a.MaxRdAtomic),
		MaxDestRdAtomic: int(a.MaxDestRdAtomic), Access: a.Access, Recovery: q.cfg.Recovery}
}

// Drained reports whether no send WQE is in progress: every WQE the
// requester started has completed (the SQ drained of a QP in SQD).
func (q *QP) Drained() bool { return q.req.head == q.req.end() }

// Failed reports whether the QP hit a fatal error (the failing WQE has
// completed with its status); the device then moves it to ERR and calls
// Flush.
func (q *QP) Failed() bool { return q.failed }

// Failure is the asynchronous event of the fatal error Failed reports.
func (q *QP) Failure() ib.EventType { return q.failEv }

// SendQueueFree is how many more send WQEs Post accepts now.
func (q *QP) SendQueueFree() int { return len(q.req.sq) - int(q.req.tail-q.req.head) }

// Outstanding is the number of send WQEs posted and not yet completed.
func (q *QP) Outstanding() int { return int(q.req.tail - q.req.head) }

// Post appends a send WQE (its SG slice headers are copied, not the bytes
// they point to). It returns false when the SQ is full.
func (q *QP) Post(w *ib.SendWQE) bool {
	r := &q.req
	if r.tail-r.head >= uint32(len(r.sq)) {
		return false
	}
	e := &r.sq[r.tail%uint32(len(r.sq))]
	sg := append(e.SG[:0], w.SG...)
	e.SendWQE = *w
	e.SG = sg
	e.state = wqePosted
	e.sent, e.got = 0, 0
	e.onWire = false
	r.tail++
	return true
}

// TakeCompletions returns the completions produced since the last call and
// forgets them; the slice is valid until the next call on the QP.
//
// The device calls it at the end of each visit to the QP, once the memory
// copies the visit made are complete (a device may batch or defer its
// writes to memory until then): only now do the reorder pool's buffers of
// the held packets executed during the visit go back to the pool, since
// those copies read from them.
func (q *QP) TakeCompletions() []ib.WC {
	q.releaseSpent()
	w := q.wcs
	q.wcs = q.wcs[:0]
	return w
}

func (q *QP) releaseSpent() {
	if len(q.spent) > 0 {
		q.pool.putAll(q.spent)
		clear(q.spent)
		q.spent = q.spent[:0]
	}
}

// spend keeps b, the pool buffer of a held packet just executed, until the
// visit's memory copies are done (TakeCompletions): a WRITE's payload, a
// SEND's or a READ response's may still be on its way into memory from b,
// and the next held packet must not land in b meanwhile.
func (q *QP) spend(b []byte) {
	if q.spent == nil {
		q.spent = make([][]byte, 0, SRWindow)
	}
	q.spent = append(q.spent, b)
}

// ReleaseHeld hands every pool buffer the QP holds back to its device's
// reorder pool and lets go of the pool: the device calls it when the QP is
// destroyed or reset, which would otherwise take the buffers with it. A
// packet that reaches the QP afterwards is not held.
func (q *QP) ReleaseHeld() {
	if q.pool == nil {
		return
	}
	q.releaseSpent()
	q.req.sr.held.dropBefore(q.pool, 0, true)
	q.resp.held.dropBefore(q.pool, 0, true)
	q.pool = nil
}

func (q *QP) complete(wc ib.WC) {
	wc.QPN = q.cfg.QPN
	q.wcs = append(q.wcs, wc)
}

// fail records a fatal error: both halves stop; any NAK already queued is
// still sent by BuildHeader so that the peer learns why.
func (q *QP) fail(st ib.WCStatus) { q.failAs(st, ib.EventQPFatal) }

// failAs is fail with the asynchronous event the error raises.
func (q *QP) failAs(st ib.WCStatus, ev ib.EventType) {
	if !q.failed {
		q.failed = true
		q.errSt = st
		q.failEv = ev
	}
	q.reqOn = false
	q.respOn = false
	q.req.timer = clock.Never
	q.req.rnrWait = false
	q.disarmAdaptive()
	q.srStop()
	q.srRespStop()
}

// Flush completes every outstanding send WQE and the receive WQE in
// progress with WR_FLUSH_ERR (the ERR state). Receive WQEs still in the
// RQ are the device's to flush.
func (q *QP) Flush() {
	q.fail(ib.WRFlushErr)
	r := &q.req
	for r.head != r.tail {
		e := &r.sq[r.head%uint32(len(r.sq))]
		q.complete(ib.WC{ID: e.ID, Status: ib.WRFlushErr, Opcode: e.Opcode.WCOpcode(), ByteLen: 0})
		e.SG = e.SG[:0]
		r.head++
	}
	r.next = r.head
	if q.resp.haveRecv {
		q.complete(ib.WC{ID: q.resp.cur.ID, Status: ib.WRFlushErr, Opcode: ib.WCRecv, IsRecv: true})
		q.resp.haveRecv = false
	}
	q.resp.qhead, q.resp.qlen = 0, 0
}

// FlushKeepAck is Flush for the application's move to ERR: the ACK of
// messages already executed (their receive completions may have been
// polled) still goes out, as the final reply. The device sends a batch's
// ACKs after it publishes the batch's completions, and an application
// that moves the QP to ERR at once (rdma_disconnect) must not leave its
// peer to flush a SEND that arrived. A QP the device fails (a CQ overrun,
// a DMA fault) sends no such ACK: what it executed did not complete. (A
// UC responder queues no ACKs; a fatal NAK, already the final reply,
// comes with failed.)
func (q *QP) FlushKeepAck() {
	if it, ok := q.resp.owedAck(); ok && !q.failed {
		q.resp.final, q.resp.hasFinal = it, true
	}
	q.Flush()
}

// SendError reports whether a UC send WQE failed locally and stopped the
// SQ: the device moves the QP to SQE and calls FlushSend.
func (q *QP) SendError() bool { return q.sqErr }

// FlushSend completes every send WQE not yet completed with WR_FLUSH_ERR
// (SQE), leaving the responder running.
func (q *QP) FlushSend() {
	r := &q.req
	for r.head != r.tail {
		e := r.entry(r.head)
		q.complete(ib.WC{ID: e.ID, Status: ib.WRFlushErr, Opcode: e.Opcode.WCOpcode()})
		e.SG = e.SG[:0]
		r.head++
	}
	r.next = r.head
	r.compPSN = r.psn
}

// Resume restarts a send queue stopped by SQE (SQE → RTS).
func (q *QP) Resume() {
	if q.sqErr && !q.failed {
		q.sqErr, q.reqOn = false, true
	}
}

// Deadline is when Expire must next be called (clock.Never: no timer):
// the RNR wait or the local ACK timeout and the adaptive retransmission
// timers, and with congestion control its timers and the end of a pacer
// wait.
func (q *QP) Deadline() clock.Time {
	dl := clock.Never
	switch {
	case !q.reqOn:
	case q.req.rnrWait:
		dl = q.req.rnrAt
	case q.adaptive():
		dl = clock.Min(q.req.timer, clock.Min(q.req.rtoAt, clock.Min(q.req.ptoAt, q.req.fastAt)))
		if q.req.sr.on {
			dl = clock.Min(dl, q.req.sr.reoAt)
		}
	default:
		dl = q.req.timer
	}
	if cc := q.cc; cc != nil {
		dl = min(dl, cc.deadline(q.hasOutput()))
	}
	return dl
}

// Expire runs the timers due at now: the RNR wait, the local ACK timeout
// and the adaptive retransmission timers, and congestion control's.
func (q *QP) Expire(now clock.Time) { q.ccExpire(now) }

// HasOutput reports whether BuildHeader would produce a packet now. A QP the
// pacer holds has none until its departure time unless it owes a CNP; one
// that has nothing to send is not parked at all (the pacer remembers its
// debt and parks it again when it has), so an idle QP costs no wake-up.
func (q *QP) HasOutput() bool {
	p := q.hasOutput()
	if cc := q.cc; cc != nil {
		if !p {
			cc.paceAt = clock.Never
		}
		p = p && cc.paceAt == clock.Never || cc.cnps > 0
	}
	return p
}

// hasOutput reports whether the transport itself has a packet to build.
func (q *QP) hasOutput() bool {
	return q.resp.qlen > 0 || q.resp.hasFinal || (q.reqOn && (q.req.hasRetransmit() || q.req.canSend(q)))
}

// MaxPacket is the largest transport packet BuildHeader describes for this
// QP.
func (q *QP) MaxPacket() int { return PacketLen(q.cfg.MTU) }

// PacketLen is the largest transport packet of a QP with path MTU mtu: what
// a ReorderPool's buffers must hold for QPs up to that MTU.
func PacketLen(mtu int) int { return bth.MaxHeaderLen + mtu + 3 }

// BuildHeader implements transport.Transport: it writes the headers of
// the next packet to send into hdr, which must hold MaxPacket bytes,
// describes its payload in pay and returns the headers' length, or 0 when
// there is nothing to send.
func (q *QP) BuildHeader(now clock.Time, hdr []byte, pay *transport.Payload) int {
	q.pay.Reset()
	n := q.build(now, hdr)
	*pay = q.pay
	return n
}

// build writes the headers of the next packet to send into buf and leaves
// its payload in q.pay. Responses go before new requests so that the
// peer's window keeps moving.
func (q *QP) build(now clock.Time, buf []byte) int {
	if len(buf) < q.MaxPacket() {
		return 0
	}
	if cc := q.cc; cc != nil {
		if cc.cnps > 0 {
			return q.buildCNP(buf)
		}
		if !cc.mayBuild(now) {
			return 0
		}
		cc.lastCNP = false
	}
	if q.resp.qlen > 0 || q.resp.hasFinal {
		return q.buildResponse(buf)
	}
	if !q.reqOn {
		return 0
	}
	if n := q.buildRetransmit(now, buf); n > 0 {
		return n
	}
	return q.buildRequest(now, buf)
}

// Receive processes one transport packet (BTH to end of pad, no ICRC) that
// the device has already checked for address, P_Key, ICRC, destination QP
// and source; m (nil: none) says how it was marked. A CNP goes to the
// reaction point; every other packet passes the notification point first.
// Malformed packets are counted and dropped.
func (q *QP) Receive(now clock.Time, pkt []byte, m *transport.Meta) {
	if len(pkt) < bth.BTHLen {
		q.RxDropped++
		return
	}
	op := bth.BTH(pkt).Opcode()
	if op == bth.CNP {
		q.receiveCNP(now)
		return
	}
	if q.cc != nil && m != nil {
		q.npPacket(now, op, m.ECN)
	}
	hl := op.HeaderLen()
	pad := bth.BTH(pkt).PadCount()
	if hl == 0 || len(pkt) < hl+pad || (!op.HasPayload() && len(pkt) != hl+pad && !isSACK(pkt, op, hl, pad)) {
		q.RxDropped++
		return
	}
	if q.cfg.UC {
		if op.Transport() != bth.TransportUC {
			q.RxDropped++
			return
		}
	} else if op.Transport() != bth.TransportRC {
		q.RxDropped++
		return
	}
	if op.IsResponse() {
		if !q.reqOn || q.cfg.UC {
			q.RxDropped++
			return
		}
		q.receiveResponse(now, pkt, op, hl, len(pkt)-pad)
		if m != nil {
			q.ccResponse(now, m.RxAway)
		} else {
			q.ccResponse(now, 0)
		}
		return
	}
	if !q.respOn {
		q.RxDropped++
		return
	}
	if m != nil {
		q.resp.win = m.RecvWindow
	}
	q.receiveRequest(pkt, op, hl, len(pkt)-pad)
}

// isSACK reports whether pkt is an ACK followed by a well-formed SACKETH
// (an ACK without one has no bytes after its AETH).
func isSACK(pkt []byte, op bth.Opcode, hl, pad int) bool {
	return op == bth.RCAcknowledge && bth.BTH(pkt).SR() && pad == 0 && bth.SACKETH(pkt[hl:]).Valid()
}

// pktsFor is the number of packets a message of n bytes takes at mtu.
func pktsFor(n uint32, mtu int) uint32 {
	if n == 0 {
		return 1
	}
	return (n + uint32(mtu) - 1) / uint32(mtu)
}

// encodeBTH writes a BTH with the fields softrnic varies.
func (q *QP) encodeBTH(b []byte, op bth.Opcode, psn bth.PSN, ackReq, se bool, pad int) {
	h := bth.BTH(b)
	h.Encode(&bth.BTHFields{Opcode: op, SE: se, PadCount: pad, PKey: q.cfg.PKey, DestQP: q.cfg.DestQPN, AckReq: ackReq, PSN: psn})
}

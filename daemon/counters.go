package daemon

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/softrnic/softrnic/congestion"
	"github.com/softrnic/softrnic/daemon/proto"
	"github.com/softrnic/softrnic/engine"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/port"
	"github.com/softrnic/softrnic/port/afxdp"
	"github.com/softrnic/softrnic/rnic"
	"github.com/softrnic/softrnic/transport/rc"
)

// CountingPort wraps the engine's port to count bytes both ways (the device
// counts frames, not bytes) and, for an AF_XDP port, to publish the XDP
// program's and the socket's statistics: afxdp.Port.Stats must run on the
// goroutine that owns the port, so the engine loop itself refreshes a
// snapshot here, at most every RefreshEvery, and at once on the first
// Recv after a reader asked for it (Snapshot). Its cost on the data path is
// a sum over each batch and two atomic adds per batch, never per frame.
type CountingPort struct {
	port.Port
	xdp   xdpPort
	multi *afxdp.Multi // non-nil: per-queue statistics too

	rxBytes, txBytes atomic.Uint64

	want  atomic.Bool   // a reader wants fresh AF_XDP statistics
	gen   atomic.Uint64 // refreshes done
	calls uint32        // loop-owned
	last  time.Time     // loop-owned: last refresh

	mu     sync.Mutex
	xst    afxdp.Stats
	queues []proto.QueueStats
	ok     bool // xst was read at least once
}

// xdpPort is what both AF_XDP ports (one queue, or afxdp.Multi over
// several) publish.
type xdpPort interface {
	Stats() (afxdp.Stats, error)
}

// RefreshEvery bounds how stale the AF_XDP statistics get while nobody asks.
const RefreshEvery = time.Second

// NewCountingPort wraps p. Give the engine the wrapper, not p.
func NewCountingPort(p port.Port) *CountingPort {
	c := &CountingPort{Port: p}
	switch x := p.(type) {
	case *afxdp.Port:
		c.xdp = x
	case *afxdp.Multi:
		c.xdp, c.multi = x, x
	}
	if c.xdp != nil {
		c.refresh() // before the engine owns the port: still this goroutine's
	}
	return c
}

// Recv implements port.Port.
func (c *CountingPort) Recv(frames [][]byte, timeout time.Duration) (int, error) {
	n, err := c.Port.Recv(frames, timeout)
	if n > 0 {
		var b int
		for _, f := range frames[:n] {
			b += len(f)
		}
		c.rxBytes.Add(uint64(b))
	}
	if c.xdp != nil {
		c.calls++
		if c.want.Load() || c.calls&1023 == 0 && time.Since(c.last) >= RefreshEvery {
			c.refresh()
		}
	}
	return n, err
}

// Wake implements port.Waker: the wrapped port is woken (every port the
// daemon opens can be).
func (c *CountingPort) Wake() error {
	if w, ok := c.Port.(port.Waker); ok {
		return w.Wake()
	}
	return errors.ErrUnsupported
}

// Submit implements port.Port.
func (c *CountingPort) Submit(frames [][]byte) (int, error) {
	n, err := c.Port.Submit(frames)
	if n > 0 {
		var b int
		for _, f := range frames[:n] {
			b += len(f)
		}
		c.txBytes.Add(uint64(b))
	}
	return n, err
}

func (c *CountingPort) refresh() {
	st, err := c.xdp.Stats()
	var qs []afxdp.QueueStats
	if c.multi != nil && err == nil {
		qs, err = c.multi.QueueStats()
	}
	c.want.Store(false)
	c.last = time.Now()
	if err == nil {
		c.mu.Lock()
		c.xst, c.ok = st, true
		c.queues = c.queues[:0]
		for _, q := range qs {
			c.queues = append(c.queues, proto.QueueStats{RxPackets: q.Received, RxRingFull: q.Socket.RxRingFull})
		}
		c.mu.Unlock()
	}
	c.gen.Add(1)
}

// FreshWait bounds how long XDPStats waits for the loop to publish fresh
// statistics: an idle loop asleep in the port is woken for them, a stopped
// one never answers.
const FreshWait = 50 * time.Millisecond

// Bytes returns the bytes received and sent so far (any goroutine).
func (c *CountingPort) Bytes() (rx, tx uint64) { return c.rxBytes.Load(), c.txBytes.Load() }

// XDPStats asks the loop for fresh AF_XDP statistics and returns them once
// published, or after FreshWait the last ones published; ok is false for
// other ports. Called from control goroutines, never from the loop.
func (c *CountingPort) XDPStats() (afxdp.Stats, bool) {
	if c.xdp == nil {
		return afxdp.Stats{}, false
	}
	g := c.gen.Load()
	c.want.Store(true)
	_ = c.Wake() // fails only without a waker, and then the next Recv comes by itself
	for waited := time.Duration(0); c.gen.Load() == g && waited < FreshWait; waited += time.Millisecond {
		time.Sleep(time.Millisecond)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.xst, c.ok
}

// Queues returns each receive queue's statistics as last published (a
// copy; nil unless the port is an afxdp.Multi). XDPStats refreshes them.
func (c *CountingPort) Queues() []proto.QueueStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.multi == nil {
		return nil
	}
	return append([]proto.QueueStats(nil), c.queues...)
}

// Counters is a snapshot of the daemon's counters: the device's, indexed
// as proto.DeviceCounters, every QP's, and each receive queue's.
type Counters struct {
	Name   string
	Valid  uint64 // bit i: Device[i] is counted
	Device [proto.NumDeviceCounters]uint64
	QPs    []proto.QPStats
	Queues []proto.QueueStats
	HasCM  bool // CM holds the rdma_cm agent's counters
	CM     [proto.NumCMCounters]uint64
	// Daemon are the daemon's own counters (proto.DaemonCounters), and
	// Usage what its clients hold against its limits; both only with
	// HaveDaemon.
	Daemon     [proto.NumDaemonCounters]uint64
	Usage      Usage
	HaveDaemon bool
}

// CounterSource takes snapshots of a running daemon's counters from any
// goroutine.
type CounterSource struct {
	Name string
	Loop *engine.Loop  // device counters as of the loop's last iteration
	Port *CountingPort // bytes and AF_XDP statistics; nil: not counted
	// CM, if set, is the rdma_cm counters (Server.CMCounters).
	CM func() ([proto.NumCMCounters]uint64, bool)
	// Server, if set, is the daemon serving the device: its own counters
	// and its clients' usage join the snapshot, and events its clients'
	// queues dropped count in async_events_lost with the device's own.
	// Set it before the first Snapshot.
	Server *Server
}

// Snapshot reads every counter once.
func (s *CounterSource) Snapshot() Counters {
	c := Counters{Name: s.Name}
	var in counterInputs
	in.dev = s.Loop.DeviceStats()
	in.loop = s.Loop.Counters()
	if s.Port != nil {
		in.rxBytes, in.txBytes = s.Port.Bytes()
		in.haveBytes = true
		in.xdp, in.haveXDP = s.Port.XDPStats()
		c.Queues = s.Port.Queues()
	}
	dev := s.Loop.Device()
	// Device totals are over every QP there ever was: the live ones and
	// those destroyed, whose counts the device keeps.
	retired := dev.QPCounterTotals(func(q *rnic.QPCounters) {
		c.QPs = append(c.QPs, qpStats(q))
		in.add(q)
	})
	in.add(&rnic.QPCounters{RC: retired.RC, UD: retired.UD, CQE: retired.CQE})
	in.eventsLost = s.Loop.Device().LostEvents()
	if s.Server != nil {
		in.eventsLost += s.Server.AsyncEventsLost.Load()
	}
	c.Valid = fillDevice(&c.Device, &in)
	if s.CM != nil {
		c.CM, c.HasCM = s.CM()
	}
	if s.Server != nil {
		c.Daemon, c.Usage, c.HaveDaemon = s.Server.counters(), s.Server.Usage(), true
	}
	return c
}

// counters reads the daemon's own counters (proto.DaemonCounters).
func (s *Server) counters() [proto.NumDaemonCounters]uint64 {
	var d [proto.NumDaemonCounters]uint64
	d[proto.DCtrRejectedConnections] = s.RejectedConn.Load()
	d[proto.DCtrAcceptErrors] = s.AcceptErrors.Load()
	d[proto.DCtrShedConnections] = s.ShedConns.Load()
	d[proto.DCtrLimitRefusals] = s.acct.total.Load()
	d[proto.DCtrBadWQEs] = s.BadWQEs.Load()
	d[proto.DCtrCQRingDropped] = s.cqRingDropped()
	d[proto.DCtrControlledQKeyRefused] = s.QKeyRefused.Load()
	d[proto.DCtrCQOverruns] = s.dev.CQOverruns()
	return d
}

// counterInputs is everything the device counters are made of.
type counterInputs struct {
	dev                rnic.Stats
	loop               engine.Counters
	rxBytes, txBytes   uint64
	haveBytes, haveXDP bool
	xdp                afxdp.Stats
	eventsLost         uint64
	// sums over the QPs
	dup, oos, rnrRx, timeouts, outOfBuf, qpDropped, badQKey, naks, retrans uint64
	seqNAKs, impliedNAKs, writes, reads, atomics                           uint64
	reqRemAccess, reqInvReq, respRemAccess, respLocLen                     uint64
	cqe                                                                    rnic.CQECounters
	rc                                                                     rc.Counters // every counter, summed
}

func (in *counterInputs) add(q *rnic.QPCounters) {
	in.dup += q.RC.RxDuplicate
	in.oos += q.RC.RxOutOfSeq
	in.rnrRx += q.RC.RNRWaits
	in.timeouts += q.RC.Timeouts
	in.outOfBuf += q.RC.TxRNRNAKs + q.UD.RxNoRecv
	in.qpDropped += q.RC.RxDropped + q.UD.RxDropped
	in.badQKey += q.UD.RxBadQKey
	in.naks += q.RC.TxNAKs
	in.retrans += q.RC.Retransmits
	in.seqNAKs += q.RC.RxNAKSeqErr
	in.impliedNAKs += q.RC.ImpliedNAKs
	in.writes += q.RC.RxWriteReqs
	in.reads += q.RC.RxReadReqs
	in.atomics += q.RC.RxAtomicReqs
	in.reqRemAccess += q.RC.RxNAKRemAccess
	in.reqInvReq += q.RC.RxNAKInvReq
	in.respRemAccess += q.RC.RemAccessErrs
	in.respLocLen += q.RC.LocalLengthErrs
	in.cqe.ReqErr += q.CQE.ReqErr
	in.cqe.ReqFlushErr += q.CQE.ReqFlushErr
	in.cqe.RespErr += q.CQE.RespErr
	in.cqe.RespFlushErr += q.CQE.RespFlushErr
	in.rc.Add(&q.RC)
}

// fillDevice is the one table from what softrnic counts to the names Linux
// RDMA tools use (proto.DeviceCounters). It returns the valid mask. The
// per-QP sums are over every QP, destroyed ones included: a device
// counter never goes down.
func fillDevice(d *[proto.NumDeviceCounters]uint64, in *counterInputs) uint64 {
	s := &in.dev
	cc := s.Counters()
	d[proto.CtrRxPackets] = s.RxFrames
	d[proto.CtrTxPackets] = s.TxFrames
	d[proto.CtrRxBytes] = in.rxBytes
	d[proto.CtrTxBytes] = in.txBytes
	d[proto.CtrDuplicateRequest] = in.dup
	d[proto.CtrOutOfSequence] = in.oos
	d[proto.CtrRnrNakRetryErr] = in.rnrRx
	d[proto.CtrLocalAckTimeoutErr] = in.timeouts
	d[proto.CtrOutOfBuffer] = in.outOfBuf
	d[proto.CtrRxICRCEncapsulated] = s.RxBadICRC
	d[proto.CtrNpECNMarkedRoCEPackets] = cc[0].Value
	d[proto.CtrNpCNPSent] = cc[1].Value
	d[proto.CtrRpCNPHandled] = cc[2].Value
	d[proto.CtrRpCNPIgnored] = cc[3].Value
	d[proto.CtrRxMalformed] = s.RxParseErr
	d[proto.CtrRxNotLocal] = s.RxNotLocal
	d[proto.CtrRxBadHeader] = s.RxBadHeader
	d[proto.CtrRxUnknownQP] = s.RxNoQP
	d[proto.CtrRxBadOpcode] = s.RxBadType
	d[proto.CtrRxBadSource] = s.RxBadSrc
	d[proto.CtrRxBadQPState] = s.RxBadState
	d[proto.CtrRxQPDropped] = in.qpDropped
	d[proto.CtrRxBadQKey] = in.badQKey
	d[proto.CtrNakSent] = in.naks
	d[proto.CtrRetransmits] = in.retrans
	d[proto.CtrTxBackpressure] = in.loop.TxBackPress
	x := &in.xdp
	d[proto.CtrXDPSteered] = x.Program.Steered
	d[proto.CtrXDPPassed] = x.Program.Passed
	d[proto.CtrXDPMalformed] = x.Program.Malformed
	d[proto.CtrXDPUnbound] = x.Program.Unbound
	d[proto.CtrXDPForeign] = x.Program.Foreign
	d[proto.CtrXskRxDropped] = x.Socket.RxDropped
	d[proto.CtrXskRxInvalidDescs] = x.Socket.RxInvalidDescs
	d[proto.CtrXskTxInvalidDescs] = x.Socket.TxInvalidDescs
	d[proto.CtrXskRxRingFull] = x.Socket.RxRingFull
	d[proto.CtrXskRxFillRingEmpty] = x.Socket.RxFillRingEmpty
	d[proto.CtrXskTxRingEmptyDescs] = x.Socket.TxRingEmptyDescs
	d[proto.CtrXskRxOversize] = x.Oversize
	d[proto.CtrPacketSeqErr] = in.seqNAKs
	d[proto.CtrImpliedNakSeqErr] = in.impliedNAKs
	d[proto.CtrRxWriteRequests] = in.writes
	d[proto.CtrRxReadRequests] = in.reads
	d[proto.CtrRxAtomicRequests] = in.atomics
	d[proto.CtrReqCQEError] = in.cqe.ReqErr
	d[proto.CtrReqCQEFlushError] = in.cqe.ReqFlushErr
	d[proto.CtrRespCQEError] = in.cqe.RespErr
	d[proto.CtrRespCQEFlushError] = in.cqe.RespFlushErr
	d[proto.CtrReqRemoteAccessErrors] = in.reqRemAccess
	d[proto.CtrReqRemoteInvalidRequest] = in.reqInvReq
	d[proto.CtrRespRemoteAccessErrors] = in.respRemAccess
	d[proto.CtrRespLocalLengthError] = in.respLocLen
	d[proto.CtrCCRTTSamples] = cc[4].Value
	d[proto.CtrCCDecreases] = cc[5].Value
	d[proto.CtrCCLossEvents] = cc[6].Value
	d[proto.CtrCCWindowFull] = cc[7].Value
	d[proto.CtrRoCEAdpRetrans] = in.rc.AdpRetrans
	d[proto.CtrRoCEAdpRetransTO] = in.rc.AdpRetransTO
	d[proto.CtrRxSACKs] = in.rc.RxSACKs
	d[proto.CtrTxSACKs] = in.rc.TxSACKs
	d[proto.CtrSelRetrans] = in.rc.SelRetrans
	d[proto.CtrSRHeld] = in.rc.SRHeld
	d[proto.CtrSRDropped] = in.rc.SRDropped
	d[proto.CtrRetransPackets] = in.rc.RetransPkts
	d[proto.CtrAsyncEventsLost] = in.eventsLost
	valid := proto.ValidAll
	if !in.haveXDP {
		valid &^= proto.ValidXDP
	}
	if !in.haveBytes {
		valid &^= 1<<proto.CtrRxBytes | 1<<proto.CtrTxBytes
	}
	return valid
}

// dcqcnValid are the per-QP DCQCN counters, valid on a QP that runs it.
const dcqcnValid = 1<<proto.QCtrDCQCNECNMarked | 1<<proto.QCtrDCQCNCNPSent | 1<<proto.QCtrDCQCNCNPHandled |
	1<<proto.QCtrDCQCNCNPIgnored | 1<<proto.QCtrDCQCNRateCuts | 1<<proto.QCtrNpHostCCMarks

// qpStats maps one QP's transport counters to proto.QPCounters: RC and UC
// QPs count the RC set, UD and GSI QPs the UD set.
func qpStats(q *rnic.QPCounters) proto.QPStats {
	s := proto.QPStats{QPN: q.QPN, State: ib.QPState(q.State)}
	v := &s.Values
	// Error completions: every QP type, counted by verbs.
	v[proto.QCtrReqCQEError] = q.CQE.ReqErr
	v[proto.QCtrReqCQEFlushError] = q.CQE.ReqFlushErr
	v[proto.QCtrRespCQEError] = q.CQE.RespErr
	v[proto.QCtrRespCQEFlushError] = q.CQE.RespFlushErr
	const cqeValid = 1<<proto.QCtrReqCQEError | 1<<proto.QCtrReqCQEFlushError | 1<<proto.QCtrRespCQEError | 1<<proto.QCtrRespCQEFlushError
	switch q.Type {
	case ib.UD, ib.GSI:
		s.Type = ib.UD
		v[proto.QCtrRxPackets] = q.UD.RxReceived
		v[proto.QCtrOutOfBuffer] = q.UD.RxNoRecv
		v[proto.QCtrRxQPDropped] = q.UD.RxDropped
		v[proto.QCtrRxBadQKey] = q.UD.RxBadQKey
		s.Valid = 1<<proto.QCtrRxPackets | 1<<proto.QCtrOutOfBuffer | 1<<proto.QCtrRxQPDropped | 1<<proto.QCtrRxBadQKey | cqeValid
	default:
		s.Type = ib.RC
		if q.Type == ib.UC {
			s.Type = ib.UC
		}
		v[proto.QCtrDuplicateRequest] = q.RC.RxDuplicate
		v[proto.QCtrOutOfSequence] = q.RC.RxOutOfSeq
		v[proto.QCtrRnrNakRetryErr] = q.RC.RNRWaits
		v[proto.QCtrLocalAckTimeoutErr] = q.RC.Timeouts
		v[proto.QCtrOutOfBuffer] = q.RC.TxRNRNAKs
		v[proto.QCtrRxQPDropped] = q.RC.RxDropped
		v[proto.QCtrNakSent] = q.RC.TxNAKs
		v[proto.QCtrRetransmits] = q.RC.Retransmits
		v[proto.QCtrRxGhostResponse] = q.RC.GhostResponse
		v[proto.QCtrPacketSeqErr] = q.RC.RxNAKSeqErr
		v[proto.QCtrImpliedNakSeqErr] = q.RC.ImpliedNAKs
		v[proto.QCtrRxWriteRequests] = q.RC.RxWriteReqs
		v[proto.QCtrRxReadRequests] = q.RC.RxReadReqs
		v[proto.QCtrRxAtomicRequests] = q.RC.RxAtomicReqs
		v[proto.QCtrReqRemoteAccessErrors] = q.RC.RxNAKRemAccess
		v[proto.QCtrReqRemoteInvalidRequest] = q.RC.RxNAKInvReq
		v[proto.QCtrRespRemoteAccessErrors] = q.RC.RemAccessErrs
		v[proto.QCtrRespLocalLengthError] = q.RC.LocalLengthErrs
		recoveryStats(v, &q.RC)
		s.Valid = uint64(1)<<proto.QCtrDCQCNECNMarked - 1
		s.Valid &^= 1<<proto.QCtrRxPackets | 1<<proto.QCtrRxBadQKey
		s.Valid |= recoveryValid
		if q.CCOn {
			ccStats(&s, &q.CC)
			if q.CC.Algorithm == "dcqcn" {
				v[proto.QCtrNpHostCCMarks] = q.HostCCMarks
			}
		}
	}
	return s
}

// ccStats fills a QP's congestion-control counters and figures: every
// algorithm's, the window's when it has one, DCQCN's or Swift's own.
func ccStats(s *proto.QPStats, cc *congestion.State) {
	v := &s.Values
	v[proto.QCtrCCRTTSamples] = cc.RTTSamples
	v[proto.QCtrCCDecreases] = cc.Decreases
	v[proto.QCtrCCLossEvents] = cc.LossEvents
	v[proto.QCtrCCRateKbps] = uint64(max(float64(cc.Rate)/1e3, 0))
	v[proto.QCtrCCSRTTNs] = uint64(max(cc.SRTT, 0))
	s.Valid |= 1<<proto.QCtrCCRTTSamples | 1<<proto.QCtrCCDecreases | 1<<proto.QCtrCCLossEvents |
		1<<proto.QCtrCCRateKbps | 1<<proto.QCtrCCSRTTNs
	if cc.Window != congestion.NoWindow {
		v[proto.QCtrCCWindowFull] = cc.WindowFull
		v[proto.QCtrCCWindowBytes] = uint64(max(cc.Window, 0))
		s.Valid |= 1<<proto.QCtrCCWindowFull | 1<<proto.QCtrCCWindowBytes
	}
	switch cc.Algorithm {
	case "dcqcn":
		v[proto.QCtrDCQCNECNMarked] = cc.ECNMarked
		v[proto.QCtrDCQCNCNPSent] = cc.CNPSent
		v[proto.QCtrDCQCNCNPHandled] = cc.CNPHandled
		v[proto.QCtrDCQCNCNPIgnored] = cc.CNPIgnored
		v[proto.QCtrDCQCNRateCuts] = cc.Cuts
		s.Valid |= dcqcnValid
	case "swift":
		v[proto.QCtrCCCwndMilli] = uint64(max(cc.Cwnd*1000, 0))
		v[proto.QCtrCCTargetNs] = uint64(max(cc.Target, 0))
		s.Valid |= 1<<proto.QCtrCCCwndMilli | 1<<proto.QCtrCCTargetNs
	}
}

// recoveryValid are the per-QP loss recovery counters, valid on RC QPs.
const recoveryValid = 1<<proto.QCtrRoCEAdpRetrans | 1<<proto.QCtrRoCEAdpRetransTO | 1<<proto.QCtrTLPProbes |
	1<<proto.QCtrFastRetrans | 1<<proto.QCtrRxSACKs | 1<<proto.QCtrTxSACKs | 1<<proto.QCtrSelRetrans |
	1<<proto.QCtrSRHeld | 1<<proto.QCtrSRDropped | 1<<proto.QCtrRetransPackets | 1<<proto.QCtrLocalAckTimeoutExcused

// recoveryStats fills a QP's loss recovery counters from c.
func recoveryStats(v *[proto.NumQPCounters]uint64, c *rc.Counters) {
	v[proto.QCtrRoCEAdpRetrans] = c.AdpRetrans
	v[proto.QCtrRoCEAdpRetransTO] = c.AdpRetransTO
	v[proto.QCtrLocalAckTimeoutExcused] = c.TimeoutsExcused
	v[proto.QCtrTLPProbes] = c.TLPProbes
	v[proto.QCtrFastRetrans] = c.FastRetrans
	v[proto.QCtrRxSACKs] = c.RxSACKs
	v[proto.QCtrTxSACKs] = c.TxSACKs
	v[proto.QCtrSelRetrans] = c.SelRetrans
	v[proto.QCtrSRHeld] = c.SRHeld
	v[proto.QCtrSRDropped] = c.SRDropped
	v[proto.QCtrRetransPackets] = c.RetransPkts
}

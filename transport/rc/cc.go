package rc

import (
	"time"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/congestion"
	"github.com/softrnic/softrnic/congestion/dcqcn"
	"github.com/softrnic/softrnic/congestion/swift"
	"github.com/softrnic/softrnic/congestion/timely"
)

// Congestion control of a connected QP. The QP owns its algorithm, its
// pacer and the reaction to what it sees, as quic-go's sent-packet handler
// owns its SendAlgorithm. A QP made with a CCConfig runs, from RTR on:
//
//   - a controller (congestion.Controller): DCQCN's reaction point, fed by
//     the CNPs addressed to the QP; or Swift or TIMELY, fed by the ACKs:
//     the wire bytes of the PSNs each one newly acknowledges and the RTT
//     sample it gives, taken from the requester's per-PSN send records with
//     Karn's rule, the very samples adaptive retransmission times itself
//     with (rtt.go); retransmission events reach it as loss
//     (congestion.LossReactor);
//   - with DCQCN, a notification point (dcqcn.NP) over the packets it
//     receives: a CE-marked packet may make the QP owe its peer a CNP,
//     which BuildHeader emits ahead of the QP's own traffic, unpaced;
//   - a pacer (congestion.Pacer) that holds everything the QP sends to the
//     controller's rate. A QP the pacer holds back reports no output and a
//     deadline at its departure time, so a slow QP costs its driver one
//     visit per packet, never a spin;
//   - for a window algorithm (Swift), the window beside the pacer: a new
//     request packet goes only while the PSNs in flight, counted in full
//     packets, are below the window (a packet may overshoot it, as in
//     TCP); and AckReq often enough that the window reopens within a
//     fraction of it.
//
// The device puts a DCQCN QP's frames in ECT(0) and its CNPs behind the CNP
// DSCP; all of this runs under the calls the device already serialises, and
// allocates nothing per packet. Without a CCConfig none of it exists.
//
// What Swift's delay split can use: RoCE's ACK carries no timestamp, so the
// peer's share of the RTT (its receive queueing and ACK turnaround) cannot
// be told from the fabric's and counts as fabric delay. This host's share
// is what the engine measures: how long it was away from the port before
// the poll that returned the ACK (transport.Meta.RxAway); the ACK arrived
// somewhere in that time, and half of it (the expectation for an arrival
// uniform in it) is the host delay handed to the controller. The hop count
// is configured (CCConfig.Hops): RoCE's ACK does not echo the data
// packet's TTL.

// CCAlgorithm is a connected QP's congestion-control algorithm.
type CCAlgorithm uint8

const (
	DCQCN  CCAlgorithm = iota // CNP-driven rate control (the zero value)
	Swift                     // delay-target window
	TIMELY                    // RTT-gradient rate control
)

var ccNames = [...]string{"dcqcn", "swift", "timely"}

func (a CCAlgorithm) String() string {
	if int(a) < len(ccNames) {
		return ccNames[a]
	}
	return "unknown"
}

// CCConfig is the congestion-control setting a QP starts with at RTR.
type CCConfig struct {
	// Algorithm picks the controller; its configuration is the field of
	// the same name (RP and NP for DCQCN).
	Algorithm CCAlgorithm
	RP        dcqcn.Config
	NP        dcqcn.NPConfig
	// Swift's MSS is replaced by the QP's full packet: its path MTU plus
	// the transport headers and PacketOverhead.
	Swift  swift.Config
	TIMELY timely.Config
	// Hops is the switches between the QP and its peer (Swift's
	// topology scaling).
	Hops int
	// PacketOverhead is the wire bytes around a transport packet
	// (Ethernet, IP, UDP, ICRC) that the window's packets count.
	PacketOverhead int
	// PacerBurst is how many bytes the QP may send back to back after an
	// idle period on top of one packet (congestion.Pacer.Burst).
	PacerBurst int
}

// CCCounters are the congestion-control counters the QPs of a device
// share. The DCQCN ones are named (in the device's counters) as the mlx5
// hw_counters that count the same events; the others are every
// algorithm's (congestion.Counters).
type CCCounters struct {
	// NPECNMarkedRoCEPackets (np_ecn_marked_roce_packets): CE-marked
	// packets received on QPs running DCQCN.
	NPECNMarkedRoCEPackets uint64
	// NPCNPSent (np_cnp_sent): CNPs built.
	NPCNPSent uint64
	// RPCNPHandled (rp_cnp_handled): CNPs that a QP's reaction point took
	// (a cut, or a cut scheduled for the next monitor period).
	RPCNPHandled uint64
	// RPCNPIgnored (rp_cnp_ignored): CNPs received and not acted upon:
	// coalesced into a pending cut, or for a QP without DCQCN.
	RPCNPIgnored uint64
	// RxCEAck counts CE-marked acknowledgements received on QPs running
	// DCQCN: the NP does not answer them (see npPacket), and they are not
	// in np_ecn_marked_roce_packets.
	RxCEAck uint64
	// Every algorithm's: cc_rtt_samples, cc_decreases, cc_loss_events,
	// cc_window_full.
	congestion.Counters
}

// ECN codepoints of the IP header's two low TOS / traffic-class bits.
const ecnCE = 0b11

// cnpLen is the transport part of a CNP: BTH and 16 reserved bytes.
const cnpLen = bth.BTHLen + bth.CNPReservedLen

// qpCC is one QP's congestion-control state. Every controller is a field,
// so that starting one allocates nothing.
type qpCC struct {
	algo    CCAlgorithm
	rp      dcqcn.RP
	np      dcqcn.NP
	sw      swift.CC
	tm      timely.CC
	ctl     congestion.Controller
	loss    congestion.LossReactor // nil: the controller ignores loss
	pacer   congestion.Pacer
	paceAt  clock.Time // parked by the pacer until then; Never when not parked
	cnps    int        // CNPs owed to the peer, sent ahead of the QP's traffic
	lastCNP bool       // the packet BuildHeader built last was a CNP (not paced)

	// ACK-clocked algorithms (Swift, TIMELY).
	acked    bool    // the controller takes ACKs (and needs send records)
	windowed bool    // the controller's window gates new requests
	mss      int     // wire bytes of a full packet: one PSN in the window
	synced   bool    // una and samples follow the requester
	una      bth.PSN // the requester's compPSN as the controller last heard
	samples  uint64  // the RTT estimator's sample count as last seen
	ackEvery int     // packets per AckReq (0: the requester's default)
	held     bool    // the window held the last send back
	lossSeen lossMarks
	lastRTT  time.Duration
	hostDly  time.Duration
	ctr      congestion.Counters // this QP's
}

// lossMarks are the requester's counters that say a retransmission
// happened: timeouts (the local ACK timer, the adaptive RTO) and the rest
// (sequence NAKs, READ response gaps, fast and selective retransmission).
type lossMarks struct{ timeouts, other uint64 }

func (q *QP) lossMarks() lossMarks {
	return lossMarks{timeouts: q.Timeouts + q.AdpRetransTO,
		other: q.RxNAKSeqErr + q.ImpliedNAKs + q.FastRetrans + q.SelRetrans}
}

// ccStart sets up congestion control as the QP enters RTR.
func (q *QP) ccStart() {
	cfg := q.ccCfg
	if cfg == nil {
		q.cc = nil
		return
	}
	if q.cc == nil {
		q.cc = new(qpCC)
	}
	cc := q.cc
	*cc = qpCC{algo: cfg.Algorithm, paceAt: clock.Never}
	// The configurations were validated by whoever made them.
	switch cfg.Algorithm {
	case Swift:
		sc := cfg.Swift
		sc.MSS = bth.BTHLen + q.cfg.MTU + cfg.PacketOverhead
		cc.mss = sc.MSS
		_ = cc.sw.Init(sc)
		cc.ctl, cc.loss = &cc.sw, &cc.sw
		cc.acked, cc.windowed = true, !q.cfg.UC
	case TIMELY:
		_ = cc.tm.Init(cfg.TIMELY)
		cc.ctl = &cc.tm
		cc.mss = bth.BTHLen + q.cfg.MTU + cfg.PacketOverhead
		cc.acked = true
		// One RTT sample per segment the paper's NIC completes.
		if cfg.TIMELY.Segment > 0 {
			cc.ackEvery = int(max(1, min(MaxPktPerAck, cfg.TIMELY.Segment/int64(q.cfg.MTU))))
		}
	default:
		_ = cc.rp.Init(cfg.RP)
		cc.ctl = &cc.rp
		cc.np.Init(cfg.NP)
	}
	cc.pacer.Burst = cfg.PacerBurst
	cc.retuneAcks()
}

// records reports whether the requester keeps per-PSN send records and
// RTT samples: for adaptive retransmission, or for a controller that
// takes them.
func (q *QP) records() bool {
	return q.adaptive() || q.cc != nil && q.cc.acked && !q.cfg.UC
}

// sync starts following the requester (its PSNs exist from RTS on).
func (cc *qpCC) sync(r *requester) {
	if !cc.synced {
		cc.synced = true
		cc.una, cc.samples = r.compPSN, r.rtt.samples
	}
}

// retuneAcks sets how often the QP asks for an ACK: a window algorithm
// every quarter window (every packet below four), so that the window
// reopens within a fraction of itself and the controller sees an RTT
// sample at least four times per round trip.
func (cc *qpCC) retuneAcks() {
	if !cc.windowed {
		return
	}
	w := cc.ctl.Window() / int64(cc.mss) / 4
	cc.ackEvery = int(max(1, min(w, MaxPktPerAck)))
}

// ackSpacing is the requester's AckReq spacing (see ackEvery: the count
// after which AckReq is set), tightened to the controller's ackEvery
// packets per AckReq.
func (q *QP) ackSpacing() int {
	n := q.req.ackEvery(q)
	if cc := q.cc; cc != nil && cc.ackEvery > 0 {
		n = min(n, cc.ackEvery-2)
	}
	return n
}

// ccWindowOpen reports whether the window lets a new request packet go.
func (q *QP) ccWindowOpen() bool {
	cc := q.cc
	if cc == nil || !cc.windowed {
		return true
	}
	r := &q.req
	cc.sync(r)
	if int64(r.psn.Diff(r.compPSN))*int64(cc.mss) < cc.ctl.Window() {
		cc.held = false
		return true
	}
	if !cc.held {
		cc.held = true
		cc.ctr.WindowFull++
		q.ccCtr.WindowFull++
	}
	return false
}

// mayBuild asks the pacer whether the QP may send a packet at now; if not
// it parks the QP until its departure time. The pacer's time for the next
// packet does not depend on that packet's size (Burst is in bytes, the
// cost is charged in Sent), so asking before the packet is built is exact.
func (cc *qpCC) mayBuild(now clock.Time) bool {
	if cc.paceAt != clock.Never {
		if cc.paceAt > now {
			return false
		}
		cc.paceAt = clock.Never
	}
	if at := cc.pacer.Next(now, cc.ctl.Rate(), 0); at > now {
		cc.paceAt = at
		return false
	}
	return true
}

// Sent implements transport.Transport: the pacer and the controller's byte
// counter are charged the frame's wire bytes. CNPs are not paced. A
// selective retransmission is a loss event the moment it leaves.
func (q *QP) Sent(now clock.Time, wire int) {
	cc := q.cc
	if cc == nil || cc.lastCNP {
		return
	}
	cc.pacer.Sent(now, cc.ctl.Rate(), wire)
	cc.ctl.OnPacketSent(now, wire)
	q.ccLoss(now)
}

// ccEvent runs one controller event and counts a decrease of its rate or
// window.
func (q *QP) ccEvent(ev func(cc *qpCC)) {
	cc := q.cc
	r0, w0 := cc.ctl.Rate(), cc.ctl.Window()
	ev(cc)
	if cc.ctl.Rate() < r0 || cc.ctl.Window() < w0 {
		cc.ctr.Decreases++
		q.ccCtr.Decreases++
	}
	cc.retuneAcks()
}

// ccLoss reports to the controller, once per call, the retransmission
// events the requester counted since the last look: a timeout if any of
// them was one.
func (q *QP) ccLoss(now clock.Time) {
	cc := q.cc
	m := q.lossMarks()
	if m == cc.lossSeen {
		return
	}
	timeout := m.timeouts != cc.lossSeen.timeouts
	cc.lossSeen = m
	cc.ctr.LossEvents++
	q.ccCtr.LossEvents++
	if cc.loss != nil {
		q.ccEvent(func(cc *qpCC) { cc.loss.OnRetransmit(now, timeout) })
	}
}

// ccResponse hands the controller what a response told: the PSNs it
// newly acknowledged and the RTT sample it gave, and any retransmission it
// caused. away is how long the engine was away from the port before the
// poll that returned it (transport.Meta.RxAway).
func (q *QP) ccResponse(now clock.Time, away time.Duration) {
	cc := q.cc
	if cc == nil {
		return
	}
	q.ccLoss(now)
	if !cc.acked || q.cfg.UC {
		return
	}
	r := &q.req
	cc.sync(r)
	n := r.compPSN.Diff(cc.una)
	sampled := r.rtt.samples != cc.samples
	if n <= 0 && !sampled {
		return
	}
	ack := congestion.Ack{Hops: q.ccCfg.Hops}
	if n > 0 {
		cc.una = r.compPSN
		ack.Bytes = int(n) * cc.mss
	}
	if sampled {
		cc.samples = r.rtt.samples
		ack.RTT = r.rtt.last
		ack.HostDelay = min(max(away, 0)/2, ack.RTT)
		cc.lastRTT, cc.hostDly = ack.RTT, ack.HostDelay
		cc.ctr.RTTSamples++
		q.ccCtr.RTTSamples++
	}
	q.ccEvent(func(cc *qpCC) { cc.ctl.OnAck(now, ack) })
}

// ccExpire runs the requester's timers, then the controller's and the
// NP's, and ends a pacer wait.
//
// A QP whose pacer or window holds its next packet back may have nothing
// unacknowledged on the wire for longer than its local ACK timeout (a
// Swift window below one packet sends one per RTT/cwnd): that is not a
// lost packet, and the local ACK timer and the adaptive RTO do not run
// then (they would spend the retry budget on nothing and end the QP with
// RETRY_EXC_ERR). The next packet sent arms them again.
func (q *QP) ccExpire(now clock.Time) {
	cc := q.cc
	if r := &q.req; q.reqOn && !q.cfg.UC {
		if cc != nil && r.psn == r.compPSN && !r.rnrWait {
			r.timer, r.rtoAt = clock.Never, clock.Never
		}
		q.expire(now)
	}
	if cc == nil {
		return
	}
	q.ccLoss(now)
	if cc.ctl.Deadline() <= now {
		q.ccEvent(func(cc *qpCC) { cc.ctl.OnTimer(now) })
	}
	if cc.algo == DCQCN && cc.np.OnTimer(now) {
		cc.cnps++
	}
	if cc.paceAt <= now {
		cc.paceAt = clock.Never
	}
}

// ccDeadline is when congestion control needs Expire: the controller's and
// the NP's timers, the end of a pacer wait (out: the QP has a packet).
func (cc *qpCC) deadline(out bool) clock.Time {
	paceAt := cc.paceAt
	if !out {
		paceAt = clock.Never // see HasOutput
	}
	dl := min(cc.ctl.Deadline(), paceAt)
	if cc.algo == DCQCN {
		dl = min(dl, cc.np.Deadline())
	}
	return dl
}

// buildCNP writes one CNP owed to the peer into buf. Layout as ConnectX:
// opcode 0x81, P_Key 0xFFFF, BECN, DestQP the peer's QP, AckReq 0, PSN 0,
// 16 zero bytes.
func (q *QP) buildCNP(buf []byte) int {
	t := buf[:cnpLen]
	clear(t)
	b := bth.BTH(t[:bth.BTHLen])
	b.SetOpcode(bth.CNP)
	b.SetPKey(bth.DefaultPKey)
	b.SetBECN(true)
	b.SetDestQP(q.cfg.DestQPN)
	q.cc.cnps--
	q.cc.lastCNP = true
	q.ccCtr.NPCNPSent++
	return cnpLen
}

// receiveCNP hands a CNP (checked by the device for address, header, ICRC,
// state and source) to DCQCN's reaction point. A CNP is not a transport
// packet: it never reaches the PSN logic and is never answered. Swift and
// TIMELY do not react to CNPs: theirs are counted as ignored.
func (q *QP) receiveCNP(now clock.Time) {
	cc := q.cc
	if cc == nil || cc.algo != DCQCN {
		q.ccCtr.RPCNPIgnored++
		return
	}
	before := cc.rp.RPCounters
	q.ccEvent(func(cc *qpCC) { cc.ctl.OnCNP(now) })
	q.ccCtr.RPCNPHandled += cc.rp.RPCNPHandled - before.RPCNPHandled
	q.ccCtr.RPCNPIgnored += cc.rp.RPCNPIgnored - before.RPCNPIgnored
}

// npPacket runs the notification point on a received packet of op (DCQCN
// only: the QPs of delay-based algorithms neither mark their packets ECN
// capable nor answer marks).
//
// Which packets the NP answers: a CE mark says the path the packet took is
// congested, and the CNP goes to the packet's sender to slow the traffic
// its reaction point paces. That is every request (SEND, WRITE, READ
// request, ATOMIC) and every READ response — the responder paces those —
// but not an acknowledgement (RC ACK/NAK, ATOMIC ACKNOWLEDGE): an ACK is
// the answer to our own data, not traffic its sender's RP controls, and a
// CNP for it would cut the rate of our peer's requests (on a one-way
// stream: a peer that sends nothing) for congestion on a path our own data
// does not slow. HPCC's ns-3 and ns3-rdma alike run the NP on data packets
// only. CE-marked ACKs are counted (RxCEAck) and otherwise ignored.
func (q *QP) npPacket(now clock.Time, op bth.Opcode, ecn uint8) {
	if q.cc.algo != DCQCN {
		return
	}
	ce := ecn == ecnCE
	if !NPAnswers(op) {
		if ce {
			q.ccCtr.RxCEAck++
		}
		return
	}
	if ce {
		q.ccCtr.NPECNMarkedRoCEPackets++
	}
	if q.cc.np.OnPacket(now, ce) {
		q.cc.cnps++
	}
}

// NPAnswers reports whether DCQCN's notification point answers a CE mark
// on a connected QP's packet of op with a CNP: requests and READ
// responses, not acknowledgements (npPacket says why).
func NPAnswers(op bth.Opcode) bool {
	return op != bth.RCAcknowledge && op != bth.RCAtomicAcknowledge
}

// CongestionState returns the QP's congestion-control state, false if it
// runs none (no CCConfig, or not yet in RTR).
func (q *QP) CongestionState() (congestion.State, bool) {
	cc := q.cc
	if cc == nil {
		return congestion.State{}, false
	}
	r := &q.req
	s := congestion.State{Algorithm: cc.algo.String(), Rate: cc.ctl.Rate(), Window: cc.ctl.Window(),
		SRTT: r.rtt.srtt, MinRTT: r.rtt.minRTT, LastRTT: cc.lastRTT, HostDelay: cc.hostDly, Counters: cc.ctr}
	if cc.windowed && q.reqOn {
		s.InFlight = int64(r.psn.Diff(r.compPSN)) * int64(cc.mss)
	}
	switch cc.algo {
	case Swift:
		s.Cwnd, s.Target = cc.sw.Cwnd(), cc.sw.Target()
	case TIMELY:
		s.Gradient = cc.tm.Gradient()
	default:
		s.TargetRate, s.Alpha, s.Cuts = cc.rp.Target(), cc.rp.Alpha(), cc.rp.Cuts
		s.ECNMarked, s.CNPSent = cc.np.NPECNMarkedRoCEPackets, cc.np.NPCNPSent
		s.CNPHandled, s.CNPIgnored = cc.rp.RPCNPHandled, cc.rp.RPCNPIgnored
	}
	return s, true
}

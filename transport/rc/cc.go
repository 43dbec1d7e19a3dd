package rc

import (
	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/congestion"
	"github.com/softrnic/softrnic/congestion/dcqcn"
)

// Congestion control of a connected QP (DCQCN). A QP made with a CCConfig
// runs, from RTR on:
//
//   - a notification point (dcqcn.NP) over the packets it receives: a
//     CE-marked packet may make the QP owe its peer a CNP, which BuildHeader
//     emits ahead of the QP's own traffic, unpaced;
//   - a reaction point (dcqcn.RP, the QP's congestion.Controller) fed by
//     the CNPs addressed to it;
//   - a pacer (congestion.Pacer) that holds everything the QP sends to the
//     controller's rate. A QP the pacer holds back reports no output and a
//     deadline at its departure time, so a slow QP costs its driver one
//     visit per packet, never a spin.
//
// The device puts the QP's frames in ECT(0) and the CNPs behind the CNP
// DSCP; all of this runs under the calls the device already serialises, and
// allocates nothing per packet. Without a CCConfig none of it exists.

// CCConfig is the congestion-control setting a QP starts with at RTR.
type CCConfig struct {
	RP dcqcn.Config
	NP dcqcn.NPConfig
	// PacerBurst is how many bytes the QP may send back to back after an
	// idle period on top of one packet (congestion.Pacer.Burst).
	PacerBurst int
}

// CCCounters are the congestion-control counters the QPs of a device
// share, named (in the device's counters) as the mlx5 hw_counters that
// count the same events.
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
	// coalesced into a pending cut, or for a QP without congestion control.
	RPCNPIgnored uint64
	// RxCEAck counts CE-marked acknowledgements received on QPs running
	// DCQCN: the NP does not answer them (see npPacket), and they are not
	// in np_ecn_marked_roce_packets.
	RxCEAck uint64
}

// ECN codepoints of the IP header's two low TOS / traffic-class bits.
const ecnCE = 0b11

// cnpLen is the transport part of a CNP: BTH and 16 reserved bytes.
const cnpLen = bth.BTHLen + bth.CNPReservedLen

// qpCC is one QP's congestion-control state.
type qpCC struct {
	rp      dcqcn.RP
	ctl     congestion.Controller // the reaction point
	np      dcqcn.NP
	pacer   congestion.Pacer
	paceAt  clock.Time // parked by the pacer until then; Never when not parked
	cnps    int        // CNPs owed to the peer, sent ahead of the QP's traffic
	lastCNP bool       // the packet BuildHeader built last was a CNP (not paced)
}

// ccStart sets up congestion control as the QP enters RTR.
func (q *QP) ccStart() {
	if q.ccCfg == nil {
		q.cc = nil
		return
	}
	if q.cc == nil {
		q.cc = new(qpCC)
	}
	cc := q.cc
	*cc = qpCC{paceAt: clock.Never}
	_ = cc.rp.Init(q.ccCfg.RP) // validated by whoever made the config
	cc.ctl = &cc.rp
	cc.np.Init(q.ccCfg.NP)
	cc.pacer.Burst = q.ccCfg.PacerBurst
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
// counter are charged the frame's wire bytes. CNPs are not paced.
func (q *QP) Sent(now clock.Time, wire int) {
	cc := q.cc
	if cc == nil || cc.lastCNP {
		return
	}
	cc.pacer.Sent(now, cc.ctl.Rate(), wire)
	cc.ctl.OnPacketSent(now, wire)
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

// ccExpire runs the controller's and the NP's timers due at now, and ends
// a pacer wait.
func (cc *qpCC) expire(now clock.Time) {
	if cc.ctl.Deadline() <= now {
		cc.ctl.OnTimer(now)
	}
	if cc.np.OnTimer(now) {
		cc.cnps++
	}
	if cc.paceAt <= now {
		cc.paceAt = clock.Never
	}
}

// receiveCNP hands a CNP (checked by the device for address, header, ICRC,
// state and source) to the reaction point. A CNP is not a transport
// packet: it never reaches the PSN logic and is never answered.
func (q *QP) receiveCNP(now clock.Time) {
	cc := q.cc
	if cc == nil {
		q.ccCtr.RPCNPIgnored++
		return
	}
	before := cc.rp.RPCounters
	cc.ctl.OnCNP(now)
	q.ccCtr.RPCNPHandled += cc.rp.RPCNPHandled - before.RPCNPHandled
	q.ccCtr.RPCNPIgnored += cc.rp.RPCNPIgnored - before.RPCNPIgnored
}

// npPacket runs the notification point on a received packet of op.
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
	ce := ecn == ecnCE
	if op == bth.RCAcknowledge || op == bth.RCAtomicAcknowledge {
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

// CongestionState returns the QP's DCQCN state, false if the QP runs none
// (no CCConfig, or not yet in RTR).
func (q *QP) CongestionState() (dcqcn.State, bool) {
	cc := q.cc
	if cc == nil {
		return dcqcn.State{}, false
	}
	return dcqcn.State{Rate: cc.rp.Rate(), Target: cc.rp.Target(), Alpha: cc.rp.Alpha(),
		RPCounters: cc.rp.RPCounters, NPCounters: cc.np.NPCounters}, true
}

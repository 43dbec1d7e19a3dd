package verbs

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/congestion"
	"github.com/softrnic/softrnic/congestion/dcqcn"
	"github.com/softrnic/softrnic/frame"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/icrc"
)

// DCQCN in the device (issue 7, live part). With a congestion-control
// profile set in Config.Congestion, every RC and UC QP runs, from RTR on:
//
//   - a notification point (dcqcn.NP) over the packets it receives: a
//     CE-marked packet may make the QP owe its peer a CNP, which Transmit
//     sends ahead of the QP's own traffic, unpaced;
//   - a reaction point (dcqcn.RP) fed by the CNPs addressed to it;
//   - a pacer (congestion.Pacer) that holds everything the QP sends to the
//     RP's rate. A QP the pacer holds back leaves the ready list and waits
//     on the timer list for its departure time, so a slow QP costs the
//     engine one visit per packet, never a spin.
//
// The QP's frames leave ECT(0) so that switches mark rather than drop them,
// and CNPs leave with the profile's CNP DSCP and ECT(0), as ConnectX sends
// them. With the profile off none of this exists (QP.cc is nil) and the
// device's bytes and behaviour are those it had before.
//
// Everything runs under the QP lock the step functions already hold: no
// extra lock, no allocation per packet.

// ECN codepoints of the IP header's two low TOS / traffic-class bits.
const (
	ecnECT0 = 0b10
	ecnCE   = 0b11
)

// Congestion is a device's congestion-control setting. The zero value is
// off. Build one with NewCongestion; RP and NP may then be edited field by
// field for experiments.
type Congestion struct {
	// Profile is "off" (or empty), "paper" or "connectx": which DCQCN
	// parameter set RP and NP hold. Any other value is refused by
	// NewDevice.
	Profile string
	// Scale is the time dilation RP and NP were built with (1: none); it
	// is recorded for the stats output, NewCongestion has applied it.
	Scale float64
	// RP and NP are the reaction and notification point parameters every
	// RC/UC QP starts with. NP.DSCP is the DSCP of the CNPs the device
	// sends (cnp_dscp); NP.Prio is not used (the port sends untagged).
	RP dcqcn.Config
	NP dcqcn.NPConfig
	// DataDSCP, if not 0, replaces the DSCP of the QPs' frames; 0 keeps
	// the DSCP of the address vector's TrafficClass (what perftest's
	// --tclass sets). Either way the ECN bits become ECT(0).
	DataDSCP uint8
	// PacerBurst is how many bytes a QP may send back to back after an
	// idle period on top of one packet (congestion.Pacer.Burst); 0 paces
	// every packet at the rate.
	PacerBurst int
}

// NewCongestion returns the setting of a profile: "off", "paper"
// (dcqcn.Paper, dcqcn.PaperNP) or "connectx" (the ConnectX knobs of cx, or
// their defaults if cx is nil), at lineRate (0: the profile's own, 40 Gb/s
// for paper and 100 Gb/s for connectx), dilated by scale (0 or 1: none;
// see dcqcn.Config.Dilate). The line rate is the undilated one, as the
// lab's plans give it.
func NewCongestion(profile string, lineRate congestion.Rate, scale float64, cx *dcqcn.ConnectX) (Congestion, error) {
	if scale == 0 {
		scale = 1
	}
	if !(scale >= 1) || math.IsInf(scale, 0) {
		return Congestion{}, fmt.Errorf("verbs: congestion scale %v, want >= 1", scale)
	}
	if lineRate < 0 {
		return Congestion{}, fmt.Errorf("verbs: negative line rate %v", lineRate)
	}
	c := Congestion{Profile: profile, Scale: scale}
	switch profile {
	case "", "off":
		return Congestion{Profile: "off"}, nil
	case "paper":
		if lineRate == 0 {
			lineRate = 40 * congestion.Gbps
		}
		c.RP, c.NP = dcqcn.Paper(lineRate), dcqcn.PaperNP()
	case "connectx":
		if lineRate == 0 {
			lineRate = 100 * congestion.Gbps
		}
		k := dcqcn.DefaultConnectX()
		if cx != nil {
			k = *cx
		}
		c.RP, c.NP = k.Config(lineRate), k.NPConfig()
	default:
		return Congestion{}, fmt.Errorf("verbs: unknown congestion profile %q (off, paper, connectx)", profile)
	}
	c.RP, c.NP = c.RP.Dilate(scale), c.NP.Dilate(scale)
	return c, c.validate()
}

// On reports whether DCQCN runs.
func (c *Congestion) On() bool { return c.Profile != "" && c.Profile != "off" }

func (c *Congestion) validate() error {
	if !c.On() {
		return nil
	}
	if c.Profile != "paper" && c.Profile != "connectx" {
		return fmt.Errorf("verbs: unknown congestion profile %q", c.Profile)
	}
	if err := c.RP.Validate(); err != nil {
		return err
	}
	if c.DataDSCP > 63 || c.NP.DSCP > 63 || c.PacerBurst < 0 || c.NP.MinInterval < 0 {
		return fmt.Errorf("verbs: DSCP above 63 or negative pacer burst or CNP interval")
	}
	return nil
}

// CongestionStats are the device's DCQCN counters, named (in Counters) as
// the mlx5 hw_counters that count the same events.
type CongestionStats struct {
	// NPECNMarkedRoCEPackets (np_ecn_marked_roce_packets): CE-marked
	// packets received on QPs running DCQCN.
	NPECNMarkedRoCEPackets uint64
	// NPCNPSent (np_cnp_sent): CNPs put on the wire.
	NPCNPSent uint64
	// RPCNPHandled (rp_cnp_handled): CNPs that a QP's reaction point took
	// (a cut, or a cut scheduled for the next monitor period).
	RPCNPHandled uint64
	// RPCNPIgnored (rp_cnp_ignored): CNPs received and not acted upon:
	// coalesced into a pending cut, or for a QP without DCQCN (profile
	// off, UD) or not in a state that sends.
	RPCNPIgnored uint64
	// RxCNP counts every CNP that passed the receive checks (no mlx5
	// equivalent: the sum of the two rp_ counters).
	RxCNP uint64
	// RxCEAck counts CE-marked acknowledgements received on QPs running
	// DCQCN: the NP does not answer them (see npPacket), and they are not
	// in np_ecn_marked_roce_packets.
	RxCEAck uint64
}

// Counter is one named counter.
type Counter struct {
	Name  string
	Value uint64
}

// Counters returns the DCQCN counters under their mlx5 names, in the order
// rdma statistic prints them.
func (s *CongestionStats) Counters() [4]Counter {
	return [4]Counter{
		{"np_ecn_marked_roce_packets", s.NPECNMarkedRoCEPackets},
		{"np_cnp_sent", s.NPCNPSent},
		{"rp_cnp_handled", s.RPCNPHandled},
		{"rp_cnp_ignored", s.RPCNPIgnored},
	}
}

// qpCC is one QP's DCQCN state, guarded by the QP's mutex.
type qpCC struct {
	rp     dcqcn.RP
	np     dcqcn.NP
	pacer  congestion.Pacer
	paceAt clock.Time // parked by the pacer until then; Never when not parked
	cnps   int        // CNPs owed to the peer, sent ahead of the QP's traffic
	cnpHdr hdrTmpl    // the QP's header with the CNP DSCP
	peerQP uint32     // DestQP of the CNPs: the peer's QPN
}

// setTOS rewrites the IPv4 TOS / IPv6 traffic class of a header template.
func (h *hdrTmpl) setTOS(tos uint8) {
	ip := h.b[frame.EthernetLen:]
	if h.v6 {
		w := binary.BigEndian.Uint32(ip)
		binary.BigEndian.PutUint32(ip, w&^(0xFF<<20)|uint32(tos)<<20)
		return
	}
	ip[1] = tos
}

// tos returns the template's IPv4 TOS / IPv6 traffic class.
func (h *hdrTmpl) tos() uint8 {
	ip := h.b[frame.EthernetLen:]
	if h.v6 {
		return uint8(binary.BigEndian.Uint32(ip) >> 20)
	}
	return ip[1]
}

// ccStart sets up DCQCN for an RC/UC QP entering RTR (q.mu held, q.hdr
// built): its frames become ECT(0) and it gets its RP, NP and pacer.
func (q *QP) ccStart() {
	c := &q.dev.cfg.Congestion
	if !c.On() || q.init.Type.Datagram() {
		q.cc = nil
		return
	}
	if q.cc == nil {
		q.cc = new(qpCC)
	}
	cc := q.cc
	*cc = qpCC{paceAt: clock.Never, peerQP: q.attr.DestQPN}
	_ = cc.rp.Init(c.RP) // validated by NewDevice
	cc.np.Init(c.NP)
	cc.pacer.Burst = c.PacerBurst
	q.ccHeaders()
}

// ccHeaders marks the QP's header template ECT(0), with the profile's data
// DSCP if it has one, and derives the CNP header from it (q.mu held).
func (q *QP) ccHeaders() {
	c := &q.dev.cfg.Congestion
	dscp := q.hdr.tos() >> 2
	if c.DataDSCP != 0 {
		dscp = c.DataDSCP
	}
	q.hdr.setTOS(dscp<<2 | ecnECT0)
	q.cc.cnpHdr = q.hdr
	q.cc.cnpHdr.setTOS(c.NP.DSCP<<2 | ecnECT0)
}

// ccRelease folds the QP's DCQCN state into what release publishes: a
// parked QP has no output until its departure time unless it owes a CNP,
// and its deadline covers the RP's and NP's timers and the departure. A
// QP whose transport has nothing to send is not parked at all (the pacer
// remembers its debt and parks it again when it has), so an idle QP costs
// no wake-up.
func (cc *qpCC) ccRelease(pending bool, dl clock.Time) (bool, clock.Time) {
	if !pending {
		cc.paceAt = clock.Never
	}
	pending = pending && cc.paceAt == clock.Never || cc.cnps > 0
	dl = min(dl, cc.rp.Deadline(), cc.np.Deadline(), cc.paceAt)
	return pending, dl
}

// ccExpire runs the QP's DCQCN timers due at now (q.mu held): rate
// increases, deferred CNPs, and the end of a pacer wait.
func (q *QP) ccExpire(now clock.Time) {
	cc := q.cc
	if cc.rp.Deadline() <= now {
		cc.rp.OnTimer(now)
	}
	if cc.np.OnTimer(now) {
		cc.cnps++
	}
	if cc.paceAt <= now {
		cc.paceAt = clock.Never
	}
}

// ccMaySend asks the pacer whether the QP may send a packet at now; if not
// it parks the QP until its departure time (q.mu held). The pacer's time
// for the next packet does not depend on that packet's size (Burst is in
// bytes, the cost is charged after the packet is built), so asking before
// the transport builds it is exact.
func (cc *qpCC) ccMaySend(now clock.Time) bool {
	if cc.paceAt != clock.Never {
		if cc.paceAt > now {
			return false
		}
		cc.paceAt = clock.Never
	}
	if at := cc.pacer.Next(now, cc.rp.Rate(), 0); at > now {
		cc.paceAt = at
		return false
	}
	return true
}

// ccSent charges a frame of n wire bytes to the pacer and the RP's byte
// counter.
func (cc *qpCC) ccSent(now clock.Time, n int) {
	r := cc.rp.Rate()
	cc.pacer.Sent(now, r, n)
	cc.rp.OnPacketSent(now, n)
}

// cnpLen is the transport part of a CNP: BTH and 16 reserved bytes.
const cnpLen = bth.BTHLen + bth.CNPReservedLen

// buildCNP writes one CNP owed by q into buf and returns the frame length,
// 0 if buf is too small (q.mu held). Layout as ConnectX: opcode 0x81,
// P_Key 0xFFFF, BECN, DestQP the peer's QP, AckReq 0, PSN 0, 16 zero
// bytes, the QP's addresses and UDP source port, the CNP DSCP with ECT(0).
func (d *Device) buildCNP(q *QP, buf []byte) int {
	cc := q.cc
	h := cc.cnpHdr.bytes()
	if len(buf) < len(h)+cnpLen+icrc.Len {
		return 0
	}
	t := buf[len(h) : len(h)+cnpLen]
	clear(t)
	b := bth.BTH(t[:bth.BTHLen])
	b.SetOpcode(bth.CNP)
	b.SetPKey(bth.DefaultPKey)
	b.SetBECN(true)
	b.SetDestQP(cc.peerQP)
	cc.cnps--
	d.Stats.NPCNPSent++
	return d.finish(buf, h, cnpLen)
}

// receiveCNP hands a CNP (checked for address, header and ICRC) to q's
// reaction point (q.mu held). A CNP is not a transport packet: it never
// reaches the PSN logic and is never answered.
func (d *Device) receiveCNP(now clock.Time, q *QP, f *frame.Frame) {
	d.Stats.RxCNP++
	cc := q.cc
	if cc == nil || (q.state != ib.RTS && q.state != ib.SQD && q.state != ib.SQE) {
		d.Stats.RPCNPIgnored++
		return
	}
	if f.Src().Unmap() != q.peer {
		d.Stats.RxBadSrc++
		return
	}
	before := cc.rp.RPCounters
	cc.rp.OnCNP(now)
	d.Stats.RPCNPHandled += cc.rp.RPCNPHandled - before.RPCNPHandled
	d.Stats.RPCNPIgnored += cc.rp.RPCNPIgnored - before.RPCNPIgnored
}

// npPacket runs q's notification point on a packet of q's transport that
// passed every check (q.mu held).
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
func (d *Device) npPacket(now clock.Time, q *QP, f *frame.Frame) {
	ce := f.ECN() == ecnCE
	if op := f.Opcode(); op == bth.RCAcknowledge || op == bth.RCAtomicAcknowledge {
		if ce {
			d.Stats.RxCEAck++
		}
		return
	}
	if ce {
		d.Stats.NPECNMarkedRoCEPackets++
	}
	if q.cc.np.OnPacket(now, ce) {
		q.cc.cnps++
	}
}

// CCState is a snapshot of a QP's DCQCN state.
type CCState struct {
	// Rate is the reaction point's current rate (R_C), Target its target
	// rate (R_T), Alpha its α.
	Rate, Target congestion.Rate
	Alpha        float64
	dcqcn.RPCounters
	dcqcn.NPCounters
}

// CongestionState returns the QP's DCQCN state, false if the QP runs none
// (profile off, UD/GSI, or not yet in RTR). It takes the QP lock: for
// tests and stats, not for the data path.
func (q *QP) CongestionState() (CCState, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	cc := q.cc
	if cc == nil {
		return CCState{}, false
	}
	return CCState{Rate: cc.rp.Rate(), Target: cc.rp.Target(), Alpha: cc.rp.Alpha(),
		RPCounters: cc.rp.RPCounters, NPCounters: cc.np.NPCounters}, true
}

package rnic

import (
	"github.com/softrnic/softrnic/frame"
	"github.com/softrnic/softrnic/ib"
)

// UDSourcePort is the UDP source port rxe gives the packets of the UD QP
// qpn: hash_32(qpn, 14) in the RoCEv2 entropy range [0xC000, 0xFFFF]
// (rdma_get_udp_sport with a zero flow label and no remote QPN falls back
// to it). An AddressVector with UDPSrcPort 0 gets a port from the flow
// label and QPNs it knows, which for an address handle (no QPN at all) is
// a constant; a UD application that wants its frames to look like rxe's —
// spread by ECMP per QP the way a kernel peer's are — sets
// AddressVector.UDPSrcPort to UDSourcePort(its QP's number).
func UDSourcePort(qpn uint32) uint16 {
	return 0xC000 | uint16((qpn*0x61C88647)>>(32-14))
}

// udpSport is rdma_get_udp_sport: entropy for ECMP from the flow label, or
// from the two QPNs when it is 0, in 0xC000..0xFFFF.
func udpSport(fl uint32, lqpn, rqpn uint32) uint16 {
	if fl == 0 {
		v := uint64(lqpn) * uint64(rqpn)
		v ^= v >> 20
		v ^= v >> 40
		fl = uint32(v & 0xFFFFF)
	}
	return uint16((fl&0x3FFF)^((fl&0xFC000)>>14)) | 0xC000
}

// makeHdr prepares the frame header of packets along av (checked with
// checkAV) to the next hop mac. It is the only place the device says
// anything about Ethernet, IP and UDP, through frame's template.
func (d *Device) makeHdr(av *ib.AddressVector, mac [6]byte, lqpn, rqpn uint32) frame.Template {
	sp := av.UDPSrcPort
	if sp == 0 {
		sp = udpSport(av.FlowLabel, lqpn, rqpn)
	}
	s := frame.Spec{DstMAC: mac, SrcMAC: d.cfg.MAC, Src: d.cfg.Addrs[av.SGIDIndex], Dst: av.DGID.Addr(),
		TOS: av.TrafficClass, TTL: av.HopLimit, FlowLabel: av.FlowLabel, SrcPort: sp}
	var t frame.Template
	_ = t.Set(&s) // checkAV made the families agree
	return t
}

// finish puts the header h in front of a transport packet of tlen bytes
// already at buf[len(h):], fills lengths and checksums, stamps the ICRC and
// returns the frame length.
func (d *Device) finish(buf []byte, h []byte, tlen int) int {
	return frame.FinishFrame(buf, h, tlen, &d.ipID)
}

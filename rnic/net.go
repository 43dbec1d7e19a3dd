package rnic

import (
	"github.com/softrnic/softrnic/frame"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/icrc"
	"github.com/softrnic/softrnic/transport"
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

// seal completes the frame in buf whose transport headers, tlen bytes,
// are at buf[len(hdr):]: it puts the frame header hdr in front of them
// (lengths, IPv4 identification and checksum), gathers the payload p
// behind them and pads it, computing the ICRC as it copies, and stamps the
// ICRC. It returns the frame's length. buf holds the whole frame.
func (d *Device) seal(buf []byte, hdr []byte, tlen int, p *transport.Payload) int {
	at := len(hdr) + tlen
	n := p.Len()
	pad := -n & 3
	end := at + n + pad + icrc.Len
	ip := frame.Prepend(buf, hdr, end, &d.ipID)
	crc, _ := icrc.Begin(buf[ip:at]) // our own IP header: Begin cannot fail
	sg, off := p.Memory()
	crc, k := ib.Gather(buf[at:at+n], sg, off, crc, icrc.Copy)
	if k < n {
		// Memory shorter than the transport said (checked at post time, so
		// never expected): the frame still goes out with a good ICRC.
		crc = icrc.Update(crc, buf[at+k:at+n])
	}
	crc = icrc.Pad(crc, buf[at+n:], pad)
	icrc.Put(buf[end-icrc.Len:end], crc)
	return end
}

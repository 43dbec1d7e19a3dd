package engine

import (
	"encoding/binary"
	"errors"

	"github.com/softrnic/softrnic/frame"
	"github.com/softrnic/softrnic/icrc"
)

var errTooLong = errors.New("engine: datagram longer than 65535 bytes")

// wrap writes Ethernet, IP and UDP headers in front of the n-byte transport
// packet already at buf[headerLen(p.Src):], stamps the ICRC after it and
// returns the frame's length.
//
// IPv4: DF set (RoCEv2 must not be fragmented), TOS from the traffic class,
// TTL from the hop limit, an incrementing identification, a correct header
// checksum. IPv6: traffic class, flow label 0 (as rxe), hop limit. UDP:
// destination 4791, the QP's source port, checksum 0 (the ICRC protects the
// datagram; RoCEv2 senders leave the UDP checksum out).
func (e *Engine) wrap(buf []byte, p *Path, n int) (int, error) {
	copy(buf[0:6], p.DstMAC[:])
	copy(buf[6:12], p.SrcMAC[:])
	hop := p.HopLimit
	if hop == 0 {
		hop = 64
	}
	off := frame.EthernetLen
	var ipLen int
	if p.Src.Is4() {
		binary.BigEndian.PutUint16(buf[12:], frame.EtherTypeIPv4)
		ipLen = frame.IPv4Len + frame.UDPLen + n + icrc.Len
		if ipLen > 0xffff {
			return 0, errTooLong
		}
		ip := buf[off : off+frame.IPv4Len]
		ip[0] = 0x45
		ip[1] = p.TrafficClass
		binary.BigEndian.PutUint16(ip[2:], uint16(ipLen))
		e.ipID++
		binary.BigEndian.PutUint16(ip[4:], e.ipID)
		binary.BigEndian.PutUint16(ip[6:], 0x4000) // DF
		ip[8] = hop
		ip[9] = frame.ProtocolUDP
		ip[10], ip[11] = 0, 0
		s4, d4 := p.Src.As4(), p.Dst.As4()
		copy(ip[12:16], s4[:])
		copy(ip[16:20], d4[:])
		binary.BigEndian.PutUint16(ip[10:], ipChecksum(ip))
		off += frame.IPv4Len
	} else {
		binary.BigEndian.PutUint16(buf[12:], frame.EtherTypeIPv6)
		ipLen = frame.IPv6Len + frame.UDPLen + n + icrc.Len
		if ipLen-frame.IPv6Len > 0xffff {
			return 0, errTooLong
		}
		ip := buf[off : off+frame.IPv6Len]
		binary.BigEndian.PutUint32(ip[0:], 6<<28|uint32(p.TrafficClass)<<20) // flow label 0
		binary.BigEndian.PutUint16(ip[4:], uint16(ipLen-frame.IPv6Len))
		ip[6] = frame.ProtocolUDP
		ip[7] = hop
		s16, d16 := p.Src.As16(), p.Dst.As16()
		copy(ip[8:24], s16[:])
		copy(ip[24:40], d16[:])
		off += frame.IPv6Len
	}
	udp := buf[off : off+frame.UDPLen]
	binary.BigEndian.PutUint16(udp[0:], p.UDPSrcPort)
	binary.BigEndian.PutUint16(udp[2:], frame.RoCEv2Port)
	binary.BigEndian.PutUint16(udp[4:], uint16(frame.UDPLen+n+icrc.Len))
	binary.BigEndian.PutUint16(udp[6:], 0)
	size := frame.EthernetLen + ipLen
	if err := icrc.Stamp(buf[frame.EthernetLen:size]); err != nil {
		return 0, err
	}
	return size, nil
}

// ipChecksum is the IPv4 header checksum of h (whose checksum field is 0).
func ipChecksum(h []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(h); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

// UDPSourcePort is the UDP source port rxe gives a QP's packets, so that
// ECMP spreads QPs the way a kernel peer's switch would: for a connected QP
// it folds the flow label rdma_calc_flow_label(local QPN, remote QPN) into
// 14 bits (rdma_get_udp_sport), which gives both ends of a QP pair the same
// port; for a UD QP (remote 0) it hashes the local QPN (hash_32, 14 bits).
// Either way the result lies in [0xC000, 0xFFFF], the range the RoCEv2
// annex reserves for this entropy. Receivers never demultiplex on it.
func UDPSourcePort(localQPN, remoteQPN uint32) uint16 {
	if remoteQPN == 0 {
		return 0xC000 | uint16((localQPN*0x61C88647)>>(32-14))
	}
	v := uint64(localQPN) * uint64(remoteQPN)
	v ^= v >> 20
	v ^= v >> 40
	fl := uint32(v) & 0xFFFFF
	low := fl&0x3FFF ^ (fl&0xFC000)>>14
	return 0xC000 | uint16(low)
}

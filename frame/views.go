package frame

import (
	"encoding/binary"
	"net"
	"net/netip"
)

// Sizes and constants of the layers below the BTH.
const (
	EthernetLen = 14
	VLANTagLen  = 4
	IPv4Len     = 20 // option-less; RoCEv2 senders never use options
	IPv6Len     = 40
	UDPLen      = 8

	EtherTypeIPv4 = 0x0800
	EtherTypeIPv6 = 0x86DD
	EtherTypeVLAN = 0x8100

	ProtocolUDP = 17

	// RoCEv2Port is the IANA UDP destination port of RoCEv2.
	RoCEv2Port = 4791
)

// Ethernet is a view of the 14-byte Ethernet II header.
type Ethernet []byte

// Dst is the destination MAC address (a view, not a copy).
func (e Ethernet) Dst() net.HardwareAddr { return net.HardwareAddr(e[0:6:6]) }

// Src is the source MAC address (a view, not a copy).
func (e Ethernet) Src() net.HardwareAddr { return net.HardwareAddr(e[6:12:12]) }

// EtherType is the type field; with an 802.1Q tag it is 0x8100.
func (e Ethernet) EtherType() uint16 { return binary.BigEndian.Uint16(e[12:]) }

// IPv4 is a view of an option-less IPv4 header.
type IPv4 []byte

// Version is 4 for a well-formed header.
func (h IPv4) Version() uint8 { return h[0] >> 4 }

// IHL is the header length in 32-bit words (5 without options).
func (h IPv4) IHL() uint8 { return h[0] & 0x0F }

// TOS is the DSCP (bits 7:2) and ECN (bits 1:0) byte.
func (h IPv4) TOS() uint8 { return h[1] }

// ECN is the two ECN bits: 0 not-ECT, 1 ECT(1), 2 ECT(0), 3 CE.
func (h IPv4) ECN() uint8 { return h[1] & 3 }

// TotalLen is the datagram length, header included.
func (h IPv4) TotalLen() uint16 { return binary.BigEndian.Uint16(h[2:]) }

// SetTotalLen sets the datagram length (the checksum is not updated).
func (h IPv4) SetTotalLen(n uint16) { binary.BigEndian.PutUint16(h[2:], n) }

// ID is the identification field.
func (h IPv4) ID() uint16 { return binary.BigEndian.Uint16(h[4:]) }

// SetID sets the identification field (the checksum is not updated).
func (h IPv4) SetID(id uint16) { binary.BigEndian.PutUint16(h[4:], id) }

// DF is the don't-fragment flag (rxe always sets it).
func (h IPv4) DF() bool { return h[6]&0x40 != 0 }

// MF is the more-fragments flag.
func (h IPv4) MF() bool { return h[6]&0x20 != 0 }

// FragOffset is the fragment offset in 8-byte units.
func (h IPv4) FragOffset() uint16 { return binary.BigEndian.Uint16(h[6:]) & 0x1FFF }

// TTL is the time to live.
func (h IPv4) TTL() uint8 { return h[8] }

// Protocol is the payload protocol (17 for UDP).
func (h IPv4) Protocol() uint8 { return h[9] }

// Checksum is the header checksum as stored.
func (h IPv4) Checksum() uint16 { return binary.BigEndian.Uint16(h[10:]) }

// Src is the source address.
func (h IPv4) Src() netip.Addr { return netip.AddrFrom4([4]byte(h[12:16])) }

// Dst is the destination address.
func (h IPv4) Dst() netip.Addr { return netip.AddrFrom4([4]byte(h[16:20])) }

// ChecksumValid reports whether the header checksum is right. Parse does not
// require it: the ICRC covers every IPv4 field but TOS, TTL and the checksum
// itself, so a corrupted address already fails VerifyICRC.
func (h IPv4) ChecksumValid() bool { return ipv4Checksum(h[:IPv4Len]) == 0 }

// SetChecksum stores the header checksum, computed over the IHL·4 bytes
// of the header (options included). Whoever rewrites a header field —
// the builder, the device's per-QP templates, an ECN marker — calls this
// one function.
func (h IPv4) SetChecksum() {
	n := min(int(h[0]&0x0F)*4, len(h))
	h[10], h[11] = 0, 0
	binary.BigEndian.PutUint16(h[10:], ipv4Checksum(h[:n]))
}

// completeChecksum turns the checksum of the header with a zero total
// length and identification (what a Template stores) into the header's:
// it adds the two in ones' complement (RFC 1624), where SetChecksum would
// sum the whole header.
func (h IPv4) completeChecksum() {
	s := uint32(^h.Checksum()) + uint32(h.TotalLen()) + uint32(h.ID())
	s = s>>16 + s&0xFFFF
	s += s >> 16
	binary.BigEndian.PutUint16(h[10:], ^uint16(s))
}

// ipv4Checksum is the ones'-complement sum of a header, complemented: 0
// over a header with a correct checksum, the checksum to store over one
// whose checksum field is zero.
func ipv4Checksum(h []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(h); i += 2 {
		s += uint32(h[i])<<8 | uint32(h[i+1])
	}
	s = s>>16 + s&0xFFFF
	s += s >> 16
	return ^uint16(s)
}

// IPv6 is a view of the 40-byte IPv6 header.
type IPv6 []byte

// Version is 6 for a well-formed header.
func (h IPv6) Version() uint8 { return h[0] >> 4 }

// TrafficClass is the DSCP and ECN byte.
func (h IPv6) TrafficClass() uint8 { return h[0]<<4 | h[1]>>4 }

// ECN is the two ECN bits of the traffic class.
func (h IPv6) ECN() uint8 { return h[1] >> 4 & 3 }

// FlowLabel is the 20-bit flow label (rxe sends 0).
func (h IPv6) FlowLabel() uint32 { return binary.BigEndian.Uint32(h[0:]) & 0xFFFFF }

// PayloadLen is the length after the 40-byte header.
func (h IPv6) PayloadLen() uint16 { return binary.BigEndian.Uint16(h[4:]) }

// SetPayloadLen sets the length after the 40-byte header.
func (h IPv6) SetPayloadLen(n uint16) { binary.BigEndian.PutUint16(h[4:], n) }

// NextHeader is the payload protocol (17 for UDP).
func (h IPv6) NextHeader() uint8 { return h[6] }

// HopLimit is the hop limit.
func (h IPv6) HopLimit() uint8 { return h[7] }

// Src is the source address.
func (h IPv6) Src() netip.Addr { return netip.AddrFrom16([16]byte(h[8:24])) }

// Dst is the destination address.
func (h IPv6) Dst() netip.Addr { return netip.AddrFrom16([16]byte(h[24:40])) }

// UDP is a view of the 8-byte UDP header.
type UDP []byte

// SrcPort is the source port: flow entropy for ECMP, never a key (rxe
// derives it from the QPNs, ConnectX CNPs use 0).
func (u UDP) SrcPort() uint16 { return binary.BigEndian.Uint16(u[0:]) }

// DstPort is the destination port, 4791 for RoCEv2.
func (u UDP) DstPort() uint16 { return binary.BigEndian.Uint16(u[2:]) }

// Length is the UDP length, header included.
func (u UDP) Length() uint16 { return binary.BigEndian.Uint16(u[4:]) }

// SetLength sets the UDP length, header included.
func (u UDP) SetLength(n uint16) { binary.BigEndian.PutUint16(u[4:], n) }

// Checksum is the UDP checksum; RoCEv2 senders send 0 (none).
func (u UDP) Checksum() uint16 { return binary.BigEndian.Uint16(u[6:]) }

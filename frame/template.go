package frame

import (
	"encoding/binary"
)

// MaxHeaderLen is the longest Ethernet/IP/UDP header a Template holds
// (802.1Q tag and IPv6).
const MaxHeaderLen = EthernetLen + VLANTagLen + IPv6Len + UDPLen

// Template is the Ethernet, IP and UDP header of the RoCEv2 frames that go
// one way (a connected QP's, an address handle's), written once from a
// Spec, so that sending a transport packet costs one copy of it and the
// per-frame fields: Prepend puts it in front of the packet and fills in
// the lengths and the IPv4 identification and checksum.
type Template struct {
	b     [MaxHeaderLen]byte
	n, ip uint8
	ipv6  bool
}

// Set writes the template from s's Ethernet, IP and UDP fields (the
// transport fields are not used).
func (t *Template) Set(s *Spec) error {
	ip, udp, ipv6, err := layout(s)
	if err != nil {
		return err
	}
	*t = Template{n: uint8(udp + UDPLen), ip: uint8(ip), ipv6: ipv6}
	writeL2L4(t.b[:], s, ip, udp, ipv6)
	t.sealIPv4()
	return nil
}

// sealIPv4 stores in an IPv4 template the checksum of its header with a
// zero total length and identification, which Prepend completes for each
// frame by adding the two (RFC 1624) instead of summing the header again.
func (t *Template) sealIPv4() {
	if t.ipv6 {
		return
	}
	h := IPv4(t.b[t.ip : int(t.n)-UDPLen])
	h.SetTotalLen(0)
	h.SetID(0)
	h.SetChecksum()
}

// Bytes is the header, as Prepend takes it; empty before Set.
func (t *Template) Bytes() []byte { return t.b[:t.n] }

// TOS is the IPv4 TOS / IPv6 traffic class (DSCP and ECN).
func (t *Template) TOS() uint8 {
	h := t.b[t.ip:]
	if t.ipv6 {
		return uint8(binary.BigEndian.Uint32(h) >> 20)
	}
	return h[1]
}

// SetTOS sets the IPv4 TOS / IPv6 traffic class.
func (t *Template) SetTOS(tos uint8) {
	h := t.b[t.ip:]
	if t.ipv6 {
		w := binary.BigEndian.Uint32(h)
		binary.BigEndian.PutUint32(h, w&^(0xFF<<20)|uint32(tos)<<20)
		return
	}
	h[1] = tos
	t.sealIPv4()
}

// Prepend writes hdr (a Template's Bytes, and nothing else: an IPv4
// template carries a partial checksum) at the front of buf for a frame
// of n bytes, Ethernet header to ICRC, and fills in the fields that vary
// per frame: the IP and UDP lengths and, for IPv4, the identification
// *ipID advanced by one and the header checksum. It returns the offset of
// the IP header, where the ICRC's coverage starts: the caller computes
// the ICRC as it puts the transport packet behind the header (icrc.Begin,
// Copy, Pad, Put), in one pass over the payload.
func Prepend(buf, hdr []byte, n int, ipID *uint16) int {
	hl := copy(buf, hdr)
	ip := EthernetLen
	if Ethernet(buf).EtherType() == EtherTypeVLAN {
		ip += VLANTagLen
	}
	udp := hl - UDPLen
	ipv6 := binary.BigEndian.Uint16(buf[ip-2:]) == EtherTypeIPv6
	setLengths(buf, ip, udp, n, ipv6)
	if !ipv6 {
		*ipID++
		h := IPv4(buf[ip:udp])
		h.SetID(*ipID)
		h.completeChecksum()
	}
	return ip
}

package frame

import (
	"encoding/binary"

	"github.com/softrnic/softrnic/icrc"
)

// MaxHeaderLen is the longest Ethernet/IP/UDP header a Template holds
// (802.1Q tag and IPv6).
const MaxHeaderLen = EthernetLen + VLANTagLen + IPv6Len + UDPLen

// Template is the Ethernet, IP and UDP header of the RoCEv2 frames that go
// one way (a connected QP's, an address handle's), written once from a
// Spec, so that sending a transport packet costs one copy of it and the
// per-frame fields: FinishFrame puts it in front of the packet and fills
// in the lengths, the IPv4 identification and checksum, and the ICRC.
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
	return nil
}

// Bytes is the header, as FinishFrame takes it; empty before Set.
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
}

// FinishFrame completes the frame whose transport packet (BTH to the end
// of the pad) of tlen bytes is at buf[len(hdr):]: it copies hdr (a
// Template's Bytes) in front of it, fills the IP and UDP lengths, gives an
// IPv4 frame the identification *ipID advanced by one, computes the IPv4
// checksum, stamps the ICRC and returns the frame's length. buf must hold
// the ICRC too.
func FinishFrame(buf, hdr []byte, tlen int, ipID *uint16) int {
	n := copy(buf, hdr)
	ip := EthernetLen
	if binary.BigEndian.Uint16(buf[12:]) == EtherTypeVLAN {
		ip += VLANTagLen
	}
	ipv6 := binary.BigEndian.Uint16(buf[ip-2:]) == EtherTypeIPv6
	end := n + tlen + icrc.Len
	if !ipv6 {
		*ipID++
		binary.BigEndian.PutUint16(buf[ip+4:], *ipID)
	}
	_ = seal(buf, ip, n-UDPLen, end, ipv6) // an IP header of our own: Stamp cannot fail
	return end
}

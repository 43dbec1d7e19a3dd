package frame

import (
	"encoding/binary"
	"errors"
	"net/netip"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/icrc"
)

// Spec says what a built frame carries, layer by layer. The extended header
// fields are used only when the opcode carries that header; PadCount in BTH
// is ignored (Finish computes it from the payload length).
type Spec struct {
	// Ethernet.
	DstMAC, SrcMAC [6]byte
	VLAN           bool   // insert one 802.1Q tag
	VLANTCI        uint16 // PCP(15:13) DEI(12) VID(11:0)

	// IP: Src and Dst both IPv4 (or IPv4-mapped IPv6) or both IPv6.
	Src, Dst  netip.Addr
	TOS       uint8  // IPv4 TOS / IPv6 traffic class: DSCP and ECN
	TTL       uint8  // IPv4 TTL / IPv6 hop limit; 0 means 64
	IPID      uint16 // IPv4 identification
	FlowLabel uint32 // IPv6 flow label (20 bits)
	NoDF      bool   // IPv4: leave DF clear (RoCEv2 senders set it)

	// UDP. The destination port is always 4791; the checksum is 0.
	SrcPort uint16

	// Transport headers.
	BTH         bth.BTHFields
	RETH        RETHFields
	AETH        AETHFields
	DETH        DETHFields
	Imm         uint32 // ImmDt
	InvRKey     uint32 // IETH
	Atomic      AtomicFields
	AtomicOrig  uint64 // AtomicAckETH
	FlushPlace  uint8  // FETH placement type
	FlushSelect uint8  // FETH selectivity
}

// RETHFields are the RETH's fields.
type RETHFields struct {
	VA     uint64
	RKey   uint32
	DMALen uint32
}

// AETHFields are the AETH's fields; build the syndrome with
// bth.ACKSyndrome, bth.RNRNAKSyndrome or bth.NAKSyndrome.
type AETHFields struct {
	Syndrome uint8
	MSN      uint32
}

// DETHFields are the DETH's fields.
type DETHFields struct {
	QKey  uint32
	SrcQP uint32
}

// AtomicFields are the AtomicETH's fields.
type AtomicFields struct {
	VA      uint64
	RKey    uint32
	SwapAdd uint64
	Compare uint64
}

// Builder errors.
var (
	ErrBufferTooSmall = errors.New("frame: buffer too small for the frame")
	ErrAddrFamily     = errors.New("frame: source and destination must be both IPv4 or both IPv6")
	ErrBuildOpcode    = errors.New("frame: opcode unknown, cannot lay out its headers")
	ErrBuildPayload   = errors.New("frame: payload given for an opcode that carries none")
	ErrTooLong        = errors.New("frame: datagram longer than 65535 bytes")
	ErrNoHeaders      = errors.New("frame: Finish without a successful Headers")
)

// Builder writes frames in two steps so that payload can be gathered into
// place without an intermediate copy:
//
//	hl, err := b.Headers(buf, &spec)     // Ethernet … extended headers
//	n := copy(buf[hl:], piece1)           // payload, from as many pieces as needed
//	n += copy(buf[hl+n:], piece2)
//	size, err := b.Finish(buf, n)         // pad, lengths, checksum, ICRC
//
// A Builder remembers the layout between the two calls and nothing else; it
// is small, reusable and not safe for concurrent use.
type Builder struct {
	ip   int // IP header offset
	udp  int // UDP header offset
	bth  int // BTH offset
	pay  int // payload offset (the value Headers returned)
	ipv6 bool
	op   bth.Opcode
	ok   bool
}

// Headers writes everything up to the payload into buf and returns the
// payload's offset. buf must be large enough for the whole frame: the
// headers, the payload that will follow, up to 3 pad bytes and the ICRC.
func (b *Builder) Headers(buf []byte, s *Spec) (int, error) {
	b.ok = false
	op := s.BTH.Opcode
	hl := op.HeaderLen()
	if hl == 0 {
		return 0, ErrBuildOpcode
	}
	var err error
	if b.ip, b.udp, b.ipv6, err = layout(s); err != nil {
		return 0, err
	}
	b.bth = b.udp + UDPLen
	b.pay = b.bth + hl
	if len(buf) < b.pay+icrc.Len {
		return 0, ErrBufferTooSmall
	}
	b.op = op
	writeL2L4(buf, s, b.ip, b.udp, b.ipv6)

	bh := bth.BTH(buf[b.bth : b.bth+bth.BTHLen])
	bh.Encode(&s.BTH)
	t := buf[b.bth:b.pay]
	if o := op.Offset(bth.ExtRETH); o >= 0 {
		bth.RETH(t[o:]).Encode(s.RETH.VA, s.RETH.RKey, s.RETH.DMALen)
	}
	if o := op.Offset(bth.ExtAETH); o >= 0 {
		bth.AETH(t[o:]).Encode(s.AETH.Syndrome, s.AETH.MSN)
	}
	if o := op.Offset(bth.ExtDETH); o >= 0 {
		bth.DETH(t[o:]).Encode(s.DETH.QKey, s.DETH.SrcQP)
	}
	if o := op.Offset(bth.ExtImmDt); o >= 0 {
		bth.ImmDt(t[o:]).SetImm(s.Imm)
	}
	if o := op.Offset(bth.ExtIETH); o >= 0 {
		bth.IETH(t[o:]).SetRKey(s.InvRKey)
	}
	if o := op.Offset(bth.ExtAtomicETH); o >= 0 {
		bth.AtomicETH(t[o:]).Encode(s.Atomic.VA, s.Atomic.RKey, s.Atomic.SwapAdd, s.Atomic.Compare)
	}
	if o := op.Offset(bth.ExtAtomicAckETH); o >= 0 {
		bth.AtomicAckETH(t[o:]).SetOrig(s.AtomicOrig)
	}
	if o := op.Offset(bth.ExtFETH); o >= 0 {
		bth.FETH(t[o:]).Encode(s.FlushPlace, s.FlushSelect)
	}
	if o := op.Offset(bth.ExtCNPReserved); o >= 0 {
		clear(t[o : o+bth.CNPReservedLen])
	}
	b.ok = true
	return b.pay, nil
}

// layout returns where a frame of s has its IP and UDP headers, and
// whether it is IPv6.
func layout(s *Spec) (ip, udp int, ipv6 bool, err error) {
	src, dst := s.Src.Unmap(), s.Dst.Unmap()
	var ipLen int
	switch {
	case src.Is4() && dst.Is4():
		ipLen = IPv4Len
	case src.Is6() && dst.Is6():
		ipLen, ipv6 = IPv6Len, true
	default:
		return 0, 0, false, ErrAddrFamily
	}
	ip = EthernetLen
	if s.VLAN {
		ip += VLANTagLen
	}
	return ip, ip + ipLen, ipv6, nil
}

// writeL2L4 writes the Ethernet, IP and UDP headers of s at their offsets
// (layout), leaving lengths and the IPv4 checksum zero for the frame's
// finish.
func writeL2L4(buf []byte, s *Spec, ip, udp int, ipv6 bool) {
	copy(buf[0:6], s.DstMAC[:])
	copy(buf[6:12], s.SrcMAC[:])
	if s.VLAN {
		binary.BigEndian.PutUint16(buf[12:], EtherTypeVLAN)
		binary.BigEndian.PutUint16(buf[14:], s.VLANTCI)
	}
	ttl := s.TTL
	if ttl == 0 {
		ttl = 64
	}
	src, dst := s.Src.Unmap(), s.Dst.Unmap()
	h := buf[ip:udp]
	if ipv6 {
		binary.BigEndian.PutUint16(buf[ip-2:], EtherTypeIPv6)
		binary.BigEndian.PutUint32(h[0:], 6<<28|uint32(s.TOS)<<20|s.FlowLabel&0xFFFFF)
		binary.BigEndian.PutUint16(h[4:], 0) // payload length: finish
		h[6] = ProtocolUDP
		h[7] = ttl
		a, d := src.As16(), dst.As16()
		copy(h[8:24], a[:])
		copy(h[24:40], d[:])
	} else {
		binary.BigEndian.PutUint16(buf[ip-2:], EtherTypeIPv4)
		h[0] = 0x45
		h[1] = s.TOS
		binary.BigEndian.PutUint16(h[2:], 0) // total length: finish
		binary.BigEndian.PutUint16(h[4:], s.IPID)
		if s.NoDF {
			binary.BigEndian.PutUint16(h[6:], 0)
		} else {
			binary.BigEndian.PutUint16(h[6:], 0x4000)
		}
		h[8] = ttl
		h[9] = ProtocolUDP
		binary.BigEndian.PutUint16(h[10:], 0) // checksum: finish
		a, d := src.As4(), dst.As4()
		copy(h[12:16], a[:])
		copy(h[16:20], d[:])
	}
	u := buf[udp : udp+UDPLen]
	binary.BigEndian.PutUint16(u[0:], s.SrcPort)
	binary.BigEndian.PutUint16(u[2:], RoCEv2Port)
	binary.BigEndian.PutUint32(u[4:], 0) // length: finish; checksum 0
}

// Finish completes a frame whose payload of payloadLen bytes the caller has
// put at the offset Headers returned: it writes the pad (zeros) and PadCnt,
// the IP and UDP lengths, the IPv4 header checksum and the ICRC, and returns
// the frame's length.
func (b *Builder) Finish(buf []byte, payloadLen int) (int, error) {
	if !b.ok {
		return 0, ErrNoHeaders
	}
	if payloadLen < 0 || (payloadLen > 0 && !b.op.HasPayload()) {
		return 0, ErrBuildPayload
	}
	pad := -payloadLen & 3
	padAt := b.pay + payloadLen
	end := padAt + pad + icrc.Len
	if end-b.ip > 0xFFFF {
		return 0, ErrTooLong
	}
	if len(buf) < end {
		return 0, ErrBufferTooSmall
	}
	clear(buf[padAt : padAt+pad])
	bth.BTH(buf[b.bth:]).SetPadCount(pad)
	if err := seal(buf, b.ip, b.udp, end, b.ipv6); err != nil {
		return 0, err
	}
	return end, nil
}

// seal fills the lengths of the IP and UDP headers at ip and udp of a
// frame ending at end, the IPv4 header checksum, and stamps the ICRC.
func seal(buf []byte, ip, udp, end int, ipv6 bool) error {
	setLengths(buf, ip, udp, end, ipv6)
	if !ipv6 {
		IPv4(buf[ip:udp]).SetChecksum()
	}
	return icrc.Stamp(buf[ip:end])
}

// setLengths fills the IP and UDP lengths of a frame ending at end (ICRC
// included) whose IP header is at ip and UDP header at udp.
func setLengths(buf []byte, ip, udp, end int, ipv6 bool) {
	UDP(buf[udp:]).SetLength(uint16(end - udp))
	if ipv6 {
		IPv6(buf[ip:udp]).SetPayloadLen(uint16(end - udp))
	} else {
		IPv4(buf[ip:udp]).SetTotalLen(uint16(end - ip))
	}
}

// Build writes a complete frame carrying payload into buf and returns its
// length: Headers, one copy, Finish.
func Build(buf []byte, s *Spec, payload []byte) (int, error) {
	var b Builder
	hl, err := b.Headers(buf, s)
	if err != nil {
		return 0, err
	}
	if len(payload) > 0 && !s.BTH.Opcode.HasPayload() {
		return 0, ErrBuildPayload
	}
	if len(buf) < hl+len(payload) {
		return 0, ErrBufferTooSmall
	}
	copy(buf[hl:], payload)
	return b.Finish(buf, len(payload))
}

// Size returns the length of the frame Build would write for s with a
// payload of payloadLen bytes, or 0 for an unknown opcode.
func Size(s *Spec, payloadLen int) int {
	hl := s.BTH.Opcode.HeaderLen()
	if hl == 0 {
		return 0
	}
	n := EthernetLen + UDPLen + hl + payloadLen + (-payloadLen & 3) + icrc.Len
	if s.VLAN {
		n += VLANTagLen
	}
	if s.Src.Unmap().Is4() {
		return n + IPv4Len
	}
	return n + IPv6Len
}

// BuildCNP writes a RoCEv2 congestion notification packet for destQP (the
// sender QP to slow down) into buf, taking Ethernet, IP and UDP fields from
// s and ignoring its transport fields: opcode 0x81, BECN set, P_Key 0xFFFF,
// all else zero, then 16 reserved zero bytes (Annex A17.9.3). ConnectX sends
// CNPs with TOS 0xC2 (DSCP 48, ECT(0)) and UDP source port 0.
func BuildCNP(buf []byte, s *Spec, destQP uint32) (int, error) {
	c := *s
	c.BTH = bth.BTHFields{Opcode: bth.CNP, PKey: bth.DefaultPKey, BECN: true, DestQP: destQP}
	return Build(buf, &c, nil)
}

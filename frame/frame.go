package frame

import (
	"encoding/binary"
	"net/netip"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/icrc"
)

// Frame is a parsed RoCEv2 frame: offsets into the buffer given to Parse,
// which must stay unchanged while the Frame is used. The zero Frame is
// empty; Parse overwrites all of it.
type Frame struct {
	buf  []byte
	ip   uint32 // IP header
	udp  uint32 // UDP header
	bth  uint32 // BTH
	pay  uint32 // payload, after the extended headers
	pad  uint32 // pad, after the payload
	icrc uint32 // ICRC, after the pad
	end  uint32 // end of the IP datagram (Ethernet padding may follow)
	ipv6 bool
	vlan bool
	op   bth.Opcode
	_    [1]byte
}

// Parse decodes b into f. On error f is left describing nothing useful; the
// error is a *ParseError (never allocated) whose Reason says whether the
// frame is not RoCEv2 at all or malformed. Parse never panics, whatever b
// holds, and does not verify the ICRC (see VerifyICRC).
func Parse(b []byte, f *Frame) error {
	f.buf = b
	// Nothing past the Ethernet and 802.1Q headers plus a 65535-byte IP
	// datagram can belong to the frame; clamping keeps the offsets in
	// uint32 whatever the slice's length.
	n := uint32(min(len(b), EthernetLen+VLANTagLen+0xFFFF+IPv6Len))
	if n < EthernetLen {
		return ErrTruncated
	}
	et := binary.BigEndian.Uint16(b[12:])
	ip := uint32(EthernetLen)
	f.vlan = false
	if et == EtherTypeVLAN {
		if n < EthernetLen+VLANTagLen {
			return ErrTruncated
		}
		et = binary.BigEndian.Uint16(b[16:])
		ip += VLANTagLen
		f.vlan = true
	}
	f.ip = ip
	var udp, end uint32
	switch et {
	case EtherTypeIPv4:
		f.ipv6 = false
		if n < ip+IPv4Len {
			return ErrTruncated
		}
		h := b[ip : ip+IPv4Len]
		if h[0]>>4 != 4 {
			return ErrIPVersion
		}
		if h[0]&0x0F != 5 {
			return ErrIPOptions
		}
		if h[9] != ProtocolUDP {
			return ErrNotUDP
		}
		if binary.BigEndian.Uint16(h[6:])&0x3FFF != 0 { // MF or a fragment offset
			return ErrFragment
		}
		tot := uint32(binary.BigEndian.Uint16(h[2:]))
		udp = ip + IPv4Len
		end = ip + tot
		if tot < IPv4Len+UDPLen || end > n {
			return ErrIPLength
		}
	case EtherTypeIPv6:
		f.ipv6 = true
		if n < ip+IPv6Len {
			return ErrTruncated
		}
		h := b[ip : ip+IPv6Len]
		if h[0]>>4 != 6 {
			return ErrIPVersion
		}
		if h[6] != ProtocolUDP {
			return ErrNotUDP
		}
		pl := uint32(binary.BigEndian.Uint16(h[4:]))
		udp = ip + IPv6Len
		end = udp + pl
		if pl < UDPLen || end > n {
			return ErrIPLength
		}
	default:
		return ErrEtherType
	}
	f.udp, f.end = udp, end
	u := b[udp : udp+UDPLen]
	if binary.BigEndian.Uint16(u[2:]) != RoCEv2Port {
		return ErrPort
	}
	if uint32(binary.BigEndian.Uint16(u[4:])) != end-udp {
		return ErrUDPLength
	}
	t := udp + UDPLen
	f.bth = t
	if end < t+bth.BTHLen+icrc.Len {
		return ErrTruncated
	}
	op := bth.Opcode(b[t])
	f.op = op
	if b[t+1]&0x0F != 0 {
		return ErrTVer
	}
	hl := uint32(op.HeaderLen())
	if hl == 0 {
		return ErrOpcode
	}
	pay := t + hl
	if end < pay+icrc.Len {
		return ErrHeaderLen
	}
	f.pay = pay
	f.icrc = end - icrc.Len
	padc := uint32(b[t+1]>>4) & 3
	if f.icrc-pay < padc {
		return ErrPadCount
	}
	f.pad = f.icrc - padc
	if f.icrc != pay && !op.HasPayload() && !(op == bth.RCAcknowledge && bth.BTH(b[t:]).SR()) {
		// (An ACK with the selective-repeat bit carries a SACKETH after
		// its AETH, which the QP checks.)
		return ErrPayload
	}
	return nil
}

// Buf is the buffer the frame was parsed from.
func (f *Frame) Buf() []byte { return f.buf }

// Len is the frame's length without Ethernet padding: Ethernet header
// through ICRC.
func (f *Frame) Len() int { return int(f.end) }

// Opcode is the BTH opcode.
func (f *Frame) Opcode() bth.Opcode { return f.op }

// Ethernet is the Ethernet header (its EtherType is 0x8100 when tagged).
func (f *Frame) Ethernet() Ethernet { return Ethernet(f.buf[:EthernetLen]) }

// VLAN returns the 802.1Q tag control information (PCP, DEI, VID) when the
// frame carries a tag.
func (f *Frame) VLAN() (tci uint16, ok bool) {
	if !f.vlan {
		return 0, false
	}
	return binary.BigEndian.Uint16(f.buf[EthernetLen:]), true
}

// IsIPv6 reports whether the frame is IPv6.
func (f *Frame) IsIPv6() bool { return f.ipv6 }

// IPv4 is the IPv4 header, nil for an IPv6 frame.
func (f *Frame) IPv4() IPv4 {
	if f.ipv6 {
		return nil
	}
	return IPv4(f.buf[f.ip:f.udp])
}

// IPv6 is the IPv6 header, nil for an IPv4 frame.
func (f *Frame) IPv6() IPv6 {
	if !f.ipv6 {
		return nil
	}
	return IPv6(f.buf[f.ip:f.udp])
}

// Src is the IP source address.
func (f *Frame) Src() netip.Addr {
	if f.ipv6 {
		return IPv6(f.buf[f.ip:f.udp]).Src()
	}
	return IPv4(f.buf[f.ip:f.udp]).Src()
}

// Dst is the IP destination address.
func (f *Frame) Dst() netip.Addr {
	if f.ipv6 {
		return IPv6(f.buf[f.ip:f.udp]).Dst()
	}
	return IPv4(f.buf[f.ip:f.udp]).Dst()
}

// ECN is the IP ECN field (3 = CE, congestion experienced), which the
// DCQCN notification point watches.
func (f *Frame) ECN() uint8 {
	if f.ipv6 {
		return IPv6(f.buf[f.ip:f.udp]).ECN()
	}
	return IPv4(f.buf[f.ip:f.udp]).ECN()
}

// UDP is the UDP header.
func (f *Frame) UDP() UDP { return UDP(f.buf[f.udp:f.bth]) }

// BTH is the base transport header.
func (f *Frame) BTH() bth.BTH { return bth.BTH(f.buf[f.bth : f.bth+bth.BTHLen]) }

// ext returns the extended header h of the given size, or nil.
func (f *Frame) ext(h bth.Ext, size uint32) []byte {
	off := f.op.Offset(h)
	if off < 0 {
		return nil
	}
	s := f.bth + uint32(off)
	return f.buf[s : s+size : s+size]
}

// RETH is the RDMA extended header, nil when the opcode has none.
func (f *Frame) RETH() bth.RETH { return f.ext(bth.ExtRETH, bth.RETHLen) }

// AETH is the ACK extended header, nil when the opcode has none.
func (f *Frame) AETH() bth.AETH { return f.ext(bth.ExtAETH, bth.AETHLen) }

// DETH is the datagram extended header, nil when the opcode has none.
func (f *Frame) DETH() bth.DETH { return f.ext(bth.ExtDETH, bth.DETHLen) }

// ImmDt is the immediate data, nil when the opcode has none.
func (f *Frame) ImmDt() bth.ImmDt { return f.ext(bth.ExtImmDt, bth.ImmDtLen) }

// IETH is the invalidate extended header, nil when the opcode has none.
func (f *Frame) IETH() bth.IETH { return f.ext(bth.ExtIETH, bth.IETHLen) }

// AtomicETH is the atomic extended header, nil when the opcode has none.
func (f *Frame) AtomicETH() bth.AtomicETH { return f.ext(bth.ExtAtomicETH, bth.AtomicETHLen) }

// AtomicAckETH is the atomic ACK extended header, nil when the opcode has
// none.
func (f *Frame) AtomicAckETH() bth.AtomicAckETH {
	return f.ext(bth.ExtAtomicAckETH, bth.AtomicAckETHLen)
}

// FETH is the flush extended header, nil when the opcode has none.
func (f *Frame) FETH() bth.FETH { return f.ext(bth.ExtFETH, bth.FETHLen) }

// CNPReserved is the 16 reserved bytes of a CNP, nil for other opcodes.
func (f *Frame) CNPReserved() []byte { return f.ext(bth.ExtCNPReserved, bth.CNPReservedLen) }

// Payload is the payload without its pad.
func (f *Frame) Payload() []byte { return f.buf[f.pay:f.pad:f.pad] }

// PayloadLen is len(f.Payload()).
func (f *Frame) PayloadLen() int { return int(f.pad - f.pay) }

// Pad is the 0-3 pad bytes after the payload.
func (f *Frame) Pad() []byte { return f.buf[f.pad:f.icrc:f.icrc] }

// ICRC is the 4-byte ICRC field.
func (f *Frame) ICRC() []byte { return f.buf[f.icrc:f.end:f.end] }

// Packet is the IP datagram: IP header through ICRC, without Ethernet
// padding. It is what the ICRC is computed over.
func (f *Frame) Packet() []byte { return f.buf[f.ip:f.end:f.end] }

// VerifyICRC reports whether the frame's ICRC is correct.
func (f *Frame) VerifyICRC() bool { return icrc.Verify(f.buf[f.ip:f.end]) }

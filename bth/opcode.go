package bth

import (
	"math/bits"
	"strconv"
)

// Opcode is the BTH OpCode byte. Its top three bits name the transport (RC,
// UC, RD, UD, CNP, XRC) and the low five the operation.
type Opcode uint8

// Reliable Connected (RC) opcodes, IBA Table 38 and include/rdma/ib_pack.h.
const (
	RCSendFirst              Opcode = 0x00
	RCSendMiddle             Opcode = 0x01
	RCSendLast               Opcode = 0x02
	RCSendLastImm            Opcode = 0x03
	RCSendOnly               Opcode = 0x04
	RCSendOnlyImm            Opcode = 0x05
	RCRDMAWriteFirst         Opcode = 0x06
	RCRDMAWriteMiddle        Opcode = 0x07
	RCRDMAWriteLast          Opcode = 0x08
	RCRDMAWriteLastImm       Opcode = 0x09
	RCRDMAWriteOnly          Opcode = 0x0A
	RCRDMAWriteOnlyImm       Opcode = 0x0B
	RCRDMAReadRequest        Opcode = 0x0C
	RCRDMAReadResponseFirst  Opcode = 0x0D
	RCRDMAReadResponseMiddle Opcode = 0x0E
	RCRDMAReadResponseLast   Opcode = 0x0F
	RCRDMAReadResponseOnly   Opcode = 0x10
	RCAcknowledge            Opcode = 0x11
	RCAtomicAcknowledge      Opcode = 0x12
	RCCompareSwap            Opcode = 0x13
	RCFetchAdd               Opcode = 0x14
	RCSendLastInv            Opcode = 0x16
	RCSendOnlyInv            Opcode = 0x17
	RCFlush                  Opcode = 0x1C // IBA 1.5 memory placement extension
	RCAtomicWrite            Opcode = 0x1D // IBA 1.5 memory placement extension
)

// Unreliable Connected (UC) opcodes: sends and RDMA writes only.
const (
	UCSendFirst        Opcode = 0x20
	UCSendMiddle       Opcode = 0x21
	UCSendLast         Opcode = 0x22
	UCSendLastImm      Opcode = 0x23
	UCSendOnly         Opcode = 0x24
	UCSendOnlyImm      Opcode = 0x25
	UCRDMAWriteFirst   Opcode = 0x26
	UCRDMAWriteMiddle  Opcode = 0x27
	UCRDMAWriteLast    Opcode = 0x28
	UCRDMAWriteLastImm Opcode = 0x29
	UCRDMAWriteOnly    Opcode = 0x2A
	UCRDMAWriteOnlyImm Opcode = 0x2B
)

// Unreliable Datagram (UD) opcodes: single-packet sends only.
const (
	UDSendOnly    Opcode = 0x64
	UDSendOnlyImm Opcode = 0x65
)

// CNP is the RoCEv2 Congestion Notification Packet (Annex A17.9.3): BTH with
// BECN set, then 16 reserved bytes. Linux's IB_OPCODE_CNP (0x80) is not what
// NICs send; ConnectX sends 0x81.
const CNP Opcode = 0x81

// Transport is the service an opcode belongs to, from its top three bits.
type Transport uint8

// Transports by opcode prefix. RD and XRC are named so that tools can say
// what they saw; softrnic implements neither.
const (
	TransportRC      Transport = 0 // 0x00-0x1F
	TransportUC      Transport = 1 // 0x20-0x3F
	TransportRD      Transport = 2 // 0x40-0x5F
	TransportUD      Transport = 3 // 0x60-0x7F
	TransportCNP     Transport = 4 // 0x80-0x9F
	TransportXRC     Transport = 5 // 0xA0-0xBF
	TransportVendor6 Transport = 6 // 0xC0-0xDF, manufacturer specific
	TransportVendor7 Transport = 7 // 0xE0-0xFF, manufacturer specific
)

var transportNames = [8]string{"RC", "UC", "RD", "UD", "CNP", "XRC", "VENDOR6", "VENDOR7"}

func (t Transport) String() string { return transportNames[t&7] }

// Ext is a set of extended transport headers, one bit per header kind.
type Ext uint16

// Extended header kinds. Their order on the wire is the opcode's business
// (FLUSH sends FETH before RETH); use Opcode.Offset to find one.
const (
	ExtRETH         Ext = 1 << iota // RDMA ETH: VA, R_Key, DMA length
	ExtAETH                         // ACK ETH: syndrome, MSN
	ExtDETH                         // Datagram ETH: Q_Key, source QP
	ExtImmDt                        // immediate data
	ExtIETH                         // invalidate ETH: R_Key to invalidate
	ExtAtomicETH                    // atomic ETH: VA, R_Key, swap/add, compare
	ExtAtomicAckETH                 // atomic ACK ETH: original remote data
	ExtFETH                         // flush ETH: placement type, selectivity
	ExtCNPReserved                  // the 16 reserved bytes of a CNP
	numExt          = iota
)

// extLens is each header's size, indexed by bit number.
var extLens = [numExt]uint8{RETHLen, AETHLen, DETHLen, ImmDtLen, IETHLen, AtomicETHLen, AtomicAckETHLen, FETHLen, CNPReservedLen}

var extNames = [numExt]string{"RETH", "AETH", "DETH", "ImmDt", "IETH", "AtomicETH", "AtomicAckETH", "FETH", "CNPReserved"}

// Has reports whether every header in h is in e.
func (e Ext) Has(h Ext) bool { return e&h == h && h != 0 }

// String lists the headers, e.g. "RETH|ImmDt".
func (e Ext) String() string {
	if e == 0 {
		return "none"
	}
	s := ""
	for i := 0; i < numExt; i++ {
		if e&(1<<i) != 0 {
			if s != "" {
				s += "|"
			}
			s += extNames[i]
		}
	}
	return s
}

// Len is the number of bytes the headers in e occupy.
func (e Ext) Len() int {
	n := 0
	for i := 0; i < numExt; i++ {
		if e&(1<<i) != 0 {
			n += int(extLens[i])
		}
	}
	return n
}

// opFlags describe an opcode beyond its headers.
type opFlags uint32

const (
	fValid opFlags = 1 << iota
	fPayload
	fFirst
	fMiddle
	fLast
	fOnly
	fSend
	fWrite
	fReadReq
	fReadResp
	fAck
	fAtomic
	fAtomicAck
	fAtomicWrite
	fFlush
	fImm
	fInv
	fCNP
	fResponse // sent by a responder back to the requester
)

type opInfo struct {
	name   string
	flags  opFlags
	ext    Ext
	hdrLen uint8         // BTH + extended headers
	off    [numExt]uint8 // offset of each present header from the BTH start; 0 = absent
}

// opTable is the whole opcode table, indexed by opcode, built once at init
// so that every query is one indexed load.
var opTable [256]opInfo

func def(op Opcode, name string, flags opFlags, exts ...Ext) {
	in := opInfo{name: name, flags: flags | fValid, hdrLen: BTHLen}
	for _, e := range exts {
		for i := 0; i < numExt; i++ {
			if e == 1<<i {
				in.off[i] = in.hdrLen
				in.hdrLen += extLens[i]
			}
		}
		in.ext |= e
	}
	opTable[op] = in
}

func init() {
	// Sends and RDMA writes share their layout between RC and UC.
	for _, base := range []struct {
		t      Opcode
		prefix string
	}{{0x00, "RC_"}, {0x20, "UC_"}} {
		p, b := base.prefix, base.t
		def(b+0x00, p+"SEND_FIRST", fPayload|fSend|fFirst)
		def(b+0x01, p+"SEND_MIDDLE", fPayload|fSend|fMiddle)
		def(b+0x02, p+"SEND_LAST", fPayload|fSend|fLast)
		def(b+0x03, p+"SEND_LAST_WITH_IMMEDIATE", fPayload|fSend|fLast|fImm, ExtImmDt)
		def(b+0x04, p+"SEND_ONLY", fPayload|fSend|fOnly)
		def(b+0x05, p+"SEND_ONLY_WITH_IMMEDIATE", fPayload|fSend|fOnly|fImm, ExtImmDt)
		def(b+0x06, p+"RDMA_WRITE_FIRST", fPayload|fWrite|fFirst, ExtRETH)
		def(b+0x07, p+"RDMA_WRITE_MIDDLE", fPayload|fWrite|fMiddle)
		def(b+0x08, p+"RDMA_WRITE_LAST", fPayload|fWrite|fLast)
		def(b+0x09, p+"RDMA_WRITE_LAST_WITH_IMMEDIATE", fPayload|fWrite|fLast|fImm, ExtImmDt)
		def(b+0x0A, p+"RDMA_WRITE_ONLY", fPayload|fWrite|fOnly, ExtRETH)
		def(b+0x0B, p+"RDMA_WRITE_ONLY_WITH_IMMEDIATE", fPayload|fWrite|fOnly|fImm, ExtRETH, ExtImmDt)
	}
	def(RCRDMAReadRequest, "RC_RDMA_READ_REQUEST", fReadReq, ExtRETH)
	def(RCRDMAReadResponseFirst, "RC_RDMA_READ_RESPONSE_FIRST", fPayload|fReadResp|fFirst|fResponse, ExtAETH)
	def(RCRDMAReadResponseMiddle, "RC_RDMA_READ_RESPONSE_MIDDLE", fPayload|fReadResp|fMiddle|fResponse)
	def(RCRDMAReadResponseLast, "RC_RDMA_READ_RESPONSE_LAST", fPayload|fReadResp|fLast|fResponse, ExtAETH)
	def(RCRDMAReadResponseOnly, "RC_RDMA_READ_RESPONSE_ONLY", fPayload|fReadResp|fOnly|fResponse, ExtAETH)
	def(RCAcknowledge, "RC_ACKNOWLEDGE", fAck|fResponse, ExtAETH)
	def(RCAtomicAcknowledge, "RC_ATOMIC_ACKNOWLEDGE", fAtomicAck|fResponse, ExtAETH, ExtAtomicAckETH)
	def(RCCompareSwap, "RC_COMPARE_SWAP", fAtomic, ExtAtomicETH)
	def(RCFetchAdd, "RC_FETCH_ADD", fAtomic, ExtAtomicETH)
	def(RCSendLastInv, "RC_SEND_LAST_WITH_INVALIDATE", fPayload|fSend|fLast|fInv, ExtIETH)
	def(RCSendOnlyInv, "RC_SEND_ONLY_WITH_INVALIDATE", fPayload|fSend|fOnly|fInv, ExtIETH)
	def(RCFlush, "RC_FLUSH", fFlush, ExtFETH, ExtRETH)
	def(RCAtomicWrite, "RC_ATOMIC_WRITE", fPayload|fAtomicWrite, ExtRETH)
	def(UDSendOnly, "UD_SEND_ONLY", fPayload|fSend|fOnly, ExtDETH)
	def(UDSendOnlyImm, "UD_SEND_ONLY_WITH_IMMEDIATE", fPayload|fSend|fOnly|fImm, ExtDETH, ExtImmDt)
	def(CNP, "CNP", fCNP, ExtCNPReserved)
}

func (o Opcode) is(f opFlags) bool { return opTable[o].flags&f != 0 }

// Valid reports whether o is an opcode softrnic knows: every RC, UC and UD
// opcode of IBA 1.5 plus the RoCEv2 CNP. RD, XRC and vendor opcodes are not.
func (o Opcode) Valid() bool { return o.is(fValid) }

// String returns the opcode's IBA name as include/rdma/ib_pack.h spells it
// (RC_RDMA_WRITE_FIRST, UD_SEND_ONLY, CNP), or OPCODE_0xNN when unknown.
func (o Opcode) String() string {
	if n := opTable[o].name; n != "" {
		return n
	}
	const hex = "0123456789ABCDEF"
	return "OPCODE_0x" + string([]byte{hex[o>>4], hex[o&15]})
}

// GoString helps test failure messages.
func (o Opcode) GoString() string { return "bth.Opcode(0x" + strconv.FormatUint(uint64(o), 16) + ")" }

// Transport returns the service o belongs to, from its top three bits.
func (o Opcode) Transport() Transport { return Transport(o >> 5) }

// Headers returns the extended headers that follow the BTH for o (none for
// an unknown opcode).
func (o Opcode) Headers() Ext { return opTable[o].ext }

// HeaderLen is the BTH plus extended headers for o, in bytes; 0 for an
// unknown opcode, whose layout nobody can know.
func (o Opcode) HeaderLen() int { return int(opTable[o].hdrLen) }

// Offset returns where header h (a single Ext bit) starts, counted from the
// first byte of the BTH, or -1 when o does not carry it.
func (o Opcode) Offset(h Ext) int {
	in := &opTable[o]
	i := bits.TrailingZeros16(uint16(h))
	if h&(h-1) != 0 || i >= numExt || in.ext&h == 0 {
		return -1
	}
	return int(in.off[i])
}

// HasPayload reports whether o may carry payload after its headers (sends,
// writes, read responses, UD sends, atomic write). Requests such as READ,
// atomics and FLUSH, ACKs and CNPs never do.
func (o Opcode) HasPayload() bool { return o.is(fPayload) }

// IsFirst reports whether o is the first packet of a multi-packet message
// (SEND/WRITE/READ response FIRST).
func (o Opcode) IsFirst() bool { return o.is(fFirst) }

// IsMiddle reports whether o is a middle packet of a multi-packet message.
func (o Opcode) IsMiddle() bool { return o.is(fMiddle) }

// IsLast reports whether o is the last packet of a multi-packet message
// (LAST, LAST_WITH_*).
func (o Opcode) IsLast() bool { return o.is(fLast) }

// IsOnly reports whether o is a message in one packet (SEND/WRITE/READ
// response ONLY and their _WITH_* forms, UD sends).
func (o Opcode) IsOnly() bool { return o.is(fOnly) }

// StartsMessage reports whether o opens a new message at the receiver: a
// FIRST or ONLY, or a single-packet request (READ, atomics, FLUSH, atomic
// write). A packet that is neither continues a message (MIDDLE/LAST).
func (o Opcode) StartsMessage() bool {
	return o.is(fFirst | fOnly | fReadReq | fAtomic | fFlush | fAtomicWrite)
}

// EndsMessage reports whether o completes a message: a LAST or ONLY, or a
// single-packet request. The requester sets AckReq on such packets.
func (o Opcode) EndsMessage() bool {
	return o.is(fLast | fOnly | fReadReq | fAtomic | fFlush | fAtomicWrite)
}

// IsSend reports whether o is any SEND opcode, RC, UC or UD.
func (o Opcode) IsSend() bool { return o.is(fSend) }

// IsWrite reports whether o is any RDMA WRITE opcode, RC or UC (not
// ATOMIC_WRITE).
func (o Opcode) IsWrite() bool { return o.is(fWrite) }

// IsReadRequest reports whether o is RC_RDMA_READ_REQUEST.
func (o Opcode) IsReadRequest() bool { return o.is(fReadReq) }

// IsReadResponse reports whether o is any RC_RDMA_READ_RESPONSE opcode.
func (o Opcode) IsReadResponse() bool { return o.is(fReadResp) }

// IsAck reports whether o is RC_ACKNOWLEDGE (ACK, NAK or RNR NAK, told
// apart by the AETH).
func (o Opcode) IsAck() bool { return o.is(fAck) }

// IsAtomic reports whether o is RC_COMPARE_SWAP or RC_FETCH_ADD.
func (o Opcode) IsAtomic() bool { return o.is(fAtomic) }

// IsAtomicAck reports whether o is RC_ATOMIC_ACKNOWLEDGE.
func (o Opcode) IsAtomicAck() bool { return o.is(fAtomicAck) }

// IsAtomicWrite reports whether o is RC_ATOMIC_WRITE (8 bytes of payload
// written atomically).
func (o Opcode) IsAtomicWrite() bool { return o.is(fAtomicWrite) }

// IsFlush reports whether o is RC_FLUSH.
func (o Opcode) IsFlush() bool { return o.is(fFlush) }

// IsCNP reports whether o is the RoCEv2 congestion notification packet.
func (o Opcode) IsCNP() bool { return o.is(fCNP) }

// HasImm reports whether o carries an ImmDt header.
func (o Opcode) HasImm() bool { return o.is(fImm) }

// HasInv reports whether o carries an IETH (SEND_*_WITH_INVALIDATE).
func (o Opcode) HasInv() bool { return o.is(fInv) }

// IsResponse reports whether o travels from responder to requester (ACK,
// atomic ACK, read responses). Everything else valid except CNP is a
// request.
func (o Opcode) IsResponse() bool { return o.is(fResponse) }

// IsRequest reports whether o travels from requester to responder.
func (o Opcode) IsRequest() bool { return o.is(fValid) && !o.is(fResponse|fCNP) }

// family groups the opcodes that may make up one multi-packet message.
func (o Opcode) family() opFlags { return opTable[o].flags & (fSend | fWrite | fReadResp) }

// InMessage reports whether a packet with opcode o leaves a multi-packet
// message open (FIRST or MIDDLE), so that the next in-order packet of the
// same direction must continue it.
func (o Opcode) InMessage() bool { return o.is(fFirst | fMiddle) }

// Follows reports whether o may be the next in-order packet after prev on
// the same QP and direction (IBA C9-32, rxe check_op_seq): after a FIRST or
// MIDDLE only a MIDDLE or LAST of the same kind (send, RDMA write, read
// response) and transport; otherwise anything valid that starts a message.
// Use it for requests at the responder and for read responses at the
// requester; ACKs and CNPs are outside any sequence.
func (o Opcode) Follows(prev Opcode) bool {
	if !o.Valid() {
		return false
	}
	if prev.InMessage() {
		return o.is(fMiddle|fLast) && o.family() == prev.family() && o.Transport() == prev.Transport()
	}
	return !o.is(fMiddle | fLast)
}

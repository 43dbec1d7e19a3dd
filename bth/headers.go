package bth

import "encoding/binary"

// Header sizes in bytes.
const (
	BTHLen          = 12
	RETHLen         = 16
	AETHLen         = 4
	DETHLen         = 8
	ImmDtLen        = 4
	IETHLen         = 4
	AtomicETHLen    = 28
	AtomicAckETHLen = 8
	FETHLen         = 4
	CNPReservedLen  = 16 // reserved bytes after a CNP's BTH
	ICRCLen         = 4

	// MaxHeaderLen is the longest BTH+extended headers of any opcode
	// (BTH+AtomicETH), so a caller can size a header buffer statically.
	MaxHeaderLen = BTHLen + AtomicETHLen
)

// DefaultPKey is the full-membership default partition key. rxe drops every
// packet whose P_Key differs, so it is what softrnic sends.
const DefaultPKey = 0xFFFF

// GSIQKey is the Q_Key of the General Services Interface QP (QP1), which
// carries CM MADs.
const GSIQKey = 0x80010000

// QPNMask keeps the 24 bits of a QP number.
const QPNMask = 0xFFFFFF

// BTH is a view of the 12-byte Base Transport Header:
//
//	byte 0    OpCode
//	byte 1    SE(7) M(6) PadCnt(5:4) TVer(3:0)
//	bytes 2-3 P_Key
//	byte 4    FECN(7) BECN(6) reserved(5:0)
//	bytes 5-7 DestQP
//	byte 8    AckReq(7) reserved(6:0)
//	bytes 9-11 PSN
type BTH []byte

// Opcode returns the OpCode byte.
func (b BTH) Opcode() Opcode { return Opcode(b[0]) }

// SE is the solicited-event bit.
func (b BTH) SE() bool { return b[1]&0x80 != 0 }

// MigReq is the M bit (path migration state).
func (b BTH) MigReq() bool { return b[1]&0x40 != 0 }

// PadCount is the number of pad bytes (0-3) before the ICRC.
func (b BTH) PadCount() int { return int(b[1]>>4) & 3 }

// TVer is the transport header version; 0 is the only one defined.
func (b BTH) TVer() uint8 { return b[1] & 0x0F }

// PKey is the partition key.
func (b BTH) PKey() uint16 { return binary.BigEndian.Uint16(b[2:]) }

// FECN is the forward explicit congestion notification bit.
func (b BTH) FECN() bool { return b[4]&0x80 != 0 }

// BECN is the backward explicit congestion notification bit (set in CNPs).
func (b BTH) BECN() bool { return b[4]&0x40 != 0 }

// DestQP is the destination QP number (24 bits).
func (b BTH) DestQP() uint32 { return binary.BigEndian.Uint32(b[4:]) & QPNMask }

// AckReq asks the responder to acknowledge this packet.
func (b BTH) AckReq() bool { return b[8]&0x80 != 0 }

// PSN is the packet sequence number.
func (b BTH) PSN() PSN { return PSN(binary.BigEndian.Uint32(b[8:]) & PSNMask) }

// SetOpcode stores the OpCode.
func (b BTH) SetOpcode(o Opcode) { b[0] = byte(o) }

// SetSE sets or clears the solicited-event bit.
func (b BTH) SetSE(v bool) { b[1] = setBit(b[1], 0x80, v) }

// SetMigReq sets or clears the M bit.
func (b BTH) SetMigReq(v bool) { b[1] = setBit(b[1], 0x40, v) }

// SetPadCount stores PadCnt (n & 3).
func (b BTH) SetPadCount(n int) { b[1] = b[1]&^0x30 | byte(n&3)<<4 }

// SetTVer stores TVer (v & 15).
func (b BTH) SetTVer(v uint8) { b[1] = b[1]&^0x0F | v&0x0F }

// SetPKey stores the partition key.
func (b BTH) SetPKey(k uint16) { binary.BigEndian.PutUint16(b[2:], k) }

// SetFECN sets or clears FECN.
func (b BTH) SetFECN(v bool) { b[4] = setBit(b[4], 0x80, v) }

// SetBECN sets or clears BECN.
func (b BTH) SetBECN(v bool) { b[4] = setBit(b[4], 0x40, v) }

// SetDestQP stores the destination QP number, keeping byte 4's bits.
func (b BTH) SetDestQP(qpn uint32) {
	_ = b[7]
	b[5], b[6], b[7] = byte(qpn>>16), byte(qpn>>8), byte(qpn)
}

// SetAckReq sets or clears AckReq.
func (b BTH) SetAckReq(v bool) { b[8] = setBit(b[8], 0x80, v) }

// SetPSN stores the PSN, keeping byte 8's bits.
func (b BTH) SetPSN(p PSN) {
	_ = b[11]
	b[9], b[10], b[11] = byte(p>>16), byte(p>>8), byte(p)
}

func setBit(x, mask byte, v bool) byte {
	if v {
		return x | mask
	}
	return x &^ mask
}

// BTHFields is a BTH in struct form, for encoding.
type BTHFields struct {
	Opcode   Opcode
	SE       bool
	MigReq   bool
	PadCount int // 0-3
	TVer     uint8
	PKey     uint16
	FECN     bool
	BECN     bool
	DestQP   uint32
	AckReq   bool
	PSN      PSN
}

// Encode writes every field of f, reserved bits zero.
func (b BTH) Encode(f *BTHFields) {
	_ = b[11]
	b[0] = byte(f.Opcode)
	b1 := byte(f.PadCount&3)<<4 | f.TVer&0x0F
	if f.SE {
		b1 |= 0x80
	}
	if f.MigReq {
		b1 |= 0x40
	}
	b[1] = b1
	binary.BigEndian.PutUint16(b[2:], f.PKey)
	b4 := byte(0)
	if f.FECN {
		b4 |= 0x80
	}
	if f.BECN {
		b4 |= 0x40
	}
	binary.BigEndian.PutUint32(b[4:], uint32(b4)<<24|f.DestQP&QPNMask)
	b8 := byte(0)
	if f.AckReq {
		b8 = 0x80
	}
	binary.BigEndian.PutUint32(b[8:], uint32(b8)<<24|uint32(f.PSN)&PSNMask)
}

// Fields decodes the view into a struct.
func (b BTH) Fields() BTHFields {
	return BTHFields{
		Opcode: b.Opcode(), SE: b.SE(), MigReq: b.MigReq(), PadCount: b.PadCount(),
		TVer: b.TVer(), PKey: b.PKey(), FECN: b.FECN(), BECN: b.BECN(),
		DestQP: b.DestQP(), AckReq: b.AckReq(), PSN: b.PSN(),
	}
}

// RETH is a view of the 16-byte RDMA Extended Transport Header: the remote
// virtual address, its R_Key and the DMA length of the whole request.
type RETH []byte

// VA is the remote virtual address.
func (r RETH) VA() uint64 { return binary.BigEndian.Uint64(r[0:]) }

// RKey is the remote key of the MR.
func (r RETH) RKey() uint32 { return binary.BigEndian.Uint32(r[8:]) }

// DMALen is the length of the whole RDMA operation in bytes.
func (r RETH) DMALen() uint32 { return binary.BigEndian.Uint32(r[12:]) }

// Encode stores all three fields.
func (r RETH) Encode(va uint64, rkey, dmaLen uint32) {
	_ = r[15]
	binary.BigEndian.PutUint64(r[0:], va)
	binary.BigEndian.PutUint32(r[8:], rkey)
	binary.BigEndian.PutUint32(r[12:], dmaLen)
}

// DETH is a view of the 8-byte Datagram Extended Transport Header (UD).
type DETH []byte

// QKey is the queue key the receiving UD QP checks.
func (d DETH) QKey() uint32 { return binary.BigEndian.Uint32(d[0:]) }

// SrcQP is the sender's QP number.
func (d DETH) SrcQP() uint32 { return binary.BigEndian.Uint32(d[4:]) & QPNMask }

// Encode stores the Q_Key and source QP, the reserved byte zero.
func (d DETH) Encode(qkey, srcQP uint32) {
	_ = d[7]
	binary.BigEndian.PutUint32(d[0:], qkey)
	binary.BigEndian.PutUint32(d[4:], srcQP&QPNMask)
}

// ImmDt is a view of the 4-byte immediate data, opaque to the transport and
// handed to the receiver's CQE as is (big-endian on the wire, as ibverbs'
// imm_data is a __be32).
type ImmDt []byte

// Imm returns the immediate value as a big-endian number.
func (i ImmDt) Imm() uint32 { return binary.BigEndian.Uint32(i) }

// SetImm stores the immediate value.
func (i ImmDt) SetImm(v uint32) { binary.BigEndian.PutUint32(i, v) }

// IETH is a view of the 4-byte Invalidate Extended Transport Header.
type IETH []byte

// RKey is the R_Key the responder invalidates.
func (i IETH) RKey() uint32 { return binary.BigEndian.Uint32(i) }

// SetRKey stores the R_Key to invalidate.
func (i IETH) SetRKey(v uint32) { binary.BigEndian.PutUint32(i, v) }

// AtomicETH is a view of the 28-byte Atomic Extended Transport Header.
type AtomicETH []byte

// VA is the remote address of the 8-byte operand (must be 8-aligned).
func (a AtomicETH) VA() uint64 { return binary.BigEndian.Uint64(a[0:]) }

// RKey is the remote key of the MR.
func (a AtomicETH) RKey() uint32 { return binary.BigEndian.Uint32(a[8:]) }

// SwapAdd is the swap value (COMPARE_SWAP) or the addend (FETCH_ADD).
func (a AtomicETH) SwapAdd() uint64 { return binary.BigEndian.Uint64(a[12:]) }

// Compare is the compare value of COMPARE_SWAP (unused by FETCH_ADD).
func (a AtomicETH) Compare() uint64 { return binary.BigEndian.Uint64(a[20:]) }

// Encode stores all four fields.
func (a AtomicETH) Encode(va uint64, rkey uint32, swapAdd, compare uint64) {
	_ = a[27]
	binary.BigEndian.PutUint64(a[0:], va)
	binary.BigEndian.PutUint32(a[8:], rkey)
	binary.BigEndian.PutUint64(a[12:], swapAdd)
	binary.BigEndian.PutUint64(a[20:], compare)
}

// AtomicAckETH is a view of the 8-byte Atomic Acknowledge Extended Transport
// Header.
type AtomicAckETH []byte

// Orig is the remote data before the atomic operation.
func (a AtomicAckETH) Orig() uint64 { return binary.BigEndian.Uint64(a) }

// SetOrig stores the original remote data.
func (a AtomicAckETH) SetOrig(v uint64) { binary.BigEndian.PutUint64(a, v) }

// FETH is a view of the 4-byte Flush Extended Transport Header (IBA 1.5).
type FETH []byte

// PlacementType is bits 3:0 of the last byte: which persistence domain the
// flush reaches (1 global visibility, 2 persistence).
func (f FETH) PlacementType() uint8 { return f[3] & 0x0F }

// Selectivity is bits 5:4: 0 flush the range in the RETH, 1 the whole MR.
func (f FETH) Selectivity() uint8 { return f[3] >> 4 & 3 }

// Encode stores placement type and selectivity, the rest zero.
func (f FETH) Encode(placement, selectivity uint8) {
	_ = f[3]
	f[0], f[1], f[2] = 0, 0, 0
	f[3] = selectivity&3<<4 | placement&0x0F
}

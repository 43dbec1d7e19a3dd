package cm

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"time"
)

// MAD and CM wire constants (IBA 13.4 and 12.6).
const (
	// MADSize is the size of every MAD on QP1: a 24-byte common header and
	// 232 bytes of class data.
	MADSize = 256
	// MADHeaderSize is the size of the common MAD header.
	MADHeaderSize = 24
	// DataSize is the size of the CM message that follows the header.
	DataSize = MADSize - MADHeaderSize

	BaseVersion    = 1
	MgmtClassCM    = 0x07
	CMClassVersion = 2
	MethodSend     = 0x03

	// GSIQPN is the QP that carries CM MADs, GSIQKey its well-known Q_Key.
	GSIQPN  = 1
	GSIQKey = 0x80010000
)

// AttrID identifies the CM message a MAD carries.
type AttrID uint16

// CM attribute IDs (IBA table 104).
const (
	AttrClassPortInfo AttrID = 0x0001
	AttrREQ           AttrID = 0x0010
	AttrMRA           AttrID = 0x0011
	AttrREJ           AttrID = 0x0012
	AttrREP           AttrID = 0x0013
	AttrRTU           AttrID = 0x0014
	AttrDREQ          AttrID = 0x0015
	AttrDREP          AttrID = 0x0016
	AttrSIDRREQ       AttrID = 0x0017
	AttrSIDRREP       AttrID = 0x0018
	AttrLAP           AttrID = 0x0019
	AttrAPR           AttrID = 0x001A
)

var attrNames = map[AttrID]string{
	AttrClassPortInfo: "ClassPortInfo", AttrREQ: "REQ", AttrMRA: "MRA", AttrREJ: "REJ",
	AttrREP: "REP", AttrRTU: "RTU", AttrDREQ: "DREQ", AttrDREP: "DREP",
	AttrSIDRREQ: "SIDR_REQ", AttrSIDRREP: "SIDR_REP", AttrLAP: "LAP", AttrAPR: "APR",
}

func (a AttrID) String() string {
	if s, ok := attrNames[a]; ok {
		return s
	}
	return "AttrID(0x" + hex16(uint16(a)) + ")"
}

func hex16(v uint16) string {
	const d = "0123456789abcdef"
	return string([]byte{d[v>>12], d[v>>8&15], d[v>>4&15], d[v&15]})
}

// Errors of the MAD codec.
var (
	ErrShortMAD     = errors.New("cm: MAD shorter than 256 bytes")
	ErrNotCM        = errors.New("cm: MAD is not a CM (class 0x07, version 2) MAD")
	ErrBadMethod    = errors.New("cm: CM MAD method is not Send")
	ErrBadVersion   = errors.New("cm: MAD base version is not 1")
	ErrShortPrivate = errors.New("cm: private data shorter than the rdma_cm header")
	ErrBadCMAHeader = errors.New("cm: invalid rdma_cm private-data header")
)

// MAD is a view over a 256-byte management datagram: the payload of a UD
// SEND to QP1. Accessors assume len(m) >= MADSize, which ParseMAD checks.
type MAD []byte

// ParseMAD checks that b holds a whole CM MAD (base version 1, class CM,
// class version 2, method Send) and returns a view of its first 256 bytes.
// It never panics, whatever b holds.
func ParseMAD(b []byte) (MAD, error) {
	if len(b) < MADSize {
		return nil, ErrShortMAD
	}
	m := MAD(b[:MADSize:MADSize])
	switch {
	case m.BaseVersion() != BaseVersion:
		return nil, ErrBadVersion
	case m.MgmtClass() != MgmtClassCM || m.ClassVersion() != CMClassVersion:
		return nil, ErrNotCM
	case m.Method() != MethodSend:
		return nil, ErrBadMethod
	}
	return m, nil
}

func (m MAD) BaseVersion() uint8    { return m[0] }
func (m MAD) MgmtClass() uint8      { return m[1] }
func (m MAD) ClassVersion() uint8   { return m[2] }
func (m MAD) Method() uint8         { return m[3] }
func (m MAD) Status() uint16        { return binary.BigEndian.Uint16(m[4:]) }
func (m MAD) ClassSpecific() uint16 { return binary.BigEndian.Uint16(m[6:]) }

// TID is the transaction ID: the kernel CM keeps one TID for a whole
// REQ/REP/RTU exchange and another for DREQ/DREP.
func (m MAD) TID() uint64 { return binary.BigEndian.Uint64(m[8:]) }

func (m MAD) AttrID() AttrID { return AttrID(binary.BigEndian.Uint16(m[16:])) }

// AttrMod carries ECE vendor options on REQ/REP in recent kernels; 0
// otherwise.
func (m MAD) AttrMod() uint32 { return binary.BigEndian.Uint32(m[20:]) }

// Data is the 232-byte CM message after the header.
func (m MAD) Data() []byte { return m[MADHeaderSize:MADSize] }

// MADHeader holds the common header's fields.
type MADHeader struct {
	BaseVersion, MgmtClass, ClassVersion, Method uint8
	Status, ClassSpecific                        uint16
	TID                                          uint64
	AttrID                                       AttrID
	Reserved                                     uint16
	AttrMod                                      uint32
}

// Header decodes the common header.
func (m MAD) Header() MADHeader {
	return MADHeader{
		BaseVersion: m[0], MgmtClass: m[1], ClassVersion: m[2], Method: m[3],
		Status: m.Status(), ClassSpecific: m.ClassSpecific(), TID: m.TID(),
		AttrID: m.AttrID(), Reserved: binary.BigEndian.Uint16(m[18:]), AttrMod: m.AttrMod(),
	}
}

// SetHeader encodes h into the common header.
func (m MAD) SetHeader(h *MADHeader) {
	m[0], m[1], m[2], m[3] = h.BaseVersion, h.MgmtClass, h.ClassVersion, h.Method
	binary.BigEndian.PutUint16(m[4:], h.Status)
	binary.BigEndian.PutUint16(m[6:], h.ClassSpecific)
	binary.BigEndian.PutUint64(m[8:], h.TID)
	binary.BigEndian.PutUint16(m[16:], uint16(h.AttrID))
	binary.BigEndian.PutUint16(m[18:], h.Reserved)
	binary.BigEndian.PutUint32(m[20:], h.AttrMod)
}

// InitCM clears m and writes a CM Send header for attr with tid.
func (m MAD) InitCM(attr AttrID, tid uint64) {
	clear(m[:MADSize])
	m.SetHeader(&MADHeader{BaseVersion: BaseVersion, MgmtClass: MgmtClassCM,
		ClassVersion: CMClassVersion, Method: MethodSend, TID: tid, AttrID: attr})
}

// Timeout converts the IBA 5-bit time encoding (CM response timeout, local
// ACK timeout, packet life time, service timeout) to a duration:
// 4.096 µs × 2^t. Values above 31 are treated as 31.
func Timeout(t uint8) time.Duration {
	return 4096 * time.Nanosecond << min(t, 31)
}

// GID is a 128-bit port GID; on RoCEv2 it is the IP address, IPv4 as
// ::ffff:a.b.c.d.
type GID [16]byte

// Addr returns the GID as an IP address (IPv4-mapped GIDs unmapped).
func (g GID) Addr() netip.Addr { return netip.AddrFrom16(g).Unmap() }

// GIDFromAddr returns the RoCEv2 GID of an IP address.
func GIDFromAddr(a netip.Addr) GID { return GID(a.As16()) }

// Byte-level helpers. Bit positions follow iba.h: fields are counted from
// the most significant bit of the byte or word they sit in.

func get24(b []byte, off int) uint32 {
	return uint32(b[off])<<16 | uint32(b[off+1])<<8 | uint32(b[off+2])
}

func put24(b []byte, off int, v uint32) {
	b[off], b[off+1], b[off+2] = byte(v>>16), byte(v>>8), byte(v)
}

// getBits returns width bits of byte b[off] starting shift bits above bit 0.
func getBits(b []byte, off int, shift, width uint) uint8 {
	return b[off] >> shift & (1<<width - 1)
}

func putBits(b []byte, off int, shift, width uint, v uint8) {
	mask := byte(1<<width-1) << shift
	b[off] = b[off]&^mask | v<<shift&mask
}

func b2u(v bool) uint8 {
	if v {
		return 1
	}
	return 0
}

// MTUBytes converts an IB MTU enum (PathMTU of a REQ or QPAttr: 1=256 …
// 5=4096) to bytes, 0 for an invalid enum.
func MTUBytes(mtu uint8) int {
	if mtu < 1 || mtu > 5 {
		return 0
	}
	return 128 << mtu
}

// MTUEnum converts a path MTU in bytes to its IB enum: the largest IB MTU
// not above bytes (0 below 256).
func MTUEnum(bytes int) uint8 {
	for e := uint8(5); e >= 1; e-- {
		if MTUBytes(e) <= bytes {
			return e
		}
	}
	return 0
}

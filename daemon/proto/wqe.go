package proto

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/verbs"
)

// Ring entry layouts (little-endian). The rings carry the application's
// form of a work request (verbs.SendWR, verbs.RecvWR): the client encodes
// what it posts, the daemon decodes what it hands its device. A send slot
// is a 64-byte header then either SGEs (16 bytes each) or inline data:
//
//	0  ID u64
//	8  opcode u8, flags u8, SGE count u8, 0
//	12 immediate data or invalidated rkey u32
//	16 remote address u64
//	24 rkey u32
//	28 inline length u32
//	32 compare u64           | UD: remote QPN u32, Q_Key u32
//	40 swap/add u64          | UD: AH handle u32, 12 reserved
//	56 reserved
//
// A receive slot is ID u64, SGE count u8, 7 reserved bytes, then SGEs.
// A completion slot (CQESize) mirrors ib.WC:
//
//	0  ID u64
//	8  status u8, opcode u8, flags u8, is-receive u8
//	12 byte length u32
//	16 immediate u32
//	20 invalidated rkey u32
//	24 QPN u32
//	28 source QP u32
//	32 source IP [16] (UD receives; IPv4 as IPv4-mapped; zero = none)
const (
	sendHeader = 64
	recvHeader = 16
	sgeSize    = 16

	// CQESize is the completion ring's slot size.
	CQESize = 48
)

// SendSlotSize is the SQ ring slot size for a QP with these caps.
func SendSlotSize(c ib.QPCaps) int {
	n := int(c.MaxSendSGE) * sgeSize
	if int(c.MaxInline) > n {
		n = int(c.MaxInline)
	}
	return (sendHeader + n + 7) &^ 7
}

// RecvSlotSize is the RQ ring slot size for a QP with these caps.
func RecvSlotSize(c ib.QPCaps) int { return recvHeader + int(c.MaxRecvSGE)*sgeSize }

// PutSendWR encodes w into an SQ slot, with ah the client's handle of a UD
// WR's address handle. The caller has checked w against the QP's caps (SGE count, inline
// size); PutSendWR fails rather than overflow.
func PutSendWR(s []byte, w *verbs.SendWR, ah Handle) error {
	le := binary.LittleEndian
	le.PutUint64(s[0:], w.ID)
	s[8], s[9], s[10], s[11] = byte(w.Opcode), byte(w.Flags), 0, 0
	imm := w.Imm
	if w.Opcode == ib.SendWithInv {
		imm = w.InvRKey
	}
	le.PutUint32(s[12:], imm)
	le.PutUint64(s[16:], w.RemoteAddr)
	le.PutUint32(s[24:], w.RKey)
	le.PutUint32(s[28:], 0)
	if w.RemoteQPN != 0 || w.RemoteQKey != 0 || ah != 0 {
		le.PutUint32(s[32:], w.RemoteQPN)
		le.PutUint32(s[36:], w.RemoteQKey)
		le.PutUint32(s[40:], uint32(ah))
		clear(s[44:56])
	} else {
		le.PutUint64(s[32:], w.CompareAdd)
		le.PutUint64(s[40:], w.Swap)
	}
	if w.Flags&ib.Inline != 0 {
		if len(w.InlineData) > len(s)-sendHeader {
			return fmt.Errorf("proto: %d bytes of inline data exceed the slot", len(w.InlineData))
		}
		le.PutUint32(s[28:], uint32(len(w.InlineData)))
		copy(s[sendHeader:], w.InlineData)
		return nil
	}
	if len(w.SG) > (len(s)-sendHeader)/sgeSize || len(w.SG) > 255 {
		return fmt.Errorf("proto: %d SGEs exceed the slot", len(w.SG))
	}
	s[10] = byte(len(w.SG))
	putSGEs(s[sendHeader:], w.SG)
	return nil
}

// GetSendWR decodes an SQ slot into w, reusing w.SG's backing array (give it
// capacity MaxSendSGE for zero allocations) and pointing w.InlineData into
// the slot (valid until the slot is released), and returns a UD WR's
// address handle (the client's handle; w.AH is left nil). ud says how to read bytes 32..56. The slot comes from a
// client and is checked, never trusted.
func GetSendWR(s []byte, w *verbs.SendWR, ud bool) (Handle, error) {
	le := binary.LittleEndian
	var ah Handle
	if len(s) < sendHeader {
		return ah, fmt.Errorf("%w: send slot of %d bytes", ErrBadMessage, len(s))
	}
	w.ID = le.Uint64(s[0:])
	w.Opcode, w.Flags = ib.WROpcode(s[8]), ib.SendFlags(s[9])
	if !w.Opcode.Valid() {
		return ah, fmt.Errorf("%w: send opcode %d", ErrBadMessage, s[8])
	}
	w.Imm, w.InvRKey = le.Uint32(s[12:]), 0
	if w.Opcode == ib.SendWithInv {
		w.Imm, w.InvRKey = 0, le.Uint32(s[12:])
	}
	w.RemoteAddr = le.Uint64(s[16:])
	w.RKey = le.Uint32(s[24:])
	w.CompareAdd, w.Swap, w.RemoteQPN, w.RemoteQKey, w.AH = 0, 0, 0, 0, nil
	if ud {
		w.RemoteQPN = le.Uint32(s[32:])
		w.RemoteQKey = le.Uint32(s[36:])
		ah = Handle(le.Uint32(s[40:]))
	} else {
		w.CompareAdd = le.Uint64(s[32:])
		w.Swap = le.Uint64(s[40:])
	}
	w.SG, w.InlineData = w.SG[:0], nil
	if w.Flags&ib.Inline != 0 {
		n := le.Uint32(s[28:])
		if uint64(n) > uint64(len(s)-sendHeader) {
			return ah, fmt.Errorf("%w: inline length %d exceeds the slot", ErrBadMessage, n)
		}
		w.InlineData = s[sendHeader : sendHeader+int(n)]
		return ah, nil
	}
	var err error
	w.SG, err = getSGEs(s[sendHeader:], int(s[10]), w.SG)
	return ah, err
}

// PutRecvWR encodes w into an RQ slot.
func PutRecvWR(s []byte, w *verbs.RecvWR) error {
	if len(w.SG) > (len(s)-recvHeader)/sgeSize || len(w.SG) > 255 {
		return fmt.Errorf("proto: %d SGEs exceed the slot", len(w.SG))
	}
	binary.LittleEndian.PutUint64(s, w.ID)
	s[8] = byte(len(w.SG))
	putSGEs(s[recvHeader:], w.SG)
	return nil
}

// GetRecvWR decodes an RQ slot into w, reusing w.SG's backing array.
func GetRecvWR(s []byte, w *verbs.RecvWR) error {
	if len(s) < recvHeader {
		return fmt.Errorf("%w: receive slot of %d bytes", ErrBadMessage, len(s))
	}
	w.ID = binary.LittleEndian.Uint64(s)
	var err error
	w.SG, err = getSGEs(s[recvHeader:], int(s[8]), w.SG[:0])
	return err
}

func putSGEs(s []byte, sg []ib.SGE) {
	le := binary.LittleEndian
	for i, e := range sg {
		o := i * sgeSize
		le.PutUint64(s[o:], e.Addr)
		le.PutUint32(s[o+8:], e.Length)
		le.PutUint32(s[o+12:], e.LKey)
	}
}

func getSGEs(s []byte, n int, sg []ib.SGE) ([]ib.SGE, error) {
	if n > len(s)/sgeSize {
		return sg, fmt.Errorf("%w: %d SGEs exceed the slot", ErrBadMessage, n)
	}
	le := binary.LittleEndian
	for i := 0; i < n; i++ {
		o := i * sgeSize
		sg = append(sg, ib.SGE{Addr: le.Uint64(s[o:]), Length: le.Uint32(s[o+8:]), LKey: le.Uint32(s[o+12:])})
	}
	return sg, nil
}

// PutWC encodes a completion into a CQ slot.
func PutWC(s []byte, c *ib.WC) {
	le := binary.LittleEndian
	le.PutUint64(s[0:], c.ID)
	s[8], s[9], s[10], s[11] = byte(c.Status), byte(c.Opcode), byte(c.Flags), 0
	if c.IsRecv {
		s[11] = 1
	}
	le.PutUint32(s[12:], c.ByteLen)
	le.PutUint32(s[16:], c.Imm)
	le.PutUint32(s[20:], c.InvRKey)
	le.PutUint32(s[24:], c.QPN)
	le.PutUint32(s[28:], c.SrcQP)
	if c.SrcIP.IsValid() {
		a := c.SrcIP.As16()
		copy(s[32:48], a[:])
	} else {
		clear(s[32:48])
	}
}

// GetWC decodes a CQ slot.
func GetWC(s []byte, c *ib.WC) {
	le := binary.LittleEndian
	c.ID = le.Uint64(s[0:])
	c.Status, c.Opcode, c.Flags, c.IsRecv = ib.WCStatus(s[8]), ib.WCOpcode(s[9]), ib.WCFlags(s[10]), s[11] != 0
	c.ByteLen = le.Uint32(s[12:])
	c.Imm = le.Uint32(s[16:])
	c.InvRKey = le.Uint32(s[20:])
	c.QPN = le.Uint32(s[24:])
	c.SrcQP = le.Uint32(s[28:])
	c.SrcIP = netip.Addr{}
	if a := [16]byte(s[32:48]); a != ([16]byte{}) {
		c.SrcIP = netip.AddrFrom16(a).Unmap()
	}
}

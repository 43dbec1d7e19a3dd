package bth

import "encoding/binary"

// Selective repeat is softrnic's own extension of RC, used only between two
// softrnic QPs that both asked for it (transport/rc documents the
// negotiation). It needs two things on the wire:
//
//   - one bit of the BTH's Resv7 field (byte 8, bit 6, right after AckReq):
//     on a request it says "this requester reads selective
//     acknowledgements", on a response "this responder holds out-of-order
//     packets and its ACKs carry a SACKETH". Byte 8 is covered by the ICRC,
//     unlike byte 4 whose FECN/BECN/Resv6 bits the ICRC masks because
//     switches may rewrite them, so the bit cannot change in transit;
//   - the SACKETH, after the AETH of an RC ACKNOWLEDGE that has the bit.
//
// IBA leaves Resv7 zero on transmit; rdma_rxe never reads it (its header
// check looks at TVer, DestQP, the opcode's transport bits, the QP state,
// the addresses, P_Key and Q_Key) and includes it in the ICRC like any
// other bit. softrnic sets it only toward a peer it has reason to believe
// is softrnic, so rxe and ConnectX peers see exactly the IBA bytes.

// SRBit is the selective-repeat bit in BTH byte 8.
const SRBit = 0x40

// SR reports the selective-repeat bit (see SRBit).
func (b BTH) SR() bool { return b[8]&SRBit != 0 }

// SetSR sets or clears the selective-repeat bit, keeping AckReq and the PSN.
func (b BTH) SetSR(v bool) { b[8] = setBit(b[8], SRBit, v) }

// SACKETH sizes.
const (
	// SACKHeaderLen is the fixed part of a SACKETH: bitmap length, base
	// and receive window.
	SACKHeaderLen = 8
	// MaxSACKWords bounds the bitmap: 16 words describe 512 PSNs, the
	// selective-repeat window.
	MaxSACKWords = 16
	// MaxSACKLen is the longest SACKETH.
	MaxSACKLen = SACKHeaderLen + 4*MaxSACKWords
)

// SACKETH is a view of the selective acknowledgement softrnic appends to the
// AETH of an ACK whose BTH has SRBit:
//
//	byte 0     number of 32-bit bitmap words that follow (0..MaxSACKWords)
//	bytes 1-3  base PSN: the PSN bit 31 of the first word describes
//	bytes 4-5  receive window: how many PSNs from the one after the ACK's
//	           the requester may have outstanding (0: no limit stated)
//	bytes 6-7  reserved, zero
//	words      bitmap, big-endian; bit 31-i of word k set means the
//	           responder has PSN base+32k+i (received, in order or held)
//
// The ACK's own PSN and syndrome keep their IBA meaning (everything up to
// the PSN is acknowledged); the bitmap only adds what arrived beyond it.
// The window is the responder's share of its host's receive buffers
// (frames its NIC, or AF_XDP socket, can hold before it drops): many
// requesters sending into one host keep within it together.
type SACKETH []byte

// SACKLen is the length of a SACKETH with n bitmap words.
func SACKLen(n int) int { return SACKHeaderLen + 4*n }

// Words is the number of bitmap words the header announces.
func (s SACKETH) Words() int { return int(s[0]) }

// Base is the PSN described by the bitmap's first bit.
func (s SACKETH) Base() PSN { return PSN(binary.BigEndian.Uint32(s) & PSNMask) }

// Word returns bitmap word k (k < Words; the view must hold it).
func (s SACKETH) Word(k int) uint32 { return binary.BigEndian.Uint32(s[SACKHeaderLen+4*k:]) }

// Has reports whether the bitmap marks p as received; PSNs outside it are
// not.
func (s SACKETH) Has(p PSN) bool {
	d := uint32(p.Diff(s.Base()))
	if p.Diff(s.Base()) < 0 || d >= uint32(32*s.Words()) {
		return false
	}
	return s.Word(int(d/32))&(1<<(31-d%32)) != 0
}

// Valid reports whether the view is exactly one well-formed SACKETH: at most
// MaxSACKWords words, as many bytes as they take, reserved bytes zero.
func (s SACKETH) Valid() bool {
	return len(s) >= SACKHeaderLen && s.Words() <= MaxSACKWords && len(s) == SACKLen(s.Words()) && s[6] == 0 && s[7] == 0
}

// Window is the receive window in PSNs (0: none stated).
func (s SACKETH) Window() int { return int(binary.BigEndian.Uint16(s[4:])) }

// SetHeader stores the word count, base PSN and receive window (0: none).
func (s SACKETH) SetHeader(words int, base PSN, window int) {
	binary.BigEndian.PutUint32(s, uint32(words)<<24|uint32(base)&PSNMask)
	binary.BigEndian.PutUint16(s[4:], uint16(min(max(window, 0), 0xFFFF)))
	s[6], s[7] = 0, 0
}

// SetWord stores bitmap word k.
func (s SACKETH) SetWord(k int, w uint32) { binary.BigEndian.PutUint32(s[SACKHeaderLen+4*k:], w) }

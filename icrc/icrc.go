package icrc

import (
	"encoding/binary"
	"errors"
)

// Len is the size of the ICRC trailer.
const Len = 4

const (
	ipv4HdrLen = 20 // RoCEv2 peers (rxe) send no IPv4 options
	ipv6HdrLen = 40
	udpHdrLen  = 8
	bthLen     = 12
)

// seed is crc32.ChecksumIEEE of 8 bytes of 0xFF: the CRC state after the
// masked-LRH prefix, so that it never has to be hashed per packet. rxe's
// seed 0xdebb20e3 is this value's bitwise complement (it runs the raw,
// uninverted CRC).
const seed = 0x2144df1c

// Errors returned for packets the ICRC cannot be computed over.
var (
	// ErrTruncated: the packet is shorter than IP+UDP+BTH+ICRC.
	ErrTruncated = errors.New("icrc: packet too short for IP, UDP, BTH and ICRC")
	// ErrNotIP: the first nibble is neither 4 (with a 20-byte header) nor 6.
	ErrNotIP = errors.New("icrc: not an option-less IPv4 or an IPv6 header")
)

// Compute returns the ICRC of pkt, an IPv4 or IPv6 RoCEv2 datagram that
// starts at its IP header and ends with the 4-byte ICRC field (whose
// contents are ignored). pkt must be exactly the datagram: Ethernet padding
// beyond the IP length must already be cut off.
func Compute(pkt []byte) (uint32, error) {
	if len(pkt) < Len {
		return 0, ErrTruncated
	}
	return Begin(pkt[:len(pkt)-Len])
}

// Begin returns the CRC state over the first bytes of a packet that starts
// at its IP header: its IP, UDP and BTH headers masked, then whatever of
// the packet follows in p (extended headers, payload) as it is. The state
// goes on with Update and Copy over the rest of the packet, up to the
// ICRC field, and is then the ICRC (Put writes it). Building a frame, a
// sender passes the headers and gathers the payload with Copy, so the
// payload is read once; Compute is Begin over the whole packet.
func Begin(p []byte) (uint32, error) {
	if len(p) == 0 {
		return 0, ErrTruncated
	}
	var crc uint32
	var n int
	switch p[0] >> 4 {
	case 4:
		if p[0]&0x0F != 5 {
			return 0, ErrNotIP
		}
		n = ipv4HdrLen + udpHdrLen + bthLen
		if len(p) < n {
			return 0, ErrTruncated
		}
		crc = maskedHeaders(seed, p[:n], &maskV4)
	case 6:
		n = ipv6HdrLen + udpHdrLen + bthLen
		if len(p) < n {
			return 0, ErrTruncated
		}
		crc = maskedHeaders(seed, p[:n], &maskV6)
	default:
		return 0, ErrNotIP
	}
	return Update(crc, p[n:]), nil
}

// Put writes crc into the 4-byte ICRC field b, little-endian as RoCEv2
// puts it on the wire.
func Put(b []byte, crc uint32) { binary.LittleEndian.PutUint32(b, crc) }

// Stamp computes the ICRC of pkt (as for Compute) and writes it into the
// last four bytes, little-endian as RoCEv2 puts it on the wire.
func Stamp(pkt []byte) error {
	crc, err := Compute(pkt)
	if err != nil {
		return err
	}
	Put(pkt[len(pkt)-Len:], crc)
	return nil
}

// Verify reports whether the ICRC at the end of pkt is correct. A packet
// too short or not IP fails.
func Verify(pkt []byte) bool {
	crc, err := Compute(pkt)
	return err == nil && crc == binary.LittleEndian.Uint32(pkt[len(pkt)-Len:])
}

// Stored returns the ICRC carried in the last four bytes of pkt.
func Stored(pkt []byte) uint32 {
	if len(pkt) < Len {
		return 0
	}
	return binary.LittleEndian.Uint32(pkt[len(pkt)-Len:])
}

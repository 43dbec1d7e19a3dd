package icrc

import (
	"encoding/binary"
	"hash/crc32"
)

// Header masks as little-endian 64-bit words: a word of the packet's IP, UDP
// and BTH headers OR-ed with the matching mask word is what the ICRC covers.

// maskV4 covers IPv4(20) ‖ UDP(8) ‖ BTH(12) = 40 bytes: TOS (byte 1), TTL
// (8), header checksum (10, 11), UDP checksum (26, 27), BTH byte 4 (32).
var maskV4 = maskWords([]int{1, 8, 10, 11, 26, 27, 32}, 0)

// maskV6 covers IPv6(40) ‖ UDP(8) ‖ BTH(12) = 60 bytes: traffic class and
// flow label (low nibble of byte 0, bytes 1-3), hop limit (7), UDP checksum
// (46, 47), BTH byte 4 (52).
var maskV6 = maskWords([]int{1, 2, 3, 7, 46, 47, 52}, 0x0F)

// maskWords builds the word masks for a header region: the listed
// bytes all ones, byte 0 OR-ed with byte0.
func maskWords(ones []int, byte0 byte) [8]uint64 {
	var b [64]byte
	for _, i := range ones {
		b[i] = 0xFF
	}
	b[0] |= byte0
	var w [8]uint64
	for i := range w {
		w[i] = binary.LittleEndian.Uint64(b[8*i:])
	}
	return w
}

// tab8 holds the slicing-by-8 tables of the reflected IEEE polynomial.
var tab8 = func() (t [8][256]uint32) {
	t[0] = *crc32.IEEETable
	for i := 0; i < 256; i++ {
		c := t[0][i]
		for j := 1; j < 8; j++ {
			c = t[0][c&0xFF] ^ c>>8
			t[j][i] = c
		}
	}
	return t
}()

// maskedHeaders continues the (finalised, as hash/crc32 keeps it) CRC crc
// over hdr with mask applied, without copying hdr. len(hdr) is 40 or 60:
// whole words go through slicing-by-8, a 4-byte tail one byte at a time.
func maskedHeaders(crc uint32, hdr []byte, mask *[8]uint64) uint32 {
	crc = ^crc
	i, k := 0, 0
	for ; i+8 <= len(hdr); i, k = i+8, k+1 {
		v := binary.LittleEndian.Uint64(hdr[i:]) | mask[k]
		crc ^= uint32(v)
		crc = tab8[0][byte(v>>56)] ^ tab8[1][byte(v>>48)] ^ tab8[2][byte(v>>40)] ^ tab8[3][byte(v>>32)] ^
			tab8[4][crc>>24] ^ tab8[5][byte(crc>>16)] ^ tab8[6][byte(crc>>8)] ^ tab8[7][byte(crc)]
	}
	if i < len(hdr) {
		m := mask[k]
		for ; i < len(hdr); i++ {
			crc = tab8[0][byte(crc)^(hdr[i]|byte(m))] ^ crc>>8
			m >>= 8
		}
	}
	return ^crc
}

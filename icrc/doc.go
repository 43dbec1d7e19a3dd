// Package icrc computes, stamps and verifies the RoCEv2 Invariant CRC.
//
// The ICRC is CRC-32/IEEE (the zlib and hash/crc32 CRC) over
//
//	8 bytes of 0xFF (standing in for InfiniBand's LRH)
//	‖ the IP header with its variant fields set to all ones
//	  (IPv4: TOS, TTL, header checksum; IPv6: traffic class, flow label, hop limit)
//	‖ the UDP header with its checksum set to 0xFFFF
//	‖ the BTH with byte 4 (FECN, BECN, reserved) set to 0xFF
//	‖ everything after the BTH up to the ICRC, pad included
//
// and is written after the packet little-endian. The masked fields are the
// ones switches may rewrite in flight (ECN marking sets FECN or the IP ECN
// bits, routers decrement TTL), so they are excluded from an end-to-end CRC.
//
// Nothing is copied: the 40 bytes of IP, UDP and BTH headers (60 for IPv6)
// are read as 64-bit words, OR-ed with a constant mask and folded into the
// CRC eight bytes at a time (mask.go); the CRC then continues over the rest
// of the packet in place. (Masking a stack copy and handing it to
// crc32.Update would be simpler, but the copy escapes to the heap because
// crc32 dispatches through a function variable.)
//
// A sender builds the ICRC as it builds the frame: Begin over the headers,
// Copy for each piece of payload it gathers from memory (the copy and the
// CRC read the payload once), Pad, Put. On amd64 with AVX-512 the payload
// runs through a carry-less multiply loop that folds 256 bytes a round
// (fold_amd64.s), copying as it goes; elsewhere, and for the last bytes,
// through hash/crc32.
package icrc

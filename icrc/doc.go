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
// of the packet in place with crc32.Update, which on amd64 and arm64 uses
// carry-less multiplication. (Masking a stack copy and handing it to
// crc32.Update would be simpler, but the copy escapes to the heap because
// crc32 dispatches through a function variable.)
package icrc

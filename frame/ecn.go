package frame

// ECN codepoints of the IP header's two low TOS / traffic-class bits.
const (
	NotECT = 0 // not ECN-capable
	ECT1   = 1
	ECT0   = 2
	CE     = 3 // congestion experienced
)

// ECNCapable reports whether b is an IP frame (Ethernet, at most one VLAN
// tag) in ECT(0) or ECT(1): one a congested switch would mark CE.
func ECNCapable(b []byte) bool {
	ip, v6 := ipOffset(b)
	if ip < 0 {
		return false
	}
	ecn := b[ip+1] & 3
	if v6 {
		ecn = b[ip+1] >> 4 & 3
	}
	return ecn == ECT0 || ecn == ECT1
}

// MarkCE marks an ECN-capable IP frame (Ethernet, at most one VLAN tag,
// IPv4 or IPv6) Congestion Experienced, as a switch whose queue is over
// its threshold does, and reports whether it did: a frame that is not
// ECN-capable, or is marked already, or carries no whole IP header is
// left alone. An IPv4 header's checksum is recomputed; the ICRC does not
// cover the ECN bits, so it stays valid.
func MarkCE(b []byte) bool {
	ip, v6 := ipOffset(b)
	if ip < 0 {
		return false
	}
	var ecn byte
	if v6 {
		ecn = b[ip+1] >> 4 & 3
	} else {
		ecn = b[ip+1] & 3
	}
	if ecn == NotECT || ecn == CE {
		return false
	}
	if v6 {
		b[ip+1] |= CE << 4
	} else {
		b[ip+1] |= CE
		IPv4(b[ip:]).SetChecksum()
	}
	return true
}

// ipOffset returns the offset of a frame's IP header (after at most one
// VLAN tag) and whether it is IPv6, or -1 if the frame carries neither a
// whole IPv4 nor a whole IPv6 header.
func ipOffset(b []byte) (int, bool) {
	if len(b) < 14 {
		return -1, false
	}
	off, et := 14, uint16(b[12])<<8|uint16(b[13])
	if et == 0x8100 && len(b) >= 18 {
		off, et = 18, uint16(b[16])<<8|uint16(b[17])
	}
	switch {
	case et == 0x0800 && len(b) >= off+20 && b[off]>>4 == 4 && b[off]&0x0F >= 5 && len(b) >= off+int(b[off]&0x0F)*4:
		return off, false
	case et == 0x86DD && len(b) >= off+40 && b[off]>>4 == 6:
		return off, true
	}
	return -1, false
}

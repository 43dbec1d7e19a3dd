package frame

import "testing"

// MarkCE marks ECT frames CE (IPv4 with a valid checksum after), and
// leaves alone what a switch would not mark.
func TestMarkCE(t *testing.T) {
	const dscp = 26
	v4 := func(ecn byte) []byte {
		b := make([]byte, 14+IPv4Len)
		b[12], b[13] = 0x08, 0x00
		ip := IPv4(b[14:])
		ip[0], ip[1], ip[8], ip[9] = 0x45, dscp<<2|ecn, 64, 17
		ip.SetChecksum()
		return b
	}
	for _, c := range []struct {
		ecn     byte
		capable bool
	}{{NotECT, false}, {ECT1, true}, {ECT0, true}, {CE, false}} {
		b := v4(c.ecn)
		if ECNCapable(b) != c.capable || MarkCE(b) != c.capable {
			t.Errorf("ECN %d: capable %v", c.ecn, ECNCapable(b))
		}
		ip := IPv4(b[14:])
		want := c.ecn
		if c.capable {
			want = CE
		}
		if ip.ECN() != want || ip.TOS()>>2 != dscp || !ip.ChecksumValid() {
			t.Errorf("ECN %d: after MarkCE TOS %#x, checksum valid %v", c.ecn, ip.TOS(), ip.ChecksumValid())
		}
	}
	b6 := make([]byte, 14+40)
	b6[12], b6[13] = 0x86, 0xDD
	b6[14], b6[15] = 0x60, ECT0<<4
	if !MarkCE(b6) || IPv6(b6[14:]).ECN() != CE {
		t.Errorf("IPv6: ECN %d", IPv6(b6[14:]).ECN())
	}
	if MarkCE(make([]byte, 20)) || ECNCapable(nil) {
		t.Error("a frame without an IP header marked")
	}
}

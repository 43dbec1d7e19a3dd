package icrc

import (
	"encoding/binary"
	"encoding/hex"
	"hash/crc32"
	"strings"
	"testing"

	"github.com/softrnic/softrnic/frame/frametest"
)

// cnpHex is the ConnectX-4 Lx CNP from ../shared/vectors/README.md.
const cnpHex = `e4 1d 2d ab 2b c2 7c fe 90 64 3b 32 08 00 45 c2 00 3c 71 8c 40 00 40 11 91 61 0a 00 11 01 0a 00
12 01 00 00 12 b7 00 28 00 00 81 00 ff ff 40 00 01 18 00 00 00 00 00 00 00 00 00 00 00 00 00 00
00 00 00 00 00 00 82 fd 00 2a`

func mustHex(s string) []byte {
	b, err := hex.DecodeString(strings.Join(strings.Fields(s), ""))
	if err != nil {
		panic(err)
	}
	return b
}

func TestSeed(t *testing.T) {
	ff := []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	if got := crc32.ChecksumIEEE(ff); got != seed {
		t.Fatalf("ChecksumIEEE(8×0xFF) = %#x, seed constant %#x", got, seed)
	}
}

func TestConnectXCNP(t *testing.T) {
	frame := mustHex(cnpHex)
	pkt := frame[14:]
	crc, err := Compute(pkt)
	if err != nil {
		t.Fatal(err)
	}
	if want := binary.LittleEndian.Uint32([]byte{0x82, 0xfd, 0x00, 0x2a}); crc != want {
		t.Fatalf("ICRC %#08x, want %#08x", crc, want)
	}
	if !Verify(pkt) {
		t.Fatal("Verify rejects the ConnectX CNP")
	}
	cp := append([]byte(nil), pkt...)
	copy(cp[len(cp)-4:], []byte{0, 0, 0, 0})
	if err := Stamp(cp); err != nil || string(cp) != string(pkt) {
		t.Fatalf("Stamp wrote % x", cp[len(cp)-4:])
	}
}

// roceDatagram finds the IP datagram of a RoCEv2 frame with a minimal,
// independent decoder (Ethernet, optional 802.1Q, IPv4/IPv6, UDP 4791), so
// that this package's tests do not rely on the frame parser.
func roceDatagram(f []byte) []byte {
	if len(f) < 14 {
		return nil
	}
	et, off := binary.BigEndian.Uint16(f[12:]), 14
	if et == 0x8100 && len(f) >= 18 {
		et, off = binary.BigEndian.Uint16(f[16:]), 18
	}
	p := f[off:]
	switch {
	case et == 0x0800 && len(p) >= 28 && p[9] == 17:
		n := int(binary.BigEndian.Uint16(p[2:]))
		if binary.BigEndian.Uint16(p[22:]) == 4791 && n <= len(p) {
			return p[:n]
		}
	case et == 0x86DD && len(p) >= 48 && p[6] == 17:
		n := 40 + int(binary.BigEndian.Uint16(p[4:]))
		if binary.BigEndian.Uint16(p[42:]) == 4791 && n <= len(p) {
			return p[:n]
		}
	}
	return nil
}

func TestCaptures(t *testing.T) {
	total := 0
	for _, c := range frametest.Captures(t) {
		n := 0
		for i, f := range c.Frames {
			pkt := roceDatagram(f)
			if pkt == nil {
				continue
			}
			n++
			if !Verify(pkt) {
				crc, err := Compute(pkt)
				t.Errorf("%s frame %d: ICRC %#08x (err %v), stored %#08x", c.Name, i+1, crc, err, Stored(pkt))
			}
		}
		if n == 0 {
			t.Errorf("%s: no RoCE frames", c.Name)
		}
		total += n
	}
	t.Logf("verified the ICRC of %d capture frames", total)
}

// maskedOffsets returns the offsets within pkt of the bytes and bits the
// ICRC ignores, as (offset, bitmask) pairs.
func maskedBits(pkt []byte) map[int]byte {
	m := map[int]byte{}
	var ip int
	if pkt[0]>>4 == 4 {
		ip = 20
		m[1] = 0xFF  // TOS
		m[8] = 0xFF  // TTL
		m[10] = 0xFF // checksum
		m[11] = 0xFF
	} else {
		ip = 40
		m[0] = 0x0F // traffic class high nibble
		m[1] = 0xFF // traffic class low nibble, flow label
		m[2] = 0xFF
		m[3] = 0xFF
		m[7] = 0xFF // hop limit
	}
	m[ip+6] = 0xFF // UDP checksum
	m[ip+7] = 0xFF
	m[ip+8+4] = 0xFF // BTH FECN, BECN, reserved
	return m
}

// TestSingleByteFlips: every single-bit flip of an invariant byte breaks the
// ICRC; every flip inside a masked field leaves it good. Run over one frame
// of each capture (the first RoCE frame) to keep it quick.
func TestSingleByteFlips(t *testing.T) {
	for _, c := range frametest.Captures(t) {
		for _, f := range c.Frames {
			pkt := roceDatagram(f)
			if pkt == nil {
				continue
			}
			pkt = append([]byte(nil), pkt...)
			masked := maskedBits(pkt)
			for off := 0; off < len(pkt)-Len; off++ {
				for bit := 0; bit < 8; bit++ {
					mask := byte(1) << bit
					pkt[off] ^= mask
					ok := Verify(pkt)
					pkt[off] ^= mask
					if want := masked[off]&mask != 0; ok != want {
						t.Fatalf("%s: flip byte %d bit %d: verify=%v, want %v", c.Name, off, bit, ok, want)
					}
				}
			}
			// Flips of the ICRC itself fail too.
			for off := len(pkt) - Len; off < len(pkt); off++ {
				pkt[off] ^= 0x01
				if Verify(pkt) {
					t.Fatalf("%s: ICRC byte %d flip still verifies", c.Name, off)
				}
				pkt[off] ^= 0x01
			}
			break
		}
	}
}

func TestBadInput(t *testing.T) {
	for _, p := range [][]byte{nil, {0x45}, make([]byte, 20+8+12+3), {0x46, 0, 0, 0}, append([]byte{0x55}, make([]byte, 60)...)} {
		if Verify(p) {
			t.Errorf("Verify(% x) = true", p)
		}
		if err := Stamp(p); err == nil {
			t.Errorf("Stamp(% x) succeeded", p)
		}
	}
	if Stored([]byte{1}) != 0 {
		t.Error("Stored on a short slice")
	}
}

func TestZeroAllocs(t *testing.T) {
	pkt := frameOfSize(1024, 4)
	if n := testing.AllocsPerRun(100, func() { _ = Stamp(pkt); _ = Verify(pkt) }); n != 0 {
		t.Fatalf("Stamp+Verify allocate %v times", n)
	}
}

// frameOfSize makes an IPv4 or IPv6 RoCE datagram of n bytes (headers,
// payload and ICRC) with a valid ICRC.
func frameOfSize(n int, ipVersion int) []byte {
	pkt := make([]byte, n)
	if ipVersion == 4 {
		pkt[0] = 0x45
		binary.BigEndian.PutUint16(pkt[2:], uint16(n))
		pkt[9] = 17
		binary.BigEndian.PutUint16(pkt[22:], 4791)
	} else {
		pkt[0] = 0x60
		binary.BigEndian.PutUint16(pkt[4:], uint16(n-40))
		pkt[6] = 17
		binary.BigEndian.PutUint16(pkt[42:], 4791)
	}
	for i := 70; i < n-4; i++ {
		pkt[i] = byte(i)
	}
	if err := Stamp(pkt); err != nil {
		panic(err)
	}
	return pkt
}

func benchICRC(b *testing.B, size, ipVersion int) {
	pkt := frameOfSize(size, ipVersion)
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if !Verify(pkt) {
			b.Fatal("bad ICRC")
		}
	}
}

// Frame sizes are IP datagrams: a 1 KiB and a 4 KiB packet.
func BenchmarkICRC1KiBIPv4(b *testing.B) { benchICRC(b, 1024, 4) }
func BenchmarkICRC4KiBIPv4(b *testing.B) { benchICRC(b, 4096, 4) }
func BenchmarkICRC1KiBIPv6(b *testing.B) { benchICRC(b, 1024, 6) }
func BenchmarkICRC4KiBIPv6(b *testing.B) { benchICRC(b, 4096, 6) }

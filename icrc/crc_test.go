package icrc

import (
	"bytes"
	"hash/crc32"
	"math/bits"
	"math/rand/v2"
	"testing"
)

// TestUpdateCopyMatchCRC32 holds Update and Copy to hash/crc32 for every
// length up to 5000 bytes, at every alignment of source and destination
// within a word, from random CRC states.
func TestUpdateCopyMatchCRC32(t *testing.T) {
	testUpdateCopy(t)
	if foldable(foldMin) > 0 {
		// And without the folding loops, as a CPU without them runs.
		defer func(f bool) { canFold = f }(canFold)
		canFold = false
		testUpdateCopy(t)
	}
}

func testUpdateCopy(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	src := make([]byte, 5000+64)
	for i := range src {
		src[i] = byte(r.Uint32())
	}
	dst := make([]byte, len(src)+64)
	for n := 0; n <= 5000; n++ {
		so, do := r.IntN(64), r.IntN(64)
		s := src[so : so+n]
		start := r.Uint32()
		want := crc32.Update(start, crc32.IEEETable, s)
		if got := Update(start, s); got != want {
			t.Fatalf("Update over %d bytes at +%d: %#x, want %#x", n, so, got, want)
		}
		clear(dst)
		if got := Copy(start, dst[do:], s); got != want {
			t.Fatalf("Copy of %d bytes +%d→+%d: %#x, want %#x", n, so, do, got, want)
		}
		if !bytes.Equal(dst[do:do+n], s) || !allZero(dst[:do]) || !allZero(dst[do+n:]) {
			t.Fatalf("Copy of %d bytes +%d→+%d wrote the wrong bytes", n, so, do)
		}
	}
}

func allZero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}

// FuzzCopy: Copy and Update agree with hash/crc32 on any input, split
// anywhere.
func FuzzCopy(f *testing.F) {
	f.Add(uint32(0), make([]byte, 300), 17)
	f.Add(uint32(0xFFFFFFFF), bytes.Repeat([]byte{0xA5}, 4096), 4000)
	f.Fuzz(func(t *testing.T, start uint32, data []byte, cut int) {
		if cut < 0 || cut > len(data) {
			cut = len(data) / 2
		}
		want := crc32.Update(start, crc32.IEEETable, data)
		dst := make([]byte, len(data))
		got := Copy(Update(start, data[:cut]), dst[cut:], data[cut:])
		if got != want || !bytes.Equal(dst[cut:], data[cut:]) {
			t.Fatalf("%d bytes cut at %d: %#x, want %#x", len(data), cut, got, want)
		}
	})
}

// TestFoldConstants derives the folding constants of fold_amd64.s: for a
// fold over D bits, x^(D+32) and x^(D-32) mod P, bit-reflected and shifted
// left by one; and x^64 mod P for the last step.
func TestFoldConstants(t *testing.T) {
	xpow := func(n int) uint64 {
		r := uint32(1)
		for i := 0; i < n; i++ {
			hi := r & 0x80000000
			r <<= 1
			if hi != 0 {
				r ^= 0x04C11DB7
			}
		}
		return uint64(bits.Reverse32(r)) << 1
	}
	for _, c := range []struct {
		d      int
		lo, hi uint64
	}{
		{2048, 0x11542778a, 0x1322d1430},
		{512, 0x154442bd4, 0x1c6e41596},
		{128, 0x1751997d0, 0x0ccaa009e},
	} {
		if lo, hi := xpow(c.d+32), xpow(c.d-32); lo != c.lo || hi != c.hi {
			t.Errorf("D=%d: %#x %#x, fold_amd64.s has %#x %#x", c.d, lo, hi, c.lo, c.hi)
		}
	}
	if k := xpow(64); k != 0x163cd6124 {
		t.Errorf("x^64: %#x", k)
	}
}

func BenchmarkUpdate4KiB(b *testing.B) {
	p := make([]byte, 4096)
	b.SetBytes(4096)
	for i := 0; i < b.N; i++ {
		Update(0, p)
	}
}

func BenchmarkCopy4KiB(b *testing.B) {
	p, d := make([]byte, 4096), make([]byte, 4096)
	b.SetBytes(4096)
	for i := 0; i < b.N; i++ {
		Copy(0, d, p)
	}
}

// BenchmarkCopyThenCRC32 is what Copy replaces: copy, then hash/crc32.
func BenchmarkCopyThenCRC32(b *testing.B) {
	p, d := make([]byte, 4096), make([]byte, 4096)
	b.SetBytes(4096)
	for i := 0; i < b.N; i++ {
		copy(d, p)
		crc32.Update(0, crc32.IEEETable, d)
	}
}

func BenchmarkCRC32Update4KiB(b *testing.B) {
	p := make([]byte, 4096)
	b.SetBytes(4096)
	for i := 0; i < b.N; i++ {
		crc32.Update(0, crc32.IEEETable, p)
	}
}

package icrc

import (
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

// TestMaskedHeadersMatchesCopy checks the word-wise masked CRC against the
// obvious method: mask a copy, run hash/crc32 over it.
func TestMaskedHeadersMatchesCopy(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, tc := range []struct {
		n    int
		mask *[8]uint64
		ones []int
		b0   byte
	}{
		{40, &maskV4, []int{1, 8, 10, 11, 26, 27, 32}, 0},
		{60, &maskV6, []int{1, 2, 3, 7, 46, 47, 52}, 0x0F},
	} {
		for iter := 0; iter < 1000; iter++ {
			hdr := make([]byte, tc.n)
			for i := range hdr {
				hdr[i] = byte(r.Uint32())
			}
			cp := append([]byte(nil), hdr...)
			for _, i := range tc.ones {
				cp[i] = 0xFF
			}
			cp[0] |= tc.b0
			start := r.Uint32()
			want := crc32.Update(start, crc32.IEEETable, cp)
			if got := maskedHeaders(start, hdr, tc.mask); got != want {
				t.Fatalf("n=%d: got %#x want %#x", tc.n, got, want)
			}
		}
	}
}

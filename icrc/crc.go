package icrc

import "hash/crc32"

// canFold says whether the folding loops (fold_amd64.s) run here.
var canFold = haveFold()

// foldMin is the shortest run the folding loops take: four 64-byte
// blocks start them.
const foldMin = 256

// foldable is how many of n bytes the folding loops take: a multiple of
// 16, from foldMin up, or none.
func foldable(n int) int {
	if !canFold || n < foldMin {
		return 0
	}
	return n &^ 15
}

// Update continues the CRC state crc (as Begin returns it) over p.
func Update(crc uint32, p []byte) uint32 {
	if n := foldable(len(p)); n > 0 {
		crc = ^foldUpdate(^crc, p[:n])
		p = p[n:]
	}
	return crc32.Update(crc, crc32.IEEETable, p)
}

// Copy copies src into dst, which must be at least as long, and continues
// the CRC state crc over the bytes copied: the copy and the CRC read src
// once, as a sender gathering a payload from memory into its frame wants.
func Copy(crc uint32, dst, src []byte) uint32 {
	dst = dst[:len(src)]
	if n := foldable(len(src)); n > 0 {
		crc = ^foldCopy(^crc, dst[:n], src[:n])
		dst, src = dst[n:], src[n:]
	}
	copy(dst, src)
	return crc32.Update(crc, crc32.IEEETable, dst)
}

// zeros is what Pad reads.
var zeros [3]byte

// Pad writes the n (0–3) zero pad bytes of a packet into b and continues
// crc over them.
func Pad(crc uint32, b []byte, n int) uint32 {
	if n == 0 {
		return crc
	}
	clear(b[:n])
	return crc32.Update(crc, crc32.IEEETable, zeros[:n])
}

//go:build !amd64

package icrc

import "hash/crc32"

// haveFold: other architectures leave every byte to hash/crc32, which
// uses their carry-less multiply where they have one.
func haveFold() bool { return false }

func foldUpdate(crc uint32, p []byte) uint32 { return ^crc32.Update(^crc, crc32.IEEETable, p) }

func foldCopy(crc uint32, dst, src []byte) uint32 {
	copy(dst, src)
	return foldUpdate(crc, src)
}

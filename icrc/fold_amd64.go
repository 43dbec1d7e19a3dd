package icrc

import "golang.org/x/sys/cpu"

// haveFold: the CPU folds 512-bit lanes with VPCLMULQDQ (AVX-512), which
// reads 256 bytes per round where hash/crc32's loop reads 64.
func haveFold() bool {
	return cpu.X86.HasAVX512F && cpu.X86.HasAVX512VPCLMULQDQ && cpu.X86.HasPCLMULQDQ && cpu.X86.HasSSE41
}

// foldUpdate continues the raw (uninverted) CRC-32 register crc over p,
// whose length is a multiple of 16 and at least foldMin.
//
//go:noescape
func foldUpdate(crc uint32, p []byte) uint32

// foldCopy is foldUpdate over src that also copies src into dst (as long).
//
//go:noescape
func foldCopy(crc uint32, dst, src []byte) uint32

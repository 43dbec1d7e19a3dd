package xsk

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// fakeMapping lays out a ring as the kernel does (indexes on their own cache
// lines, then the entries) in ordinary memory, so the ring protocol can be
// tested without privileges; the test plays the kernel's side.
func fakeMapping(size uint32, entry uint64) ([]byte, unix.XDPRingOffset) {
	off := unix.XDPRingOffset{Producer: 0, Consumer: 64, Flags: 128, Desc: 192}
	// Back the mapping with uint64s so the indexes are aligned for atomics.
	words := make([]uint64, (off.Desc+uint64(size)*entry)/8+1)
	mem := unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), len(words)*8)
	return mem, off
}

func setIndexes(mem []byte, off unix.XDPRingOffset, prod, cons uint32) {
	*(*uint32)(unsafe.Pointer(&mem[off.Producer])) = prod
	*(*uint32)(unsafe.Pointer(&mem[off.Consumer])) = cons
}

package shmring

import (
	"sync/atomic"
	"unsafe"
)

// atomicU64 is the 8-byte index at offset off of the shared header: both
// processes load and store it atomically.
func atomicU64(mem []byte, off int) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&mem[off]))
}

// atomicU32 is the 4-byte flag at offset off of the shared header.
func atomicU32(mem []byte, off int) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&mem[off]))
}

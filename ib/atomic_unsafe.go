package ib

import (
	"encoding/binary"
	"sync"
	"sync/atomic"
	"unsafe"
)

// atomicMu serialises atomics on operands that are not 8-byte aligned in Go
// memory (an MR whose iova and buffer address differ modulo 8); aligned
// operands use the CPU's atomic instructions and take no lock.
var atomicMu sync.Mutex

// CmpSwap compares the 8 bytes of s (host byte order, as an RNIC's atomic
// operand is) with cmp and stores swap if equal, returning the original
// value. s must be 8 bytes long.
func (s Seg) CmpSwap(cmp, swap uint64) uint64 {
	if s.x != nil {
		return s.x.CmpSwapExternal(s.va, cmp, swap)
	}
	b := s.b[:8]
	if uintptr(unsafe.Pointer(&b[0]))%8 == 0 {
		p := (*uint64)(unsafe.Pointer(&b[0]))
		for {
			old := atomic.LoadUint64(p)
			if old != cmp {
				return old
			}
			if atomic.CompareAndSwapUint64(p, old, swap) {
				return old
			}
		}
	}
	atomicMu.Lock()
	old := binary.NativeEndian.Uint64(b)
	if old == cmp {
		binary.NativeEndian.PutUint64(b, swap)
	}
	atomicMu.Unlock()
	return old
}

// FetchAdd adds add to the 8 bytes of s (host byte order) and returns the
// original value. s must be 8 bytes long.
func (s Seg) FetchAdd(add uint64) uint64 {
	if s.x != nil {
		return s.x.FetchAddExternal(s.va, add)
	}
	b := s.b[:8]
	if uintptr(unsafe.Pointer(&b[0]))%8 == 0 {
		return atomic.AddUint64((*uint64)(unsafe.Pointer(&b[0])), add) - add
	}
	atomicMu.Lock()
	old := binary.NativeEndian.Uint64(b)
	binary.NativeEndian.PutUint64(b, old+add)
	atomicMu.Unlock()
	return old
}

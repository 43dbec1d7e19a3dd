package rnic

import "unsafe"

// addrOf is the address of b's first byte in this process (0 for an empty
// slice): the virtual address ibv_reg_mr registers memory at.
func addrOf(b []byte) uint64 {
	if len(b) == 0 {
		return 0
	}
	return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b))))
}

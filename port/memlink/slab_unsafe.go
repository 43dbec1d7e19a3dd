package memlink

import "unsafe"

// slotOf returns the slot whose buffer starts where b does.
func (w *wire) slotOf(b []byte) (int32, bool) {
	if cap(b) == 0 || len(w.slab) == 0 {
		return 0, false
	}
	off := uintptr(unsafe.Pointer(unsafe.SliceData(b))) - uintptr(unsafe.Pointer(unsafe.SliceData(w.slab)))
	if off >= uintptr(len(w.slab)) || off%uintptr(w.maxFrame) != 0 {
		return 0, false
	}
	return int32(off / uintptr(w.maxFrame)), true
}

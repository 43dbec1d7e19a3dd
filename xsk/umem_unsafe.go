package xsk

import "unsafe"

// slotOf returns the transmit slot whose first byte b starts at.
func (s *Socket) slotOf(b []byte) (uint32, bool) {
	if cap(b) == 0 || len(s.umem) == 0 || s.txSlots.size == 0 {
		return 0, false
	}
	off := uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b))) - uintptr(unsafe.Pointer(unsafe.SliceData(s.umem))))
	t := &s.txSlots
	if off < t.base || off >= uint64(len(s.umem)) || (off-t.base)%t.size != 0 {
		return 0, false
	}
	k := (off - t.base) / t.size
	if k >= uint64(len(t.state)) {
		return 0, false
	}
	return uint32(k), true
}

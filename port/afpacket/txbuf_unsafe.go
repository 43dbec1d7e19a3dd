package afpacket

import "unsafe"

// bufOf returns the transmit buffer that starts where b does.
func (p *Port) bufOf(b []byte) (int32, bool) {
	if cap(b) == 0 || len(p.txSlab) == 0 {
		return 0, false
	}
	off := uintptr(unsafe.Pointer(unsafe.SliceData(b))) - uintptr(unsafe.Pointer(unsafe.SliceData(p.txSlab)))
	if off >= uintptr(len(p.txSlab)) || off%uintptr(p.maxFrame) != 0 {
		return 0, false
	}
	return int32(off / uintptr(p.maxFrame)), true
}

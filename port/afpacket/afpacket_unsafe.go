package afpacket

import (
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// slot returns slot i's header; its status word is shared with the kernel.
func (p *Port) slot(i int) *unix.Tpacket2Hdr {
	return (*unix.Tpacket2Hdr)(unsafe.Pointer(&p.ring[i*p.slotSize]))
}

// status is the slot's ownership word: the kernel publishes a frame by
// storing TP_STATUS_USER after writing it; we hand the slot back by storing
// TP_STATUS_KERNEL after we are done reading. Atomic accesses order the two.
func status(h *unix.Tpacket2Hdr) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&h.Status))
}

// sendmmsg sends the messages hdrs describe without blocking; it returns
// how many went, or the errno.
func sendmmsg(fd int, hdrs []unix.Mmsghdr) (int, unix.Errno) {
	r, _, e := unix.Syscall6(unix.SYS_SENDMMSG, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(hdrs))), uintptr(len(hdrs)), unix.MSG_DONTWAIT, 0, 0)
	return int(r), e
}

package main

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

const unsafeSizeofXDPStatistics = unsafe.Sizeof(unix.XDPStatistics{})

// getsockoptXDPStatistics is getsockopt(fd, SOL_XDP, XDP_STATISTICS),
// which x/sys/unix has no typed wrapper for.
func getsockoptXDPStatistics(fd int, st *unix.XDPStatistics, n *uint32) error {
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_XDP, unix.XDP_STATISTICS,
		uintptr(unsafe.Pointer(st)), uintptr(unsafe.Pointer(n)), 0)
	if e != 0 {
		return e
	}
	return nil
}

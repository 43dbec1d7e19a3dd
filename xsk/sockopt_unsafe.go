package xsk

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// setsockopt sets socket option name of level to *v, a value laid out as
// the kernel's struct (or integer) for it.
func setsockopt[T any](fd, level, name int, v *T) error {
	_, _, e := unix.Syscall6(unix.SYS_SETSOCKOPT, uintptr(fd), uintptr(level), uintptr(name), uintptr(unsafe.Pointer(v)), unsafe.Sizeof(*v), 0)
	if e != 0 {
		return e
	}
	return nil
}

// getsockopt reads socket option name of level into *v.
func getsockopt[T any](fd, level, name int, v *T) error {
	l := uint32(unsafe.Sizeof(*v))
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), uintptr(level), uintptr(name), uintptr(unsafe.Pointer(v)), uintptr(unsafe.Pointer(&l)), 0)
	if e != 0 {
		return e
	}
	return nil
}

// addrOf is the address of b's first byte, for the kernel. b is an mmap,
// which the Go runtime never moves.
func addrOf(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b)))) }

package daemon

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// detach replaces b's pages (a mapping of client memory) with private
// anonymous memory, atomically for any concurrent reader.
func detach(b []byte) error {
	_, err := unix.MmapPtr(-1, 0, unsafe.Pointer(unsafe.SliceData(b)), uintptr(len(b)),
		unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_FIXED)
	return err
}

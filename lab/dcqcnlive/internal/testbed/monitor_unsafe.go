package testbed

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// recv reads one frame: its length, the packet type (PACKET_HOST,
// PACKET_OUTGOING, ...) and the kernel's CLOCK_REALTIME timestamp in ns (0
// if there was none).
func (r *receiver) recv(fd int) (n int, pkttype uint8, realNs int64, err error) {
	r.hdr.Name = (*byte)(unsafe.Pointer(&r.name))
	r.hdr.Namelen = uint32(unsafe.Sizeof(r.name))
	oob := unsafe.Slice((*byte)(unsafe.Pointer(&r.oob[0])), 8*len(r.oob))
	r.hdr.Control = &oob[0]
	r.hdr.SetControllen(len(oob))
	r.hdr.Flags = 0
	got, _, e := unix.Syscall(unix.SYS_RECVMSG, uintptr(fd), uintptr(unsafe.Pointer(&r.hdr)), 0)
	if e != 0 {
		return 0, 0, 0, e
	}
	return int(got), r.name.Pkttype, timestampNs(oob[:r.hdr.Controllen]), nil
}

// timestampNs finds SCM_TIMESTAMPNS in control messages and returns it in
// ns, or 0. oob must be 8-byte aligned (the receiver's buffer is).
func timestampNs(oob []byte) int64 {
	const hdrLen = unix.SizeofCmsghdr
	for len(oob) >= hdrLen {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
		l := int(h.Len)
		if l < hdrLen || l > len(oob) {
			return 0
		}
		if h.Level == unix.SOL_SOCKET && h.Type == unix.SCM_TIMESTAMPNS && l >= hdrLen+int(unsafe.Sizeof(unix.Timespec{})) {
			ts := (*unix.Timespec)(unsafe.Pointer(&oob[hdrLen]))
			return ts.Nano()
		}
		step := (l + 7) &^ 7 // CMSG_ALIGN on 64-bit
		if step > len(oob) {
			return 0
		}
		oob = oob[step:]
	}
	return 0
}

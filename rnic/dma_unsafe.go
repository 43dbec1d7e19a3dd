package rnic

import (
	"math/bits"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The device's system calls on its clients' memory: pread and pwritev on
// a process's /proc/PID/mem (dma.go has the rest of the copy engine).

// iovec is one range of a pwritev.
type iovec = unix.Iovec

// Close closes the file. Every MR over the address space must have been
// deregistered first.
func (a *AddrSpace) Close() error { return unix.Close(a.fd) }

// read copies len(dst) bytes at va into dst, false on a fault.
func (m *extMem) read(dst []byte, va uint64) bool {
	a := m.as
	a.inflight.Add(1)
	defer a.inflight.Add(-1)
	if m.revoked.Load() {
		return false
	}
	s := &a.dev.Stats.DMAStats
	for len(dst) > 0 {
		n, err := unix.Pread(a.fd, dst, int64(va))
		s.DMAReadCalls++
		if err == unix.EINTR {
			continue
		}
		if err != nil || n <= 0 {
			return false
		}
		s.DMAReadBytes += uint64(n)
		dst, va = dst[n:], va+uint64(n)
	}
	return true
}

// dmaFlush writes every queued write: one pwritev per run of consecutive
// ranges of one address space.
func (d *Device) dmaFlush() {
	b := &d.dma
	s := &d.Stats.DMAStats
	for i := 0; i < len(b.w); {
		a := b.w[i].m.as
		a.inflight.Add(1)
		va := b.w[i].va
		end := va
		iov := b.iov[:0]
		j := i
		for ; j < len(b.w) && len(iov) < dmaMaxIOV; j++ {
			w := &b.w[j]
			if w.m.as != a || w.va != end {
				break
			}
			if w.m.revoked.Load() {
				if j == i {
					b.fault = true
					s.DMAFaults++
					j++
				}
				break
			}
			var v iovec
			v.Base = unsafe.SliceData(w.b)
			v.SetLen(len(w.b))
			iov = append(iov, v)
			end += uint64(len(w.b))
		}
		if len(iov) > 0 {
			s.DMAWriteRanges += uint64(len(iov))
			if !a.pwritev(iov, va, s) {
				b.fault = true
				s.DMAFaults++
			}
		}
		a.inflight.Add(-1)
		i = j
	}
	clear(b.w)
	b.w, b.used, b.lastArena = b.w[:0], 0, -1
	b.ra.b = nil // it may hold what was just written
}

// pwritev writes iov at va, false on a fault.
func (a *AddrSpace) pwritev(iov []iovec, va uint64, s *DMAStats) bool {
	for len(iov) > 0 {
		n, _, e := unix.Syscall6(unix.SYS_PWRITEV, uintptr(a.fd), uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)),
			uintptr(va), uintptr(va>>32>>(bits.UintSize-32)), 0)
		s.DMAWriteCalls++
		if e == unix.EINTR {
			continue
		}
		if e != 0 || n == 0 {
			return false
		}
		s.DMAWriteBytes += uint64(n)
		va += uint64(n)
		for n > 0 {
			if l := uintptr(iov[0].Len); n >= l {
				n -= l
				iov = iov[1:]
				continue
			}
			iov[0].Base = (*byte)(unsafe.Add(unsafe.Pointer(iov[0].Base), n))
			iov[0].Len -= uint64(n)
			n = 0
		}
	}
	return true
}

package rnic

import (
	"encoding/binary"
	"math/bits"
	"runtime"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/ib"
)

// AddrSpace is another process's address space, which the device reads and
// writes through a file descriptor of that process's /proc/PID/mem (the
// daemon receives it from the process itself): the memory of MRs
// registered with RegExternal. The device never maps it; it copies with
// pread and pwritev, so the process's memory may be anything it can
// address (heap, file and huge-page mappings, System V shared memory) and
// an unmapped range only makes a copy fail.
//
// The file pins the address space, not a process ID that could be reused:
// once the process has exited, every copy fails.
type AddrSpace struct {
	dev *Device
	fd  int
	// inflight counts the copies in progress, so that Dereg can wait
	// for them: a deregistered MR is never touched again.
	inflight atomic.Int32
}

// NewAddrSpace makes the address space reached through fd (opened for
// reading and writing), which the AddrSpace owns from now on.
func (d *Device) NewAddrSpace(fd int) *AddrSpace { return &AddrSpace{dev: d, fd: fd} }

// Close closes the file. Every MR over the address space must have been
// deregistered first.
func (a *AddrSpace) Close() error { return unix.Close(a.fd) }

// extMem is one MR's memory as an ib.External: the device's copies of
// that MR, which fail once it is deregistered.
type extMem struct {
	as      *AddrSpace
	revoked atomic.Bool
}

// revoke stops every access to the MR's memory and waits for the copies
// in progress in the address space, so that none reaches the memory
// after it returns (verbs.MR's Dereg).
func (m *extMem) revoke() {
	m.revoked.Store(true)
	for m.as.inflight.Load() != 0 {
		runtime.Gosched()
	}
}

// DMAStats count the device's copies to and from external memory (calls
// are system calls: a read, or a write of a run of consecutive ranges).
type DMAStats struct {
	DMAReadCalls   uint64
	DMAReadBytes   uint64
	DMAWriteCalls  uint64
	DMAWriteBytes  uint64
	DMAWriteRanges uint64 // ranges written (what the runs batched)
	DMAFaults      uint64 // copies that failed: the QP went to ERR
}

// Batching limits: writes queued per flush, iovecs per pwritev (the
// kernel's IOV_MAX), and the arena the queued writes are copied into.
const (
	dmaMaxWrites = 512
	dmaMaxIOV    = 1024
	dmaArena     = 256 << 10
	// dmaReadAhead bounds one read: the payload of the packets one QP
	// visit builds (txBudget of them at the largest MTU).
	dmaReadAhead = txBudget * 4096
)

// dmaWrite is one queued write.
type dmaWrite struct {
	m  *extMem
	va uint64
	b  []byte
}

// dmaBatch is the device's queue of writes to external memory. The step
// functions own it (one goroutine at a time); it is flushed once per QP
// visit, before the QP's completions are published (releaseEngine), and
// before any read or atomic, and when its arena is full.
type dmaBatch struct {
	w     []dmaWrite
	iov   []unix.Iovec
	arena []byte
	used  int
	// lastArena is where in the arena the last write's bytes start (-1:
	// the last write is not in the arena), so that the next one can join it.
	lastArena int
	fault     bool // a copy failed since the last check (dmaSettle)
	atom      [8]byte
	ra        readAhead
}

// readAhead is what a QP visit read of one external range beyond the
// packet that asked.
type readAhead struct {
	m   *extMem
	va  uint64
	b   []byte // the bytes at va (nil: none)
	buf []byte // dmaReadAhead bytes, b's storage
}

func (b *dmaBatch) pending() bool { return len(b.w) > 0 }

// ViewExternal implements ib.External: the n bytes at va, from what the
// QP visit read ahead for the packets before, else read with one pread of
// up to dmaReadAhead bytes of the range (avail). Read-ahead lives for one
// visit: the application may change its memory between visits (a buffer
// whose WR completed), never during one. A failed read gives zeros.
func (m *extMem) ViewExternal(va uint64, n, avail int) []byte {
	d := m.as.dev
	b := &d.dma
	if b.pending() {
		d.dmaFlush() // a read sees every earlier write
	}
	ra := &b.ra
	if ra.m == m && va >= ra.va && va+uint64(n) <= ra.va+uint64(len(ra.b)) {
		o := va - ra.va
		return ra.b[o : o+uint64(n)]
	}
	if ra.buf == nil {
		ra.buf = make([]byte, dmaReadAhead)
	}
	if n > len(ra.buf) {
		ra.buf = make([]byte, n) // larger than any packet: not the data path
	}
	ra.b = nil
	if want := max(n, min(avail, len(ra.buf))); want > n && m.read(ra.buf[:want], va) {
		ra.m, ra.va, ra.b = m, va, ra.buf[:want]
		return ra.b[:n]
	}
	// Just these bytes: the range may fail further on than this packet.
	v := ra.buf[:n]
	if !m.read(v, va) {
		clear(v)
		b.fault = true
		d.Stats.DMAFaults++
	}
	return v
}

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

// WriteExternal implements ib.External: the write is queued. Its bytes are
// copied into the batch's arena, where the writes of consecutive frames to
// consecutive addresses join into one range: the kernel's cost of a
// /proc/PID/mem write is per range far more than per byte (a page to
// bounce through, the address space to pin), and a copy is cheap.
func (m *extMem) WriteExternal(va uint64, src []byte) {
	if len(src) == 0 {
		return
	}
	d := m.as.dev
	b := &d.dma
	if b.w == nil {
		// The first write of the device: the batch's buffers, once.
		b.w = make([]dmaWrite, 0, dmaMaxWrites)
		b.iov = make([]unix.Iovec, 0, dmaMaxIOV)
		b.arena = make([]byte, dmaArena)
	}
	if len(b.w) == dmaMaxWrites || len(src) > len(b.arena)-b.used {
		d.dmaFlush()
	}
	if len(src) > len(b.arena) {
		// Larger than the arena (never a packet's): written at once.
		b.w = append(b.w, dmaWrite{m: m, va: va, b: src})
		d.dmaFlush()
		return
	}
	off := b.used
	copy(b.arena[off:], src)
	b.used += len(src)
	if n := len(b.w); n > 0 && b.lastArena >= 0 {
		p := &b.w[n-1]
		if p.m == m && p.va+uint64(len(p.b)) == va && b.lastArena+len(p.b) == off {
			p.b = b.arena[b.lastArena:b.used:b.used]
			return
		}
	}
	b.lastArena = off
	b.w = append(b.w, dmaWrite{m: m, va: va, b: b.arena[off:b.used:b.used]})
}

// CmpSwapExternal implements ib.External. The operation is atomic with
// respect to the device's other atomics (the engine runs them one at a
// time), not to the process's own CPU accesses: IBV_ATOMIC_HCA.
func (m *extMem) CmpSwapExternal(va, cmp, swap uint64) uint64 {
	return m.atomic(va, func(old uint64) uint64 {
		if old == cmp {
			return swap
		}
		return old
	})
}

// FetchAddExternal implements ib.External (see CmpSwapExternal).
func (m *extMem) FetchAddExternal(va, add uint64) uint64 {
	return m.atomic(va, func(old uint64) uint64 { return old + add })
}

func (m *extMem) atomic(va uint64, op func(uint64) uint64) uint64 {
	d := m.as.dev
	b := &d.dma
	if b.pending() {
		d.dmaFlush()
	}
	if !m.read(b.atom[:], va) {
		b.fault = true
		d.Stats.DMAFaults++
		return 0
	}
	old := binary.NativeEndian.Uint64(b.atom[:])
	if v := op(old); v != old {
		binary.NativeEndian.PutUint64(b.atom[:], v)
		m.WriteExternal(va, b.atom[:])
		d.dmaFlush()
	}
	return old
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
			var v unix.Iovec
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
func (a *AddrSpace) pwritev(iov []unix.Iovec, va uint64, s *DMAStats) bool {
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

// dmaSettle flushes the writes of the QP visit ending now and takes the
// fault flag: a copy of that visit failed.
func (d *Device) dmaSettle() bool {
	if d.dma.pending() {
		d.dmaFlush()
	}
	d.dma.ra.b = nil
	f := d.dma.fault
	d.dma.fault = false
	return f
}

// dmaFaulted marks the completions of a QP visit in which a copy failed,
// the QP's flush included: the device cannot tell which WRs the copy
// belonged to, so every one the visit completed reports LOC_PROT_ERR
// (its data may not have landed whole), and if there was none, the oldest
// WR flushed does, so that the application sees why the QP stopped.
func dmaFaulted(wcs []ib.WC) {
	marked := false
	for i := range wcs {
		if wcs[i].Status == ib.Success {
			wcs[i].Status = ib.LocProtErr
			marked = true
		}
	}
	for i := range wcs {
		if !marked && wcs[i].Status == ib.WRFlushErr {
			wcs[i].Status = ib.LocProtErr
			return
		}
	}
}

var _ ib.External = (*extMem)(nil)

package rnic

import (
	"encoding/binary"
	"runtime"
	"sync/atomic"

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
	// dmaReadFirst is a read's size before any stream has shown how much
	// a Transmit takes; dmaReadMin the least it shrinks to.
	dmaReadFirst = 16 << 10
	dmaReadMin   = 4 << 10
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
	iov   []iovec
	arena []byte
	used  int
	// lastArena is where in the arena the last write's bytes start (-1:
	// the last write is not in the arena), so that the next one can join it.
	lastArena int
	fault     bool // a copy failed since the last check (dmaSettle)
	atom      [8]byte
	ra        readAhead
}

// readAhead is what one Transmit read of one external range beyond the
// packet that asked.
type readAhead struct {
	m   *extMem
	va  uint64
	b   []byte // the bytes at va (nil: none)
	buf []byte // dmaReadAhead bytes, b's storage
	// gen is the device's completion count when b was read: a
	// completion published since may have handed a buffer in b back to
	// the application, which may then change it and post it again.
	gen uint64
	// limit bounds a read: the payload the frames Transmit may still
	// build for the QP it visits can carry (0: dmaReadAhead).
	limit int
	// used is how much of b the packets took; want is how much a read
	// takes (0: dmaReadFirst): doubled when a stream takes all of it and
	// asks for the bytes behind, cut to what was taken when a Transmit
	// ends (the QP's window, its pacing or the batch stopped it) with
	// bytes left unread by any packet.
	used, want int
}

func (b *dmaBatch) pending() bool { return len(b.w) > 0 }

// ViewExternal implements ib.External: the n bytes at va, from what
// this Transmit read ahead for the packets before, else read with one
// pread of as much of the range (avail) as the frames Transmit may still
// build carry, at most dmaReadAhead bytes. The read-ahead serves the
// visits of one Transmit, a QP's next round included, so that a stream
// reads each byte once in large preads, and it is dropped when the
// Transmit ends, when the device writes external memory, and when a
// completion is published: the memory of a WR the device has not
// completed is the device's to read, the application's again once it
// has (the next Transmit may follow a received READ request, which
// reads memory the application may have changed). A failed read gives
// zeros.
func (m *extMem) ViewExternal(va uint64, n, avail int) []byte {
	d := m.as.dev
	b := &d.dma
	if b.pending() {
		d.dmaFlush() // a read sees every earlier write
	}
	ra := &b.ra
	if ra.b != nil && ra.m == m && va >= ra.va && va+uint64(n) <= ra.va+uint64(len(ra.b)) &&
		ra.gen == d.completions.Load() && !m.revoked.Load() {
		o := va - ra.va
		ra.used = max(ra.used, int(o)+n)
		return ra.b[o : o+uint64(n)]
	}
	if ra.buf == nil {
		ra.buf = make([]byte, dmaReadAhead)
	}
	if n > len(ra.buf) {
		ra.buf = make([]byte, n) // larger than any packet: not the data path
	}
	if ra.want == 0 {
		ra.want = dmaReadFirst
	}
	if ra.b != nil && ra.m == m && va == ra.va+uint64(len(ra.b)) && ra.used == len(ra.b) {
		ra.want = min(2*ra.want, len(ra.buf)) // the stream took all: read more at once
	}
	ra.b = nil
	lim := min(len(ra.buf), ra.want)
	if ra.limit > 0 {
		lim = min(lim, ra.limit)
	}
	gen := d.completions.Load()
	if want := max(n, min(avail, lim)); want > n && m.read(ra.buf[:want], va) {
		ra.m, ra.va, ra.b, ra.gen, ra.used = m, va, ra.buf[:want], gen, n
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
		b.iov = make([]iovec, 0, dmaMaxIOV)
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

// dmaSettle flushes the writes of the QP visit ending now and takes the
// fault flag: a copy of that visit failed.
func (d *Device) dmaSettle() bool {
	if d.dma.pending() {
		d.dmaFlush()
	}
	f := d.dma.fault
	d.dma.fault = false
	return f
}

// dmaReadLimit bounds the next reads ahead to frames frames of up to mtu
// payload bytes each (Transmit, before each frame it builds).
func (d *Device) dmaReadLimit(frames, mtu int) { d.dma.ra.limit = frames * mtu }

// dmaEndTransmit drops the read-ahead as Transmit returns, and sizes the
// next reads to what this Transmit took of it.
func (d *Device) dmaEndTransmit() {
	ra := &d.dma.ra
	if ra.b != nil && ra.used < len(ra.b) {
		ra.want = max(ra.used, dmaReadMin)
	}
	ra.b = nil
	ra.limit = 0
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

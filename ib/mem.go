package ib

// Seg is one contiguous range of registered memory, as a work queue entry
// or a remote access names it.
//
// Transports reach memory only through Seg's methods and CopyIn/CopyOut,
// never through its bytes. A Seg is either local memory (the
// application's own in process, a memfd the daemon maps) or a range of
// memory the device reaches by copying (External: another process's
// address space). The transports cannot tell the two apart.
type Seg struct {
	b  []byte   // local memory
	x  External // external memory, or nil
	va uint64   // external: the address of the first byte
	n  int      // external: the length
}

// External is memory the device reaches by copying instead of by address:
// a range of another process's address space, read and written through a
// file descriptor of its /proc/PID/mem. The device implements it; a
// transport only ever calls it through a Seg, under the QP's lock, from
// the device's step functions.
//
// Reads happen at once: ViewExternal returns the n bytes at va, valid until
// the next call on the device; avail, the bytes of the Seg from va on (at
// least n), lets the device read ahead what the next packets of the same
// range will ask for. Writes may be queued: the device flushes them
// before it publishes the completion that covers them, and before any
// later read or atomic of the same QP. A failed access (the memory was
// unmapped, or the MR deregistered) is the device's to report: it errors
// the QP as a DMA error would; a failed read gives zeros.
type External interface {
	ViewExternal(va uint64, n, avail int) []byte
	WriteExternal(va uint64, src []byte)
	CmpSwapExternal(va, cmp, swap uint64) uint64
	FetchAddExternal(va, add uint64) uint64
}

// LocalSeg is the Seg of local memory b.
func LocalSeg(b []byte) Seg { return Seg{b: b} }

// ExternalSeg is the Seg of the n bytes at address va of x.
func ExternalSeg(x External, va uint64, n int) Seg { return Seg{x: x, va: va, n: n} }

// Len is the Seg's length in bytes.
func (s Seg) Len() int {
	if s.x != nil {
		return s.n
	}
	return len(s.b)
}

// Slice returns the part [off, off+n) of s; the caller has checked the
// bounds.
func (s Seg) Slice(off, n uint64) Seg {
	if s.x != nil {
		return Seg{x: s.x, va: s.va + off, n: int(n)}
	}
	return Seg{b: s.b[off : off+n : off+n]}
}

// ReadAt copies the bytes of s from offset off into dst and returns how
// many it copied (fewer than len(dst) only where s ends).
func (s Seg) ReadAt(dst []byte, off uint32) int {
	if s.x != nil {
		if int(off) >= s.n {
			return 0
		}
		k := min(len(dst), s.n-int(off))
		return copy(dst, s.x.ViewExternal(s.va+uint64(off), k, s.n-int(off)))
	}
	if int(off) >= len(s.b) {
		return 0
	}
	return copy(dst, s.b[off:])
}

// WriteAt copies src into s from offset off and returns how many bytes it
// stored (fewer than len(src) only where s ends).
func (s Seg) WriteAt(off uint32, src []byte) int {
	if s.x != nil {
		if int(off) >= s.n {
			return 0
		}
		k := min(len(src), s.n-int(off))
		s.x.WriteExternal(s.va+uint64(off), src[:k])
		return k
	}
	if int(off) >= len(s.b) {
		return 0
	}
	return copy(s.b[off:], src)
}

// CopyIn gathers bytes from sg starting at byte offset off into dst and
// returns how many were copied (less than len(dst) only if sg ends).
func CopyIn(dst []byte, sg []Seg, off uint32) int {
	n := 0
	o := off
	for _, s := range sg {
		if int(o) >= s.Len() {
			o -= uint32(s.Len())
			continue
		}
		n += s.ReadAt(dst[n:], o)
		o = 0
		if n == len(dst) {
			break
		}
	}
	return n
}

// Gather copies len(dst) bytes of sg, from byte offset off on, into dst
// through copyFn and returns what copyFn made of state, and how many bytes
// it copied (less than len(dst) only if sg ends). copyFn copies src into
// dst and folds the bytes into a running state: the device computes a
// frame's ICRC while it gathers the payload (icrc.Copy), reading the
// memory once.
func Gather(dst []byte, sg []Seg, off uint32, state uint32, copyFn func(state uint32, dst, src []byte) uint32) (uint32, int) {
	n := 0
	o := int(off)
	for _, s := range sg {
		l := s.Len()
		if o >= l {
			o -= l
			continue
		}
		k := min(l-o, len(dst)-n)
		var src []byte
		if s.x != nil {
			// Another address space: a view of what the device read
			// (ahead, for the packets after this one), copied and
			// folded here like local memory.
			src = s.x.ViewExternal(s.va+uint64(o), k, l-o)
		} else {
			src = s.b[o : o+k]
		}
		state = copyFn(state, dst[n:n+k], src)
		n += k
		o = 0
		if n == len(dst) {
			break
		}
	}
	return state, n
}

// CopyOut scatters src into sg starting at byte offset off and returns how
// many bytes were stored (less than len(src) only if sg ends).
func CopyOut(sg []Seg, off uint32, src []byte) int {
	n := 0
	o := off
	for _, s := range sg {
		if int(o) >= s.Len() {
			o -= uint32(s.Len())
			continue
		}
		n += s.WriteAt(o, src[n:])
		o = 0
		if n == len(src) {
			break
		}
	}
	return n
}

// Memory resolves the remote accesses of a responder. One Memory is bound
// to one QP, and so to its PD: an rkey of another PD is not found.
type Memory interface {
	// Resolve returns the n bytes at virtual address va of the MR named by
	// rkey, if that MR is in the QP's PD, is valid, grants access and
	// covers [va, va+n). The Seg is exactly n bytes long.
	Resolve(rkey uint32, va uint64, n uint64, access Access) (Seg, bool)
	// Invalidate invalidates the MR named by rkey (SEND_WITH_INV); false if
	// there is no such MR in the QP's PD.
	Invalidate(rkey uint32) bool
}

package ib

// Seg is one contiguous range of registered memory, as a work queue entry
// or a remote access names it.
//
// Transports reach memory only through Seg's methods and CopyIn/CopyOut,
// never through its bytes: today a Seg is always local memory (the
// application's own in process, a memfd the daemon maps), but a Seg may
// come to name a range of another process's address space that the device
// reads and writes with pread/pwrite on a file descriptor, its writes
// batched and flushed before the completion that covers them is published.
// Such a Seg changes the device, not the transports.
type Seg struct {
	b []byte
}

// LocalSeg is the Seg of local memory b.
func LocalSeg(b []byte) Seg { return Seg{b: b} }

// Len is the Seg's length in bytes.
func (s Seg) Len() int { return len(s.b) }

// Slice returns the part [off, off+n) of s; the caller has checked the
// bounds.
func (s Seg) Slice(off, n uint64) Seg { return Seg{b: s.b[off : off+n : off+n]} }

// ReadAt copies the bytes of s from offset off into dst and returns how
// many it copied (fewer than len(dst) only where s ends).
func (s Seg) ReadAt(dst []byte, off uint32) int {
	if int(off) >= len(s.b) {
		return 0
	}
	return copy(dst, s.b[off:])
}

// WriteAt copies src into s from offset off and returns how many bytes it
// stored (fewer than len(src) only where s ends).
func (s Seg) WriteAt(off uint32, src []byte) int {
	if int(off) >= len(s.b) {
		return 0
	}
	return copy(s.b[off:], src)
}

// CopyIn gathers bytes from sg starting at byte offset off into dst and
// returns how many were copied (less than len(dst) only if sg ends).
func CopyIn(dst []byte, sg []Seg, off uint32) int {
	n := 0
	o := int(off)
	for _, s := range sg {
		if o >= len(s.b) {
			o -= len(s.b)
			continue
		}
		n += copy(dst[n:], s.b[o:])
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
		if o >= len(s.b) {
			o -= len(s.b)
			continue
		}
		k := min(len(s.b)-o, len(dst)-n)
		state = copyFn(state, dst[n:n+k], s.b[o:o+k])
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
	o := int(off)
	for _, s := range sg {
		if o >= len(s.b) {
			o -= len(s.b)
			continue
		}
		n += copy(s.b[o:], src[n:])
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

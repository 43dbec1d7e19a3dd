package rnic

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"sync/atomic"

	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/verbs"
)

// MR is a memory region over caller memory (local memory, or a range of
// an AddrSpace).
type MR struct {
	pd     *PD
	mem    ib.Seg  // the whole region
	buf    []byte  // local memory; nil for external
	ext    *extMem // external memory; nil for local
	iova   uint64
	access ib.Access
	lkey   uint32
	rkey   uint32
	valid  atomic.Bool
}

// LKey is the local key used in scatter/gather entries.
func (m *MR) LKey() uint32 { return m.lkey }

// RKey is the key a peer names the MR with.
func (m *MR) RKey() uint32 { return m.rkey }

// IOVA is the virtual address of the MR's first byte.
func (m *MR) IOVA() uint64 { return m.iova }

// Len is the MR's length in bytes.
func (m *MR) Len() int { return m.mem.Len() }

// Bytes returns the registered memory (nil for an MR over an AddrSpace).
func (m *MR) Bytes() []byte { return m.buf }

// Valid reports whether the MR may still be used (not deregistered or
// invalidated by a SEND_WITH_INV).
func (m *MR) Valid() bool { return m.valid.Load() }

var _ verbs.MR = (*MR)(nil)

// RegMR registers bytes [off, off+n) of m at virtual address iova (0: their
// address in this process, as ibv_reg_mr uses the virtual address) with
// the given access (ibv_reg_mr_iova).
func (pd *PD) RegMR(m verbs.Mem, off, n int, iova uint64, access ib.Access) (verbs.MR, error) {
	b := m.Bytes()
	if off < 0 || n < 0 || off+n > len(b) {
		return nil, fmt.Errorf("rnic: register MR: [%d, %d) outside the %d-byte memory: %w", off, off+n, len(b), verbs.ErrInvalid)
	}
	return pd.RegBytes(b[off:off+n:off+n], iova, access)
}

// RegBytes registers buf at virtual address iova (0: buf's address) with
// the given access: RegMR for memory the caller has as a slice (the
// daemon's mappings of its clients' memory).
func (pd *PD) RegBytes(buf []byte, iova uint64, access ib.Access) (*MR, error) {
	if iova == 0 {
		iova = addrOf(buf)
	}
	return pd.register(&MR{pd: pd, mem: ib.LocalSeg(buf), buf: buf, iova: iova, access: access})
}

// RegExternal registers the n bytes at address addr of the address space
// a at virtual address iova with the given access. The caller has
// checked that the range is mapped in a and, for an access that writes,
// writable: the device's copies would otherwise write read-only pages
// (FOLL_FORCE) or fail.
func (pd *PD) RegExternal(a *AddrSpace, addr, n, iova uint64, access ib.Access) (*MR, error) {
	if a.dev != pd.dev {
		return nil, fmt.Errorf("rnic: register MR: the address space is another device's: %w", verbs.ErrInvalid)
	}
	if n > MaxMsgSize || addr+n < addr {
		return nil, fmt.Errorf("rnic: register MR: [%#x, +%d) out of range: %w", addr, n, verbs.ErrInvalid)
	}
	x := &extMem{as: a}
	return pd.register(&MR{pd: pd, mem: ib.ExternalSeg(x, addr, int(n)), ext: x, iova: iova, access: access})
}

// register checks m's access and range and gives it its keys.
func (pd *PD) register(m *MR) (*MR, error) {
	access, iova, n := m.access, m.iova, uint64(m.mem.Len())
	// IBA: remote write or atomic access requires local write.
	if !access.ValidForMR() {
		return nil, fmt.Errorf("rnic: register MR: access %#x (remote write or atomic needs local write): %w", uint32(access), verbs.ErrAccess)
	}
	if iova+n < iova {
		return nil, fmt.Errorf("rnic: register MR: [%#x, +%d) wraps the address space: %w", iova, n, verbs.ErrInvalid)
	}
	m.valid.Store(true)
	d := pd.dev
	d.keyMu.Lock()
	defer d.keyMu.Unlock()
	var err error
	if m.lkey, err = d.freshKey(); err != nil {
		return nil, err
	}
	d.keys.put(m.lkey, m)
	if m.rkey, err = d.freshKey(); err != nil {
		d.keys.remove(m.lkey)
		return nil, err
	}
	d.keys.put(m.rkey, m)
	return m, nil
}

// freshKey draws 32 random bits not in use (and not 0): keys must not be
// guessable from earlier ones, which a counter would be. Caller holds
// keyMu.
func (d *Device) freshKey() (uint32, error) {
	var b [4]byte
	for i := 0; i < 64; i++ {
		if _, err := rand.Read(b[:]); err != nil {
			return 0, err
		}
		k := binary.LittleEndian.Uint32(b[:])
		if k != 0 && d.keys.get(k) == nil {
			return k, nil
		}
	}
	return 0, verbs.ErrKeySpace
}

// Dereg deregisters the MR: its keys stop working at once, and the device
// copies no more of an external MR's memory once it returns (work that
// still names it then fails as a DMA error).
func (m *MR) Dereg() error {
	m.valid.Store(false)
	d := m.pd.dev
	d.keyMu.Lock()
	if d.keys.get(m.lkey) == m {
		d.keys.remove(m.lkey)
	}
	if d.keys.get(m.rkey) == m {
		d.keys.remove(m.rkey)
	}
	d.keyMu.Unlock()
	if m.ext != nil {
		m.ext.revoke()
	}
	return nil
}

// lookup returns the MR named by key if it is valid and in pd.
func (d *Device) lookup(key uint32, pd *PD) *MR {
	m := d.keys.get(key)
	if m == nil || m.pd != pd || !m.valid.Load() {
		return nil
	}
	return m
}

// slice returns [va, va+n) of m when it lies inside the MR.
func (m *MR) slice(va, n uint64) (ib.Seg, bool) {
	if va < m.iova || va+n < va || va+n > m.iova+uint64(m.mem.Len()) {
		return ib.Seg{}, false
	}
	return m.mem.Slice(va-m.iova, n), true
}

// qpMem is the transports' view of remote-accessible memory, bound to the
// QP's PD.
type qpMem struct{ q *QP }

// Resolve implements ib.Memory.
func (m qpMem) Resolve(rkey uint32, va, n uint64, access ib.Access) (ib.Seg, bool) {
	mr := m.q.dev.lookup(rkey, m.q.pd)
	if mr == nil || mr.rkey != rkey || mr.access&access != access {
		return ib.Seg{}, false
	}
	return mr.slice(va, n)
}

// Invalidate implements ib.Memory.
func (m qpMem) Invalidate(rkey uint32) bool {
	mr := m.q.dev.lookup(rkey, m.q.pd)
	if mr == nil || mr.rkey != rkey {
		return false
	}
	mr.valid.Store(false)
	return true
}

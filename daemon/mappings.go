package daemon

import (
	"math/bits"

	"golang.org/x/sys/unix"
)

// The MRs of one client over one memfd share the daemon's mappings of it:
// a mapping covers an aligned window of the file (shareWindow, or the
// whole file when smaller) and every later MR inside it uses it too, so
// that a client registering 100 000 MRs in one buffer costs the daemon a
// handful of mappings, not 100 000 of vm.max_map_count's 65 530. Mappings
// are the session's own: two clients never share one.

// shareWindow is the alignment and size of a shared mapping's window.
const shareWindow = 64 << 20

// fileKey names a file as fstat does.
type fileKey struct{ dev, ino uint64 }

// memfdMap is one mapping of a client's memfd.
type memfdMap struct {
	key  fileKey
	off  uint64 // file offset of mem[0]
	mem  []byte
	refs int // MRs in it (under the session's mu)
	held []charge
}

// grave is a mapping no MR uses any more, detached from the client's
// memory, waiting to be unmapped with what it was charged.
type grave struct {
	mem  []byte
	held []charge
}

// mapMemfd returns the bytes [off, off+n) of the client's memfd fd
// (sealed and at least off+n bytes long, as CheckSealed checked) in a
// mapping of the session's, shared if one covers them, else new and
// charged to the session (a mapping and its bytes). Caller holds ss.mu.
func (ss *session) mapMemfd(fd int, off, n uint64) (*memfdMap, []byte, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, nil, errf(unix.EINVAL, "MR memory: fstat: %v", err)
	}
	key := fileKey{st.Dev, st.Ino}
	for _, m := range ss.maps[key] {
		if off >= m.off && off+n <= m.off+uint64(len(m.mem)) {
			return m, m.mem[off-m.off : off-m.off+n : off-m.off+n], nil
		}
	}
	// Pages of the file: a huge-page memfd maps in huge pages.
	align := uint64(unix.Getpagesize())
	if b := uint64(st.Blksize); b > align && bits.OnesCount64(b) == 1 {
		align = b
	}
	size := (uint64(st.Size) + align - 1) &^ (align - 1)
	win := max(uint64(shareWindow), align)
	start, end := off&^(win-1), min((off+n+win-1)&^(win-1), size)
	held := []charge{{Mappings, 1}, {MRBytes, int64(end - start)}}
	if !ss.acct.tryTake(held...) {
		// The window is more than the MR needs: its pages alone may fit.
		start, end = off&^(align-1), (off+n+align-1)&^(align-1)
		held[1].n = int64(end - start)
		if err2 := ss.take(held...); err2 != nil {
			return nil, nil, err2
		}
	}
	mem, err := unix.Mmap(fd, int64(start), int(end-start), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		ss.give(held...)
		return nil, nil, errf(unix.ENOMEM, "mapping client memory: %v", err)
	}
	m := &memfdMap{key: key, off: start, mem: mem, held: held}
	ss.maps[key] = append(ss.maps[key], m)
	return m, mem[off-start : off-start+n : off-start+n], nil
}

// unrefMap drops an MR's reference to m; the last one detaches m from the
// client's memory at once and leaves it for buryGraves. Caller holds
// ss.mu.
func (ss *session) unrefMap(m *memfdMap) {
	if m.refs--; m.refs > 0 {
		return
	}
	list := ss.maps[m.key]
	for i, x := range list {
		if x == m {
			list = append(list[:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(ss.maps, m.key)
	} else {
		ss.maps[m.key] = list
	}
	if err := detach(m.mem); err != nil {
		// Not for want of mappings: the limits keep the daemon's below
		// vm.max_map_count, and a whole mapping replaced in place needs
		// no new one. If it still failed, the MRs are gone (no key
		// reaches the memory) and the mapping is unmapped with the
		// others once no QP of the session can hold a reference into it.
		ss.log.Error("detaching deregistered memory", "err", err)
	}
	ss.graves = append(ss.graves, grave{mem: m.mem, held: m.held})
}

// buryGraves unmaps detached mappings once the session has no QP and no
// SRQ: only the session's own QPs and SRQs (same PD) can hold resolved
// references into them (an SRQ's posted receives, which a QP created
// later would take).
// Caller holds ss.mu.
func (ss *session) buryGraves() {
	if ss.liveQPs != 0 || ss.liveSRQs != 0 {
		return
	}
	for _, g := range ss.graves {
		if err := unix.Munmap(g.mem); err != nil {
			ss.log.Error("unmapping deregistered memory", "err", err)
			continue
		}
		ss.give(g.held...)
	}
	ss.graves = nil
}

package daemon

import (
	"bytes"
	"fmt"
	"math/bits"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/daemon/proto"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/rnic"
)

// A client's own address space, for the MRs of stock applications, which
// register any memory they have (heap, file and huge-page mappings,
// System V segments) and which the daemon therefore cannot map. The
// client passes two files it opened itself: its /proc/self/mem, through
// which the device copies (rnic.AddrSpace), and its /proc/self/maps,
// against which a registration is checked. Both are bound to the address
// space they were opened on, not to a process ID that could be reused, and
// were opened with the client's own rights: the daemon gains no access the
// client did not have. Writes through /proc/PID/mem can write read-only
// pages (FOLL_FORCE), so the daemon enforces access itself: an MR that
// writes must be writable memory when registered (EFAULT otherwise, as
// pinning it for writing would fail), and the device writes only where an
// MR's access flags let it.
type addrSpaceObj struct {
	as   *rnic.AddrSpace
	maps int    // the client's /proc/PID/maps
	dir  string // "/proc/PID", as the daemon sees the files
	mu   sync.Mutex
	buf  []byte // maps as last read (under mu)
	refs int    // MRs over it (under the session's mu)
}

// procMagic is procfs' statfs f_type (PROC_SUPER_MAGIC).
const procMagic = 0x9fa0

// procFile checks that fd is a file of procfs named name, with the given
// access mode, and returns the directory it is in.
func procFile(fd int, name string, mode int) (string, error) {
	var st unix.Statfs_t
	if err := unix.Fstatfs(fd, &st); err != nil || st.Type != procMagic {
		return "", errf(unix.EINVAL, "the %s fd is not a file of /proc", name)
	}
	fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err != nil || fl&unix.O_ACCMODE != mode {
		return "", errf(unix.EBADF, "the %s fd is not open for %s", name, map[int]string{unix.O_RDWR: "reading and writing", unix.O_RDONLY: "reading"}[mode])
	}
	link, err := readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
	if err != nil || filepath.Base(link) != name {
		return "", errf(unix.EINVAL, "the %s fd is %q, not a /proc/PID/%s", name, link, name)
	}
	return filepath.Dir(link), nil
}

// readlink is readlink(2) of a short link.
func readlink(p string) (string, error) {
	b := make([]byte, 256)
	n, err := unix.Readlink(p, b)
	if err != nil {
		return "", err
	}
	return string(b[:n]), nil
}

// attachMem makes an address space of the two files the client passed
// (OpAttachMem), which it takes over.
func (ss *session) attachMem(body []byte, fds []int) (any, []int, error) {
	mem, maps := fds[0], fds[1]
	fail := func(err error) (any, []int, error) {
		unix.Close(mem)
		unix.Close(maps)
		return nil, nil, err
	}
	if len(body) != 0 {
		return fail(errf(unix.EINVAL, "ATTACH_MEM takes no body"))
	}
	dir, err := procFile(mem, "mem", unix.O_RDWR)
	if err != nil {
		return fail(err)
	}
	mdir, err := procFile(maps, "maps", unix.O_RDONLY)
	if err != nil {
		return fail(err)
	}
	if mdir != dir {
		return fail(errf(unix.EINVAL, "the mem and maps fds are of two processes (%s, %s)", dir, mdir))
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	h, err := ss.newHandle(true)
	if err != nil {
		return fail(err)
	}
	if err := ss.take(charge{FDs, addrSpaceFDs}); err != nil {
		return fail(err)
	}
	ss.spaces[h] = &addrSpaceObj{as: ss.s.dev.NewAddrSpace(mem), maps: maps, dir: dir}
	ss.log.Debug("address space attached", "proc", dir, "handle", h)
	return &proto.HandleMsg{Handle: h}, nil, nil
}

// regMRAddr registers memory of an attached address space (OpRegMRAddr).
func (ss *session) regMRAddr(body []byte) (any, []int, error) {
	var req proto.RegMRAddrReq
	if err := proto.DecodeBody(body, &req); err != nil {
		return nil, nil, err
	}
	if err := ss.checkMRReq(req.Access, req.Length, req.IOVA); err != nil {
		return nil, nil, err
	}
	if _, carry := bits.Add64(req.Addr, req.Length, 0); carry != 0 {
		return nil, nil, errf(unix.EFAULT, "[%#x, +%d) wraps the address space", req.Addr, req.Length)
	}
	ss.mu.Lock()
	p, okp := ss.pds[req.PD]
	a, oka := ss.spaces[req.Space]
	if okp && oka {
		p.refs++ // held across the check, which runs unlocked
		a.refs++
	}
	ss.mu.Unlock()
	switch {
	case !okp:
		return nil, nil, errf(unix.ENOENT, "no PD %d on this connection", req.PD)
	case !oka:
		return nil, nil, errf(unix.ENOENT, "no address space %d on this connection", req.Space)
	}
	unref := func() {
		ss.mu.Lock()
		p.refs--
		a.refs--
		ss.mu.Unlock()
	}
	if err := a.checkMapped(req.Addr, req.Length, req.Access&(ib.LocalWrite|ib.RemoteWrite|ib.RemoteAtomic) != 0); err != nil {
		unref()
		return nil, nil, err
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	p.refs--
	a.refs--
	// The memory is the client's own, reached by copies: it costs no
	// mapping, but counts in MRBytes as a memfd MR's mapping does.
	held := []charge{{MRs, 1}, {MRBytes, int64(req.Length)}}
	if err := ss.take(held...); err != nil {
		return nil, nil, err
	}
	mr, err := p.pd.RegExternal(a.as, req.Addr, req.Length, req.IOVA, req.Access)
	if err != nil {
		ss.give(held...)
		return nil, nil, err
	}
	h, _ := ss.newHandle(false)
	p.refs++
	a.refs++
	ss.mrs[h] = &mrObj{mr: mr, pd: p, space: a, length: int64(req.Length)}
	return &proto.RegMRResp{MR: h, LKey: mr.LKey(), RKey: mr.RKey()}, nil, nil
}

// checkMRReq checks what every registration checks: length, access flags,
// and an IOVA range that does not wrap.
func (ss *session) checkMRReq(access ib.Access, length, iova uint64) error {
	if length == 0 || length > ss.s.info.MaxMRSize {
		return errf(unix.EINVAL, "MR length %d out of range (1 to %d)", length, ss.s.info.MaxMRSize)
	}
	if access&^(ib.LocalWrite|ib.RemoteWrite|ib.RemoteRead|ib.RemoteAtomic) != 0 {
		return errf(unix.EINVAL, "unknown access flags %#x", uint32(access))
	}
	if access&(ib.RemoteWrite|ib.RemoteAtomic) != 0 && access&ib.LocalWrite == 0 {
		return errf(unix.EINVAL, "remote write or atomic access requires local write (as in verbs)")
	}
	if _, carry := bits.Add64(iova, length, 0); carry != 0 {
		return errf(unix.EINVAL, "MR wraps the address space")
	}
	return nil
}

// checkMapped checks that [addr, addr+n) is mapped readable, and writable
// if write, in the address space's current mappings: EFAULT otherwise.
func (a *addrSpaceObj) checkMapped(addr, n uint64, write bool) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.readMaps(); err != nil {
		return err
	}
	next, end := addr, addr+n
	for rest := a.buf; len(rest) > 0 && next < end; {
		line := rest
		if i := bytes.IndexByte(rest, '\n'); i >= 0 {
			line, rest = rest[:i], rest[i+1:]
		} else {
			rest = nil
		}
		lo, hi, perms, ok := parseMapsLine(line)
		if !ok || hi <= next {
			continue
		}
		if lo > next {
			break // a hole (the lines are in address order)
		}
		if perms[0] != 'r' || (write && perms[1] != 'w') {
			what := "readable"
			if write {
				what = "writable"
			}
			return errf(unix.EFAULT, "[%#x, %#x) is not %s (%s %s)", next, min(hi, end), what, perms, strings.TrimSpace(string(line[min(len(line), 73):])))
		}
		next = hi
	}
	if next < end {
		return errf(unix.EFAULT, "[%#x, %#x) is not mapped", next, end)
	}
	return nil
}

// readMaps reads the whole maps file into a.buf (under a.mu).
func (a *addrSpaceObj) readMaps() error {
	if a.buf == nil {
		a.buf = make([]byte, 0, 64<<10)
	}
	a.buf = a.buf[:0]
	for off := int64(0); ; {
		if len(a.buf) == cap(a.buf) {
			a.buf = append(a.buf, 0)[:len(a.buf)]
		}
		n, err := unix.Pread(a.maps, a.buf[len(a.buf):cap(a.buf)], off)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return errf(unix.EFAULT, "reading the client's memory map: %v", err)
		}
		if n == 0 {
			if len(a.buf) == 0 {
				return errf(unix.ESRCH, "the client's address space is gone")
			}
			return nil
		}
		a.buf = a.buf[:len(a.buf)+n]
		off += int64(n)
	}
}

// parseMapsLine reads "lo-hi perms ..." of a /proc/PID/maps line.
func parseMapsLine(l []byte) (lo, hi uint64, perms string, ok bool) {
	r, rest, ok1 := bytes.Cut(l, []byte(" "))
	p, _, ok2 := bytes.Cut(rest, []byte(" "))
	a, b, ok3 := bytes.Cut(r, []byte("-"))
	if !ok1 || !ok2 || !ok3 || len(p) < 4 {
		return 0, 0, "", false
	}
	lo, e1 := strconv.ParseUint(string(a), 16, 64)
	hi, e2 := strconv.ParseUint(string(b), 16, 64)
	return lo, hi, string(p), e1 == nil && e2 == nil && lo < hi
}

// release closes the address space's files, once no MR uses it (at the
// end of the session, after its MRs are deregistered).
func (a *addrSpaceObj) release() {
	a.as.Close()
	unix.Close(a.maps)
}

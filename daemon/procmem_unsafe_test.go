package daemon_test

import (
	"errors"
	"os"
	"strconv"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/daemon"
	"github.com/softrnic/softrnic/daemon/proto"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/testlink"
)

func openFD(t testing.TB, path string, flags int) int {
	t.Helper()
	fd, err := unix.Open(path, flags|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Skipf("%s: %v", path, err)
	}
	return fd
}

// attach passes mem and maps (closing the test's copies) and returns the
// address space, or the error.
func (r *rawClient) attach(mem, maps int) (proto.Handle, error) {
	defer unix.Close(mem)
	defer unix.Close(maps)
	var h proto.HandleMsg
	err := r.call(proto.OpAttachMem, nil, &h, mem, maps)
	return h.Handle, err
}

// Registering memory by address checks the files the client passes and
// the range against the client's mappings: mapped and readable, and
// writable for an access that writes (EFAULT otherwise, as pinning would
// fail); the MR's bytes count against the client's limit.
func TestRegMRAddrChecks(t *testing.T) {
	devA, _ := testlink.Pair(t, 1024)
	lim := unlimited()
	lim[daemon.MRBytes][daemon.PerConn] = 1 << 20
	_, path := serve(t, devA, daemon.Options{Limits: lim})
	r := openRaw(t, path)
	var pd proto.HandleMsg
	if err := r.call(proto.OpAllocPD, nil, &pd); err != nil {
		t.Fatal(err)
	}
	errnoOf := func(err error) unix.Errno {
		var e *proto.Error
		if errors.As(err, &e) {
			return e.Errno
		}
		return 0
	}

	// The files: /proc/self/mem read-write and /proc/self/maps of the
	// same process, nothing else.
	memfd, _ := unix.MemfdCreate("x", unix.MFD_CLOEXEC)
	for _, c := range []struct {
		name      string
		mem, maps int
		want      unix.Errno
	}{
		{"mem read-only", openFD(t, "/proc/self/mem", unix.O_RDONLY), openFD(t, "/proc/self/maps", unix.O_RDONLY), unix.EBADF},
		{"not procfs", memfd, openFD(t, "/proc/self/maps", unix.O_RDONLY), unix.EINVAL},
		{"mem for maps", openFD(t, "/proc/self/mem", unix.O_RDWR), openFD(t, "/proc/self/mem", unix.O_RDONLY), unix.EINVAL},
		{"two processes", openFD(t, "/proc/self/mem", unix.O_RDWR), openFD(t, "/proc/self/task/"+strconv.Itoa(unix.Gettid())+"/maps", unix.O_RDONLY), unix.EINVAL},
	} {
		if _, err := r.attach(c.mem, c.maps); errnoOf(err) != c.want {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	sp, err := r.attach(openFD(t, "/proc/self/mem", unix.O_RDWR), openFD(t, "/proc/self/maps", unix.O_RDONLY))
	if err != nil {
		t.Fatal(err)
	}

	pg := os.Getpagesize()
	rw, _ := unix.Mmap(-1, 0, 4*pg, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	defer unix.Munmap(rw)
	if unix.Mprotect(rw[pg:2*pg], unix.PROT_READ) != nil || unix.Mprotect(rw[2*pg:3*pg], unix.PROT_NONE) != nil {
		t.Fatal("mprotect")
	}
	if _, _, e := unix.Syscall(unix.SYS_MUNMAP, uintptr(unsafe.Pointer(&rw[3*pg])), uintptr(pg), 0); e != 0 { // (unix.Munmap takes whole mappings only)
		t.Fatal(e)
	}
	base := uint64(uintptr(unsafe.Pointer(&rw[0])))
	all := ib.LocalWrite | ib.RemoteWrite | ib.RemoteRead | ib.RemoteAtomic
	reg := func(addr, n uint64, access ib.Access) error {
		var resp proto.RegMRResp
		return r.call(proto.OpRegMRAddr, &proto.RegMRAddrReq{PD: pd.Handle, Access: access, Space: sp, Addr: addr, Length: n, IOVA: 0x10000}, &resp)
	}
	p := uint64(pg)
	for _, c := range []struct {
		name   string
		addr   uint64
		n      uint64
		access ib.Access
		want   unix.Errno
	}{
		{"read-write memory, all access", base + 10, p - 10, all, 0},
		{"read-only memory, read access", base + p, p, ib.RemoteRead, 0},
		{"read-only memory, local write", base + p - 8, 16, ib.LocalWrite, unix.EFAULT},
		{"no access memory", base + 2*p, 8, 0, unix.EFAULT},
		{"unmapped", base + 3*p, 8, ib.LocalWrite, unix.EFAULT},
		{"across a hole", base, 4 * p, 0, unix.EFAULT},
		{"wraps", ^uint64(0) - 4, 8, 0, unix.EFAULT},
		{"zero length", base, 0, 0, unix.EINVAL},
		{"remote write without local write", base, 8, ib.RemoteWrite, unix.EINVAL},
		{"over the client's limit", base, 2 << 20, 0, unix.EFAULT}, // the range is checked first
	} {
		if err := reg(c.addr, c.n, c.access); errnoOf(err) != c.want {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	big, _ := unix.Mmap(-1, 0, 2<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	defer unix.Munmap(big)
	if err := reg(uint64(uintptr(unsafe.Pointer(&big[0]))), 2<<20, ib.LocalWrite); errnoOf(err) != unix.ENOMEM {
		t.Errorf("over the client's limit: %v", err)
	}
	var bad proto.RegMRResp
	if err := r.call(proto.OpRegMRAddr, &proto.RegMRAddrReq{PD: pd.Handle, Space: 999, Addr: base, Length: 8, IOVA: base}, &bad); errnoOf(err) != unix.ENOENT {
		t.Errorf("unknown address space: %v", err)
	}
}

// BenchmarkRegMRAddr is what ibv_reg_mr and ibv_dereg_mr cost a program
// through the drop-in library, less the library itself: a registration by
// address (the range checked against the client's mappings) and its
// deregistration, each one control round trip, beside two round trips
// that check nothing; and the attachment of the address space (the
// library's first registration: two files passed).
// Nothing is pinned or touched, so the size of the region matters only
// through the mappings it spans.
func BenchmarkRegMRAddr(b *testing.B) {
	devA, _ := testlink.Pair(b, 1024)
	_, path := serve(b, devA, daemon.Options{})
	r := openRaw(b, path)
	var pd proto.HandleMsg
	if err := r.call(proto.OpAllocPD, nil, &pd); err != nil {
		b.Fatal(err)
	}
	// The baseline: two round trips that check nothing (a PD made and
	// freed), as reg and dereg are two.
	b.Run("pd", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			var h proto.HandleMsg
			if err := r.call(proto.OpAllocPD, nil, &h); err != nil {
				b.Fatal(err)
			}
			if err := r.call(proto.OpDeallocPD, &h, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("attach", func(b *testing.B) {
		// An address space lives as long as its session: a fresh
		// session every 64, so that their files do not pile up.
		a := openRaw(b, path)
		for i := 0; i < b.N; i++ {
			if i%64 == 63 {
				b.StopTimer()
				a.conn.Close()
				a = openRaw(b, path)
				b.StartTimer()
			}
			if _, err := a.attach(openFD(b, "/proc/self/mem", unix.O_RDWR), openFD(b, "/proc/self/maps", unix.O_RDONLY)); err != nil {
				b.Fatal(err)
			}
		}
	})
	sp, err := r.attach(openFD(b, "/proc/self/mem", unix.O_RDWR), openFD(b, "/proc/self/maps", unix.O_RDONLY))
	if err != nil {
		b.Fatal(err)
	}
	for _, n := range []int{4 << 10, 1 << 20, 64 << 20} {
		m, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
		if err != nil {
			b.Fatal(err)
		}
		addr := uint64(uintptr(unsafe.Pointer(&m[0])))
		b.Run(strconv.Itoa(n>>10)+"KiB", func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				var resp proto.RegMRResp
				if err := r.call(proto.OpRegMRAddr, &proto.RegMRAddrReq{PD: pd.Handle, Access: ib.LocalWrite | ib.RemoteWrite | ib.RemoteRead, Space: sp, Addr: addr, Length: uint64(n), IOVA: addr}, &resp); err != nil {
					b.Fatal(err)
				}
				if err := r.call(proto.OpDeregMR, &proto.HandleMsg{Handle: resp.MR}, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
		unix.Munmap(m)
	}
}

// MRs by address are charged as memfd MRs are, in one account: an MR and
// its bytes each, but no mapping (the device copies through the client's
// mem file, which with its maps file costs the daemon two fds while the
// address space lives). Over the bytes limit, a registration fails with
// ENOMEM; deregistered, an MR gives its bytes back.
func TestRegMRAddrLimits(t *testing.T) {
	dev := testlink.Loopback(t, 1024)
	lim := unlimited()
	lim[daemon.MRBytes][daemon.PerConn] = 1 << 20
	srv, path, _ := serveIn(t, t.TempDir(), dev, daemon.Options{Limits: lim})
	r := openRaw(t, path)
	pd := r.allocPD()
	usage := func() [daemon.NumResources]int64 { return srv.Usage().Host }

	const fdBytes = 256 << 10
	var mfd proto.RegMRResp
	if err := r.call(proto.OpRegMR, &proto.RegMRReq{PD: pd, Access: ib.LocalWrite, Length: fdBytes, IOVA: 0x1000}, &mfd, memfd(t, fdBytes)); err != nil {
		t.Fatal(err)
	}
	opened := usage()
	sp, err := r.attach(openFD(t, "/proc/self/mem", unix.O_RDWR), openFD(t, "/proc/self/maps", unix.O_RDONLY))
	if err != nil {
		t.Fatal(err)
	}
	if u := usage(); u[daemon.FDs] != opened[daemon.FDs]+2 || u[daemon.Mappings] != opened[daemon.Mappings] {
		t.Fatalf("address space attached: fds %d, mappings %d; before %d, %d", u[daemon.FDs], u[daemon.Mappings], opened[daemon.FDs], opened[daemon.Mappings])
	}

	const n = 512 << 10
	mem, err := unix.Mmap(-1, 0, 2*n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	base := uint64(uintptr(unsafe.Pointer(&mem[0])))
	reg := func(addr uint64) (proto.Handle, error) {
		var resp proto.RegMRResp
		err := r.call(proto.OpRegMRAddr, &proto.RegMRAddrReq{PD: pd, Access: ib.LocalWrite | ib.RemoteWrite, Space: sp, Addr: addr, Length: n, IOVA: addr}, &resp)
		return resp.MR, err
	}
	first, err := reg(base)
	if err != nil {
		t.Fatal(err)
	}
	u := usage()
	if u[daemon.MRBytes] != fdBytes+n || u[daemon.MRs] != 2 || u[daemon.Mappings] != opened[daemon.Mappings] {
		t.Fatalf("a memfd MR and an MR by address: %d bytes, %d MRs, %d mappings charged", u[daemon.MRBytes], u[daemon.MRs], u[daemon.Mappings])
	}
	if _, err := reg(base + n); !errors.Is(err, unix.ENOMEM) {
		t.Fatalf("%d bytes over a limit of %d: %v, want ENOMEM", fdBytes+2*n, 1<<20, err)
	}
	if got := srv.Usage().Refusals[daemon.MRBytes][daemon.PerConn]; got != 1 {
		t.Fatalf("%d refusals counted, want 1", got)
	}
	if u := usage(); u[daemon.MRBytes] != fdBytes+n || u[daemon.MRs] != 2 {
		t.Fatalf("after the refusal: %d bytes, %d MRs charged", u[daemon.MRBytes], u[daemon.MRs])
	}
	if err := r.call(proto.OpDeregMR, &proto.HandleMsg{Handle: first}, nil); err != nil {
		t.Fatal(err)
	}
	if u := usage(); u[daemon.MRBytes] != fdBytes || u[daemon.MRs] != 1 || u[daemon.Mappings] != opened[daemon.Mappings] {
		t.Fatalf("deregistered: %d bytes, %d MRs, %d mappings charged", u[daemon.MRBytes], u[daemon.MRs], u[daemon.Mappings])
	}
	if _, err := reg(base + n); err != nil {
		t.Fatalf("with the bytes given back: %v", err)
	}
	r.conn.Close()
	eventually(t, "client released", func() bool { return usage() == [daemon.NumResources]int64{} })
}

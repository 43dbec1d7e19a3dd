package daemon_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/daemon"
	"github.com/softrnic/softrnic/daemon/proto"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/testlink"
	"github.com/softrnic/softrnic/rnic"
)

// The daemon's clients as a hostile local program would be one: control
// messages written straight with daemon/proto, never through the client
// library, which checks what it sends.

// rawClient is one control connection of a hostile client.
type rawClient struct {
	t    testing.TB
	conn *proto.Conn
	seq  uint32
}

// dialRaw connects without sending anything.
func dialRaw(t testing.TB, path string) (*rawClient, error) {
	uc, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, err
	}
	r := &rawClient{t: t, conn: proto.NewConn(uc)}
	t.Cleanup(func() { r.conn.Close() })
	return r, nil
}

// openRaw connects and opens, failing the test if either fails.
func openRaw(t testing.TB, path string) *rawClient {
	t.Helper()
	r, err := dialRaw(t, path)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.call(proto.OpOpen, &proto.OpenReq{Version: proto.Version}, nil); err != nil {
		t.Fatal("OPEN:", err)
	}
	return r
}

// call sends one request and decodes the reply into resp (nil: no body
// expected); received fds are returned by callFDs, closed here.
func (r *rawClient) call(op proto.Op, req, resp any, fds ...int) error {
	out, err := r.callFDs(op, req, resp, fds...)
	proto.CloseFDs(out)
	return err
}

func (r *rawClient) callFDs(op proto.Op, req, resp any, fds ...int) ([]int, error) {
	r.seq++
	serr := r.conn.Send(proto.Header{Op: op, Seq: r.seq}, req, fds...)
	if serr != nil && op != proto.OpOpen {
		return nil, serr
	}
	// An OPEN may be answered before it is sent (a refused connection):
	// the answer is then there to read, after a reset perhaps.
	h, body, out, err := r.conn.Recv()
	if err != nil && op == proto.OpOpen {
		h, body, out, err = r.conn.Recv()
	}
	if err != nil {
		return nil, errors.Join(serr, err)
	}
	if h.Errno != 0 {
		proto.CloseFDs(out)
		return nil, &proto.Error{Op: op, Errno: unix.Errno(h.Errno), Msg: string(body)}
	}
	if resp != nil {
		if err := proto.DecodeBody(body, resp); err != nil {
			proto.CloseFDs(out)
			return nil, err
		}
	}
	return out, nil
}

// allocPD allocates a PD, failing the test if it cannot.
func (r *rawClient) allocPD() proto.Handle {
	r.t.Helper()
	var m proto.HandleMsg
	if err := r.call(proto.OpAllocPD, nil, &m); err != nil {
		r.t.Fatalf("ALLOC_PD: %v", err)
	}
	return m.Handle
}

// memfd makes a sealed memfd of n bytes, as the client library does.
func memfd(t testing.TB, n int) int {
	t.Helper()
	fd, err := unix.MemfdCreate("hostile", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Ftruncate(fd, int64(n)); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW); err != nil {
		t.Fatal(err)
	}
	return fd
}

// figures are what a process holds: open fds, mappings, resident memory.
type figures struct {
	fds, maps int
	rss       int64 // bytes
}

func (f figures) String() string {
	return fmt.Sprintf("%d fds, %d mappings, RSS %d MiB", f.fds, f.maps, f.rss>>20)
}

func figuresOf(pid int) figures {
	var f figures
	dir := "/proc/" + strconv.Itoa(pid)
	if ents, err := os.ReadDir(dir + "/fd"); err == nil {
		f.fds = len(ents)
	}
	if b, err := os.ReadFile(dir + "/maps"); err == nil {
		f.maps = strings.Count(string(b), "\n")
	}
	if b, err := os.ReadFile(dir + "/status"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if rest, ok := strings.CutPrefix(l, "VmRSS:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
				f.rss = kb << 10
			}
		}
	}
	return f
}

// eventually polls cond every few milliseconds for up to 10 s.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10 s", what)
		}
	}
}

// serveIn is serve with the socket in dir (for clients of other users:
// the directory must be theirs to reach).
func serveIn(t testing.TB, dir string, dev *rnic.Device, opt daemon.Options) (*daemon.Server, string, chan error) {
	t.Helper()
	if opt.Logger == nil {
		opt.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if opt.Group == 0 {
		opt.Group = -1
	}
	srv, err := daemon.NewServer(dev, opt)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "ctl.sock")
	if err := srv.Listen(path); err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve() }()
	t.Cleanup(func() { srv.Close(time.Second) })
	return srv, path, served
}

// unlimited is a Limits with every limit lifted.
func unlimited() daemon.Limits {
	var l daemon.Limits
	for r := range l {
		l[r] = [daemon.NumScopes]int64{-1, -1, -1}
	}
	return l
}

// A peer that connects and never opens is closed after OpenTimeout: it
// holds nothing after that, is counted, and the others are served
// meanwhile. OpenTimeout is long enough (2 s) for the client's own OPEN to
// beat it on a loaded machine.
func TestSilentPeersAreShed(t *testing.T) {
	dev := testlink.Loopback(t, 1024)
	srv, path, served := serveIn(t, t.TempDir(), dev, daemon.Options{OpenTimeout: 2 * time.Second})
	before := figuresOf(os.Getpid())
	const n = 40
	var silent []*rawClient
	for i := 0; i < n; i++ {
		r, err := dialRaw(t, path)
		if err != nil {
			t.Fatal(err)
		}
		silent = append(silent, r)
	}
	// Every peer is admitted (none refused); a stalled test may see the
	// first already shed.
	eventually(t, "silent peers admitted", func() bool {
		return srv.Usage().Host[daemon.Connections]+int64(srv.ShedConns.Load()) == n
	})
	c, err := client.Dial(path)
	if err != nil {
		t.Fatal("a client while silent peers wait:", err)
	}
	if _, err := c.AllocPD(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "silent peers shed", func() bool { return srv.ShedConns.Load() == n })
	for i, r := range silent {
		if _, _, _, err := r.conn.Recv(); !proto.IsClosed(err) {
			t.Fatalf("silent peer %d: %v, want the connection closed", i, err)
		}
		r.conn.Close()
	}
	// A session closes its connection before it gives the slot back.
	eventually(t, "silent peers released", func() bool { return srv.Usage().Host[daemon.Connections] == 1 })
	c.Close()
	eventually(t, "client released", func() bool { return srv.Usage().Host == [daemon.NumResources]int64{} })
	if after := figuresOf(os.Getpid()); after.fds > before.fds+2 {
		t.Errorf("fds: %v before, %v after", before, after)
	}
	select {
	case err := <-served:
		t.Fatalf("Serve returned: %v", err)
	default:
	}
}

// One uid's connections, and the fds its CQs and QPs cost the daemon, are
// bounded; a request over a limit fails with the errno the kernel would
// give (EAGAIN for a connection, EMFILE for fds), is counted, and leaves
// the daemon serving the others.
func TestConnectionAndFDLimits(t *testing.T) {
	dev := testlink.Loopback(t, 1024)
	lim := unlimited()
	lim[daemon.Connections][daemon.PerUID] = 4
	lim[daemon.FDs][daemon.PerConn] = 5 + 1 + 10 // connection, doorbell, 10 CQs (their doorbells)
	srv, path, _ := serveIn(t, t.TempDir(), dev, daemon.Options{Limits: lim})
	var conns []*rawClient
	for i := 0; i < 4; i++ {
		conns = append(conns, openRaw(t, path))
	}
	r, err := dialRaw(t, path)
	if err != nil {
		t.Fatal(err)
	}
	err = r.call(proto.OpOpen, &proto.OpenReq{Version: proto.Version}, nil)
	if !errors.Is(err, unix.EAGAIN) || !strings.Contains(err.Error(), "connections-per-uid") {
		t.Fatalf("fifth connection of the uid: %v", err)
	}
	// The library sees the same refusal.
	if _, err := client.Dial(path); !errors.Is(err, unix.EAGAIN) {
		t.Fatalf("client.Dial over the limit: %v", err)
	}
	// CQs until the connection's fds run out: EMFILE, not EINVAL. A CQ
	// costs the daemon one fd (the client's CQ doorbell; it keeps the
	// ring's mapping, not its memfd).
	a := conns[0]
	fds := figuresOf(os.Getpid()).fds
	cqs := 0
	for ; cqs < 100; cqs++ {
		if err = a.call(proto.OpCreateCQ, &proto.CreateCQReq{Depth: 1}, nil); err != nil {
			break
		}
	}
	if cqs != 10 || !errors.Is(err, unix.EMFILE) {
		t.Fatalf("%d CQs, then %v; want 10, then EMFILE", cqs, err)
	}
	if now := figuresOf(os.Getpid()).fds; now > fds+10 {
		t.Fatalf("10 CQs took %d fds of the daemon", now-fds)
	}
	// Another connection is not affected.
	if err := conns[1].call(proto.OpCreateCQ, &proto.CreateCQReq{Depth: 1}, nil); err != nil {
		t.Fatalf("another connection's CQ: %v", err)
	}
	u := srv.Usage()
	if u.Refusals[daemon.Connections][daemon.PerUID] != 2 || u.Refusals[daemon.FDs][daemon.PerConn] != 1 ||
		u.Host[daemon.CQs] != 11 || u.Host[daemon.Connections] != 4 {
		t.Fatalf("usage %v, refusals %v", u.Host, u.Refusals)
	}
	// A connection closed frees its share: a new one is admitted.
	conns[0].conn.Close()
	eventually(t, "connection released", func() bool { return srv.Usage().Host[daemon.Connections] == 3 })
	openRaw(t, path)
}

// Memory a client's queues take is bounded in bytes, not objects (a
// handful of QPs with 16384 WRs of 32 SGEs each, or CQs of a million
// entries, used to take gigabytes), and returned when it goes.
func TestQueueMemoryIsBoundedAndReturned(t *testing.T) {
	dev := testlink.Loopback(t, 1024)
	lim := unlimited()
	lim[daemon.QueueBytes][daemon.PerConn] = 384 << 20
	srv, path, _ := serveIn(t, t.TempDir(), dev, daemon.Options{Limits: lim})
	base := figuresOf(os.Getpid())
	r := openRaw(t, path)
	pd := r.allocPD()
	var cq proto.CreateCQResp
	if err := r.call(proto.OpCreateCQ, &proto.CreateCQReq{Depth: 64}, &cq); err != nil {
		t.Fatal(err)
	}
	caps := ib.QPCaps{MaxSendWR: 16384, MaxRecvWR: 16384, MaxSendSGE: 32, MaxRecvSGE: 32}
	qps := 0
	var err error
	for ; qps < 100; qps++ {
		req := proto.CreateQPReq{PD: pd, SendCQ: cq.CQ, RecvCQ: cq.CQ, Type: ib.RC, Caps: caps}
		if err = r.call(proto.OpCreateQP, &req, nil); err != nil {
			break
		}
	}
	if qps == 0 || qps >= 100 || !errors.Is(err, unix.ENOMEM) {
		t.Fatalf("%d QPs of 16384 WRs, then %v; want a few, then ENOMEM", qps, err)
	}
	held := srv.Usage().Host[daemon.QueueBytes]
	if held > 384<<20 || held < 384<<20*3/4 {
		t.Fatalf("%d bytes of queues held; the limit is %d", held, 384<<20)
	}
	// CQs of the most entries, each its ring (the device keeps no array
	// of its own for them), until the rest of the limit is spent.
	cqs := 0
	for ; cqs < 16; cqs++ {
		if err = r.call(proto.OpCreateCQ, &proto.CreateCQReq{Depth: dev.Query().MaxCQE}, nil); err != nil {
			break
		}
	}
	if cqs >= 16 || !errors.Is(err, unix.ENOMEM) {
		t.Fatalf("%d CQs of %d entries over the limit, then %v; want ENOMEM", cqs, dev.Query().MaxCQE, err)
	}
	if held := srv.Usage().Host[daemon.QueueBytes]; held > 384<<20 {
		t.Fatalf("%d bytes of queues held with the CQs; the limit is %d", held, 384<<20)
	}
	peak := figuresOf(os.Getpid())
	r.conn.Close()
	eventually(t, "queues released", func() bool { return srv.Usage().Host[daemon.QueueBytes] == 0 })
	if raceDetector {
		return
	}
	var after figures
	eventually(t, "memory returned", func() bool {
		after = figuresOf(os.Getpid())
		return after.rss-base.rss < (peak.rss-base.rss)/2
	})
	t.Logf("%d QPs of 16384/16384 WRs, 32/32 SGEs: %d MiB of queues; before %v, peak %v, after the client went %v",
		qps, held>>20, base, peak, after)
}

// The memory of huge CQs goes back to the system when their client goes:
// nothing of the daemon's keeps a destroyed CQ (or QP) reachable. A CQ is
// its client's ring (the device keeps no array of its own): a mapping of
// the daemon's, which goes with the client.
func TestCQMemoryIsReturned(t *testing.T) {
	dev := testlink.Loopback(t, 1024)
	srv, path, _ := serveIn(t, t.TempDir(), dev, daemon.Options{Limits: unlimited()})
	base := figuresOf(os.Getpid())
	rings := func() int {
		b, err := os.ReadFile("/proc/self/maps")
		if err != nil {
			t.Fatal(err)
		}
		return strings.Count(string(b), "memfd:softrnic-cq")
	}
	rings0 := rings()
	r := openRaw(t, path)
	for i := 0; i < 6; i++ {
		if err := r.call(proto.OpCreateCQ, &proto.CreateCQReq{Depth: dev.Query().MaxCQE}, nil); err != nil {
			t.Fatal(err)
		}
	}
	peak := figuresOf(os.Getpid())
	if n := rings() - rings0; n != 6 {
		t.Fatalf("6 CQs: %d CQ rings mapped", n)
	}
	r.conn.Close()
	eventually(t, "queues released", func() bool { return srv.Usage().Host[daemon.QueueBytes] == 0 })
	eventually(t, "rings unmapped", func() bool { return rings() == rings0 })
	var after figures
	if !raceDetector && peak.rss-base.rss > 64<<20 {
		eventually(t, "memory returned", func() bool {
			after = figuresOf(os.Getpid())
			return after.rss-base.rss < (peak.rss-base.rss)/4
		})
	}
	after = figuresOf(os.Getpid())
	t.Logf("6 CQs of %d entries: before %v, peak %v, after the client went %v", dev.Query().MaxCQE, base, peak, after)
}

// MRs in one memfd share the daemon's mappings of it: 20 000 one-page MRs
// cost a few mappings, not 20 000; MRs each in their own memfd run into
// the mappings limit (ENOMEM), not into vm.max_map_count. Deregistered,
// their mappings go.
func TestMRsShareMappings(t *testing.T) {
	dev := testlink.Loopback(t, 1024)
	lim := unlimited()
	lim[daemon.Mappings][daemon.PerConn] = 64
	srv, path, _ := serveIn(t, t.TempDir(), dev, daemon.Options{Limits: lim})
	r := openRaw(t, path)
	pd := r.allocPD()
	pg := unix.Getpagesize()
	const n = 20000
	fd := memfd(t, n*pg) // 78 MiB: two 64 MiB windows
	before := figuresOf(os.Getpid())
	mrs := make([]proto.Handle, 0, n)
	for i := 0; i < n; i++ {
		var m proto.RegMRResp
		req := proto.RegMRReq{PD: pd, Access: ib.LocalWrite | ib.RemoteWrite, Offset: uint64(i * pg), Length: uint64(pg), IOVA: uint64(i * pg)}
		if err := r.call(proto.OpRegMR, &req, &m, fd); err != nil {
			t.Fatalf("MR %d: %v", i, err)
		}
		mrs = append(mrs, m.MR)
	}
	during := figuresOf(os.Getpid())
	// The process's own count also moves with the Go heap (the test is
	// the daemon), and the race detector's shadow memory with it: a
	// margin for them, far below one mapping per MR.
	heapMaps := 32
	if raceDetector {
		heapMaps = 256
	}
	u := srv.Usage().Host
	if u[daemon.MRs] != n || u[daemon.Mappings] != 2 || during.maps > before.maps+heapMaps {
		t.Fatalf("%d MRs: %d mappings charged; process %v before, %v after", u[daemon.MRs], u[daemon.Mappings], before, during)
	}
	// Each MR in a memfd of its own: a mapping each, up to the limit.
	var err error
	i := 0
	for ; i < 100; i++ {
		var m proto.RegMRResp
		req := proto.RegMRReq{PD: pd, Access: ib.LocalWrite, Length: uint64(pg), IOVA: 0x1000}
		if err = r.call(proto.OpRegMR, &req, &m, memfd(t, pg)); err != nil {
			break
		}
	}
	if i != 62 || !errors.Is(err, unix.ENOMEM) {
		t.Fatalf("%d MRs in memfds of their own, then %v; want 62, then ENOMEM", i, err)
	}
	for _, h := range mrs {
		if err := r.call(proto.OpDeregMR, &proto.HandleMsg{Handle: h}, nil); err != nil {
			t.Fatal(err)
		}
	}
	after := figuresOf(os.Getpid())
	if u := srv.Usage().Host; u[daemon.Mappings] != 62 || u[daemon.MRs] != 62 || after.maps > during.maps+62+heapMaps {
		t.Fatalf("after deregistering the shared MRs: usage %v; process %v", u, after)
	}
}

// Controlled Q_Keys (the high bit set: QP1's 0x80010000 among them) are
// for clients with CAP_NET_RAW, as ib_uverbs has them: another user's
// client gets EPERM, counted; root sets one.
func TestControlledQKeyNeedsNetRaw(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a client as another user")
	}
	dev := testlink.Loopback(t, 1024)
	dir := reachableDir(t)
	srv, path, _ := serveIn(t, dir, dev, daemon.Options{Group: 65534, Mode: 0o660})
	if err := os.Chown(dir, -1, 65534); err != nil {
		t.Fatal(err)
	}
	out := runChildAs(t, dir, "qkey", path, 65534, 65534)
	if !strings.Contains(out, "0x80010000: EPERM") || !strings.Contains(out, "0x11: ok") {
		t.Fatalf("client of uid 65534: %q", out)
	}
	if srv.QKeyRefused.Load() != 1 {
		t.Fatalf("refusals counted: %d", srv.QKeyRefused.Load())
	}
	// Root may.
	r := openRaw(t, path)
	if err := setQKey(r, 0x80010000); err != nil {
		t.Fatalf("root's controlled Q_Key: %v", err)
	}
}

// A uid's limits are its own: another user's client that takes all its
// uid may have (connections, then a connection's fds in CQs) is refused
// with EAGAIN and EMFILE, while this user's clients are served as usual.
func TestLimitsIsolateUsers(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a client as another user")
	}
	dev := testlink.Loopback(t, 1024)
	dir := reachableDir(t)
	lim := unlimited()
	lim[daemon.Connections][daemon.PerUID] = 20
	lim[daemon.FDs][daemon.PerUID] = 20*5 + 20 + 500 // connections, doorbells, 500 CQs
	srv, path, _ := serveIn(t, dir, dev, daemon.Options{Group: 65534, Limits: lim})
	cmd := exec.Command(filepath.Join(dir, "daemon.test"), "-test.run=^$")
	cmd.Env = append(os.Environ(), "SOFTRNIC_HOSTILE=hog", "SOFTRNIC_CONTROL="+path)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}}
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.Close(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "20 connections, then EAGAIN; 500 CQs, then EMFILE\n" {
		t.Fatalf("the other user's client: %q %v", line, err)
	}
	// Root's clients, meanwhile: connections and CQs up to their own
	// uid's limits.
	for i := 0; i < 15; i++ {
		r := openRaw(t, path)
		if err := r.call(proto.OpCreateCQ, &proto.CreateCQReq{Depth: 1}, nil); err != nil {
			t.Fatalf("root's client %d: %v", i, err)
		}
	}
	if u := srv.Usage(); u.Host[daemon.CQs] != 515 || u.Refusals[daemon.Connections][daemon.PerUID] != 1 || u.Refusals[daemon.FDs][daemon.PerUID] != 1 {
		t.Fatalf("usage %v, refusals %v", u.Host, u.Refusals)
	}
}

// setQKey makes a UD QP on r and moves it to INIT with qkey.
func setQKey(r *rawClient, qkey uint32) error {
	pd := r.allocPD()
	var cq proto.CreateCQResp
	if err := r.call(proto.OpCreateCQ, &proto.CreateCQReq{Depth: 4}, &cq); err != nil {
		return err
	}
	var qp proto.CreateQPResp
	req := proto.CreateQPReq{PD: pd, SendCQ: cq.CQ, RecvCQ: cq.CQ, Type: ib.UD, Caps: ib.QPCaps{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}}
	if err := r.call(proto.OpCreateQP, &req, &qp); err != nil {
		return err
	}
	return r.call(proto.OpModifyQP, &proto.ModifyQPReq{QP: qp.QP, Mask: ib.AttrState | ib.AttrPKeyIndex | ib.AttrPort | ib.AttrQKey,
		Attr: ib.QPAttr{State: ib.Init, Port: 1, QKey: qkey}}, nil)
}

// reachableDir is a directory other users can enter, holding a copy of
// the test binary they can run.
func reachableDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "softrnic-hostile-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	exe, _ := os.Executable()
	bin, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "daemon.test"), bin, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// runChildAs runs a hostile role (hostileChild) as uid:gid from the copy
// of the test binary in dir and returns its output.
func runChildAs(t *testing.T, dir, role, path string, uid, gid uint32) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(dir, "daemon.test"), "-test.run=^$")
	cmd.Env = append(os.Environ(), "SOFTRNIC_HOSTILE="+role, "SOFTRNIC_CONTROL="+path)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid, Groups: []uint32{}}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child %s: %v\n%s", role, err, out)
	}
	return string(out)
}

// startChild starts a hostile role as this user and returns it with its
// output, read line by line.
func startChild(t *testing.T, role, path string, env ...string) (*exec.Cmd, *bufio.Reader, io.Writer) {
	t.Helper()
	exe, _ := os.Executable()
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(append(os.Environ(), "SOFTRNIC_HOSTILE="+role, "SOFTRNIC_CONTROL="+path), env...)
	cmd.Stderr = os.Stderr
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	return cmd, bufio.NewReader(out), in
}

// hostileChild runs a hostile client role in a process of its own.
func hostileChild(role, path string) int {
	switch role {
	case "qkey":
		// A UD QP with a controlled Q_Key, then an ordinary one.
		for _, k := range []uint32{0x80010000, 0x11} {
			r, err := dialRaw(&childTB{}, path)
			if err == nil {
				err = r.call(proto.OpOpen, &proto.OpenReq{Version: proto.Version}, nil)
			}
			if err == nil {
				err = setQKey(r, k)
			}
			switch {
			case errors.Is(err, unix.EPERM):
				fmt.Printf("%#x: EPERM\n", k)
			case err != nil:
				fmt.Printf("%#x: %v\n", k, err)
			default:
				fmt.Printf("%#x: ok\n", k)
			}
		}
		return 0
	case "flood":
		// Connections that never speak, as many as this process may
		// open, held until killed.
		if _, err := daemon.RaiseNoFile(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
		n, _ := strconv.Atoi(os.Getenv("SOFTRNIC_FLOOD"))
		held := 0
		for ; held < n; held++ {
			uc, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
			if err != nil {
				break
			}
			defer uc.Close()
		}
		fmt.Printf("held %d\n", held)
		time.Sleep(time.Minute) // bounded: the test kills it long before
		return 1
	case "soak":
		return soakAttacker(path)
	case "hog":
		// Connections until refused, then CQs on one of them until
		// refused; held until stdin closes.
		var conns []*rawClient
		var connErr, cqErr error
		for len(conns) < 1000 {
			r, err := dialRaw(&childTB{}, path)
			if err == nil {
				err = r.call(proto.OpOpen, &proto.OpenReq{Version: proto.Version}, nil)
			}
			if err != nil {
				connErr = err
				break
			}
			conns = append(conns, r)
		}
		cqs := 0
		for len(conns) > 0 && cqs < 100000 {
			if cqErr = conns[0].call(proto.OpCreateCQ, &proto.CreateCQReq{Depth: 1}, nil); cqErr != nil {
				break
			}
			cqs++
		}
		fmt.Printf("%d connections, then %v; %d CQs, then %v\n", len(conns), errnoName(connErr), cqs, errnoName(cqErr))
		_, _ = io.Copy(io.Discard, os.Stdin) // until the test closes it
		return 0
	case "dial":
		// When told to (a line on stdin).
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n') // the test's "go", or its end
		c, err := client.Dial(path)
		var pe *proto.Error
		switch {
		case errors.As(err, &pe):
			fmt.Printf("refused %d %s\n", int(pe.Errno), pe.Msg)
		case err != nil:
			fmt.Printf("failed %v\n", err)
		default:
			c.Close()
			fmt.Println("ok")
		}
		return 0
	}
	fmt.Fprintln(os.Stderr, "unknown role", role)
	return 2
}

func errnoName(err error) string {
	var no unix.Errno
	if errors.As(err, &no) {
		return unix.ErrnoName(no)
	}
	return fmt.Sprint(err)
}

// childTB stands in for testing.TB in a child process: dialRaw's cleanup
// is left to the process's exit.
type childTB struct{ testing.TB }

func (childTB) Cleanup(func()) {}
func (childTB) Helper()        {}
func (childTB) Fatal(args ...any) {
	fmt.Println(args...)
	os.Exit(1)
}
func (c childTB) Fatalf(format string, args ...any) { c.Fatal(fmt.Sprintf(format, args...)) }

// Out of file descriptors, the daemon keeps serving: with every limit
// lifted and its RLIMIT_NOFILE low, a flood of silent connections makes
// accept fail; each failure is counted, the newest connection is turned
// away with EMFILE (which its client sees), Serve never returns, and once
// the flood is gone a client is served as before.
func TestOutOfFDsKeepsServing(t *testing.T) {
	dev := testlink.Loopback(t, 1024)
	srv, path, served := serveIn(t, t.TempDir(), dev, daemon.Options{Limits: unlimited(), OpenTimeout: time.Minute})
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	low := rl
	low.Cur = uint64(figuresOf(os.Getpid()).fds + 100)
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Setrlimit(unix.RLIMIT_NOFILE, &rl) }) // lowering it succeeded
	// The test process is the daemon: its other client runs in a process
	// of its own, started before the daemon runs out; a raw one here
	// connects first.
	early := openRaw(t, path)
	_, dial, go_ := startChild(t, "dial", path)
	flood, out, _ := startChild(t, "flood", path, "SOFTRNIC_FLOOD=400")
	if line, err := out.ReadString('\n'); err != nil || !strings.HasPrefix(line, "held ") {
		t.Fatalf("flood: %q %v", line, err)
	}
	eventually(t, "accept failures", func() bool { return srv.AcceptErrors.Load() > 0 && srv.ShedConns.Load() > 0 })
	// A CQ now needs an fd the daemon has not: EMFILE, as the kernel
	// said (not EINVAL).
	if err := early.call(proto.OpCreateCQ, &proto.CreateCQReq{Depth: 4}, nil); !errors.Is(err, unix.EMFILE) {
		t.Errorf("CQ while the daemon is out of fds: %v", err)
	}
	// Another client now: turned away with EMFILE, or served if the
	// daemon had an fd for it.
	if _, err := io.WriteString(go_, "go\n"); err != nil {
		t.Fatal(err)
	}
	line, _ := dial.ReadString('\n')
	if line != "ok\n" && !strings.HasPrefix(line, fmt.Sprintf("refused %d ", int(unix.EMFILE))) {
		t.Fatalf("a client while the daemon is out of fds: %q", line)
	}
	select {
	case err := <-served:
		t.Fatalf("Serve returned: %v", err)
	default:
	}
	flood.Process.Kill()
	flood.Wait()
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	eventually(t, "flood released", func() bool { return srv.Usage().Host[daemon.Connections] == 1 }) // early's
	c, err := client.Dial(path)
	if err != nil {
		t.Fatal("after the flood:", err)
	}
	defer c.Close()
	if _, err := c.AllocPD(); err != nil {
		t.Fatal(err)
	}
	t.Logf("accept errors %d, connections shed %d; a client during the flood: %q", srv.AcceptErrors.Load(), srv.ShedConns.Load(), strings.TrimSpace(line))
}

package client

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/daemon"
	"github.com/softrnic/softrnic/daemon/proto"
	"github.com/softrnic/softrnic/engine"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/testlink"
	"github.com/softrnic/softrnic/rnic"
	"github.com/softrnic/softrnic/verbs"
)

// TestMain runs the child roles of the cross-process tests when the test
// binary is re-executed with SOFTRNIC_CLIENT_CHILD set.
func TestMain(m *testing.M) {
	if role := os.Getenv("SOFTRNIC_CLIENT_CHILD"); role != "" {
		os.Exit(child(role, os.Getenv("SOFTRNIC_CONTROL")))
	}
	os.Exit(m.Run())
}

type testDaemon struct {
	srv  *daemon.Server
	dev  *rnic.Device // on a loopback link: its QPs reach each other
	path string
	gone chan daemon.ClientInfo
}

func startDaemon(t testing.TB, opt daemon.Options) *testDaemon {
	return startDaemonIn(t, t.TempDir(), opt)
}

func startDaemonIn(t testing.TB, dir string, opt daemon.Options) *testDaemon {
	t.Helper()
	return startDaemonOn(t, testlink.Loopback(t, 1024), dir, opt)
}

// startDaemonOn serves dev, a device whose engine runs.
func startDaemonOn(t testing.TB, dev *rnic.Device, dir string, opt daemon.Options) *testDaemon {
	t.Helper()
	td := &testDaemon{dev: dev, path: filepath.Join(dir, "ctl.sock"), gone: make(chan daemon.ClientInfo, 16)}
	if opt.Logger == nil {
		opt.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if opt.Group == 0 {
		opt.Group = -1
	}
	opt.OnClientGone = func(ci daemon.ClientInfo) { td.gone <- ci }
	srv, err := daemon.NewServer(td.dev, opt)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Listen(td.path); err != nil {
		t.Fatal(err)
	}
	td.srv = srv
	served := make(chan error, 1)
	go func() { served <- srv.Serve() }()
	t.Cleanup(func() {
		srv.Close(time.Second)
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return td
}

// endpoint is one client with a PD, a 64 KiB MR, a CQ and an RC QP.
type endpoint struct {
	c   *Client
	pd  *PD
	mem *Mem
	mr  *MR
	cq  *CQ
	qp  *QP
}

func newEndpoint(t testing.TB, path string, access ib.Access) *endpoint {
	t.Helper()
	c, err := Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	e := &endpoint{c: c}
	e.pd = must(t)(c.AllocPD()).(*PD)
	if e.mem, err = AllocMem(64 << 10); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.mem.Free() })
	e.mr = must(t)(e.pd.RegMR(e.mem, 0, 64<<10, 0, access)).(*MR)
	e.cq = must(t)(c.CreateCQ(256)).(*CQ)
	e.qp = must(t)(e.pd.CreateQP(&verbs.QPInitAttr{Type: ib.RC, SendCQ: e.cq, RecvCQ: e.cq,
		Cap: ib.QPCaps{MaxSendWR: 128, MaxRecvWR: 128, MaxSendSGE: 2, MaxRecvSGE: 2, MaxInline: 64}})).(*QP)
	return e
}

// must returns a function that fails the test on a non-nil error and
// returns the value otherwise.
func must(t testing.TB) func(v any, err error) any {
	return func(v any, err error) any {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

// gid is the GID of the test daemon's device (both ends of a connection
// are on it).
var gid = ib.GIDFrom(testlink.AddrA)

// connect brings a and b to RTS, pointed at each other.
func connect(t testing.TB, a, b *endpoint, access ib.Access) {
	t.Helper()
	for _, p := range [][2]*endpoint{{a, b}, {b, a}} {
		q, peer := p[0].qp, p[1].qp
		steps := []struct {
			attr ib.QPAttr
			mask ib.QPAttrMask
		}{
			{ib.QPAttr{State: ib.Init, Access: access, Port: 1}, ib.AttrState | ib.AttrAccessFlags | ib.AttrPKeyIndex | ib.AttrPort},
			{ib.QPAttr{State: ib.RTR, DestQPN: peer.QPN(), PathMTU: 1024, RQPSN: 100, MaxDestRdAtomic: 4, MinRNRTimer: 1, AV: ib.AddressVector{DGID: gid}},
				ib.AttrState | ib.AttrAV | ib.AttrPathMTU | ib.AttrDestQPN | ib.AttrRQPSN | ib.AttrMaxDestRdAtomic | ib.AttrMinRNRTimer},
			{ib.QPAttr{State: ib.RTS, SQPSN: 100, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 4}, ib.AttrState | ib.AttrSQPSN | ib.AttrTimeout | ib.AttrRetryCnt | ib.AttrRNRRetry | ib.AttrMaxQPRdAtomic},
		}
		for _, s := range steps {
			if err := q.Modify(&s.attr, s.mask); err != nil {
				t.Fatalf("QP %d to %v: %v", q.QPN(), s.attr.State, err)
			}
		}
	}
}

// waitWC polls cq until one completion arrives, sleeping on the CQ's
// doorbell between polls (bounded).
func waitWC(t testing.TB, cq *CQ) ib.WC {
	t.Helper()
	var wcs [1]ib.WC
	deadline := time.Now().Add(10 * time.Second)
	for {
		if cq.Poll(wcs[:]) == 1 {
			return wcs[0]
		}
		if time.Now().After(deadline) {
			t.Fatal("no completion")
		}
		if err := cq.Wait(100 * time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
}

const allAccess = ib.LocalWrite | ib.RemoteWrite | ib.RemoteRead | ib.RemoteAtomic

func TestSendWriteReadThroughDaemon(t *testing.T) {
	td := startDaemon(t, daemon.Options{})
	a, b := newEndpoint(t, td.path, allAccess), newEndpoint(t, td.path, allAccess)
	connect(t, a, b, ib.RemoteWrite|ib.RemoteRead|ib.RemoteAtomic)

	// SEND → RECV, two SGEs on each side.
	copy(a.mem.Bytes()[0:], "hello, ")
	copy(a.mem.Bytes()[100:], "remote world")
	if _, err := b.qp.PostRecv([]verbs.RecvWR{{ID: 7, SG: []ib.SGE{b.mr.SGE(1000, 4), b.mr.SGE(2000, 100)}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.qp.PostSend([]verbs.SendWR{{ID: 1, Opcode: ib.SendWithImm, Flags: ib.Signaled, Imm: 0xabc,
		SG: []ib.SGE{a.mr.SGE(0, 7), a.mr.SGE(100, 12)}}}); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, a.cq); wc.ID != 1 || wc.Status != ib.Success || wc.Opcode != ib.WCSend || wc.QPN != a.qp.QPN() {
		t.Fatalf("send completion %+v", wc)
	}
	wc := waitWC(t, b.cq)
	if wc.ID != 7 || wc.Status != ib.Success || !wc.IsRecv || wc.ByteLen != 19 || wc.Imm != 0xabc || wc.Flags&ib.WCWithImm == 0 {
		t.Fatalf("recv completion %+v", wc)
	}
	if got := string(b.mem.Bytes()[1000:1004]) + string(b.mem.Bytes()[2000:2015]); got != "hello, remote world" {
		t.Fatalf("received %q", got)
	}

	// RDMA WRITE lands directly in b's own buffer (the memfd both map).
	copy(a.mem.Bytes()[4096:], "written by a")
	if _, err := a.qp.PostSend([]verbs.SendWR{{ID: 2, Opcode: ib.RDMAWrite, Flags: ib.Signaled,
		SG: []ib.SGE{a.mr.SGE(4096, 12)}, RemoteAddr: b.mr.IOVA() + 8192, RKey: b.mr.RKey()}}); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, a.cq); wc.Status != ib.Success || wc.Opcode != ib.WCRDMAWrite {
		t.Fatalf("write completion %+v", wc)
	}
	if got := string(b.mem.Bytes()[8192:8204]); got != "written by a" {
		t.Fatalf("b's buffer holds %q", got)
	}

	// Inline RDMA WRITE: the data travels in the SQ slot.
	if _, err := a.qp.PostSend([]verbs.SendWR{{ID: 3, Opcode: ib.RDMAWrite, Flags: ib.Signaled | ib.Inline,
		InlineData: []byte("inline!"), RemoteAddr: b.mr.IOVA() + 9000, RKey: b.mr.RKey()}}); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, a.cq); wc.Status != ib.Success {
		t.Fatalf("inline write completion %+v", wc)
	}
	if got := string(b.mem.Bytes()[9000:9007]); got != "inline!" {
		t.Fatalf("b's buffer holds %q", got)
	}

	// RDMA READ from b into a.
	copy(b.mem.Bytes()[12000:], "read me back")
	if _, err := a.qp.PostSend([]verbs.SendWR{{ID: 4, Opcode: ib.RDMARead, Flags: ib.Signaled,
		SG: []ib.SGE{a.mr.SGE(16000, 12)}, RemoteAddr: b.mr.IOVA() + 12000, RKey: b.mr.RKey()}}); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, a.cq); wc.Status != ib.Success || wc.Opcode != ib.WCRDMARead || wc.ByteLen != 12 {
		t.Fatalf("read completion %+v", wc)
	}
	if got := string(a.mem.Bytes()[16000:16012]); got != "read me back" {
		t.Fatalf("read %q", got)
	}

	// Unsignaled WRs produce no completion; the next signaled one does.
	if _, err := a.qp.PostSend([]verbs.SendWR{{ID: 5, Opcode: ib.RDMAWrite, SG: []ib.SGE{a.mr.SGE(0, 8)}, RemoteAddr: b.mr.IOVA(), RKey: b.mr.RKey()}, {ID: 6, Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: []ib.SGE{a.mr.SGE(0, 8)}, RemoteAddr: b.mr.IOVA(), RKey: b.mr.RKey()}}); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, a.cq); wc.ID != 6 {
		t.Fatalf("got completion for %d, want only 6", wc.ID)
	}

	// Atomics: FETCH_AND_ADD then CMP_AND_SWP on an 8-byte word of b's MR;
	// the original value lands in a's buffer.
	binary.NativeEndian.PutUint64(b.mem.Bytes()[24000:], 40)
	if _, err := a.qp.PostSend([]verbs.SendWR{{ID: 20, Opcode: ib.AtomicFetchAndAdd, Flags: ib.Signaled, SG: []ib.SGE{a.mr.SGE(32000, 8)},
		RemoteAddr: b.mr.IOVA() + 24000, RKey: b.mr.RKey(), CompareAdd: 2}}); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, a.cq); wc.Status != ib.Success || wc.Opcode != ib.WCFetchAdd ||
		binary.NativeEndian.Uint64(a.mem.Bytes()[32000:]) != 40 || binary.NativeEndian.Uint64(b.mem.Bytes()[24000:]) != 42 {
		t.Fatalf("fetch-add: %+v", wc)
	}
	if _, err := a.qp.PostSend([]verbs.SendWR{{ID: 21, Opcode: ib.AtomicCmpAndSwp, Flags: ib.Signaled, SG: []ib.SGE{a.mr.SGE(32008, 8)},
		RemoteAddr: b.mr.IOVA() + 24000, RKey: b.mr.RKey(), CompareAdd: 42, Swap: 7}}); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, a.cq); wc.Status != ib.Success || wc.Opcode != ib.WCCompSwap ||
		binary.NativeEndian.Uint64(a.mem.Bytes()[32008:]) != 42 || binary.NativeEndian.Uint64(b.mem.Bytes()[24000:]) != 7 {
		t.Fatalf("compare-swap: %+v", wc)
	}

	attr, err := a.qp.Query()
	if err != nil || attr.State != ib.RTS || attr.DestQPN != b.qp.QPN() {
		t.Fatalf("query: %+v %v", attr, err)
	}
	st, err := a.c.Status()
	if err != nil || st.NumClients != 2 || st.Listed != 2 {
		t.Fatalf("status: %+v %v", st, err)
	}
	for _, cs := range st.Clients[:st.Listed] {
		if cs.QPs != 1 || cs.MRs != 1 || cs.CQs != 1 || cs.PDs != 1 || cs.PID != int32(os.Getpid()) {
			t.Fatalf("client status %+v", cs)
		}
	}
}

// Two clients of one daemon cannot touch each other's objects: handles are
// per connection, and an rkey is only good for the access its MR and QP
// grant.
func TestClientsAreIsolated(t *testing.T) {
	td := startDaemon(t, daemon.Options{})
	a := newEndpoint(t, td.path, ib.LocalWrite) // a grants no remote access
	b := newEndpoint(t, td.path, allAccess)
	connect(t, a, b, ib.RemoteWrite|ib.RemoteRead)

	// b names a's handles on its own connection: not found, and a's objects
	// are untouched. b's handle numbers coincide with a's, by construction.
	if a.mr.Handle() != b.mr.Handle() || a.qp.Handle() != b.qp.Handle() {
		t.Fatalf("handles differ (%d/%d, %d/%d): test assumption broken", a.mr.Handle(), b.mr.Handle(), a.qp.Handle(), b.qp.Handle())
	}
	foreign := a.mr.Handle() + 100 // certainly nothing on b's connection
	for _, op := range []proto.Op{proto.OpDeregMR, proto.OpDestroyQP, proto.OpDestroyCQ, proto.OpDeallocPD, proto.OpQueryQP} {
		if err := b.c.callHandle(op, foreign); !errors.Is(err, unix.ENOENT) {
			t.Errorf("%v of an unknown handle: %v, want ENOENT", op, err)
		}
	}
	if _, err := b.pd.CreateQP(&verbs.QPInitAttr{Type: ib.RC, SendCQ: a.cq, RecvCQ: a.cq, Cap: ib.QPCaps{MaxSendWR: 1}}); err == nil {
		t.Error("b created a QP on a's CQ")
	}
	req := proto.CreateQPReq{PD: foreign, SendCQ: b.cq.h, RecvCQ: b.cq.h, Type: ib.RC, Caps: ib.QPCaps{MaxSendWR: 1}}
	if _, _, err := b.c.call(proto.OpCreateQP, &req, 2); !errors.Is(err, unix.ENOENT) {
		t.Errorf("CreateQP in a foreign PD: %v", err)
	}

	// a's MR registered without remote access: b's WRITE with a's rkey fails
	// with a remote access error and writes nothing.
	copy(b.mem.Bytes(), "intruder")
	before := append([]byte(nil), a.mem.Bytes()[:64]...)
	if _, err := b.qp.PostSend([]verbs.SendWR{{ID: 9, Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: []ib.SGE{b.mr.SGE(0, 8)}, RemoteAddr: a.mr.IOVA(), RKey: a.mr.RKey()}}); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, b.cq); wc.Status != ib.RemAccessErr {
		t.Fatalf("write to a non-remote MR: %v", wc.Status)
	}
	if !bytes.Equal(a.mem.Bytes()[:64], before) {
		t.Fatal("a's memory changed")
	}
	// The failed QP is in error now: the next WR is flushed.
	if _, err := b.qp.PostSend([]verbs.SendWR{{ID: 10, Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: []ib.SGE{b.mr.SGE(0, 8)}, RemoteAddr: a.mr.IOVA(), RKey: a.mr.RKey()}}); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, b.cq); wc.Status != ib.WRFlushErr || wc.ID != 10 {
		t.Fatalf("after error: %+v", wc)
	}

	// A guessed rkey (a's lkey, or a's rkey plus one) is refused too.
	c, d := newEndpoint(t, td.path, allAccess), newEndpoint(t, td.path, allAccess)
	connect(t, c, d, ib.RemoteWrite)
	for _, key := range []uint32{d.mr.LKey(), d.mr.RKey() + 1, a.mr.RKey()} {
		c2, d2 := newEndpoint(t, td.path, allAccess), d
		_ = c2
		if _, err := c.qp.PostSend([]verbs.SendWR{{ID: 11, Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: []ib.SGE{c.mr.SGE(0, 8)}, RemoteAddr: d2.mr.IOVA(), RKey: key}}); err != nil {
			t.Fatal(err)
		}
		wc := waitWC(t, c.cq)
		if wc.Status != ib.RemAccessErr && wc.Status != ib.WRFlushErr {
			t.Fatalf("rkey %#x: %v", key, wc.Status)
		}
	}
	if !bytes.Equal(d.mem.Bytes()[:8], make([]byte, 8)) {
		t.Fatal("d's memory changed")
	}

	// b's local SGE naming a's lkey is a protection error, not a's data.
	e1, e2 := newEndpoint(t, td.path, allAccess), newEndpoint(t, td.path, allAccess)
	connect(t, e1, e2, ib.RemoteWrite)
	copy(a.mem.Bytes()[:6], "secret")
	if _, err := e1.qp.PostSend([]verbs.SendWR{{ID: 12, Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: []ib.SGE{{Addr: a.mr.IOVA(), Length: 6, LKey: a.mr.LKey()}}, RemoteAddr: e2.mr.IOVA(), RKey: e2.mr.RKey()}}); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, e1.cq); wc.Status != ib.LocProtErr {
		t.Fatalf("foreign lkey: %v", wc.Status)
	}
	if bytes.Contains(e2.mem.Bytes()[:64], []byte("secret")) {
		t.Fatal("a's data leaked through a foreign lkey")
	}
}

func TestControlErrors(t *testing.T) {
	td := startDaemon(t, daemon.Options{})
	e := newEndpoint(t, td.path, allAccess)
	if err := e.pd.Dealloc(); !errors.Is(err, unix.EBUSY) {
		t.Errorf("dealloc a PD with an MR and a QP: %v", err)
	}
	if err := e.cq.Destroy(); !errors.Is(err, unix.EBUSY) {
		t.Errorf("destroy a CQ with a QP: %v", err)
	}
	if _, err := e.pd.RegMR(e.mem, 0, 64, 0, ib.RemoteWrite); !errors.Is(err, unix.EINVAL) {
		t.Errorf("remote write without local write: %v", err)
	}
	if _, err := e.c.CreateCQ(1 << 30); !errors.Is(err, unix.EINVAL) {
		t.Errorf("huge CQ: %v", err)
	}
	// Posting before RTS is refused at once, as ibv_post_send does.
	f := newEndpoint(t, td.path, allAccess)
	if _, err := f.qp.PostSend([]verbs.SendWR{{Opcode: ib.Send}}); !errors.Is(err, verbs.ErrQPState) {
		t.Errorf("post in RESET: %v", err)
	}
	if _, err := f.qp.PostRecv([]verbs.RecvWR{{SG: make([]ib.SGE, 3)}}); !errors.Is(err, verbs.ErrQPState) {
		t.Errorf("recv in RESET: %v", err)
	}
	bad := ib.QPAttr{State: ib.RTS}
	if err := f.qp.Modify(&bad, ib.AttrState); !errors.Is(err, unix.EINVAL) {
		t.Errorf("RESET→RTS: %v", err)
	}
	// Orderly teardown works.
	if err := f.qp.Destroy(); err != nil {
		t.Fatal(err)
	}
	if err := f.mr.Dereg(); err != nil {
		t.Fatal(err)
	}
	if err := f.cq.Destroy(); err != nil {
		t.Fatal(err)
	}
	if err := f.pd.Dealloc(); err != nil {
		t.Fatal(err)
	}
}

// rawConn speaks the protocol by hand, to send what the client never would.
func rawConn(t *testing.T, path string) *proto.Conn {
	c, err := netDialPacket(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestHostileControlMessages(t *testing.T) {
	td := startDaemon(t, daemon.Options{})
	c := rawConn(t, td.path)
	roundTrip := func(op proto.Op, body any, fds ...int) (proto.Header, string) {
		t.Helper()
		if err := c.Send(proto.Header{Op: op, Seq: 1}, body, fds...); err != nil {
			t.Fatal(err)
		}
		h, b, rfds, err := c.Recv()
		if err != nil {
			t.Fatal(err)
		}
		proto.CloseFDs(rfds)
		return h, string(b)
	}
	if h, msg := roundTrip(proto.OpAllocPD, nil); h.Errno != uint32(unix.EPROTO) {
		t.Errorf("op before open: %v %q", unix.Errno(h.Errno), msg)
	}
	if h, _ := roundTrip(proto.OpOpen, &proto.OpenReq{Version: 99}); h.Errno != uint32(unix.EPROTONOSUPPORT) {
		t.Errorf("bad version: %v", unix.Errno(h.Errno))
	}
	if h, _ := roundTrip(proto.OpOpen, []byte{1, 2, 3}); h.Errno != uint32(unix.EINVAL) {
		t.Errorf("short body: %v", unix.Errno(h.Errno))
	}
	if h, _ := roundTrip(proto.OpOpen, &proto.OpenReq{Version: proto.Version}); h.Errno != 0 {
		t.Fatalf("open: %v", unix.Errno(h.Errno))
	}
	if h, _ := roundTrip(proto.Op(999), nil); h.Errno != uint32(unix.EOPNOTSUPP) {
		t.Errorf("unknown op: %v", unix.Errno(h.Errno))
	}
	// An fd on an op that takes none is refused (and closed by the daemon).
	pipe := make([]int, 2)
	if err := unix.Pipe2(pipe, unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pipe[0])
	defer unix.Close(pipe[1])
	if h, _ := roundTrip(proto.OpAllocPD, nil, pipe[0]); h.Errno != uint32(unix.EINVAL) {
		t.Errorf("stray fd: %v", unix.Errno(h.Errno))
	}
	h, _ := roundTrip(proto.OpAllocPD, nil)
	if h.Errno != 0 {
		t.Fatal("alloc pd")
	}
	// Registering memory that is not a sealed memfd: a pipe, and an
	// unsealed memfd that could be truncated under the daemon's mapping.
	reg := &proto.RegMRReq{PD: 1, Access: ib.LocalWrite, Length: 4096, IOVA: 0x1000}
	if h, msg := roundTrip(proto.OpRegMR, reg, pipe[0]); h.Errno != uint32(unix.EINVAL) {
		t.Errorf("MR on a pipe: %v %q", unix.Errno(h.Errno), msg)
	}
	mfd, _ := unix.MemfdCreate("unsealed", unix.MFD_CLOEXEC)
	if err := unix.Ftruncate(mfd, 8192); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(mfd)
	if h, msg := roundTrip(proto.OpRegMR, reg, mfd); h.Errno != uint32(unix.EINVAL) || !strings.Contains(msg, "seal") {
		t.Errorf("MR on an unsealed memfd: %v %q", unix.Errno(h.Errno), msg)
	}
	// A sealed memfd shorter than the MR claims.
	m, _ := AllocMem(4096)
	defer m.Free()
	reg.Length = 1 << 20
	if h, _ := roundTrip(proto.OpRegMR, reg, m.fd); h.Errno != uint32(unix.EINVAL) {
		t.Errorf("MR beyond the memfd: %v", unix.Errno(h.Errno))
	}
	reg.Length, reg.IOVA = 4096, ^uint64(0)-10
	if h, _ := roundTrip(proto.OpRegMR, reg, m.fd); h.Errno != uint32(unix.EINVAL) {
		t.Errorf("MR wrapping the address space: %v", unix.Errno(h.Errno))
	}
	if h, _ := roundTrip(proto.OpModifyQP, &proto.ModifyQPReq{QP: 1, Mask: 1 << 30}); h.Errno != uint32(unix.ENOENT) {
		t.Errorf("modify of a PD's handle: %v", unix.Errno(h.Errno))
	}
	// The daemon still serves others.
	e := newEndpoint(t, td.path, allAccess)
	if e.qp.QPN() == 0 {
		t.Fatal("no QPN")
	}
	// The mask goes to the device as it is: bits ibv_modify_qp does not
	// know are refused there.
	if err := e.qp.Modify(&ib.QPAttr{State: ib.Init, Port: 1}, ib.AttrState|ib.AttrPKeyIndex|ib.AttrPort|1<<30); !errors.Is(err, unix.EINVAL) {
		t.Errorf("unknown mask bits: %v", err)
	}
}

// A client that scribbles garbage into its SQ ring gets an error completion
// and an errored QP; the daemon keeps serving.
func TestGarbageInSQRing(t *testing.T) {
	td := startDaemon(t, daemon.Options{})
	a, b := newEndpoint(t, td.path, allAccess), newEndpoint(t, td.path, allAccess)
	connect(t, a, b, ib.RemoteWrite)
	s := a.qp.sqp.Reserve()
	for i := range s {
		s[i] = 0xff // opcode 255, 255 SGEs
	}
	s[0] = 42
	if _, err := a.qp.sqp.Commit(); err != nil {
		t.Fatal(err)
	}
	wc := waitWC(t, a.cq)
	if wc.Status == ib.Success || wc.ID == 0 {
		t.Fatalf("garbage WQE completed %+v", wc)
	}
	if td.srv.BadWQEs.Load() == 0 {
		t.Fatal("bad WQE not counted")
	}
	// As an RNIC does with a malformed WQE, the QP went to the error
	// state: what is posted after is flushed.
	if attr, err := a.qp.Query(); err != nil || attr.State != ib.Err {
		t.Fatalf("QP after a malformed WQE: %v %v", attr.State, err)
	}
	if _, err := a.qp.PostSend([]verbs.SendWR{{ID: 43, Opcode: ib.Send, SG: []ib.SGE{a.mr.SGE(0, 8)}}}); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, a.cq); wc.ID != 43 || wc.Status != ib.WRFlushErr {
		t.Fatalf("WR after the malformed one: %+v", wc)
	}
	// b is unaffected.
	if _, err := b.qp.PostRecv([]verbs.RecvWR{{ID: 1, SG: []ib.SGE{b.mr.SGE(0, 16)}}}); err != nil {
		t.Fatal(err)
	}
}

// A client that scribbles garbage into its RQ ring after two receives
// gets them flushed, then the garbage's error completion: an error of the
// receive queue takes the QP to ERR, whatever its type.
func TestGarbageInRQRing(t *testing.T) {
	td := startDaemon(t, daemon.Options{})
	a, b := newEndpoint(t, td.path, allAccess), newEndpoint(t, td.path, allAccess)
	connect(t, a, b, ib.RemoteWrite)
	if _, err := a.qp.PostRecv([]verbs.RecvWR{{ID: 1, SG: []ib.SGE{a.mr.SGE(0, 16)}}, {ID: 2, SG: []ib.SGE{a.mr.SGE(16, 16)}}}); err != nil {
		t.Fatal(err)
	}
	s := a.qp.rqp.Reserve()
	clear(s)
	s[0] = 42
	s[8] = 200 // SGEs the slot cannot hold
	if _, err := a.qp.rqp.Commit(); err != nil {
		t.Fatal(err)
	}
	for _, want := range []ib.WC{{ID: 1, Status: ib.WRFlushErr}, {ID: 2, Status: ib.WRFlushErr}, {ID: 42, Status: ib.LocQPOpErr}} {
		if wc := waitWC(t, a.cq); wc.ID != want.ID || wc.Status != want.Status || !wc.IsRecv {
			t.Fatalf("got %+v, want wr_id %d %v", wc, want.ID, want.Status)
		}
	}
	if td.srv.BadWQEs.Load() != 1 {
		t.Fatalf("%d bad WQEs counted", td.srv.BadWQEs.Load())
	}
	if attr, err := a.qp.Query(); err != nil || attr.State != ib.Err {
		t.Fatalf("QP after a malformed receive: %v %v", attr.State, err)
	}
}

// A malformed WR that finds the device's SQ full waits in the ring for
// room, as the WRs after it do, and is counted once however often the
// daemon meets it meanwhile.
func TestGarbageWaitsForRoom(t *testing.T) {
	td := startDaemon(t, daemon.Options{})
	a, b := newEndpoint(t, td.path, allAccess), newEndpoint(t, td.path, allAccess)
	connect(t, a, b, ib.RemoteWrite)
	// b has no receive: each SEND meets RNR NAKs (retried for ever) and
	// holds its slot in a's SQ.
	sends := make([]verbs.SendWR, 128)
	for i := range sends {
		sends[i] = verbs.SendWR{ID: uint64(i + 1), Opcode: ib.Send, Flags: ib.Signaled, SG: []ib.SGE{a.mr.SGE(0, 16)}}
	}
	if _, err := a.qp.PostSend(sends); err != nil {
		t.Fatal(err)
	}
	var s []byte
	for deadline := time.Now().Add(10 * time.Second); s == nil; s = a.qp.sqp.Reserve() {
		if time.Now().After(deadline) {
			t.Fatal("the SQ ring stayed full")
		}
		time.Sleep(time.Millisecond)
	}
	for i := range s {
		s[i] = 0xff // opcode 255, 255 SGEs
	}
	binary.LittleEndian.PutUint64(s, 1000)
	if _, err := a.qp.sqp.Commit(); err != nil {
		t.Fatal(err)
	}
	// The daemon meets it, finds no room, and meets it again at each
	// step while the RNR NAKs keep its engine busy.
	for deadline := time.Now().Add(10 * time.Second); td.srv.BadWQEs.Load() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the malformed WR was not counted")
		}
	}
	time.Sleep(50 * time.Millisecond)
	for i := range 128 {
		if _, err := b.qp.PostRecv([]verbs.RecvWR{{ID: uint64(i), SG: []ib.SGE{b.mr.SGE(0, 16)}}}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 128 {
		if wc := waitWC(t, a.cq); wc.ID != uint64(i+1) || wc.Status != ib.Success {
			t.Fatalf("SEND %d: %+v", i+1, wc)
		}
	}
	if wc := waitWC(t, a.cq); wc.ID != 1000 || wc.Status != ib.LocQPOpErr {
		t.Fatalf("the malformed WR: %+v", wc)
	}
	if n := td.srv.BadWQEs.Load(); n != 1 {
		t.Fatalf("%d bad WQEs counted, want 1", n)
	}
}

func TestSecondDaemonRefused(t *testing.T) {
	td := startDaemon(t, daemon.Options{})
	srv2, err := daemon.NewServer(td.dev, daemon.Options{Group: -1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer srv2.Close(0)
	if err := srv2.Listen(td.path); err == nil || !strings.Contains(err.Error(), "another softrnic daemon") {
		t.Fatalf("second Listen: %v", err)
	}
	// The socket's mode is what was configured.
	fi, err := os.Stat(td.path)
	if err != nil || fi.Mode().Perm() != 0o660 {
		t.Fatalf("socket mode %v %v", fi.Mode(), err)
	}
}

// A client process that dies (SIGKILL, no goodbye) has all its resources
// released, and the daemon keeps serving the others.
func TestClientDeathReleasesEverything(t *testing.T) {
	td := startDaemon(t, daemon.Options{})
	survivor, peer := newEndpoint(t, td.path, allAccess), newEndpoint(t, td.path, allAccess)
	connect(t, survivor, peer, ib.RemoteWrite)
	q0, m0 := td.dev.Resources()

	cmd, out := startChild(t, "hold", td.path)
	ready := make([]byte, 6)
	if _, err := io.ReadFull(out, ready); err != nil || string(ready) != "ready\n" {
		t.Fatalf("child: %q %v", ready, err)
	}
	if n := len(td.srv.Clients()); n != 3 {
		t.Fatalf("%d clients, want 3", n)
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	var info daemon.ClientInfo
	select {
	case info = <-td.gone:
	case <-time.After(10 * time.Second):
		t.Fatal("daemon did not notice the death")
	}
	if info.PID != int32(cmd.Process.Pid) || info.QPs != 2 || info.MRs != 2 || info.CQs != 1 || info.PDs != 1 {
		t.Fatalf("released %+v", info)
	}
	if q, m := td.dev.Resources(); q != q0 || m != m0 {
		t.Fatalf("%d QPs and %d MRs live, want %d and %d", q, m, q0, m0)
	}
	// The survivors still work.
	copy(survivor.mem.Bytes(), "still here")
	if _, err := survivor.qp.PostSend([]verbs.SendWR{{ID: 1, Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: []ib.SGE{survivor.mr.SGE(0, 10)}, RemoteAddr: peer.mr.IOVA(), RKey: peer.mr.RKey()}}); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, survivor.cq); wc.Status != ib.Success || string(peer.mem.Bytes()[:10]) != "still here" {
		t.Fatalf("survivor: %+v", wc)
	}
}

// Only root, the daemon's user and the control group may use the RNIC: the
// socket file mode is the first gate, SO_PEERCRED the second.
func TestPeerCredentials(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a client as another user")
	}
	// Everything the other user touches (the test binary, the socket's
	// directory) must be reachable by it.
	dir, err := os.MkdirTemp("", "softrnic-cred-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	exe, _ := os.Executable()
	bin, _ := os.ReadFile(exe)
	childExe = filepath.Join(dir, "client.test")
	if err := os.WriteFile(childExe, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	defer func() { childExe = "" }()
	sub := func(name string) string {
		d := filepath.Join(dir, name)
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		return d
	}
	// Mode 0666 opens the file to everyone: the credential check must hold.
	td := startDaemonIn(t, sub("a"), daemon.Options{Mode: 0o666})
	cmd, out := startChildAs(t, "dial", td.path, 65534, 65534)
	msg, _ := io.ReadAll(out)
	cmd.Wait()
	if !strings.Contains(string(msg), "operation not permitted") {
		t.Fatalf("nobody was let in: %q", msg)
	}
	if td.srv.RejectedConn.Load() != 1 {
		t.Fatal("rejection not counted")
	}
	// With the group configured, a member is let in.
	td2 := startDaemonIn(t, sub("b"), daemon.Options{Mode: 0o666, Group: 65534})
	cmd, out = startChildAs(t, "dial", td2.path, 65534, 65534)
	msg, _ = io.ReadAll(out)
	cmd.Wait()
	if !strings.Contains(string(msg), "opened") {
		t.Fatalf("group member refused: %q", msg)
	}
	// Mode 0660 keeps others out at the file.
	td3 := startDaemonIn(t, sub("c"), daemon.Options{})
	cmd, out = startChildAs(t, "dial", td3.path, 65534, 65534)
	msg, _ = io.ReadAll(out)
	cmd.Wait()
	if !strings.Contains(string(msg), "permission denied") {
		t.Fatalf("socket mode did not keep nobody out: %q", msg)
	}
}

// SIGTERM's path: the server moves QPs to error, the client sees flush
// completions for its outstanding receives, then the connection closes.
func TestShutdownFlushes(t *testing.T) {
	td := startDaemon(t, daemon.Options{})
	a, b := newEndpoint(t, td.path, allAccess), newEndpoint(t, td.path, allAccess)
	connect(t, a, b, ib.RemoteWrite)
	for i := uint64(1); i <= 5; i++ {
		if _, err := b.qp.PostRecv([]verbs.RecvWR{{ID: i, SG: []ib.SGE{b.mr.SGE(0, 64)}}}); err != nil {
			t.Fatal(err)
		}
	}
	// Close at once: receives still in the ring are drained and flushed too.
	td.srv.Close(time.Second)
	for i := uint64(1); i <= 5; i++ {
		wc := waitWC(t, b.cq)
		if wc.ID != i || wc.Status != ib.WRFlushErr || !wc.IsRecv {
			t.Fatalf("completion %d: %+v", i, wc)
		}
	}
	if _, err := b.c.AllocPD(); err == nil {
		t.Fatal("daemon still serving after Close")
	}
	if qps, mrs := td.dev.Resources(); qps+mrs != 0 {
		t.Fatalf("left behind: %d QPs %d MRs", qps, mrs)
	}
}

// Posting and polling through the daemon allocate nothing, on either side
// (client, engine, rings, loopback device all run in this process).
func TestPostPollZeroAllocs(t *testing.T) {
	td := startDaemon(t, daemon.Options{})
	a, b := newEndpoint(t, td.path, allAccess), newEndpoint(t, td.path, allAccess)
	connect(t, a, b, ib.RemoteWrite)
	w := []verbs.SendWR{{ID: 1, Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: []ib.SGE{a.mr.SGE(0, 64)}, RemoteAddr: b.mr.IOVA(), RKey: b.mr.RKey()}}
	var wcs [4]ib.WC
	roundTrip := func() {
		if _, err := a.qp.PostSend(w); err != nil {
			t.Fatal(err)
		}
		for a.cq.Poll(wcs[:]) == 0 {
			runtime.Gosched() // AllocsPerRun runs with GOMAXPROCS=1: let the engine run
		}
	}
	for i := 0; i < 100; i++ {
		roundTrip()
	}
	if n := testing.AllocsPerRun(500, roundTrip); n != 0 {
		t.Fatalf("%v allocs per post→poll through the daemon", n)
	}
}

var (
	childMu  sync.Mutex
	childExe string // a copy of the test binary other users can run, when set
)

func startChild(t *testing.T, role, path string) (*exec.Cmd, io.Reader) {
	return startChildAs(t, role, path, -1, -1)
}

func startChildAs(t *testing.T, role, path string, uid, gid int) (*exec.Cmd, io.Reader) {
	t.Helper()
	childMu.Lock()
	defer childMu.Unlock()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if childExe != "" {
		exe = childExe
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), "SOFTRNIC_CLIENT_CHILD="+role, "SOFTRNIC_CONTROL="+path)
	if uid >= 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}}
	}
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	return cmd, out
}

// child runs a client role in a separate process.
func child(role, path string) int {
	c, err := Dial(path)
	if role == "dial" {
		if err != nil {
			fmt.Println(err)
			return 0
		}
		// Open succeeded; an operation proves the daemon serves us.
		if _, err := c.AllocPD(); err != nil {
			fmt.Println(err)
			return 0
		}
		fmt.Println("opened")
		return 0
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// hold: create resources, say so, and wait to be killed.
	pd, err := c.AllocPD()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	mem, _ := AllocMem(1 << 16)
	for i := 0; i < 2; i++ {
		if _, err := pd.RegMR(mem, i*4096, 4096, 0, allAccess); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	cq, err := c.CreateCQ(64)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	for i := 0; i < 2; i++ {
		if _, err := pd.CreateQP(&verbs.QPInitAttr{Type: ib.RC, SendCQ: cq, RecvCQ: cq, Cap: ib.QPCaps{MaxSendWR: 16, MaxRecvWR: 16}}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	fmt.Println("ready")
	time.Sleep(time.Minute) // bounded: the parent kills us long before
	return 1
}

// One client cannot exhaust the daemon: its objects and the bytes of its
// memory the daemon maps are bounded; MRs on one memfd share a mapping,
// which counts until it is really unmapped; all of it goes with the
// client.
func TestPerClientLimits(t *testing.T) {
	var lim daemon.Limits
	lim[daemon.Objects][daemon.PerConn] = 3
	lim[daemon.MRBytes][daemon.PerConn] = 3 << 16
	td := startDaemon(t, daemon.Options{Limits: lim})
	c, err := Dial(td.path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pd, _ := c.AllocPD()
	var mems []*Mem
	for i := 0; i < 4; i++ {
		m, _ := AllocMem(1 << 16)
		defer m.Free()
		mems = append(mems, m)
	}
	var mrs []verbs.MR
	for i := 0; i < 3; i++ {
		mr, err := pd.RegMR(mems[i], 0, 1<<16, 0, ib.LocalWrite)
		if err != nil {
			t.Fatalf("MR %d: %v", i, err)
		}
		mrs = append(mrs, mr)
	}
	if _, err := pd.RegMR(mems[3], 0, 4096, 0, ib.LocalWrite); !errors.Is(err, unix.ENOMEM) {
		t.Fatalf("MR beyond the mr-bytes limit: %v", err)
	}
	// Another MR in memory already mapped costs no bytes.
	mr, err := pd.RegMR(mems[0], 8192, 4096, 0, ib.LocalWrite)
	if err != nil {
		t.Fatalf("MR in a mapped memfd: %v", err)
	}
	// The mapping counts until its last MR goes (here, with no QP, it is
	// unmapped at once).
	mrs[0].Dereg()
	if _, err := pd.RegMR(mems[3], 0, 4096, 0, ib.LocalWrite); !errors.Is(err, unix.ENOMEM) {
		t.Fatalf("MR beyond the limit while the mapping is in use: %v", err)
	}
	mr.Dereg()
	if _, err := pd.RegMR(mems[3], 0, 1<<16, 0, ib.LocalWrite); err != nil {
		t.Fatalf("MR after the mapping went: %v", err)
	}
	if _, err := c.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if _, err := pd.CreateAH(&ib.AddressVector{DGID: gid}); err != nil { // 3rd object
		t.Fatal(err)
	}
	if _, err := c.AllocPD(); !errors.Is(err, unix.ENOMEM) {
		t.Fatalf("object beyond the objects limit: %v", err)
	}
	if u := td.srv.Usage(); u.Refusals[daemon.MRBytes][daemon.PerConn] != 2 || u.Refusals[daemon.Objects][daemon.PerConn] != 1 {
		t.Fatalf("refusals counted: %v", u.Refusals)
	}
	c.Close()
	<-td.gone
	if u := td.srv.Usage(); u.Host != [daemon.NumResources]int64{} {
		t.Fatalf("the host still holds %v after the client went", u.Host)
	}
}

// Address handles are the session's own objects: a UD WR naming a handle
// that is not one of its client's AHs (another client's number, its own
// PD's) completes in error and sends nothing; an AH holds its PD; AHs
// count against the objects limit and go with their client.
func TestAddressHandlesAreIsolated(t *testing.T) {
	var lim daemon.Limits
	lim[daemon.Objects][daemon.PerConn] = 16
	td := startDaemon(t, daemon.Options{Limits: lim})
	ud := func() *endpoint {
		e := newEndpoint(t, td.path, ib.LocalWrite)
		qp, err := e.pd.CreateQP(&verbs.QPInitAttr{Type: ib.UD, SendCQ: e.cq, RecvCQ: e.cq,
			Cap: ib.QPCaps{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}})
		if err != nil {
			t.Fatal(err)
		}
		e.qp = qp.(*QP)
		for _, s := range []ib.QPState{ib.Init, ib.RTR, ib.RTS} {
			req, _, _ := ib.Transition(ib.UD, e.qp.State(), s)
			if err := e.qp.Modify(&ib.QPAttr{State: s, Port: 1, QKey: 0x22}, ib.AttrState|req); err != nil {
				t.Fatal(err)
			}
		}
		return e
	}
	a, b := ud(), ud()
	vah, err := a.pd.CreateAH(&ib.AddressVector{DGID: gid})
	if err != nil {
		t.Fatal(err)
	}
	ah := vah.(*AH)
	if _, err := a.qp.PostRecv([]verbs.RecvWR{{ID: 1, SG: []ib.SGE{a.mr.SGE(0, 256)}}}); err != nil {
		t.Fatal(err)
	}
	// b names a's AH's number, and numbers of its own PD, MR, CQ, QP.
	for _, h := range []proto.Handle{ah.h, b.pd.h, b.mr.h, b.cq.h, b.qp.h} {
		forged := &AH{c: b.c, h: h}
		if _, err := b.qp.PostSend([]verbs.SendWR{{ID: uint64(h), Opcode: ib.Send, Flags: ib.Signaled,
			SG: []ib.SGE{b.mr.SGE(0, 8)}, AH: forged, RemoteQPN: a.qp.QPN(), RemoteQKey: 0x22}}); err != nil {
			t.Fatal(err)
		}
		if wc := waitWC(t, b.cq); wc.Status == ib.Success || wc.ID != uint64(h) {
			t.Fatalf("UD WR naming handle %d, not an AH of the client: %+v", h, wc)
		}
	}
	// a's own AH works: the one SEND that arrives is a's.
	copy(a.mem.Bytes()[1000:], "to myself")
	if _, err := a.qp.PostSend([]verbs.SendWR{{ID: 9, Opcode: ib.Send, Flags: ib.Signaled,
		SG: []ib.SGE{a.mr.SGE(1000, 9)}, AH: ah, RemoteQPN: a.qp.QPN(), RemoteQKey: 0x22}}); err != nil {
		t.Fatal(err)
	}
	for got := 0; got < 2; got++ {
		wc := waitWC(t, a.cq)
		if wc.Status != ib.Success || wc.IsRecv && (wc.SrcQP != a.qp.QPN() || string(a.mem.Bytes()[40:49]) != "to myself") {
			t.Fatalf("a's own datagram: %+v %q", wc, a.mem.Bytes()[40:49])
		}
	}
	// The AH holds its PD.
	if err := a.pd.Dealloc(); !errors.Is(err, unix.EBUSY) {
		t.Fatalf("PD with an AH deallocated: %v", err)
	}
	// AHs count against the client's objects.
	var n int
	for ; n < 32; n++ {
		if _, err := b.pd.CreateAH(&ib.AddressVector{DGID: gid}); err != nil {
			if !errors.Is(err, unix.ENOMEM) {
				t.Fatalf("AH %d: %v", n, err)
			}
			break
		}
	}
	if n == 32 {
		t.Fatal("AHs beyond the objects limit")
	}
	// They go with their client.
	b.c.Close()
	select {
	case info := <-td.gone:
		if info.AHs != n {
			t.Fatalf("released %+v, want %d AHs", info, n)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the daemon did not release the client")
	}
}

// While traffic flows, posting and polling through the daemon are memory
// operations on both sides: over a SEND ping-pong whose ends busy-poll
// their CQs, the daemon's engine keeps fetching (its spin window is made
// long here, so that a loaded host descheduling the test for a while does
// not let it nap), no post rings it and no completion rings a client. A
// client that sleeps in Poll instead is rung for its completions, which
// shows the counters count: it goes to sleep before its peer replies,
// since on one device the reply loops back within Poll's spin.
func TestSteadyStateMakesNoSyscalls(t *testing.T) {
	dev := testlink.LoopbackWith(t, 1024, engine.Options{SpinFor: time.Minute, SpinMax: -1})
	td := startDaemonOn(t, dev, t.TempDir(), daemon.Options{})
	a, b := newEndpoint(t, td.path, allAccess), newEndpoint(t, td.path, allAccess)
	connect(t, a, b, 0)
	recv := func(e *endpoint) {
		if _, err := e.qp.PostRecv([]verbs.RecvWR{{ID: 7, SG: []ib.SGE{e.mr.SGE(4096, 64)}}}); err != nil {
			t.Fatal(err)
		}
	}
	send := func(e *endpoint) {
		if _, err := e.qp.PostSend([]verbs.SendWR{{ID: 1, Opcode: ib.Send, Flags: ib.Signaled, SG: []ib.SGE{e.mr.SGE(0, 64)}}}); err != nil {
			t.Fatal(err)
		}
	}
	// wait spins until e's CQ held a receive completion (recv) or a send
	// completion.
	wait := func(e *endpoint, recv bool) {
		var wcs [1]ib.WC
		deadline := time.Now().Add(10 * time.Second)
		for {
			n := e.cq.Poll(wcs[:])
			if n == 1 && wcs[0].Status != ib.Success {
				t.Fatalf("completion %+v", wcs[0])
			}
			if n == 1 && wcs[0].IsRecv == recv {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("no completion (receive: %v)", recv)
			}
			if n == 0 {
				runtime.Gosched()
			}
		}
	}
	// asleep runs reply once a is asleep in Poll, its CQ empty.
	asleep := func(reply func()) {
		wait(a, false) // a's own SEND's completion: its CQ is empty after it
		s := a.c.Sleeps.Load()
		done := make(chan struct{})
		go func() { defer close(done); a.c.Poll() }()
		for deadline := time.Now().Add(10 * time.Second); a.c.Sleeps.Load() == s; runtime.Gosched() {
			if time.Now().After(deadline) {
				t.Error("Poll never slept on an empty CQ")
				break
			}
		}
		reply()
		<-done
	}
	pingpong := func(n int, sleep bool) {
		for range n {
			recv(a)
			recv(b)
			send(a)
			wait(b, true)
			if sleep {
				asleep(func() { send(b) })
			} else {
				send(b)
			}
			wait(a, true)
		}
	}
	counts := func() (posts, wakes, cqs, sleeps uint64) {
		return a.c.Doorbells.Load() + b.c.Doorbells.Load(), td.srv.Wakes.Load(), td.srv.CQDoorbells.Load(), a.c.Sleeps.Load()
	}
	pingpong(100, false) // warm up: the engine's spin window adapts
	const n = 2000
	p0, w0, c0, s0 := counts()
	pingpong(n, false)
	p1, w1, c1, s1 := counts()
	t.Logf("%d round trips, both ends spinning: %d posts rang the engine (%d wake-ups), %d completions rang a client, %d polls slept",
		n, p1-p0, w1-w0, c1-c0, s1-s0)
	if p1-p0 != 0 || c1-c0 != 0 || s1-s0 != 0 {
		t.Errorf("%d round trips (%d posts): %d doorbells to the engine, %d to the clients, %d sleeps", n, 4*n, p1-p0, c1-c0, s1-s0)
	}
	pingpong(n/10, true)
	_, _, c2, s2 := counts()
	t.Logf("%d round trips, one end asleep in Poll: %d completions rang it, %d polls slept", n/10, c2-c1, s2-s1)
	if c2-c1 == 0 || s2-s1 == 0 {
		t.Errorf("a client asleep in Poll was never rung (%d) or never slept (%d)", c2-c1, s2-s1)
	}
}

// Poll gives its CPU away between looks at empty CQs only while
// completions flow, that is after a Poll that found one: an idle client
// goes to sleep without a yield, and one whose completions stopped coming
// yields for one Poll, then sleeps, and stops yielding.
func TestPollYieldsOnlyWhileFlowing(t *testing.T) {
	td := startDaemon(t, daemon.Options{})
	a, b := newEndpoint(t, td.path, allAccess), newEndpoint(t, td.path, allAccess)
	connect(t, a, b, 0)
	poll := func(what string, want bool) (yields, sleeps uint64) {
		y, s := a.c.Yields.Load(), a.c.Sleeps.Load()
		if got := a.c.Poll(); got != want {
			t.Fatalf("%s: Poll reported %v", what, got)
		}
		return a.c.Yields.Load() - y, a.c.Sleeps.Load() - s
	}
	if y, s := poll("idle", false); y != 0 || s != 1 {
		t.Errorf("idle: %d yields, %d sleeps; want 0 and 1", y, s)
	}
	if _, err := b.qp.PostRecv([]verbs.RecvWR{{ID: 7, SG: []ib.SGE{b.mr.SGE(4096, 64)}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.qp.PostSend([]verbs.SendWR{{ID: 1, Opcode: ib.Send, Flags: ib.Signaled, SG: []ib.SGE{a.mr.SGE(0, 64)}}}); err != nil {
		t.Fatal(err)
	}
	// The SEND's completion, found by a Poll that spins briefly or sleeps
	// until its doorbell: no yield, since nothing flowed before.
	y0 := a.c.Yields.Load()
	for deadline := time.Now().Add(10 * time.Second); !a.c.Poll(); {
		if time.Now().After(deadline) {
			t.Fatal("no completion for a's SEND")
		}
	}
	if y := a.c.Yields.Load() - y0; y != 0 {
		t.Errorf("a completion after idle Polls: %d yields, want 0", y)
	}
	var wcs [1]ib.WC
	if n := a.cq.Poll(wcs[:]); n != 1 || wcs[0].Status != ib.Success {
		t.Fatalf("a's SEND: %d completions %+v", n, wcs[0])
	}
	if y, s := poll("after a completion", false); y == 0 || s != 1 {
		t.Errorf("after a completion, with none coming: %d yields, %d sleeps; want some and 1", y, s)
	}
	if y, s := poll("idle again", false); y != 0 || s != 1 {
		t.Errorf("idle again: %d yields, %d sleeps; want 0 and 1", y, s)
	}
}

// TestRecoveryPerQP: a QP's loss recovery chosen through the client
// reaches the daemon's device; without one it takes the device's; a mode
// that does not exist is refused.
func TestRecoveryPerQP(t *testing.T) {
	td := startDaemon(t, daemon.Options{})
	e := newEndpoint(t, td.path, allAccess)
	mk := func(r ib.Recovery) (verbs.QP, error) {
		return e.pd.CreateQP(&verbs.QPInitAttr{Type: ib.RC, SendCQ: e.cq, RecvCQ: e.cq, Recovery: r,
			Cap: ib.QPCaps{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	}
	want := map[uint32]ib.Recovery{e.qp.QPN(): ib.RecoverySelective}
	for _, r := range []ib.Recovery{ib.RecoveryAdaptive, ib.RecoveryTimeout, ib.RecoverySelective} {
		q, err := mk(r)
		if err != nil {
			t.Fatal(err)
		}
		want[q.QPN()] = r
	}
	got := map[uint32]ib.Recovery{}
	td.dev.EachQPCounters(func(c *rnic.QPCounters) {
		if c.Type == ib.RC {
			got[c.QPN] = c.Recovery
		}
	})
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("the device's QPs run %v, want %v", got, want)
	}
	if _, err := mk(7); !errors.Is(err, unix.EINVAL) {
		t.Fatalf("recovery 7: %v", err)
	}
}

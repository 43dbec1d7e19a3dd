package verbs_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/cm"
	"github.com/softrnic/softrnic/daemon"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/testlink"
	"github.com/softrnic/softrnic/rdmacm"
	"github.com/softrnic/softrnic/rnic"
	"github.com/softrnic/softrnic/verbs"
)

// The contract tests run the same application code on every RNIC a tool
// can run on: a device of this process, and a softrnic daemon's through
// package client. Both implement verbs (and rdmacm.CM, with an agent on
// the in-process device), directly: there is no adapter in between.
var (
	_ verbs.Device     = (*rnic.Device)(nil)
	_ verbs.Device     = (*client.Client)(nil)
	_ verbs.PD         = (*rnic.PD)(nil)
	_ verbs.PD         = (*client.PD)(nil)
	_ verbs.MR         = (*rnic.MR)(nil)
	_ verbs.MR         = (*client.MR)(nil)
	_ verbs.CQ         = (*rnic.CQ)(nil)
	_ verbs.CQ         = (*client.CQ)(nil)
	_ verbs.QP         = (*rnic.QP)(nil)
	_ verbs.QP         = (*client.QP)(nil)
	_ verbs.SRQ        = (*rnic.SRQ)(nil)
	_ verbs.AH         = (*rnic.AH)(nil)
	_ verbs.AH         = (*client.AH)(nil)
	_ verbs.RecvSyncer = (*client.QP)(nil)
	_ verbs.Locker     = (*rnic.QP)(nil)
	_ verbs.Notifier   = (*rnic.CQ)(nil)
	_ rdmacm.CM        = (*rdmacm.Agent)(nil)
	_ rdmacm.CM        = (*client.Client)(nil)
)

// testbed is two devices joined by an in-memory link, each driven by its
// engine, and a daemon serving device A: the three RNICs a tool can run
// on (A in process, A through the daemon, B in process), with rdma_cm on
// each (agents on A and B; the daemon uses A's).
type testbed struct {
	a, b, d       verbs.Device
	acm, bcm, dcm rdmacm.CM
}

func newTestbed(t testing.TB) *testbed {
	devA, devB := testlink.Pair(t, 1024)
	agent := func(dev *rnic.Device) *rdmacm.Agent {
		a, err := rdmacm.New(rdmacm.Config{Device: dev, Resolve: dev.Config().Resolve})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { a.Close() })
		return a
	}
	aa, ba := agent(devA), agent(devB)
	srv, err := daemon.NewServer(devA, daemon.Options{Group: -1, CM: aa, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	sock := t.TempDir() + "/ctl.sock"
	if err := srv.Listen(sock); err != nil {
		t.Fatal(err)
	}
	go func() {
		if err := srv.Serve(); err != nil {
			t.Error(err)
		}
	}()
	t.Cleanup(func() { srv.Close(time.Second) })
	c, err := client.Dial(sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &testbed{a: devA, b: devB, d: c, acm: aa, bcm: ba, dcm: c}
}

type pair struct {
	name       string
	x, y       verbs.Device
	xcm, ycm   rdmacm.CM
	xIP, yIP   netip.Addr
	xGID, yGID ib.GID
}

func (tb *testbed) pairs() []pair {
	a, b := testlink.AddrA, testlink.AddrB
	return []pair{
		{"inprocess", tb.a, tb.b, tb.acm, tb.bcm, a, b, ib.GIDFrom(a), ib.GIDFrom(b)},
		{"daemon-sends", tb.d, tb.b, tb.dcm, tb.bcm, a, b, ib.GIDFrom(a), ib.GIDFrom(b)},
		{"daemon-receives", tb.b, tb.d, tb.bcm, tb.dcm, b, a, ib.GIDFrom(b), ib.GIDFrom(a)},
	}
}

// end is one side of a connection: its memory, MR, CQ and QP.
type end struct {
	dev verbs.Device
	pd  verbs.PD
	mem verbs.Mem
	mr  verbs.MR
	cq  verbs.CQ
	qp  verbs.QP
	typ ib.QPType
	wcs [4]ib.WC
}

func newEnd(t testing.TB, dev verbs.Device, typ ib.QPType) *end {
	e := &end{dev: dev, typ: typ}
	var err error
	if e.mem, err = dev.AllocMem(1 << 16); err != nil {
		t.Fatal(err)
	}
	if e.pd, err = dev.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if e.mr, err = e.pd.RegMR(e.mem, 0, 1<<16, 0x7000_0000, ib.LocalWrite|ib.RemoteWrite|ib.RemoteRead); err != nil {
		t.Fatal(err)
	}
	if e.mr.IOVA() != 0x7000_0000 || e.mr.Len() != 1<<16 {
		t.Fatalf("MR at %#x, %d bytes", e.mr.IOVA(), e.mr.Len())
	}
	if e.cq, err = dev.CreateCQ(256); err != nil {
		t.Fatal(err)
	}
	if e.qp, err = e.pd.CreateQP(&verbs.QPInitAttr{Type: typ, SendCQ: e.cq, RecvCQ: e.cq,
		Cap: ib.QPCaps{MaxSendWR: 64, MaxRecvWR: 64, MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
		t.Fatal(err)
	}
	if e.qp.Type() != typ || e.qp.State() != ib.Reset || e.qp.QPN() == 0 {
		t.Fatalf("new QP: %v %v %#x", e.qp.Type(), e.qp.State(), e.qp.QPN())
	}
	t.Cleanup(func() {
		e.qp.Destroy()
		e.mr.Dereg()
		e.cq.Destroy()
		e.pd.Dealloc()
		e.mem.Free()
	})
	return e
}

// modify moves e's QP to the state with what IBA requires of the
// transition.
func (e *end) modify(t testing.TB, a ib.QPAttr) {
	t.Helper()
	req, _, _ := ib.Transition(e.typ, e.qp.State(), a.State)
	if err := e.qp.Modify(&a, ib.AttrState|req); err != nil {
		t.Fatalf("%v QP to %v: %v", e.typ, a.State, err)
	}
	if e.qp.State() != a.State {
		t.Fatalf("QP in %v after a Modify to %v", e.qp.State(), a.State)
	}
}

// connect moves x and y to RTS toward each other.
func connect(t testing.TB, x, y *end, p *pair) {
	for _, s := range []struct {
		e    *end
		peer *end
		gid  ib.GID
	}{{x, y, p.yGID}, {y, x, p.xGID}} {
		access := ib.RemoteWrite | ib.RemoteRead
		if s.e.typ == ib.UC {
			access = ib.RemoteWrite // UC has no READ
		}
		s.e.modify(t, ib.QPAttr{State: ib.Init, Port: 1, Access: access, QKey: 0x11111111})
		s.e.modify(t, ib.QPAttr{State: ib.RTR, PathMTU: 1024, DestQPN: s.peer.qp.QPN(), RQPSN: 100, MaxDestRdAtomic: 4,
			AV: ib.AddressVector{DGID: s.gid}})
		s.e.modify(t, ib.QPAttr{State: ib.RTS, SQPSN: 100, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 4})
	}
}

// wait polls e's CQ for one completion, bounded in tries, yielding between.
func (e *end) wait(t testing.TB) ib.WC {
	for i := 0; i < 50_000_000; i++ {
		if e.cq.Poll(e.wcs[:1]) == 1 {
			if e.wcs[0].Status != ib.Success {
				t.Fatalf("completion %+v", e.wcs[0])
			}
			return e.wcs[0]
		}
		runtime.Gosched()
	}
	t.Fatal("no completion")
	return ib.WC{}
}

// sync waits until the daemon holds every receive posted on e (no-op in
// process).
func (e *end) sync(t testing.TB) {
	if rs, ok := e.qp.(verbs.RecvSyncer); ok {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := rs.SyncRecv(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// peerRead runs fn under y's QP lock where the device has one (the engine
// writes the memory there, without a completion to order it).
func peerRead(q verbs.QP, fn func()) {
	if l, ok := q.(verbs.Locker); ok {
		l.WithLock(fn)
		return
	}
	fn()
}

// Every WR kind the tools use works on every RNIC, for RC, UC and UD:
// SEND into a posted receive, WRITE and READ into and out of the peer's
// MR; bytes checked; Query reports what Modify set.
func TestVerbsOnEveryRNIC(t *testing.T) {
	tb := newTestbed(t)
	for _, p := range tb.pairs() {
		for _, typ := range []ib.QPType{ib.RC, ib.UC, ib.UD} {
			t.Run(p.name+"/"+typ.String(), func(t *testing.T) {
				x, y := newEnd(t, p.x, typ), newEnd(t, p.y, typ)
				ud := typ == ib.UD
				connect(t, x, y, &p)
				if a, err := x.qp.Query(); err != nil || a.State != ib.RTS || a.SQPSN != 100 || !ud && (a.DestQPN != y.qp.QPN() || a.AV.DGID != p.yGID) {
					t.Fatalf("query %+v %v", a, err)
				}
				var ah verbs.AH
				if ud {
					var err error
					if ah, err = x.pd.CreateAH(&ib.AddressVector{DGID: p.yGID}); err != nil {
						t.Fatal(err)
					}
					defer ah.Destroy()
					if ah.AV().DGID != p.yGID {
						t.Fatalf("AH to %v", ah.AV().DGID)
					}
				}
				// SEND.
				copy(x.mem.Bytes()[100:], "hello through either RNIC")
				rwr := []verbs.RecvWR{{ID: 7, SG: []ib.SGE{{Addr: y.mr.IOVA() + 1000, Length: 200, LKey: y.mr.LKey()}}}}
				if _, err := y.qp.PostRecv(rwr); err != nil {
					t.Fatal(err)
				}
				y.sync(t)
				w := []verbs.SendWR{{ID: 1, Opcode: ib.Send, Flags: ib.Signaled, SG: []ib.SGE{{Addr: x.mr.IOVA() + 100, Length: 25, LKey: x.mr.LKey()}},
					AH: ah, RemoteQPN: y.qp.QPN(), RemoteQKey: 0x11111111}}
				if _, err := x.qp.PostSend(w); err != nil {
					t.Fatal(err)
				}
				if wc := x.wait(t); wc.ID != 1 || wc.IsRecv {
					t.Fatalf("send completion %+v", wc)
				}
				off := 1000
				if ud {
					off += 40 // the GRH slot
				}
				wc := y.wait(t)
				if wc.ID != 7 || !wc.IsRecv || string(y.mem.Bytes()[off:off+25]) != "hello through either RNIC" {
					t.Fatalf("receive %+v: %q", wc, y.mem.Bytes()[off:off+25])
				}
				if ud {
					if wc.SrcQP != x.qp.QPN() || wc.SrcIP != p.xIP {
						t.Fatalf("UD receive from %#x at %v", wc.SrcQP, wc.SrcIP)
					}
					return
				}
				// WRITE.
				copy(x.mem.Bytes()[200:], "written")
				w[0] = verbs.SendWR{ID: 2, Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: []ib.SGE{{Addr: x.mr.IOVA() + 200, Length: 7, LKey: x.mr.LKey()}},
					RemoteAddr: y.mr.IOVA() + 5000, RKey: y.mr.RKey()}
				if _, err := x.qp.PostSend(w); err != nil {
					t.Fatal(err)
				}
				x.wait(t)
				peerMem := func() (s string) {
					peerRead(y.qp, func() { s = string(y.mem.Bytes()[5000:5007]) })
					return s
				}
				if typ == ib.UC {
					// A UC WRITE completes when sent: wait for its arrival.
					for i := 0; i < 5000 && peerMem() != "written"; i++ {
						time.Sleep(time.Millisecond)
					}
				}
				if got := peerMem(); got != "written" {
					t.Fatalf("peer memory %q after WRITE", got)
				}
				if typ == ib.UC {
					return
				}
				// READ.
				peerRead(y.qp, func() { copy(y.mem.Bytes()[6000:], "read back") })
				w[0] = verbs.SendWR{ID: 3, Opcode: ib.RDMARead, Flags: ib.Signaled, SG: []ib.SGE{{Addr: x.mr.IOVA() + 300, Length: 9, LKey: x.mr.LKey()}},
					RemoteAddr: y.mr.IOVA() + 6000, RKey: y.mr.RKey()}
				if _, err := x.qp.PostSend(w); err != nil {
					t.Fatal(err)
				}
				x.wait(t)
				if got := string(x.mem.Bytes()[300:309]); got != "read back" {
					t.Fatalf("READ brought %q", got)
				}
			})
		}
	}
}

// Errors are the same kinds on every RNIC: errors.Is finds the verbs kind
// in process and the errno through the daemon. A refused work request
// comes back as a WRError naming the QP, the queue, the WR's index and
// wr_id and the limit it exceeded.
func TestVerbsErrorsOnEveryRNIC(t *testing.T) {
	tb := newTestbed(t)
	for _, p := range tb.pairs()[:2] {
		t.Run(p.name, func(t *testing.T) {
			x := newEnd(t, p.x, ib.RC)
			wrError := func(what string, n int, err error, queue verbs.Queue, index int, id uint64, kind error, limit string) {
				t.Helper()
				var we *verbs.WRError
				if !errors.As(err, &we) || !errors.Is(err, kind) || !errors.Is(err, syscall.EINVAL) {
					t.Errorf("%s: %v, want a WRError of kind %v (EINVAL)", what, err, kind)
					return
				}
				if n != index || we.QPN != x.qp.QPN() || we.Queue != queue || we.Index != index || we.ID != id ||
					!strings.Contains(err.Error(), limit) {
					t.Errorf("%s: %d posted, %+v (%v); want QP %#x %v WR %d wr_id %#x, naming %s", what, n, *we, err,
						x.qp.QPN(), queue, index, id, limit)
				}
			}
			// RESET→RTS is no transition.
			if err := x.qp.Modify(&ib.QPAttr{State: ib.RTS}, ib.AttrState); !errors.Is(err, syscall.EINVAL) {
				t.Errorf("RESET→RTS: %v", err)
			}
			// A post before RTS is refused at once.
			n, err := x.qp.PostSend([]verbs.SendWR{{ID: 7, Opcode: ib.Send}})
			wrError("send in RESET", n, err, verbs.QueueSQ, 0, 7, verbs.ErrQPState, "RESET")
			// Receives are posted from INIT; the second one has an SGE too
			// many.
			x.modify(t, ib.QPAttr{State: ib.Init, Port: 1, Access: ib.RemoteWrite})
			sge := ib.SGE{Addr: x.mr.IOVA(), Length: 64, LKey: x.mr.LKey()}
			n, err = x.qp.PostRecv([]verbs.RecvWR{{ID: 8, SG: []ib.SGE{sge}}, {ID: 9, SG: []ib.SGE{sge, sge}}})
			wrError("receive of two SGEs", n, err, verbs.QueueRQ, 1, 9, verbs.ErrTooManySGE, "max_recv_sge 1")
			y := newEnd(t, p.y, ib.RC)
			x.modify(t, ib.QPAttr{State: ib.RTR, PathMTU: 1024, DestQPN: y.qp.QPN(), RQPSN: 100, MaxDestRdAtomic: 4,
				AV: ib.AddressVector{DGID: p.yGID}})
			x.modify(t, ib.QPAttr{State: ib.RTS, SQPSN: 100, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 4})
			n, err = x.qp.PostSend([]verbs.SendWR{{ID: 10, Opcode: ib.Send, SG: []ib.SGE{sge, sge}}})
			wrError("send of two SGEs", n, err, verbs.QueueSQ, 0, 10, verbs.ErrTooManySGE, "max_send_sge 1")
			n, err = x.qp.PostSend([]verbs.SendWR{{ID: 11, Opcode: ib.Send, Flags: ib.Inline, InlineData: make([]byte, 4096)}})
			wrError("4 KiB inline", n, err, verbs.QueueSQ, 0, 11, verbs.ErrInlineSize, "max_inline_data")
			if _, err := x.pd.RegMR(x.mem, 0, 64, 0, ib.RemoteWrite); !errors.Is(err, syscall.EINVAL) {
				t.Errorf("remote write without local write: %v", err)
			}
		})
	}
}

// The per-message path — post a receive, post a SEND, poll both CQs — makes
// no allocation on any RNIC (the engines and the daemon's pump run
// meanwhile and are counted too), through the verbs interfaces.
func TestPostPollAllocationFree(t *testing.T) {
	tb := newTestbed(t)
	for _, p := range tb.pairs() {
		t.Run(p.name, func(t *testing.T) {
			x, y := newEnd(t, p.x, ib.RC), newEnd(t, p.y, ib.RC)
			connect(t, x, y, &p)
			rwr := []verbs.RecvWR{{ID: 1, SG: []ib.SGE{{Addr: y.mr.IOVA(), Length: 64, LKey: y.mr.LKey()}}}}
			swr := []verbs.SendWR{{ID: 2, Opcode: ib.Send, Flags: ib.Signaled, SG: []ib.SGE{{Addr: x.mr.IOVA(), Length: 64, LKey: x.mr.LKey()}}}}
			// Receives run 32 ahead of the SENDs, as a tool keeps its RQ
			// filled: one posted now serves a SEND 32 messages later.
			for range 32 {
				if _, err := y.qp.PostRecv(rwr); err != nil {
					t.Fatal(err)
				}
			}
			y.sync(t)
			one := func() {
				if _, err := y.qp.PostRecv(rwr); err != nil {
					t.Fatal(err)
				}
				if _, err := x.qp.PostSend(swr); err != nil {
					t.Fatal(err)
				}
				x.wait(t)
				y.wait(t)
			}
			for range 50 { // warm up: ring pages, engine scratch
				one()
			}
			if n := testing.AllocsPerRun(300, one); n != 0 {
				t.Errorf("%.2f allocations per message", n)
			}
		})
	}
}

// rdma_cm drives an application's QPs the same way on every RNIC: an RC
// connection accepted and connected with QPs the application made (its
// receive posted in INIT before), a SEND over it, Disconnect; a SIDR
// lookup answered with the application's UD QP.
func TestCMOnEveryRNIC(t *testing.T) {
	tb := newTestbed(t)
	port := uint16(7400)
	for _, p := range tb.pairs() {
		port++
		t.Run(p.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			x, y := newEnd(t, p.x, ib.RC), newEnd(t, p.y, ib.RC)
			cp := &rdmacm.ConnParam{Access: ib.RemoteWrite}
			l, err := p.ycm.Listen(port, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			accepted := make(chan error, 1)
			go func() {
				if err := rdmacm.InitQP(y.qp, cp); err != nil {
					accepted <- err
					return
				}
				if _, err := y.qp.PostRecv([]verbs.RecvWR{{ID: 9, SG: []ib.SGE{{Addr: y.mr.IOVA(), Length: 64, LKey: y.mr.LKey()}}}}); err != nil {
					accepted <- err
					return
				}
				r, err := l.GetRequest(ctx)
				if err == nil {
					_, err = r.Accept(ctx, y.qp, cp)
				}
				accepted <- err
			}()
			conn, err := p.xcm.Connect(ctx, x.qp, p.yIP, port, cp)
			if err != nil {
				t.Fatal(err)
			}
			if err := <-accepted; err != nil {
				t.Fatal(err)
			}
			if conn.QP() != x.qp || x.qp.State() != ib.RTS || conn.Peer() != p.yIP {
				t.Fatalf("connection: QP %v in %v to %v", conn.QP(), x.qp.State(), conn.Peer())
			}
			copy(x.mem.Bytes(), "over rdma_cm")
			if _, err := x.qp.PostSend([]verbs.SendWR{{ID: 1, Opcode: ib.Send, Flags: ib.Signaled, SG: []ib.SGE{{Addr: x.mr.IOVA(), Length: 12, LKey: x.mr.LKey()}}}}); err != nil {
				t.Fatal(err)
			}
			x.wait(t)
			if wc := y.wait(t); wc.ID != 9 || string(y.mem.Bytes()[:12]) != "over rdma_cm" {
				t.Fatalf("receive %+v %q", wc, y.mem.Bytes()[:12])
			}
			if err := conn.Disconnect(ctx); err != nil {
				t.Fatal(err)
			}

			// SIDR: y answers with a UD QP; a port nobody serves is refused.
			u := newEnd(t, p.y, ib.UD)
			if err := rdmacm.PrepareUD(u.qp); err != nil {
				t.Fatal(err)
			}
			ul, err := p.ycm.ListenUD(port, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer ul.Close()
			go func() {
				r, err := ul.GetRequest(ctx)
				if err == nil {
					if _, err = r.AV(); err == nil {
						err = r.Accept(u.qp, nil)
					}
				}
				accepted <- err
			}()
			peer, err := p.xcm.ResolveUD(ctx, p.yIP, port, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := <-accepted; err != nil {
				t.Fatal(err)
			}
			if peer.QPN != u.qp.QPN() || peer.QKey != rdmacm.UDPQKey || peer.AV.DGID != p.yGID {
				t.Fatalf("resolved %+v, want QPN %#x", peer, u.qp.QPN())
			}
			var se *rdmacm.SIDRError
			if _, err := p.xcm.ResolveUD(ctx, p.yIP, port+100, nil); !errors.As(err, &se) || se.Status != cm.SIDRUnsupported {
				t.Fatalf("lookup of a port nobody serves: %v", err)
			}
		})
	}
}

// BenchmarkPingPong64 is a 64-byte SEND ping-pong (one round trip per op)
// between two engines on an in-memory link, one side in process or
// through the daemon (in this process: rings, pump and socket are the
// real ones), the other in process: the daemon's own cost per hop,
// without a kernel or another process in the way.
func BenchmarkPingPong64(b *testing.B) {
	for i, side := range []string{"inprocess", "daemon"} {
		b.Run(side, func(b *testing.B) {
			tb := newTestbed(b)
			p := tb.pairs()[i]
			ex, ey := newEnd(b, p.x, ib.RC), newEnd(b, p.y, ib.RC)
			connect(b, ex, ey, &p)
			xr := []verbs.RecvWR{{ID: 1, SG: []ib.SGE{{Addr: ex.mr.IOVA(), Length: 64, LKey: ex.mr.LKey()}}}}
			yr := []verbs.RecvWR{{ID: 1, SG: []ib.SGE{{Addr: ey.mr.IOVA(), Length: 64, LKey: ey.mr.LKey()}}}}
			xs := []verbs.SendWR{{ID: 2, Opcode: ib.Send, Flags: ib.Signaled, SG: []ib.SGE{{Addr: ex.mr.IOVA(), Length: 64, LKey: ex.mr.LKey()}}}}
			ys := []verbs.SendWR{{ID: 2, Opcode: ib.Send, Flags: ib.Signaled, SG: []ib.SGE{{Addr: ey.mr.IOVA(), Length: 64, LKey: ey.mr.LKey()}}}}
			for range 16 {
				if _, err := ex.qp.PostRecv(xr); err != nil {
					b.Fatal(err)
				}
				if _, err := ey.qp.PostRecv(yr); err != nil {
					b.Fatal(err)
				}
			}
			ex.sync(b)
			b.ResetTimer()
			for range b.N {
				if _, err := ex.qp.PostSend(xs); err != nil {
					b.Fatal(err)
				}
				for got := 0; got < 2; got++ { // y: its receive, then its send's completion
					if ey.wait(b).IsRecv {
						if _, err := ey.qp.PostRecv(yr); err != nil {
							b.Fatal(err)
						}
						if _, err := ey.qp.PostSend(ys); err != nil {
							b.Fatal(err)
						}
					}
				}
				for got := 0; got < 2; got++ { // x: its send's completion and the reply
					if ex.wait(b).IsRecv {
						if _, err := ex.qp.PostRecv(xr); err != nil {
							b.Fatal(err)
						}
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/2, "µs/half-RTT")
		})
	}
}

// Posting to a connected QP after destroying it fails with EINVAL on every
// RNIC, the daemon's included (whose rings the client has unmapped by
// then): never a crash, never a WR that reaches the device.
func TestPostToDestroyedQP(t *testing.T) {
	tb := newTestbed(t)
	for _, p := range tb.pairs()[:2] {
		t.Run(p.name, func(t *testing.T) {
			x, y := newEnd(t, p.x, ib.RC), newEnd(t, p.y, ib.RC)
			connect(t, x, y, &p)
			if err := x.qp.Destroy(); err != nil {
				t.Fatal(err)
			}
			_, serr := x.qp.PostSend([]verbs.SendWR{{Opcode: ib.Send}})
			_, rerr := x.qp.PostRecv([]verbs.RecvWR{{ID: 1}})
			if !errors.Is(serr, syscall.EINVAL) || !errors.Is(rerr, syscall.EINVAL) {
				t.Fatalf("post send %v, post recv %v", serr, rerr)
			}
		})
	}
}

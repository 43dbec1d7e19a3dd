package verbsapi_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/daemon"
	"github.com/softrnic/softrnic/engine"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/port/memlink"
	"github.com/softrnic/softrnic/rnic"
	"github.com/softrnic/softrnic/verbsapi"
)

var (
	macA, macB   = [6]byte{2, 0, 0, 0, 0, 0xa}, [6]byte{2, 0, 0, 0, 0, 0xb}
	addrA, addrB = netip.MustParseAddr("10.9.0.1"), netip.MustParseAddr("10.9.0.2")
)

// testbed is two verbs devices joined by an in-memory link, each driven by
// its engine, and a daemon serving device A: the three RNICs a tool can
// run on (A in process, A through the daemon, B in process).
type testbed struct {
	a, b, d verbsapi.Device
	vb      *rnic.Device // b's verbs device, for an rdma_cm agent on it
}

func newTestbed(t testing.TB) *testbed {
	pa, pb := memlink.NewPair(memlink.Config{MaxFrame: 1700})
	t.Cleanup(func() { pa.Close(); pb.Close() })
	macs := map[netip.Addr][6]byte{addrA: macA, addrB: macB}
	resolve := func(_ context.Context, ip netip.Addr) (src, dst [6]byte, err error) {
		m, ok := macs[ip]
		if !ok {
			return src, dst, fmt.Errorf("no neighbour %v", ip)
		}
		return src, m, nil
	}
	start := func(mac [6]byte, addr netip.Addr, p *memlink.Port) *rnic.Device {
		dev, err := rnic.NewDevice(rnic.Config{MAC: mac, Addrs: []netip.Addr{addr}, PortMTU: 1024})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- engine.Run(ctx, dev, p, engine.Options{}) }()
		t.Cleanup(func() { cancel(); <-done })
		return dev
	}
	devA, devB := start(macA, addrA, pa), start(macB, addrB, pb)
	srv, err := daemon.NewServer(daemon.NewVerbsDevice(devA, "mla", func(ip netip.Addr) ([6]byte, error) {
		_, m, err := resolve(context.Background(), ip)
		return m, err
	}), daemon.Options{Group: -1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "ctl.sock")
	if err := srv.Listen(sock); err != nil {
		t.Fatal(err)
	}
	go srv.Serve()
	t.Cleanup(func() { srv.Close(time.Second) })
	c, err := client.Dial(sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &testbed{a: verbsapi.Local(devA, "mla", resolve, nil), b: verbsapi.Local(devB, "mlb", resolve, nil), d: verbsapi.Daemon(c), vb: devB}
}

// end is one side of a connection: its memory, MR, CQ and QP.
type end struct {
	mem verbsapi.Mem
	mr  verbsapi.MR
	cq  verbsapi.CQ
	qp  verbsapi.QP
	typ ib.QPType
	ah  verbsapi.AH
	wcs [4]ib.WC
}

func newEnd(t testing.TB, dev verbsapi.Device, typ ib.QPType) *end {
	e := &end{}
	var err error
	if e.mem, err = dev.AllocMem(1 << 16); err != nil {
		t.Fatal(err)
	}
	pd, err := dev.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	if e.mr, err = pd.RegMR(e.mem, 0, 1<<16, 0x7000_0000, ib.LocalWrite|ib.RemoteWrite|ib.RemoteRead); err != nil {
		t.Fatal(err)
	}
	if e.cq, err = dev.CreateCQ(256); err != nil {
		t.Fatal(err)
	}
	if e.qp, err = pd.CreateQP(verbsapi.QPInitAttr{Type: typ, SendCQ: e.cq, RecvCQ: e.cq, MaxSendWR: 64, MaxRecvWR: 64, MaxSGE: 1}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		e.qp.Destroy()
		e.mr.Dereg()
		e.cq.Destroy()
		pd.Dealloc()
		e.mem.Free()
	})
	e.typ = typ
	init := ib.QPAttr{State: ib.Init, Port: 1, Access: ib.RemoteWrite | ib.RemoteRead, QKey: 0x11111111}
	if typ == ib.UC {
		init.Access = ib.RemoteWrite // UC has no READ
	}
	if err := e.qp.Modify(&init, mask(typ, ib.Reset, ib.Init)); err != nil {
		t.Fatal(err)
	}
	return e
}

// mask is the attribute mask IBA requires of the transition.
func mask(t ib.QPType, from, to ib.QPState) ib.QPAttrMask {
	req, _, _ := ib.Transition(t, from, to)
	return ib.AttrState | req
}

// connect moves x and y to RTS toward each other (UD: address handles).
func connect(t testing.TB, x, y *end, xIP, yIP netip.Addr, ud bool) {
	for _, s := range []struct {
		e    *end
		peer *end
		ip   netip.Addr
	}{{x, y, yIP}, {y, x, xIP}} {
		rtr := ib.QPAttr{State: ib.RTR, PathMTU: 1024, DestQPN: s.peer.qp.QPN(), RQPSN: 100, MaxDestRdAtomic: 4,
			AV: ib.AddressVector{DGID: ib.GIDFrom(s.ip)}}
		rts := ib.QPAttr{State: ib.RTS, SQPSN: 100, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 4}
		if err := s.e.qp.Modify(&rtr, mask(s.e.typ, ib.Init, ib.RTR)); err != nil {
			t.Fatalf("RTR: %v", err)
		}
		if err := s.e.qp.Modify(&rts, mask(s.e.typ, ib.RTR, ib.RTS)); err != nil {
			t.Fatalf("RTS: %v", err)
		}
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
	if rs, ok := e.qp.(verbsapi.RecvSyncer); ok {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := rs.SyncRecv(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

func pairs(tb *testbed) []struct {
	name string
	x, y verbsapi.Device
	xIP  netip.Addr
	yIP  netip.Addr
} {
	return []struct {
		name string
		x, y verbsapi.Device
		xIP  netip.Addr
		yIP  netip.Addr
	}{
		{"inprocess", tb.a, tb.b, addrA, addrB},
		{"daemon-sends", tb.d, tb.b, addrA, addrB},
		{"daemon-receives", tb.b, tb.d, addrB, addrA},
	}
}

// Every WR kind the tools use works on both RNICs, for RC, UC and UD:
// SEND into a posted receive, WRITE and READ into and out of the peer's
// MR, FETCH_AND_ADD; bytes checked.
func TestVerbsOnBothRNICs(t *testing.T) {
	tb := newTestbed(t)
	for _, p := range pairs(tb) {
		for _, typ := range []ib.QPType{ib.RC, ib.UC, ib.UD} {
			t.Run(p.name+"/"+typ.String(), func(t *testing.T) {
				x, y := newEnd(t, p.x, typ), newEnd(t, p.y, typ)
				ud := typ == ib.UD
				connect(t, x, y, p.xIP, p.yIP, ud)
				var ah verbsapi.AH
				if ud {
					pd, _ := p.x.AllocPD()
					var err error
					if ah, err = pd.CreateAH(ib.AddressVector{DGID: ib.GIDFrom(p.yIP)}); err != nil {
						t.Fatal(err)
					}
					if ah.Dest() != p.yIP {
						t.Fatalf("AH to %v", ah.Dest())
					}
				}
				// SEND.
				copy(x.mem.Bytes()[100:], "hello through either RNIC")
				rsg := []ib.SGE{{Addr: y.mr.IOVA() + 1000, Length: 200, LKey: y.mr.LKey()}}
				if err := y.qp.PostRecv(&verbsapi.RecvWR{ID: 7, SG: rsg}); err != nil {
					t.Fatal(err)
				}
				y.sync(t)
				w := &verbsapi.SendWR{ID: 1, Opcode: ib.Send, Flags: ib.Signaled, SG: []ib.SGE{{Addr: x.mr.IOVA() + 100, Length: 25, LKey: x.mr.LKey()}},
					AH: ah, RemoteQPN: y.qp.QPN(), RemoteQKey: 0x11111111}
				if err := x.qp.PostSend(w); err != nil {
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
					return
				}
				// WRITE.
				copy(x.mem.Bytes()[200:], "written")
				*w = verbsapi.SendWR{ID: 2, Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: []ib.SGE{{Addr: x.mr.IOVA() + 200, Length: 7, LKey: x.mr.LKey()}},
					RemoteAddr: y.mr.IOVA() + 5000, RKey: y.mr.RKey()}
				if err := x.qp.PostSend(w); err != nil {
					t.Fatal(err)
				}
				x.wait(t)
				// The peer's memory is read under its QP's lock (the
				// engine writes it there, without a completion to order it).
				peerMem := func() (s string) {
					y.qp.WithLock(func() { s = string(y.mem.Bytes()[5000:5007]) })
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
				y.qp.WithLock(func() { copy(y.mem.Bytes()[6000:], "read back") })
				*w = verbsapi.SendWR{ID: 3, Opcode: ib.RDMARead, Flags: ib.Signaled, SG: []ib.SGE{{Addr: x.mr.IOVA() + 300, Length: 9, LKey: x.mr.LKey()}},
					RemoteAddr: y.mr.IOVA() + 6000, RKey: y.mr.RKey()}
				if err := x.qp.PostSend(w); err != nil {
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

// The per-message path — post a receive, post a SEND, poll both CQs — makes
// no allocation on either RNIC (the engines and the daemon's pump run
// meanwhile and are counted too).
func TestPostPollAllocationFree(t *testing.T) {
	tb := newTestbed(t)
	for _, p := range pairs(tb) {
		t.Run(p.name, func(t *testing.T) {
			x, y := newEnd(t, p.x, ib.RC), newEnd(t, p.y, ib.RC)
			connect(t, x, y, p.xIP, p.yIP, false)
			rwr := &verbsapi.RecvWR{ID: 1, SG: []ib.SGE{{Addr: y.mr.IOVA(), Length: 64, LKey: y.mr.LKey()}}}
			swr := &verbsapi.SendWR{ID: 2, Opcode: ib.Send, Flags: ib.Signaled, SG: []ib.SGE{{Addr: x.mr.IOVA(), Length: 64, LKey: x.mr.LKey()}}}
			// Receives run 32 ahead of the SENDs, as a tool keeps its RQ
			// filled: one posted now serves a SEND 32 messages later.
			for range 32 {
				if err := y.qp.PostRecv(rwr); err != nil {
					t.Fatal(err)
				}
			}
			y.sync(t)
			one := func() {
				if err := y.qp.PostRecv(rwr); err != nil {
					t.Fatal(err)
				}
				if err := x.qp.PostSend(swr); err != nil {
					t.Fatal(err)
				}
				x.wait(t)
				y.wait(t)
			}
			for range 50 { // warm up: AH caches, ring pages, engine scratch
				one()
			}
			if n := testing.AllocsPerRun(300, one); n != 0 {
				t.Errorf("%.2f allocations per message", n)
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
	for _, side := range []string{"inprocess", "daemon"} {
		b.Run(side, func(b *testing.B) {
			tb := newTestbed(b)
			x := tb.a
			if side == "daemon" {
				x = tb.d
			}
			ex, ey := newEnd(b, x, ib.RC), newEnd(b, tb.b, ib.RC)
			connect(b, ex, ey, addrA, addrB, false)
			xr := &verbsapi.RecvWR{ID: 1, SG: []ib.SGE{{Addr: ex.mr.IOVA(), Length: 64, LKey: ex.mr.LKey()}}}
			yr := &verbsapi.RecvWR{ID: 1, SG: []ib.SGE{{Addr: ey.mr.IOVA(), Length: 64, LKey: ey.mr.LKey()}}}
			xs := &verbsapi.SendWR{ID: 2, Opcode: ib.Send, Flags: ib.Signaled, SG: []ib.SGE{{Addr: ex.mr.IOVA(), Length: 64, LKey: ex.mr.LKey()}}}
			ys := &verbsapi.SendWR{ID: 2, Opcode: ib.Send, Flags: ib.Signaled, SG: []ib.SGE{{Addr: ey.mr.IOVA(), Length: 64, LKey: ey.mr.LKey()}}}
			for range 16 {
				ex.qp.PostRecv(xr)
				ey.qp.PostRecv(yr)
			}
			ex.sync(b)
			b.ResetTimer()
			for range b.N {
				ex.qp.PostSend(xs)
				for got := 0; got < 2; got++ { // y: its receive, then its send's completion
					if ey.wait(b).IsRecv {
						ey.qp.PostRecv(yr)
						ey.qp.PostSend(ys)
					}
				}
				for got := 0; got < 2; got++ { // x: its send's completion and the reply
					if ex.wait(b).IsRecv {
						ex.qp.PostRecv(xr)
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/2, "µs/half-RTT")
		})
	}
}

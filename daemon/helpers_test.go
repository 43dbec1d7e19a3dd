package daemon_test

import (
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/softrnic/softrnic/daemon"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/ibtest"
	"github.com/softrnic/softrnic/internal/testlink"
	"github.com/softrnic/softrnic/rnic"
	"github.com/softrnic/softrnic/verbs"
)

// The tests run a daemon on device A of a pair (testlink.Pair) and put the
// peer applications on device B, in process. Both sides are verbs: a
// client of the daemon and an application on device B are driven by the
// same helpers.

var (
	macA         = testlink.MACA
	addrA, addrB = testlink.AddrA, testlink.AddrB
	gidA, gidB   = ib.GIDFrom(addrA), ib.GIDFrom(addrB)
)

// serve starts a daemon on dev with opt (quiet, no group unless set) on a
// socket in a temp dir, until the test ends.
func serve(t testing.TB, dev *rnic.Device, opt daemon.Options) (*daemon.Server, string) {
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
	path := filepath.Join(t.TempDir(), "ctl.sock")
	if err := srv.Listen(path); err != nil {
		t.Fatal(err)
	}
	go func() {
		if err := srv.Serve(); err != nil {
			t.Error(err)
		}
	}()
	t.Cleanup(func() { srv.Close(time.Second) })
	return srv, path
}

// twoDevices makes devices A and B joined by a link, and a daemon serving
// A.
func twoDevices(t testing.TB) (devA, devB *rnic.Device, path string) {
	devA, devB = testlink.Pair(t, 1024)
	_, path = serve(t, devA, daemon.Options{})
	return devA, devB, path
}

// app is an application's objects on a verbs device: a PD, memory and its
// MR, a CQ and a QP.
type app struct {
	pd  verbs.PD
	mem verbs.Mem
	mr  verbs.MR
	cq  verbs.CQ
	qp  verbs.QP
}

// newApp makes an app on dev: size bytes registered with access, a CQ of
// cqDepth, and a QP of type typ with caps.
func newApp(t testing.TB, dev verbs.Device, typ ib.QPType, size int, access ib.Access, cqDepth int, caps ib.QPCaps) *app {
	t.Helper()
	a := &app{}
	var err error
	if a.pd, err = dev.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if a.mem, err = dev.AllocMem(size); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.mem.Free() })
	if a.mr, err = a.pd.RegMR(a.mem, 0, size, 0, access); err != nil {
		t.Fatal(err)
	}
	if a.cq, err = dev.CreateCQ(cqDepth); err != nil {
		t.Fatal(err)
	}
	if a.qp, err = a.pd.CreateQP(&verbs.QPInitAttr{Type: typ, SendCQ: a.cq, RecvCQ: a.cq, Cap: caps}); err != nil {
		t.Fatal(err)
	}
	return a
}

// sge is n bytes at offset off of the app's MR.
func (a *app) sge(off, n int) ib.SGE {
	return ib.SGE{Addr: a.mr.IOVA() + uint64(off), Length: uint32(n), LKey: a.mr.LKey()}
}

// buf is the app's registered memory.
func (a *app) buf() []byte { return a.mem.Bytes() }

// send posts one send WR.
func (a *app) send(t testing.TB, w verbs.SendWR) {
	t.Helper()
	if _, err := a.qp.PostSend([]verbs.SendWR{w}); err != nil {
		t.Fatal(err)
	}
}

// recv posts one receive of n bytes at off.
func (a *app) recv(t testing.TB, id uint64, off, n int) {
	t.Helper()
	if _, err := a.qp.PostRecv([]verbs.RecvWR{{ID: id, SG: []ib.SGE{a.sge(off, n)}}}); err != nil {
		t.Fatal(err)
	}
}

// connectRC moves q through INIT, RTR and RTS to the RC (or UC) QP qpn at
// dgid: PSNs sq and rq, 4 READs/atomics each way, RNR timer 1 (0.01 ms).
func connectRC(t testing.TB, q verbs.QP, access ib.Access, qpn uint32, dgid ib.GID, sq, rq uint32) {
	t.Helper()
	steps := []struct {
		to ib.QPState
		a  ib.QPAttr
	}{
		{ib.Init, ib.QPAttr{Access: access}},
		{ib.RTR, ib.QPAttr{PathMTU: 1024, DestQPN: qpn, RQPSN: rq, MaxDestRdAtomic: 4, MinRNRTimer: 1, AV: ib.AddressVector{DGID: dgid}}},
		{ib.RTS, ib.QPAttr{SQPSN: sq, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 4}},
	}
	for _, s := range steps {
		if err := ibtest.Modify(q, s.to, &s.a); err != nil {
			t.Fatalf("QP %#x to %v: %v", q.QPN(), s.to, err)
		}
	}
}

// readyUD moves a UD QP to RTS with Q_Key qkey.
func readyUD(t testing.TB, q verbs.QP, qkey uint32) {
	t.Helper()
	for _, s := range []ib.QPState{ib.Init, ib.RTR, ib.RTS} {
		if err := ibtest.Modify(q, s, &ib.QPAttr{QKey: qkey}); err != nil {
			t.Fatalf("UD QP %#x to %v: %v", q.QPN(), s, err)
		}
	}
}

// waitWC returns cq's next completion, failing the test after 10 s.
func waitWC(t testing.TB, cq verbs.CQ) ib.WC {
	t.Helper()
	var wcs [1]ib.WC
	deadline := time.Now().Add(10 * time.Second)
	for cq.Poll(wcs[:]) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no completion within 10 s")
		}
		if err := cq.Wait(20 * time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	return wcs[0]
}

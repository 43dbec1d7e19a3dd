package daemon_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/cm"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/rdmacm"
	"github.com/softrnic/softrnic/rnic"
	"github.com/softrnic/softrnic/verbs"
)

// peerCM starts an rdma_cm agent on device B for the test.
func peerCM(t testing.TB, devB *rnic.Device) *rdmacm.Agent {
	t.Helper()
	peer, err := rdmacm.New(rdmacm.Config{Device: devB, Resolve: devB.Config().Resolve})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { peer.Close() })
	return peer
}

// TestDaemonCMRejectsBeforeAnyClient: the daemon's rdma_cm agent runs from
// the moment the daemon serves, so a peer's REQ for a port no client
// listens on gets REJ "invalid service ID" (reason 8), as from the kernel
// CM, though no client ever made a CM call (a peer would otherwise wait
// out its REQ retries, about a minute, instead of being refused).
func TestDaemonCMRejectsBeforeAnyClient(t *testing.T) {
	_, devB, _ := twoDevices(t)
	peer := peerCM(t, devB)
	b := newApp(t, devB, ib.RC, 4096, ib.LocalWrite, 16, ib.QPCaps{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	_, err := peer.Connect(ctx, b.qp, addrA, 4242, &rdmacm.ConnParam{})
	var rej *rdmacm.RejectedError
	if !errors.As(err, &rej) {
		t.Fatalf("REQ to the daemon's device, no listener: got %v, want REJ reason 8", err)
	}
	if rej.Reason != cm.RejInvalidServiceID || uint16(rej.Reason) != 8 {
		t.Fatalf("REJ reason %d, want 8 (invalid service ID)", uint16(rej.Reason))
	}
}

// TestDaemonCMConnects: rdma_cm through the daemon drives QPs the client
// created, as librdmacm does: the client accepts a peer's connection with
// one of its RC QPs, then connects another to a peer's listener; data
// flows both ways, Disconnect ends a connection, and the QPs stay the
// client's. The daemon refuses to connect a QP that is not the client's
// own RC QP, or one already connected.
func TestDaemonCMConnects(t *testing.T) {
	_, devB, path := twoDevices(t)
	peer := peerCM(t, devB)
	c, err := client.Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	caps := ib.QPCaps{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1}
	access := ib.LocalWrite | ib.RemoteWrite
	a := newApp(t, c, ib.RC, 1<<16, access, 32, caps)
	b := newApp(t, devB, ib.RC, 1<<16, access, 32, caps)
	p := &rdmacm.ConnParam{Access: ib.RemoteWrite}

	// Passive client: its receive is in place before it accepts.
	l, err := c.Listen(5000, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	dialed := make(chan error, 1)
	go func() {
		_, err := peer.Connect(ctx, b.qp, addrA, 5000, p)
		dialed <- err
	}()
	req, err := l.GetRequest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if req.Peer() != addrB {
		t.Errorf("request from %v", req.Peer())
	}
	if err := rdmacm.InitQP(a.qp, p); err != nil {
		t.Fatal(err)
	}
	a.recv(t, 1, 0, 64)
	conn, err := req.Accept(ctx, a.qp, p)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-dialed; err != nil {
		t.Fatal(err)
	}
	if conn.QP() != a.qp || a.qp.State() != ib.RTS {
		t.Fatalf("connection's QP %v in %v", conn.QP(), a.qp.State())
	}
	copy(b.buf(), "over rdma_cm")
	b.send(t, verbs.SendWR{ID: 2, Opcode: ib.Send, Flags: ib.Signaled, SG: []ib.SGE{b.sge(0, 12)}})
	if wc := waitWC(t, a.cq); wc.ID != 1 || wc.Status != ib.Success || string(a.buf()[:12]) != "over rdma_cm" {
		t.Fatalf("client receive %+v %q", wc, a.buf()[:12])
	}
	waitWC(t, b.cq)
	// A request is answered once (EINVAL, as the kernel's rdma_accept on a
	// connected ID), and a connected QP cannot answer another.
	fresh, err := a.pd.CreateQP(&verbs.QPInitAttr{Type: ib.RC, SendCQ: a.cq, RecvCQ: a.cq, Cap: caps})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := req.Accept(ctx, fresh, p); !errors.Is(err, unix.EINVAL) {
		t.Fatalf("request accepted twice: %v", err)
	}
	if _, err := req.Accept(ctx, a.qp, p); !errors.Is(err, unix.EISCONN) {
		t.Fatalf("a connected QP accepting: %v", err)
	}
	fresh.Destroy()
	if err := conn.Disconnect(ctx); err != nil {
		t.Fatal(err)
	}

	// Active client: a second QP connects to the peer's listener.
	pl, err := peer.Listen(5001, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer pl.Close()
	b2 := newApp(t, devB, ib.RC, 1<<16, access, 32, caps)
	accepted := make(chan error, 1)
	go func() {
		r, err := pl.GetRequest(ctx)
		if err == nil {
			_, err = r.Accept(ctx, b2.qp, p)
		}
		accepted <- err
	}()
	a2qp, err := a.pd.CreateQP(&verbs.QPInitAttr{Type: ib.RC, SendCQ: a.cq, RecvCQ: a.cq, Cap: caps})
	if err != nil {
		t.Fatal(err)
	}
	conn2, err := c.Connect(ctx, a2qp, addrB, 5001, p)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-accepted; err != nil {
		t.Fatal(err)
	}
	copy(a.buf()[100:], "written through the connection")
	if _, err := a2qp.PostSend([]verbs.SendWR{{ID: 3, Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: []ib.SGE{a.sge(100, 30)},
		RemoteAddr: b2.mr.IOVA(), RKey: b2.mr.RKey()}}); err != nil {
		t.Fatal(err)
	}
	wc := waitWC(t, a.cq)
	// The completion orders the WRITE before this read, but through the
	// client's CQ ring, mapped at two addresses, where the race detector
	// cannot follow it; querying b2's QP takes the lock its device wrote
	// the data under.
	if _, err := b2.qp.Query(); err != nil {
		t.Fatal(err)
	}
	if wc.ID != 3 || wc.Status != ib.Success || string(b2.buf()[:30]) != "written through the connection" {
		t.Fatalf("WRITE on the active connection %+v %q", wc, b2.buf()[:30])
	}
	// A connected QP cannot be connected again; a UD QP not at all.
	if _, err := c.Connect(ctx, a2qp, addrB, 5001, p); !errors.Is(err, unix.EISCONN) {
		t.Fatalf("second connect of a connected QP: %v", err)
	}
	ud, err := a.pd.CreateQP(&verbs.QPInitAttr{Type: ib.UD, SendCQ: a.cq, RecvCQ: a.cq, Cap: caps})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Connect(ctx, ud, addrB, 5001, p); !errors.Is(err, rdmacm.ErrNotRC) {
		t.Fatalf("connect of a UD QP: %v", err)
	}
	// Close ends the connection at once; the QP stays the client's.
	if err := conn2.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a2qp.Destroy(); err != nil {
		t.Fatal(err)
	}
}

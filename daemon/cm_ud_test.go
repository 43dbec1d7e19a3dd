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
	"github.com/softrnic/softrnic/verbs"
)

// TestDaemonSIDR: rdma_cm's UDP port space through the daemon. A client's
// UD listener answers a peer's SIDR_REQ with the client's own UD QP and
// rdma_cm's Q_Key (an RC QP is refused and the request waits on); a client's lookup learns a peer
// listener's QPN and Q_Key, or the SIDR status of a refusal; and when the
// client dies its listener goes with it: the peer's next lookup is
// refused as for a port nobody listens on, and another client can listen
// on the port.
func TestDaemonSIDR(t *testing.T) {
	_, devB, path := twoDevices(t)
	peer := peerCM(t, devB)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	c, err := client.Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	caps := ib.QPCaps{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}
	a := newApp(t, c, ib.UD, 4096, ib.LocalWrite, 16, caps)
	ud := a.qp
	if err := rdmacm.PrepareUD(ud); err != nil {
		t.Fatal(err)
	}
	rc, err := a.pd.CreateQP(&verbs.QPInitAttr{Type: ib.RC, SendCQ: a.cq, RecvCQ: a.cq, Cap: caps})
	if err != nil {
		t.Fatal(err)
	}

	// The client listens; the peer looks the port up.
	l, err := c.ListenUD(4791, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ListenUD(4791, 0); !errors.Is(err, unix.EADDRINUSE) {
		t.Fatalf("second UD listen on the port: %v, want EADDRINUSE", err)
	}
	type resolved struct {
		p   *rdmacm.UDPeer
		err error
	}
	res := make(chan resolved, 1)
	go func() {
		p, err := peer.ResolveUD(ctx, addrA, 4791, nil)
		res <- resolved{p, err}
	}()
	r, err := l.GetRequest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if r.Peer() != addrB {
		t.Errorf("request from %v, want %v", r.Peer(), addrB)
	}
	if err := r.Accept(rc, nil); !errors.Is(err, unix.EINVAL) {
		t.Fatalf("SIDR answered with an RC QP: %v, want EINVAL", err)
	}
	// The request still waits: answered with the UD QP.
	if err := r.Accept(ud, nil); err != nil {
		t.Fatal(err)
	}
	if err := r.Accept(ud, nil); !errors.Is(err, unix.ENOENT) {
		t.Fatalf("answering a request twice: %v, want ENOENT", err)
	}
	got := <-res
	if got.err != nil || got.p.QPN != ud.QPN() || got.p.QKey != rdmacm.UDPQKey {
		t.Fatalf("peer's lookup: %+v %v, want QPN %#x Q_Key %#x", got.p, got.err, ud.QPN(), rdmacm.UDPQKey)
	}

	// The client looks up the peer's listener, and a port nobody serves.
	pl, err := peer.ListenUD(4792, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer pl.Close()
	qpB := newApp(t, devB, ib.UD, 4096, ib.LocalWrite, 4, caps).qp
	if err := rdmacm.PrepareUD(qpB); err != nil {
		t.Fatal(err)
	}
	go func() {
		pr, err := pl.GetRequest(ctx)
		if err == nil {
			err = pr.Accept(qpB, nil)
		}
		if err != nil {
			t.Errorf("peer's UD listener: %v", err)
		}
	}()
	svc, err := c.ResolveUD(ctx, addrB, 4792, nil)
	if err != nil || svc.QPN != qpB.QPN() || svc.QKey != rdmacm.UDPQKey || svc.Addr != addrB || svc.AV.DGID != gidB {
		t.Fatalf("client's lookup: %+v %v, want QPN %#x", svc, err, qpB.QPN())
	}
	_, err = c.ResolveUD(ctx, addrB, 4793, nil)
	var se *rdmacm.SIDRError
	if !errors.As(err, &se) || se.Status != cm.SIDRUnsupported {
		t.Fatalf("lookup of a port nobody serves: %v, want an rdmacm.SIDRError", err)
	}

	// The client dies: its listener is gone.
	c.Close()
	var serr *rdmacm.SIDRError
	for i := 0; ; i++ {
		_, err = peer.ResolveUD(ctx, addrA, 4791, nil)
		if errors.As(err, &serr) && serr.Status == cm.SIDRUnsupported {
			break
		}
		if i == 50 {
			t.Fatalf("lookup after the listening client died: %v, want SIDR status 1", err)
		}
		time.Sleep(20 * time.Millisecond) // the daemon ends the session asynchronously
	}
	c2, err := client.Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	l2, err := c2.ListenUD(4791, 0)
	if err != nil {
		t.Fatalf("UD listen on the dead client's port: %v", err)
	}
	l2.Close()
}

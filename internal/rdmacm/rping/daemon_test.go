package rping

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/daemon"
	"github.com/softrnic/softrnic/port/memlink"
	"github.com/softrnic/softrnic/rdmacm"
	"github.com/softrnic/softrnic/rnic"
)

// daemonSetup joins two devices by a memlink: device S is served by a
// daemon (its rdma_cm agent the daemon's), device C runs an agent in
// process. It returns a client of the daemon (its RNIC and its CM), C's
// agent and the daemon's socket.
func daemonSetup(t *testing.T) (c *client.Client, cli *rdmacm.Agent, sock string) {
	la, lb := memlink.NewPair(memlink.Config{Seed: 5})
	macs := map[netip.Addr][6]byte{ipS: macS, ipC: macC}
	resolve := func(_ context.Context, peer netip.Addr) ([6]byte, error) {
		if m, ok := macs[peer]; ok {
			return m, nil
		}
		return [6]byte{}, errors.New("no neighbour")
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	mk := func(mac [6]byte, ip netip.Addr, p *memlink.Port) *rnic.Device {
		d, err := rnic.NewDevice(rnic.Config{Name: "mls", MAC: mac, Addrs: []netip.Addr{ip}, Resolve: resolve})
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := runEngine(ctx, d, p); err != nil && !errors.Is(err, context.Canceled) {
				t.Error(err)
			}
		}()
		return d
	}
	devS, devC := mk(macS, ipS, la), mk(macC, ipC, lb)
	var err error
	srv, err := daemon.NewServer(devS, daemon.Options{Group: -1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	sock = filepath.Join(t.TempDir(), "ctl.sock")
	if err := srv.Listen(sock); err != nil {
		t.Fatal(err)
	}
	go func() {
		if err := srv.Serve(); err != nil {
			t.Error(err)
		}
	}()
	if cli, err = rdmacm.New(rdmacm.Config{Device: devC, Resolve: resolve}); err != nil {
		t.Fatal(err)
	}
	if c, err = client.Dial(sock); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		cli.Close()
		srv.Close(time.Second)
		cancel()
		wg.Wait()
	})
	return c, cli, sock
}

// TestPingThroughDaemon: rping -V -v with its connection made by the
// daemon's CM agent, the daemon's side as server and as client, against an
// in-process rping, at 64 bytes and at 5000 (multi-packet READ and WRITE).
func TestPingThroughDaemon(t *testing.T) {
	c, cli, _ := daemonSetup(t)
	for _, size := range []int{64, 5000} {
		for _, daemonServes := range []bool{true, false} {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			o := Options{Count: 10, Size: size, Verbose: true, Validate: true}
			var sout, cout bytes.Buffer
			so, co := o, o
			so.Out, co.Out = &sout, &cout
			ready := make(chan struct{})
			serr := make(chan error, 1)
			var cerr error
			if daemonServes {
				go func() { serr <- RunServer(ctx, c, c, so, func() { close(ready) }) }()
				<-ready
				cerr = Client(ctx, cli, ipS, co)
			} else {
				o.Port = 7175
				so.Port, co.Port = 7175, 7175
				go func() { serr <- Server(ctx, cli, so, func() { close(ready) }) }()
				<-ready
				cerr = RunClient(ctx, c, c, ipC, co)
			}
			if cerr != nil {
				cancel()
			}
			if err := <-serr; err != nil || cerr != nil {
				t.Fatalf("size %d, daemon serves %v: server %v, client %v\n%s\n%s", size, daemonServes, err, cerr, sout.String(), cout.String())
			}
			cancel()
			if n := strings.Count(cout.String(), "ping data: "); n != 10 || strings.Count(sout.String(), "server ping data: ") != 10 {
				t.Fatalf("size %d, daemon serves %v: client printed %d pings\n%s\n%s", size, daemonServes, n, sout.String(), cout.String())
			}
		}
	}
}

// A client's listener and the CM waits it started go with it: when it
// closes, a GetRequest it waits in ends and its port is free for the next
// client; a connection to a port nobody listens on is refused.
func TestDaemonCMCleanup(t *testing.T) {
	c, cli, sock := daemonSetup(t)
	l0, err := c.Listen(7200, 0)
	if err != nil {
		t.Fatal(err)
	}
	// The same port twice: refused.
	if _, err := c.Listen(7200, 0); !errors.Is(err, unix.EADDRINUSE) {
		t.Fatalf("second listen on the port: %v", err)
	}
	// The client goes away while the daemon waits for a request for it.
	waiting := make(chan error, 1)
	go func() { _, err := l0.GetRequest(context.Background()); waiting <- err }()
	time.Sleep(20 * time.Millisecond)
	c.Close()
	select {
	case err := <-waiting:
		if err == nil {
			t.Fatal("GetRequest returned a request nobody sent")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("GetRequest still blocked after its connection closed")
	}
	c2, err := client.Dial(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	var l rdmacm.Listener
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if l, err = c2.Listen(7200, 0); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatalf("the port stayed taken after its client left: %v", err)
	}
	l.Close()
	// Nobody listens now: the in-process side's Connect is rejected.
	e, err := newEndpoint(cli.Device())
	if err != nil {
		t.Fatal(err)
	}
	defer e.close()
	qp, err := e.newQP()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err = cli.Connect(ctx, qp, ipS, 7200, e.params())
	var rej *rdmacm.RejectedError
	if !errors.As(err, &rej) {
		t.Fatalf("dial to a closed port: %v", err)
	}
}

// A client that goes away with a connection up takes it down: the daemon
// sends the peer a DREQ (the peer's connection ends) and frees the QP.
func TestDaemonCMClientGone(t *testing.T) {
	c, cli, _ := daemonSetup(t)
	ln, err := cli.Listen(7300, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	peerEnd, err := newEndpoint(cli.Device())
	if err != nil {
		t.Fatal(err)
	}
	defer peerEnd.close()
	accepted := make(chan rdmacm.Conn, 1)
	go func() {
		pc, err := rdmacm.AcceptNext(ctx, ln, peerEnd.newQP, peerEnd.params())
		if err != nil {
			t.Error(err)
		}
		accepted <- pc
	}()
	e, err := newEndpoint(c)
	if err != nil {
		t.Fatal(err)
	}
	qp, err := e.newQP()
	if err != nil {
		t.Fatal(err)
	}
	conn, err := c.Connect(ctx, qp, ipC, 7300, e.params())
	if err != nil {
		t.Fatal(err)
	}
	if conn.QP().QPN() == 0 || conn.Peer() != ipC {
		t.Fatalf("connection QP %#x to %v", conn.QP().QPN(), conn.Peer())
	}
	pc := <-accepted
	if pc == nil {
		t.FailNow()
	}
	defer pc.Close()
	c.Close() // the client dies
	select {
	case <-pc.Done():
	case <-time.After(20 * time.Second):
		t.Fatal("the peer's connection outlived the client that held the other end")
	}
}

// An rping server through the daemon that nobody connects to ends when its
// context does (Ctrl-C), though the daemon would wait two minutes. The
// context ends once the server listens, however long getting there took.
func TestDaemonServerInterrupted(t *testing.T) {
	c, _, _ := daemonSetup(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	listening := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- RunServer(ctx, c, c, Options{}, func() { close(listening) }) }()
	select {
	case <-listening:
	case err := <-done:
		t.Fatalf("server ended with %v before it listened", err)
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("server ended with %v, want its context's end", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("server still waiting after its context ended")
	}
}

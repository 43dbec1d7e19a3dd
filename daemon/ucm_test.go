package daemon_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/cm"
	"github.com/softrnic/softrnic/daemon"
	"github.com/softrnic/softrnic/daemon/proto"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/testlink"
	"github.com/softrnic/softrnic/rdmacm"
	"github.com/softrnic/softrnic/rnic"
	"github.com/softrnic/softrnic/verbs"
)

// fastCM shortens the CM's timers for the tests: a response timeout of
// about 4 ms plus two packet life times of 1 ms, three retries.
var fastCM = cm.Config{CMResponseTimeout: 10, PacketLifeTime: 8, MaxCMRetries: 3, TargetACKDelay: 8}

// serveCM starts a daemon on devA whose rdma_cm agent runs with cfg.
func serveCM(t *testing.T, devA *rnic.Device, cfg cm.Config) (*daemon.Server, string) {
	t.Helper()
	a, err := rdmacm.New(rdmacm.Config{Device: devA, Resolve: devA.Config().Resolve, CM: cfg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() }) // after the server's (cleanups run last first)
	return serve(t, devA, daemon.Options{CM: a})
}

func cmCounters(t *testing.T, srv *daemon.Server) [proto.NumCMCounters]uint64 {
	t.Helper()
	c, ok := srv.CMCounters()
	if !ok {
		t.Fatal("no rdma_cm counters")
	}
	return c
}

// waitCounter waits (bounded) until counter i reaches at least want: the
// daemon counts as the peer's MADs arrive.
func waitCounter(t *testing.T, srv *daemon.Server, i int, want uint64) {
	t.Helper()
	for range 500 {
		if cmCounters(t, srv)[i] >= want {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%s = %d, want at least %d", proto.CMCounters[i].Name, cmCounters(t, srv)[i], want)
}

// connectThroughDaemon connects a QP of the client, listening on port,
// with one of the peer's: the daemon serves connections.
func connectThroughDaemon(t *testing.T, ctx context.Context, c *client.Client, peer *rdmacm.Agent, devB *rnic.Device, port uint16) {
	t.Helper()
	caps := ib.QPCaps{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}
	p := &rdmacm.ConnParam{Access: ib.RemoteWrite}
	l, err := c.Listen(port, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	a := newApp(t, c, ib.RC, 4096, ib.LocalWrite, 8, caps)
	b := newApp(t, devB, ib.RC, 4096, ib.LocalWrite, 8, caps)
	dialed := make(chan error, 1)
	go func() {
		conn, err := peer.Connect(ctx, b.qp, addrA, port, p)
		if err == nil {
			conn.Close()
		}
		dialed <- err
	}()
	conn, err := rdmacm.AcceptNext(ctx, l, func() (verbs.QP, error) { return a.qp, nil }, p)
	if err != nil {
		t.Fatalf("the daemon no longer serves connections: %v", err)
	}
	if err := <-dialed; err != nil {
		t.Fatal(err)
	}
	conn.Close()
}

// CM MADs of wrong lengths, of another class or version, of attributes
// the CM does not serve, and for no connection reach the daemon's GSI QP:
// it counts each kind and keeps serving connections.
func TestUCMMalformedMADs(t *testing.T) {
	devA, devB := testlink.Pair(t, 1024)
	srv, path := serveCM(t, devA, cm.Config{})
	pd, err := devB.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	cq, err := devB.CreateCQ(16)
	if err != nil {
		t.Fatal(err)
	}
	gsi, err := pd.CreateQP(&verbs.QPInitAttr{Type: ib.GSI, SendCQ: cq, RecvCQ: cq,
		Cap: ib.QPCaps{MaxSendWR: 8, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	readyUD(t, gsi, bth.GSIQKey)
	mem, err := devB.AllocMem(512)
	if err != nil {
		t.Fatal(err)
	}
	mr, err := pd.RegMR(mem, 0, 512, 0, ib.LocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	ah, err := pd.CreateAH(&ib.AddressVector{DGID: gidA, HopLimit: 64})
	if err != nil {
		t.Fatal(err)
	}
	send := func(n int, fill func(m []byte)) {
		t.Helper()
		b := mem.Bytes()
		clear(b)
		if n >= cm.MADHeaderSize {
			cm.MAD(b[:cm.MADSize]).InitCM(cm.AttrRTU, 0x1234)
		}
		if fill != nil {
			fill(b)
		}
		if _, err := gsi.PostSend([]verbs.SendWR{{Opcode: ib.Send, Flags: ib.Signaled, AH: ah, RemoteQPN: 1, RemoteQKey: bth.GSIQKey,
			SG: []ib.SGE{{Addr: mr.IOVA(), Length: uint32(n), LKey: mr.LKey()}}}}); err != nil {
			t.Fatal(err)
		}
		if wc := waitWC(t, cq); wc.Status != ib.Success {
			t.Fatalf("send of %d bytes: %v", n, wc.Status)
		}
	}
	before := cmCounters(t, srv)
	send(100, nil)                                               // short
	send(300, nil)                                               // longer than a MAD
	send(cm.MADSize, func(m []byte) { m[2] = 1 })                // class version 1
	send(cm.MADSize, func(m []byte) { m[1] = 0x81 })             // another management class
	send(cm.MADSize, func(m []byte) { m[17] = 0x30 })            // an attribute CM has not
	send(cm.MADSize, func(m []byte) { m[17] = 0x19 })            // LAP: no alternate paths
	send(cm.MADSize, func(m []byte) { m[24+3] = 0x77 })          // an RTU for no connection
	send(cm.MADSize, func(m []byte) { m[17] = 0x15; m[31] = 9 }) // a DREQ for no connection: answered
	waitCounter(t, srv, proto.CMRxMsgs, before[proto.CMRxMsgs]+8)
	after := cmCounters(t, srv)
	diff := func(i int) uint64 { return after[i] - before[i] }
	if diff(proto.CMRxMalformed) != 4 || diff(proto.CMRxUnsupported) != 2 || diff(proto.CMRxUnmatched) != 2 {
		t.Fatalf("malformed %d (want 4), unsupported %d (want 2), unmatched %d (want 2)",
			diff(proto.CMRxMalformed), diff(proto.CMRxUnsupported), diff(proto.CMRxUnmatched))
	}
	// The DREQ for no connection was answered with a DREP, as the kernel
	// does, so that a peer that lost its state stops retrying.
	if diff(proto.CMTxMsgs) != 1 {
		t.Fatalf("%d MADs sent, want the one DREP", diff(proto.CMTxMsgs))
	}
	// The daemon still serves: B's CM connects to a client of it.
	gsi.Destroy()
	peer := peerCM(t, devB)
	c, err := client.Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	connectThroughDaemon(t, ctx, c, peer, devB, 6000)
}

// A flood of REQs: beyond a listener's backlog the daemon refuses with
// REJ "no resources"; beyond the CM's half-open caps it drops them (the
// peers' CM retries). It counts both and keeps serving.
func TestUCMRequestFlood(t *testing.T) {
	devA, devB := testlink.Pair(t, 1024)
	cfg := fastCM
	cfg.MaxHalfOpen = 6
	srv, path := serveCM(t, devA, cfg)
	// The peers retry every 70 ms or so, slow enough for the daemon's
	// answers to reach them on a loaded host.
	peerCfg := cm.Config{CMResponseTimeout: 14, PacketLifeTime: 8, MaxCMRetries: 3, TargetACKDelay: 8, Seed: 99}
	peer, err := rdmacm.New(rdmacm.Config{Device: devB, Resolve: devB.Config().Resolve, CM: peerCfg})
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	c, err := client.Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := c.Listen(6001, 2)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	caps := ib.QPCaps{MaxSendWR: 2, MaxRecvWR: 2, MaxSendSGE: 1, MaxRecvSGE: 1}
	const flood = 12
	var wg sync.WaitGroup
	results := make(chan error, flood)
	for range flood {
		b := newApp(t, devB, ib.RC, 64, ib.LocalWrite, 4, caps)
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := peer.Connect(ctx, b.qp, addrA, 6001, &rdmacm.ConnParam{})
			results <- err
		}()
	}
	wg.Wait()
	close(results)
	var full, expired, timedOut, other int
	for err := range results {
		var rej *rdmacm.RejectedError
		switch {
		case errors.As(err, &rej) && rej.Reason == cm.RejNoResources:
			full++
		case errors.As(err, &rej) && rej.Reason == cm.RejTimeout:
			expired++
		case errors.Is(err, rdmacm.ErrTimeout):
			timedOut++
		default:
			other++
			t.Logf("flood connect: %v", err)
		}
	}
	// Two wait in the client's backlog, unanswered: the daemon's CM
	// refuses them when their peers' retries are over (REJ timeout), or
	// the peers give up first; beyond the backlog the daemon refuses at
	// once (a peer that gave up before the refusal came counts it as a
	// timeout), beyond the half-open cap it drops the REQs until the
	// peers give up.
	st := cmCounters(t, srv)
	if full == 0 || st[proto.CMBacklogFull] < uint64(full) || expired > 2 || other != 0 || full+expired+timedOut != flood {
		t.Fatalf("%d refused (backlog_full %d), %d expired, %d timed out, %d other", full, st[proto.CMBacklogFull], expired, timedOut, other)
	}
	if st[proto.CMReqDropped] == 0 {
		t.Fatalf("no REQ dropped at the half-open cap of 6: %+v", st)
	}
	if st[proto.CMRxDuplicates] == 0 {
		t.Fatalf("the peers' REQ retries were not seen as duplicates: %+v", st)
	}
	// Two requests reached the listener. A peer that gave up first sent
	// the daemon a REJ that may still be on its way: once the daemon has
	// taken every MAD the peers sent, both requests are over (timed out
	// there, or rejected by their peers), and a late answer fails.
	_, ps := peer.Stats()
	var sent uint64
	for _, n := range ps.Tx {
		sent += n
	}
	waitCounter(t, srv, proto.CMRxMsgs, sent)
	for range 2 {
		r, err := l.GetRequest(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Reject(nil); err == nil {
			t.Fatal("a request over long ago was refused without error")
		}
	}
	l.Close()
	// Once the flood's entries are released (their peers' retry time
	// after the last REQ), the daemon serves the next connection; the
	// peer retries until then.
	l2, err := c.Listen(6002, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	a := newApp(t, c, ib.RC, 64, ib.LocalWrite, 4, caps)
	b := newApp(t, devB, ib.RC, 64, ib.LocalWrite, 4, caps)
	accepted := make(chan error, 1)
	go func() {
		_, err := rdmacm.AcceptNext(ctx, l2, func() (verbs.QP, error) { return a.qp, nil }, &rdmacm.ConnParam{})
		accepted <- err
	}()
	for i := 0; ; i++ {
		_, err := peer.Connect(ctx, b.qp, addrA, 6002, &rdmacm.ConnParam{})
		if err == nil {
			break
		}
		if !errors.Is(err, rdmacm.ErrTimeout) || i == 50 {
			t.Fatalf("connect after the flood: %v", err)
		}
		if err := b.qp.Modify(&ib.QPAttr{State: ib.Reset}, ib.AttrState); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-accepted; err != nil {
		t.Fatal(err)
	}
}

// A peer that never answers: the client's connection ends UNREACHABLE
// (rdmacm.ErrTimeout) after the CM's retries, and one to an address that
// does not resolve at once (EHOSTUNREACH); both counted.
func TestUCMPeerNeverAnswers(t *testing.T) {
	devA, _ := testlink.Pair(t, 1024) // B runs no CM: its QP1 does not exist
	srv, path := serveCM(t, devA, fastCM)
	c, err := client.Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	caps := ib.QPCaps{MaxSendWR: 2, MaxRecvWR: 2, MaxSendSGE: 1, MaxRecvSGE: 1}
	a := newApp(t, c, ib.RC, 64, ib.LocalWrite, 4, caps)
	if _, err := c.Connect(ctx, a.qp, addrB, 6003, &rdmacm.ConnParam{}); !errors.Is(err, rdmacm.ErrTimeout) {
		t.Fatalf("connect to a silent peer: %v, want UNREACHABLE (rdmacm.ErrTimeout)", err)
	}
	st := cmCounters(t, srv)
	if st[proto.CMTimeouts] != 1 || st[proto.CMTxRetries] != uint64(fastCM.MaxCMRetries) {
		t.Fatalf("timeouts %d, retries %d (want 1, %d)", st[proto.CMTimeouts], st[proto.CMTxRetries], fastCM.MaxCMRetries)
	}
	if _, err := c.ResolveUD(ctx, addrB, 6004, nil); !errors.Is(err, rdmacm.ErrTimeout) {
		t.Fatalf("SIDR to a silent peer: %v", err)
	}
	a2 := newApp(t, c, ib.RC, 64, ib.LocalWrite, 4, caps)
	nowhere := netip.MustParseAddr("192.0.2.99")
	if _, err := c.Connect(ctx, a2.qp, nowhere, 6003, &rdmacm.ConnParam{}); !errors.Is(err, unix.EHOSTUNREACH) {
		t.Fatalf("connect to an address that does not resolve: %v", err)
	}
	if st := cmCounters(t, srv); st[proto.CMTimeouts] != 2 || st[proto.CMUnresolved] != 1 {
		t.Fatalf("timeouts %d (want 2), unresolved %d (want 1)", st[proto.CMTimeouts], st[proto.CMUnresolved])
	}
}

// A client that goes away between REQ and RTU: its requests are refused
// to their peers, its own REQ is withdrawn (REJ), and the peers hear it
// as rdma_cm reports it (REJECTED); counted as torn down.
func TestUCMClientGoneMidConnect(t *testing.T) {
	devA, devB := testlink.Pair(t, 1024)
	srv, path := serveCM(t, devA, cm.Config{})
	peer := peerCM(t, devB)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	caps := ib.QPCaps{MaxSendWR: 2, MaxRecvWR: 2, MaxSendSGE: 1, MaxRecvSGE: 1}

	// Passive: the request reached the client, which dies before it
	// answers.
	c, err := client.Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	l, err := c.Listen(6005, 0)
	if err != nil {
		t.Fatal(err)
	}
	b := newApp(t, devB, ib.RC, 64, ib.LocalWrite, 4, caps)
	dialed := make(chan error, 1)
	go func() {
		_, err := peer.Connect(ctx, b.qp, addrA, 6005, &rdmacm.ConnParam{})
		dialed <- err
	}()
	if _, err := l.GetRequest(ctx); err != nil {
		t.Fatal(err)
	}
	c.Close()
	var rej *rdmacm.RejectedError
	if err := <-dialed; !errors.As(err, &rej) || rej.Reason != cm.RejConsumerDefined {
		t.Fatalf("peer's connect to a client that died: %v, want REJ consumer defined", err)
	}

	// Active: the client's REQ is out, the peer has it; the client dies.
	c2, err := client.Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	pl, err := peer.Listen(6006, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer pl.Close()
	a := newApp(t, c2, ib.RC, 64, ib.LocalWrite, 4, caps)
	go func() { _, _ = c2.Connect(ctx, a.qp, addrB, 6006, &rdmacm.ConnParam{}) }() // it dies before the answer
	r, err := pl.GetRequest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c2.Close()
	waitCounter(t, srv, proto.CMTornDown, 2)
	b2 := newApp(t, devB, ib.RC, 64, ib.LocalWrite, 4, caps)
	if _, err := r.Accept(ctx, b2.qp, &rdmacm.ConnParam{}); err == nil {
		t.Fatal("the peer accepted a request whose client died")
	}
	// The daemon serves the next client.
	c3, err := client.Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	connectThroughDaemon(t, ctx, c3, peer, devB, 6007)
}

// The SIDR answer names a QP a peer will send to: the daemon refuses one
// that is not ready for it, in RESET or INIT, or with a Q_Key other than
// the one announced.
func TestUCMSIDRAnswerChecksQP(t *testing.T) {
	devA, devB := testlink.Pair(t, 1024)
	_, path := serveCM(t, devA, cm.Config{})
	peer := peerCM(t, devB)
	c, err := client.Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	caps := ib.QPCaps{MaxSendWR: 2, MaxRecvWR: 2, MaxSendSGE: 1, MaxRecvSGE: 1}
	l, err := c.ListenUD(6008, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	res := make(chan error, 1)
	go func() {
		_, err := peer.ResolveUD(ctx, addrA, 6008, nil)
		res <- err
	}()
	r, err := l.GetRequest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ud := newApp(t, c, ib.UD, 64, ib.LocalWrite, 4, caps).qp
	if err := r.Accept(ud, nil); !errors.Is(err, unix.EINVAL) {
		t.Fatalf("answer with a UD QP in RESET: %v", err)
	}
	readyUD(t, ud, 0x1111) // RTS, but not rdma_cm's Q_Key
	if err := r.Accept(ud, nil); !errors.Is(err, unix.EINVAL) {
		t.Fatalf("answer with a UD QP of another Q_Key: %v", err)
	}
	ud2 := newApp(t, c, ib.UD, 64, ib.LocalWrite, 4, caps).qp
	if err := rdmacm.PrepareUD(ud2); err != nil {
		t.Fatal(err)
	}
	if err := r.Accept(ud2, nil); err != nil {
		t.Fatal(err)
	}
	if err := <-res; err != nil {
		t.Fatal(err)
	}
}

// The peer disconnects: the client's connection ends (Done, Err
// ErrDisconnected, its QP in ERR with the posted receive flushed) and its
// private data came both ways.
func TestUCMPeerDisconnects(t *testing.T) {
	devA, devB := testlink.Pair(t, 1024)
	_, path := serveCM(t, devA, cm.Config{})
	peer := peerCM(t, devB)
	c, err := client.Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	caps := ib.QPCaps{MaxSendWR: 2, MaxRecvWR: 2, MaxSendSGE: 1, MaxRecvSGE: 1}
	pl, err := peer.Listen(6010, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer pl.Close()
	b := newApp(t, devB, ib.RC, 64, ib.LocalWrite, 4, caps)
	accepted := make(chan rdmacm.Conn, 1)
	go func() {
		r, err := pl.GetRequest(ctx)
		if err != nil {
			t.Error(err)
			accepted <- nil
			return
		}
		if string(r.PrivateData()[:3]) != "req" {
			t.Errorf("REQ private data %q", r.PrivateData())
		}
		pc, err := r.Accept(ctx, b.qp, &rdmacm.ConnParam{PrivateData: []byte("rep")})
		if err != nil {
			t.Error(err)
		}
		accepted <- pc
	}()
	a := newApp(t, c, ib.RC, 64, ib.LocalWrite, 4, caps)
	if err := rdmacm.InitQP(a.qp, &rdmacm.ConnParam{}); err != nil {
		t.Fatal(err)
	}
	a.recv(t, 7, 0, 64)
	conn, err := c.Connect(ctx, a.qp, addrB, 6010, &rdmacm.ConnParam{PrivateData: []byte("req")})
	if err != nil {
		t.Fatal(err)
	}
	pc := <-accepted
	if pc == nil {
		t.FailNow()
	}
	if string(conn.PrivateData()[:3]) != "rep" {
		t.Fatalf("REP private data %q", conn.PrivateData())
	}
	select {
	case <-conn.Done():
		t.Fatal("connection over before the peer disconnected")
	default:
	}
	if err := pc.Disconnect(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-conn.Done():
	case <-ctx.Done():
		t.Fatal("the client never saw the peer's DREQ")
	}
	if !errors.Is(conn.Err(), rdmacm.ErrDisconnected) {
		t.Fatalf("Err %v", conn.Err())
	}
	if wc := waitWC(t, a.cq); wc.ID != 7 || wc.Status != ib.WRFlushErr {
		t.Fatalf("the posted receive: %+v, want a flush", wc)
	}
}

// The UCM operations as a misbehaving client may send them: unknown
// handles, wrong bodies, operations on the wrong kind of ID. Each is
// refused with its errno and the session goes on; when the daemon stops,
// every ID hears DEVICE_REMOVAL on its channel before the channel closes.
func TestUCMRawOperations(t *testing.T) {
	devA, _ := testlink.Pair(t, 1024)
	srv, path := serveCM(t, devA, cm.Config{})
	uc, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	conn := proto.NewConn(uc)
	defer conn.Close()
	seq := uint32(0)
	call := func(op proto.Op, req any) (body []byte, fds []int, errno unix.Errno) {
		t.Helper()
		seq++
		if err := conn.Send(proto.Header{Op: op, Seq: seq}, req); err != nil {
			t.Fatal(err)
		}
		h, b, f, err := conn.Recv()
		if err != nil || h.Op != op || h.Seq != seq {
			t.Fatalf("%v: %v (%v #%d)", op, err, h.Op, h.Seq)
		}
		return b, f, unix.Errno(h.Errno)
	}
	call(proto.OpOpen, &proto.OpenReq{Version: proto.Version})
	b, fds, no := call(proto.OpUCMCreateChannel, nil)
	if no != 0 || len(fds) != 1 {
		t.Fatalf("CREATE_CHANNEL: %v, %d fds", no, len(fds))
	}
	var ch proto.HandleMsg
	if err := proto.DecodeBody(b, &ch); err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fds[0]), "events")
	defer f.Close()
	for _, c := range []struct {
		what string
		op   proto.Op
		req  any
		want unix.Errno
	}{
		{"listen on no channel", proto.OpUCMListen, &proto.UCMListenReq{Channel: 999, Port: 7000, IPVersion: 4}, unix.ENOENT},
		{"listen in an unknown port space", proto.OpUCMListen, &proto.UCMListenReq{Channel: ch.Handle, Port: 7000, Space: 9, IPVersion: 4}, unix.EINVAL},
		{"listen on another's address", proto.OpUCMListen, &proto.UCMListenReq{Channel: ch.Handle, Port: 7000, IPVersion: 4,
			Addr: netip.MustParseAddr("::ffff:192.0.2.99").As16()}, unix.EADDRNOTAVAIL},
		{"a backlog over 1024", proto.OpUCMListen, &proto.UCMListenReq{Channel: ch.Handle, Port: 7000, IPVersion: 4, Backlog: 5000}, unix.EINVAL},
		{"a short body", proto.OpUCMListen, &proto.HandleMsg{Handle: ch.Handle}, unix.EINVAL},
		{"connect from another's GID", proto.OpUCMConnect, &proto.UCMConnectReq{Channel: ch.Handle, QPType: ib.RC,
			Local: netip.MustParseAddr("::ffff:192.0.2.99").As16(), Peer: netip.MustParseAddr("::ffff:192.0.2.11").As16()}, unix.EADDRNOTAVAIL},
		{"connect a QP that is not ours", proto.OpUCMConnect, &proto.UCMConnectReq{Channel: ch.Handle, QPType: ib.RC, PathMTU: 3,
			Local: gidA, Peer: gidB, Param: proto.UCMConnParam{QPN: 1}}, unix.EINVAL},
		{"connect UC", proto.OpUCMConnect, &proto.UCMConnectReq{Channel: ch.Handle, QPType: ib.UC, Local: gidA, Peer: gidB}, unix.EOPNOTSUPP},
		{"too much private data", proto.OpUCMConnect, &proto.UCMConnectReq{Channel: ch.Handle, Space: proto.PortSpaceUDP,
			Local: gidA, Peer: gidB, Param: proto.UCMConnParam{PrivateDataLen: 190}}, unix.EINVAL},
		{"accept an unknown ID", proto.OpUCMAccept, &proto.UCMAcceptReq{ID: 4242}, unix.ENOENT},
		{"destroy an unknown ID", proto.OpUCMDestroyID, &proto.HandleMsg{Handle: 4242}, unix.ENOENT},
		{"destroy an unknown channel", proto.OpUCMDestroyChannel, &proto.HandleMsg{Handle: 4242}, unix.ENOENT},
		{"an event as a request", proto.OpUCMEvent, &proto.UCMEvent{}, unix.EOPNOTSUPP},
	} {
		if _, _, no := call(c.op, c.req); no != c.want {
			t.Errorf("%s: %v, want %v", c.what, no, c.want)
		}
	}
	b, _, no = call(proto.OpUCMListen, &proto.UCMListenReq{Channel: ch.Handle, Port: 7000, IPVersion: 6})
	if no != 0 {
		t.Fatalf("LISTEN: %v", no)
	}
	var l proto.HandleMsg
	if err := proto.DecodeBody(b, &l); err != nil {
		t.Fatal(err)
	}
	if _, _, no := call(proto.OpUCMListen, &proto.UCMListenReq{Channel: ch.Handle, Port: 7000, IPVersion: 4}); no != unix.EADDRINUSE {
		t.Errorf("an IPv4 listener beside an IPv6 wildcard: %v, want EADDRINUSE", no)
	}
	for _, op := range []proto.Op{proto.OpUCMEstablish, proto.OpUCMNotify, proto.OpUCMDisconnect} {
		if _, _, no := call(op, &proto.HandleMsg{Handle: l.Handle}); no != unix.EINVAL {
			t.Errorf("%v on a listener: %v, want EINVAL", op, no)
		}
	}
	if _, _, no := call(proto.OpUCMReject, &proto.UCMRejectReq{ID: l.Handle}); no != unix.EINVAL {
		t.Errorf("REJECT of a listener: %v", no)
	}

	srv.Close(time.Second)
	buf := make([]byte, proto.MaxMessage)
	n, err := f.Read(buf)
	if err != nil {
		t.Fatalf("no DEVICE_REMOVAL: %v", err)
	}
	h, body, err := proto.DecodeHeader(buf[:n])
	var ev proto.UCMEvent
	if err != nil || h.Op != proto.OpUCMEvent || proto.DecodeBody(body, &ev) != nil ||
		ev.Event != proto.UCMEventDeviceRemoval || ev.ID != l.Handle || h.Seq != 1 {
		t.Fatalf("event %v %+v, want DEVICE_REMOVAL for %d", err, ev, l.Handle)
	}
	if n, err := f.Read(buf); n != 0 && err == nil {
		t.Fatalf("more after DEVICE_REMOVAL: %d bytes", n)
	}
}

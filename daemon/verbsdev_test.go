package daemon_test

import (
	"bytes"
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
	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/daemon"
	"github.com/softrnic/softrnic/daemon/proto"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/ibtest"
	"github.com/softrnic/softrnic/rnic"
)

var (
	macA, macB   = [6]byte{2, 0, 0, 0, 0, 0xa}, [6]byte{2, 0, 0, 0, 0, 0xb}
	addrA, addrB = netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("192.0.2.11")
)

// shuttle is the wire and the engine of two verbs devices: it moves every
// frame one device transmits to the other and runs their timers. Frames are
// real RoCEv2 frames with ICRCs, checked by the receiving device. Like the
// engine, it keeps polling for a while after the last work (SpinFor) and
// then sleeps until a doorbell or the earliest transport deadline.
func shuttle(ctx context.Context, a, b *rnic.Device) {
	out := make([][]byte, 32)
	for i := range out {
		out[i] = make([]byte, 0, 9000)
	}
	idle := time.NewTimer(time.Hour)
	lastWork := clock.Now()
	for ctx.Err() == nil {
		now := clock.Now()
		work := false
		for _, p := range [][2]*rnic.Device{{a, b}, {b, a}} {
			if n := p[0].Transmit(now, out); n > 0 {
				p[1].Receive(now, out[:n])
				work = true
			}
			p[0].Expire(now)
		}
		if work {
			lastWork = now
			continue
		}
		if now.Sub(lastWork) < 50*time.Microsecond {
			runtime.Gosched()
			continue
		}
		wait := min(clock.Min(a.NextDeadline(), b.NextDeadline()).Sub(now), time.Millisecond)
		if wait <= 0 {
			continue
		}
		idle.Reset(wait)
		select {
		case <-a.Doorbell():
		case <-b.Doorbell():
		case <-idle.C:
		case <-ctx.Done():
		}
	}
}

// twoDevices makes devices A and B joined by a shuttle goroutine, and a
// daemon serving A on a socket in a temp dir.
func twoDevices(t testing.TB) (devA, devB *rnic.Device, path string) {
	return twoDevicesSpin(t, 0)
}

// twoDevicesSpin is twoDevices with the daemon pump's SpinFor.
func twoDevicesSpin(t testing.TB, spin time.Duration) (devA, devB *rnic.Device, path string) {
	devA, err := rnic.NewDevice(rnic.Config{MAC: macA, Addrs: []netip.Addr{addrA}, PortMTU: 1024})
	if err != nil {
		t.Fatal(err)
	}
	devB, _ = rnic.NewDevice(rnic.Config{MAC: macB, Addrs: []netip.Addr{addrB}, PortMTU: 1024})
	macs := map[netip.Addr][6]byte{addrA: macA, addrB: macB}
	resolve := func(a netip.Addr) ([6]byte, error) {
		m, ok := macs[a]
		if !ok {
			return m, fmt.Errorf("no neighbour %v", a)
		}
		return m, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { shuttle(ctx, devA, devB); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	srv, err := daemon.NewServer(daemon.NewVerbsDevice(devA, "veth-a", resolve), daemon.Options{Group: -1, SpinFor: spin, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	path = filepath.Join(t.TempDir(), "ctl.sock")
	if err := srv.Listen(path); err != nil {
		t.Fatal(err)
	}
	go srv.Serve()
	t.Cleanup(func() { srv.Close(time.Second) })
	return devA, devB, path
}

// A client process's memory, registered through the daemon's verbs device,
// is written and read by a peer RNIC with RDMA WRITE and READ; the peer's
// wrong rkey gets a remote access error and writes nothing.
func TestVerbsDeviceThroughDaemon(t *testing.T) {
	devA, devB, path := twoDevices(t)
	_ = devA

	// The client side: memory, MR, CQ, RC QP, all through the daemon.
	c, err := client.Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if info := c.Info(); info.NumGIDs != 1 || netip.AddrFrom16(info.GIDs[0]).Unmap() != addrA || info.ActiveMTU != 1024 {
		t.Fatalf("device info %+v", info)
	}
	pd, _ := c.AllocPD()
	mem, _ := client.AllocMem(1 << 16)
	defer mem.Free()
	mr, err := pd.RegMR(mem, 0, 1<<16, ib.LocalWrite|ib.RemoteWrite|ib.RemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	cq, _ := c.CreateCQ(64)
	qp, err := pd.CreateQP(client.QPInitAttr{Type: proto.RC, SendCQ: cq, RecvCQ: cq, Caps: proto.QPCaps{MaxSendWR: 64, MaxRecvWR: 64, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}

	// The peer: an application on device B, in-process verbs.
	pdB := devB.AllocPD()
	bufB := make([]byte, 1<<16)
	mrB, _ := pdB.RegMR(bufB, ib.LocalWrite)
	cqB := devB.CreateCQ(64)
	qpB, err := pdB.CreateQP(rnic.QPInitAttr{Type: ib.RC, SendCQ: cqB, RecvCQ: cqB, MaxSendWR: 64, MaxRecvWR: 64})
	if err != nil {
		t.Fatal(err)
	}

	// Connect: the client with proto attributes, the peer with verbs ones.
	gidB := addrB.As16()
	steps := []struct {
		a proto.QPAttr
		m proto.QPAttrMask
	}{
		{proto.QPAttr{State: proto.Init, Access: ib.RemoteWrite | ib.RemoteRead}, proto.AttrState | proto.AttrPKeyIndex | proto.AttrPort | proto.AttrAccessFlags},
		{proto.QPAttr{State: proto.RTR, PathMTU: 1024, DestQPN: qpB.QPN(), RQPSN: 500, DGID: [16]byte(gidB[:]), MaxDestRdAtomic: 4, MinRNRTimer: 12}, proto.AttrState | proto.AttrAV | proto.AttrPathMTU | proto.AttrDestQPN | proto.AttrRQPSN | proto.AttrMaxDestRdAtomc | proto.AttrMinRNRTimer},
		{proto.QPAttr{State: proto.RTS, SQPSN: 700, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 4}, proto.AttrState | proto.AttrSQPSN | proto.AttrTimeout | proto.AttrRetryCnt | proto.AttrRNRRetry | proto.AttrMaxQPRdAtomic},
	}
	for _, s := range steps {
		if err := qp.Modify(&s.a, s.m); err != nil {
			t.Fatalf("client QP to %v: %v", s.a.State, err)
		}
	}
	if err := ibtest.Modify(qpB, ib.Init, &ib.QPAttr{}); err != nil {
		t.Fatal(err)
	}
	if err := ibtest.Modify(qpB, ib.RTR, &ib.QPAttr{PathMTU: 1024, DestQPN: qp.QPN, RQPSN: 700, MaxDestRdAtomic: 4, AV: ib.AddressVector{DMAC: macA, DGID: ib.GIDFrom(addrA)}}); err != nil {
		t.Fatal(err)
	}
	if err := ibtest.Modify(qpB, ib.RTS, &ib.QPAttr{SQPSN: 500, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 4}); err != nil {
		t.Fatal(err)
	}
	waitB := func() ib.WC {
		t.Helper()
		var wcs [1]ib.WC
		wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer wcancel()
		if _, err := cqB.Wait(wctx, wcs[:]); err != nil {
			t.Fatal("peer: no completion")
		}
		return wcs[0]
	}
	waitClient := func() ib.WC {
		t.Helper()
		var wcs [1]ib.WC
		deadline := time.Now().Add(10 * time.Second)
		for cq.Poll(wcs[:]) == 0 {
			if time.Now().After(deadline) {
				t.Fatal("client: no completion")
			}
			cq.Wait(50 * time.Millisecond)
		}
		return wcs[0]
	}

	// RDMA WRITE from the peer lands in the client's own buffer: 3000
	// bytes, three packets at MTU 1024.
	msg := bytes.Repeat([]byte("remote write into client memory. "), 100)[:3000]
	copy(bufB, msg)
	if _, err := qpB.PostSend(rnic.SendWR{ID: 1, Opcode: ib.RDMAWrite, Flags: ib.Signaled,
		SG: []ib.SGE{{Addr: mrB.IOVA(), Length: 3000, LKey: mrB.LKey()}}, RemoteAddr: mr.Addr + 4096, RKey: mr.RKey}); err != nil {
		t.Fatal(err)
	}
	if wc := waitB(); wc.Status != ib.Success {
		t.Fatalf("peer WRITE: %v", wc.Status)
	}
	if !bytes.Equal(mem.Bytes()[4096:7096], msg) {
		t.Fatal("client memory does not hold the written data")
	}

	// RDMA READ by the peer from the client's buffer.
	copy(mem.Bytes()[20000:], "the client's answer")
	if _, err := qpB.PostSend(rnic.SendWR{ID: 2, Opcode: ib.RDMARead, Flags: ib.Signaled,
		SG: []ib.SGE{{Addr: mrB.IOVA() + 8192, Length: 19, LKey: mrB.LKey()}}, RemoteAddr: mr.Addr + 20000, RKey: mr.RKey}); err != nil {
		t.Fatal(err)
	}
	if wc := waitB(); wc.Status != ib.Success || string(bufB[8192:8211]) != "the client's answer" {
		t.Fatalf("peer READ: %v %q", wc.Status, bufB[8192:8211])
	}

	// The client SENDs through its shared-memory SQ; the peer receives.
	qpB.PostRecv(rnic.RecvWR{ID: 3, SG: []ib.SGE{{Addr: mrB.IOVA() + 30000, Length: 100, LKey: mrB.LKey()}}})
	copy(mem.Bytes()[100:], "hello from the client process")
	if _, err := qp.PostSend(&proto.SendWR{ID: 4, Opcode: ib.Send, Flags: ib.Signaled, SG: []proto.SGE{mr.SGE(100, 29)}}); err != nil {
		t.Fatal(err)
	}
	if wc := waitClient(); wc.ID != 4 || wc.Status != ib.Success {
		t.Fatalf("client SEND: %+v", wc)
	}
	if wc := waitB(); wc.ID != 3 || wc.Status != ib.Success || string(bufB[30000:30029]) != "hello from the client process" {
		t.Fatalf("peer RECV: %+v %q", wc, bufB[30000:30029])
	}

	// A wrong rkey: remote access error at the peer, nothing written.
	before := append([]byte(nil), mem.Bytes()...)
	qpB.PostSend(rnic.SendWR{ID: 5, Opcode: ib.RDMAWrite, Flags: ib.Signaled,
		SG: []ib.SGE{{Addr: mrB.IOVA(), Length: 64, LKey: mrB.LKey()}}, RemoteAddr: mr.Addr, RKey: mr.RKey ^ 0x5a5a})
	if wc := waitB(); wc.Status != ib.RemAccessErr {
		t.Fatalf("wrong rkey: %v", wc.Status)
	}
	if !bytes.Equal(mem.Bytes(), before) {
		t.Fatal("a write with a wrong rkey changed client memory")
	}
	attr, err := qp.Query()
	if err != nil || attr.DestQPN != qpB.QPN() || attr.SQPSN != 700 || attr.RQPSN != 500 || attr.PathMTU != 1024 || attr.DGID != [16]byte(gidB[:]) {
		t.Fatalf("query %+v %v", attr, err)
	}
}

// UD through the daemon: the client's datagram names its destination in
// the WQE (GID, QPN, Q_Key); the daemon resolves the address handle off the
// pump and the peer receives the GRH slot and the payload.
func TestVerbsDeviceUD(t *testing.T) {
	_, devB, path := twoDevices(t)
	c, err := client.Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pd, _ := c.AllocPD()
	mem, _ := client.AllocMem(4096)
	defer mem.Free()
	mr, _ := pd.RegMR(mem, 0, 4096, ib.LocalWrite)
	cq, _ := c.CreateCQ(16)
	qp, err := pd.CreateQP(client.QPInitAttr{Type: proto.UD, SendCQ: cq, RecvCQ: cq, Caps: proto.QPCaps{MaxSendWR: 8, MaxRecvWR: 8}})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []struct {
		a proto.QPAttr
		m proto.QPAttrMask
	}{
		{proto.QPAttr{State: proto.Init, QKey: 0x11111111}, proto.AttrState | proto.AttrPKeyIndex | proto.AttrPort | proto.AttrQKey},
		{proto.QPAttr{State: proto.RTR}, proto.AttrState},
		{proto.QPAttr{State: proto.RTS, SQPSN: 1}, proto.AttrState | proto.AttrSQPSN},
	} {
		if err := qp.Modify(&s.a, s.m); err != nil {
			t.Fatalf("client UD QP to %v: %v", s.a.State, err)
		}
	}
	pdB := devB.AllocPD()
	bufB := make([]byte, 4096)
	mrB, _ := pdB.RegMR(bufB, ib.LocalWrite)
	cqB := devB.CreateCQ(16)
	qpB, _ := pdB.CreateQP(rnic.QPInitAttr{Type: ib.UD, SendCQ: cqB, RecvCQ: cqB})
	ibtest.Modify(qpB, ib.Init, &ib.QPAttr{QKey: 0x11111111})
	ibtest.Modify(qpB, ib.RTR, &ib.QPAttr{})
	ibtest.Modify(qpB, ib.RTS, &ib.QPAttr{})
	if _, err := qpB.PostRecv(rnic.RecvWR{ID: 5, SG: []ib.SGE{{Addr: mrB.IOVA(), Length: 1024, LKey: mrB.LKey()}}}); err != nil {
		t.Fatal(err)
	}
	copy(mem.Bytes(), "datagram through the daemon")
	gid := addrB.As16()
	if _, err := qp.PostSend(&proto.SendWR{ID: 6, Opcode: ib.Send, Flags: ib.Signaled, SG: []proto.SGE{mr.SGE(0, 27)},
		RemoteQPN: qpB.QPN(), QKey: 0x11111111, DGID: [16]byte(gid[:])}); err != nil {
		t.Fatal(err)
	}
	var wcs [1]ib.WC
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	if _, err := cqB.Wait(wctx, wcs[:]); err != nil {
		t.Fatal("peer: no UD receive")
	}
	if wcs[0].ID != 5 || wcs[0].Status != ib.Success || wcs[0].SrcQP != qp.QPN || wcs[0].SrcIP != addrA ||
		string(bufB[40:67]) != "datagram through the daemon" {
		t.Fatalf("UD receive %+v, payload %q", wcs[0], bufB[40:67])
	}
	var cwc [1]ib.WC
	for deadline := time.Now().Add(10 * time.Second); cq.Poll(cwc[:]) == 0; {
		if time.Now().After(deadline) {
			t.Fatal("client: no UD send completion")
		}
		cq.Wait(10 * time.Millisecond)
	}
	if cwc[0].ID != 6 || cwc[0].Status != ib.Success {
		t.Fatalf("client UD send completion %+v", cwc[0])
	}
	// A destination that does not resolve fails the WR, and only it.
	bad := netip.MustParseAddr("192.0.2.99").As16()
	qp.PostSend(&proto.SendWR{ID: 7, Opcode: ib.Send, Flags: ib.Signaled, SG: []proto.SGE{mr.SGE(0, 8)}, RemoteQPN: 1, QKey: 1, DGID: [16]byte(bad[:])})
	for deadline := time.Now().Add(10 * time.Second); cq.Poll(cwc[:]) == 0; {
		if time.Now().After(deadline) {
			t.Fatal("client: no completion for an unresolvable destination")
		}
		cq.Wait(10 * time.Millisecond)
	}
	if cwc[0].ID != 7 || cwc[0].Status == ib.Success {
		t.Fatalf("unresolvable destination: %+v", cwc[0])
	}
}

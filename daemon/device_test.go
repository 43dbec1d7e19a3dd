package daemon_test

import (
	"bytes"
	"errors"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/verbs"
)

// A client process's memory, registered through the daemon's device, is
// written and read by a peer RNIC with RDMA WRITE and READ; the peer's
// wrong rkey gets a remote access error and writes nothing.
func TestClientThroughDaemon(t *testing.T) {
	_, devB, path := twoDevices(t)
	c, err := client.Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if info := c.Info(); info.NumGIDs != 1 || netip.AddrFrom16(info.GIDs[0]).Unmap() != addrA || info.ActiveMTU != 1024 || c.Name() != "mem-a" {
		t.Fatalf("device info %+v", info)
	}
	caps := ib.QPCaps{MaxSendWR: 64, MaxRecvWR: 64, MaxSendSGE: 1, MaxRecvSGE: 1}
	a := newApp(t, c, ib.RC, 1<<16, ib.LocalWrite|ib.RemoteWrite|ib.RemoteRead, 64, caps)
	b := newApp(t, devB, ib.RC, 1<<16, ib.LocalWrite, 64, caps)
	connectRC(t, a.qp, ib.RemoteWrite|ib.RemoteRead, b.qp.QPN(), gidB, 700, 500)
	connectRC(t, b.qp, 0, a.qp.QPN(), gidA, 500, 700)

	// RDMA WRITE from the peer lands in the client's own buffer: 3000
	// bytes, three packets at MTU 1024.
	msg := bytes.Repeat([]byte("remote write into client memory. "), 100)[:3000]
	copy(b.buf(), msg)
	b.send(t, verbs.SendWR{ID: 1, Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: []ib.SGE{b.sge(0, 3000)}, RemoteAddr: a.mr.IOVA() + 4096, RKey: a.mr.RKey()})
	if wc := waitWC(t, b.cq); wc.Status != ib.Success {
		t.Fatalf("peer WRITE: %v", wc.Status)
	}
	if !bytes.Equal(a.buf()[4096:7096], msg) {
		t.Fatal("client memory does not hold the written data")
	}

	// RDMA READ by the peer from the client's buffer.
	copy(a.buf()[20000:], "the client's answer")
	b.send(t, verbs.SendWR{ID: 2, Opcode: ib.RDMARead, Flags: ib.Signaled, SG: []ib.SGE{b.sge(8192, 19)}, RemoteAddr: a.mr.IOVA() + 20000, RKey: a.mr.RKey()})
	if wc := waitWC(t, b.cq); wc.Status != ib.Success || string(b.buf()[8192:8211]) != "the client's answer" {
		t.Fatalf("peer READ: %v %q", wc.Status, b.buf()[8192:8211])
	}

	// The client SENDs through its shared-memory SQ; the peer receives.
	b.recv(t, 3, 30000, 100)
	copy(a.buf()[100:], "hello from the client process")
	a.send(t, verbs.SendWR{ID: 4, Opcode: ib.Send, Flags: ib.Signaled, SG: []ib.SGE{a.sge(100, 29)}})
	if wc := waitWC(t, a.cq); wc.ID != 4 || wc.Status != ib.Success {
		t.Fatalf("client SEND: %+v", wc)
	}
	if wc := waitWC(t, b.cq); wc.ID != 3 || wc.Status != ib.Success || string(b.buf()[30000:30029]) != "hello from the client process" {
		t.Fatalf("peer RECV: %+v %q", wc, b.buf()[30000:30029])
	}

	// A wrong rkey: remote access error at the peer, nothing written.
	before := append([]byte(nil), a.buf()...)
	b.send(t, verbs.SendWR{ID: 5, Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: []ib.SGE{b.sge(0, 64)}, RemoteAddr: a.mr.IOVA(), RKey: a.mr.RKey() ^ 0x5a5a})
	if wc := waitWC(t, b.cq); wc.Status != ib.RemAccessErr {
		t.Fatalf("wrong rkey: %v", wc.Status)
	}
	if !bytes.Equal(a.buf(), before) {
		t.Fatal("a write with a wrong rkey changed client memory")
	}
	attr, err := a.qp.Query()
	if err != nil || attr.DestQPN != b.qp.QPN() || attr.SQPSN != 700 || attr.RQPSN != 500 || attr.PathMTU != 1024 || attr.AV.DGID != gidB {
		t.Fatalf("query %+v %v", attr, err)
	}
}

// UD through the daemon: the client makes an address handle (a daemon
// object; the device resolves the next hop) and its datagrams name it;
// the peer receives the GRH slot and the payload. A destination that does
// not resolve fails CreateAH; a WR naming no AH of the client fails alone.
func TestDaemonUD(t *testing.T) {
	_, devB, path := twoDevices(t)
	c, err := client.Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	caps := ib.QPCaps{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1}
	a := newApp(t, c, ib.UD, 4096, ib.LocalWrite, 16, caps)
	b := newApp(t, devB, ib.UD, 4096, ib.LocalWrite, 16, caps)
	readyUD(t, a.qp, 0x11111111)
	readyUD(t, b.qp, 0x11111111)
	b.recv(t, 5, 0, 1024)
	ah, err := a.pd.CreateAH(&ib.AddressVector{DGID: gidB})
	if err != nil {
		t.Fatal(err)
	}
	if av := ah.AV(); av.DGID != gidB {
		t.Fatalf("AH %+v", av)
	}
	copy(a.buf(), "datagram through the daemon")
	a.send(t, verbs.SendWR{ID: 6, Opcode: ib.Send, Flags: ib.Signaled, SG: []ib.SGE{a.sge(0, 27)}, AH: ah, RemoteQPN: b.qp.QPN(), RemoteQKey: 0x11111111})
	wc := waitWC(t, b.cq)
	if wc.ID != 5 || wc.Status != ib.Success || wc.SrcQP != a.qp.QPN() || wc.SrcIP != addrA ||
		string(b.buf()[40:67]) != "datagram through the daemon" {
		t.Fatalf("UD receive %+v, payload %q", wc, b.buf()[40:67])
	}
	if wc := waitWC(t, a.cq); wc.ID != 6 || wc.Status != ib.Success {
		t.Fatalf("client UD send completion %+v", wc)
	}

	// A destination that does not resolve: no AH.
	if _, err := a.pd.CreateAH(&ib.AddressVector{DGID: ib.GIDFrom(netip.MustParseAddr("192.0.2.99"))}); !errors.Is(err, unix.EINVAL) {
		t.Fatalf("AH to an unresolvable destination: %v", err)
	}
	// A destroyed AH's handle names nothing: the WR completes in error,
	// the next one with a live AH goes.
	ah2, err := a.pd.CreateAH(&ib.AddressVector{DGID: gidB})
	if err != nil {
		t.Fatal(err)
	}
	if err := ah2.Destroy(); err != nil {
		t.Fatal(err)
	}
	if err := ah2.Destroy(); !errors.Is(err, unix.ENOENT) {
		t.Fatalf("AH destroyed twice: %v", err)
	}
	a.send(t, verbs.SendWR{ID: 7, Opcode: ib.Send, Flags: ib.Signaled, SG: []ib.SGE{a.sge(0, 8)}, AH: ah2, RemoteQPN: b.qp.QPN(), RemoteQKey: 0x11111111})
	if wc := waitWC(t, a.cq); wc.ID != 7 || wc.Status == ib.Success {
		t.Fatalf("WR with a destroyed AH: %+v", wc)
	}
	if err := a.pd.Dealloc(); !errors.Is(err, unix.EBUSY) {
		t.Fatalf("PD with an AH deallocated: %v", err)
	}
}

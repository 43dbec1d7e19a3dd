package main

import (
	"bytes"
	"context"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/host"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/ibtest"
	"github.com/softrnic/softrnic/internal/netnstest"
	"github.com/softrnic/softrnic/internal/rnictest"
	"github.com/softrnic/softrnic/rnic"
	"github.com/softrnic/softrnic/verbs"
)

// buildSoftrnic builds this command into a temp dir.
func buildSoftrnic(t testing.TB) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "softrnic")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// The daemon in namespace A serves a client (this test process) whose
// registered memory a peer RNIC in namespace B writes and reads over a real
// veth; a second daemon on the interface is refused; SIGTERM ends the
// daemon with status 0, the client's QP flushed and no XDP program left.
func TestDaemonOverVeth(t *testing.T) {
	netnstest.SkipUnlessRoot(t)
	bin := buildSoftrnic(t)
	for _, kind := range []string{"afxdp", "afpacket"} {
		t.Run(kind, func(t *testing.T) { daemonOverVeth(t, bin, kind) })
	}
}

func daemonOverVeth(t *testing.T, bin, kind string) {
	pair := netnstest.NewTestPair(t, netnstest.PairOptions{})
	dir := t.TempDir()
	sock := filepath.Join(dir, "ctl.sock")
	var logs bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", pair.A.NS.Name, bin, "daemon", "-d", pair.A.Name,
		"--control", sock, "--port", kind, "--log-level", "debug")
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		if err := <-exited; t.Failed() {
			t.Logf("daemon log (killed: %v):\n%s", err, logs.String())
		}
	})
	var c *client.Client
	for deadline := time.Now().Add(20 * time.Second); ; {
		var err error
		if c, err = client.Dial(sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("daemon never answered: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	defer c.Close()
	if info := c.Info(); info.NumGIDs == 0 || netip.AddrFrom16(info.GIDs[0]).Unmap() != pair.A.Addr || info.ActiveMTU != 1024 {
		t.Fatalf("device info: %d GIDs, first %v, MTU %d", info.NumGIDs, netip.AddrFrom16(info.GIDs[0]), info.ActiveMTU)
	}

	st, err := c.Status()
	if err != nil || st.NumClients != 1 || st.Listed != 1 || st.Clients[0].PID != int32(os.Getpid()) ||
		string(bytes.TrimRight(st.Port.Kind[:], "\x00")) != kind {
		t.Fatalf("status %+v %v", st, err)
	}
	if attach := string(bytes.TrimRight(st.Port.Attach[:], "\x00")); kind == "afxdp" && attach != "driver" && attach != "generic" {
		t.Fatalf("AF_XDP attach mode %q", attach)
	}

	// A second daemon on the same interface is refused, clearly.
	out, err := exec.CommandContext(ctx, "ip", "netns", "exec", pair.A.NS.Name, bin, "daemon", "-d", pair.A.Name,
		"--control", filepath.Join(dir, "other.sock"), "--port", "afpacket").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "already serves "+pair.A.Name) {
		t.Fatalf("second daemon: %v\n%s", err, out)
	}

	// The peer: a verbs device on an AF_PACKET port in namespace B.
	devB := startPeer(t, pair.B)

	pd, _ := c.AllocPD()
	mem, _ := client.AllocMem(1 << 16)
	defer mem.Free()
	mr, err := pd.RegMR(mem, 0, 1<<16, 0, ib.LocalWrite|ib.RemoteWrite|ib.RemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	cq, _ := c.CreateCQ(64)
	qp, err := pd.CreateQP(&verbs.QPInitAttr{Type: ib.RC, SendCQ: cq, RecvCQ: cq, Cap: ib.QPCaps{MaxSendWR: 16, MaxRecvWR: 16}})
	if err != nil {
		t.Fatal(err)
	}
	pdB := rnictest.PD(devB)
	bufB := make([]byte, 1<<16)
	mrB, _ := pdB.RegBytes(bufB, 0, ib.LocalWrite)
	cqB := rnictest.CQ(devB, 64)
	qpB, _ := rnictest.QP(pdB, rnictest.QPAttr{Type: ib.RC, SendCQ: cqB, RecvCQ: cqB})
	gidB := pair.B.Addr.As16()
	for _, s := range []struct {
		a ib.QPAttr
		m ib.QPAttrMask
	}{
		{ib.QPAttr{State: ib.Init, Port: 1, Access: ib.RemoteWrite | ib.RemoteRead}, ib.AttrState | ib.AttrPKeyIndex | ib.AttrPort | ib.AttrAccessFlags},
		{ib.QPAttr{State: ib.RTR, PathMTU: 1024, DestQPN: qpB.QPN(), AV: ib.AddressVector{DGID: ib.GID(gidB)}, MaxDestRdAtomic: 4}, ib.AttrState | ib.AttrAV | ib.AttrPathMTU | ib.AttrDestQPN | ib.AttrMaxDestRdAtomic | ib.AttrRQPSN | ib.AttrMinRNRTimer},
		{ib.QPAttr{State: ib.RTS, Timeout: 14, RetryCnt: 7, RNRRetry: 7}, ib.AttrState | ib.AttrTimeout | ib.AttrRetryCnt | ib.AttrRNRRetry | ib.AttrSQPSN | ib.AttrMaxQPRdAtomic},
	} {
		if err := qp.Modify(&s.a, s.m); err != nil {
			t.Fatalf("client QP to %v: %v", s.a.State, err)
		}
	}
	var macA [6]byte
	copy(macA[:], pair.A.MAC)
	if err := ibtest.Modify(qpB, ib.Init, &ib.QPAttr{}); err != nil {
		t.Fatal(err)
	}
	if err := ibtest.Modify(qpB, ib.RTR, &ib.QPAttr{PathMTU: 1024, DestQPN: qp.QPN(), MaxDestRdAtomic: 4, AV: ib.AddressVector{DMAC: macA, DGID: ib.GIDFrom(pair.A.Addr)}}); err != nil {
		t.Fatal(err)
	}
	if err := ibtest.Modify(qpB, ib.RTS, &ib.QPAttr{Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 4}); err != nil {
		t.Fatal(err)
	}
	waitB := func(what string) {
		t.Helper()
		var wcs [1]ib.WC
		wctx, wcancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer wcancel()
		if _, err := cqB.PollWait(wctx, wcs[:]); err != nil {
			t.Fatalf("%s: no completion at the peer", what)
		}
		if wcs[0].Status != ib.Success {
			t.Fatalf("%s: %v", what, wcs[0].Status)
		}
	}

	// RDMA WRITE from namespace B into the client's memory, 8 KiB.
	for i := range bufB[:8192] {
		bufB[i] = byte(i*13 + 1)
	}
	if _, err := qpB.PostSend([]verbs.SendWR{{ID: 1, Opcode: ib.RDMAWrite, Flags: ib.Signaled,
		SG: []ib.SGE{{Addr: mrB.IOVA(), Length: 8192, LKey: mrB.LKey()}}, RemoteAddr: mr.IOVA() + 4096, RKey: mr.RKey()}}); err != nil {
		t.Fatal(err)
	}
	waitB("RDMA WRITE")
	if !bytes.Equal(mem.Bytes()[4096:4096+8192], bufB[:8192]) {
		t.Fatal("client memory does not hold the data written from namespace B")
	}
	// RDMA READ from namespace B out of the client's memory.
	copy(mem.Bytes()[30000:], "read across namespaces")
	if _, err := qpB.PostSend([]verbs.SendWR{{ID: 2, Opcode: ib.RDMARead, Flags: ib.Signaled,
		SG: []ib.SGE{{Addr: mrB.IOVA() + 20000, Length: 22, LKey: mrB.LKey()}}, RemoteAddr: mr.IOVA() + 30000, RKey: mr.RKey()}}); err != nil {
		t.Fatal(err)
	}
	waitB("RDMA READ")
	if string(bufB[20000:20022]) != "read across namespaces" {
		t.Fatalf("peer read %q", bufB[20000:20022])
	}

	// SIGTERM: the client's outstanding receive is flushed, the daemon exits
	// 0, and no XDP program stays on the interface.
	if _, err := qp.PostRecv([]verbs.RecvWR{{ID: 77, SG: []ib.SGE{{Addr: mr.IOVA(), Length: 64, LKey: mr.LKey()}}}}); err != nil {
		t.Fatal(err)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	var wc [1]ib.WC
	for deadline := time.Now().Add(10 * time.Second); cq.Poll(wc[:]) == 0; {
		if time.Now().After(deadline) {
			t.Fatal("no flush completion after SIGTERM")
		}
		if err := cq.Wait(10 * time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	if wc[0].ID != 77 || wc[0].Status != ib.WRFlushErr {
		t.Fatalf("after SIGTERM: %+v", wc[0])
	}
	select {
	case err := <-exited:
		exited <- err
		if err != nil {
			t.Fatalf("daemon exit: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("daemon did not exit after SIGTERM")
	}
	link, err := pair.A.NS.IP("link", "show", "dev", pair.A.Name)
	if err != nil || strings.Contains(link, "xdp") {
		t.Fatalf("XDP left attached: %v\n%s", err, link)
	}
	if !strings.Contains(logs.String(), "port="+kind) || !strings.Contains(logs.String(), "stopped") {
		t.Fatalf("no orderly stop in the log:\n%s", logs.String())
	}
	t.Logf("daemon log:\n%s", logs.String())
}

// startPeer runs the remote RNIC of the daemon tests: a verbs device on an
// AF_PACKET port on link b (in its namespace), driven by engine.Run until
// the test ends.
func startPeer(t *testing.T, b netnstest.Link) *rnic.Device {
	t.Helper()
	var h *host.Host
	if err := b.NS.Do(func() (err error) {
		h, err = host.Open(host.Config{Interface: b.Name, GIDs: []netip.Addr{b.Addr}, MTU: 1024, Port: host.AFPacket, NoCM: true})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h.Device
}

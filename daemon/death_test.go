package daemon_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/daemon"
	"github.com/softrnic/softrnic/daemon/proto"
	"github.com/softrnic/softrnic/engine"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/ibtest"
	"github.com/softrnic/softrnic/port/memlink"
	"github.com/softrnic/softrnic/rnic"
)

// TestMain runs a client process when the test binary is re-executed with
// SOFTRNIC_DAEMON_CHILD set.
func TestMain(m *testing.M) {
	if os.Getenv("SOFTRNIC_DAEMON_CHILD") != "" {
		os.Exit(streamingChild(os.Getenv("SOFTRNIC_CONTROL")))
	}
	os.Exit(m.Run())
}

// streamingChild is a client that registers 1 MiB, connects a QP to the
// peer QPN it reads on stdin, prints its QPN, rkey and address, and then
// posts RDMA WRITEs to the peer without end, until it is killed.
func streamingChild(path string) int {
	c, err := client.Dial(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	pd, _ := c.AllocPD()
	mem, _ := client.AllocMem(1 << 20)
	mr, err := pd.RegMR(mem, 0, 1<<20, ib.LocalWrite|ib.RemoteWrite)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cq, _ := c.CreateCQ(256)
	qp, err := pd.CreateQP(client.QPInitAttr{Type: proto.RC, SendCQ: cq, RecvCQ: cq, Caps: proto.QPCaps{MaxSendWR: 64, MaxRecvWR: 4}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("%d %d %d\n", qp.QPN, mr.RKey, mr.Addr)
	var peerQPN uint32
	var peerRKey uint32
	var peerAddr uint64
	if _, err := fmt.Fscan(os.Stdin, &peerQPN, &peerRKey, &peerAddr); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	gid := addrB.As16()
	for _, s := range []struct {
		a proto.QPAttr
		m proto.QPAttrMask
	}{
		{proto.QPAttr{State: proto.Init, Access: ib.RemoteWrite}, proto.AttrState | proto.AttrPKeyIndex | proto.AttrPort | proto.AttrAccessFlags},
		{proto.QPAttr{State: proto.RTR, PathMTU: 1024, DestQPN: peerQPN, DGID: [16]byte(gid[:])}, proto.AttrState | proto.AttrAV | proto.AttrPathMTU | proto.AttrDestQPN | proto.AttrRQPSN | proto.AttrMaxDestRdAtomc | proto.AttrMinRNRTimer},
		{proto.QPAttr{State: proto.RTS, Timeout: 14, RetryCnt: 7, RNRRetry: 7}, proto.AttrState | proto.AttrTimeout | proto.AttrRetryCnt | proto.AttrRNRRetry | proto.AttrSQPSN | proto.AttrMaxQPRdAtomic},
	} {
		if err := qp.Modify(&s.a, s.m); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	fmt.Println("streaming")
	w := &proto.SendWR{Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: []proto.SGE{mr.SGE(0, 4096)}, RemoteAddr: peerAddr, RKey: peerRKey}
	wcs := make([]ib.WC, 64)
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); {
		qp.PostSend(w)
		cq.Poll(wcs)
	}
	return 1
}

// A client killed in the middle of transfers both ways (it streams RDMA
// WRITEs out while the peer streams RDMA WRITEs into its memory) has its
// resources released; the daemon keeps serving: another client then
// transfers as usual.
func TestClientKilledMidTransfer(t *testing.T) {
	devA, _ := rnic.NewDevice(rnic.Config{MAC: macA, Addrs: []netip.Addr{addrA}, PortMTU: 1024})
	devB, _ := rnic.NewDevice(rnic.Config{MAC: macB, Addrs: []netip.Addr{addrB}, PortMTU: 1024})
	pa, pb := memlink.NewPair(memlink.Config{})
	ctx, cancel := context.WithCancel(context.Background())
	errs := make(chan error, 2)
	go func() { errs <- engine.Run(ctx, devA, pa, engine.Options{}) }()
	go func() { errs <- engine.Run(ctx, devB, pb, engine.Options{}) }()
	t.Cleanup(func() {
		cancel()
		for i := 0; i < 2; i++ {
			if err := <-errs; err != nil {
				t.Errorf("engine.Run: %v", err)
			}
		}
	})
	gone := make(chan daemon.ClientInfo, 4)
	srv, err := daemon.NewServer(daemon.NewVerbsDevice(devA, "mem0", func(netip.Addr) ([6]byte, error) { return macB, nil }),
		daemon.Options{Group: -1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), OnClientGone: func(ci daemon.ClientInfo) { gone <- ci }})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "ctl.sock")
	if err := srv.Listen(path); err != nil {
		t.Fatal(err)
	}
	go srv.Serve()
	t.Cleanup(func() { srv.Close(time.Second) })

	// The peer on device B: its memory for the child's writes, a QP.
	pdB := devB.AllocPD()
	bufB := make([]byte, 1<<20)
	mrB, _ := pdB.RegMR(bufB, ib.LocalWrite|ib.RemoteWrite)
	cqB := devB.CreateCQ(1024)
	qpB, _ := pdB.CreateQP(rnic.QPInitAttr{Type: ib.RC, SendCQ: cqB, RecvCQ: cqB, MaxSendWR: 256})

	exe, _ := os.Executable()
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), "SOFTRNIC_DAEMON_CHILD=1", "SOFTRNIC_CONTROL="+path)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	out := bufio.NewReader(stdout)
	var childQPN, childRKey uint32
	var childAddr uint64
	if _, err := fmt.Fscan(out, &childQPN, &childRKey, &childAddr); err != nil {
		t.Fatal("child:", err)
	}
	ibtest.Modify(qpB, ib.Init, &ib.QPAttr{Access: ib.RemoteWrite})
	ibtest.Modify(qpB, ib.RTR, &ib.QPAttr{PathMTU: 1024, DestQPN: childQPN, AV: ib.AddressVector{DMAC: macA, DGID: ib.GIDFrom(addrA)}})
	ibtest.Modify(qpB, ib.RTS, &ib.QPAttr{Timeout: 16, RetryCnt: 7, RNRRetry: 7})
	fmt.Fprintf(stdin, "%d %d %d\n", qpB.QPN(), mrB.RKey(), mrB.IOVA())
	out.ReadString('\n') // the end of the line Fscan read
	if line, err := out.ReadString('\n'); err != nil || line != "streaming\n" {
		t.Fatalf("child: %q %v", line, err)
	}

	// Stream WRITEs into the child's memory from B, and let the child's
	// own WRITEs flow for a moment; then kill it mid-transfer.
	writes := 0
	w := rnic.SendWR{Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: []ib.SGE{{Addr: mrB.IOVA(), Length: 32768, LKey: mrB.LKey()}}, RemoteAddr: childAddr + 65536, RKey: childRKey}
	wcs := make([]ib.WC, 64)
	ok := 0
	for deadline := time.Now().Add(20 * time.Second); ok < 50; {
		if n, _ := qpB.PostSend(w); n == 1 {
			writes++
		}
		for _, wc := range wcs[:cqB.Poll(wcs)] {
			if wc.Status != ib.Success {
				t.Fatalf("WRITE into the live child: %v", wc.Status)
			}
			ok++
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d WRITEs into the child completed", ok)
		}
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	select {
	case ci := <-gone:
		if ci.QPs != 1 || ci.MRs != 1 {
			t.Fatalf("released %+v", ci)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("daemon did not release the dead client")
	}
	// Writes still in flight to the dead client's QP now fail at the peer
	// (its QP is gone); keep posting a little: the daemon must not crash.
	for start := time.Now(); time.Since(start) < 100*time.Millisecond; {
		qpB.PostSend(w)
		cqB.Poll(wcs)
	}

	// Another client is served as usual.
	c, err := client.Dial(path)
	if err != nil {
		t.Fatal("daemon gone after the client died:", err)
	}
	defer c.Close()
	pd, _ := c.AllocPD()
	mem, _ := client.AllocMem(1 << 16)
	defer mem.Free()
	mr, _ := pd.RegMR(mem, 0, 1<<16, ib.LocalWrite|ib.RemoteWrite)
	cq, _ := c.CreateCQ(16)
	qp, err := pd.CreateQP(client.QPInitAttr{Type: proto.RC, SendCQ: cq, RecvCQ: cq, Caps: proto.QPCaps{MaxSendWR: 4, MaxRecvWR: 4}})
	if err != nil {
		t.Fatal(err)
	}
	qpB2, _ := pdB.CreateQP(rnic.QPInitAttr{Type: ib.RC, SendCQ: cqB, RecvCQ: cqB})
	gid := addrB.As16()
	for _, s := range []struct {
		a proto.QPAttr
		m proto.QPAttrMask
	}{
		{proto.QPAttr{State: proto.Init, Access: ib.RemoteWrite}, proto.AttrState | proto.AttrPKeyIndex | proto.AttrPort | proto.AttrAccessFlags},
		{proto.QPAttr{State: proto.RTR, PathMTU: 1024, DestQPN: qpB2.QPN(), DGID: [16]byte(gid[:])}, proto.AttrState | proto.AttrAV | proto.AttrPathMTU | proto.AttrDestQPN | proto.AttrRQPSN | proto.AttrMaxDestRdAtomc | proto.AttrMinRNRTimer},
		{proto.QPAttr{State: proto.RTS, Timeout: 14, RetryCnt: 7, RNRRetry: 7}, proto.AttrState | proto.AttrTimeout | proto.AttrRetryCnt | proto.AttrRNRRetry | proto.AttrSQPSN | proto.AttrMaxQPRdAtomic},
	} {
		if err := qp.Modify(&s.a, s.m); err != nil {
			t.Fatal(err)
		}
	}
	ibtest.Modify(qpB2, ib.Init, &ib.QPAttr{})
	ibtest.Modify(qpB2, ib.RTR, &ib.QPAttr{PathMTU: 1024, DestQPN: qp.QPN, AV: ib.AddressVector{DMAC: macA, DGID: ib.GIDFrom(addrA)}})
	ibtest.Modify(qpB2, ib.RTS, &ib.QPAttr{Timeout: 14, RetryCnt: 7, RNRRetry: 7})
	copy(bufB[500000:], "after the crash")
	for cqB.Poll(wcs) > 0 {
	}
	qpB2.PostSend(rnic.SendWR{ID: 9, Opcode: ib.RDMAWrite, Flags: ib.Signaled,
		SG: []ib.SGE{{Addr: mrB.IOVA() + 500000, Length: 15, LKey: mrB.LKey()}}, RemoteAddr: mr.Addr, RKey: mr.RKey})
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	for {
		n, err := cqB.Wait(wctx, wcs[:1])
		if err != nil {
			t.Fatal("no completion for the new client's peer")
		}
		if n == 1 && wcs[0].ID == 9 {
			break
		}
	}
	if wcs[0].Status != ib.Success || string(mem.Bytes()[:15]) != "after the crash" {
		t.Fatalf("new client: %v %q", wcs[0].Status, mem.Bytes()[:15])
	}
	t.Logf("%d WRITEs posted into the child, %d completed before the kill", writes, ok)
}

package daemon_test

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/daemon"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/ibtest"
	"github.com/softrnic/softrnic/internal/testlink"
	"github.com/softrnic/softrnic/verbs"
)

// TestMain runs a client process when the test binary is re-executed with
// SOFTRNIC_DAEMON_CHILD or SOFTRNIC_HOSTILE set.
func TestMain(m *testing.M) {
	if os.Getenv("SOFTRNIC_DAEMON_CHILD") != "" {
		os.Exit(streamingChild(os.Getenv("SOFTRNIC_CONTROL")))
	}
	if role := os.Getenv("SOFTRNIC_HOSTILE"); role != "" {
		os.Exit(hostileChild(role, os.Getenv("SOFTRNIC_CONTROL")))
	}
	os.Exit(m.Run())
}

// streamingChild is a client that registers 1 MiB, connects a QP to the
// peer QPN it reads on stdin, prints its QPN, rkey and address, and then
// posts RDMA WRITEs to the peer without end, until it is killed.
func streamingChild(path string) int {
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	c, err := client.Dial(path)
	if err != nil {
		return fail(err)
	}
	pd, _ := c.AllocPD()
	mem, _ := c.AllocMem(1 << 20)
	mr, err := pd.RegMR(mem, 0, 1<<20, 0, ib.LocalWrite|ib.RemoteWrite)
	if err != nil {
		return fail(err)
	}
	cq, _ := c.CreateCQ(256)
	qp, err := pd.CreateQP(&verbs.QPInitAttr{Type: ib.RC, SendCQ: cq, RecvCQ: cq, Cap: ib.QPCaps{MaxSendWR: 64, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		return fail(err)
	}
	fmt.Printf("%d %d %d\n", qp.QPN(), mr.RKey(), mr.IOVA())
	var peerQPN uint32
	var peerRKey uint32
	var peerAddr uint64
	if _, err := fmt.Fscan(os.Stdin, &peerQPN, &peerRKey, &peerAddr); err != nil {
		return fail(err)
	}
	for _, s := range []struct {
		to ib.QPState
		a  ib.QPAttr
	}{
		{ib.Init, ib.QPAttr{Access: ib.RemoteWrite}},
		{ib.RTR, ib.QPAttr{PathMTU: 1024, DestQPN: peerQPN, AV: ib.AddressVector{DGID: gidB}}},
		{ib.RTS, ib.QPAttr{Timeout: 14, RetryCnt: 7, RNRRetry: 7}},
	} {
		if err := ibtest.Modify(qp, s.to, &s.a); err != nil {
			return fail(err)
		}
	}
	fmt.Println("streaming")
	w := []verbs.SendWR{{Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: []ib.SGE{{Addr: mr.IOVA(), Length: 4096, LKey: mr.LKey()}}, RemoteAddr: peerAddr, RKey: peerRKey}}
	wcs := make([]ib.WC, 64)
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); {
		_, _ = qp.PostSend(w) // a full send queue waits for the next polls
		cq.Poll(wcs)
	}
	return 1
}

// A client killed in the middle of transfers both ways (it streams RDMA
// WRITEs out while the peer streams RDMA WRITEs into its memory) has its
// resources released; the daemon keeps serving: another client then
// transfers as usual.
func TestClientKilledMidTransfer(t *testing.T) {
	devA, devB := testlink.Pair(t, 1024)
	gone := make(chan daemon.ClientInfo, 4)
	_, path := serve(t, devA, daemon.Options{OnClientGone: func(ci daemon.ClientInfo) { gone <- ci }})

	// The peer on device B: its memory for the child's writes, a QP.
	b := newApp(t, devB, ib.RC, 1<<20, ib.LocalWrite|ib.RemoteWrite, 1024, ib.QPCaps{MaxSendWR: 256, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1})
	qpB, cqB, bufB := b.qp, b.cq, b.buf()

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
	if err := ibtest.Modify(qpB, ib.Init, &ib.QPAttr{Access: ib.RemoteWrite}); err != nil {
		t.Fatal(err)
	}
	if err := ibtest.Modify(qpB, ib.RTR, &ib.QPAttr{PathMTU: 1024, DestQPN: childQPN, AV: ib.AddressVector{DMAC: macA, DGID: ib.GIDFrom(addrA)}}); err != nil {
		t.Fatal(err)
	}
	if err := ibtest.Modify(qpB, ib.RTS, &ib.QPAttr{Timeout: 16, RetryCnt: 7, RNRRetry: 7}); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(stdin, "%d %d %d\n", qpB.QPN(), b.mr.RKey(), b.mr.IOVA())
	// the end of the line Fscan read
	if _, err := out.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	if line, err := out.ReadString('\n'); err != nil || line != "streaming\n" {
		t.Fatalf("child: %q %v", line, err)
	}

	// Stream WRITEs into the child's memory from B, and let the child's
	// own WRITEs flow for a moment; then kill it mid-transfer.
	writes := 0
	w := []verbs.SendWR{{Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: []ib.SGE{b.sge(0, 32768)}, RemoteAddr: childAddr + 65536, RKey: childRKey}}
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
		// A full send queue waits for the polls.
		if _, err := qpB.PostSend(w); err != nil && !errors.Is(err, verbs.ErrQueueFull) {
			t.Fatal(err)
		}
		cqB.Poll(wcs)
	}

	// Another client is served as usual.
	c, err := client.Dial(path)
	if err != nil {
		t.Fatal("daemon gone after the client died:", err)
	}
	defer c.Close()
	a := newApp(t, c, ib.RC, 1<<16, ib.LocalWrite|ib.RemoteWrite, 16, ib.QPCaps{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1})
	qpB2, err := b.pd.CreateQP(&verbs.QPInitAttr{Type: ib.RC, SendCQ: cqB, RecvCQ: cqB, Cap: ib.QPCaps{MaxSendWR: 4, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	connectRC(t, a.qp, ib.RemoteWrite, qpB2.QPN(), gidB, 0, 0)
	connectRC(t, qpB2, 0, a.qp.QPN(), gidA, 0, 0)
	copy(bufB[500000:], "after the crash")
	for cqB.Poll(wcs) > 0 {
	}
	if _, err := qpB2.PostSend([]verbs.SendWR{{ID: 9, Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: []ib.SGE{b.sge(500000, 15)}, RemoteAddr: a.mr.IOVA(), RKey: a.mr.RKey()}}); err != nil {
		t.Fatal(err)
	}
	var wc ib.WC
	for wc.ID != 9 {
		wc = waitWC(t, cqB)
	}
	if wc.Status != ib.Success || string(a.buf()[:15]) != "after the crash" {
		t.Fatalf("new client: %v %q", wc.Status, a.buf()[:15])
	}
	t.Logf("%d WRITEs posted into the child, %d completed before the kill", writes, ok)
}

package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
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

// daemonPID is the pid of the daemon a `ip netns exec` command runs (ip
// execs it in place).
func daemonTicks(t *testing.T, pid int) uint64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// Fields after the command name (in parentheses, which may hold spaces):
	// utime and stime are the 12th and 13th.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	u, _ := strconv.ParseUint(f[11], 10, 64)
	s, _ := strconv.ParseUint(f[12], 10, 64)
	return u + s
}

// An idle daemon costs nothing: with no client, and with eight clients
// holding connected RC QPs that move nothing, its engine sleeps in its
// port until a frame, a post or a timer needs it. Its CPU time over 10 s
// is measured in clock ticks (1/100 s) and must stay under 2 % of a CPU.
func TestDaemonIdleCostsNothing(t *testing.T) {
	netnstest.SkipUnlessRoot(t)
	bin := buildSoftrnic(t)
	pair := netnstest.NewTestPair(t, netnstest.PairOptions{})
	sock, pid := startDaemonPID(t, bin, pair.A)
	measure := func(what string) {
		time.Sleep(time.Second) // the engine's spin and naps after the last work
		t0 := daemonTicks(t, pid)
		time.Sleep(10 * time.Second)
		ticks := daemonTicks(t, pid) - t0
		t.Logf("daemon %s: %d ticks of CPU in 10 s (%.1f %% of a CPU)", what, ticks, float64(ticks)/10)
		if ticks >= 20 {
			t.Errorf("daemon %s used %d ticks in 10 s, over 2 %% of a CPU", what, ticks)
		}
	}
	measure("with no client")

	devB := startPeer(t, pair.B)
	pdB := rnictest.PD(devB)
	bufB := make([]byte, 4096)
	mrB, _ := pdB.RegBytes(bufB, 0, ib.LocalWrite)
	for i := range 8 {
		c, err := client.Dial(sock)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		pd, _ := c.AllocPD()
		mem, _ := client.AllocMem(4096)
		defer mem.Free()
		mr, err := pd.RegMR(mem, 0, 4096, 0, ib.LocalWrite|ib.RemoteWrite)
		if err != nil {
			t.Fatal(err)
		}
		cq, _ := c.CreateCQ(64)
		qp, err := pd.CreateQP(&verbs.QPInitAttr{Type: ib.RC, SendCQ: cq, RecvCQ: cq, Cap: ib.QPCaps{MaxSendWR: 16, MaxRecvWR: 16}})
		if err != nil {
			t.Fatal(err)
		}
		cqB := rnictest.CQ(devB, 64)
		qpB, _ := rnictest.QP(pdB, rnictest.QPAttr{Type: ib.RC, SendCQ: cqB, RecvCQ: cqB})
		connectDaemonQP(t, qp, qpB, pair)
		// One RDMA WRITE from B proves the connection, then nothing moves.
		if _, err := qpB.PostSend([]verbs.SendWR{{ID: 1, Opcode: ib.RDMAWrite, Flags: ib.Signaled,
			SG: []ib.SGE{{Addr: mrB.IOVA(), Length: 64, LKey: mrB.LKey()}}, RemoteAddr: mr.IOVA(), RKey: mr.RKey()}}); err != nil {
			t.Fatal(err)
		}
		var wcs [1]ib.WC
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		_, err = cqB.PollWait(ctx, wcs[:])
		cancel()
		if err != nil || wcs[0].Status != ib.Success {
			t.Fatalf("client %d: WRITE from B: %v %v", i, err, wcs[0].Status)
		}
	}
	measure("with 8 idle clients holding connected RC QPs")
}

// startDaemonPID is startDaemon returning the daemon's pid too.
func startDaemonPID(t *testing.T, bin string, a netnstest.Link) (string, int) {
	t.Helper()
	sock, _ := startDaemon(t, bin, a)
	out, err := exec.Command("ip", "netns", "pids", a.NS.Name).Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range strings.Fields(string(out)) {
		pid, _ := strconv.Atoi(f)
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil && strings.Contains(string(b), "daemon\x00") &&
			strings.Contains(string(b), sock) {
			return sock, pid
		}
	}
	t.Fatalf("no daemon process in %s", a.NS.Name)
	return "", 0
}

// connectDaemonQP connects the daemon client's RC QP q (on pair.A) and
// the in-process QP qB (on pair.B) to each other.
func connectDaemonQP(t *testing.T, q verbs.QP, qB *rnic.QP, pair *netnstest.Pair) {
	t.Helper()
	connectClientQP(t, q, qB.QPN(), pair.B.Addr)
	var macA [6]byte
	copy(macA[:], pair.A.MAC)
	if err := ibtest.Modify(qB, ib.Init, &ib.QPAttr{Access: ib.RemoteWrite}); err != nil {
		t.Fatal(err)
	}
	if err := ibtest.Modify(qB, ib.RTR, &ib.QPAttr{PathMTU: 1024, DestQPN: q.QPN(), MaxDestRdAtomic: 4, MinRNRTimer: 1,
		AV: ib.AddressVector{DMAC: macA, DGID: ib.GIDFrom(pair.A.Addr)}}); err != nil {
		t.Fatal(err)
	}
	if err := ibtest.Modify(qB, ib.RTS, &ib.QPAttr{Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 4}); err != nil {
		t.Fatal(err)
	}
}

// fataler is what connectClientQP needs of a test (a child process has
// its own).
type fataler interface {
	Helper()
	Fatalf(format string, args ...any)
}

// connectClientQP moves a daemon client's RC QP to RTS towards QP qpn at
// peer.
func connectClientQP(t fataler, q verbs.QP, qpn uint32, peer netip.Addr) {
	t.Helper()
	for _, s := range []struct {
		a ib.QPAttr
		m ib.QPAttrMask
	}{
		{ib.QPAttr{State: ib.Init, Port: 1, Access: ib.RemoteWrite}, ib.AttrState | ib.AttrPKeyIndex | ib.AttrPort | ib.AttrAccessFlags},
		{ib.QPAttr{State: ib.RTR, PathMTU: 1024, DestQPN: qpn, AV: ib.AddressVector{DGID: ib.GIDFrom(peer)}, MaxDestRdAtomic: 4, MinRNRTimer: 1},
			ib.AttrState | ib.AttrAV | ib.AttrPathMTU | ib.AttrDestQPN | ib.AttrMaxDestRdAtomic | ib.AttrRQPSN | ib.AttrMinRNRTimer},
		{ib.QPAttr{State: ib.RTS, Timeout: 14, RetryCnt: 7, RNRRetry: 7}, ib.AttrState | ib.AttrTimeout | ib.AttrRetryCnt | ib.AttrRNRRetry | ib.AttrSQPSN | ib.AttrMaxQPRdAtomic},
	} {
		if err := q.Modify(&s.a, s.m); err != nil {
			t.Fatalf("QP %#x to %v: %v", q.QPN(), s.a.State, err)
		}
	}
}

// The streaming client of TestManyClients, a child process: it connects
// its 4 QPs to the peer's, streams 4 KiB SENDs on all of them until told
// the duration is over, and prints how many completed on each.
const (
	streamChildEnv = "SOFTRNIC_TEST_STREAM_CHILD" // the control socket
	streamPeerEnv  = "SOFTRNIC_TEST_STREAM_PEER"  // GID address, then the 4 QPNs, comma-separated
	streamQPs      = 4
	streamSize     = 4096
	streamDepth    = 16 // SENDs outstanding per QP
)

// streamT is a child's fataler: it panics, and the child exits 1.
type streamT struct{}

func (streamT) Helper()                           {}
func (streamT) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }

func streamChild(sock string) int {
	defer func() {
		if r := recover(); r != nil {
			fmt.Fprintln(os.Stderr, "stream child:", r)
			os.Exit(1)
		}
	}()
	peer := strings.Split(os.Getenv(streamPeerEnv), ",")
	addr := netip.MustParseAddr(peer[0])
	c, err := client.Dial(sock)
	if err != nil {
		panic(err)
	}
	defer c.Close()
	pd, _ := c.AllocPD()
	mem, _ := client.AllocMem(streamSize)
	mr, err := pd.RegMR(mem, 0, streamSize, 0, ib.LocalWrite)
	if err != nil {
		panic(err)
	}
	var qps [streamQPs]verbs.QP
	var cqs [streamQPs]verbs.CQ
	var qpns []string
	for i := range qps {
		if cqs[i], err = c.CreateCQ(2 * streamDepth); err != nil {
			panic(err)
		}
		if qps[i], err = pd.CreateQP(&verbs.QPInitAttr{Type: ib.RC, SendCQ: cqs[i], RecvCQ: cqs[i],
			Cap: ib.QPCaps{MaxSendWR: streamDepth, MaxRecvWR: 1}}); err != nil {
			panic(err)
		}
		qpns = append(qpns, strconv.Itoa(int(qps[i].QPN())))
	}
	fmt.Println("qpns " + strings.Join(qpns, ","))
	in := bufio.NewScanner(os.Stdin)
	if !in.Scan() || in.Text() != "go" {
		return 1
	}
	for i, q := range qps {
		n, _ := strconv.Atoi(peer[1+i])
		connectClientQP(streamT{}, q, uint32(n), addr)
	}
	stop := make(chan struct{})
	go func() { in.Scan(); close(stop) }() // "stop", or the parent gone
	var done, out [streamQPs]int
	ws := []verbs.SendWR{{Opcode: ib.Send, Flags: ib.Signaled, SG: []ib.SGE{{Addr: mr.IOVA(), Length: streamSize, LKey: mr.LKey()}}}}
	var wcs [streamDepth]ib.WC
	start := time.Now()
	for running := true; running; {
		select {
		case <-stop:
			running = false
		default:
		}
		moved := false
		for i, q := range qps {
			for out[i] < streamDepth {
				if n, err := q.PostSend(ws); err != nil || n != 1 {
					panic(fmt.Sprintf("post: %v", err))
				}
				out[i]++
			}
			n := cqs[i].Poll(wcs[:])
			for _, w := range wcs[:n] {
				if w.Status != ib.Success {
					panic(fmt.Sprintf("QP %d: %v", i, w.Status))
				}
			}
			done[i] += n
			out[i] -= n
			moved = moved || n > 0
		}
		if !moved {
			c.Poll()
		}
	}
	s := make([]string, streamQPs)
	for i := range done {
		s[i] = strconv.Itoa(done[i])
	}
	fmt.Printf("done %s %.3f\n", strings.Join(s, ","), time.Since(start).Seconds())
	return 0
}

// Many clients share the daemon fairly: 16 client processes with 4 RC QPs
// each stream 4 KiB SENDs through one daemon to a peer in the other
// namespace for 3 s, and every QP progresses, the slowest at least half
// the mean; also with two `yes` hogs taking CPU. The aggregate rate is
// reported.
func TestManyClients(t *testing.T) {
	netnstest.SkipUnlessRoot(t)
	bin := buildSoftrnic(t)
	for _, hogs := range []int{0, 2} {
		t.Run(fmt.Sprintf("hogs=%d", hogs), func(t *testing.T) {
			pair := netnstest.NewTestPair(t, netnstest.PairOptions{})
			sock, _ := startDaemon(t, bin, pair.A)
			for range hogs {
				hog := exec.Command("yes")
				if err := hog.Start(); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { hog.Process.Kill(); hog.Wait() })
			}
			manyClients(t, sock, pair)
		})
	}
}

func manyClients(t *testing.T, sock string, pair *netnstest.Pair) {
	const clients, streamFor = 16, 3 * time.Second
	devB := startPeerQueues(t, pair.B)
	pdB := rnictest.PD(devB)
	bufB := make([]byte, streamSize)
	mrB, _ := pdB.RegBytes(bufB, 0, ib.LocalWrite)
	cqB := rnictest.CQ(devB, 1<<16)
	const recvs = 64
	qpsB := make(map[uint32]*rnic.QP)
	var order []*rnic.QP
	for range clients * streamQPs {
		q, err := rnictest.QP(pdB, rnictest.QPAttr{Type: ib.RC, SendCQ: cqB, RecvCQ: cqB, MaxRecvWR: recvs})
		if err != nil {
			t.Fatal(err)
		}
		qpsB[q.QPN()] = q
		order = append(order, q)
	}
	recv := []verbs.RecvWR{{SG: []ib.SGE{{Addr: mrB.IOVA(), Length: streamSize, LKey: mrB.LKey()}}}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // every receive consumed is posted again
		defer wg.Done()
		wcs := make([]ib.WC, 256)
		for {
			n, err := cqB.PollWait(ctx, wcs)
			if err != nil {
				return
			}
			for _, w := range wcs[:n] {
				if q := qpsB[w.QPN]; q != nil && w.IsRecv {
					if _, err := q.PostRecv(recv); err != nil {
						t.Error(err)
						return
					}
				}
			}
		}
	}()
	defer wg.Wait()
	defer cancel()

	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	type child struct {
		cmd *exec.Cmd
		in  io.WriteCloser
		out *bufio.Scanner
	}
	kids := make([]child, clients)
	for i := range kids {
		peer := []string{pair.B.Addr.String()}
		for _, q := range order[i*streamQPs : (i+1)*streamQPs] {
			peer = append(peer, strconv.Itoa(int(q.QPN())))
		}
		cmd := exec.Command(exe, "-test.run=^$")
		cmd.Env = append(os.Environ(), streamChildEnv+"="+sock, streamPeerEnv+"="+strings.Join(peer, ","))
		cmd.Stderr = os.Stderr
		in, _ := cmd.StdinPipe()
		out, _ := cmd.StdoutPipe()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		kids[i] = child{cmd, in, bufio.NewScanner(out)}
	}
	var macA [6]byte
	copy(macA[:], pair.A.MAC)
	for i, k := range kids {
		if !k.out.Scan() || !strings.HasPrefix(k.out.Text(), "qpns ") {
			t.Fatalf("client %d: %q", i, k.out.Text())
		}
		for j, f := range strings.Split(strings.TrimPrefix(k.out.Text(), "qpns "), ",") {
			n, _ := strconv.Atoi(f)
			qB := order[i*streamQPs+j]
			if err := ibtest.Modify(qB, ib.Init, &ib.QPAttr{}); err != nil {
				t.Fatal(err)
			}
			for range recvs {
				if _, err := qB.PostRecv(recv); err != nil {
					t.Fatal(err)
				}
			}
			if err := ibtest.Modify(qB, ib.RTR, &ib.QPAttr{PathMTU: 1024, DestQPN: uint32(n), MinRNRTimer: 1,
				AV: ib.AddressVector{DMAC: macA, DGID: ib.GIDFrom(pair.A.Addr)}}); err != nil {
				t.Fatal(err)
			}
			if err := ibtest.Modify(qB, ib.RTS, &ib.QPAttr{Timeout: 14, RetryCnt: 7, RNRRetry: 7}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, k := range kids {
		if _, err := io.WriteString(k.in, "go\n"); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(streamFor)
	for _, k := range kids {
		if _, err := io.WriteString(k.in, "stop\n"); err != nil {
			t.Fatal(err)
		}
	}
	var counts []float64
	var total, secs float64
	for i, k := range kids {
		if !k.out.Scan() {
			t.Fatalf("client %d gave no result (%v)", i, k.out.Err())
		}
		var list string
		var s float64
		if _, err := fmt.Sscanf(k.out.Text(), "done %s %f", &list, &s); err != nil {
			t.Fatalf("client %d: %q", i, k.out.Text())
		}
		for _, f := range strings.Split(list, ",") {
			n, _ := strconv.Atoi(f)
			counts = append(counts, float64(n))
			total += float64(n)
		}
		secs = max(secs, s)
		if err := k.cmd.Wait(); err != nil {
			t.Fatalf("client %d: %v", i, err)
		}
	}
	mean := total / float64(len(counts))
	slowest := slices.Min(counts)
	t.Logf("%d clients × %d QPs, 4 KiB SENDs for %.1f s: %.0f messages, %.3f Gbit/s in all; per QP mean %.0f, slowest %.0f (%.2f of the mean), fastest %.0f",
		clients, streamQPs, secs, total, total*streamSize*8/secs/1e9, mean, slowest, slowest/mean, slices.Max(counts))
	if slowest < mean/2 || slowest == 0 {
		t.Errorf("a QP starved: slowest %.0f messages, mean %.0f", slowest, mean)
	}
}

// One RNIC per interface: while a daemon serves an interface, a tool asked
// to run its own RNIC there is refused at once, told to use the daemon;
// and a daemon refuses an interface a tool holds.
func TestOneOwnerPerInterface(t *testing.T) {
	netnstest.SkipUnlessRoot(t)
	bin := buildSoftrnic(t)
	pair := netnstest.NewTestPair(t, netnstest.PairOptions{})
	sock, _ := startDaemon(t, bin, pair.A)
	for _, args := range [][]string{
		{"perf", "send_bw", "-d", pair.A.Name},
		{"rping", "-s", "-d", pair.A.Name},
		{"pingpong", "rc", "-d", pair.A.Name},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		out, err := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", pair.A.NS.Name, bin}, args...)...).CombinedOutput()
		timedOut := ctx.Err() != nil
		cancel()
		if err == nil || timedOut || !strings.Contains(string(out), "served by the softrnic daemon") ||
			!strings.Contains(string(out), "--daemon "+sock) {
			t.Errorf("softrnic %s beside the daemon: %v\n%s", strings.Join(args, " "), err, out)
		}
	}

	// A perf server holds B (it waits for its client); a daemon there is
	// refused, naming it.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv := exec.CommandContext(ctx, "ip", "netns", "exec", pair.B.NS.Name, bin, "perf", "send_bw", "-d", pair.B.Name)
	srv.Env = append(os.Environ(), "SOFTRNIC_PORT=afxdp")
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { srv.Process.Kill(); srv.Wait() }()
	held := fmt.Sprintf("pid=%d\nname=softrnic perf\n", srv.Process.Pid) // ip execs perf in place
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		claims, _ := filepath.Glob(filepath.Join(host.OwnerDir, "*-"+pair.B.Name))
		found := false
		for _, c := range claims {
			b, _ := os.ReadFile(c)
			found = found || strings.HasPrefix(string(b), held)
		}
		if found {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the perf server never claimed %s", pair.B.Name)
		}
	}
	dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
	defer dcancel()
	out, err := exec.CommandContext(dctx, "ip", "netns", "exec", pair.B.NS.Name, bin, "daemon", "-d", pair.B.Name,
		"--control", filepath.Join(t.TempDir(), "b.sock")).CombinedOutput()
	if err == nil || dctx.Err() != nil || !strings.Contains(string(out), fmt.Sprintf("%s is in use by softrnic perf (pid %d)", pair.B.Name, srv.Process.Pid)) {
		t.Fatalf("daemon beside a perf server: %v\n%s", err, out)
	}
}

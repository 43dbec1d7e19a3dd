package main

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
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

// TestDaemonTwoQueues: the daemon with queues = 2 on a two-queue veth end
// serves RDMA WRITE and READ from a peer in another namespace on 16 QPs.
// The peer is another softrnic on both queues of its end, which transmits
// each QP (one UDP source port each) on the queue its source port hashes
// to; on veth that is the daemon's receive queue, so the 16 QPs reach both: both must have had RoCEv2
// redirected to their AF_XDP socket (veth's per-queue XDP counters), none
// may have been left to the kernel, every byte is checked, softrnic status
// shows the two queues and softrnic stats each queue's frames.
func TestDaemonTwoQueues(t *testing.T) {
	netnstest.SkipUnlessRoot(t)
	if _, err := exec.LookPath("ethtool"); err != nil {
		t.Skip("needs ethtool for veth's per-queue counters")
	}
	bin := buildSoftrnic(t)
	pair := netnstest.NewTestPair(t, netnstest.PairOptions{Queues: 2})
	sock := filepath.Join(t.TempDir(), "ctl.sock")
	var logs bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", pair.A.NS.Name, bin, "daemon", "-d", pair.A.Name,
		"--control", sock, "--port", "afxdp", "--queues", "2", "--log-level", "debug")
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
	if st, err := c.Status(); err != nil || st.Port.Queues != 2 {
		t.Fatalf("status: %d queues, %v; want 2", st.Port.Queues, err)
	}
	out, err := exec.CommandContext(ctx, bin, "status", "--control", sock).CombinedOutput()
	if err != nil || !regexp.MustCompile(`(?m)^queues +2$`).Match(out) {
		t.Fatalf("softrnic status: %v\n%s", err, out)
	}

	devB := startPeerQueues(t, pair.B)
	const qps, size = 16, 4096
	pd, _ := c.AllocPD()
	mem, _ := client.AllocMem(2 * qps * size)
	defer mem.Free()
	mr, err := pd.RegMR(mem, 0, 2*qps*size, 0, ib.LocalWrite|ib.RemoteWrite|ib.RemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	cq, _ := c.CreateCQ(64)
	pdB := rnictest.PD(devB)
	bufB := make([]byte, 2*qps*size)
	mrB, _ := pdB.RegBytes(bufB, 0, ib.LocalWrite)
	cqB := rnictest.CQ(devB, 4*qps)
	gidB := pair.B.Addr.As16()
	var macA [6]byte
	copy(macA[:], pair.A.MAC)
	var peers []*rnic.QP
	for i := 0; i < qps; i++ {
		qp, err := pd.CreateQP(&verbs.QPInitAttr{Type: ib.RC, SendCQ: cq, RecvCQ: cq, Cap: ib.QPCaps{MaxSendWR: 4, MaxRecvWR: 4}})
		if err != nil {
			t.Fatal(err)
		}
		qpB, err := rnictest.QP(pdB, rnictest.QPAttr{Type: ib.RC, SendCQ: cqB, RecvCQ: cqB})
		if err != nil {
			t.Fatal(err)
		}
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
		if err := ibtest.Modify(qpB, ib.Init, &ib.QPAttr{}); err != nil {
			t.Fatal(err)
		}
		if err := ibtest.Modify(qpB, ib.RTR, &ib.QPAttr{PathMTU: 1024, DestQPN: qp.QPN(), MaxDestRdAtomic: 4, AV: ib.AddressVector{DMAC: macA, DGID: ib.GIDFrom(pair.A.Addr)}}); err != nil {
			t.Fatal(err)
		}
		if err := ibtest.Modify(qpB, ib.RTS, &ib.QPAttr{Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 4}); err != nil {
			t.Fatal(err)
		}
		peers = append(peers, qpB)
	}
	// Peer QP i WRITEs its slot of bufB into the client's slot i and READs
	// the client's slot qps+i into bufB's.
	for i := range bufB[:qps*size] {
		bufB[i] = byte(i*13 + i>>10 + 1)
	}
	cm := mem.Bytes()
	for i := range cm[qps*size:] {
		cm[qps*size+i] = byte(i*5 + 7)
	}
	for i, q := range peers {
		w, r := uint64(i*size), uint64((qps+i)*size)
		if _, err := q.PostSend([]verbs.SendWR{{ID: uint64(i), Opcode: ib.RDMAWrite, Flags: ib.Signaled,
			SG: []ib.SGE{{Addr: mrB.IOVA() + w, Length: size, LKey: mrB.LKey()}}, RemoteAddr: mr.IOVA() + w, RKey: mr.RKey()}}); err != nil {
			t.Fatal(err)
		}
		if _, err := q.PostSend([]verbs.SendWR{{ID: uint64(100 + i), Opcode: ib.RDMARead, Flags: ib.Signaled,
			SG: []ib.SGE{{Addr: mrB.IOVA() + r, Length: size, LKey: mrB.LKey()}}, RemoteAddr: mr.IOVA() + r, RKey: mr.RKey()}}); err != nil {
			t.Fatal(err)
		}
	}
	wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer wcancel()
	var wcs [2 * qps]ib.WC
	for got := 0; got < 2*qps; {
		k, err := cqB.PollWait(wctx, wcs[got:])
		if err != nil {
			t.Fatalf("%d of %d completions at the peer: %v", got, 2*qps, err)
		}
		for _, w := range wcs[got : got+k] {
			if w.Status != ib.Success {
				t.Fatalf("peer completion %+v", w)
			}
		}
		got += k
	}
	if !bytes.Equal(cm[:qps*size], bufB[:qps*size]) {
		t.Error("client memory does not hold what the peer wrote")
	}
	if !bytes.Equal(bufB[qps*size:], cm[qps*size:]) {
		t.Error("the peer read something else than the client's memory")
	}

	// Both receive queues had RoCEv2 redirected to their socket.
	ethS, err := exec.CommandContext(ctx, "ip", "netns", "exec", pair.A.NS.Name, "ethtool", "-S", pair.A.Name).CombinedOutput()
	if err != nil {
		t.Fatalf("ethtool -S: %v\n%s", err, ethS)
	}
	stats := string(ethS)
	for q := 0; q < 2; q++ {
		n, err := ethtoolStat(stats, fmt.Sprintf("rx_queue_%d_xdp_redirect", q))
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("receive queue %d: %d frames redirected to AF_XDP", q, n)
		if n == 0 {
			t.Errorf("receive queue %d had no RoCEv2 redirected: the QPs did not spread, or its socket is missing", q)
		}
	}
	out, err = exec.CommandContext(ctx, bin, "stats", "--control", sock).CombinedOutput()
	if err != nil {
		t.Fatalf("softrnic stats: %v\n%s", err, out)
	}
	if n, err := ethtoolStat(string(out), "xdp_unbound"); err != nil || n != 0 {
		t.Errorf("xdp_unbound %d, %v: RoCEv2 left to the kernel\n%s", n, err, out)
	}
	// softrnic stats details both queues, each with its share of the
	// frames.
	for q := 0; q < 2; q++ {
		m := regexp.MustCompile(fmt.Sprintf(`(?m)^link %s/1 queue %d rx_packets (\d+) xsk_rx_ring_full 0$`, pair.A.Name, q)).FindSubmatch(out)
		if m == nil || string(m[1]) == "0" {
			t.Errorf("softrnic stats: no traffic shown on queue %d\n%s", q, out)
		}
	}
}

// ethtoolStat reads "name: value" (ethtool -S) or "name value" (softrnic
// stats) from text.
func ethtoolStat(text, name string) (uint64, error) {
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(strings.ReplaceAll(line, ":", " "))
		for i := 0; i+1 < len(f); i++ {
			if f[i] == name {
				return strconv.ParseUint(f[i+1], 10, 64)
			}
		}
	}
	return 0, fmt.Errorf("no %s in:\n%s", name, text)
}

// startPeerQueues is startPeer on an AF_XDP port over all the link's
// queues. (A kernel AF_PACKET sender picks the transmit queue of the CPU
// it runs on, so it would not spread QPs over queues.)
func startPeerQueues(t *testing.T, b netnstest.Link) *rnic.Device {
	t.Helper()
	var h *host.Host
	if err := b.NS.Do(func() (err error) {
		h, err = host.Open(host.Config{Interface: b.Name, GIDs: []netip.Addr{b.Addr}, MTU: 1024, Port: host.AFXDP, NoCM: true})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h.Device
}

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/icrc"
	"github.com/softrnic/softrnic/internal/ibtest"
	"github.com/softrnic/softrnic/internal/netnstest"
	"github.com/softrnic/softrnic/internal/rnictest"
	"github.com/softrnic/softrnic/verbs"
)

// The user-facing tools against a live daemon on a veth in a namespace: a
// peer in another namespace WRITEs into a client's memory while
// "softrnic capture -c 20" records; then "softrnic stats" (text, --qp
// --json), "softrnic status" and a scrape of --metrics report what
// happened, and the capture holds 20 RoCEv2 frames with valid ICRCs.
func TestToolsAgainstDaemon(t *testing.T) {
	netnstest.SkipUnlessRoot(t)
	bin := buildSoftrnic(t)
	for _, kind := range []string{"afxdp", "afpacket"} {
		t.Run(kind, func(t *testing.T) { toolsAgainstDaemon(t, bin, kind) })
	}
}

func toolsAgainstDaemon(t *testing.T, bin, kind string) {
	pair := netnstest.NewTestPair(t, netnstest.PairOptions{})
	dir := t.TempDir()
	sock := filepath.Join(dir, "ctl.sock")
	var logs syncBuffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", pair.A.NS.Name, bin, "daemon", "-d", pair.A.Name,
		"--control", sock, "--port", kind, "--metrics", "127.0.0.1:0")
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
	tool := func(args ...string) string {
		t.Helper()
		var out, errb bytes.Buffer
		cctx, ccancel := context.WithTimeout(ctx, 30*time.Second)
		defer ccancel()
		cmd := exec.CommandContext(cctx, bin, args...)
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			t.Fatalf("softrnic %s: %v\n%s%s", strings.Join(args, " "), err, out.String(), errb.String())
		}
		return out.String()
	}

	// The capture runs before the traffic starts: it says so on stderr.
	pcapFile := filepath.Join(dir, "roce.pcap")
	capErr, capDone := startCapture(t, ctx, bin, "capture", "-w", pcapFile, "-c", "20", "--control", sock)

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
	// Both devices number QPs from 17: a QP made first on B gives the peer
	// a QPN unlike the client's, so that frames to each can be told apart.
	if _, err := rnictest.QP(pdB, rnictest.QPAttr{Type: ib.RC, SendCQ: cqB, RecvCQ: cqB}); err != nil {
		t.Fatal(err)
	}
	qpB, _ := rnictest.QP(pdB, rnictest.QPAttr{Type: ib.RC, SendCQ: cqB, RecvCQ: cqB})
	if qpB.QPN() == qp.QPN() {
		t.Fatalf("peer and client QPs both %d", qp.QPN())
	}
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

	// Three 8 KiB RDMA WRITEs from namespace B: 24 request packets at MTU
	// 1024, and the daemon's ACKs, more than the capture's 20 frames.
	const writes, size = 3, 8192
	for i := range bufB[:size] {
		bufB[i] = byte(i*7 + 3)
	}
	write := func(w int) {
		t.Helper()
		if _, err := qpB.PostSend([]verbs.SendWR{{ID: uint64(w), Opcode: ib.RDMAWrite, Flags: ib.Signaled,
			SG: []ib.SGE{{Addr: mrB.IOVA(), Length: size, LKey: mrB.LKey()}}, RemoteAddr: mr.IOVA() + uint64(w)*size, RKey: mr.RKey()}}); err != nil {
			t.Fatal(err)
		}
		var wcs [1]ib.WC
		wctx, wcancel := context.WithTimeout(ctx, 15*time.Second)
		_, err := cqB.PollWait(wctx, wcs[:])
		wcancel()
		if err != nil || wcs[0].Status != ib.Success {
			t.Fatalf("WRITE %d: %v %v", w, err, wcs[0].Status)
		}
		if !bytes.Equal(mem.Bytes()[w*size:(w+1)*size], bufB[:size]) {
			t.Fatalf("WRITE %d: data not in the client's memory", w)
		}
	}
	for w := 0; w < writes; w++ {
		write(w)
	}
	select {
	case err := <-capDone:
		capDone <- err
		if err != nil {
			t.Fatalf("capture: %v\n%s", err, capErr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("capture -c 20 did not end: %s", capErr.String())
	}
	if !strings.Contains(capErr.String(), "20 frames written, 0 dropped") {
		t.Errorf("capture said: %s", capErr.String())
	}
	t.Logf("softrnic capture: %s", capErr.String())
	checkCapture(t, pcapFile, 20, qp.QPN(), qpB.QPN())

	// The daemon's responder may see duplicates only of requests the peer
	// retransmitted: on a loaded host the peer's adaptive ACK timer can
	// expire before the daemon's ACK comes, which is recovery, not a fault.
	retransB := func() uint64 { return devB.RecoveryCounters([]uint32{qpB.QPN()}).RetransPackets }
	dupsAllowed := retransB()
	if dupsAllowed > 0 {
		t.Logf("the peer retransmitted %d packets: as many duplicates are allowed", dupsAllowed)
	}

	// softrnic stats: the device line and the client QP's line.
	out := tool("stats", "--control", sock)
	t.Logf("softrnic stats:\n%s", out)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	dev := statsFields(t, lines[0], "link "+pair.A.Name+"/1 ")
	reqs := uint64(writes * size / 1024)
	if dev["rx_packets"] < reqs || dev["tx_packets"] < writes || dev["rx_bytes"] < reqs*1024 || dev["tx_bytes"] == 0 ||
		dev["rx_icrc_encapsulated"] != 0 || dev["duplicate_request"] > dupsAllowed {
		t.Errorf("device counters after %d WRITE packets:\n%s", reqs, lines[0])
	}
	_, haveXSK := dev["xsk_rx_ring_full"]
	switch {
	case kind == "afxdp" && (!haveXSK || dev["xdp_steered"] < dev["rx_packets"]):
		t.Errorf("AF_XDP port: XDP program and ring statistics missing or short:\n%s", lines[0])
	case kind == "afpacket" && (haveXSK || strings.Contains(lines[0], "xdp_")):
		t.Errorf("AF_PACKET port reports XDP counters:\n%s", lines[0])
	}
	qpLine := fmt.Sprintf("link %s/1 lqpn %d type RC state RTS ", pair.A.Name, qp.QPN())
	found := false
	for _, l := range lines[1:] {
		if strings.HasPrefix(l, qpLine) {
			found = true
			if f := statsFields(t, l, qpLine); f["duplicate_request"] > dupsAllowed || f["out_of_buffer"] != 0 {
				t.Errorf("client QP counters: %s", l)
			}
		}
	}
	if !found {
		t.Errorf("no line for the client's QP %d:\n%s", qp.QPN(), out)
	}
	// --qp N --json: that QP only.
	out = tool("stats", "--control", sock, "--qp", strconv.Itoa(int(qp.QPN())), "--json")
	var js statsJSON
	if err := json.Unmarshal([]byte(out), &js); err != nil || len(js.QPs) != 1 || js.QPs[0].LQPN != qp.QPN() ||
		js.QPs[0].Type != "RC" || js.Counters != nil || len(js.NotCounted) == 0 {
		t.Errorf("stats --qp --json: %v\n%s", err, out)
	}

	// softrnic status: AF_XDP, its attach mode (copy: veth has no
	// zero-copy), the QP and this process among the clients.
	out = tool("status", "--control", sock)
	t.Logf("softrnic status:\n%s", out)
	for _, re := range []string{
		`(?m)^device     ` + pair.A.Name + `  node_guid [0-9a-f]{16}  port 1 ACTIVE  mtu 1024$`,
		`(?m)^gid 0      ` + regexp.QuoteMeta(pair.A.Addr.String()) + `$`,
		portLine(kind),
		`(?m)^queues     1$`,
		// The client's QP and the GSI QP (QP1) of the daemon's rdma_cm
		// agent, which runs from the daemon's start.
		`(?m)^qps        2$`,
		`(?m)^  qpn 1  UD  RTS$`,
		fmt.Sprintf(`(?m)^  qpn %d  RC  RTS$`, qp.QPN()),
		fmt.Sprintf(`(?m)^  client \d+  pid %d uid 0 gid 0  qps 1 cqs 1 mrs 1 pds 1$`, os.Getpid()),
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("status lacks %s:\n%s", re, out)
		}
	}

	// /metrics, scraped from inside the daemon's namespace.
	m := regexp.MustCompile(`serving Prometheus metrics.*addr=(127\.0\.0\.1:\d+)`).FindStringSubmatch(logs.String())
	if m == nil {
		t.Fatalf("no metrics address in the log")
	}
	var body string
	if err := pair.A.NS.Do(func() error {
		conn, err := net.DialTimeout("tcp", m[1], 5*time.Second)
		if err != nil {
			return err
		}
		defer conn.Close()
		if err := conn.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "GET /metrics HTTP/1.0\r\nHost: %s\r\n\r\n", m[1])
		b, err := io.ReadAll(conn)
		body = string(b)
		return err
	}); err != nil {
		t.Fatalf("scrape: %v", err)
	}
	rx := regexp.MustCompile(`(?m)^softrnic_rx_packets_total\{device="` + pair.A.Name + `"\} (\d+)$`).FindStringSubmatch(body)
	if rx == nil {
		t.Fatalf("scrape lacks rx_packets:\n%.2000s", body)
	}
	if n, _ := strconv.ParseUint(rx[1], 10, 64); n < dev["rx_packets"] {
		t.Errorf("scraped rx_packets %d, below the %d stats printed earlier", n, dev["rx_packets"])
	}
	dup := regexp.MustCompile(fmt.Sprintf(`(?m)^softrnic_qp_duplicate_request_total\{device="%s",qpn="%d",type="RC"\} (\d+)$`,
		pair.A.Name, qp.QPN())).FindStringSubmatch(body)
	if dup == nil {
		t.Errorf("scrape lacks the QP's duplicate_request")
	} else if n, _ := strconv.ParseUint(dup[1], 10, 64); n > retransB() {
		t.Errorf("scraped duplicate_request %d, above the %d packets the peer retransmitted", n, retransB())
	}

	// capture --qp N --pcapng during two more WRITEs: only frames addressed
	// to the client's QP, the 16 requests, none of the ACKs to the peer
	// (without the filter the first WRITE's ACK would be the 9th frame).
	ngFile := filepath.Join(dir, "qp.pcapng")
	ngErr, ngDone := startCapture(t, ctx, bin, "capture", "-w", ngFile, "-c", "16", "--qp", strconv.Itoa(int(qp.QPN())), "--pcapng", "--control", sock)
	write(writes)
	write(writes + 1)
	select {
	case err := <-ngDone:
		ngDone <- err
		if err != nil || !strings.Contains(ngErr.String(), "16 frames written") {
			t.Fatalf("capture --qp: %v\n%s", err, ngErr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("capture --qp -c 16 did not end: %s", ngErr.String())
	}
	checkCapture(t, ngFile, 16, qp.QPN(), qp.QPN())
}

// portLine is the pattern of status's port line: veth has no AF_XDP
// zero-copy, so copy mode.
func portLine(kind string) string {
	if kind == "afxdp" {
		return `(?m)^port       afxdp  XDP (driver|generic) mode  copy$`
	}
	return `(?m)^port       ` + kind + `$`
}

// startCapture runs softrnic with args (a capture) until it says it is
// writing; its stderr and exit come back.
func startCapture(t *testing.T, ctx context.Context, bin string, args ...string) (*syncBuffer, chan error) {
	t.Helper()
	capErr := &syncBuffer{}
	capCmd := exec.CommandContext(ctx, bin, args...)
	capCmd.Stderr = capErr
	if err := capCmd.Start(); err != nil {
		t.Fatal(err)
	}
	capDone := make(chan error, 1)
	go func() { capDone <- capCmd.Wait() }()
	t.Cleanup(func() {
		capCmd.Process.Kill()
		err := <-capDone
		capDone <- err
	})
	for deadline := time.Now().Add(20 * time.Second); !strings.Contains(capErr.String(), "writing"); {
		if time.Now().After(deadline) {
			t.Fatalf("capture never started: %s", capErr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return capErr, capDone
}

// statsFields parses "name value ..." after prefix.
func statsFields(t *testing.T, line, prefix string) map[string]uint64 {
	t.Helper()
	rest, ok := strings.CutPrefix(line, prefix)
	if !ok {
		t.Fatalf("line does not start with %q: %s", prefix, line)
	}
	f := strings.Fields(rest)
	if len(f)%2 != 0 {
		t.Fatalf("odd fields: %s", line)
	}
	m := map[string]uint64{}
	for i := 0; i < len(f); i += 2 {
		v, err := strconv.ParseUint(f[i+1], 10, 64)
		if err != nil {
			t.Fatalf("%s: %v", f[i], err)
		}
		m[f[i]] = v
	}
	return m
}

// checkCapture opens the pcap (or pcapng) with gopacket: n Ethernet frames,
// each a RoCEv2 packet with a valid ICRC to qpA or qpB, and to both (pass
// the same QPN twice for a capture filtered to one QP).
func checkCapture(t *testing.T, name string, n int, qpA, qpB uint32) {
	t.Helper()
	f, err := os.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var r interface {
		ReadPacketData() ([]byte, gopacket.CaptureInfo, error)
		LinkType() layers.LinkType
	}
	if strings.HasSuffix(name, ".pcapng") {
		r, err = pcapgo.NewNgReader(bufio.NewReader(f), pcapgo.DefaultNgReaderOptions)
	} else {
		r, err = pcapgo.NewReader(bufio.NewReader(f))
	}
	if err != nil {
		t.Fatal(err)
	}
	if r.LinkType() != layers.LinkTypeEthernet {
		t.Fatalf("link type %v", r.LinkType())
	}
	got := 0
	to := map[uint32]int{}
	for {
		data, _, err := r.ReadPacketData()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got++
		if len(data) < 14+20+8+bth.BTHLen+icrc.Len || data[12] != 0x08 || data[13] != 0x00 {
			t.Fatalf("frame %d: not IPv4 RoCEv2 (%d bytes)", got, len(data))
		}
		if !icrc.Verify(data[14:]) {
			t.Errorf("frame %d: bad ICRC", got)
		}
		if port := int(data[14+20+2])<<8 | int(data[14+20+3]); port != 4791 {
			t.Errorf("frame %d: UDP port %d", got, port)
		}
		b := bth.BTH(data[14+20+8:])
		dq := b.DestQP()
		if dq != qpA && dq != qpB {
			t.Errorf("frame %d: destination QP %d, neither %d nor %d", got, dq, qpA, qpB)
		}
		to[dq]++
	}
	if got != n {
		t.Fatalf("capture holds %d frames, want %d", got, n)
	}
	if to[qpA] == 0 || to[qpB] == 0 {
		t.Errorf("frames to QP %d: %d, to QP %d: %d; want both directions", qpA, to[qpA], qpB, to[qpB])
	}
}

// syncBuffer is a bytes.Buffer a child process writes while the test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

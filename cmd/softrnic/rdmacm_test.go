package main

import (
	"bytes"
	"context"
	"io"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/netnstest"
)

// The project's rdma_cm test program (c/test/cm_test.c), under
// AddressSanitizer, through softrnic run against a daemon on a veth:
// event channels, IDs, address and route resolution (IPv4, IPv6, our own
// address, a destination routed through another interface, one with no
// route), QPs on IDs, a connection to a peer that runs no CM (withdrawn;
// UNREACHABLE on a synchronous ID), and DEVICE_REMOVAL when the daemon
// stops; and pyverbs' rdma_cm module over the same library.
func TestCMProgram(t *testing.T) {
	netnstest.SkipUnlessRoot(t)
	dir := buildCLib(t)
	bin := buildSoftrnic(t)
	pair := netnstest.NewTestPair(t, netnstest.PairOptions{})
	// An interface that is not the daemon's (a veth pair inside
	// namespace A), for ADDR_ERROR (-ENODEV).
	for _, args := range [][]string{
		{"link", "add", "cmx0", "type", "veth", "peer", "name", "cmx1"},
		{"addr", "add", "10.251.0.1/24", "dev", "cmx0"},
		{"link", "set", "cmx0", "up"},
		{"link", "set", "cmx1", "up"},
	} {
		if out, err := pair.A.NS.IP(args...); err != nil {
			t.Fatalf("ip %v: %v\n%s", args, err, out)
		}
	}
	// Short CM timers: a connection to B, which runs no CM, is given up
	// on in seconds (UNREACHABLE), not Linux's 100 s.
	sock, stop := startDaemon(t, bin, pair.A, "--cm-response-timeout", "12", "--cm-max-retries", "2")
	test := filepath.Join(dir, "asan", "cm_test")
	prog := func(ctx context.Context, args ...string) *exec.Cmd {
		return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", pair.A.NS.Name, bin, "run",
			"--lib", filepath.Join(dir, "asan", "lib"), "--control", sock, "--", test}, args...)...)
	}
	t.Run("local", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		out, err := prog(ctx, "local", pair.B.Addr.String(), pair.B.Addr6.String(), "10.251.0.2", "203.0.113.1").CombinedOutput()
		if err != nil || !bytes.Contains(out, []byte(" passed, 0 failed")) {
			t.Fatalf("%v\n%s", err, out)
		}
		t.Logf("%s", bytes.TrimSpace(out))
	})
	// pyverbs' rdma_cm module (Cython over librdmacm): an event channel, an
	// ID resolving address and route, and a synchronous endpoint.
	t.Run("pyverbs", func(t *testing.T) {
		if exec.Command("/usr/bin/python3", "-c", "import pyverbs.cmid").Run() != nil {
			t.Skip("pyverbs is not installed")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, "ip", "netns", "exec", pair.A.NS.Name, bin, "run", "--lib", filepath.Join(dir, "lib"),
			"--control", sock, "--", "/usr/bin/python3", "-c", `
import pyverbs.cm_enums as ce
from pyverbs.cmid import CMID, AddrInfo, CMEventChannel, CMEvent
ch = CMEventChannel()
cmid = CMID(creator=ch, port_space=ce.RDMA_PS_TCP)
ai = AddrInfo(dst='`+pair.B.Addr6.String()+`', dst_service='7471', port_space=ce.RDMA_PS_TCP)
cmid.resolve_addr(ai, 2000)
ev = CMEvent(ch)
assert ev.event_type == ce.RDMA_CM_EVENT_ADDR_RESOLVED, ev.event_type
ev.ack_cm_event()
cmid.resolve_route(2000)
ev = CMEvent(ch)
assert ev.event_type == ce.RDMA_CM_EVENT_ROUTE_RESOLVED, ev.event_type
ev.ack_cm_event()
ep = CMID(creator=AddrInfo(dst='`+pair.B.Addr.String()+`', dst_service='7471', port_space=ce.RDMA_PS_TCP))
print('pyverbs rdmacm ok')
`).CombinedOutput()
		if err != nil || !bytes.Contains(out, []byte("pyverbs rdmacm ok")) {
			t.Fatalf("%v\n%s", err, out)
		}
	})
	// Last: it stops the daemon.
	t.Run("device-removal", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		runAcrossStop(t, prog(ctx, "fatal"), stop)
	})
}

// Connections between two processes on two daemons, through the C test
// program under AddressSanitizer: the library's whole connection path
// (listen, connect, accept, reject, establish, disconnect, SIDR, the QP
// driven by the library or by the application, traffic on it over the
// veth), the CM exchange run by the daemons.
func TestCMConnections(t *testing.T) {
	netnstest.SkipUnlessRoot(t)
	dir := buildCLib(t)
	bin := buildSoftrnic(t)
	pair := netnstest.NewTestPair(t, netnstest.PairOptions{})
	sockA, _ := startDaemon(t, bin, pair.A)
	sockB, _ := startDaemon(t, bin, pair.B)
	test := filepath.Join(dir, "asan", "cm_test")
	prog := func(ctx context.Context, ns *netnstest.NS, sock string, args ...string) *exec.Cmd {
		return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns.Name, bin, "run",
			"--lib", filepath.Join(dir, "asan", "lib"), "--control", sock, "--", test}, args...)...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	srv := prog(ctx, pair.B.NS, sockB, "server", "7471")
	var serr bytes.Buffer
	srv.Stderr = &serr
	sout, err := srv.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make([]byte, 6)
	if _, err := io.ReadFull(sout, ready); err != nil || string(ready) != "ready\n" {
		srv.Wait()
		t.Fatalf("server: %q %v\n%s", ready, err, serr.String())
	}
	cout, cerr := prog(ctx, pair.A.NS, sockA, "client", pair.B.Addr.String(), pair.B.Addr6.String(), "7471").CombinedOutput()
	rest, _ := io.ReadAll(sout)
	werr := srv.Wait()
	if cerr != nil || werr != nil || !bytes.Contains(cout, []byte(" passed, 0 failed")) || !bytes.Contains(rest, []byte(" passed, 0 failed")) {
		t.Fatalf("client: %v\n%s\nserver: %v\n%s%s", cerr, cout, werr, rest, serr.String())
	}
	// The UD QP the client learned through SIDR is the one the server made.
	if cq, sq := udQPN(cout), udQPN(rest); cq == "" || cq != sq {
		t.Errorf("SIDR answered QP %q, the server's is %q", cq, sq)
	}
	t.Logf("client: %s; server: %s", lastLine(cout), lastLine(rest))
}

func udQPN(out []byte) string {
	for _, l := range bytes.Split(out, []byte("\n")) {
		if q, ok := bytes.CutPrefix(l, []byte("udqpn ")); ok {
			return string(q)
		}
	}
	return ""
}

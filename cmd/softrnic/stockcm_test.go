package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/netnstest"
	"github.com/softrnic/softrnic/internal/perftest"
)

// Stock rdma_cm programs, unchanged, through softrnic run: rdma-core's
// rping, udaddy, rdma_server and rdma_client, and perftest with -R,
// between two namespaces with a daemon each; stock rping against softrnic
// rping in process; and a connection refused, reported as the stock tool
// reports it. A pass is both sides exiting 0 (rping -V checks every ping's
// data).

// cmStock is what the runs share: two namespaces, a daemon in each (in B
// only with inProcA: A then runs softrnic's tools in process).
type cmStock struct {
	bin, lib     string
	pair         *netnstest.Pair
	sockA, sockB string
	port         atomic.Int32
}

func newCMStock(t testing.TB, daemonOnA bool) *cmStock {
	t.Helper()
	netnstest.SkipUnlessRoot(t)
	for _, p := range []string{"rping", "udaddy", "rdma_server", "rdma_client", "ib_write_bw"} {
		if _, err := exec.LookPath(p); err != nil {
			t.Skipf("%s is not installed (make deps)", p)
		}
	}
	e := &cmStock{lib: filepath.Join(buildCLib(t), "lib"), bin: buildSoftrnic(t)}
	e.pair = netnstest.NewTestPair(t, netnstest.PairOptions{})
	if daemonOnA {
		e.sockA, _ = startDaemon(t, e.bin, e.pair.A)
	}
	e.sockB, _ = startDaemon(t, e.bin, e.pair.B)
	e.port.Store(21100)
	return e
}

func (e *cmStock) nextPort() string { return strconv.Itoa(int(e.port.Add(1))) }

// stock is argv through softrnic run on A, or on B with onB.
func (e *cmStock) stock(ctx context.Context, onB bool, argv ...string) *exec.Cmd {
	ns, sock := e.pair.A.NS, e.sockA
	if onB {
		ns, sock = e.pair.B.NS, e.sockB
	}
	args := append([]string{"netns", "exec", ns.Name, e.bin, "run", "--lib", e.lib, "--control", sock, "--"}, argv...)
	return exec.CommandContext(ctx, "ip", args...)
}

// inProcess is softrnic argv in process on A's interface.
func (e *cmStock) inProcess(ctx context.Context, argv ...string) *exec.Cmd {
	args := append([]string{"netns", "exec", e.pair.A.NS.Name, e.bin}, argv...)
	args = append(args, "-d", e.pair.A.Name)
	return exec.CommandContext(ctx, "ip", args...)
}

// listenWait bounds how long a client is run again while the server it
// dials does not listen yet: a server process starting through softrnic
// run on a loaded machine (every package's tests at once on 2 CPUs) can
// take seconds.
const listenWait = 30 * time.Second

// dialUntilListening runs client until it exits 0 or its output does not
// say the server is not listening yet (refused matches; "" runs it once),
// 100 ms apart, for at most listenWait; it returns the last run's output
// and error. A server that exits meanwhile (done, sout its output) fails
// the test.
func dialUntilListening(t testing.TB, done <-chan error, sout *bytes.Buffer, client func() *exec.Cmd, refused string) ([]byte, error) {
	t.Helper()
	for deadline := time.Now().Add(listenWait); ; {
		out, err := client().CombinedOutput()
		if err == nil || refused == "" || !bytes.Contains(out, []byte(refused)) || time.Now().After(deadline) {
			return out, err
		}
		select {
		case serr := <-done:
			t.Fatalf("server exited (%v) before a client reached it:\n%s", serr, sout.String())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// runCM runs server, then client (again while the server is not listening
// yet: see dialUntilListening). Both must exit 0; the client's output is
// returned. A client that lost perftest's second-connect race (see
// perftest.StockSecondConnectRace) ends the run early with raced set: only a new
// run of both sides can pass.
func runCM(t testing.TB, ctx context.Context, server *exec.Cmd, client func() *exec.Cmd, refused string) (clientOut string, raced bool) {
	t.Helper()
	var sout bytes.Buffer
	server.Stdout, server.Stderr = &sout, &sout
	if err := server.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- server.Wait() }()
	cout, cerr := dialUntilListening(t, done, &sout, client, refused)
	if cerr != nil && perftest.StockSecondConnectRace(cout) {
		_ = server.Process.Kill() // it waits for a client that crashed
		t.Logf("client lost perftest's second-connect race (%v); server killed: %v\n%s", cerr, <-done, cout)
		return "", true
	}
	var serr error
	select {
	case serr = <-done:
	case <-ctx.Done():
		serr = ctx.Err()
	}
	if rpingTeardownRace(cerr, cout) {
		t.Logf("client: rping's own teardown race after a complete run (rdma-core PR #1622):\n%s", cout)
		cerr = nil
	}
	if rpingTeardownRace(serr, sout.Bytes()) {
		t.Logf("server: rping's own teardown race after a complete run (rdma-core PR #1622):\n%s", sout.String())
		serr = nil
	}
	if cerr != nil || serr != nil {
		t.Fatalf("client %v: %v\n%s\nserver %v: %v\n%s", client().Args, cerr, cout, server.Args, serr, sout.String())
	}
	return string(cout), false
}

// rpingTeardownRace reports whether a stock rping failed only by its own
// race at exit, fixed in rdma-core after Debian's 44 (pull request #1622):
// its CM event thread asks for one more event after the last, when the
// main thread has already destroyed the event channel, and exits 255 with
// "rdma_get_cm_event: Bad file descriptor", the run itself complete. The
// output must hold nothing else but the disconnection's own lines, so a
// run that failed for any other reason still fails.
func rpingTeardownRace(err error, out []byte) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 255 || !bytes.Contains(out, []byte("rdma_get_cm_event: Bad file descriptor")) {
		return false
	}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		switch l {
		case "rdma_get_cm_event: Bad file descriptor", "client DISCONNECT EVENT...", "server DISCONNECT EVENT...",
			"wait for RDMA_READ_ADV state 10":
		default:
			return false
		}
	}
	return true
}

// serve runs the stock server on B and the stock client on A, and returns
// the client's output. A run lost to perftest's second-connect race is run
// again, both sides, at most twice more; a third loss fails.
func (e *cmStock) serve(t *testing.T, server, client []string, refused string) string {
	t.Helper()
	for attempt := 1; ; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		cout, raced := runCM(t, ctx, e.stock(ctx, true, server...), func() *exec.Cmd { return e.stock(ctx, false, client...) }, refused)
		cancel()
		if !raced {
			return cout
		}
		if attempt == 3 {
			t.Fatalf("%s lost perftest's second-connect race %d times in a row", client[0], attempt)
		}
	}
}

// rping -V between the daemons: the library's QP and the application's
// own (-q), IPv4 and IPv6, small, odd and the largest sizes, several
// counts.
func TestStockRping(t *testing.T) {
	e := newCMStock(t, true)
	b4, b6 := e.pair.B.Addr.String(), e.pair.B.Addr6.String()
	for _, c := range []struct {
		addr  string
		q     bool
		size  int
		count int
	}{
		{b4, false, 64, 10},
		{b4, true, 64, 10},
		{b6, false, 4096, 20},
		{b6, true, 1000, 50},
		{b4, false, 65535, 5},
		{b4, true, 26, 200},
	} {
		name := fmt.Sprintf("%s/S%d/C%d", c.addr, c.size, c.count)
		if c.q {
			name += "/q"
		}
		t.Run(name, func(t *testing.T) {
			p := e.nextPort()
			args := []string{"-V", "-a", c.addr, "-p", p, "-S", strconv.Itoa(c.size), "-C", strconv.Itoa(c.count)}
			if c.q {
				args = append(args, "-q")
			}
			e.serve(t, append([]string{"rping", "-s"}, args...), append([]string{"rping", "-c"}, args...),
				"RDMA_CM_EVENT_REJECTED, error 8")
		})
	}
}

// A connection nobody listens for is refused as the kernel refuses it,
// and the stock tools report it as they do on rxe: REJ reason 8 (invalid
// service ID) for rping, SIDR status 1 (service unsupported) for udaddy.
func TestStockRefused(t *testing.T) {
	e := newCMStock(t, true)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := e.stock(ctx, false, "rping", "-c", "-a", e.pair.B.Addr.String(), "-p", e.nextPort(), "-C", "1").CombinedOutput()
	if err == nil || !bytes.Contains(out, []byte("cma event RDMA_CM_EVENT_REJECTED, error 8")) {
		t.Fatalf("rping to a port nobody listens on: %v\n%s", err, out)
	}
	out, err = e.stock(ctx, false, "udaddy", "-s", e.pair.B.Addr.String()).CombinedOutput()
	if err == nil || !bytes.Contains(out, []byte("RDMA_CM_EVENT_UNREACHABLE, error: 1")) {
		t.Fatalf("udaddy to a port nobody listens on: %v\n%s", err, out)
	}
}

// udaddy: SIDR in the UDP port space, then UD messages both ways (the
// address handles from the SIDR answer and from the received GRH).
func TestStockUdaddy(t *testing.T) {
	e := newCMStock(t, true)
	cout := e.serve(t, []string{"udaddy", "-C", "20"}, []string{"udaddy", "-s", e.pair.B.Addr.String(), "-C", "20"},
		"RDMA_CM_EVENT_UNREACHABLE")
	if !strings.Contains(cout, "data transfers complete") {
		t.Fatalf("udaddy client:\n%s", cout)
	}
}

// rdma_server and rdma_client: synchronous IDs (rdma_create_ep,
// rdma_get_request) and the rdma_verbs.h helpers.
func TestStockRdmaServerClient(t *testing.T) {
	e := newCMStock(t, true)
	p := e.nextPort()
	e.serve(t, []string{"rdma_server", "-p", p}, []string{"rdma_client", "-s", e.pair.B.Addr.String(), "-p", p}, "rdma_connect")
}

// perftest with -R: rdma_cm connects the QPs (RC WRITE, UD SEND, SEND
// latency).
func TestStockPerftestRDMACM(t *testing.T) {
	e := newCMStock(t, true)
	for _, c := range [][]string{
		{"ib_write_bw", "-R", "-n", "200", "-s", "65536"},
		{"ib_send_bw", "-R", "-c", "UD", "-n", "200", "-r", "256"},
		{"ib_send_lat", "-R", "-n", "200"},
	} {
		t.Run(strings.Join(c[:min(len(c), 4)], ""), func(t *testing.T) {
			p := e.nextPort()
			args := append(c[1:], "-p", p, "-F")
			// perftest's client does not dial again when the server is not
			// listening yet: it prints the REJECTED event (8) and exits.
			cout := e.serve(t, append([]string{c[0]}, args...), append(append([]string{c[0]}, args...), e.pair.B.Addr.String()),
				"Unexpected CM event bl blka 8")
			if !strings.Contains(cout, "#bytes") {
				t.Fatalf("%s printed no results:\n%s", c[0], cout)
			}
		})
	}
}

// Stock rping through softrnic against softrnic rping in process, each as
// client and as server: the daemon's CM and the in-process agent speak
// the same CM.
func TestStockRpingAgainstInProcess(t *testing.T) {
	e := newCMStock(t, false)
	a, b := e.pair.A.Addr.String(), e.pair.B.Addr.String()
	for _, c := range []struct {
		name  string
		size  string
		stock bool // the stock rping is the client (on B); else the server
	}{
		{"stock-client", "64", true},
		{"stock-server", "4096", false},
		{"stock-client-large", "65535", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			p := e.nextPort()
			if c.stock {
				runCM(t, ctx, e.inProcess(ctx, "rping", "-s", "-V", "-a", a, "-p", p, "-S", c.size),
					func() *exec.Cmd {
						return e.stock(ctx, true, "rping", "-c", "-V", "-a", a, "-p", p, "-S", c.size, "-C", "20")
					}, "RDMA_CM_EVENT_REJECTED, error 8")
				return
			}
			// The stock server on B, softrnic rping's client on A.
			var sout bytes.Buffer
			srv := e.stock(ctx, true, "rping", "-s", "-V", "-a", b, "-p", p, "-S", c.size)
			srv.Stdout, srv.Stderr = &sout, &sout
			if err := srv.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- srv.Wait() }()
			out, err := dialUntilListening(t, done, &sout, func() *exec.Cmd {
				return e.inProcess(ctx, "rping", "-c", "-V", "-a", b, "-p", p, "-S", c.size, "-C", "20")
			}, "(8)")
			if err != nil && !bytes.Contains(out, []byte("(8)")) {
				srv.Process.Kill() // the stock server may wait for ever
			}
			serr := <-done
			if rpingTeardownRace(serr, sout.Bytes()) {
				t.Logf("stock server: rping's own teardown race after a complete run:\n%s", sout.String())
				serr = nil
			}
			if err != nil || serr != nil {
				t.Fatalf("softrnic rping client: %v\n%s\nstock server: %v\n%s", err, out, serr, sout.String())
			}
		})
	}
}

// BenchmarkRpingSetup times one connection of stock rping through
// softrnic (softrnic run, the daemon's CM) beside one of softrnic rping in
// process (its own host and CM agent), in interleaved rounds: a client
// run of one 64-byte ping (-C 1), from exec to exit, against a persistent
// stock server (rping -s -P) through a daemon. The figures include
// process start-up: the daemon client's is opening the library's device
// and its control connection, the in-process tool's is opening its host
// (attaching its XDP program and AF_XDP socket).
func BenchmarkRpingSetup(b *testing.B) {
	stock, inproc := newCMStock(b, true), newCMStock(b, false)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type path struct {
		e      *cmStock
		port   string
		client func(e *cmStock, port string) *exec.Cmd
		total  time.Duration
	}
	paths := []*path{
		{e: stock, client: func(e *cmStock, p string) *exec.Cmd {
			return e.stock(ctx, false, "rping", "-c", "-a", e.pair.B.Addr.String(), "-p", p, "-C", "1")
		}},
		{e: inproc, client: func(e *cmStock, p string) *exec.Cmd {
			return e.inProcess(ctx, "rping", "-c", "-a", e.pair.B.Addr.String(), "-p", p, "-C", "1")
		}},
	}
	for _, pt := range paths {
		pt.port = pt.e.nextPort()
		srv := pt.e.stock(ctx, true, "rping", "-s", "-P", "-a", pt.e.pair.B.Addr.String(), "-p", pt.port)
		if err := srv.Start(); err != nil {
			b.Fatal(err)
		}
		defer srv.Wait()
		defer srv.Process.Kill()
		for i := 0; ; i++ { // until the server listens
			out, err := pt.client(pt.e, pt.port).CombinedOutput()
			if err == nil {
				break
			}
			if i == 50 {
				b.Fatalf("%v\n%s", err, out)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j := range paths {
			pt := paths[(i+j)%len(paths)] // alternate which goes first
			start := time.Now()
			if out, err := pt.client(pt.e, pt.port).CombinedOutput(); err != nil {
				b.Fatalf("%v\n%s", err, out)
			}
			pt.total += time.Since(start)
		}
	}
	b.StopTimer()
	s, n := paths[0].total.Seconds()*1e3/float64(b.N), paths[1].total.Seconds()*1e3/float64(b.N)
	b.ReportMetric(s, "stock-ms/conn")
	b.ReportMetric(n, "inprocess-ms/conn")
	b.ReportMetric(s/n, "stock/inprocess")
}

// Only rping's teardown race is forgiven: a failure with any other output
// or status still fails.
func TestRpingTeardownRace(t *testing.T) {
	err255 := exec.Command("sh", "-c", "exit 255").Run()
	err1 := exec.Command("sh", "-c", "exit 1").Run()
	race := []byte("client DISCONNECT EVENT...\nrdma_get_cm_event: Bad file descriptor\n")
	for _, c := range []struct {
		err  error
		out  []byte
		want bool
	}{
		{err255, race, true},
		{err1, race, false},
		{nil, race, false},
		{err255, []byte("data mismatch!\nrdma_get_cm_event: Bad file descriptor\n"), false},
		{err255, []byte("cma event RDMA_CM_EVENT_REJECTED, error 8\n"), false},
	} {
		if got := rpingTeardownRace(c.err, c.out); got != c.want {
			t.Errorf("rpingTeardownRace(%v, %q) = %v", c.err, c.out, got)
		}
	}
}

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/netnstest"
)

// Stock RDMA programs, unchanged, through softrnic run: Debian's perftest
// and ibverbs-utils between two namespaces with a daemon each, and against
// softrnic perf in process. A pass is both sides exiting 0 with a result
// (perftest's table, pingpong's summary).
//
// UC and UD have no retransmission: a message lost at the receiver leaves
// a stock server waiting for it until the run's deadline. On a loaded
// host frames are lost when the receiver's engine, starved of CPU, lets
// its AF_XDP fill ring run dry. The runs are designed around that: UC and
// UD servers post a receive for every message up front (-r ≥ -n), message
// counts are bounded, and a run that lost a message is ended lossGrace
// after the loss shows rather than at its deadline. Such a run is run
// again, at most twice, only when the daemons' counters (sampled while its
// QPs exist) show frames or messages lost at a receiver during it, and the
// counters are logged; any other failure, and a third one, fails the
// test. (Receives a server posted before telling its client to start are
// in the device when the client's messages arrive: the daemon refills the
// device's RQ from the client's ring when a message finds it empty.)

// stockEnv is what the runs share.
type stockEnv struct {
	bin, lib string
	port     atomic.Int32
}

func newStockEnv(t *testing.T) *stockEnv {
	dir := buildCLib(t)
	e := &stockEnv{bin: buildSoftrnic(t), lib: filepath.Join(dir, "lib")}
	for _, p := range []string{"ib_write_bw", "ibv_rc_pingpong"} {
		if _, err := exec.LookPath(p); err != nil {
			t.Skipf("%s is not installed (make deps)", p)
		}
	}
	e.port.Store(20100)
	return e
}

// side is where one end of a run runs: a namespace and either a daemon's
// socket (the stock program through softrnic run) or an interface
// (softrnic perf in process).
type side struct {
	ns    *netnstest.NS
	sock  string // daemon's control socket; "" for in process
	iface string
}

// cmd is argv run on s: through softrnic run, or as softrnic perf TEST -d
// IFACE for in process (argv[0] then names the perftest program).
func (e *stockEnv) cmd(ctx context.Context, s side, argv []string) *exec.Cmd {
	args := []string{"netns", "exec", s.ns.Name, e.bin}
	if s.sock != "" {
		args = append(args, "run", "--lib", e.lib, "--control", s.sock, "--")
		args = append(args, argv...)
	} else {
		args = append(args, "perf", strings.TrimPrefix(argv[0], "ib_"), "-d", s.iface)
		args = append(args, argv[1:]...)
	}
	return exec.CommandContext(ctx, "ip", args...)
}

// syncBuf is a bytes.Buffer for a process's output read while it runs.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) Bytes() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]byte(nil), s.b.Bytes()...)
}

// stallAfter is how long one side of a run may go on alone once the
// other has exited: a server still waiting then waits for a message that
// will not come.
const stallAfter = 10 * time.Second

// lossGrace is how long a UC or UD run goes on once a receiver lost a
// message.
const lossGrace = 5 * time.Second

// pair runs server argv on srv and the same with peer on cli, the client
// once the server listens; it returns both outputs and the first error.
// When a side is still running stallAfter after the other exited, or the
// run nears its deadline, stalled is called (the QPs still exist, and
// with them their counters) before both are killed; abort kills them at
// once.
func (e *stockEnv) pair(t *testing.T, srv, cli side, peer string, argv []string, timeout time.Duration, stalled func(), abort <-chan struct{}) (sout, cout []byte, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	port := strconv.Itoa(int(e.port.Add(1)))
	var sbuf, cbuf syncBuf
	s := e.cmd(ctx, srv, append(append([]string{}, argv...), "-p", port))
	s.Stdout, s.Stderr = &sbuf, &sbuf
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	sdone := make(chan error, 1)
	go func() { sdone <- s.Wait() }()
	// The server is up once it listens (the side channel's TCP port,
	// inside the namespace).
	for ready := false; !ready; {
		select {
		case err := <-sdone:
			return sbuf.Bytes(), nil, fmt.Errorf("server exited before listening: %w", err)
		case <-time.After(50 * time.Millisecond):
		}
		out, _ := exec.Command("ip", "netns", "exec", srv.ns.Name, "ss", "-Hltn", "sport = :"+port).Output()
		ready = len(bytes.TrimSpace(out)) > 0
	}
	c := e.cmd(ctx, cli, append(append([]string{}, argv...), "-p", port, peer))
	c.Stdout, c.Stderr = &cbuf, &cbuf
	if err := c.Start(); err != nil {
		cancel()
		if serr := <-sdone; serr != nil {
			t.Logf("server (killed): %v", serr)
		}
		t.Fatal(err)
	}
	cdone := make(chan error, 1)
	go func() { cdone <- c.Wait() }()
	var serr, cerr error
	sgot, cgot := false, false
	deadline := time.NewTimer(timeout - stallAfter)
	defer deadline.Stop()
	var alone <-chan time.Time
	for !sgot || !cgot {
		select {
		case serr = <-sdone:
			sgot = true
			alone = time.After(stallAfter)
		case cerr = <-cdone:
			cgot = true
			alone = time.After(stallAfter)
		case <-alone:
			stalled()
			cancel()
			alone = nil
		case <-deadline.C:
			stalled()
			cancel()
		case <-abort:
			cancel()
			abort = nil
		}
	}
	sout, cout = sbuf.Bytes(), cbuf.Bytes()
	switch {
	case cerr != nil:
		err = fmt.Errorf("client: %w", cerr)
	case serr != nil:
		err = fmt.Errorf("server: %w", serr)
	}
	return sout, cout, err
}

// perftestResult is the first line of perftest's result table (after its
// "#bytes" header): nil if there is none.
func perftestResult(out []byte) []string {
	lines := strings.Split(string(out), "\n")
	for i, l := range lines {
		if strings.Contains(l, "#bytes") && i+1 < len(lines) {
			if f := strings.Fields(lines[i+1]); len(f) >= 3 {
				if _, err := strconv.ParseFloat(f[0], 64); err == nil {
					return f
				}
			}
		}
	}
	return nil
}

// lossCounters sums what the daemons counted as received frames lost:
// AF_XDP drops (ring full, fill ring empty, other) and packets that found
// no receive WQE or were dropped by a QP (UC messages with a hole).
func (e *stockEnv) lossCounters(socks ...string) (uint64, string) {
	var total uint64
	var parts []string
	for _, sock := range socks {
		if sock == "" {
			continue
		}
		out, err := exec.Command(e.bin, "stats", "--control", sock, "--json").Output()
		if err != nil {
			continue
		}
		var st struct {
			Counters map[string]uint64 `json:"counters"`
			QPs      []struct {
				Counters map[string]uint64 `json:"counters"`
			} `json:"qps"`
		}
		if json.Unmarshal(out, &st) != nil {
			continue
		}
		for _, k := range []string{"xsk_rx_dropped", "xsk_rx_ring_full", "xsk_rx_fill_ring_empty_descs", "out_of_buffer", "rx_qp_dropped"} {
			if v := st.Counters[k]; v > 0 {
				total += v
				parts = append(parts, fmt.Sprintf("%s %s=%d", filepath.Base(filepath.Dir(sock)), k, v))
			}
		}
	}
	return total, strings.Join(parts, " ")
}

// run runs argv between srv and cli and checks the result; a UC or UD run
// is retried as the file comment says.
func (e *stockEnv) run(t *testing.T, srv, cli side, peer string, argv []string, check func(sout, cout []byte) error) {
	t.Helper()
	unreliable := false
	for i, a := range argv {
		if a == "-c" && i+1 < len(argv) && (argv[i+1] == "UC" || argv[i+1] == "UD") {
			unreliable = true
		}
	}
	if strings.HasPrefix(argv[0], "ibv_ud") {
		unreliable = true
	}
	for attempt := 1; ; attempt++ {
		// The counters of a QP go with it, so they are sampled while the
		// run goes on, and once more when it stalls.
		before, _ := e.lossCounters(srv.sock, cli.sock)
		var mu sync.Mutex
		worst, what := before, ""
		sample := func() {
			n, w := e.lossCounters(srv.sock, cli.sock)
			mu.Lock()
			if n > worst {
				worst, what = n, w
			}
			mu.Unlock()
		}
		stop, abort := make(chan struct{}), make(chan struct{})
		sampled := make(chan struct{})
		go func(abort chan struct{}) {
			// A UC or UD run that lost a message waits for it in vain:
			// it is ended lossGrace after the loss shows.
			defer close(sampled)
			var lostAt time.Time
			for {
				select {
				case <-stop:
					return
				case <-time.After(time.Second):
					sample()
				}
				mu.Lock()
				lost := worst > before
				mu.Unlock()
				switch {
				case !unreliable || !lost:
				case lostAt.IsZero():
					lostAt = time.Now()
				case time.Since(lostAt) > lossGrace && abort != nil:
					close(abort)
					abort = nil
				}
			}
		}(abort)
		sout, cout, err := e.pair(t, srv, cli, peer, argv, 90*time.Second, sample, abort)
		close(stop)
		<-sampled
		if err == nil {
			err = check(sout, cout)
		}
		if err == nil {
			return
		}
		sample()
		lost := int64(worst) - int64(before)
		if unreliable && attempt < 3 && lost > 0 {
			t.Logf("attempt %d: %v, with %d frames or messages lost at a receiver during the run (%s): UC and UD do not retransmit; running again",
				attempt, err, lost, what)
			continue
		}
		t.Fatalf("%s: %v (lost at a receiver during the run: %d)\nserver:\n%s\nclient:\n%s", strings.Join(argv, " "), err, lost, sout, cout)
	}
}

// checkPerftest accepts a run whose client (and server, for the bandwidth
// tests that report on both sides) printed a result.
func checkPerftest(sout, cout []byte) error {
	r := perftestResult(cout)
	if r == nil {
		return fmt.Errorf("no result table from the client")
	}
	if n, _ := strconv.ParseFloat(r[1], 64); n <= 0 {
		return fmt.Errorf("client result %v", r)
	}
	return nil
}

// stockCases are the perftest runs: every program over the transports it
// allows, sizes from 1 B to 1 MiB (UD: its MTU), -q 4 (bandwidth tests),
// both post-send APIs, and -e (completion events; perftest has none for
// WRITE). UC and UD receivers post a receive for every message (-r).
func stockCases() [][]string {
	var cs [][]string
	add := func(argv ...string) { cs = append(cs, append([]string{argv[0], "-F"}, argv[1:]...)) }
	for _, c := range []string{"RC", "UC"} {
		r := []string{"-c", c} // (a WRITE has no receive to post)
		add(append([]string{"ib_write_bw", "-s", "1", "-n", "500"}, r...)...)
		add(append([]string{"ib_write_bw", "-s", "1048576", "-n", "8"}, r...)...)
		add(append([]string{"ib_write_bw", "-q", "4", "--use_old_post_send", "-s", "4096", "-n", "100"}, r...)...)
		add(append([]string{"ib_write_lat", "-s", "1", "-n", "200"}, r...)...)
		add(append([]string{"ib_write_lat", "-s", "1048576", "-n", "8", "--use_old_post_send"}, r...)...)
	}
	for _, c := range []string{"RC", "UC", "UD"} {
		r := []string{"-c", c}
		big, mid := "1048576", "4096"
		if c != "RC" {
			r = append(r, "-r", "512")
		}
		if c == "UD" {
			big, mid = "1024", "1024" // a datagram is at most the path MTU
		}
		add(append([]string{"ib_send_bw", "-s", "1", "-n", "500"}, r...)...)
		add(append([]string{"ib_send_bw", "-s", big, "-n", "8"}, r...)...)
		add(append([]string{"ib_send_bw", "-q", "4", "--use_old_post_send", "-s", "512", "-n", "100"}, r...)...)
		add(append([]string{"ib_send_bw", "-e", "-s", mid, "-n", "200"}, r...)...)
		add(append([]string{"ib_send_lat", "-s", "1", "-n", "200"}, r...)...)
		add(append([]string{"ib_send_lat", "-s", big, "-n", "8", "--use_old_post_send"}, r...)...)
		add(append([]string{"ib_send_lat", "-e", "-s", "64", "-n", "100"}, r...)...)
	}
	add("ib_read_bw", "-s", "1", "-n", "500")
	add("ib_read_bw", "-s", "1048576", "-n", "8")
	add("ib_read_bw", "-q", "4", "--use_old_post_send", "-e", "-s", "4096", "-n", "100")
	add("ib_read_lat", "-s", "1", "-n", "200")
	add("ib_read_lat", "-s", "1048576", "-n", "8", "--use_old_post_send")
	add("ib_atomic_bw", "-n", "500")
	add("ib_atomic_bw", "-q", "4", "--use_old_post_send", "-n", "200")
	add("ib_atomic_bw", "-e", "-n", "200")
	add("ib_atomic_lat", "-n", "200")
	add("ib_atomic_lat", "-A", "CMP_AND_SWAP", "--use_old_post_send", "-n", "100")
	return cs
}

// Every perftest program between two namespaces, a daemon each, both ends
// through softrnic run.
func TestStockPerftest(t *testing.T) {
	netnstest.SkipUnlessRoot(t)
	e := newStockEnv(t)
	pair := netnstest.NewTestPair(t, netnstest.PairOptions{})
	// A UMEM (and so a fill ring) that holds a 1 MiB UC burst several
	// times over, so that a receiver's engine starved of CPU for a few
	// milliseconds does not drop frames the sender never resends.
	sockA, _ := startDaemon(t, e.bin, pair.A, "--umem-size", "64M")
	sockB, _ := startDaemon(t, e.bin, pair.B, "--umem-size", "64M")
	srv, cli := side{ns: pair.B.NS, sock: sockB}, side{ns: pair.A.NS, sock: sockA}
	for _, argv := range stockCases() {
		t.Run(strings.Join(argv, " "), func(t *testing.T) {
			e.run(t, srv, cli, pair.B.Addr.String(), argv, checkPerftest)
		})
	}
}

var pingpongSummary = regexp.MustCompile(`(?m)^\d+ iters in [\d.]+ seconds`)

// ibverbs-utils' ping-pongs with their buffers checked (-c), with and
// without completion events (-e).
func TestStockPingpong(t *testing.T) {
	netnstest.SkipUnlessRoot(t)
	e := newStockEnv(t)
	pair := netnstest.NewTestPair(t, netnstest.PairOptions{})
	sockA, _ := startDaemon(t, e.bin, pair.A)
	sockB, _ := startDaemon(t, e.bin, pair.B)
	srv, cli := side{ns: pair.B.NS, sock: sockB}, side{ns: pair.A.NS, sock: sockA}
	check := func(sout, cout []byte) error {
		if !pingpongSummary.Match(sout) || !pingpongSummary.Match(cout) {
			return fmt.Errorf("no summary")
		}
		return nil
	}
	for _, argv := range [][]string{
		{"ibv_rc_pingpong", "-g", "0", "-c", "-n", "200"},
		{"ibv_rc_pingpong", "-g", "0", "-c", "-e", "-n", "200"},
		{"ibv_rc_pingpong", "-g", "0", "-c", "-s", "65536", "-n", "50"},
		{"ibv_ud_pingpong", "-g", "0", "-c", "-s", "512", "-n", "200"},
		{"ibv_ud_pingpong", "-g", "0", "-c", "-e", "-s", "512", "-n", "200"},
	} {
		t.Run(strings.Join(argv, " "), func(t *testing.T) {
			e.run(t, srv, cli, pair.B.Addr.String(), argv, check)
		})
	}
}

// Stock perftest through a daemon against softrnic perf in process, each
// as the server and as the client.
func TestStockAgainstInProcess(t *testing.T) {
	netnstest.SkipUnlessRoot(t)
	e := newStockEnv(t)
	pair := netnstest.NewTestPair(t, netnstest.PairOptions{})
	sockA, _ := startDaemon(t, e.bin, pair.A)
	stock, inproc := side{ns: pair.A.NS, sock: sockA}, side{ns: pair.B.NS, iface: pair.B.Name}
	for _, argv := range [][]string{
		{"ib_write_bw", "-F", "-s", "65536", "-n", "200", "-q", "2"},
		{"ib_write_lat", "-F", "-s", "64", "-n", "200"},
		{"ib_read_bw", "-F", "-s", "16384", "-n", "200"},
		{"ib_read_lat", "-F", "-s", "64", "-n", "200"},
		{"ib_send_bw", "-F", "-s", "4096", "-n", "200"},
		{"ib_send_lat", "-F", "-s", "64", "-n", "200"},
		{"ib_atomic_bw", "-F", "-n", "200"},
		{"ib_atomic_lat", "-F", "-n", "200"},
		{"ib_write_bw", "-F", "-c", "UC", "-s", "4096", "-n", "100"},
		{"ib_send_bw", "-F", "-c", "UD", "-s", "1024", "-n", "200", "-r", "512"},
	} {
		for _, stockServes := range []bool{true, false} {
			name := strings.Join(argv, " ")
			srv, cli, peer := stock, inproc, pair.A.Addr.String()
			if stockServes {
				name += "/stock-server"
			} else {
				name += "/stock-client"
				srv, cli, peer = inproc, stock, pair.B.Addr.String()
			}
			t.Run(name, func(t *testing.T) {
				e.run(t, srv, cli, peer, argv, func(sout, cout []byte) error {
					if perftestResult(cout) == nil && perftestResult(sout) == nil {
						return fmt.Errorf("no result table")
					}
					return nil
				})
			})
		}
	}
}

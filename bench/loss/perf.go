package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/softrnic/softrnic/internal/netnstest"
)

// host is one end of a measurement: a namespace and the interface softrnic
// opens in it.
type host struct {
	ns   *netnstest.NS
	dev  string
	addr string // IPv4 address, what the client dials
}

// perfJob is one `softrnic perf` run: the server on B (in process on B's
// interface, or in B's daemon), the client on A, each a process of the
// binary under test in its namespace.
type perfJob struct {
	bin      string
	test     string   // write_bw
	args     []string // perftest flags for both ends
	server   host
	client   host
	daemon   *daemon // the server's QPs live here (nil: in process)
	port     int     // side-channel TCP port
	duration time.Duration
	limit    time.Duration // kill both ends this long after the client starts
}

// Run is the outcome of one perfJob.
type Run struct {
	Args       []string `json:"args"` // perftest flags of both ends
	QPs        int      `json:"qps"`
	PathMTU    int      `json:"path_mtu,omitempty"` // as the client reported it
	MiBps      float64  `json:"goodput_mibps"`      // aggregate over the QPs, perftest's BW average
	PeakMiBps  float64  `json:"peak_mibps,omitempty"`
	Iters      uint64   `json:"iters,omitempty"`
	Verified   bool     `json:"verified,omitempty"` // --verify passed on both ends
	Load1      float64  `json:"load1"`              // the host's 1-minute load average as the run started
	Seconds    float64  `json:"seconds"`            // wall time, side channel included
	CPUSeconds float64  `json:"cpu_seconds"`        // both perf processes (not a daemon's)
	// Failure is empty for a run that completed: RETRY_EXC_ERR (or another
	// completion status), "timeout" (killed after the job's limit),
	// "stalled" (perf gave up for want of progress) or "error".
	Failure string `json:"failure,omitempty"`
	Detail  string `json:"detail,omitempty"` // the failing end's last words
	// XSK is the receiver's AF_XDP socket statistics (its perf process,
	// or its daemon) over the run.
	XSK      *XSKStats `json:"receiver_xsk,omitempty"`
	XSKError string    `json:"receiver_xsk_error,omitempty"`
	// Veth is the growth of the receiver's veth counters (ethtool -S,
	// summed over queues: rx_xdp_redirect frames went to an AF_XDP socket,
	// rx_drops include those the socket refused).
	Veth map[string]uint64 `json:"receiver_veth,omitempty"`
	// Bridge is the lossy bridge's RoCEv2 frame counts (lossy path only).
	Bridge *netnstest.PathCounters `json:"bridge,omitempty"`
	// CNPSent and HostCCMarks are the receiver's np_cnp_sent and
	// np_host_cc_marks (its perf process under DCQCN; nil otherwise).
	CNPSent     *uint64 `json:"receiver_np_cnp_sent,omitempty"`
	HostCCMarks *uint64 `json:"receiver_np_host_cc_marks,omitempty"`
	// SenderRecovery is the sender's loss recovery counters (perf's
	// "recovery": tlp_probes, roce_adp_retrans_to, retrans_packets, ...):
	// what explains a receiver's duplicate_request.
	SenderRecovery map[string]uint64 `json:"sender_recovery,omitempty"`
	// Daemon is the growth of the receiving daemon's device counters
	// (softrnic stats), when B's side ran in a daemon; those that sum over
	// QPs are their largest value sampled during the run.
	Daemon map[string]uint64 `json:"daemon_counters,omitempty"`
}

// OK says whether the run completed with a figure.
func (r Run) OK() bool { return r.Failure == "" && r.MiBps > 0 }

func (j *perfJob) common() []string {
	a := append([]string{"perf", j.test, "--json", "-p", strconv.Itoa(j.port)}, j.args...)
	if j.duration > 0 {
		a = append(a, "-D", strconv.Itoa(int(j.duration.Round(time.Second)/time.Second)))
	}
	return a
}

// run runs the job and returns its outcome; a failure is reported in it,
// never as a panic or an exit.
func (j *perfJob) run() (r Run) {
	r = Run{Args: j.args, QPs: qpsOf(j.args), Load1: loadavg()[0]}
	start := time.Now()
	defer func() { r.Seconds = time.Since(start).Seconds() }()

	srvArgs := append(j.common(), "-d", j.server.dev)
	if j.daemon != nil {
		srvArgs = append(j.common(), "--daemon", j.daemon.sock)
	}
	cliArgs := append(j.common(), "-d", j.client.dev, j.server.addr)
	ctx, cancel := context.WithTimeout(context.Background(), j.limit+20*time.Second)
	defer cancel()

	vethBefore, vethErr := ethtoolStats(j.server.ns, j.server.dev)
	var statsBefore map[string]uint64
	if j.daemon != nil {
		statsBefore, _ = j.daemon.counters()
	}

	// Each end has its own context: ending one (SIGTERM, then SIGKILL, see
	// perfCmd) is cancelling it.
	sctx, scancel := context.WithCancel(ctx)
	defer scancel()
	srv := perfCmd(sctx, j.bin, j.server.ns, srvArgs)
	var sout, serr bytes.Buffer
	srv.Stdout, srv.Stderr = &sout, &limitedWriter{w: &serr}
	if err := startTracked(srv); err != nil {
		r.Failure, r.Detail = "error", err.Error()
		return r
	}
	srvDone := make(chan error, 1)
	go func() { srvDone <- waitTracked(srv) }()
	var watch *xskWatch
	if j.daemon == nil {
		var err error
		if watch, err = watchXSK(srv.Process.Pid, 20*time.Millisecond); err != nil {
			r.XSKError = err.Error()
		}
	}
	finishWatch := func() {
		if watch != nil {
			s, err := watch.Finish()
			r.XSK = &s
			if err != nil {
				r.XSKError = err.Error()
			}
			watch = nil
		}
	}
	defer finishWatch()
	if err := waitListening(ctx, j.server.ns, j.port, srvDone); err != nil {
		scancel()
		if exitErr := <-srvDone; errors.Is(err, errExited) {
			err = fmt.Errorf("%w: %w", err, exitErr)
		}
		r.Failure, r.Detail = "error", fmt.Sprintf("server: %v: %s", err, lastLines(serr.String(), 2))
		return r
	}

	// The client's own limit; ctx is the backstop for both ends.
	cctx, ccancel := context.WithTimeout(ctx, j.limit)
	defer ccancel()
	cli := perfCmd(cctx, j.bin, j.client.ns, cliArgs)
	var cout, cerr bytes.Buffer
	cli.Stdout, cli.Stderr = &cout, &limitedWriter{w: &cerr}
	// The daemon's device counters that sum over QPs (out_of_sequence,
	// rx_write_requests, ...) lose a QP's counts when the QP is destroyed,
	// at the end of the run: sample them while the QPs exist.
	var samples chan map[string]uint64
	stopSampling := make(chan struct{})
	if j.daemon != nil {
		samples = make(chan map[string]uint64, 1)
		go func() { samples <- j.daemon.sampleMax(stopSampling, 250*time.Millisecond) }()
	}
	cliErr := startTracked(cli)
	if cliErr == nil {
		cliErr = waitTracked(cli)
	}
	close(stopSampling)
	timedOut := cctx.Err() != nil
	var srvErr error
	wait := 5 * time.Second
	if timedOut {
		wait = 0
	}
	select {
	case srvErr = <-srvDone:
	case <-time.After(wait):
		// The client is gone; a server still waiting for it will not
		// finish on its own.
		scancel()
		srvErr = <-srvDone
	}
	finishWatch()
	r.CPUSeconds = cpuOf(cli) + cpuOf(srv)

	if vethErr == nil {
		if after, err := ethtoolStats(j.server.ns, j.server.dev); err == nil {
			r.Veth = delta(vethBefore, after)
		}
	}
	if j.daemon != nil {
		peak := <-samples
		if after, err := j.daemon.counters(); err == nil {
			r.Daemon = delta(statsBefore, maxOf(peak, after))
		}
	}

	switch {
	case timedOut:
		r.Failure, r.Detail = "timeout", fmt.Sprintf("killed after %v; client: %s", j.limit, lastLines(cerr.String(), 1))
		return r
	case cliErr != nil || srvErr != nil:
		r.Failure = classify(cerr.String() + "\n" + serr.String())
		r.Detail = fmt.Sprintf("client: %v %s; server: %v %s", cliErr, lastLines(cerr.String(), 1), srvErr, lastLines(serr.String(), 1))
		return r
	}
	cres, err := parsePerfJSON(cout.Bytes())
	if err != nil {
		r.Failure, r.Detail = "error", "client output: "+err.Error()
		return r
	}
	sres, serrJ := parsePerfJSON(sout.Bytes())
	if len(cres.BW) == 0 {
		r.Failure, r.Detail = "error", "client reported no bandwidth"
		return r
	}
	if serrJ == nil && sres.DCQCN != nil {
		r.CNPSent, r.HostCCMarks = sres.DCQCN.CNPSent, sres.DCQCN.HostCCMarks
	}
	for k, v := range cres.Recovery {
		if f, ok := v.(float64); ok {
			if r.SenderRecovery == nil {
				r.SenderRecovery = map[string]uint64{}
			}
			r.SenderRecovery[k] = uint64(f)
		}
	}
	b := cres.BW[0]
	r.PathMTU = cres.TestInfo.MTU
	r.MiBps, r.PeakMiBps, r.Iters = b.BWAverage, b.BWPeak, b.Iters
	if hasVerify(j.args) {
		r.Verified = cres.TestInfo.Verified != nil && *cres.TestInfo.Verified &&
			serrJ == nil && sres.TestInfo.Verified != nil && *sres.TestInfo.Verified
		if !r.Verified {
			r.Failure, r.Detail = "not verified", "--verify not confirmed by both ends"
		}
	}
	return r
}

// perfCmd is `ip netns exec NS BIN args...` on an AF_XDP port. ip(8) execs
// the binary, so the command's process is softrnic itself (its pid, CPU
// time and sockets). A cancelled context sends SIGTERM, as a user's Ctrl-C
// would, then SIGKILL after a grace time.
func perfCmd(ctx context.Context, bin string, ns *netnstest.NS, args []string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns.Name, bin}, args...)...)
	cmd.Env = append(os.Environ(), "SOFTRNIC_PORT=afxdp")
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 3 * time.Second
	return cmd
}

func cpuOf(c *exec.Cmd) float64 {
	if st := c.ProcessState; st != nil {
		return (st.UserTime() + st.SystemTime()).Seconds()
	}
	return 0
}

// errExited is a perf server that exited before it listened.
var errExited = errors.New("exited before listening")

// waitListening waits until a TCP socket listens on port in ns (the perf
// server's side channel), without connecting to it: perftest's server
// takes one connection. It gives up when the server exits or ctx ends.
func waitListening(ctx context.Context, ns *netnstest.NS, port int, exited chan error) error {
	want := fmt.Sprintf(":%04X ", port)
	for {
		listening := false
		if err := ns.Do(func() error {
			// thread-self: Do's thread is the one in the namespace.
			for _, f := range []string{"/proc/thread-self/net/tcp", "/proc/thread-self/net/tcp6"} {
				b, _ := os.ReadFile(f)
				sc := bufio.NewScanner(bytes.NewReader(b))
				for sc.Scan() {
					fs := strings.Fields(sc.Text())
					// local_address is field 1, st field 3 (0A: LISTEN).
					if len(fs) > 3 && strings.HasSuffix(fs[1]+" ", want) && fs[3] == "0A" {
						listening = true
					}
				}
			}
			return nil
		}); err != nil {
			return err
		}
		if listening {
			return nil
		}
		select {
		case err := <-exited:
			exited <- err // the caller waits for it too
			return errExited
		case <-ctx.Done():
			return errors.New("did not listen in time")
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// classify names why a run failed from what its ends printed.
func classify(stderr string) string {
	for _, s := range []string{"RNR_RETRY_EXC_ERR", "RETRY_EXC_ERR"} {
		if strings.Contains(stderr, s) {
			return s
		}
	}
	if i := strings.Index(stderr, "completed with status "); i >= 0 {
		if f := strings.Fields(stderr[i+len("completed with status "):]); len(f) > 0 {
			return f[0]
		}
	}
	if strings.Contains(stderr, "no progress for") {
		return "stalled"
	}
	return "error"
}

// perfJSON is the part of perftest's --json output read here.
type perfJSON struct {
	TestInfo struct {
		QPs      int   `json:"Number_of_qps"`
		MTU      int   `json:"Mtu"`
		Verified *bool `json:"verified"`
	} `json:"test_info"`
	BW []struct {
		Size      uint64  `json:"MsgSize"`
		Iters     uint64  `json:"n_iterations"`
		BWPeak    float64 `json:"BW_peak"`
		BWAverage float64 `json:"BW_average"`
	} `json:"results_bw"`
	DCQCN *struct {
		CNPSent     *uint64 `json:"np_cnp_sent"`
		HostCCMarks *uint64 `json:"np_host_cc_marks"`
	} `json:"dcqcn"`
	Recovery map[string]any `json:"recovery"`
}

// parsePerfJSON reads the JSON document in perf's standard output (it may
// follow other lines).
func parsePerfJSON(out []byte) (perfJSON, error) {
	var j perfJSON
	i := bytes.IndexByte(out, '{')
	if i < 0 {
		return j, fmt.Errorf("no JSON in %q", lastLines(string(out), 2))
	}
	err := json.NewDecoder(bytes.NewReader(out[i:])).Decode(&j)
	return j, err
}

func hasVerify(args []string) bool {
	for _, a := range args {
		if a == "--verify" {
			return true
		}
	}
	return false
}

func qpsOf(args []string) int {
	for i, a := range args {
		if (a == "-q" || a == "--qp") && i+1 < len(args) {
			if n, err := strconv.Atoi(args[i+1]); err == nil {
				return n
			}
		}
	}
	return 1
}

// ethtoolStats reads `ethtool -S dev` in ns, summing per-queue counters
// over the queues (rx_queue_0_xdp_redirect counts as rx_xdp_redirect).
func ethtoolStats(ns *netnstest.NS, dev string) (map[string]uint64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", "netns", "exec", ns.Name, "ethtool", "-S", dev).Output()
	if err != nil {
		return nil, fmt.Errorf("ethtool -S %s: %w", dev, err)
	}
	return parseEthtool(string(out)), nil
}

func parseEthtool(out string) map[string]uint64 {
	m := map[string]uint64{}
	for _, line := range strings.Split(out, "\n") {
		name, val, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		v, err := strconv.ParseUint(strings.TrimSpace(val), 10, 64)
		if err != nil || name == "peer_ifindex" {
			continue
		}
		for _, dir := range []string{"rx", "tx"} {
			if rest, ok := strings.CutPrefix(name, dir+"_queue_"); ok {
				if _, tail, ok := strings.Cut(rest, "_"); ok {
					name = dir + "_" + tail
				}
			}
		}
		m[name] += v
	}
	return m
}

// delta is after − before for every counter of after (counters that went
// backwards, a device reset, count from zero).
func delta(before, after map[string]uint64) map[string]uint64 {
	d := make(map[string]uint64, len(after))
	for k, v := range after {
		if b := before[k]; v >= b {
			d[k] = v - b
		} else {
			d[k] = v
		}
	}
	return d
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, " | ")
}

// limitedWriter keeps the last 64 KiB written to it.
type limitedWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (l *limitedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.w.Write(b)
	if l.w.Len() > 64<<10 {
		rest := l.w.Bytes()[l.w.Len()-32<<10:]
		nb := append([]byte(nil), rest...)
		l.w.Reset()
		l.w.Write(nb)
	}
	return len(b), nil
}

// daemon is a `softrnic daemon` on one host, the receiver of table c.
type daemon struct {
	bin  string
	sock string
	cmd  *exec.Cmd
	logs *limitedWriter
	done chan error
	xsk  *xskWatch
}

// startDaemon runs `softrnic daemon` on h's interface (AF_XDP) and returns
// once `softrnic stats` gets an answer from it.
func startDaemon(bin string, h host, dir string) (*daemon, error) {
	d := &daemon{bin: bin, sock: filepath.Join(dir, "softrnic.sock"), logs: &limitedWriter{w: new(bytes.Buffer)}, done: make(chan error, 1)}
	d.cmd = exec.Command("ip", "netns", "exec", h.ns.Name, bin, "daemon", "-d", h.dev, "--control", d.sock, "--port", "afxdp")
	d.cmd.Stdout, d.cmd.Stderr = d.logs, d.logs
	if err := startTracked(d.cmd); err != nil {
		return nil, err
	}
	go func() { d.done <- waitTracked(d.cmd) }()
	if w, err := watchXSK(d.cmd.Process.Pid, 20*time.Millisecond); err == nil {
		d.xsk = w
	}
	for deadline := time.Now().Add(20 * time.Second); ; {
		if _, err := d.counters(); err == nil {
			return d, nil
		}
		select {
		case err := <-d.done:
			d.done <- err
			_, _ = d.stop() // exited already: only its sockets' statistics are left, of no use here
			return nil, fmt.Errorf("daemon exited: %w: %s", err, lastLines(d.logs.w.String(), 2))
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_, _ = d.stop() // its sockets' statistics are of no use here
			return nil, fmt.Errorf("daemon never answered: %s", lastLines(d.logs.w.String(), 2))
		}
	}
}

// counters is the daemon's device counters (softrnic stats --json).
func (d *daemon) counters() (map[string]uint64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, d.bin, "stats", "--control", d.sock, "--json").Output()
	if err != nil {
		return nil, err
	}
	var s struct {
		Counters map[string]uint64 `json:"counters"`
	}
	if err := json.Unmarshal(out, &s); err != nil {
		return nil, err
	}
	return s.Counters, nil
}

// sampleMax reads the daemon's counters every interval until stop and
// returns each counter's largest value.
func (d *daemon) sampleMax(stop <-chan struct{}, interval time.Duration) map[string]uint64 {
	peak := map[string]uint64{}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return peak
		case <-t.C:
		}
		if c, err := d.counters(); err == nil {
			peak = maxOf(peak, c)
		}
	}
}

// maxOf is each counter's larger value in a and b.
func maxOf(a, b map[string]uint64) map[string]uint64 {
	m := make(map[string]uint64, len(b))
	for k, v := range a {
		m[k] = v
	}
	for k, v := range b {
		m[k] = max(m[k], v)
	}
	return m
}

// stop ends the daemon (SIGTERM, then SIGKILL) and returns its AF_XDP
// sockets' statistics over its life; the error says what failed, the
// daemon's exit (after SIGTERM it exits 0) among it.
func (d *daemon) stop() (*XSKStats, error) {
	// Signal and Kill fail only for a daemon that has exited: d.done has
	// its status.
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	var exitErr error
	select {
	case exitErr = <-d.done:
	case <-time.After(15 * time.Second):
		_ = d.cmd.Process.Kill()
		exitErr = fmt.Errorf("no exit 15 s after SIGTERM: %w", <-d.done)
	}
	if exitErr != nil {
		exitErr = fmt.Errorf("daemon: %w", exitErr)
	}
	if d.xsk == nil {
		return nil, errors.Join(exitErr, errors.New("could not follow the daemon's sockets"))
	}
	s, err := d.xsk.Finish()
	d.xsk = nil
	return &s, errors.Join(exitErr, err)
}

// children are the processes this program started and has not yet waited
// for: an interrupted run ends them before it removes their namespaces (a
// namespace outlives its name while a process is in it).
var children = struct {
	sync.Mutex
	m map[*exec.Cmd]bool
}{m: map[*exec.Cmd]bool{}}

func startTracked(c *exec.Cmd) error {
	children.Lock()
	defer children.Unlock()
	if err := c.Start(); err != nil {
		return err
	}
	children.m[c] = true
	return nil
}

func waitTracked(c *exec.Cmd) error {
	err := c.Wait()
	children.Lock()
	delete(children.m, c)
	children.Unlock()
	return err
}

// killChildren kills every process started here that is still running.
func killChildren() {
	children.Lock()
	defer children.Unlock()
	for c := range children.m {
		_ = c.Process.Kill() // fails only for one that has exited
	}
}

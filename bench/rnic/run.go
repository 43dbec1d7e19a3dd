package main

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/softrnic/softrnic/bench/internal/iobench"
	"github.com/softrnic/softrnic/host"
	"github.com/softrnic/softrnic/internal/netnstest"
	"github.com/softrnic/softrnic/internal/perftest"
	"github.com/softrnic/softrnic/internal/perftest/runner"
)

// MTU of the veth pair: RoCE path MTU 4096 fits (a 4154-byte frame), as
// rxe runs it, and the raw 4 KiB frames too; the same pair serves every
// measurement.
const MTU = 4200

// Options size the run.
type Options struct {
	RawDuration time.Duration // each raw AF_XDP rate test
	// Rounds is how many times the raw AF_XDP rx-only rate at RawSize and
	// every WRITE row are measured, interleaved; each row shows its median
	// round (0 or 1: once).
	Rounds       int
	WriteIters1  int           // 64 KiB WRITEs, 1 QP
	WriteIters4  int           // 64 KiB WRITEs per QP, 4 QPs
	SendIters    int           // 64 B SENDs, message rate
	LatIters     int           // 64 B SEND round trips
	SockperfSecs int           // sockperf ping-pong duration
	PerfTimeout  time.Duration // each softrnic perf run
	// Procs says which softrnic measurements run again with one child
	// process per end, after all four have run with both ends in this
	// process (as runner's BenchmarkPerfVeth does): ProcsLatency (send_lat
	// only, to compare like with like with sockperf's two
	// processes), ProcsAll (the default: two hosts are two processes, and
	// a WRITE responder alone in its process naps differently, see
	// engine.Options.SpinMax) or ProcsNone.
	Procs string
	// Daemon runs the four softrnic measurements again with the client's
	// QPs in a daemon (a third child, serving B's interface) and the
	// server in a child process: the daemon's rows.
	Daemon     bool
	CPUProfile string // CPU profile of the in-process softrnic phase ('' none)
	ProfDir    string // child processes: each end's CPU profile goes here ('' none)
}

// Values of Options.Procs.
const (
	ProcsLatency = "send_lat"
	ProcsAll     = "all"
	ProcsNone    = "none"
)

// DefaultOptions are what `make bench` runs: a few seconds per figure.
func DefaultOptions() Options {
	return Options{RawDuration: 2 * time.Second, Rounds: 3, WriteIters1: 20000, WriteIters4: 5000, SendIters: 200000,
		LatIters: 20000, SockperfSecs: 3, PerfTimeout: 90 * time.Second, Procs: ProcsAll, Daemon: true}
}

func loadavg() [3]float64 {
	b, _ := os.ReadFile("/proc/loadavg")
	l, _ := ParseLoadavg(string(b))
	return l
}

// Run makes the namespaces and the veth pair, measures everything on it in
// turn and removes them (also when a measurement fails: a failed figure is
// reported in its row, not as an error). It returns an error only when the
// pair cannot be made.
func Run(o Options, log io.Writer) (*Report, error) {
	rep := &Report{When: time.Now().UTC(), Kernel: iobench.Kernel(), CPUs: runtime.NumCPU(),
		Go: runtime.Version(), MTU: MTU, LoadStart: loadavg(),
		Note: "veth between two namespaces on this host, copy mode; both softrnic ends, the raw sender and receiver and softirq share the CPUs"}
	pair, err := netnstest.NewPair(netnstest.PairOptions{MTU: MTU})
	if err != nil {
		return nil, err
	}
	var once sync.Once
	closePair := func() (err error) { once.Do(func() { err = pair.Close() }); return err }
	current.Store(&pairCloser{close: closePair})
	defer func() {
		current.Store(nil)
		if err := closePair(); err != nil {
			fmt.Fprintln(log, "bench/rnic: removing the namespaces:", err)
		}
	}()

	// 1. Raw AF_XDP, the ceiling any engine on this port works under. The
	// rx-only rate at RawSize, which the WRITE goal is stated against, is
	// measured in each round of step 2 instead.
	raw := func(test string, size int) iobench.Result {
		r := iobench.Run(pair, iobench.Config{}, "afxdp", test, size, o.RawDuration, 0)
		if rep.XDPMode == "" && r.Mode != "" {
			rep.XDPMode = r.Mode
		}
		fmt.Fprintf(log, "raw afxdp %-8s %5d B: %s\n", test, size, iobench.Summary(r))
		return r
	}
	rep.Raw = append(rep.Raw, raw("tx-only", 64), raw("rx-only", 64), raw("tx-only", RawSize))

	// 2. softrnic against softrnic, through `softrnic perf`'s own code.
	profiling := false
	if o.CPUProfile != "" {
		if f, err := os.Create(o.CPUProfile); err != nil {
			fmt.Fprintln(log, "cpuprofile:", err)
		} else {
			defer func() {
				if err := f.Close(); err != nil {
					fmt.Fprintln(log, "cpuprofile:", err)
				}
			}()
			if err := pprof.StartCPUProfile(f); err != nil {
				fmt.Fprintln(log, "cpuprofile:", err)
			} else {
				profiling = true
			}
		}
	}
	cases := []struct {
		name, test string
		args       []string
	}{
		{Write1QP, "write_bw", []string{"-s", "65536", "-n", strconv.Itoa(o.WriteIters1)}},
		{Write4QP, "write_bw", []string{"-s", "65536", "-n", strconv.Itoa(o.WriteIters4), "-q", "4"}},
		{SendBW64, "send_bw", []string{"-s", "64", "-n", strconv.Itoa(o.SendIters)}},
		{SendLat, "send_lat", []string{"-s", "64", "-n", strconv.Itoa(o.LatIters)}},
	}
	type job struct {
		name, test string
		args       []string
		ends       string
	}
	var jobs []job
	for _, c := range cases {
		jobs = append(jobs, job{c.name, c.test, c.args, EndsInProcess})
	}
	for _, c := range cases {
		if o.Procs == ProcsAll || o.Procs == ProcsLatency && c.test == "send_lat" {
			jobs = append(jobs, job{c.name, c.test, c.args, EndsProcs})
		}
	}
	if o.Daemon {
		for _, c := range cases {
			jobs = append(jobs, job{c.name, c.test, c.args, EndsDaemon})
		}
	}
	run := func(j job) Perf {
		args := append([]string{"--report_gbits"}, j.args...)
		tc := tests[j.test]
		var p Perf
		switch j.ends {
		case EndsProcs:
			p = perfRunProcs(pair, j.name, j.test, tc.m, o.PerfTimeout, args, false, o.ProfDir)
			p.Name = j.name + ProcsSuffix
		case EndsDaemon:
			p = perfRunProcs(pair, j.name, j.test, tc.m, o.PerfTimeout, args, true, "")
			p.Name = j.name + DaemonSuffix
		default:
			p = perfRun(pair, j.name, tc.verb, tc.m, o.PerfTimeout, args)
		}
		p.Ends = j.ends
		p.Test = j.name
		if p.Error != "" {
			fmt.Fprintf(log, "softrnic %s: error: %s\n", p.Name, p.Error)
		} else if tc.m == perftest.Latency {
			fmt.Fprintf(log, "softrnic %s: half RTT p50 %.2f µs, p99 %.2f µs (%.1f s)\n", p.Name, p.LatP50Us, p.LatP99Us, p.Seconds)
		} else {
			fmt.Fprintf(log, "softrnic %s: %.2f Gbit/s, %.4f Mpps (%.1f s; %.2f Gbit per CPU-s)\n", p.Name, p.GoodputGbps, p.MsgRateMpps, p.Seconds, p.GbitPerCPUSec)
		}
		return p
	}
	// The WRITE goal compares two rates that each move by ±15 % from run
	// to run on this machine: measure them in Rounds interleaved rounds
	// (the raw rate, then each WRITE row) and keep each row's median round.
	isWrite := func(j job) bool { return j.name == Write1QP || j.name == Write4QP }
	rounds := max(o.Rounds, 1)
	var rawRounds, frameRounds []iobench.Result
	writeRounds := make(map[int][]Perf)
	for k := 0; k < rounds; k++ {
		if rounds > 1 {
			fmt.Fprintf(log, "round %d of %d: raw AF_XDP rx-only %d B and %d B, and the WRITE rows\n", k+1, rounds, RawSize, WriteFrame)
		}
		rawRounds = append(rawRounds, raw("rx-only", RawSize))
		frameRounds = append(frameRounds, raw("rx-only", WriteFrame))
		for i, j := range jobs {
			if isWrite(j) {
				writeRounds[i] = append(writeRounds[i], run(j))
			}
		}
	}
	rep.Raw = append(rep.Raw, median(rawRounds, rawRate), median(frameRounds, rawRate))
	rep.RawRounds, rep.RawFrameRounds = rawRounds, frameRounds
	for i, j := range jobs {
		var p Perf
		if isWrite(j) {
			p = medianPerf(writeRounds[i])
			fmt.Fprintf(log, "softrnic %s: median of %d rounds %.2f Gbit/s\n", p.Name, rounds, p.GoodputGbps)
		} else {
			if j.ends != EndsInProcess && profiling {
				pprof.StopCPUProfile() // the children profile themselves
				profiling = false
			}
			p = run(j)
		}
		rep.RNIC = append(rep.RNIC, p)
	}
	if profiling {
		pprof.StopCPUProfile()
	}

	// 3. The kernel's UDP ping-pong over the same veth.
	rep.Sockperf = sockperf(pair, o.SockperfSecs)
	if rep.Sockperf.Error != "" {
		fmt.Fprintf(log, "sockperf: error: %s\n", rep.Sockperf.Error)
	} else {
		fmt.Fprintf(log, "sockperf ping-pong 64 B: p50 %.2f µs, p99 %.2f µs\n", rep.Sockperf.P50Us, rep.Sockperf.P99Us)
	}

	rep.ComputeRatios()
	rep.LoadEnd = loadavg()
	return rep, nil
}

// perfRun runs one `softrnic perf` test, the server on A and the client on
// B, each on its own AF_XDP port, within timeout; it reads the client's
// result as runner's BenchmarkPerfVeth does.
func perfRun(pair *netnstest.Pair, name string, verb perftest.Verb, m perftest.Measure, timeout time.Duration, args []string) (p Perf) {
	p = Perf{Name: name, Args: args, QPs: 1}
	start, cpu0 := time.Now(), iobench.CPUTime()
	defer func() {
		p.Seconds = time.Since(start).Seconds()
		p.setCPU(iobench.CPUTime() - cpu0)
	}()
	ps, err := perftest.ParseArgs(verb, m, append([]string{"-d", pair.A.Name}, args...))
	if err != nil {
		p.Error = err.Error()
		return p
	}
	pc, err := perftest.ParseArgs(verb, m, append([]string{"-d", pair.B.Name, pair.A.Addr.String()}, args...))
	if err != nil {
		p.Error = err.Error()
		return p
	}
	p.Size, p.QPs = ps.Size, ps.QPs
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var sout, cout bytes.Buffer
	listening := make(chan struct{})
	serr := make(chan error, 1)
	go func() {
		serr <- pair.A.NS.Do(func() error {
			_, err := runner.RunCLI(ctx, ps, runner.CLIOptions{PortKind: host.AFXDP, Listening: func(net.Addr) { close(listening) }}, &sout)
			return err
		})
	}()
	select {
	case <-listening:
	case err := <-serr:
		p.Error = fmt.Sprintf("server: %v", err)
		return p
	case <-ctx.Done():
		p.Error = "server did not listen in time"
		return p
	}
	var res runner.Result
	cerr := pair.B.NS.Do(func() (err error) {
		res, err = runner.RunCLI(ctx, pc, runner.CLIOptions{PortKind: host.AFXDP, DialFor: 5 * time.Second}, &cout)
		return err
	})
	if cerr != nil {
		cancel()
	}
	if err := <-serr; err != nil || cerr != nil {
		p.Error = fmt.Sprintf("server: %v, client: %v", err, cerr)
		return p
	}
	fillPerf(&p, m, res)
	return p
}

// setCPU records the CPU time of a run and, for a bandwidth run, the
// payload bits it moved per CPU second.
func (p *Perf) setCPU(secs float64) {
	p.CPUSeconds = secs
	if secs > 0 && p.Error == "" && p.LatP50Us == 0 && p.Iters > 0 {
		p.GbitPerCPUSec = float64(p.Iters) * float64(p.Size) * 8 / 1e9 / secs
	}
}

// sockperf runs `sockperf server` in A and `sockperf ping-pong` (UDP, 64 B)
// from B to it, each bounded in time, and parses the client's report.
func sockperf(pair *netnstest.Pair, secs int) Sockperf {
	addr := pair.A.Addr.String()
	args := []string{"ping-pong", "-i", addr, "-m", "64", "-t", strconv.Itoa(secs)}
	s := Sockperf{Args: args}
	if _, err := exec.LookPath("sockperf"); err != nil {
		s.Error = "sockperf not installed (Debian package sockperf)"
		return s
	}
	limit := time.Duration(secs)*time.Second + 20*time.Second
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	ready := &waitFor{want: "block on socket", done: make(chan struct{})}
	srv := exec.CommandContext(ctx, "ip", "netns", "exec", pair.A.NS.Name, "sockperf", "server", "-i", addr)
	srv.Stdout, srv.Stderr = ready, ready
	if err := srv.Start(); err != nil {
		s.Error = err.Error()
		return s
	}
	defer func() {
		// sockperf's server runs until killed: its exit status is that.
		_ = srv.Process.Kill()
		_ = srv.Wait()
	}()
	select {
	case <-ready.done:
	case <-time.After(5 * time.Second):
		s.Error = "sockperf server did not start: " + ready.String()
		return s
	}
	var out bytes.Buffer
	cli := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", pair.B.NS.Name, "sockperf"}, args...)...)
	cli.Stdout, cli.Stderr = &out, &out
	if err := cli.Run(); err != nil {
		s.Error = fmt.Sprintf("sockperf ping-pong: %v: %s", err, lastLines(out.String(), 3))
		return s
	}
	r, err := ParseSockperf(out.String())
	r.Args = args
	if err != nil {
		r.Error = err.Error()
	}
	return r
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, " | ")
}

// waitFor collects a process's output and closes done once want appears.
type waitFor struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	want string
	done chan struct{}
	seen bool
}

func (w *waitFor) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.buf.Len() < 64<<10 {
		w.buf.Write(b)
	}
	if !w.seen && strings.Contains(w.buf.String(), w.want) {
		w.seen = true
		close(w.done)
	}
	return len(b), nil
}

func (w *waitFor) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return lastLines(w.buf.String(), 3)
}

// median is the round with the median rate (the lower middle one of an
// even count); rate gives a failed round -1, the slowest.
func median[T any](rounds []T, rate func(T) float64) T {
	s := slices.Clone(rounds)
	slices.SortStableFunc(s, func(a, b T) int { return cmp.Compare(rate(a), rate(b)) })
	return s[(len(s)-1)/2]
}

func rawRate(r iobench.Result) float64 {
	if r.Error != "" {
		return -1
	}
	return r.FramesPerSec
}

// medianPerf is the median round of a WRITE row, with every round's
// goodput in RoundsGbps.
func medianPerf(ps []Perf) Perf {
	m := median(ps, perfRate)
	m.RoundsGbps = nil
	for _, p := range ps {
		m.RoundsGbps = append(m.RoundsGbps, perfRate(p))
	}
	return m
}

func perfRate(p Perf) float64 {
	if p.Error != "" {
		return -1
	}
	return p.GoodputGbps
}

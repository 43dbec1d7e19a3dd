package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/internal/netnstest"
)

// test is one row: the perftest program, its arguments, and what is read
// from its result table.
type test struct {
	Name  string   `json:"name"`
	Prog  string   `json:"program"` // ib_send_lat, ...
	Args  []string `json:"args"`
	Lat   bool     `json:"latency"` // t_typical (the median) in µs; else BW average in Gb/s
	Goal  float64  `json:"goal"`    // the ratio's bound: at most (latency) or at least (bandwidth); 0 none
	Inner []float64
	Stock []float64
	Via   []float64 // softrnic perf through the same daemons
	// The client process's CPU time (user + system) in each run, seconds.
	InnerCPU, StockCPU, ViaCPU []float64
}

type report struct {
	When      time.Time  `json:"when"`
	LoadStart [3]float64 `json:"load_start"`
	LoadEnd   [3]float64 `json:"load_end"`
	Rounds    int        `json:"rounds"`
	MTU       int        `json:"mtu"`
	Rows      []row      `json:"rows"`
	Note      string     `json:"note"`
}

type row struct {
	Test     string    `json:"test"`
	Unit     string    `json:"unit"`
	InProc   []float64 `json:"in_process"`
	Stock    []float64 `json:"stock"`
	Daemon   []float64 `json:"perf_daemon"`
	InMedian float64   `json:"in_process_median"`
	StMedian float64   `json:"stock_median"`
	DMedian  float64   `json:"perf_daemon_median"`
	Ratio    float64   `json:"ratio"`
	Goal     string    `json:"goal"`
	Met      *bool     `json:"met,omitempty"`
	// The client process's CPU seconds (user + system), medians: in
	// process that includes its engine; through the daemons the
	// application's own polling, which shares the CPUs with the engines.
	InCPU    float64 `json:"in_process_client_cpu_s"`
	StockCPU float64 `json:"stock_client_cpu_s"`
	DCPU     float64 `json:"perf_daemon_client_cpu_s"`
}

func main() {
	bin := flag.String("softrnic", "bin/softrnic", "the softrnic binary")
	clib := flag.String("clib", "c/build/lib", "the drop-in libraries (make clib)")
	rounds := flag.Int("rounds", 3, "interleaved rounds")
	latN := flag.Int("lat-iters", 2000, "iterations of the latency test")
	bwN := flag.Int("bw-iters", 5000, "iterations of the 64-byte SEND bandwidth test")
	wN := flag.Int("write-iters", 2000, "iterations of the 64 KiB WRITE bandwidth test")
	jsonPath := flag.String("json", "out/bench-stock.json", "write the report here as JSON ('' to skip)")
	flag.Parse()
	fail := func(f string, a ...any) {
		fmt.Fprintf(os.Stderr, "bench/stock: "+f+"\n", a...)
		os.Exit(1)
	}
	if os.Geteuid() != 0 {
		fail("needs root (namespaces, XDP)")
	}
	var err error
	if *bin, err = filepath.Abs(*bin); err != nil {
		fail("%v", err)
	}
	if *clib, err = filepath.Abs(*clib); err != nil {
		fail("%v", err)
	}
	for _, p := range []string{"ib_send_lat", "ib_send_bw", "ib_write_bw"} {
		if _, err := exec.LookPath(p); err != nil {
			fail("%s: not installed (make deps)", p)
		}
	}
	tests := []*test{
		{Name: "send_lat -s 64", Prog: "ib_send_lat", Args: []string{"-s", "64", "-n", strconv.Itoa(*latN)}, Lat: true, Goal: 1.5},
		{Name: "send_bw -s 64", Prog: "ib_send_bw", Args: []string{"-s", "64", "-n", strconv.Itoa(*bwN)}},
		{Name: "write_bw -s 65536", Prog: "ib_write_bw", Args: []string{"-s", "65536", "-n", strconv.Itoa(*wN)}, Goal: 0.9},
	}
	rep := &report{When: time.Now().UTC(), LoadStart: loadavg(), Rounds: *rounds, MTU: 1500,
		Note: "both ends on this host in two namespaces joined by a veth (AF_XDP copy mode); stock: Debian's perftest through softrnic run on a daemon at each end; in process: softrnic perf at each end"}
	pair, err := netnstest.NewPair(netnstest.PairOptions{})
	if err != nil {
		fail("%v", err)
	}
	defer func() {
		if err := pair.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "removing the namespaces: %v\n", err)
		}
	}()
	b := &bench{bin: *bin, clib: *clib, pair: pair, port: 18700}
	for r := 1; r <= *rounds; r++ {
		for _, t := range tests {
			v, err := again(func() (float64, error) { return b.inProcess(t) }, fmt.Sprintf("round %d, %s in process", r, t.Name))
			if err != nil {
				fail("round %d, %s in process: %v", r, t.Name, err)
			}
			t.Inner = append(t.Inner, v)
			t.InnerCPU = append(t.InnerCPU, b.clientCPU)
		}
		stop, err := b.daemons()
		if err != nil {
			fail("round %d: daemons: %v", r, err)
		}
		for _, t := range tests {
			v, err := again(func() (float64, error) { return b.stock(t) }, fmt.Sprintf("round %d, %s through the daemons", r, t.Name))
			if err != nil {
				stop()
				fail("round %d, %s through the daemons: %v", r, t.Name, err)
			}
			t.Stock = append(t.Stock, v)
			t.StockCPU = append(t.StockCPU, b.clientCPU)
			v, err = again(func() (float64, error) { return b.viaDaemon(t) }, fmt.Sprintf("round %d, %s softrnic perf through the daemons", r, t.Name))
			if err != nil {
				stop()
				fail("round %d, %s softrnic perf through the daemons: %v", r, t.Name, err)
			}
			t.Via = append(t.Via, v)
			t.ViaCPU = append(t.ViaCPU, b.clientCPU)
		}
		stop()
		fmt.Fprintf(os.Stderr, "round %d of %d done\n", r, *rounds)
	}
	rep.LoadEnd = loadavg()
	fmt.Printf("Stock perftest through softrnic run (a daemon each end) and softrnic perf in process, same veth, %d interleaved rounds, medians\n", *rounds)
	fmt.Printf("load average at start %.2f %.2f %.2f, at end %.2f %.2f %.2f\n\n", rep.LoadStart[0], rep.LoadStart[1], rep.LoadStart[2], rep.LoadEnd[0], rep.LoadEnd[1], rep.LoadEnd[2])
	fmt.Printf("%-20s %-14s %12s %12s %12s %8s  %s\n", "test", "", "in process", "perf daemon", "stock", "ratio", "goal")
	for _, t := range tests {
		rw := row{Test: t.Name, InProc: t.Inner, Stock: t.Stock, Daemon: t.Via, InMedian: median(t.Inner), StMedian: median(t.Stock), DMedian: median(t.Via),
			InCPU: median(t.InnerCPU), StockCPU: median(t.StockCPU), DCPU: median(t.ViaCPU)}
		rw.Ratio = rw.StMedian / rw.InMedian
		what := "BW average, Gb/s"
		rw.Unit = "Gb/s"
		if t.Lat {
			what, rw.Unit = "p50 latency, µs", "us"
		}
		if t.Goal > 0 {
			met := rw.Ratio >= t.Goal
			rw.Goal = fmt.Sprintf("≥ %.1f×", t.Goal)
			if t.Lat {
				met = rw.Ratio <= t.Goal
				rw.Goal = fmt.Sprintf("≤ %.1f×", t.Goal)
			}
			rw.Met = &met
			if met {
				rw.Goal += " met"
			} else {
				rw.Goal += " NOT met"
			}
		}
		fmt.Printf("%-20s %-14s %12.3f %12.3f %12.3f %7.2f×  %s\n", t.Name, what, rw.InMedian, rw.DMedian, rw.StMedian, rw.Ratio, rw.Goal)
		rep.Rows = append(rep.Rows, rw)
	}
	fmt.Printf("\nclient process CPU, s (user + system, medians; in process it includes the engine)\n")
	for _, rw := range rep.Rows {
		fmt.Printf("%-35s %12.3f %12.3f %12.3f\n", rw.Test, rw.InCPU, rw.DCPU, rw.StockCPU)
	}
	if *jsonPath != "" {
		if err := os.MkdirAll(filepath.Dir(*jsonPath), 0o755); err != nil {
			fail("%v", err)
		}
		j, _ := json.MarshalIndent(rep, "", "  ")
		if err := os.WriteFile(*jsonPath, append(j, '\n'), 0o644); err != nil {
			fail("%v", err)
		}
	}
}

// again runs fn, and once more if it fails (a run that times out on a
// loaded host, RETRY_EXC_ERR at perftest's 67 ms timeout, says nothing of
// the rate when it runs); the failure is printed either way.
func again(fn func() (float64, error), what string) (float64, error) {
	v, err := fn()
	if err == nil {
		return v, nil
	}
	fmt.Fprintf(os.Stderr, "%s failed, running it again: %v\n", what, firstLines(err.Error(), 3))
	return fn()
}

func firstLines(s string, n int) string {
	l := strings.SplitN(s, "\n", n+1)
	return strings.Join(l[:min(n, len(l))], " | ")
}

type bench struct {
	bin, clib string
	pair      *netnstest.Pair
	port      int
	sockA     string
	sockB     string
	clientCPU float64 // the last run's client process's CPU seconds
}

// daemons starts a daemon at each end and returns what stops them.
func (b *bench) daemons() (stop func(), err error) {
	dir, err := os.MkdirTemp("", "bench-stock")
	if err != nil {
		return nil, err
	}
	var cmds []*exec.Cmd
	stop = func() {
		for _, c := range cmds {
			if err := c.Process.Signal(os.Interrupt); err != nil {
				fmt.Fprintf(os.Stderr, "stopping a daemon: %v\n", err)
			}
			_ = c.Wait() // the daemon's exit on SIGINT is no figure of the bench
		}
		if err := os.RemoveAll(dir); err != nil {
			fmt.Fprintf(os.Stderr, "%v\n", err)
		}
	}
	for i, l := range []netnstest.Link{b.pair.A, b.pair.B} {
		sock := filepath.Join(dir, fmt.Sprintf("ctl%d.sock", i))
		c := exec.Command("ip", "netns", "exec", l.NS.Name, b.bin, "daemon", "-d", l.Name, "--control", sock, "--port", "afxdp")
		if err := c.Start(); err != nil {
			stop()
			return nil, err
		}
		cmds = append(cmds, c)
		for deadline := time.Now().Add(20 * time.Second); ; {
			cl, err := client.Dial(sock)
			if err == nil {
				cl.Close()
				break
			}
			if time.Now().After(deadline) {
				stop()
				return nil, fmt.Errorf("daemon on %s never answered: %w", l.Name, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		if i == 0 {
			b.sockA = sock
		} else {
			b.sockB = sock
		}
	}
	return stop, nil
}

// inProcess runs t with softrnic perf at both ends.
func (b *bench) inProcess(t *test) (float64, error) {
	name := strings.TrimPrefix(t.Prog, "ib_")
	side := func(l netnstest.Link) []string {
		return []string{"netns", "exec", l.NS.Name, b.bin, "perf", name, "-d", l.Name}
	}
	return b.run(t, side(b.pair.B), side(b.pair.A))
}

// viaDaemon runs t with softrnic perf at both ends through the same
// daemons (its memory a memfd the daemon maps: no copies), which tells
// what of the stock programs' figures is the daemon's and what the
// library's and the copies'.
func (b *bench) viaDaemon(t *test) (float64, error) {
	name := strings.TrimPrefix(t.Prog, "ib_")
	side := func(l netnstest.Link, sock string) []string {
		return []string{"netns", "exec", l.NS.Name, b.bin, "perf", name, "--daemon", sock}
	}
	return b.run(t, side(b.pair.B, b.sockB), side(b.pair.A, b.sockA))
}

// stock runs t with the stock program through softrnic run at both ends.
func (b *bench) stock(t *test) (float64, error) {
	side := func(l netnstest.Link, sock string) []string {
		return []string{"netns", "exec", l.NS.Name, b.bin, "run", "--lib", b.clib, "--control", sock, "--", t.Prog}
	}
	return b.run(t, side(b.pair.B, b.sockB), side(b.pair.A, b.sockA))
}

// run runs server then client (ip ARGS...) with t's arguments and returns
// the client's figure.
func (b *bench) run(t *test, srv, cli []string) (float64, error) {
	b.port++
	args := append(append([]string{}, t.Args...), "-F", "--report_gbits", "-p", strconv.Itoa(b.port))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s := exec.CommandContext(ctx, "ip", append(srv, args...)...)
	var sout strings.Builder
	s.Stdout, s.Stderr = &sout, &sout
	if err := s.Start(); err != nil {
		return 0, err
	}
	done := make(chan error, 1)
	go func() { done <- s.Wait() }()
	for listening := false; !listening; {
		select {
		case err := <-done:
			return 0, fmt.Errorf("server exited: %w\n%s", err, sout.String())
		case <-time.After(50 * time.Millisecond):
		}
		out, _ := exec.Command("ip", "netns", "exec", b.pair.B.NS.Name, "ss", "-Hltn", "sport = :"+strconv.Itoa(b.port)).Output()
		listening = len(strings.TrimSpace(string(out))) > 0
	}
	c := exec.CommandContext(ctx, "ip", append(append(cli, args...), b.pair.B.Addr.String())...)
	cout, cerr := c.CombinedOutput()
	b.clientCPU = 0
	if ps := c.ProcessState; ps != nil {
		// ip netns exec and softrnic run both exec: this is the program's.
		b.clientCPU = (ps.UserTime() + ps.SystemTime()).Seconds()
	}
	serr := <-done
	if cerr != nil || serr != nil {
		return 0, fmt.Errorf("client %w, server %w\nclient:\n%s\nserver:\n%s", cerr, serr, cout, sout.String())
	}
	return figure(string(cout), t.Lat)
}

// figure reads perftest's result table: t_typical (the median, µs) of a
// latency test, BW average of a bandwidth test.
func figure(out string, lat bool) (float64, error) {
	lines := strings.Split(out, "\n")
	for i, l := range lines {
		if !strings.Contains(l, "#bytes") || i+1 >= len(lines) {
			continue
		}
		head, f := strings.Fields(l), strings.Fields(lines[i+1])
		want := "BW average"
		if lat {
			want = "t_typical"
		}
		col := slices.IndexFunc(head, func(h string) bool { return strings.HasPrefix(h, strings.Fields(want)[0]) })
		if !lat {
			// "BW peak[Gb/sec]" and "BW average[Gb/sec]" are two words each.
			col = -1
			for k := 0; k+1 < len(head); k++ {
				if head[k] == "BW" && strings.HasPrefix(head[k+1], "average") {
					col = 2 + (k-2)/2
				}
			}
		}
		if col < 0 || col >= len(f) {
			continue
		}
		return strconv.ParseFloat(f[col], 64)
	}
	return 0, errors.New("no result table:\n" + out)
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

func loadavg() [3]float64 {
	var l [3]float64
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	for i := 0; i < 3 && i < len(f); i++ {
		l[i], _ = strconv.ParseFloat(f[i], 64)
	}
	return l
}

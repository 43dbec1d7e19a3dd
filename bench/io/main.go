package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/softrnic/softrnic/bench/internal/iobench"
	"github.com/softrnic/softrnic/bpf"
	"github.com/softrnic/softrnic/internal/netnstest"
)

// current is the pair in use, for the signal handler to remove.
var current atomic.Pointer[netnstest.Pair]

func main() {
	dur := flag.Duration("duration", 2*time.Second, "duration of each rate test")
	pings := flag.Int("pings", 20000, "round trips per ping-pong test (bounded by 2×duration)")
	jsonPath := flag.String("json", "out/bench-io.json", "write results here as JSON ('' to skip)")
	sizesF := flag.String("sizes", "64,1024,4096", "frame sizes in bytes")
	portsF := flag.String("ports", "afxdp,afpacket", "ports to measure")
	testsF := flag.String("tests", "tx-only,tx-threaded,rx-only,rx-gen,ping-pong", "tests to run (rx-gen: AF_XDP only)")
	xdpMode := flag.String("xdp-mode", "auto", "AF_XDP attach mode: auto, driver or generic")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run here")
	var cfg iobench.Config
	flag.BoolVar(&cfg.TxPort, "tx-port", false, "tx-only: the peer is a port that does not read, not the counting XDP sink")
	flag.DurationVar(&cfg.BusyPoll, "busy-poll", 0, "AF_XDP: SO_BUSY_POLL time (0: off), with SO_PREFER_BUSY_POLL")
	flag.Parse()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench/io:", err)
			os.Exit(1)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, "bench/io:", err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}
	switch *xdpMode {
	case "auto":
	case "driver":
		cfg.XDPAttach = bpf.DriverMode
	case "generic":
		cfg.XDPAttach = bpf.GenericMode
	default:
		fmt.Fprintf(os.Stderr, "bench/io: bad -xdp-mode %q\n", *xdpMode)
		os.Exit(2)
	}
	// Interrupted (Ctrl-C, a closed pipe): remove the namespaces first.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM, syscall.SIGPIPE, syscall.SIGHUP)
	go func() {
		s := <-sig
		if p := current.Load(); p != nil {
			_ = p.Close() // best effort on the way out
		}
		fmt.Fprintln(os.Stderr, "bench/io: stopped by", s)
		os.Exit(130)
	}()
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "bench/io: needs root (network namespaces, veth, XDP)")
		os.Exit(2)
	}
	var sizes []int
	for _, s := range strings.Split(*sizesF, ",") {
		var v int
		if _, err := fmt.Sscan(s, &v); err != nil || v < 60 {
			fmt.Fprintf(os.Stderr, "bench/io: bad size %q (minimum 60)\n", s)
			os.Exit(2)
		}
		sizes = append(sizes, v)
	}
	rep := iobench.Report{
		When: time.Now().UTC(), Kernel: iobench.Kernel(), CPUs: runtime.NumCPU(),
		Go: runtime.Version(), Duration: dur.String(),
		Note: "veth between two namespaces on this host; sender, receiver and softirq share the CPUs",
	}
	for _, size := range sizes {
		// 4 KiB frames need a jumbo MTU; keep 1500 otherwise so that the
		// AF_XDP port uses single-buffer frames as it would in production.
		mtu := 1500
		if size > 1514 {
			mtu = size + 100
		}
		pair, err := netnstest.NewPair(netnstest.PairOptions{MTU: mtu})
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench/io:", err)
			os.Exit(1)
		}
		current.Store(pair)
		for _, kind := range strings.Split(*portsF, ",") {
			for _, test := range strings.Split(*testsF, ",") {
				if test == "rx-gen" && (kind != "afxdp" || size > bpf.MaxGeneratorFrame) {
					continue // the generator feeds only an XDP receive path, with frames that fit a page
				}
				r := iobench.Run(pair, cfg, kind, test, size, *dur, *pings)
				rep.Results = append(rep.Results, r)
				fmt.Fprintf(os.Stderr, "%-8s %-9s %5d B: %s\n", kind, test, size, iobench.Summary(r))
			}
		}
		current.Store(nil)
		if err := pair.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "bench/io: removing the namespaces:", err)
		}
	}
	iobench.PrintTable(os.Stdout, rep)
	if *jsonPath != "" {
		b, _ := json.MarshalIndent(rep, "", "  ")
		if err := os.MkdirAll(filepath.Dir(*jsonPath), 0o755); err != nil {
			fmt.Fprintln(os.Stderr, "bench/io:", err)
			os.Exit(1)
		}
		if err := os.WriteFile(*jsonPath, append(b, '\n'), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "bench/io:", err)
			os.Exit(1)
		}
		fmt.Println("wrote", *jsonPath)
	}
}

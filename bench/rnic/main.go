package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"time"
)

// current is the namespace pair in use, for the signal handler and the
// watchdog to remove.
var current atomic.Pointer[pairCloser]

type pairCloser struct{ close func() error }

func main() {
	if childMain() {
		return
	}
	o := DefaultOptions()
	jsonPath := flag.String("json", "out/bench-rnic.json", "write the report here as JSON ('' to skip)")
	flag.DurationVar(&o.RawDuration, "raw-duration", o.RawDuration, "duration of each raw AF_XDP rate test")
	flag.IntVar(&o.Rounds, "rounds", o.Rounds, "interleaved rounds of the raw rx-only 4 KiB rate and the WRITE rows (each row shows its median round)")
	flag.IntVar(&o.WriteIters1, "write-iters", o.WriteIters1, "64 KiB WRITEs with 1 QP")
	flag.IntVar(&o.WriteIters4, "write-iters-4qp", o.WriteIters4, "64 KiB WRITEs per QP with 4 QPs (perftest's -n is per QP)")
	flag.IntVar(&o.SendIters, "send-iters", o.SendIters, "64 B SENDs for the message rate")
	flag.IntVar(&o.LatIters, "lat-iters", o.LatIters, "64 B SEND round trips for the latency")
	flag.IntVar(&o.SockperfSecs, "sockperf-time", o.SockperfSecs, "seconds of sockperf ping-pong")
	flag.DurationVar(&o.PerfTimeout, "perf-timeout", o.PerfTimeout, "time limit of each softrnic perf run")
	flag.StringVar(&o.Procs, "procs", o.Procs, "softrnic measurements also run with one process per end: send_lat, all or none")
	flag.BoolVar(&o.Daemon, "daemon", o.Daemon, "softrnic measurements also run with the client through a daemon")
	flag.StringVar(&o.CPUProfile, "cpuprofile", "", "write a CPU profile of the in-process softrnic runs here")
	flag.StringVar(&o.ProfDir, "profdir", "", "each softrnic child process (-procs) writes its CPU profile into this directory")
	total := flag.Duration("timeout", 8*time.Minute, "time limit of the whole run")
	flag.Parse()
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "bench/rnic: needs root (network namespaces, veth, XDP)")
		os.Exit(2)
	}
	// Interrupted, or over time: remove the namespaces before leaving.
	bail := func(why string) {
		if p := current.Load(); p != nil {
			_ = p.close() // best effort on the way out
		}
		fmt.Fprintln(os.Stderr, "bench/rnic:", why)
		os.Exit(130)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM, syscall.SIGPIPE, syscall.SIGHUP)
	go func() { bail(fmt.Sprint("stopped by ", <-sig)) }()
	time.AfterFunc(*total, func() { bail(fmt.Sprintf("gave up after %v (-timeout)", *total)) })

	rep, err := Run(o, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench/rnic:", err)
		os.Exit(1)
	}
	PrintTable(os.Stdout, rep)
	if *jsonPath != "" {
		if err := writeJSON(*jsonPath, rep); err != nil {
			fmt.Fprintln(os.Stderr, "bench/rnic:", err)
			os.Exit(1)
		}
		fmt.Println("wrote", *jsonPath)
	}
}

func writeJSON(path string, rep *Report) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

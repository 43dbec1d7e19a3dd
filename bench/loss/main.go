package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	o := DefaultOptions()
	jsonPath := flag.String("json", "out/bench-loss.json", "write the report here as JSON ('' to skip)")
	flag.StringVar(&o.Bin, "softrnic", o.Bin, "the softrnic binary to measure")
	flag.DurationVar(&o.Duration, "duration", o.Duration, "length of each perf run (-D, whole seconds)")
	flag.DurationVar(&o.Grace, "grace", o.Grace, "a run still going this long after its duration is killed and marked timeout")
	tables := flag.String("tables", "loss,qps,daemon", "which tables to measure: loss, qps, daemon")
	flag.IntVar(&o.LossMTU, "loss-mtu", o.LossMTU, "MTU of the lossy path's links")
	losses := flag.String("loss", ints(o.Losses), "loss rates each way, per mille (0 is always measured: the ratios' base)")
	timeouts := flag.String("u", ints(o.Timeouts), "local ACK timeouts (perftest -u) of the loss table")
	flag.IntVar(&o.Rounds, "rounds", o.Rounds, "interleaved rounds of the loss table")
	modes := flag.String("modes", DefaultModes, "retransmission modes of the loss table: NAME=FLAGS;... (FLAGS for both perf ends, space separated)")
	qps := flag.String("qps", ints(o.QPs), "QP counts of the QP table")
	mtus := flag.String("mtus", ints(o.MTUs), "MTUs of the QP table")
	flag.IntVar(&o.QPRounds, "qp-rounds", o.QPRounds, "rounds of the QP table")
	flag.IntVar(&o.Hogs, "hogs", o.Hogs, "CPU hogs (busy loops) running throughout the QP table: how many QPs still complete on a loaded host")
	qpFlags := flag.String("qp-flags", "", "more perf flags of both ends in the QP table (not the daemon run), space separated (e.g. '--cc dcqcn': the receiver's host congestion signal needs DCQCN)")
	flag.IntVar(&o.DaemonQPs, "daemon-qps", o.DaemonQPs, "QPs of the daemon-receiver run")
	flag.IntVar(&o.DaemonMTU, "daemon-mtu", o.DaemonMTU, "MTU of the daemon-receiver run")
	total := flag.Duration("timeout", 15*time.Minute, "time limit of the whole run")
	flag.Parse()

	fail := func(code int, f string, a ...any) {
		fmt.Fprintf(os.Stderr, "bench/loss: "+f+"\n", a...)
		os.Exit(code)
	}
	var err error
	if o.Losses, err = parseInts(*losses); err != nil {
		fail(2, "-loss: %v", err)
	}
	if !containsInt(o.Losses, 0) {
		o.Losses = append([]int{0}, o.Losses...)
	}
	if o.Timeouts, err = parseInts(*timeouts); err != nil {
		fail(2, "-u: %v", err)
	}
	o.QPFlags = strings.Fields(*qpFlags)
	if o.QPs, err = parseInts(*qps); err != nil {
		fail(2, "-qps: %v", err)
	}
	if o.MTUs, err = parseInts(*mtus); err != nil {
		fail(2, "-mtus: %v", err)
	}
	if o.Modes, err = ParseModes(*modes); err != nil {
		fail(2, "-modes: %v", err)
	}
	want := map[string]bool{}
	for _, t := range strings.Split(*tables, ",") {
		switch t = strings.TrimSpace(t); t {
		case "loss", "qps", "daemon":
			want[t] = true
		default:
			fail(2, "-tables: unknown table %q", t)
		}
	}
	o.Loss, o.QPTable = want["loss"], want["qps"]
	if !want["daemon"] {
		o.DaemonQPs = 0
	}
	if o.Duration < time.Second {
		fail(2, "-duration: at least 1s")
	}
	if os.Geteuid() != 0 {
		fail(2, "needs root (network namespaces, veth, XDP)")
	}
	if st, err := os.Stat(o.Bin); err != nil || st.Mode()&0o111 == 0 {
		fail(2, "no softrnic binary at %s (make build, or -softrnic PATH)", o.Bin)
	}
	if o.Bin, err = filepath.Abs(o.Bin); err != nil {
		fail(2, "%v", err)
	}

	// Interrupted, or over time: end the perf processes and remove the
	// namespaces before leaving.
	bail := func(why string) {
		killChildren()
		if c := current.Load(); c != nil {
			_ = (*c)() // best effort on the way out
		}
		fail(130, "%s", why)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM, syscall.SIGPIPE, syscall.SIGHUP)
	go func() { bail(fmt.Sprint("stopped by ", <-sig)) }()
	time.AfterFunc(*total, func() { bail(fmt.Sprintf("gave up after %v (-timeout)", *total)) })

	rep, err := Measure(o, os.Stderr)
	if err != nil {
		killChildren()
		fail(1, "%v", err)
	}
	PrintTable(os.Stdout, rep)
	if *jsonPath != "" {
		if err := writeJSON(*jsonPath, rep); err != nil {
			fail(1, "%v", err)
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

func parseInts(s string) ([]int, error) {
	var v []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 {
			return nil, fmt.Errorf("bad number %q", f)
		}
		v = append(v, n)
	}
	return v, nil
}

func ints(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}

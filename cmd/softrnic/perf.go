package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/softrnic/softrnic/engine"
	"github.com/softrnic/softrnic/perftest"
	"github.com/softrnic/softrnic/perftest/runner"
)

func init() {
	register("perf", "perftest-compatible benchmarks: write_bw, read_bw, send_bw, atomic_bw and their _lat", runPerf)
}

// perfTests maps perf's subcommands to perftest programs.
var perfTests = map[string]struct {
	verb perftest.Verb
	m    perftest.Measure
}{
	"write_bw": {perftest.Write, perftest.BW}, "write_lat": {perftest.Write, perftest.Latency},
	"read_bw": {perftest.Read, perftest.BW}, "read_lat": {perftest.Read, perftest.Latency},
	"send_bw": {perftest.Send, perftest.BW}, "send_lat": {perftest.Send, perftest.Latency},
	"atomic_bw": {perftest.Atomic, perftest.BW}, "atomic_lat": {perftest.Atomic, perftest.Latency},
}

func perfUsage() {
	fmt.Fprint(os.Stderr, `usage: softrnic perf TEST -d INTERFACE [flags]          (server)
       softrnic perf TEST -d INTERFACE [flags] SERVER   (client)

TEST is write_bw, write_lat, read_bw, read_lat, send_bw, send_lat, atomic_bw
or atomic_lat. Either end may be a stock perftest (ib_write_bw, ...) on a
ConnectX or rxe host: the side channel is perftest's own, byte for byte.

flags (perftest's):
`+perftest.Usage+`
SOFTRNIC_PORT=afxdp|afpacket|auto chooses the packet I/O (default auto:
AF_XDP, else AF_PACKET).
`)
}

func runPerf(args []string) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" {
		perfUsage()
		return 2
	}
	tt, ok := perfTests[args[0]]
	if !ok {
		fmt.Fprintf(os.Stderr, "softrnic perf: unknown test %q\n\n", args[0])
		perfUsage()
		return 2
	}
	p, err := perftest.ParseArgs(tt.verb, tt.m, args[1:])
	if errors.Is(err, perftest.ErrHelp) {
		perfUsage()
		return 0
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "softrnic perf: %v\n", err)
		return 2
	}
	kind := engine.PortKind(strings.ToLower(os.Getenv("SOFTRNIC_PORT")))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	run := runner.RunCLI
	if p.RDMACM {
		run = runner.RunCLICM // -R: control channel and QPs through rdma_cm, no TCP
	}
	if _, err := run(ctx, p, runner.CLIOptions{PortKind: kind, DialFor: 3 * time.Second}, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "softrnic perf %s: %v\n", args[0], err)
		return 1
	}
	return 0
}

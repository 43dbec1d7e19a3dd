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

	"github.com/softrnic/softrnic/daemon/proto"
	"github.com/softrnic/softrnic/host"
	"github.com/softrnic/softrnic/internal/perftest"
	"github.com/softrnic/softrnic/internal/perftest/runner"
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
       softrnic perf TEST --daemon SOCKET [flags] [SERVER]

TEST is write_bw, write_lat, read_bw, read_lat, send_bw, send_lat, atomic_bw
or atomic_lat. Either end may be a stock perftest (ib_write_bw, ...) on a
ConnectX or rxe host: the side channel is perftest's own, byte for byte.

flags (perftest's):
`+perftest.Usage+`
      --daemon=SOCKET    run the QPs in the softrnic daemon listening on
                         SOCKET (its control socket, e.g. `+proto.DefaultControl+`)
                         instead of opening INTERFACE here; -d is then optional
                         and must name the daemon's interface; with -R
                         the daemon's rdma_cm connects them (RC) or
                         answers SIDR with them (-c UD)

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
	rest, daemonSock, err := cutDaemonFlag(args[1:])
	if err != nil {
		fmt.Fprintf(os.Stderr, "softrnic perf: %v\n", err)
		return 2
	}
	p, err := perftest.ParseArgs(tt.verb, tt.m, rest)
	if errors.Is(err, perftest.ErrHelp) {
		perfUsage()
		return 0
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "softrnic perf: %v\n", err)
		return 2
	}
	kind := host.PortKind(strings.ToLower(os.Getenv("SOFTRNIC_PORT")))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	run := runner.RunCLI
	if p.RDMACM {
		// -R: control channel and QPs through rdma_cm, no TCP; with
		// --daemon through the daemon's CM agent.
		run = runner.RunCLICM
	}
	if _, err := run(ctx, p, runner.CLIOptions{PortKind: kind, DialFor: 3 * time.Second, Daemon: daemonSock}, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "softrnic perf %s: %v\n", args[0], err)
		return 1
	}
	return 0
}

// cutDaemonFlag takes --daemon SOCKET (or --daemon=SOCKET) out of args,
// which perftest's parser would not know, and returns the rest.
func cutDaemonFlag(args []string) (rest []string, socket string, err error) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--daemon":
			if i+1 == len(args) || args[i+1] == "" {
				return nil, "", errors.New("--daemon needs the daemon's control socket")
			}
			socket = args[i+1]
			i++
		case strings.HasPrefix(a, "--daemon="):
			if socket = strings.TrimPrefix(a, "--daemon="); socket == "" {
				return nil, "", errors.New("--daemon needs the daemon's control socket")
			}
		default:
			rest = append(rest, a)
		}
	}
	return rest, socket, nil
}

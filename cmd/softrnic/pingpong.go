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

	"github.com/softrnic/softrnic/host"
	"github.com/softrnic/softrnic/internal/pingpong"
)

func init() {
	register("pingpong", "rdma-core's ibv_rc_pingpong / ibv_ud_pingpong: pingpong rc|ud -d IFACE [flags] [SERVER]", runPingpong)
}

func pingpongUsage() {
	fmt.Fprint(os.Stderr, `usage: softrnic pingpong rc|ud -d INTERFACE [flags]          (server)
       softrnic pingpong rc|ud -d INTERFACE [flags] SERVER   (client)
       softrnic pingpong rc|ud --daemon SOCKET [flags] [SERVER]

rc and ud are rdma-core's ibv_rc_pingpong and ibv_ud_pingpong: either end
may be the stock tool on an rxe or ConnectX host (same side channel, same
--chk pattern, same report lines). A RoCE peer needs -g on both ends.

flags (the stock tools'):
`+pingpong.Usage+`
      --daemon=SOCKET    run the QP in the softrnic daemon listening on
                         SOCKET instead of a device of this process

SOFTRNIC_PORT=afxdp|afpacket|auto chooses the packet I/O (default auto).
`)
}

func runPingpong(args []string) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" {
		pingpongUsage()
		return 2
	}
	var t pingpong.Transport
	switch args[0] {
	case "rc":
		t = pingpong.RC
	case "ud":
		t = pingpong.UD
	default:
		fmt.Fprintf(os.Stderr, "softrnic pingpong: unknown transport %q (rc or ud)\n\n", args[0])
		pingpongUsage()
		return 2
	}
	rest, daemonSock, err := cutDaemonFlag(args[1:])
	if err != nil {
		fmt.Fprintf(os.Stderr, "softrnic pingpong: %v\n", err)
		return 2
	}
	p, err := pingpong.ParseArgs(t, rest)
	if errors.Is(err, pingpong.ErrHelp) {
		pingpongUsage()
		return 0
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "softrnic pingpong: %v\n", err)
		return 2
	}
	if p.Device == "" && daemonSock == "" {
		fmt.Fprintf(os.Stderr, "softrnic pingpong: -d INTERFACE is required (the network interface to run RoCE on)\n")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	kind := host.PortKind(strings.ToLower(os.Getenv("SOFTRNIC_PORT")))
	if _, err := pingpong.RunCLI(ctx, p, pingpong.CLIOptions{PortKind: kind, DialFor: 3 * time.Second, Daemon: daemonSock}, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "softrnic pingpong %s: %v\n", args[0], err)
		return 1
	}
	return 0
}

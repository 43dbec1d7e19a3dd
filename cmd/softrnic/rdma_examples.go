package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/softrnic/softrnic/engine"
	"github.com/softrnic/softrnic/rdmacm"
	"github.com/softrnic/softrnic/rdmacm/examples"
)

func init() {
	register("rdma_server", "librdmacm's rdma_server over the CM on QP1: -s ADDR or -d IFACE [-p PORT]", func(args []string) int { return runRDMAExample(args, false) })
	register("rdma_client", "librdmacm's rdma_client over the CM on QP1: -s SERVER [-p PORT]", func(args []string) int { return runRDMAExample(args, true) })
}

// rdmaExampleArgs parses the stock tools' -s and -p, plus -d IFACE (the
// server's -s is the address to serve on, which picks the interface).
func rdmaExampleArgs(args []string, client bool) (cmHost, uint16, error) {
	fs := flag.NewFlagSet("rdma_example", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	addr := fs.String("s", "", "")
	port := fs.Uint("p", examples.DefaultPort, "")
	iface := fs.String("d", "", "")
	if err := fs.Parse(args); err != nil {
		return cmHost{}, 0, err
	}
	h := cmHost{iface: *iface, client: client, kind: engine.PortKind(strings.ToLower(os.Getenv("SOFTRNIC_PORT")))}
	if *addr != "" {
		a, err := netip.ParseAddr(*addr)
		if err != nil {
			return h, 0, fmt.Errorf("bad address %q", *addr)
		}
		h.addr = a.Unmap()
	}
	if client && !h.addr.IsValid() {
		return h, 0, errors.New("-s SERVER is required")
	}
	if *port == 0 || *port > 65535 || fs.NArg() > 0 {
		return h, 0, errors.New("usage: [-s ADDR] [-p PORT] [-d IFACE]")
	}
	return h, uint16(*port), nil
}

func runRDMAExample(args []string, client bool) int {
	h, port, err := rdmaExampleArgs(args, client)
	if err != nil {
		fmt.Fprintf(os.Stderr, "softrnic: %v\n", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err = withCMAgent(ctx, h, func(a *rdmacm.Agent) error {
		if client {
			return examples.Client(ctx, a, h.addr, port, os.Stdout)
		}
		return examples.Server(ctx, a, port, os.Stdout, nil)
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "softrnic: %v\n", err)
		return 1
	}
	return 0
}

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

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/host"
	"github.com/softrnic/softrnic/internal/rdmacm/examples"
	"github.com/softrnic/softrnic/rdmacm"
	"github.com/softrnic/softrnic/verbs"
)

func init() {
	register("rdma_server", "librdmacm's rdma_server over the CM on QP1: -s ADDR or -d IFACE [-p PORT] [--daemon SOCKET]", func(args []string) int { return runRDMAExample(args, false) })
	register("rdma_client", "librdmacm's rdma_client over the CM on QP1: -s SERVER [-p PORT] [--daemon SOCKET]", func(args []string) int { return runRDMAExample(args, true) })
}

// rdmaExampleArgs parses the stock tools' -s and -p, plus -d IFACE (the
// server's -s is the address to serve on, which picks the interface) and
// --daemon SOCKET (run through a softrnic daemon).
func rdmaExampleArgs(args []string, client bool) (cmHost, uint16, string, error) {
	fs := flag.NewFlagSet("rdma_example", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	addr := fs.String("s", "", "")
	port := fs.Uint("p", examples.DefaultPort, "")
	iface := fs.String("d", "", "")
	daemonSock := fs.String("daemon", "", "")
	var cc host.CCFlags
	cc.Register(fs)
	if err := fs.Parse(args); err != nil {
		return cmHost{}, 0, "", err
	}
	h := cmHost{iface: *iface, client: client, kind: host.PortKind(strings.ToLower(os.Getenv("SOFTRNIC_PORT"))), cc: cc}
	if _, err := cc.Congestion(); err != nil {
		return h, 0, "", err
	}
	if *daemonSock != "" && (cc.CC != "" || cc.DCQCN != "" || cc.Scale != 1) {
		return h, 0, "", errors.New("--cc and --daemon exclude each other: congestion control is the daemon's to configure")
	}
	if *addr != "" {
		a, err := netip.ParseAddr(*addr)
		if err != nil {
			return h, 0, "", fmt.Errorf("bad address %q", *addr)
		}
		h.addr = a.Unmap()
	}
	if client && !h.addr.IsValid() {
		return h, 0, "", errors.New("-s SERVER is required")
	}
	if *port == 0 || *port > 65535 || fs.NArg() > 0 {
		return h, 0, "", errors.New("usage: [-s ADDR] [-p PORT] [-d IFACE] [--daemon SOCKET] [--cc ALGO[:PROFILE] [--cc-scale S]]")
	}
	return h, uint16(*port), *daemonSock, nil
}

func runRDMAExample(args []string, isClient bool) int {
	h, port, daemonSock, err := rdmaExampleArgs(args, isClient)
	if err != nil {
		fmt.Fprintf(os.Stderr, "softrnic: %v\n", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	run := func(dev verbs.Device, cm rdmacm.CM) error {
		if isClient {
			return examples.Client(ctx, dev, cm, h.addr, port, os.Stdout)
		}
		return examples.Server(ctx, dev, cm, port, os.Stdout, nil)
	}
	if daemonSock != "" {
		var c *client.Client
		if c, err = client.Dial(daemonSock); err == nil {
			err = run(c, c)
			c.Close()
		}
	} else {
		err = withCMAgent(h, func(a *rdmacm.Agent) error { return run(a.Device(), a) })
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "softrnic: %v\n", err)
		return 1
	}
	return 0
}

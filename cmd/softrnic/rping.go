package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/host"
	cmrping "github.com/softrnic/softrnic/internal/cm/rping"
	"github.com/softrnic/softrnic/internal/rdmacm/rping"
	"github.com/softrnic/softrnic/rdmacm"
)

func init() {
	register("rping", "librdmacm's rping over the CM on QP1: -s (server) or -c -a ADDR (client)", runRping)
}

const rpingUsage = `usage: softrnic rping -s [-a ADDR] [-p PORT] [-S SIZE] [-v] [-V] [-d IFACE]   (server)
       softrnic rping -c -a ADDR [-p PORT] [-C COUNT] [-S SIZE] [-v] [-V] [-d IFACE]   (client)

librdmacm's rping, wire-compatible with the stock tool on rxe or a ConnectX:
the connection goes through the IB CM on QP1 (rdma_cm TCP port space), then
the server RDMA READs the client's buffer and RDMA WRITEs it back, COUNT
times. The server serves one client and exits when it disconnects.

  -s          server
  -c          client
  -a ADDR     client: the server's address; server: the address to serve on
              (picks the interface when -d is not given)
  -p PORT     rdma_cm port (default 7174)
  -C COUNT    pings (client; default: until interrupted)
  -S SIZE     ping buffer size, 26..65535 (default 64)
  -v          print each ping's data
  -V          verify each ping's data (exit 1 on a mismatch)
  -d IFACE    network interface to run RoCE on (default: the one routing
              to -a)
  --daemon SOCKET
              run through the softrnic daemon with this control socket: its
              CM agent makes the connection and its device the QP (no -d)

SOFTRNIC_PORT=afxdp|afpacket|auto chooses the packet I/O (default auto).
`

// rpingArgs are the parsed flags.
type rpingArgs struct {
	server, client bool
	addr           netip.Addr
	iface          string
	opts           rping.Options
	kind           host.PortKind
	daemon         string // --daemon: the daemon's control socket
	cc             host.CCFlags
}

func parseRping(args []string) (rpingArgs, error) {
	var r rpingArgs
	fs := flag.NewFlagSet("rping", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.BoolVar(&r.server, "s", false, "")
	fs.BoolVar(&r.client, "c", false, "")
	addr := fs.String("a", "", "")
	port := fs.Uint("p", 7174, "")
	fs.IntVar(&r.opts.Count, "C", 0, "")
	fs.IntVar(&r.opts.Size, "S", 64, "")
	fs.BoolVar(&r.opts.Verbose, "v", false, "")
	fs.BoolVar(&r.opts.Validate, "V", false, "")
	fs.StringVar(&r.iface, "d", "", "")
	fs.StringVar(&r.daemon, "daemon", "", "")
	r.cc.Register(fs)
	if err := fs.Parse(args); err != nil {
		return r, err
	}
	if fs.NArg() > 0 {
		return r, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if r.daemon != "" && (r.cc.CC != "" || r.cc.DCQCN != "" || r.cc.Scale != 1) {
		return r, errors.New("--cc and --daemon exclude each other: congestion control is the daemon's to configure")
	}
	if _, err := r.cc.Congestion(); err != nil {
		return r, err
	}
	if r.server == r.client {
		return r, errors.New("exactly one of -s and -c is required")
	}
	if r.daemon != "" && r.iface != "" {
		return r, errors.New("-d and --daemon exclude each other: the daemon runs on its own interface")
	}
	if *port == 0 || *port > 65535 {
		return r, fmt.Errorf("bad port %d", *port)
	}
	r.opts.Port = uint16(*port)
	if *addr != "" {
		a, err := netip.ParseAddr(*addr)
		if err != nil {
			ips, lerr := net.DefaultResolver.LookupNetIP(context.Background(), "ip", *addr)
			if lerr != nil || len(ips) == 0 {
				return r, fmt.Errorf("bad address %q: %w", *addr, err)
			}
			a = ips[0]
		}
		r.addr = a.Unmap()
	}
	if r.client && !r.addr.IsValid() {
		return r, errors.New("the client needs -a ADDR")
	}
	if r.opts.Count < 0 {
		return r, errors.New("-C must not be negative")
	}
	if r.opts.Size < cmrping.MinSize || r.opts.Size > cmrping.MaxSize {
		return r, fmt.Errorf("-S %d: the size must be in [%d, %d]", r.opts.Size, cmrping.MinSize, cmrping.MaxSize)
	}
	r.kind = host.PortKind(strings.ToLower(os.Getenv("SOFTRNIC_PORT")))
	return r, nil
}

func runRping(args []string) int {
	r, err := parseRping(args)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(os.Stderr, rpingUsage)
		return 0
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "softrnic rping: %v\n\n%s", err, rpingUsage)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := rpingMain(ctx, r, os.Stdout, nil); err != nil {
		fmt.Fprintf(os.Stderr, "softrnic rping: %v\n", err)
		return 1
	}
	return 0
}

// cmHost says where a CM tool runs: the interface (-d), the peer's or our
// own address, and the packet I/O.
type cmHost struct {
	iface  string
	addr   netip.Addr // the server's address (client: the peer; server: ours, optional)
	client bool
	kind   host.PortKind
	cc     host.CCFlags // --cc, --cc-scale, --dcqcn
}

// pickIface picks the interface: the one given, else the one routing to a
// client's server, else the one holding a server's address.
func (h cmHost) pickIface() (string, error) {
	switch {
	case h.iface != "":
		return h.iface, nil
	case h.client:
		name, err := host.InterfaceToward(h.addr)
		if err != nil {
			return "", fmt.Errorf("%w: give -d IFACE", err)
		}
		return name, nil
	case h.addr.IsValid():
		name, err := host.InterfaceHolding(h.addr)
		if err != nil {
			return "", fmt.Errorf("%w: give -d IFACE", err)
		}
		return name, nil
	}
	return "", errors.New("the server needs -d IFACE or its address")
}

// withCMAgent opens a host on h's interface (in the calling thread's
// network namespace: device, port, engine, rdma_cm agent), calls f with
// its agent and closes it (the agent first, so that its last DREQ or REJ
// still goes out). Every rdma_cm tool (rping, rdma_server, rdma_client)
// runs through it.
func withCMAgent(h cmHost, f func(*rdmacm.Agent) error) error {
	name, err := h.pickIface()
	if err != nil {
		return err
	}
	cc, err := h.cc.Congestion()
	if err != nil {
		return err
	}
	hst, err := host.Open(host.Config{Interface: name, Port: h.kind, Congestion: cc, CountersFile: os.Getenv(host.CountersEnv)})
	if err != nil {
		return err
	}
	ferr := f(hst.CM)
	if err := hst.Close(); err != nil && ferr == nil {
		return err
	}
	return ferr
}

// rpingMain runs the rping server or client on a device of its own. ready,
// if set, is called once a server listens.
func rpingMain(ctx context.Context, r rpingArgs, out io.Writer, ready func()) error {
	r.opts.Out = out
	if r.daemon != "" {
		return rpingDaemon(ctx, r, ready)
	}
	return withCMAgent(cmHost{iface: r.iface, addr: r.addr, client: r.client, kind: r.kind, cc: r.cc}, func(a *rdmacm.Agent) error {
		if r.server {
			return rping.Server(ctx, a, r.opts, ready)
		}
		return rping.Client(ctx, a, r.addr, r.opts)
	})
}

// rpingDaemon runs rping through the softrnic daemon at r.daemon: its
// device, and its CM agent for the connection (the client is both).
func rpingDaemon(ctx context.Context, r rpingArgs, ready func()) error {
	c, err := client.Dial(r.daemon)
	if err != nil {
		return err
	}
	defer c.Close()
	if r.server {
		if r.addr.IsValid() && !slices.Contains(c.GIDs(), r.addr) {
			return fmt.Errorf("the daemon's device (%s) has no address %v", c.Name(), r.addr)
		}
		return rping.RunServer(ctx, c, c, r.opts, ready)
	}
	return rping.RunClient(ctx, c, c, r.addr, r.opts)
}

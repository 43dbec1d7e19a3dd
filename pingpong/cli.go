package pingpong

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/softrnic/softrnic/engine"
	"github.com/softrnic/softrnic/perftest/runner"
	"github.com/softrnic/softrnic/route"
)

// CLIOptions are what `softrnic pingpong` adds to the stock options.
type CLIOptions struct {
	PortKind engine.PortKind // AF_XDP, AF_PACKET or auto
	// DialFor is how long a client keeps retrying the server's side
	// channel (the stock client tries once).
	DialFor time.Duration
	// Listening, when set, is called once the server listens.
	Listening func(net.Addr)
}

// RunCLI is `softrnic pingpong rc|ud`: it opens the device on p.Device in
// the calling thread's network namespace (as `softrnic perf` does: a
// verbs.Device on an AF_XDP or AF_PACKET port, driven by engine.Run),
// serves one client or connects to p.Host, and runs the ping-pong.
func RunCLI(ctx context.Context, p Params, o CLIOptions, stdout io.Writer) (Result, error) {
	if p.Device == "" {
		return Result{}, errors.New("pingpong: -d INTERFACE is required")
	}
	in, err := engine.LookupInterface(p.Device)
	if err != nil {
		return Result{}, err
	}
	pt, err := engine.OpenPort(in, o.PortKind)
	if err != nil {
		return Result{}, fmt.Errorf("pingpong: open %s: %w", in.Name, err)
	}
	defer pt.Close()
	dev, err := runner.NewDevice(in)
	if err != nil {
		return Result{}, err
	}
	loop, err := engine.NewLoop(dev, pt, engine.Options{})
	if err != nil {
		return Result{}, err
	}
	res, err := route.New()
	if err != nil {
		return Result{}, err
	}
	defer res.Close()
	ectx, stop := context.WithCancel(ctx)
	engDone := make(chan error, 1)
	go func() { engDone <- loop.Run(ectx) }()
	defer func() { stop(); <-engDone }()

	h := Host{Device: dev, Iface: in, Resolve: func(ctx context.Context, peer netip.Addr) (src, dst [6]byte, err error) {
		rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		n, err := res.Resolve(rctx, peer)
		if err != nil {
			return src, dst, err
		}
		if n.IfIndex != in.Index {
			return src, dst, fmt.Errorf("%v is reached through %s, not %s", peer, n.IfName, in.Name)
		}
		copy(src[:], n.SrcMAC)
		copy(dst[:], n.DstMAC)
		return src, dst, nil
	}}
	conn, err := sideChannel(ctx, p, o)
	if err != nil {
		return Result{}, err
	}
	defer conn.Close()
	// A peer that dies mid-exchange must not hang us: the context ends
	// the side channel too.
	stopConn := context.AfterFunc(ctx, func() { conn.Close() })
	defer stopConn()
	r, err := Run(ctx, h, p, conn, stdout)
	if err != nil {
		return r, err
	}
	select {
	case err := <-engDone:
		engDone <- err
		if err != nil {
			return r, fmt.Errorf("pingpong: engine: %w", err)
		}
	default:
	}
	return r, nil
}

// sideChannel accepts one client or dials the server.
func sideChannel(ctx context.Context, p Params, o CLIOptions) (net.Conn, error) {
	port := strconv.Itoa(p.Port)
	if p.Host == "" {
		var lc net.ListenConfig
		ln, err := lc.Listen(ctx, "tcp", ":"+port)
		if err != nil {
			return nil, err
		}
		defer ln.Close()
		if o.Listening != nil {
			o.Listening(ln.Addr())
		}
		stop := context.AfterFunc(ctx, func() { ln.Close() })
		defer stop()
		return ln.Accept()
	}
	deadline := time.Now().Add(o.DialFor)
	for {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", net.JoinHostPort(p.Host, port))
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			return c, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

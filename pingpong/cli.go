package pingpong

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/softrnic/softrnic/engine"
	"github.com/softrnic/softrnic/perftest/runner"
	"github.com/softrnic/softrnic/rnic"
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
// rnic.Device on an AF_XDP or AF_PACKET port, driven by engine.Run),
// serves one client or connects to p.Host, and runs the ping-pong.
func RunCLI(ctx context.Context, p Params, o CLIOptions, stdout io.Writer) (Result, error) {
	if p.Device == "" {
		return Result{}, errors.New("pingpong: -d INTERFACE is required")
	}
	var r Result
	err := runner.OpenHost(ctx, p.Device, o.PortKind, rnic.Congestion{}, func(rh runner.Host) error {
		conn, err := runner.SideChannel(ctx, p.Host, p.Port, o.DialFor, o.Listening)
		if err != nil {
			return err
		}
		defer conn.Close()
		// A peer that dies mid-exchange must not hang us: the context ends
		// the side channel too.
		stopConn := context.AfterFunc(ctx, func() { conn.Close() })
		defer stopConn()
		r, err = Run(ctx, Host{Device: rh.Device, Iface: rh.Iface, Resolve: rh.Resolve}, p, conn, stdout)
		return err
	})
	if err != nil {
		return r, fmt.Errorf("pingpong: %w", err)
	}
	return r, nil
}

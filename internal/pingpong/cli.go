package pingpong

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/softrnic/softrnic/congestion/dcqcn"
	"github.com/softrnic/softrnic/host"
	"github.com/softrnic/softrnic/internal/perftest/runner"
	"github.com/softrnic/softrnic/rnic"
)

// CLIOptions are what `softrnic pingpong` adds to the stock options.
type CLIOptions struct {
	PortKind host.PortKind // AF_XDP, AF_PACKET or auto
	// DialFor is how long a client keeps retrying the server's side
	// channel (the stock client tries once).
	DialFor time.Duration
	// Listening, when set, is called once the server listens.
	Listening func(net.Addr)
	// Daemon, when set, is the control socket of a softrnic daemon: the
	// QP lives in the daemon's device instead of a device of our own.
	Daemon string
}

// RunCLI is `softrnic pingpong rc|ud`: it opens the device on p.Device in
// the calling thread's network namespace (as `softrnic perf` does: a
// rnic.Device on an AF_XDP or AF_PACKET port, driven by engine.Run), or
// uses the daemon's with o.Daemon, serves one client or connects to
// p.Host, and runs the ping-pong.
func RunCLI(ctx context.Context, p Params, o CLIOptions, stdout io.Writer) (Result, error) {
	var r Result
	run := func(rh runner.Host) error {
		conn, err := runner.SideChannel(ctx, p.Host, p.Port, o.DialFor, o.Listening)
		if err != nil {
			return err
		}
		defer conn.Close()
		// A peer that dies mid-exchange must not hang us: the context ends
		// the side channel too.
		stopConn := context.AfterFunc(ctx, func() { conn.Close() })
		defer stopConn()
		r, err = Run(ctx, Host{Device: rh.Device, Iface: rh.Iface}, p, conn, stdout)
		return err
	}
	var err error
	switch {
	case o.Daemon != "":
		if p.CC != "" || p.CCScale != 1 || p.HostCC != "" {
			return r, errors.New("pingpong: --cc with --daemon: congestion control is the daemon's to configure")
		}
		h, c, derr := runner.DaemonHost(o.Daemon)
		if derr != nil {
			return r, fmt.Errorf("pingpong: %w", derr)
		}
		defer c.Close()
		if p.Device != "" && p.Device != h.Iface.Name {
			return r, fmt.Errorf("pingpong: -d %s, but the daemon at %s serves %s", p.Device, o.Daemon, h.Iface.Name)
		}
		err = run(h)
	case p.Device == "":
		return Result{}, errors.New("pingpong: -d INTERFACE is required (the network interface to run RoCE on)")
	default:
		var cc rnic.Congestion
		if cc, err = ccOf(p); err == nil {
			err = runner.OpenHost(p.Device, o.PortKind, cc, 0, run)
		}
	}
	if err != nil {
		return r, fmt.Errorf("pingpong: %w", err)
	}
	return r, nil
}

// ccOf is the device's congestion control for --cc, --cc-scale and
// --host-cc.
func ccOf(p Params) (rnic.Congestion, error) {
	algo, profile, err := host.ParseCC(p.CC, "")
	if err != nil {
		return rnic.Congestion{}, err
	}
	hcc, err := dcqcn.ParseHostCC(p.HostCC)
	if err != nil {
		return rnic.Congestion{}, fmt.Errorf("--host-cc: %w", err)
	}
	return host.Congestion(host.CC{Algorithm: algo, Profile: profile, Scale: p.CCScale, HostCC: hcc})
}

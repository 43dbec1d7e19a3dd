package runner

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/engine"
	"github.com/softrnic/softrnic/host"
	"github.com/softrnic/softrnic/internal/perftest"
	"github.com/softrnic/softrnic/rnic"
)

// CLIOptions are what `softrnic perf` adds to perftest's parameters.
type CLIOptions struct {
	PortKind host.PortKind // AF_XDP, AF_PACKET or auto
	// DialFor is how long a client keeps retrying to reach the server's
	// side channel (perftest gives up at once; a script starting both ends
	// together is easier with a few seconds).
	DialFor time.Duration
	// Listening, when set, is called with the server's address once it
	// listens (tests use it to start the client).
	Listening func(net.Addr)
	// Daemon, when set, is the control socket of a softrnic daemon: the
	// test's QPs, CQs and MRs then live in the daemon's device (--daemon
	// SOCKET) instead of a device of our own on the interface, and the
	// side channel is still ours.
	Daemon string
}

// RunCLI is `softrnic perf`: it opens the device on p.Device in the calling
// thread's network namespace (a rnic.Device driven by engine.Run on an
// AF_XDP or AF_PACKET port),
// then serves one perftest client (p.Host empty; --clients N: N clients at
// once on the one device) or connects to the server p.Host, runs the test
// and prints perftest's report, or JSON with --json. --dcqcn runs DCQCN on
// the device (CongestionFor).
func RunCLI(ctx context.Context, p perftest.Params, o CLIOptions, stdout io.Writer) (Result, error) {
	var r Result
	err := withHost(p, o, func(h Host) (err error) {
		if p.Host == "" && p.Clients > 1 {
			r, err = serveClients(ctx, h, p, o, stdout)
		} else {
			r, err = runOne(ctx, h, p, o, stdout)
		}
		return err
	})
	return r, err
}

// withHost opens the host for a perf run: OpenHost with --dcqcn's
// congestion control. RunCLI and RunCLICM share it.
func withHost(p perftest.Params, o CLIOptions, f func(Host) error) error {
	if o.Daemon != "" {
		return withDaemon(p, o.Daemon, f)
	}
	if p.Device == "" {
		return errors.New("perf: -d INTERFACE is required (the network interface to run RoCE on)")
	}
	cc, err := CongestionFor(p)
	if err != nil {
		return err
	}
	// The receive buffers are sized for the run's QPs (at least the
	// default's): its peer's -q QPs all send into this host.
	if err := OpenHost(p.Device, o.PortKind, cc, max(p.QPs, host.DefaultRxQPs), f); err != nil {
		return fmt.Errorf("perf: %w", err)
	}
	return nil
}

// withDaemon runs f on the device of the softrnic daemon at socket: the
// tools' --daemon. The daemon owns the interface, its port, its engine,
// neighbour resolution and DCQCN (its own configuration), so -d may only
// name the daemon's interface, and --dcqcn is refused.
func withDaemon(p perftest.Params, socket string, f func(Host) error) error {
	if p.DCQCN != "" || p.CC != "" || p.CCScale != 1 || p.HostCC != "" {
		return errors.New("perf: --cc, --cc-scale, --dcqcn or --host-cc with --daemon: congestion control is the daemon's to configure (its cc keys)")
	}
	h, c, err := DaemonHost(socket)
	if err != nil {
		return fmt.Errorf("perf: %w", err)
	}
	defer c.Close()
	if p.Device != "" && p.Device != h.Iface.Name {
		return fmt.Errorf("perf: -d %s, but the daemon at %s serves %s", p.Device, socket, h.Iface.Name)
	}
	return f(h)
}

// DaemonHost connects to the softrnic daemon at socket and returns a Host
// on its device (the client, which is its CM too), whose Iface has the
// daemon's interface name, GID table and MTU (the RoCE MTU, not the
// netdev's). Close the client when done: the daemon then frees whatever
// the host left.
func DaemonHost(socket string) (Host, *client.Client, error) {
	c, err := client.Dial(socket)
	if err != nil {
		return Host{}, nil, err
	}
	h := Host{Device: c, CM: c, Iface: host.Interface{Name: c.Name(), MTU: int(c.Query().ActiveMTU), GIDs: c.GIDs()}}
	return h, c, nil
}

// OpenHost opens the RNIC the built-in tools run on, a host.Host on the
// interface named device (in the calling thread's network namespace),
// with the given packet I/O and congestion control cc and receive buffers
// for rxQPs QPs (host.Config.RxQPs; 0: the default); it calls f with it
// and tears everything down when f returns.
func OpenHost(device string, kind host.PortKind, cc rnic.Congestion, rxQPs int, f func(Host) error) error {
	h, err := host.Open(host.Config{Interface: device, Port: kind, Congestion: cc, Engine: engineOptions(cc),
		RxQPs: rxQPs, CountersFile: os.Getenv(host.CountersEnv)})
	if err != nil {
		return err
	}
	ferr := f(Host{Device: h.Device, CM: h.CM, Iface: h.Iface, Stats: h.Loop.DeviceStats})
	if err := h.Close(); err != nil && ferr == nil {
		return err
	}
	return ferr
}

// runOne runs the test with one client or server over its side channel.
func runOne(ctx context.Context, h Host, p perftest.Params, o CLIOptions, stdout io.Writer) (Result, error) {
	conn, err := SideChannel(ctx, p.Host, p.Port, o.DialFor, o.Listening)
	if err != nil {
		return Result{}, err
	}
	defer conn.Close()
	return execJSON(ctx, h, p, conn, stdout)
}

// execJSON runs one test on conn and writes its JSON with --json.
func execJSON(ctx context.Context, h Host, p perftest.Params, conn net.Conn, stdout io.Writer) (Result, error) {
	t := New(h, p, p.Host != "", stdout)
	r, err := t.Exec(ctx, conn)
	if err != nil {
		return r, err
	}
	if p.JSON {
		if err := t.JSON().Write(stdout); err != nil {
			return r, err
		}
	}
	return r, nil
}

// serveClients is a server's --clients N: it accepts N side-channel
// connections on one listener and runs each client's test as it arrives,
// all at once, on the one device (each with its own PD, MR, CQs and QPs).
// Two flows into one interface need this: only one process can own the
// interface's AF_XDP queue, so a second server on it would never see its
// packets. Each client's report (and JSON object) is written whole, one
// after the other; the result is every client's rows, and the first
// failure.
func serveClients(ctx context.Context, h Host, p perftest.Params, o CLIOptions, stdout io.Writer) (Result, error) {
	ln, err := net.Listen("tcp", ":"+strconv.Itoa(p.Port))
	if err != nil {
		return Result{}, err
	}
	defer ln.Close()
	if o.Listening != nil {
		o.Listening(ln.Addr())
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stopAccept := context.AfterFunc(cctx, func() { ln.Close() })
	defer stopAccept()
	type outcome struct {
		r   Result
		out []byte
		err error
	}
	done := make(chan outcome, p.Clients)
	started := 0
	var acceptErr error
	for ; started < p.Clients; started++ {
		conn, err := ln.Accept()
		if err != nil {
			acceptErr = err
			break
		}
		go func() {
			defer conn.Close()
			var buf bytes.Buffer
			r, err := execJSON(cctx, h, p, conn, &buf)
			if err != nil {
				cancel() // one failed client ends the run, as one server would
				err = fmt.Errorf("perf: client %v: %w", conn.RemoteAddr(), err)
			}
			done <- outcome{r, buf.Bytes(), err}
		}()
	}
	var all Result
	var errs []error
	if acceptErr != nil && ctx.Err() == nil && started < p.Clients {
		errs = append(errs, fmt.Errorf("perf: accept client %d of %d: %w", started+1, p.Clients, acceptErr))
	}
	for range started {
		oc := <-done
		if _, err := stdout.Write(oc.out); err != nil {
			errs = append(errs, err)
		}
		all.BW = append(all.BW, oc.r.BW...)
		all.Lat = append(all.Lat, oc.r.Lat...)
		all.CC = append(all.CC, oc.r.CC...)
		all.MTU, all.Verify = oc.r.MTU, oc.r.Verify
		if oc.err != nil {
			errs = append(errs, oc.err)
		}
	}
	return all, errors.Join(errs...)
}

// engineOptions tunes the engine for the DCQCN setting cc. Under time
// dilation S every delay of the experiment is S times longer, so the
// engine may nap S times longer between polls of its port (at most
// maxDilatedNap) when idle: at S = 400 a 250 µs nap is 0.6 µs of the
// undilated time, and it spares a loaded host tens of thousands of
// wake-ups a second per process, which the paced senders need. Departures
// of paced QPs are timer deadlines, which end a nap on time regardless.
func engineOptions(cc rnic.Congestion) engine.Options {
	var o engine.Options
	if cc.On() && cc.Scale > 1 {
		o.IdleWait = min(time.Duration(float64(defaultIdleWait)*cc.Scale), maxDilatedNap)
	}
	return o
}

// defaultIdleWait is engine.Options.IdleWait's default; maxDilatedNap
// bounds engineOptions' dilated nap.
const (
	defaultIdleWait = 10 * time.Microsecond
	maxDilatedNap   = 250 * time.Microsecond
)

// SideChannel is the TCP connection perftest-style tools exchange their
// setup over: with host empty it accepts one client on port (calling
// listening, if set, once it listens); otherwise it dials host:port,
// retrying for dialFor.
func SideChannel(ctx context.Context, host string, port int, dialFor time.Duration, listening func(net.Addr)) (net.Conn, error) {
	portStr := strconv.Itoa(port)
	if host == "" {
		ln, err := net.Listen("tcp", ":"+portStr)
		if err != nil {
			return nil, err
		}
		defer ln.Close()
		if listening != nil {
			listening(ln.Addr())
		}
		stop := context.AfterFunc(ctx, func() { ln.Close() })
		defer stop()
		return ln.Accept()
	}
	deadline := time.Now().Add(dialFor)
	for {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", net.JoinHostPort(host, portStr))
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

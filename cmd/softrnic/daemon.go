package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/softrnic/softrnic/capture"
	"github.com/softrnic/softrnic/daemon"
	"github.com/softrnic/softrnic/daemon/proto"
	"github.com/softrnic/softrnic/engine"
	"github.com/softrnic/softrnic/port"
	"github.com/softrnic/softrnic/port/afpacket"
	"github.com/softrnic/softrnic/port/afxdp"
	"github.com/softrnic/softrnic/rnic"
	"github.com/softrnic/softrnic/route"
)

func init() {
	register("daemon", "run the RNIC on an interface and serve local applications", runDaemon)
}

func runDaemon(args []string) int {
	fs := flag.NewFlagSet("softrnic daemon", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: softrnic daemon -d IFACE [--config FILE] [flags]")
		fmt.Fprintln(fs.Output(), "\nEvery configuration key is also a flag; flags override the file.")
		fs.PrintDefaults()
	}
	flags := daemon.RegisterFlags(fs)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "softrnic daemon: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	cfg, err := flags.Load()
	if err != nil {
		fmt.Fprintln(os.Stderr, "softrnic daemon:", err)
		return 2
	}
	log, err := daemon.NewLogger(os.Stderr, &cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "softrnic daemon:", err)
		return 2
	}
	if err := serveDaemon(&cfg, log); err != nil {
		log.Error("daemon failed", "err", err)
		return 1
	}
	return 0
}

// serveDaemon runs the daemon until SIGTERM or SIGINT, then shuts down in
// order: stop accepting work and move QPs to error (clients get flush
// completions), stop the engine, close the port (which detaches XDP and
// frees the UMEM).
func serveDaemon(cfg *daemon.Config, log *slog.Logger) error {
	lock, err := daemon.Lock(filepath.Dir(cfg.Control), cfg.Interface)
	if err != nil {
		return err
	}
	defer lock.Close()

	in, err := engine.LookupInterface(cfg.Interface)
	if err != nil {
		return err
	}
	gids := cfg.GIDs
	if len(gids) == 0 {
		gids = in.GIDs
	}
	mtu := cfg.MTU
	if mtu == 0 {
		mtu = in.ActiveMTU()
	}
	if mtu == 0 {
		return fmt.Errorf("%s: MTU %d is too small for RoCE", in.Name, in.MTU)
	}
	res, err := route.New()
	if err != nil {
		return err
	}
	defer res.Close()
	resolve := func(ctx context.Context, a netip.Addr) ([6]byte, error) {
		var mac [6]byte
		n, err := res.Resolve(ctx, a)
		if err != nil {
			return mac, err
		}
		copy(mac[:], n.DstMAC)
		return mac, nil
	}
	dev, err := rnic.NewDevice(rnic.Config{Name: in.Name, MAC: in.MAC, Addrs: append([]netip.Addr(nil), gids...), PortMTU: mtu, Resolve: resolve})
	if err != nil {
		return err
	}
	p, kind, err := openPort(cfg, in, gids, log)
	if err != nil {
		return err
	}
	portClosed := false
	defer func() {
		if !portClosed {
			p.Close()
		}
	}()

	group := -1
	if cfg.ControlGroup != "" {
		g, err := daemon.LookupGroup(cfg.ControlGroup)
		if err != nil {
			return err
		}
		group = int(g)
	}
	var tap capture.Tap // softrnic capture (root clients) starts sessions on it
	// Read once, before the engine owns the port: attach and copy mode do
	// not change while it runs.
	var st proto.PortStatus
	copy(st.Kind[:], kind)
	st.Queues = 1
	if m, ok := p.(*afxdp.Multi); ok {
		st.Queues = uint32(m.NumQueues())
	}
	if xp, ok := p.(interface{ Stats() (afxdp.Stats, error) }); ok {
		if s, err := xp.Stats(); err == nil {
			copy(st.Attach[:], s.AttachMode.String())
			if s.ZeroCopy {
				st.ZeroCopy = 1
			}
			log.Info("AF_XDP", "attach", s.AttachMode, "zerocopy", s.ZeroCopy, "multibuffer", s.Multi, "queues", st.Queues)
		}
	}
	portStatus := func() proto.PortStatus { return st }
	// The engine gets the counting wrapper: byte counts, and AF_XDP
	// statistics read on the loop's own goroutine (softrnic stats, /metrics).
	cp := daemon.NewCountingPort(p)
	loop, err := engine.NewLoop(dev, cp, engine.Options{Tap: &tap})
	if err != nil {
		return err
	}
	counters := &daemon.CounterSource{Name: in.Name, Loop: loop, Port: cp}
	srv, err := daemon.NewServer(dev,
		daemon.Options{Logger: log, Group: group, Mode: cfg.ControlMode, Tap: &tap, PortStatus: portStatus, Counters: counters.Snapshot})
	if err != nil {
		return err
	}
	if cfg.Metrics != "" {
		mopts, err := cfg.MetricsOptions()
		if err != nil {
			srv.Close(0)
			return fmt.Errorf("metrics endpoint: %w", err)
		}
		ms, err := daemon.ServeMetrics(cfg.Metrics, daemon.NewCollector(counters.Snapshot), mopts...)
		if err != nil {
			srv.Close(0)
			return fmt.Errorf("metrics endpoint: %w", err)
		}
		defer ms.Close()
		log.Info("serving Prometheus metrics", "addr", ms.Addr().String(), "path", "/metrics")
	}
	if err := srv.Listen(cfg.Control); err != nil {
		srv.Close(0)
		return err
	}

	sig, stopSig := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stopSig()
	engCtx, stopEngine := context.WithCancel(context.Background())
	engDone := make(chan error, 1)
	go func() { engDone <- loop.Run(engCtx) }()
	srvDone := make(chan error, 1)
	go func() { srvDone <- srv.Serve() }()
	log.Info("serving", "port", kind, "mtu", mtu, "gids", gids, "control", cfg.Control, "dcqcn", cfg.DCQCN.Profile)

	var runErr error
	select {
	case <-sig.Done():
		log.Info("stopping: moving QPs to error and flushing clients")
	case runErr = <-engDone:
		log.Error("engine stopped", "err", runErr)
	case runErr = <-srvDone:
		log.Error("control server stopped", "err", runErr)
	}
	srv.Close(2 * time.Second)
	stopEngine()
	if err := <-engDone; err != nil && runErr == nil && !errors.Is(err, context.Canceled) {
		runErr = err
	}
	portClosed = true
	if err := p.Close(); err != nil && runErr == nil {
		runErr = fmt.Errorf("closing the port: %w", err)
	}
	log.Info("stopped", "rx_frames", dev.Stats.RxFrames, "tx_frames", dev.Stats.TxFrames)
	return runErr
}

// openPort opens the configured port: AF_XDP with the configured UMEM (the
// port loads and attaches the steering program, restricted to our GIDs),
// or AF_PACKET, or AF_XDP falling back to AF_PACKET.
func openPort(cfg *daemon.Config, in engine.Interface, gids []netip.Addr, log *slog.Logger) (port.Port, string, error) {
	xdp := func() (port.Port, error) {
		c := afxdp.Config{IfIndex: in.Index, LocalAddrs: gids,
			FrameSize: uint32(cfg.FrameSize), NumFrames: uint32(cfg.UMEMSize / int64(cfg.FrameSize))}
		// A failed open returns an untyped nil, never a nil *Port in a
		// port.Port.
		if cfg.Queues == 1 {
			if p, err := afxdp.Open(c); err == nil {
				return p, nil
			} else {
				return nil, err
			}
		}
		// One socket per RX queue, all fed to the one engine goroutine;
		// each QP transmits on the queue of its UDP source port.
		m, err := afxdp.OpenMulti(afxdp.MultiConfig{Config: c, Queues: cfg.Queues, SpreadTx: true})
		if err != nil {
			return nil, err
		}
		return m, nil
	}
	pkt := func() (port.Port, error) { return afpacket.Open(afpacket.Config{IfIndex: in.Index}) }
	switch cfg.Port {
	case "afxdp":
		p, err := xdp()
		return p, "afxdp", err
	case "afpacket":
		p, err := pkt()
		return p, "afpacket", err
	}
	p, err := xdp()
	if err == nil {
		return p, "afxdp", nil
	}
	log.Warn("AF_XDP unavailable, using AF_PACKET", "err", err)
	p2, err2 := pkt()
	if err2 != nil {
		return nil, "", errors.Join(err, err2)
	}
	return p2, "afpacket", nil
}

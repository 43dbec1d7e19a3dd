package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/softrnic/softrnic/cm"
	"github.com/softrnic/softrnic/congestion"
	"github.com/softrnic/softrnic/daemon"
	"github.com/softrnic/softrnic/daemon/proto"
	"github.com/softrnic/softrnic/engine"
	"github.com/softrnic/softrnic/host"
	"github.com/softrnic/softrnic/internal/capture"
	"github.com/softrnic/softrnic/port"
	"github.com/softrnic/softrnic/port/afxdp"
	"github.com/softrnic/softrnic/rnic"
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
// completions), then the host (the CM agent, the engine, the port, which
// detaches XDP and frees the UMEM).
func serveDaemon(cfg *daemon.Config, log *slog.Logger) (err error) {
	// Every client connection, CQ and QP costs file descriptors: take
	// all the unit allows (LimitNOFILE), and size the client limits from
	// it (daemon.DefaultLimits).
	nofile, err := daemon.RaiseNoFile()
	if err != nil {
		log.Warn("raising RLIMIT_NOFILE", "err", err)
	}
	hostFigures := daemon.ReadHost()
	limits := cfg.Limits.WithDefaults(daemon.DefaultLimits(hostFigures))
	log.Info("client limits", "nofile", nofile, "max_map_count", hostFigures.MaxMapCount,
		"connections_per_host", limits[daemon.Connections][daemon.PerHost], "fds_per_host", limits[daemon.FDs][daemon.PerHost],
		"mappings_per_host", limits[daemon.Mappings][daemon.PerHost], "queue_bytes_per_host", limits[daemon.QueueBytes][daemon.PerHost])

	cc, err := daemonCongestion(cfg)
	if err != nil {
		return err
	}
	var tap capture.Tap // softrnic capture (root clients) starts sessions on it
	var cp *daemon.CountingPort
	h, err := host.Open(host.Config{Interface: cfg.Interface, GIDs: cfg.GIDs, MTU: cfg.MTU, Port: host.PortKind(cfg.Port),
		Queues: cfg.Queues, FrameSize: cfg.FrameSize, UMEMSize: cfg.UMEMSize, RxQPs: cfg.RxQPs, Congestion: cc, Recovery: cfg.Recovery,
		CountersFile: os.Getenv(host.CountersEnv),
		Engine:       engine.Options{Tap: &tap}, Log: log, Owner: host.Owner{Name: "softrnic daemon", Control: cfg.Control},
		CM: cm.Config{CMResponseTimeout: cfg.CMResponseTimeout, MaxCMRetries: cfg.CMMaxRetries},
		// The engine gets the counting wrapper: byte counts, and AF_XDP
		// statistics read on the loop's own goroutine (softrnic stats,
		// /metrics).
		WrapPort: func(p port.Port) port.Port { cp = daemon.NewCountingPort(p); return cp }})
	if err != nil {
		return err
	}
	hostClosed := false
	defer func() {
		if !hostClosed {
			err = errors.Join(err, h.Close())
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
	// Read once: attach and copy mode do not change while the engine runs.
	var st proto.PortStatus
	copy(st.Kind[:], h.PortKind)
	st.Queues = 1
	if m, ok := h.Port.(*afxdp.Multi); ok {
		st.Queues = uint32(m.NumQueues())
	}
	if xp, ok := h.Port.(interface{ Stats() (afxdp.Stats, error) }); ok {
		if s, err := xp.Stats(); err == nil {
			copy(st.Attach[:], s.AttachMode.String())
			if s.ZeroCopy {
				st.ZeroCopy = 1
			}
			log.Info("AF_XDP", "attach", s.AttachMode, "zerocopy", s.ZeroCopy, "multibuffer", s.Multi, "queues", st.Queues)
		}
	}
	portStatus := func() proto.PortStatus { return st }
	counters := &daemon.CounterSource{Name: h.Iface.Name, Loop: h.Loop, Port: cp}
	srv, err := daemon.NewServer(h.Device, daemon.Options{Logger: log, Group: group, Mode: cfg.ControlMode, Tap: &tap,
		PortStatus: portStatus, Counters: counters.Snapshot, CM: h.CM, Limits: limits})
	if err != nil {
		return err
	}
	counters.CM = srv.CMCounters
	counters.Server = srv // its own counters and its clients' usage on /metrics
	if cfg.Metrics != "" {
		mopts, err := cfg.MetricsOptions()
		if err != nil {
			return errors.Join(fmt.Errorf("metrics endpoint: %w", err), srv.Close(0))
		}
		ms, err := daemon.ServeMetrics(cfg.Metrics, daemon.NewCollector(counters.Snapshot), mopts...)
		if err != nil {
			return errors.Join(fmt.Errorf("metrics endpoint: %w", err), srv.Close(0))
		}
		defer func() { err = errors.Join(err, ms.Close()) }()
		log.Info("serving Prometheus metrics", "addr", ms.Addr().String(), "path", "/metrics")
	}
	if err := srv.Listen(cfg.Control); err != nil {
		return errors.Join(err, srv.Close(0))
	}

	sig, stopSig := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stopSig()
	srvDone := make(chan error, 1)
	go func() { srvDone <- srv.Serve() }()
	algo, profile, scale := h.Device.CongestionProfile()
	log.Info("serving", "port", h.PortKind, "mtu", h.Device.Query().ActiveMTU, "gids", h.Iface.GIDs, "control", cfg.Control,
		"cc", algo, "cc_profile", profile, "cc_scale", scale, "host_cc", h.Device.Config().Congestion.HostCC.String())

	var runErr error
	select {
	case <-sig.Done():
		log.Info("stopping: moving QPs to error and flushing clients")
	case <-h.Stopped():
		runErr = h.Err()
		log.Error("engine stopped", "err", runErr)
	case runErr = <-srvDone:
		log.Error("control server stopped", "err", runErr)
	}
	if err := srv.Close(2 * time.Second); err != nil && runErr == nil {
		runErr = err
	}
	hostClosed = true
	if err := h.Close(); err != nil && runErr == nil {
		runErr = err
	}
	ds := h.Loop.DeviceStats()
	log.Info("stopped", "rx_frames", ds.RxFrames, "tx_frames", ds.TxFrames)
	return runErr
}

// daemonCongestion is the device's congestion control from the cc keys
// (cc, cc-scale, cc-line-gbps, [swift]) and, under cc dcqcn, the [dcqcn]
// ones: dcqcn.profile (off: none), with the connectx profile's knobs;
// host.Congestion builds it, as it does for the tools.
func daemonCongestion(cfg *daemon.Config) (rnic.Congestion, error) {
	cx, err := cfg.DCQCN.ConnectX()
	if err != nil {
		return rnic.Congestion{}, err
	}
	c := &cfg.CC
	algo, profile, _ := strings.Cut(c.Algorithm, ":")
	if algo == "dcqcn" {
		profile = cfg.DCQCN.Profile
		if profile == "off" {
			algo, profile = "off", ""
		}
	}
	cc, err := host.Congestion(host.CC{Algorithm: algo, Profile: profile, Scale: c.Scale,
		LineRate: congestion.Rate(c.LineGbps) * congestion.Gbps, ConnectX: &cx,
		Swift: host.SwiftKnobs{BaseTarget: c.SwiftBaseTarget, HopScale: c.SwiftHopScale, FSRange: c.SwiftFSRange,
			EndpointTarget: c.SwiftEndpointTarget, Hops: c.SwiftHops}, HostCC: cfg.DCQCN.HostCC})
	if err != nil {
		return cc, &daemon.KeyError{Key: "cc", Err: err}
	}
	return cc, nil
}

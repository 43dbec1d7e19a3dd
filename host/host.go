package host

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/softrnic/softrnic/cm"
	"github.com/softrnic/softrnic/congestion"
	"github.com/softrnic/softrnic/congestion/dcqcn"
	"github.com/softrnic/softrnic/engine"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/route"
	"github.com/softrnic/softrnic/port"
	"github.com/softrnic/softrnic/port/afxdp"
	"github.com/softrnic/softrnic/rdmacm"
	"github.com/softrnic/softrnic/rnic"
	"github.com/softrnic/softrnic/verbs"
	"github.com/softrnic/softrnic/xsk"
)

// Config is what a host is made of. Only Interface is required.
type Config struct {
	// Interface is the network interface to run RoCE on, by name.
	Interface string
	// GIDs, if set, is the GID table instead of the interface's addresses
	// (in order).
	GIDs []netip.Addr
	// MTU, if set, is the port's RoCE MTU instead of the largest the
	// interface carries.
	MTU int
	// Port is the packet I/O: AF_XDP, AF_PACKET, or Auto (AF_XDP, else
	// AF_PACKET; the default).
	Port PortKind
	// Queues is how many receive queues an AF_XDP port serves, one socket
	// each (0: all of the interface's, so that RSS cannot hand RoCEv2 to a
	// queue nobody reads).
	Queues int
	// FrameSize and UMEMSize size an AF_XDP port's UMEM per queue (0:
	// 2048-byte frames when the MTU fits them, else 4096; 16 MiB).
	FrameSize int
	UMEMSize  int64
	// RxQPs is how many QPs sending into the host at once an AF_XDP
	// port's receive buffers are sized for (0: DefaultRxQPs, at most
	// MaxRxQPs): RxBuffersPerQP frames each, every one of the interface's
	// MTU, beyond what UMEMSize gives if need be (rxBuffers).
	RxQPs int
	// Congestion is the device's congestion control (Congestion; the zero
	// value is off).
	Congestion rnic.Congestion
	// Recovery is the loss recovery of the device's RC QPs
	// (rnic.Config.Recovery; the zero value: selective repeat with
	// adaptive retransmission).
	Recovery ib.Recovery
	// Engine tunes the engine loop; its Tap, if set, sees every frame.
	Engine engine.Options
	// WrapPort, if set, wraps the port the engine drives (the daemon
	// counts bytes there).
	WrapPort func(port.Port) port.Port
	// NoCM runs no rdma_cm agent (the device's GSI QP stays free).
	NoCM bool
	// CM configures the rdma_cm agent's CM (timeouts, retries; the zero
	// value is the Linux CM's defaults).
	CM cm.Config
	// CountersFile, if set, is where Close appends the device's counters
	// over its life, as one JSON line (Counters): a tool's or the daemon's
	// account of what it retransmitted, which the interop lab holds
	// against the peer's duplicate counts. The tools set it from
	// $SOFTRNIC_COUNTERS (CountersEnv).
	CountersFile string
	// Log, if set, reports what Open chose (an AF_XDP fallback).
	Log *slog.Logger
	// Owner is who opens the host: Open claims the interface for it, and
	// refuses if another host holds it (owner.go).
	Owner Owner
}

// Host is an RNIC on an interface of this machine, running: the rnic
// device, its port, the engine loop driving it in a goroutine of its own,
// neighbour resolution for it, the port's state following the interface's
// link (link.go), and an rdma_cm agent on it. Every tool and the daemon run
// on one.
type Host struct {
	Iface Interface
	// Device is the RNIC. Its Config.Resolve is the host's neighbour
	// resolution, restricted to peers reached through Iface.
	Device *rnic.Device
	// Port is the port as opened (before Config.WrapPort), and PortKind
	// what it is (AF_XDP or AF_PACKET).
	Port     port.Port
	PortKind PortKind
	// Loop is the engine loop (Counters, DeviceStats).
	Loop *engine.Loop
	// CM is the rdma_cm agent on Device (nil with Config.NoCM).
	CM *rdmacm.Agent

	res     *route.Resolver
	claim   *claim
	ctrFile string
	stop    context.CancelFunc
	done    chan struct{}
	runErr  error
	closeMu sync.Once
	closeEr error
}

// resolveTimeout bounds one neighbour resolution (ARP may not answer).
const resolveTimeout = 3 * time.Second

// Open looks the interface up, opens the port, makes the device and
// starts the engine and the rdma_cm agent. Close releases them.
func Open(cfg Config) (_ *Host, err error) {
	if cfg.Interface == "" {
		return nil, errors.New("host: no interface")
	}
	in, err := LookupInterface(cfg.Interface)
	if err != nil {
		return nil, err
	}
	if len(cfg.GIDs) > 0 {
		in.GIDs = append([]netip.Addr(nil), cfg.GIDs...)
	}
	h := &Host{Iface: in, done: make(chan struct{}), ctrFile: cfg.CountersFile}
	if h.claim, err = claimInterface(in.Name, cfg.Owner); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, h.release())
		}
	}()
	if h.res, err = route.New(); err != nil {
		return nil, err
	}
	if h.Port, h.PortKind, err = openPort(&cfg, in); err != nil {
		return nil, err
	}
	rx := 0
	if c, ok := h.Port.(interface{ RxFrames() int }); ok {
		rx = c.RxFrames()
	}
	if h.Device, err = NewDevice(in, DeviceOptions{MTU: cfg.MTU, Congestion: cfg.Congestion, Recovery: cfg.Recovery,
		RxFrames: rx, Resolve: h.resolve}); err != nil {
		return nil, err
	}
	p := h.Port
	if cfg.WrapPort != nil {
		p = cfg.WrapPort(p)
	}
	eng := cfg.Engine
	if g, ok := h.Port.(port.RxGauge); ok && eng.Gauge == nil {
		eng.Gauge = g // the wrapper hides it
	}
	if eng.Yield == nil {
		eng.Yield = port.Yield
	}
	if eng.Nap == nil {
		eng.Nap = port.Nap
	}
	if h.Loop, err = engine.NewLoop(h.Device, p, eng); err != nil {
		return nil, err
	}
	ctx, stop := context.WithCancel(context.Background())
	if err := watchLink(in.Index, h.Device, ctx.Done(), cfg.Log); err != nil {
		stop()
		return nil, fmt.Errorf("host: watching %s's link state: %w", in.Name, err)
	}
	h.stop = stop
	go func() {
		defer close(h.done)
		h.runErr = h.Loop.Run(ctx)
	}()
	if !cfg.NoCM {
		if h.CM, err = rdmacm.New(rdmacm.Config{Device: h.Device, Resolve: h.resolve, CM: cfg.CM}); err != nil {
			return nil, err
		}
	}
	return h, nil
}

// DeviceOptions are what NewDevice makes a device of besides its
// interface. The zero value is the defaults.
type DeviceOptions struct {
	MTU        int             // RoCE MTU (0: the largest the interface carries)
	Congestion rnic.Congestion // congestion control (zero: off)
	Recovery   ib.Recovery     // loss recovery (zero: selective)
	RxFrames   int             // the port's receive frames (rnic.Config.RxFrames; 0: not known)
	// Resolve is the neighbour resolution (rnic.Config.Resolve).
	Resolve func(context.Context, netip.Addr) ([6]byte, error)
}

// NewDevice makes the device of an interface: its MAC, its GIDs, and what
// o says. Open makes a host's with it; tests on in-memory links make
// theirs.
func NewDevice(in Interface, o DeviceOptions) (*rnic.Device, error) {
	mtu := o.MTU
	if mtu == 0 {
		mtu = in.ActiveMTU()
	}
	if mtu == 0 {
		return nil, fmt.Errorf("host: %s's MTU %d is too small for RoCE", in.Name, in.MTU)
	}
	return rnic.NewDevice(rnic.Config{Name: in.Name, MAC: in.MAC, Addrs: append([]netip.Addr(nil), in.GIDs...), PortMTU: mtu,
		Congestion: o.Congestion, Recovery: o.Recovery, RxFrames: o.RxFrames, Resolve: o.Resolve})
}

// resolve is the device's neighbour resolution: the next hop's MAC for a
// peer reached through the host's interface.
func (h *Host) resolve(ctx context.Context, peer netip.Addr) ([6]byte, error) {
	var mac [6]byte
	if slices.Contains(h.Iface.GIDs, peer.Unmap()) {
		// The device itself (the kernel would call it a local address):
		// its frames loop back inside it (rnic's loopback).
		return h.Iface.MAC, nil
	}
	ctx, cancel := context.WithTimeout(ctx, resolveTimeout)
	defer cancel()
	n, err := h.res.Resolve(ctx, peer) // probes IPv6 peers on links without link-local addresses
	if err != nil {
		return mac, err
	}
	if n.IfIndex != h.Iface.Index {
		return mac, fmt.Errorf("%v is reached through %s, not %s", peer, n.IfName, h.Iface.Name)
	}
	copy(mac[:], n.DstMAC)
	return mac, nil
}

// Stopped is closed when the engine stopped: after Close, or when its
// port failed (Err says why).
func (h *Host) Stopped() <-chan struct{} { return h.done }

// Err is why the engine stopped on its own (nil while it runs, and after
// Close).
func (h *Host) Err() error {
	select {
	case <-h.done:
		return h.runErr
	default:
		return nil
	}
}

// Close stops the host in order: the rdma_cm agent first (its last DREQs
// and REJs still go out), then the engine, then the port and the
// resolver. It returns the engine's error if it had failed.
func (h *Host) Close() error {
	h.closeMu.Do(func() { h.closeEr = h.release() })
	return h.closeEr
}

func (h *Host) release() error {
	var err error
	if h.CM != nil {
		if cerr := h.CM.Close(); cerr != nil {
			err = fmt.Errorf("closing the rdma_cm agent: %w", cerr)
		}
	}
	if h.stop != nil {
		h.stop()
		<-h.done
		if h.runErr != nil && !errors.Is(h.runErr, context.Canceled) && err == nil {
			err = fmt.Errorf("engine: %w", h.runErr)
		}
	}
	if h.Port != nil {
		if cerr := h.Port.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("closing the port: %w", cerr)
		}
	}
	if h.ctrFile != "" && h.Device != nil {
		if werr := h.writeCounters(); werr != nil && err == nil {
			err = werr
		}
	}
	if h.res != nil {
		h.res.Close()
	}
	// Last: the interface is free for the next owner.
	if cerr := h.claim.release(); cerr != nil && err == nil {
		err = fmt.Errorf("releasing the interface: %w", cerr)
	}
	return err
}

// openPort opens the configured port: AF_XDP (its steering program
// restricted to the host's GIDs, one socket per receive queue), or
// AF_PACKET, or AF_XDP falling back to AF_PACKET.
func openPort(cfg *Config, in Interface) (port.Port, PortKind, error) {
	fs, n := umemGeometry(cfg.FrameSize, cfg.UMEMSize, in.MTU)
	x := afxdp.Config{IfIndex: in.Index, LocalAddrs: in.GIDs, FrameSize: fs, NumFrames: n,
		RxBuffers: rxBuffers(cfg.RxQPs, fs, n, in.MTU)}
	switch cfg.Port {
	case AFXDP:
		p, err := openXDP(x, cfg.Queues)
		return p, AFXDP, err
	case AFPacket:
		p, err := openPacket(in)
		return p, AFPacket, err
	case Auto, "":
		p, err := openXDP(x, cfg.Queues)
		if err == nil {
			return p, AFXDP, nil
		}
		if cfg.Log != nil {
			cfg.Log.Warn("AF_XDP unavailable, using AF_PACKET", "err", err)
		}
		p2, err2 := openPacket(in)
		if err2 != nil {
			return nil, "", errors.Join(err, err2)
		}
		return p2, AFPacket, nil
	}
	return nil, "", fmt.Errorf("host: unknown port kind %q (afxdp, afpacket, auto)", cfg.Port)
}

// DefaultUMEMSize is an AF_XDP port's UMEM per queue when Config.UMEMSize
// is 0.
const DefaultUMEMSize = 16 << 20

// umemGeometry is the UMEM frame size and frame count of an AF_XDP port:
// frameSize (0: 2048 when an MTU-sized frame fits a 2048-byte chunk, else
// 4096) in umemSize bytes (0: DefaultUMEMSize). Half the frames receive:
// at MTU 1500 2 KiB chunks double them, 4096 frames in the FILL ring of
// the default UMEM instead of 2048, which is what many QPs sending into
// the host at once (fan-in) need before it drops.
func umemGeometry(frameSize int, umemSize int64, mtu int) (fs, n uint32) {
	if frameSize == 0 {
		frameSize = 4096
		if mtu+smallChunkOverhead <= 2048 {
			frameSize = 2048
		}
	}
	if umemSize == 0 {
		umemSize = DefaultUMEMSize
	}
	n = uint32(umemSize / int64(frameSize))
	for n&(n-1) != 0 { // the socket wants a power of two
		n &= n - 1
	}
	return uint32(frameSize), n
}

// The receive buffers an AF_XDP port sizes for the QPs that send into it.
const (
	// DefaultRxQPs is Config.RxQPs when 0: at MTU 1500 the default UMEM
	// already holds their buffers; at MTU 4200 it doubles its receive
	// half.
	DefaultRxQPs = 64
	// MaxRxQPs bounds Config.RxQPs.
	MaxRxQPs = 4096
	// RxBuffersPerQP is the frames each QP may have in the host's
	// receive rings at once: twice the share the device grants a
	// selective-repeat peer when all of them send (rnic: half the frames
	// shared), 32 KiB at path MTU 1024, so that the share does not shrink
	// below it.
	RxBuffersPerQP = 32
)

// rxBuffers is the receive buffers of an AF_XDP socket for rxQPs QPs
// (0: DefaultRxQPs) at MTU mtu in chunks of fs bytes: RxBuffersPerQP
// frames each, a buffer per chunk-sized segment of a frame, rounded up to
// a power of two and bounded by xsk.MaxRxBuffers; 0 (half of the n UMEM
// frames, the socket's default) when those are as many or more.
func rxBuffers(rxQPs int, fs, n uint32, mtu int) uint32 {
	if rxQPs <= 0 {
		rxQPs = DefaultRxQPs
	}
	rxQPs = min(rxQPs, MaxRxQPs)
	seg := int(fs) - 256 // XDP's headroom
	segs := (mtu + 18 + seg - 1) / seg
	want := uint64(rxQPs) * RxBuffersPerQP * uint64(max(segs, 1))
	if want <= uint64(n/2) {
		return 0
	}
	b := uint32(1)
	for uint64(b) < want && b < xsk.MaxRxBuffers {
		b <<= 1
	}
	return b
}

// smallChunkOverhead is what a 2048-byte UMEM chunk spends besides the
// frame: XDP's headroom (256 bytes) and Ethernet with a VLAN tag.
const smallChunkOverhead = 256 + 18

// CC is what a tool or the daemon asks of congestion control (the
// tools' --cc, --cc-scale and --dcqcn, the daemon's cc keys); Congestion
// turns it into the device's setting, so that both configure it the same
// way.
type CC struct {
	// Algorithm is "off" (or empty), "dcqcn", "swift" or "timely";
	// Profile one of its profiles ("": the default; rnic.NewCongestion).
	Algorithm, Profile string
	// Scale is the time dilation (0 or 1: none): rates ÷ Scale, delays ×
	// Scale, bytes and packets unchanged.
	Scale float64
	// LineRate, if > 0, replaces the profile's (undilated) line rate.
	LineRate congestion.Rate
	// ConnectX tunes DCQCN's connectx profile (nil: the firmware's
	// defaults).
	ConnectX *dcqcn.ConnectX
	// Swift overrides single Swift parameters, undilated.
	Swift SwiftKnobs
	// HostCC is when DCQCN signals host congestion
	// (rnic.Congestion.HostCC); not dilated, since the host's receive
	// rings fill at its real speed.
	HostCC dcqcn.HostCCConfig
}

// SwiftKnobs override Swift's profile where they are > 0.
type SwiftKnobs struct {
	BaseTarget, HopScale, FSRange, EndpointTarget time.Duration
	Hops                                          int
}

// ParseCC parses the tools' --cc value, ALGORITHM[:PROFILE] (dcqcn,
// dcqcn:paper, swift, timely:paper, off), and reconciles it with --dcqcn
// PROFILE, which came first and is kept: --dcqcn P alone means --cc
// dcqcn:P, --dcqcn off alone means off, and with --cc it may only name
// the profile of --cc dcqcn. Empty strings mean "not given"; neither
// given is off.
func ParseCC(cc, dcqcnProfile string) (algorithm, profile string, err error) {
	algorithm, profile, _ = strings.Cut(cc, ":")
	switch {
	case cc == "" && (dcqcnProfile == "" || dcqcnProfile == "off"):
		return "off", "", nil
	case cc == "":
		return "dcqcn", dcqcnProfile, nil
	case algorithm == "off" && profile == "" && (dcqcnProfile == "" || dcqcnProfile == "off"):
		return "off", "", nil
	case dcqcnProfile == "":
	case algorithm != "dcqcn" || dcqcnProfile == "off":
		return "", "", fmt.Errorf("--dcqcn %s conflicts with --cc %s", dcqcnProfile, cc)
	case profile != "" && profile != dcqcnProfile:
		return "", "", fmt.Errorf("--dcqcn %s conflicts with --cc %s", dcqcnProfile, cc)
	default:
		profile = dcqcnProfile
	}
	if _, ok := rnic.Algorithms[algorithm]; !ok {
		return "", "", fmt.Errorf("--cc %q: want off, dcqcn, swift or timely, optionally :PROFILE", cc)
	}
	return algorithm, profile, nil
}

// CCFlags are the tools' congestion-control flags: --cc
// ALGORITHM[:PROFILE], --cc-scale S and DCQCN's --dcqcn PROFILE and
// --dcqcn-scale S (the same as --cc-scale); see ParseCC.
type CCFlags struct {
	CC, DCQCN, HostCC string
	Scale             float64
}

// Register adds the flags to fs.
func (f *CCFlags) Register(fs *flag.FlagSet) {
	fs.StringVar(&f.CC, "cc", "", "congestion control: off, dcqcn, swift, timely, optionally :PROFILE")
	fs.StringVar(&f.DCQCN, "dcqcn", "", "DCQCN profile (paper, connectx, hpcc-mlx, off); alone: --cc dcqcn:PROFILE")
	fs.Float64Var(&f.Scale, "cc-scale", 1, "time dilation of congestion control: rates ÷ S, delays × S")
	fs.Float64Var(&f.Scale, "dcqcn-scale", 1, "the same as --cc-scale")
	fs.StringVar(&f.HostCC, "host-cc", "", "DCQCN's host-congestion signal: on, off or fill=F,rx=R,hold=D (dcqcn.ParseHostCC)")
}

// Congestion is the device's congestion control the flags ask for.
func (f *CCFlags) Congestion() (rnic.Congestion, error) {
	algo, profile, err := ParseCC(f.CC, f.DCQCN)
	if err != nil {
		return rnic.Congestion{}, err
	}
	hcc, err := dcqcn.ParseHostCC(f.HostCC)
	if err != nil {
		return rnic.Congestion{}, fmt.Errorf("--host-cc: %w", err)
	}
	return Congestion(CC{Algorithm: algo, Profile: profile, Scale: f.Scale, HostCC: hcc})
}

// Congestion is the device's congestion control for c, as
// rnic.NewCongestion gives it, with the Swift knobs applied and a pacer
// that may send a burst after a pause: pacerWindow at the line rate, at
// most maxPacerBurst. A software RNIC shares a small host with its
// applications and peers and wakes for a departure late by up to
// milliseconds; strict pacing forfeits every late wake-up (a hardware
// rate limiter has the same kind of tolerance).
func Congestion(c CC) (rnic.Congestion, error) {
	cc, err := rnic.NewCongestion(c.Algorithm, c.Profile, c.LineRate, c.Scale, c.ConnectX)
	if err != nil {
		return cc, err
	}
	if cc.Algorithm == "swift" {
		k, s := &c.Swift, cc.Scale
		set := func(dst *time.Duration, v time.Duration) {
			if v > 0 {
				*dst = time.Duration(float64(v) * s)
			}
		}
		set(&cc.Swift.BaseTarget, k.BaseTarget)
		set(&cc.Swift.HopScale, k.HopScale)
		set(&cc.Swift.FSRange, k.FSRange)
		set(&cc.Swift.EndpointTarget, k.EndpointTarget)
		if k.Hops > 0 {
			cc.Hops = k.Hops
		}
		if err := cc.Swift.Validate(); err != nil {
			return cc, err
		}
	}
	cc.HostCC = c.HostCC
	if cc.On() {
		cc.PacerBurst = int(min(float64(cc.LineRate())/8*pacerWindow.Seconds(), maxPacerBurst))
	}
	return cc, nil
}

// pacerWindow and maxPacerBurst bound the pacer's burst (Congestion).
const (
	pacerWindow   = 2 * time.Millisecond
	maxPacerBurst = 64 << 10
)

// CountersEnv names the environment variable the tools take
// Config.CountersFile from.
const CountersEnv = "SOFTRNIC_COUNTERS"

// Counters is the line Close appends to Config.CountersFile: the device's
// frames and its RC QPs' loss recovery over its life, destroyed QPs
// included.
type Counters struct {
	Interface string                 `json:"interface"`
	PID       int                    `json:"pid"`
	RxFrames  uint64                 `json:"rx_frames"`
	TxFrames  uint64                 `json:"tx_frames"`
	Recovery  verbs.RecoveryCounters `json:"recovery"`
}

func (h *Host) writeCounters() error {
	rcc := h.Device.RCCounters()
	st := h.Device.StatsSnapshot()
	b, err := json.Marshal(Counters{Interface: h.Iface.Name, PID: os.Getpid(), RxFrames: st.RxFrames, TxFrames: st.TxFrames,
		Recovery: rnic.RecoveryCountersOf(&rcc)})
	if err != nil {
		return err
	}
	f, err := os.OpenFile(h.ctrFile, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("counters: %w", err)
	}
	_, err = f.Write(append(b, '\n'))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("counters: %w", err)
	}
	return nil
}

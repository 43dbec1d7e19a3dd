package sim

import (
	"errors"
	"fmt"
	"time"

	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/congestion"
	"github.com/softrnic/softrnic/congestion/dcqcn"
	"github.com/softrnic/softrnic/congestion/hpcc"
	"github.com/softrnic/softrnic/congestion/swift"
	"github.com/softrnic/softrnic/congestion/timely"
)

// Scenario names.
const (
	TwoFlow  = "two-flow"
	NFlow    = "n-flow"
	Incast   = "incast"
	Workload = "workload"
)

// Scenarios lists the scenarios.
var Scenarios = []string{TwoFlow, NFlow, Incast, Workload}

// Options describe one run. Zero fields take the defaults documented on
// each; Defaults fills them in.
type Options struct {
	Scenario string // TwoFlow (default), NFlow, Incast or Workload
	// Algorithm is DCQCN (default), HPCC, TIMELY or Swift.
	Algorithm string
	// Flows is N for NFlow (default 4) and the number of incast senders
	// for Incast (default 16); TwoFlow and Workload ignore it.
	Flows int
	// Profile is the algorithm's parameter set: for DCQCN "paper"
	// (default; the workload's default is "hpcc-mlx"), "connectx" or
	// "hpcc-mlx"; for HPCC and TIMELY "artifact" (HPCC's ns-3 settings,
	// default) or "paper"; for Swift "default". RP and NP, when non-nil,
	// replace DCQCN's reaction and notification point; HPCC, TIMELY and
	// Swift replace those algorithms' configuration.
	Profile string
	RP      *dcqcn.Config
	// ConnectX, for the connectx profile, holds its mlx5 knobs (nil: the
	// firmware defaults); the summary lists them by name.
	ConnectX *dcqcn.ConnectX
	NP       *dcqcn.NPConfig
	HPCC     *hpcc.Config
	TIMELY   *timely.Config
	Swift    *swift.Config
	Seed     uint64
	// Duration of simulated time: two-flow 110 ms, n-flow 100 ms + N ms,
	// incast 20 ms, workload 10 ms (flows arrive during Duration; the run
	// goes on for Drain more, with no new arrivals).
	Duration, Drain time.Duration
	// LinkRate of every host link (40 Gb/s; workload 100 Gb/s);
	// LinkDelay of every link (1 µs).
	LinkRate  congestion.Rate
	LinkDelay time.Duration
	// PacketSize is a full data packet's payload (1000 bytes) and
	// HeaderBytes its headers on the wire (0 in two-flow, n-flow and
	// incast, whose PacketSize is thus the wire size, the fluid model's 1
	// KB packet; 48 in the workload, as HPCC's ns-3 counts them). HPCC's
	// packets carry INT on top: 2 bytes plus 8 per switch of the longest
	// path.
	PacketSize, HeaderBytes int
	// AckInterval is how many data packets one ACK acknowledges (1, HPCC
	// ns-3's L2_ACK_INTERVAL); a flow's last packet is always acknowledged.
	AckInterval int
	// Marking and RED configure every switch port (dequeue; 5 KB / 200 KB /
	// 1 %, the paper's values at 40 Gb/s; workload: HPCC ns-3's DCQCN map,
	// 100 KB / 400 KB / 20 % per 25 Gb/s of host rate). ScaleRED scales a
	// port's ramp with its rate over the host rate (default in the
	// workload, as HPCC's KMIN/KMAX maps do for its 400 Gb/s links).
	Marking  MarkAt
	RED      RED
	ScaleRED bool
	// Buffer is each switch port's tail-drop limit (12 MB; workload:
	// SwitchBuffer). SwitchBuffer, when > 0, is a limit on the bytes queued
	// in all ports of a switch (workload: 32 MB per 100 Gb/s of host rate,
	// HPCC ns-3's BUFFER_SIZE).
	Buffer, SwitchBuffer int64
	// PFC enables PAUSE: an ingress holding more than PFCXoff bytes pauses
	// its upstream port until it drops to PFCXon (defaults 96 KB and 96 KB
	// minus two packets; workload: SwitchBuffer/8, what HPCC ns-3's
	// dynamic threshold gives while the buffer is empty). Incast and
	// workload enable PFC unless NoPFC is set.
	PFC, NoPFC      bool
	PFCXoff, PFCXon int64
	// IncastSize is each incast sender's transfer (1 MB; workload 500 KB);
	// incast flows start at IncastStart (1 ms). In the workload, IncastFanIn
	// > 0 adds a burst every IncastEvery (1 ms): IncastFanIn random senders
	// each send IncastSize to one random receiver (fct.txt dport 200).
	IncastSize  int64
	IncastStart time.Duration
	IncastFanIn int
	IncastEvery time.Duration
	// Workload: Topology is LeafSpine (default), FatTree or HPCCTopo (the
	// HPCC paper's 320 servers at 100 Gb/s, 400 Gb/s fabric). A leaf-spine
	// has Leaves leaves (4) of HostsPerLeaf hosts (8) under Spines spines
	// (4); a fat-tree has K pods (4) of K/2 ToRs and K/2 aggregation
	// switches, (K/2)² cores and HostsPerToR hosts per ToR (K/2 ·
	// Oversub). Oversub (1) is a ToR's host bandwidth over its uplink
	// bandwidth; UplinkRate, the rate of switch-to-switch links, defaults
	// to what makes it so (leaf-spine), the host rate (fat-tree) or 400
	// Gb/s (hpcc).
	Topology                     string
	Leaves, Spines, HostsPerLeaf int
	K, HostsPerToR               int
	Oversub                      float64
	UplinkRate                   congestion.Rate
	// CDF is the flow-size distribution: "websearch" (default),
	// "fbhadoop", or a file in HPCC's traffic_gen format. Load is each
	// host's offered load as a fraction of its link (0.3): flows arrive at
	// every host as a Poisson process of rate Load·LinkRate/mean size, to
	// a uniformly random other host.
	CDF  string
	Load float64
	// TraceInterval is the period of the rate/α/queue trace rows (10 µs, or
	// 100 µs above 16 flows); statistics sample the bottleneck every µs.
	// The workload records no per-flow traces.
	TraceInterval time.Duration
	// ThroughputBin is the bin of the received-throughput trace (1 ms;
	// 100 µs for incast, which is over in a few ms). Statistics always use
	// 1 ms bins.
	ThroughputBin time.Duration
	// Retime applies a rate change to the gap the pacer is already
	// waiting out (HPCC ns-3's ChangeRate); default false: a new rate
	// applies from the next packet on, as in ns3-rdma and softrnic's
	// engine.
	Retime bool
	// WindowStart, if > 0, starts the measurement window there instead of
	// 20 ms before the end (a longer window, to see how the per-seed
	// spread of a window mean shrinks with its length). It must lie on a
	// whole millisecond before Duration.
	WindowStart time.Duration
	// Progress, if set, is called now and then with the simulated time.
	Progress func(now, end clock.Time)
}

// Defaults fills zero fields and checks the rest.
func (o *Options) Defaults() error {
	if o.Scenario == "" {
		o.Scenario = TwoFlow
	}
	if o.Algorithm == "" {
		o.Algorithm = DCQCN
	}
	work := o.Scenario == Workload
	switch o.Scenario {
	case TwoFlow:
		o.Flows = 2
	case NFlow:
		if o.Flows == 0 {
			o.Flows = 4
		}
	case Incast:
		if o.Flows == 0 {
			o.Flows = 16
		}
		if !o.NoPFC {
			o.PFC = true
		}
	case Workload:
		if err := o.workloadDefaults(); err != nil {
			return err
		}
	default:
		return fmt.Errorf("sim: unknown scenario %q (two-flow, n-flow, incast, workload)", o.Scenario)
	}
	if !work && (o.Flows < 1 || o.Flows > 4096) {
		return fmt.Errorf("sim: flows %d outside [1, 4096]", o.Flows)
	}
	if o.Profile == "" {
		switch o.Algorithm {
		case DCQCN:
			o.Profile = "paper"
		case Swift:
			o.Profile = "default"
		default:
			o.Profile = "artifact"
		}
	}
	if o.LinkRate == 0 {
		o.LinkRate = 40 * congestion.Gbps
	}
	if o.LinkDelay == 0 {
		o.LinkDelay = time.Microsecond
	}
	if o.PacketSize == 0 {
		o.PacketSize = 1000
	}
	if o.AckInterval == 0 {
		o.AckInterval = 1
	}
	if o.RED == (RED{}) {
		o.RED = RED{Kmin: 5_000, Kmax: 200_000, Pmax: 0.01}
	}
	if o.Buffer == 0 {
		o.Buffer = 12_000_000
	}
	if o.PFCXoff == 0 {
		o.PFCXoff = 96_000
	}
	if o.PFCXon == 0 {
		o.PFCXon = o.PFCXoff - 2*int64(o.PacketSize+o.HeaderBytes)
	}
	if o.IncastSize == 0 {
		o.IncastSize = 1_000_000
	}
	if o.IncastStart == 0 {
		o.IncastStart = time.Millisecond
	}
	if o.Duration == 0 {
		switch o.Scenario {
		case TwoFlow:
			o.Duration = 110 * time.Millisecond
		case NFlow:
			o.Duration = 100*time.Millisecond + time.Duration(o.Flows)*time.Millisecond
		case Incast:
			o.Duration = 20 * time.Millisecond
		case Workload:
			o.Duration = 10 * time.Millisecond
		}
	}
	if o.TraceInterval == 0 {
		o.TraceInterval = 10 * time.Microsecond
		if o.Flows > 16 {
			o.TraceInterval = 100 * time.Microsecond
		}
	}
	if o.ThroughputBin == 0 {
		o.ThroughputBin = time.Millisecond
		if o.Scenario == Incast {
			o.ThroughputBin = 100 * time.Microsecond
		}
	}
	switch {
	case o.ThroughputBin < time.Microsecond || o.ThroughputBin > time.Second:
		return errors.New("sim: throughput bin outside [1µs, 1s]")
	case !(o.LinkRate > 0) || o.LinkDelay < 0:
		return errors.New("sim: need a positive link rate and a non-negative delay")
	case o.PacketSize < 64 || o.PacketSize > 1<<16 || o.HeaderBytes < 0 || o.HeaderBytes > 1024:
		return fmt.Errorf("sim: packet size %d outside [64, 65536] or headers %d outside [0, 1024]", o.PacketSize, o.HeaderBytes)
	case o.AckInterval < 1:
		return errors.New("sim: ACK interval must be ≥ 1")
	case o.Duration < time.Millisecond || o.Duration > time.Hour || o.Drain < 0 || o.Drain > time.Hour:
		return fmt.Errorf("sim: duration %v outside [1ms, 1h] or drain %v outside [0, 1h]", o.Duration, o.Drain)
	case o.TraceInterval < time.Microsecond || o.TraceInterval%time.Microsecond != 0:
		return errors.New("sim: trace interval must be a whole number of µs")
	case o.RED.Kmin < 0 || o.RED.Kmax <= o.RED.Kmin || o.RED.Pmax < 0 || o.RED.Pmax > 1:
		return errors.New("sim: need 0 ≤ Kmin < Kmax and Pmax in [0,1]")
	case o.PFCXon < 0 || o.PFCXon > o.PFCXoff:
		return errors.New("sim: need 0 ≤ PFC XON ≤ XOFF")
	case o.IncastSize < 0 || o.IncastStart < 0 || o.Buffer <= 0 || o.SwitchBuffer < 0:
		return errors.New("sim: negative incast size or start, or no buffer")
	case o.WindowStart < 0 || o.WindowStart%time.Millisecond != 0 || (o.WindowStart > 0 && o.WindowStart+time.Millisecond > o.Duration):
		return errors.New("sim: window start must be a whole ms at least 1 ms before the end")
	}
	return nil
}

// workloadDefaults fills the workload scenario's defaults, which differ
// from the others' (HPCC ns-3's settings at 100 Gb/s).
func (o *Options) workloadDefaults() error {
	if o.Algorithm == DCQCN && o.Profile == "" {
		o.Profile = "hpcc-mlx"
	}
	if o.Topology == "" {
		o.Topology = LeafSpine
	}
	if o.LinkRate == 0 {
		o.LinkRate = 100 * congestion.Gbps
	}
	if o.HeaderBytes == 0 {
		o.HeaderBytes = 48
	}
	if o.Oversub == 0 {
		o.Oversub = 1
	}
	if !(o.Oversub > 0 && o.Oversub <= 64) {
		return fmt.Errorf("sim: oversubscription %v outside (0, 64]", o.Oversub)
	}
	perHost := o.LinkRate
	switch o.Topology {
	case LeafSpine:
		if o.Leaves == 0 {
			o.Leaves = 4
		}
		if o.Spines == 0 {
			o.Spines = 4
		}
		if o.HostsPerLeaf == 0 {
			o.HostsPerLeaf = 8
		}
		if o.UplinkRate == 0 {
			o.UplinkRate = congestion.Rate(float64(o.HostsPerLeaf) * float64(perHost) / (float64(o.Spines) * o.Oversub))
		}
		if o.Leaves < 1 || o.Spines < 1 || o.HostsPerLeaf < 1 || o.Leaves*o.HostsPerLeaf < 2 || o.Leaves*o.HostsPerLeaf > 100_000 {
			return fmt.Errorf("sim: leaf-spine %d×%d hosts, %d spines", o.Leaves, o.HostsPerLeaf, o.Spines)
		}
	case FatTree:
		if o.K == 0 {
			o.K = 4
		}
		if o.K < 2 || o.K%2 != 0 || o.K > 64 {
			return fmt.Errorf("sim: fat-tree k = %d: want an even k in [2, 64]", o.K)
		}
		if o.HostsPerToR == 0 {
			o.HostsPerToR = max(int(float64(o.K/2)*o.Oversub+0.5), 1)
		}
		if o.UplinkRate == 0 {
			o.UplinkRate = perHost
		}
	case HPCCTopo:
		if o.UplinkRate == 0 {
			o.UplinkRate = 4 * perHost
		}
	default:
		return fmt.Errorf("sim: unknown topology %q (leaf-spine, fat-tree, hpcc)", o.Topology)
	}
	if o.RED == (RED{}) {
		k := float64(perHost) / (25 * float64(congestion.Gbps))
		o.RED = RED{Kmin: int64(100_000 * k), Kmax: int64(400_000 * k), Pmax: 0.2}
		o.ScaleRED = true
	}
	if o.SwitchBuffer == 0 {
		o.SwitchBuffer = int64(32e6 * float64(perHost) / (100 * float64(congestion.Gbps)))
	}
	if o.Buffer == 0 {
		o.Buffer = o.SwitchBuffer
	}
	if !o.NoPFC {
		o.PFC = true
	}
	if o.PFCXoff == 0 {
		o.PFCXoff = max(o.SwitchBuffer/8, 96_000)
	}
	if o.CDF == "" {
		o.CDF = "websearch"
	}
	if o.Load == 0 {
		o.Load = 0.3
	}
	if !(o.Load > 0 && o.Load <= 1) {
		return fmt.Errorf("sim: load %v outside (0, 1]", o.Load)
	}
	if o.IncastFanIn < 0 {
		return errors.New("sim: negative incast fan-in")
	}
	if o.IncastFanIn > 0 {
		if o.IncastSize == 0 {
			o.IncastSize = 500_000
		}
		if o.IncastEvery == 0 {
			o.IncastEvery = time.Millisecond
		}
		if o.IncastEvery < time.Microsecond {
			return errors.New("sim: incast period under 1 µs")
		}
	}
	return nil
}

// Profiles returns the reaction- and notification-point configurations of a
// named profile at a line rate.
func Profiles(name string, lineRate congestion.Rate) (dcqcn.Config, dcqcn.NPConfig, error) {
	switch name {
	case "paper":
		return dcqcn.Paper(lineRate), dcqcn.PaperNP(), nil
	case "connectx":
		cx := dcqcn.DefaultConnectX()
		return cx.Config(lineRate), cx.NPConfig(), nil
	case "hpcc-mlx":
		// HPCC ns-3 answers every marked packet; coalescing is the RP's.
		return dcqcn.HPCCMellanox(lineRate), dcqcn.NPConfig{}, nil
	}
	return dcqcn.Config{}, dcqcn.NPConfig{}, fmt.Errorf("sim: unknown profile %q (paper, connectx, hpcc-mlx)", name)
}

// flowSpec is a flow of the small scenarios.
type flowSpec struct {
	src, dst int32
	start    time.Duration
	size     int64
}

// topology builds the scenario's nodes, links and routes and returns the
// small scenarios' flows.
func (b *builder) topology() []flowSpec {
	o, n := b.o, b.n
	var specs []flowSpec
	switch o.Scenario {
	case TwoFlow, NFlow:
		sw := b.node("sw", switchNode)
		r := b.node("r", hostNode)
		toR, _ := b.link(sw, r)
		n.bottleneck = toR
		for i := 0; i < o.Flows; i++ {
			h := b.node(fmt.Sprintf("h%d", i+1), hostNode)
			b.link(h, sw)
			start := time.Duration(i) * time.Millisecond
			if o.Scenario == TwoFlow {
				start = time.Duration(i) * 10 * time.Millisecond
			}
			specs = append(specs, flowSpec{h, r, start, 0})
		}
	case Incast:
		// sw1 holds the victim's sender and one incast sender; sw2 holds the
		// other incast senders, the incast receiver r and the victim's
		// receiver rv. The victim never crosses the congested port sw2->r,
		// and the sw1->sw2 cable runs at twice the host rate so that it is
		// never a bottleneck itself; but the victim shares that cable with
		// an incast flow, so PFC PAUSEs from sw2 stop it too.
		sw1 := b.node("sw1", switchNode)
		sw2 := b.node("sw2", switchNode)
		b.linkAt(sw1, sw2, 2*o.LinkRate)
		r := b.node("r", hostNode)
		toR, _ := b.link(sw2, r)
		n.bottleneck = toR
		rv := b.node("rv", hostNode)
		b.link(sw2, rv)
		v := b.node("v", hostNode)
		b.link(v, sw1)
		specs = append(specs, flowSpec{v, rv, 0, 0})
		for i := 0; i < o.Flows; i++ {
			h := b.node(fmt.Sprintf("i%d", i+1), hostNode)
			if i == 0 {
				b.link(h, sw1)
			} else {
				b.link(h, sw2)
			}
			specs = append(specs, flowSpec{h, r, o.IncastStart, o.IncastSize})
		}
	case Workload:
		b.buildWorkloadTopology()
	}
	b.routes()
	return specs
}

// configure builds the topology and the algorithm on it: everything but
// the flows.
func configure(o *Options) (*net, *builder, []flowSpec, fabric, error) {
	n := &net{free: -1, retime: o.Retime, pfc: o.PFC, xoff: o.PFCXoff, xon: o.PFCXon, bottleneck: -1,
		binWidth: clock.Time(time.Millisecond), traceWidth: clock.Time(o.ThroughputBin), end: clock.Time(o.Duration + o.Drain),
		progress: o.Progress, q: newEvq(), bins: o.Scenario != Workload}
	b := &builder{n: n, o: o}
	specs := b.topology()
	n.payload, n.hdr = o.PacketSize, o.HeaderBytes
	fb, switches := b.fabricOf(n.payload+n.hdr, n.payload)
	alg, err := newAlgorithm(o, fb)
	if err != nil {
		return nil, nil, nil, fb, err
	}
	n.alg = alg
	n.pktSize, n.ackSize = n.payload+n.hdr, AckSize
	if alg.int {
		// HPCC's INT header: a record of 8 bytes per switch and a hop count.
		n.intStride = switches
		n.pktSize += 2 + 8*switches
		n.ackSize += 2 + 8*switches
	}
	n.acks, n.ackInterval = alg.acks, o.AckInterval
	n.cfg = describe(o, alg, fb, n)
	return n, b, specs, fb, nil
}

// build creates the scenario's topology, its algorithm and flows, and
// names its bottleneck port (the switch port towards the receiver; none in
// the workload).
func build(o *Options) (*net, error) {
	n, b, specs, _, err := configure(o)
	if err != nil {
		return nil, err
	}
	for _, sp := range specs {
		if err := n.alg.attach(b.flow(sp.src, sp.dst, sp.start, sp.size)); err != nil {
			return nil, err
		}
	}
	if o.Scenario == Workload {
		if err := b.workload(); err != nil {
			return nil, err
		}
	} else {
		n.ports[n.bottleneck].monitored = true
	}
	for i := range n.flows {
		n.schedule(n.flows[i].start, evFlowStart, int32(i), -1, 0)
	}
	return n, nil
}

// Resolved is what a run's algorithm would run with, after the defaults
// and the topology's delays are applied: the configuration of the one
// algorithm the Options name (the others are zero), and the run's
// description.
type Resolved struct {
	RP     dcqcn.Config
	NP     dcqcn.NPConfig
	HPCC   hpcc.Config
	TIMELY timely.Config
	Swift  swift.Config
	Config RunConfig
}

// Configure resolves o without running it, for callers that adjust one
// parameter of a profile whose others depend on the topology (HPCC's T,
// Swift's targets).
func Configure(o Options) (*Resolved, error) {
	if err := o.Defaults(); err != nil {
		return nil, err
	}
	n, _, _, _, err := configure(&o)
	if err != nil {
		return nil, err
	}
	a := n.alg
	return &Resolved{RP: a.rp, NP: a.np, HPCC: a.hp, TIMELY: a.tm, Swift: a.sw, Config: n.cfg}, nil
}

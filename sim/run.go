package sim

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/congestion"
	"github.com/softrnic/softrnic/congestion/dcqcn"
)

// Scenario names.
const (
	TwoFlow = "two-flow"
	NFlow   = "n-flow"
	Incast  = "incast"
)

// Options describe one run. Zero fields take the defaults documented on
// each; Defaults fills them in.
type Options struct {
	Scenario string // TwoFlow (default), NFlow or Incast
	// Flows is N for NFlow (default 4) and the number of incast senders
	// for Incast (default 16); TwoFlow ignores it.
	Flows int
	// Profile is "paper" (default), "connectx" or "hpcc-mlx"; RP and NP,
	// when non-nil, replace the profile's reaction and notification point.
	Profile string
	RP      *dcqcn.Config
	// ConnectX, for the connectx profile, holds its mlx5 knobs (nil: the
	// firmware defaults); the summary lists them by name.
	ConnectX *dcqcn.ConnectX
	NP       *dcqcn.NPConfig
	Seed     uint64
	// Duration of simulated time: two-flow 110 ms, n-flow 100 ms + N ms,
	// incast 20 ms.
	Duration time.Duration
	// LinkRate of every link (40 Gb/s); LinkDelay of every link (1 µs).
	LinkRate  congestion.Rate
	LinkDelay time.Duration
	// PacketSize is the data packet size on the wire (1000 bytes, the
	// fluid model's 1 KB packet).
	PacketSize int
	// Marking and RED configure every switch port (dequeue; 5 KB / 200 KB /
	// 1 %, the paper's values at 40 Gb/s).
	Marking MarkAt
	RED     RED
	// Buffer is each switch port's tail-drop limit (12 MB).
	Buffer int64
	// PFC enables PAUSE: an ingress holding more than PFCXoff bytes pauses
	// its upstream port until it drops to PFCXon (defaults 96 KB and 96 KB
	// minus two packets). Incast enables PFC unless NoPFC is set.
	PFC, NoPFC      bool
	PFCXoff, PFCXon int64
	// IncastSize is each incast sender's transfer (1 MB); incast flows
	// start at IncastStart (1 ms).
	IncastSize  int64
	IncastStart time.Duration
	// TraceInterval is the period of the rate/α/queue trace rows (10 µs, or
	// 100 µs above 16 flows); statistics sample the bottleneck every µs.
	TraceInterval time.Duration
	// ThroughputBin is the bin of the received-throughput trace (1 ms;
	// 100 µs for incast, which is over in a few ms). Statistics always use
	// 1 ms bins.
	ThroughputBin time.Duration
	// Retime applies an RP rate change to the gap the pacer is already
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
	default:
		return fmt.Errorf("sim: unknown scenario %q (two-flow, n-flow, incast)", o.Scenario)
	}
	if o.Flows < 1 || o.Flows > 4096 {
		return fmt.Errorf("sim: flows %d outside [1, 4096]", o.Flows)
	}
	if o.Profile == "" {
		o.Profile = "paper"
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
		o.PFCXon = o.PFCXoff - 2*int64(o.PacketSize)
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
	case o.LinkRate < 0 || o.LinkDelay < 0:
		return errors.New("sim: negative link rate or delay")
	case o.PacketSize < 64 || o.PacketSize > 1<<16:
		return fmt.Errorf("sim: packet size %d outside [64, 65536]", o.PacketSize)
	case o.Duration < time.Millisecond || o.Duration > time.Hour:
		return fmt.Errorf("sim: duration %v outside [1ms, 1h]", o.Duration)
	case o.TraceInterval < time.Microsecond || o.TraceInterval%time.Microsecond != 0:
		return errors.New("sim: trace interval must be a whole number of µs")
	case o.RED.Kmin < 0 || o.RED.Kmax <= o.RED.Kmin || o.RED.Pmax < 0 || o.RED.Pmax > 1:
		return errors.New("sim: need 0 ≤ Kmin < Kmax and Pmax in [0,1]")
	case o.PFCXon < 0 || o.PFCXon > o.PFCXoff:
		return errors.New("sim: need 0 ≤ PFC XON ≤ XOFF")
	case o.IncastSize < 0 || o.IncastStart < 0:
		return errors.New("sim: negative incast size or start")
	case o.WindowStart < 0 || o.WindowStart%time.Millisecond != 0 || (o.WindowStart > 0 && o.WindowStart+time.Millisecond > o.Duration):
		return errors.New("sim: window start must be a whole ms at least 1 ms before the end")
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

// builder assembles a topology.
type builder struct {
	n   *net
	o   *Options
	rp  dcqcn.Config
	np  dcqcn.NPConfig
	err error
}

func (b *builder) node(name string, k nodeKind) int32 {
	b.n.nodes = append(b.n.nodes, node{name: name, kind: k, wakeAt: clock.Never})
	return int32(len(b.n.nodes) - 1)
}

// link joins a and b with a cable of the default rate: one port in each
// direction.
func (b *builder) link(a, c int32) (ac, ca int32) { return b.linkAt(a, c, b.o.LinkRate) }

func (b *builder) linkAt(a, c int32, rate congestion.Rate) (ac, ca int32) {
	n := b.n
	mk := func(from, to int32) int32 {
		n.ports = append(n.ports, port{
			name: n.nodes[from].name + "->" + n.nodes[to].name, node: from, peer: to,
			rate: rate, delay: clock.Time(b.o.LinkDelay),
			data: fifo{-1, -1}, hi: fifo{-1, -1}, limit: b.o.Buffer,
			markAt: MarkOff, red: b.o.RED,
		})
		id := int32(len(n.ports) - 1)
		if n.nodes[from].kind == switchNode {
			n.ports[id].markAt = b.o.Marking
			// One PCG stream per port, keyed by the port's index, so
			// adding a port elsewhere leaves the others' draws alone.
			n.ports[id].rng = rand.New(rand.NewPCG(b.o.Seed, 0x5eed0000+uint64(id)))
		}
		n.nodes[from].ports = append(n.nodes[from].ports, id)
		return id
	}
	ac, ca = mk(a, c), mk(c, a)
	n.ports[ac].reverse, n.ports[ca].reverse = ca, ac
	return
}

func (b *builder) flow(src, dst int32, start time.Duration, size int64) {
	n := b.n
	f := flow{id: len(n.flows), src: src, dst: dst, start: clock.Time(start), size: size,
		finish: -1, rpAt: clock.Never, npAt: clock.Never, rate: b.rp.LineRate}
	if err := f.rp.Init(b.rp); err != nil && b.err == nil {
		b.err = err
	}
	f.np.Init(b.np)
	n.flows = append(n.flows, f)
	n.nodes[src].flows = append(n.nodes[src].flows, int32(f.id))
}

// routes gives every switch an egress port per destination: a breadth-first
// search back from each destination, visiting ports in creation order, so
// the shortest path chosen is the same on every run. Hosts do not forward.
func (b *builder) routes() {
	n := b.n
	for i := range n.nodes {
		if n.nodes[i].kind == switchNode {
			n.nodes[i].route = make([]int32, len(n.nodes))
			for j := range n.nodes[i].route {
				n.nodes[i].route[j] = -1
			}
		}
	}
	for d := range n.nodes {
		if n.nodes[d].kind != hostNode {
			continue
		}
		seen := make([]bool, len(n.nodes))
		seen[d] = true
		queue := []int32{int32(d)}
		for len(queue) > 0 {
			u := queue[0]
			queue = queue[1:]
			if u != int32(d) && n.nodes[u].kind == hostNode {
				continue
			}
			for _, pi := range n.nodes[u].ports {
				v := n.ports[pi].peer
				if seen[v] {
					continue
				}
				seen[v] = true
				if n.nodes[v].kind == switchNode {
					n.nodes[v].route[d] = n.ports[pi].reverse
				}
				queue = append(queue, v)
			}
		}
	}
}

// build creates the scenario's topology and flows and names its bottleneck
// port (the switch port towards the receiver).
func build(o *Options) (*net, error) {
	rp, np, err := Profiles(o.Profile, o.LinkRate)
	if err != nil {
		return nil, err
	}
	if o.ConnectX != nil {
		if o.Profile != "connectx" {
			return nil, fmt.Errorf("sim: ConnectX knobs given for profile %q", o.Profile)
		}
		rp, np = o.ConnectX.Config(o.LinkRate), o.ConnectX.NPConfig()
	}
	if o.RP != nil {
		rp = *o.RP
	}
	if o.NP != nil {
		np = *o.NP
	}
	n := &net{free: -1, pktSize: o.PacketSize, retime: o.Retime, pfc: o.PFC, xoff: o.PFCXoff, xon: o.PFCXon,
		binWidth: clock.Time(time.Millisecond), traceWidth: clock.Time(o.ThroughputBin), end: clock.Time(o.Duration), progress: o.Progress}
	n.cfg = describe(o, rp, np)
	b := &builder{n: n, o: o, rp: rp, np: np}
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
			b.flow(h, r, start, 0)
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
		b.flow(v, rv, 0, 0)
		for i := 0; i < o.Flows; i++ {
			h := b.node(fmt.Sprintf("i%d", i+1), hostNode)
			if i == 0 {
				b.link(h, sw1)
			} else {
				b.link(h, sw2)
			}
			b.flow(h, r, o.IncastStart, o.IncastSize)
		}
	}
	if b.err != nil {
		return nil, b.err
	}
	b.routes()
	n.ports[n.bottleneck].monitored = true
	for i := range n.flows {
		n.schedule(n.flows[i].start, evFlowStart, int32(i), -1, 0)
	}
	return n, nil
}

package sim

import (
	"fmt"
	"time"

	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/congestion"
	"github.com/softrnic/softrnic/congestion/dcqcn"
	"github.com/softrnic/softrnic/congestion/hpcc"
	"github.com/softrnic/softrnic/congestion/swift"
	"github.com/softrnic/softrnic/congestion/timely"
)

// Algorithm names.
const (
	DCQCN  = "dcqcn"
	HPCC   = "hpcc"
	TIMELY = "timely"
	Swift  = "swift"
)

// Algorithms lists the algorithms the simulator runs.
var Algorithms = []string{DCQCN, HPCC, TIMELY, Swift}

// algorithm is one congestion-control algorithm as a run uses it: its
// configuration (one per run: every flow starts from it), what it needs
// from the network, and how its state shows in the traces.
type algorithm struct {
	name     string
	acks     bool // flows need ACKs (every ACK-clocked algorithm)
	int      bool // switches push INT records (HPCC)
	windowed bool // the controller's window bounds bytes in flight

	rp dcqcn.Config
	np dcqcn.NPConfig
	hp hpcc.Config
	tm timely.Config
	sw swift.Config

	// cols name the two per-flow trace columns besides the rate; the
	// figure's last panel shows the second.
	cols [2]traceCol

	free []congestion.Controller // controllers of finished flows, for reuse
}

type traceCol struct {
	name, label string
	prec        int
}

// fabric is what an algorithm's configuration is derived from.
type fabric struct {
	hostRate  congestion.Rate
	baseRTT   time.Duration // the largest base RTT between two hosts (HPCC's GLOBAL_T)
	hopRTT    time.Duration // what one more switch hop adds to a base RTT
	pktSize   int           // wire bytes of a full data packet
	linkDelay time.Duration
}

// newAlgorithm configures name/profile on a fabric. Options.RP/NP (DCQCN)
// and Options.HPCC/TIMELY/Swift replace the profile's configuration.
func newAlgorithm(o *Options, fb fabric) (*algorithm, error) {
	a := &algorithm{name: o.Algorithm}
	switch o.Algorithm {
	case DCQCN:
		rp, np, err := Profiles(o.Profile, fb.hostRate)
		if err != nil {
			return nil, err
		}
		if o.ConnectX != nil {
			if o.Profile != "connectx" {
				return nil, fmt.Errorf("sim: ConnectX knobs given for profile %q", o.Profile)
			}
			rp, np = o.ConnectX.Config(fb.hostRate), o.ConnectX.NPConfig()
		}
		if o.RP != nil {
			rp = *o.RP
		}
		if o.NP != nil {
			np = *o.NP
		}
		if err := rp.Validate(); err != nil {
			return nil, err
		}
		a.rp, a.np = rp, np
		a.acks = o.Scenario == Workload
		a.cols = [2]traceCol{{"target_gbps", "R_T (Gb/s)", 4}, {"alpha", "α", 6}}
	case HPCC:
		switch o.Profile {
		case "", "artifact":
			a.hp = hpcc.Artifact(fb.hostRate, fb.baseRTT)
		case "paper":
			a.hp = hpcc.Paper(fb.hostRate, fb.baseRTT)
		default:
			return nil, fmt.Errorf("sim: unknown hpcc profile %q (artifact, paper)", o.Profile)
		}
		if o.HPCC != nil {
			a.hp = *o.HPCC
		}
		if err := a.hp.Validate(); err != nil {
			return nil, err
		}
		a.acks, a.int, a.windowed = true, true, true
		a.cols = [2]traceCol{{"window_kb", "W (KB)", 3}, {"u", "U", 4}}
	case TIMELY:
		switch o.Profile {
		case "", "artifact":
			a.tm = timely.Artifact(fb.hostRate)
		case "paper":
			a.tm = timely.Paper(fb.hostRate)
		default:
			return nil, fmt.Errorf("sim: unknown timely profile %q (artifact, paper)", o.Profile)
		}
		if o.TIMELY != nil {
			a.tm = *o.TIMELY
		}
		if err := a.tm.Validate(); err != nil {
			return nil, err
		}
		a.acks = true
		a.cols = [2]traceCol{{"gradient", "gradient", 4}, {"rtt_us", "RTT (µs)", 3}}
	case Swift:
		if o.Profile != "" && o.Profile != "default" {
			return nil, fmt.Errorf("sim: unknown swift profile %q (default)", o.Profile)
		}
		a.sw = SwiftFor(fb)
		if o.Swift != nil {
			a.sw = *o.Swift
		}
		if err := a.sw.Validate(); err != nil {
			return nil, err
		}
		a.acks, a.windowed = true, true
		a.cols = [2]traceCol{{"target_us", "target delay (µs)", 3}, {"cwnd_pkts", "cwnd (packets)", 4}}
	default:
		return nil, fmt.Errorf("sim: unknown algorithm %q (dcqcn, hpcc, timely, swift)", o.Algorithm)
	}
	return a, nil
}

// SwiftFor derives Swift's delays from a fabric. A path through s switches
// has a base RTT of about (s+1)·hopRTT, hopRTT being two link delays and a
// packet's serialisation; the fabric target is base + s·h + flow scaling
// with base = hopRTT plus ten packets of queueing at the host rate (the
// paper's "queuing delay for a small number of flows") and h = hopRTT, so
// every path gets the same queueing allowance on top of its own base RTT;
// flow scaling adds up to 5× base (htsim's choice). The endpoint target is
// base: the simulator's hosts answer at once.
func SwiftFor(fb fabric) swift.Config {
	q := 10 * time.Duration(fb.hostRate.TxTime(fb.pktSize))
	base := fb.hopRTT + q
	return swift.Default(fb.pktSize, fb.hostRate, fb.baseRTT, base, fb.hopRTT, 5*base)
}

// get returns a controller at its initial state, reusing a finished one.
func (a *algorithm) get() (congestion.Controller, error) {
	var c congestion.Controller
	if k := len(a.free); k > 0 {
		c = a.free[k-1]
		a.free = a.free[:k-1]
	} else {
		switch a.name {
		case DCQCN:
			c = new(dcqcn.RP)
		case HPCC:
			c = new(hpcc.CC)
		case TIMELY:
			c = new(timely.CC)
		default:
			c = new(swift.CC)
		}
	}
	var err error
	switch c := c.(type) {
	case *dcqcn.RP:
		err = c.Init(a.rp)
	case *hpcc.CC:
		err = c.Init(a.hp)
	case *timely.CC:
		err = c.Init(a.tm)
	case *swift.CC:
		err = c.Init(a.sw)
	}
	return c, err
}

func (a *algorithm) put(c congestion.Controller) { a.free = append(a.free, c) }

// attach gives flow f a fresh controller (and for DCQCN its NP).
func (a *algorithm) attach(f *flow) error {
	c, err := a.get()
	if err != nil {
		return err
	}
	f.cc, f.rate, f.ccAt = c, c.Rate(), clock.Never
	if rp, ok := c.(*dcqcn.RP); ok {
		f.rp = rp
		f.np.Init(a.np)
	}
	return nil
}

// detach returns a finished flow's controller for reuse.
func (a *algorithm) detach(f *flow) {
	if f.cc != nil {
		a.put(f.cc)
	}
	f.cc, f.rp, f.ccAt = nil, nil, clock.Never
}

// sample is a flow's trace row: rate, then the two columns.
func (a *algorithm) sample(f *flow, now clock.Time) (rate, x, y float64) {
	switch c := f.cc.(type) {
	case *dcqcn.RP:
		return c.Rate().Gbps(), c.Target().Gbps(), c.AlphaAt(now)
	case *hpcc.CC:
		return c.Rate().Gbps(), float64(c.Window()) / 1e3, c.U()
	case *timely.CC:
		return c.Rate().Gbps(), c.Gradient(), float64(c.LastRTT()) / 1e3
	case *swift.CC:
		return c.Rate().Gbps(), float64(c.Target()) / 1e3, c.Cwnd()
	}
	return 0, 0, 0
}

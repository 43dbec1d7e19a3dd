// Package timely implements TIMELY (Mittal et al., SIGCOMM 2015), the
// RTT-gradient rate controller: a sender that reads queueing from the
// round-trip times its ACKs give and steers its rate by their gradient.
//
// The paper's Algorithm 1, run on each update event with the event's RTT
// sample new_rtt:
//
//	new_rtt_diff = new_rtt − prev_rtt;  prev_rtt = new_rtt
//	rtt_diff = (1 − α)·rtt_diff + α·new_rtt_diff
//	gradient = rtt_diff / minRTT
//	if new_rtt < T_low:   rate ← rate + δ
//	elif new_rtt > T_high: rate ← rate·(1 − β·(1 − T_high/new_rtt))
//	elif gradient ≤ 0:     rate ← rate + N·δ   (N = 5 after five events in a
//	                                            row with gradient ≤ 0, else 1)
//	else:                  rate ← rate·(1 − β·gradient)
//
// An update event is a completion event in the paper (a segment of data
// acknowledged) and once per round trip in HPCC's ns-3 (the first ACK that
// acknowledges data sent after the previous update); Config.Segment picks.
// The first event only records prev_rtt. HPCC's ns-3 also counts hyper
// increase differently (after five increases of any kind, the increase is
// N·δ, whichever branch made it); Config.HAIAnyIncrease selects that.
package timely

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/congestion"
)

// Config is every parameter of a TIMELY sender.
type Config struct {
	// LineRate is the start rate and the ceiling; MinRate the floor.
	LineRate, MinRate congestion.Rate
	// TLow and THigh bound the gradient region (paper 50 µs, 500 µs).
	TLow, THigh time.Duration
	// MinRTT normalises the gradient (20 µs).
	MinRTT time.Duration
	// Alpha is the EWMA weight of a new RTT difference (0.875).
	Alpha float64
	// Beta is the multiplicative decrease factor (0.8).
	Beta float64
	// AddStep is δ (10 Mb/s at 10 Gb/s in the paper; HPCC's ns-3 scales
	// it with the line rate, 100 Mb/s at 100 Gb/s).
	AddStep congestion.Rate
	// HAIThreshold is how many events in a row must qualify before an
	// increase is hyper (5); HAIFactor is N (5).
	HAIThreshold, HAIFactor int
	// HAIAnyIncrease counts consecutive increases of any kind, and makes
	// every increase past the threshold hyper (HPCC's ns-3). False: the
	// paper — consecutive events with a non-positive gradient, and only
	// the gradient branch's increase is hyper.
	HAIAnyIncrease bool
	// Segment, when > 0, makes an update event of every Segment bytes
	// acknowledged (the paper's completion events). 0: one event per round
	// trip (HPCC's ns-3).
	Segment int64
}

// Validate reports a Config that cannot run.
func (c *Config) Validate() error {
	switch {
	case !(c.LineRate > 0):
		return errors.New("timely: LineRate must be > 0")
	case !(c.MinRate >= 0) || c.MinRate > c.LineRate:
		return fmt.Errorf("timely: MinRate %v outside [0, LineRate]", c.MinRate)
	case c.TLow < 0 || c.THigh <= c.TLow:
		return errors.New("timely: need 0 ≤ TLow < THigh")
	case c.MinRTT <= 0:
		return errors.New("timely: MinRTT must be > 0")
	case !(c.Alpha > 0 && c.Alpha <= 1):
		return fmt.Errorf("timely: α %v outside (0, 1]", c.Alpha)
	case !(c.Beta > 0 && c.Beta <= 1):
		return fmt.Errorf("timely: β %v outside (0, 1]", c.Beta)
	case !(c.AddStep >= 0) || math.IsInf(float64(c.AddStep), 0):
		return errors.New("timely: δ must be ≥ 0")
	case c.HAIThreshold < 0 || c.HAIFactor < 1:
		return errors.New("timely: need HAIThreshold ≥ 0 and HAIFactor ≥ 1")
	case c.Segment < 0:
		return errors.New("timely: negative Segment")
	}
	return nil
}

// Paper is the SIGCOMM 2015 parameter set with δ scaled from its 10 Gb/s
// value to lineRate: T_low 50 µs, T_high 500 µs, minRTT 20 µs, α 0.875,
// β 0.8, δ = 10 Mb/s per 10 Gb/s, N = 5 after five events, one event per
// 16 KB acknowledged (the paper's NIC completes segments of 16–64 KB), a
// floor of one δ.
func Paper(lineRate congestion.Rate) Config {
	d := 10 * congestion.Mbps * lineRate / (10 * congestion.Gbps)
	return Config{
		LineRate: lineRate, MinRate: d,
		TLow: 50 * time.Microsecond, THigh: 500 * time.Microsecond, MinRTT: 20 * time.Microsecond,
		Alpha: 0.875, Beta: 0.8, AddStep: d, HAIThreshold: 5, HAIFactor: 5,
		Segment: 16 << 10,
	}
}

// Artifact is TIMELY as HPCC's ns-3 runs it (run.py --cc timely): the
// paper's thresholds and gains, δ = C/100, hyper increase 5·δ after five
// increases of any kind, one update per round trip, a 1 Gb/s floor.
func Artifact(lineRate congestion.Rate) Config {
	c := Paper(lineRate)
	c.MinRate = min(1*congestion.Gbps, lineRate)
	c.HAIAnyIncrease = true
	c.Segment = 0
	return c
}

// Counters count update events by the branch they took.
type Counters struct {
	Events                            uint64
	LowIncreases, HighDecreases       uint64
	GradientIncreases, HyperIncreases uint64
	GradientDecreases                 uint64
}

// CC is one flow's TIMELY sender state. It implements congestion.Controller
// and never allocates.
type CC struct {
	cfg     Config
	rate    congestion.Rate
	prevRTT float64 // ns; 0 until the first event
	diff    float64 // rtt_diff, ns
	streak  int     // events in a row that qualify for hyper increase
	grad    float64 // the last event's normalised gradient

	sent, acked int64
	nextEvent   int64 // acked bytes at which the next event is due
	started     bool

	Counters
}

var _ congestion.Controller = (*CC)(nil)

// New returns a controller at line rate, or an error for an invalid Config.
func New(cfg Config) (*CC, error) {
	c := new(CC)
	if err := c.Init(cfg); err != nil {
		return nil, err
	}
	return c, nil
}

// Init (re)initialises c in place.
func (c *CC) Init(cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	*c = CC{cfg: cfg, rate: cfg.LineRate}
	return nil
}

// Config returns the parameters c runs with.
func (c *CC) Config() Config { return c.cfg }

// Rate is the current rate.
func (c *CC) Rate() congestion.Rate { return c.rate }

// RTTDiff is the smoothed RTT difference; Gradient the last normalised
// gradient; LastRTT the last event's RTT sample.
func (c *CC) RTTDiff() time.Duration           { return time.Duration(c.diff) }
func (c *CC) Gradient() float64                { return c.grad }
func (c *CC) LastRTT() time.Duration           { return time.Duration(c.prevRTT) }
func (c *CC) Window() int64                    { return congestion.NoWindow }
func (c *CC) Deadline() clock.Time             { return clock.Never }
func (c *CC) OnTimer(clock.Time)               {}
func (c *CC) OnCNP(clock.Time)                 {}
func (c *CC) OnPacketSent(_ clock.Time, n int) { c.sent += int64(n) }

// OnAck runs an update event when this ACK completes one.
func (c *CC) OnAck(_ clock.Time, ack congestion.Ack) {
	if ack.Bytes > 0 {
		c.acked += int64(ack.Bytes)
	}
	if ack.RTT <= 0 {
		return
	}
	if c.cfg.Segment > 0 {
		if c.acked < c.nextEvent {
			return
		}
		// One event per segment boundary crossed, however many.
		c.nextEvent += ((c.acked-c.nextEvent)/c.cfg.Segment + 1) * c.cfg.Segment
	} else {
		if c.started && c.acked <= c.nextEvent {
			return
		}
		c.nextEvent = c.sent
	}
	rtt := float64(ack.RTT)
	if !c.started {
		c.started = true
		c.prevRTT = rtt
		return
	}
	c.event(rtt)
}

// event is one pass of Algorithm 1.
func (c *CC) event(rtt float64) {
	cfg := &c.cfg
	c.Events++
	c.diff = (1-cfg.Alpha)*c.diff + cfg.Alpha*(rtt-c.prevRTT)
	c.prevRTT = rtt
	c.grad = c.diff / float64(cfg.MinRTT)
	if !cfg.HAIAnyIncrease {
		if c.grad <= 0 {
			c.streak++
		} else {
			c.streak = 0
		}
	}
	increase := func(hyperBranch bool) {
		step := cfg.AddStep
		if hyperBranch && c.streak >= cfg.HAIThreshold {
			step *= congestion.Rate(cfg.HAIFactor)
			c.HyperIncreases++
		}
		c.rate = min(c.rate+step, cfg.LineRate)
	}
	decrease := func(f float64) {
		c.rate = max(congestion.Rate(float64(c.rate)*max(f, 0)), cfg.MinRate)
		if cfg.HAIAnyIncrease {
			c.streak = 0
		}
	}
	switch {
	case rtt < float64(cfg.TLow):
		c.LowIncreases++
		increase(cfg.HAIAnyIncrease)
	case rtt > float64(cfg.THigh):
		c.HighDecreases++
		decrease(1 - cfg.Beta*(1-float64(cfg.THigh)/rtt))
		return
	case c.grad <= 0:
		c.GradientIncreases++
		increase(true)
	default:
		c.GradientDecreases++
		decrease(1 - cfg.Beta*c.grad)
		return
	}
	if cfg.HAIAnyIncrease {
		c.streak++
	}
}

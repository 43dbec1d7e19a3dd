// Package swift implements Swift (Kumar et al., SIGCOMM 2020), Google's
// delay-target window controller: additive increase while the measured
// delay is below a target, a multiplicative decrease proportional to the
// excess (at most max_mdf, at most once per RTT) above it, a window that may
// fall below one packet (the sender then paces one packet every RTT/cwnd),
// and a target that grows with the path's hop count and shrinks as the
// window grows (flow scaling: many flows ⇒ small windows ⇒ more queueing
// allowed).
//
// Swift keeps two windows: the fabric window, driven by the fabric delay
// (RTT minus the end hosts' share) against the scaled fabric target, and
// the endpoint window, driven by the end hosts' delay against a fixed
// endpoint target; the sender uses the smaller. Per ACK (Algorithm 1):
//
//	if delay < target:  cwnd += ai/cwnd · num_acked   (cwnd ≥ 1)
//	                    cwnd += ai · num_acked         (cwnd < 1)
//	elif can_decrease:  cwnd ×= max(1 − β·(delay − target)/delay, 1 − max_mdf)
//
//	fabric target = base_target + hops·h + clamp(α/√fcwnd + β', 0, fs_range)
//	α = fs_range/(1/√fs_min_cwnd − 1/√fs_max_cwnd),  β' = −α/√fs_max_cwnd
//
// with can_decrease = (now − t_last_decrease ≥ rtt), rtt being a smoothed
// RTT, and t_last_decrease set whenever the window shrinks. A
// retransmission timeout or fast recovery cuts by (1 − max_mdf) under the
// same once-per-RTT rule; RetxResetThreshold timeouts in a row reset the
// window to its minimum.
package swift

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/congestion"
)

// Config is every parameter of a Swift sender. Windows are in packets of
// MSS bytes, as in the paper.
type Config struct {
	// MSS is the bytes of one packet, as OnPacketSent and Ack.Bytes
	// count them.
	MSS int
	// LineRate caps the pacing rate.
	LineRate congestion.Rate
	// BaseTarget is the fabric target of a one-hop path with few flows;
	// HopScale (h) is added per switch hop.
	BaseTarget, HopScale time.Duration
	// FSRange is the most flow scaling adds to the fabric target, reached
	// at FSMinCwnd packets and falling to 0 at FSMaxCwnd (0.1 and 100 in
	// the paper's figure).
	FSRange              time.Duration
	FSMinCwnd, FSMaxCwnd float64
	// EndpointTarget is the endpoint window's target delay.
	EndpointTarget time.Duration
	// AI is the additive increase, packets per RTT; Beta the decrease
	// gain; MaxMDF the largest fraction one decrease may take.
	AI, Beta, MaxMDF float64
	// MinCwnd and MaxCwnd bound both windows (the paper goes down to 0.001
	// packets); InitCwnd is where both start.
	MinCwnd, MaxCwnd, InitCwnd float64
	// RTTGain is the gain of the smoothed RTT that gates decreases and sets
	// the pacing delay (1/8, as TCP's and htsim's).
	RTTGain float64
	// RetxResetThreshold is how many retransmission timeouts in a row
	// reset the window to MinCwnd.
	RetxResetThreshold int
}

// Validate reports a Config that cannot run.
func (c *Config) Validate() error {
	switch {
	case c.MSS <= 0:
		return errors.New("swift: MSS must be > 0")
	case !(c.LineRate > 0):
		return errors.New("swift: LineRate must be > 0")
	case c.BaseTarget <= 0 || c.HopScale < 0 || c.FSRange < 0 || c.EndpointTarget <= 0:
		return errors.New("swift: need BaseTarget > 0, HopScale ≥ 0, FSRange ≥ 0, EndpointTarget > 0")
	case !(c.FSMinCwnd > 0 && c.FSMaxCwnd > c.FSMinCwnd):
		return errors.New("swift: need 0 < FSMinCwnd < FSMaxCwnd")
	case !(c.AI > 0) || !(c.Beta > 0 && c.Beta <= 1) || !(c.MaxMDF > 0 && c.MaxMDF < 1):
		return errors.New("swift: need AI > 0, β in (0,1], max_mdf in (0,1)")
	case !(c.MinCwnd > 0 && c.MaxCwnd >= c.MinCwnd && c.InitCwnd >= c.MinCwnd && c.InitCwnd <= c.MaxCwnd):
		return fmt.Errorf("swift: need 0 < MinCwnd ≤ InitCwnd ≤ MaxCwnd (%v, %v, %v)", c.MinCwnd, c.InitCwnd, c.MaxCwnd)
	case !(c.RTTGain > 0 && c.RTTGain <= 1):
		return errors.New("swift: RTTGain outside (0, 1]")
	case c.RetxResetThreshold < 1:
		return errors.New("swift: RetxResetThreshold must be ≥ 1")
	case math.IsInf(c.MaxCwnd, 0):
		return errors.New("swift: MaxCwnd must be finite")
	}
	return nil
}

// Default is Swift with the paper's gains (ai 1, β 0.8, max_mdf 0.5, flow
// scaling over 0.1–100 packets, windows down to 0.001 packets) around the
// delays of a given fabric: baseTarget and hopScale are the fabric's (see
// the simulator for how it derives them), fsRange the most flow scaling
// adds. The window starts at one bandwidth-delay product of lineRate over
// baseRTT (line rate, as the other algorithms here start) and may grow to
// 100 of them; the endpoint target is baseTarget.
func Default(mss int, lineRate congestion.Rate, baseRTT, baseTarget, hopScale, fsRange time.Duration) Config {
	bdp := float64(lineRate) * baseRTT.Seconds() / 8 / float64(mss)
	return Config{
		MSS: mss, LineRate: lineRate,
		BaseTarget: baseTarget, HopScale: hopScale, FSRange: fsRange,
		FSMinCwnd: 0.1, FSMaxCwnd: 100,
		EndpointTarget: baseTarget,
		AI:             1, Beta: 0.8, MaxMDF: 0.5,
		MinCwnd: 0.001, MaxCwnd: max(100*bdp, 1), InitCwnd: max(bdp, 1),
		RTTGain: 1.0 / 8, RetxResetThreshold: 5,
	}
}

// Counters count what the controller did.
type Counters struct {
	Increases, Decreases, Blocked uint64 // Blocked: a decrease can_decrease held back
	Retransmits, Resets           uint64
}

// CC is one flow's Swift sender state. It implements congestion.Controller
// and congestion.LossReactor, and never allocates.
type CC struct {
	cfg          Config
	fsA, fsB     float64 // flow-scaling α and β', ns
	fcwnd, ecwnd float64 // packets
	srtt         float64 // ns; 0 until the first sample
	lastDecrease clock.Time
	decreased    bool // lastDecrease is meaningful
	retx         int
	lastTarget   float64 // ns, the last fabric target computed
	Counters
}

var (
	_ congestion.Controller  = (*CC)(nil)
	_ congestion.LossReactor = (*CC)(nil)
)

// New returns a controller at InitCwnd, or an error for an invalid Config.
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
	a := float64(cfg.FSRange) / (1/math.Sqrt(cfg.FSMinCwnd) - 1/math.Sqrt(cfg.FSMaxCwnd))
	*c = CC{cfg: cfg, fsA: a, fsB: -a / math.Sqrt(cfg.FSMaxCwnd), fcwnd: cfg.InitCwnd, ecwnd: cfg.InitCwnd}
	return nil
}

// Config returns the parameters c runs with.
func (c *CC) Config() Config { return c.cfg }

// Cwnd is the window in packets: min(fabric, endpoint).
func (c *CC) Cwnd() float64 { return min(c.fcwnd, c.ecwnd) }

// FabricCwnd and EndpointCwnd are the two windows, in packets.
func (c *CC) FabricCwnd() float64   { return c.fcwnd }
func (c *CC) EndpointCwnd() float64 { return c.ecwnd }

// SRTT is the smoothed RTT; Target the last fabric target computed.
func (c *CC) SRTT() time.Duration   { return time.Duration(c.srtt) }
func (c *CC) Target() time.Duration { return time.Duration(c.lastTarget) }

// FabricTarget is the fabric target delay for a path of hops switches at
// fabric window fcwnd (packets).
func (c *CC) FabricTarget(hops int, fcwnd float64) time.Duration {
	return time.Duration(c.fabricTarget(hops, fcwnd))
}

func (c *CC) fabricTarget(hops int, fcwnd float64) float64 {
	fs := min(max(c.fsA/math.Sqrt(fcwnd)+c.fsB, 0), float64(c.cfg.FSRange))
	return float64(c.cfg.BaseTarget) + float64(hops)*float64(c.cfg.HopScale) + fs
}

// Window is cwnd·MSS bytes (at least one byte: with less than a packet in
// flight the sender may always send one, paced by Rate).
func (c *CC) Window() int64 {
	return max(int64(c.Cwnd()*float64(c.cfg.MSS)), 1)
}

// Rate is the line rate while the window holds a packet or more; below
// one packet it is one packet per RTT/cwnd (Swift's pacing delay).
func (c *CC) Rate() congestion.Rate {
	w := c.Cwnd()
	if w >= 1 || c.srtt <= 0 {
		return c.cfg.LineRate
	}
	return min(congestion.Rate(w*float64(c.cfg.MSS)*8e9/c.srtt), c.cfg.LineRate)
}

func (c *CC) Deadline() clock.Time         { return clock.Never }
func (c *CC) OnTimer(clock.Time)           {}
func (c *CC) OnCNP(clock.Time)             {}
func (c *CC) OnPacketSent(clock.Time, int) {}

func (c *CC) canDecrease(now clock.Time) bool {
	return !c.decreased || float64(now-c.lastDecrease) >= c.srtt
}

// OnAck runs Algorithm 1 on the ACK's delays.
func (c *CC) OnAck(now clock.Time, ack congestion.Ack) {
	if ack.RTT <= 0 {
		return
	}
	c.retx = 0
	rtt := float64(ack.RTT)
	if c.srtt == 0 {
		c.srtt = rtt
	} else {
		c.srtt += c.cfg.RTTGain * (rtt - c.srtt)
	}
	can := c.canDecrease(now)
	host := min(max(float64(ack.HostDelay), 0), rtt)
	acked := float64(max(ack.Bytes, 0)) / float64(c.cfg.MSS)
	prev := c.Cwnd()
	c.lastTarget = c.fabricTarget(ack.Hops, c.fcwnd)
	c.fcwnd = c.adjust(c.fcwnd, rtt-host, c.lastTarget, acked, can)
	c.ecwnd = c.adjust(c.ecwnd, host, float64(c.cfg.EndpointTarget), acked, can)
	c.settle(now, prev)
}

func (c *CC) adjust(w, delay, target, acked float64, can bool) float64 {
	switch {
	case delay < target:
		c.Increases++
		if w >= 1 {
			return w + c.cfg.AI/w*acked
		}
		return w + c.cfg.AI*acked
	case can:
		c.Decreases++
		return w * max(1-c.cfg.Beta*(delay-target)/delay, 1-c.cfg.MaxMDF)
	}
	c.Blocked++
	return w
}

// settle bounds the windows and stamps a decrease.
func (c *CC) settle(now clock.Time, prev float64) {
	c.fcwnd = min(max(c.fcwnd, c.cfg.MinCwnd), c.cfg.MaxCwnd)
	c.ecwnd = min(max(c.ecwnd, c.cfg.MinCwnd), c.cfg.MaxCwnd)
	if c.Cwnd() < prev {
		c.lastDecrease, c.decreased = now, true
	}
}

// OnRetransmit reacts to loss recovery: a timeout or fast recovery cuts
// both windows by (1 − max_mdf) if a decrease is allowed; repeated
// timeouts reset them to the minimum.
func (c *CC) OnRetransmit(now clock.Time, timeout bool) {
	c.Retransmits++
	prev := c.Cwnd()
	if timeout {
		c.retx++
		if c.retx >= c.cfg.RetxResetThreshold {
			c.fcwnd, c.ecwnd = c.cfg.MinCwnd, c.cfg.MinCwnd
			c.Resets++
			c.settle(now, prev)
			return
		}
	} else {
		c.retx = 0
	}
	if c.canDecrease(now) {
		c.fcwnd *= 1 - c.cfg.MaxMDF
		c.ecwnd *= 1 - c.cfg.MaxMDF
	}
	c.settle(now, prev)
}

// Package hpcc implements HPCC (Li et al., SIGCOMM 2019), High Precision
// Congestion Control: a window-based sender driven by the in-band network
// telemetry (INT) that every switch on the path appends to data packets and
// the receiver echoes in ACKs. From each hop's queue length and transmitted
// bytes it computes the normalised inflight bytes U of the most loaded link
// and steers the window so that U approaches the target utilisation η.
//
// The algorithm (the paper's Algorithm 1, as HPCC's ns-3 implements it in
// RdmaHw::UpdateRateHp and FastReactHp), per ACK:
//
//	for every hop i:   τ = ts_i − ts'_i
//	                   txRate = (txBytes_i − txBytes'_i)/τ
//	                   u_i = txRate/B_i + min(qlen_i, qlen'_i)/(B_i·T)
//	u, τ of the hop with the largest u_i;  τ = min(τ, T)
//	U ← (1 − τ/T)·U + (τ/T)·u
//	if U ≥ η or incStage ≥ maxStage:  W = Wc/(U/η) + W_AI   (incStage ← 0)
//	else:                             W = Wc + W_AI          (incStage++)
//	R = W/T
//
// where the primed records are those of the previous ACK and Wc, the
// reference window, and incStage change only on the first ACK that
// acknowledges data sent after the last such update — once per round trip
// ("ack.seq > lastUpdateSeq"); the ACKs in between react from Wc without
// moving it (fast reaction). The very first ACK only stores its records.
// Like the artifact, the controller works in the rate domain: Rate is
// R = W/T and Window W = R·T, W_AI being AIRate·T.
package hpcc

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/congestion"
)

// MaxHops is the most INT records a controller keeps (switches on a path).
// A path with more hops than this is controlled from its first MaxHops.
const MaxHops = 8

// Config is every parameter of an HPCC sender.
type Config struct {
	// LineRate is the NIC rate: the start rate and the ceiling.
	LineRate congestion.Rate
	// MinRate is the floor of the rate (MIN_RATE of HPCC's ns-3 configs).
	MinRate congestion.Rate
	// BaseRTT is T, the base round-trip time the window is sized to
	// (W = R·T) and U's EWMA runs over. HPCC's ns-3 runs with GLOBAL_T 1:
	// the largest base RTT of the topology, for every flow.
	BaseRTT time.Duration
	// Eta is η, the target utilisation (0.95).
	Eta float64
	// MaxStage is how many additive-increase round trips may pass before a
	// multiplicative step is taken while U < η (MI_THRESH; 0: every update
	// is multiplicative).
	MaxStage int
	// AIRate is W_AI as a rate, W_AI/T (HPCC ns-3's RATE_AI for HPCC).
	AIRate congestion.Rate
	// FastReact lets the ACKs between two per-RTT updates change the rate
	// (FAST_REACT 1 in the artifact's runs).
	FastReact bool
}

// Validate reports a Config that cannot run.
func (c *Config) Validate() error {
	switch {
	case !(c.LineRate > 0):
		return errors.New("hpcc: LineRate must be > 0")
	case c.MinRate < 0 || c.MinRate > c.LineRate:
		return fmt.Errorf("hpcc: MinRate %v outside [0, LineRate]", c.MinRate)
	case c.BaseRTT <= 0:
		return errors.New("hpcc: BaseRTT must be > 0")
	case !(c.Eta > 0 && c.Eta <= 1):
		return fmt.Errorf("hpcc: η %v outside (0, 1]", c.Eta)
	case c.MaxStage < 0:
		return errors.New("hpcc: negative MaxStage")
	case !(c.AIRate >= 0) || math.IsInf(float64(c.AIRate), 0):
		return errors.New("hpcc: AIRate must be ≥ 0")
	}
	return nil
}

// Artifact is HPCC as HPCC's ns-3 runs it in the paper's evaluation
// (simulation/run.py --cc hp): η = 0.95, MI_THRESH 0, W_AI/T =
// 10·C/(25 Gb/s) Mb/s (40 Mb/s at 100 Gb/s), fast reaction on, minimum
// rate 1 Gb/s.
func Artifact(lineRate congestion.Rate, baseRTT time.Duration) Config {
	return Config{
		LineRate:  lineRate,
		MinRate:   min(1*congestion.Gbps, lineRate),
		BaseRTT:   baseRTT,
		Eta:       0.95,
		MaxStage:  0,
		AIRate:    10 * congestion.Mbps * lineRate / (25 * congestion.Gbps),
		FastReact: true,
	}
}

// Paper is Artifact with maxStage = 5, the RdmaHw MiThresh default: five
// additive round trips before a multiplicative step below η.
func Paper(lineRate congestion.Rate, baseRTT time.Duration) Config {
	c := Artifact(lineRate, baseRTT)
	c.MaxStage = 5
	return c
}

// Counters count what the controller did, for traces and tests.
type Counters struct {
	// Updates are per-RTT updates (Wc moved); FastReacts the ACKs in
	// between that changed the rate from Wc.
	Updates, FastReacts uint64
	// Multiplicative and Additive count the updates and fast reactions by
	// the branch they took.
	Multiplicative, Additive uint64
}

// CC is one flow's HPCC sender state. It implements congestion.Controller
// and never allocates.
type CC struct {
	cfg   Config
	t     float64         // T in ns
	rate  congestion.Rate // R = W/T
	ref   congestion.Rate // Wc/T
	stage int             // incStage
	u     float64         // U, the EWMA of normalised inflight

	sent, acked int64 // bytes, as OnPacketSent and Ack.Bytes count them
	lastUpdate  int64 // sent when Wc last moved (lastUpdateSeq)
	started     bool  // the first ACK has stored its records

	nhop int
	hop  [MaxHops]congestion.INTHop

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

// Init (re)initialises c in place: line rate, U = 1 (as the artifact
// starts), no records.
func (c *CC) Init(cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	*c = CC{cfg: cfg, t: float64(cfg.BaseRTT), rate: cfg.LineRate, ref: cfg.LineRate, u: 1}
	return nil
}

// Config returns the parameters c runs with.
func (c *CC) Config() Config { return c.cfg }

// Rate is R = W/T.
func (c *CC) Rate() congestion.Rate { return c.rate }

// Reference is Wc/T, the rate the next update starts from.
func (c *CC) Reference() congestion.Rate { return c.ref }

// U is the current estimate of the bottleneck's normalised inflight.
func (c *CC) U() float64 { return c.u }

// Stage is incStage, the additive updates since the last multiplicative one.
func (c *CC) Stage() int { return c.stage }

// Window is W = R·T in bytes, at least one byte.
func (c *CC) Window() int64 {
	return max(int64(float64(c.rate)*c.t/8e9), 1)
}

// Deadline is clock.Never: HPCC has no timer.
func (c *CC) Deadline() clock.Time { return clock.Never }

// OnTimer does nothing.
func (c *CC) OnTimer(clock.Time) {}

// OnCNP does nothing: HPCC's feedback is INT.
func (c *CC) OnCNP(clock.Time) {}

// OnPacketSent counts bytes sent (snd_nxt).
func (c *CC) OnPacketSent(_ clock.Time, n int) { c.sent += int64(n) }

// OnAck runs the per-ACK update on the INT records the ACK echoes.
func (c *CC) OnAck(_ clock.Time, ack congestion.Ack) {
	if ack.Bytes > 0 {
		c.acked += int64(ack.Bytes)
	}
	hops := ack.INT
	if len(hops) > MaxHops {
		hops = hops[:MaxHops]
	}
	if !c.started {
		c.started = true
		c.lastUpdate = c.sent
		c.store(hops)
		return
	}
	full := c.acked > c.lastUpdate
	if !full && !c.cfg.FastReact {
		return
	}
	if len(hops) != c.nhop {
		// The path changed length: no hop can be compared with its last
		// record. Start over from these.
		c.store(hops)
		if full {
			c.lastUpdate = max(c.lastUpdate, c.sent)
		}
		return
	}
	// U and its τ come from the most loaded hop; a hop with no time since
	// its last record (τ = 0, not seen on a real path) has no rate and
	// cannot be the most loaded.
	var U, dt float64
	for i := range hops {
		h, old := &hops[i], &c.hop[i]
		if tau := float64(h.TS - old.TS); tau > 0 && h.Rate > 0 {
			txRate := float64(h.TxBytes-old.TxBytes) * 8e9 / tau // bit/s
			q := float64(min(h.QLen, old.QLen))
			if u := txRate/float64(h.Rate) + q*8e9/(float64(h.Rate)*c.t); u > U {
				U, dt = u, tau
			}
		}
		*old = *h
	}
	if len(hops) > 0 {
		dt = min(dt, c.t)
		c.u = (c.u*(c.t-dt) + U*dt) / c.t
		maxc := max(c.u/c.cfg.Eta, 1e-12) // U is > 0 on any real path
		var next congestion.Rate
		stage := c.stage
		if maxc >= 1 || c.stage >= c.cfg.MaxStage {
			next = congestion.Rate(float64(c.ref)/maxc) + c.cfg.AIRate
			stage = 0
			c.Multiplicative++
		} else {
			next = c.ref + c.cfg.AIRate
			stage++
			c.Additive++
		}
		next = min(max(next, c.cfg.MinRate), c.cfg.LineRate)
		c.rate = next
		if full {
			c.ref, c.stage = next, stage
			c.Updates++
		} else {
			c.FastReacts++
		}
	}
	if full {
		c.lastUpdate = max(c.lastUpdate, c.sent)
	}
}

func (c *CC) store(hops []congestion.INTHop) {
	c.nhop = copy(c.hop[:], hops)
}

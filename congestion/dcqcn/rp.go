package dcqcn

import (
	"math"

	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/congestion"
)

// RPCounters are the reaction point's counters, named as the mlx5
// hw_counters they correspond to.
type RPCounters struct {
	// RPCNPHandled (rp_cnp_handled) counts CNPs that caused a rate cut (or
	// the first-CNP rate set).
	RPCNPHandled uint64
	// RPCNPIgnored (rp_cnp_ignored) counts CNPs that arrived while a cut was
	// already pending in the same rate_reduce_monitor_period and were
	// coalesced into it.
	RPCNPIgnored uint64
	// Cuts, Increases count rate changes by kind, for traces and tests.
	Cuts, FastRecovery, AdditiveIncrease, HyperIncrease uint64
}

// RP is DCQCN's reaction point for one QP: it turns CNPs, bytes sent and
// its own timers into the QP's sending rate. It implements
// congestion.Controller and never allocates.
//
// Timers that only decay α are evaluated lazily when the next event comes
// (α is a closed-form function of time between events), so an RP asks for
// OnTimer only when its rate can change: at a rate-increase expiry or a
// pending rate_reduce_monitor_period cut. Once the rate is back at the line
// rate and stays there, it asks for nothing at all.
type RP struct {
	cfg Config

	rc, rt congestion.Rate // current and target rate
	alpha  float64

	started   bool       // a CNP has arrived: before that the QP runs at line rate and no timer runs
	alphaNext clock.Time // next α tick (decay, or periodic update)
	alphaFlag bool       // AlphaPeriodic: a CNP arrived since the last tick

	cutPending bool
	cutNext    clock.Time // next rate_reduce_monitor_period boundary with a cut pending
	cutOrigin  clock.Time // the grid's origin: the first CNP

	incNext    clock.Time // next rate-increase timer expiry; Never when idle
	timerStage int        // T: timer increase events since the last cut
	byteStage  int        // BC: byte-counter increase events since the last cut
	bytes      int64      // bytes sent towards the next byte-counter event

	RPCounters
}

var _ congestion.Controller = (*RP)(nil)

// NewRP returns a reaction point at line rate, or an error for an invalid
// Config.
func NewRP(cfg Config) (*RP, error) {
	r := new(RP)
	if err := r.Init(cfg); err != nil {
		return nil, err
	}
	return r, nil
}

// Init (re)initialises r in place, for callers that keep RPs in an array.
func (r *RP) Init(cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	*r = RP{cfg: cfg, rc: cfg.LineRate, rt: cfg.LineRate, alpha: cfg.InitialAlpha,
		alphaNext: clock.Never, cutNext: clock.Never, incNext: clock.Never}
	return nil
}

// Config returns the parameters r runs with.
func (r *RP) Config() Config { return r.cfg }

// Rate is R_C, the current rate.
func (r *RP) Rate() congestion.Rate { return r.rc }

// Target is R_T, the target rate.
func (r *RP) Target() congestion.Rate { return r.rt }

// Alpha is α as of the last event.
func (r *RP) Alpha() float64 { return r.alpha }

// AlphaAt is α at now, including the decay ticks due since the last event,
// without changing r.
func (r *RP) AlphaAt(now clock.Time) float64 {
	c := *r
	c.alphaTo(now)
	return c.alpha
}

// Window is congestion.NoWindow: DCQCN is purely rate-based.
func (r *RP) Window() int64 { return congestion.NoWindow }

// Deadline is the next rate-increase expiry or pending cut.
func (r *RP) Deadline() clock.Time {
	d := r.incNext
	if r.cutPending && r.cutNext < d {
		d = r.cutNext
	}
	return d
}

// OnAck is a no-op: DCQCN's feedback is the CNP.
func (r *RP) OnAck(now clock.Time, _ congestion.Ack) { r.advance(now) }

// OnTimer runs every timer due at now.
func (r *RP) OnTimer(now clock.Time) { r.advance(now) }

// OnPacketSent feeds the byte counter: every ByteCounter bytes is one
// rate-increase event.
func (r *RP) OnPacketSent(now clock.Time, n int) {
	r.advance(now)
	if !r.started || r.cfg.ByteCounter <= 0 || n <= 0 {
		return
	}
	r.bytes += int64(n)
	for i := 0; r.bytes >= r.cfg.ByteCounter && i < maxCatchUp; i++ {
		r.bytes -= r.cfg.ByteCounter
		r.byteStage++
		r.increase()
	}
	if r.bytes >= r.cfg.ByteCounter { // only after an absurd n
		r.bytes = 0
	}
}

// OnCNP reacts to one CNP for this QP.
func (r *RP) OnCNP(now clock.Time) {
	r.advance(now)
	if !r.started {
		r.started = true
		r.alpha = r.cfg.InitialAlpha
		r.alphaNext = now + clock.Time(r.cfg.AlphaPeriod)
		r.cutOrigin = now
		if r.cfg.RateOnFirstCNP > 0 {
			r.rc = min(r.cfg.RateOnFirstCNP, r.cfg.LineRate)
			r.rt = r.rc
			r.RPCNPHandled++
			r.restartIncrease(now)
			return
		}
		if r.cfg.ReduceMonitorPeriod > 0 {
			// The first CNP sets α to its initial value and is itself
			// the sample: it does not also raise α at the next tick.
			r.cutPending = true
			r.cutNext = now + clock.Time(r.cfg.ReduceMonitorPeriod)
			r.RPCNPHandled++
			return
		}
		r.RPCNPHandled++
		r.cut(now)
		return
	}
	if r.cfg.Alpha == AlphaPeriodic {
		r.alphaFlag = true
	}
	if r.cfg.ReduceMonitorPeriod > 0 {
		if r.cutPending {
			r.RPCNPIgnored++
			return
		}
		p := clock.Time(r.cfg.ReduceMonitorPeriod)
		r.cutPending = true
		r.cutNext = r.cutOrigin + ((now-r.cutOrigin)/p+1)*p
		r.RPCNPHandled++
		return
	}
	r.RPCNPHandled++
	r.cut(now)
}

// maxCatchUp bounds the work one call can do when the caller has not called
// for a long time; beyond it the rate has long been saturated anyway.
const maxCatchUp = 1 << 16

// advance runs, in time order, every timer due at or before now. At equal
// times α ticks first (a cut uses the α of its instant), then a pending cut,
// then a rate increase (which a cut at the same instant restarts).
func (r *RP) advance(now clock.Time) {
	for i := 0; i < maxCatchUp; i++ {
		t := r.incNext
		if r.cutPending && r.cutNext <= t {
			t = r.cutNext
		}
		if t > now {
			break
		}
		r.alphaTo(t)
		if r.cutPending && r.cutNext == t {
			r.cutPending = false
			r.cut(t)
			continue
		}
		r.timerStage++
		r.increase()
		r.incNext = t + clock.Time(r.cfg.TimerPeriod)
		if r.rc >= r.cfg.LineRate && r.rt >= r.cfg.LineRate {
			// Saturated: further expiries change nothing until the next
			// cut, which restarts the timer.
			r.incNext = clock.Never
		}
	}
	r.alphaTo(now)
}

// alphaTo applies the α ticks due at or before t.
func (r *RP) alphaTo(t clock.Time) {
	if !r.started || r.alphaNext > t {
		return
	}
	p := clock.Time(r.cfg.AlphaPeriod)
	k := int64((t-r.alphaNext)/p) + 1 // ticks due
	r.alphaNext += clock.Time(k) * p
	g := r.cfg.G
	if r.cfg.Alpha == AlphaPeriodic && r.alphaFlag {
		r.alpha = ewmaUp(r.alpha, g)
		r.alphaFlag = false
		k--
	}
	// Pure decay: multiply while cheap (bit-exact with a per-tick loop),
	// closed form beyond.
	if k <= 64 {
		for ; k > 0; k-- {
			r.alpha *= 1 - g
		}
	} else {
		r.alpha *= math.Pow(1-g, float64(k))
	}
	r.alpha = min(r.alpha, r.cfg.AlphaMax)
}

// cut is DCQCN's multiplicative decrease (the paper's equation 1 with the
// target-rate, bound and order options).
func (r *RP) cut(now clock.Time) {
	c := &r.cfg
	if c.Alpha == AlphaOnCNP && c.Order == AlphaThenCut {
		r.alpha = min(ewmaUp(r.alpha, c.G), c.AlphaMax)
	}
	if c.ClampTargetRate || r.byteStage > 0 || (c.ClampTargetRateAfterTimeInc && r.timerStage > 0) {
		r.rt = r.rc
	}
	dec := congestion.Rate(float64(r.rc) * (c.DecreaseFactor * r.alpha))
	if c.MinDecFactor > 0 {
		dec = min(dec, congestion.Rate(float64(r.rc)*(1-c.MinDecFactor)))
	}
	r.rc = max(r.rc-dec, c.MinRate)
	if c.Alpha == AlphaOnCNP {
		if c.Order == CutThenAlpha {
			r.alpha = min(ewmaUp(r.alpha, c.G), c.AlphaMax)
		}
		// K counts from the last CNP.
		r.alphaNext = now + clock.Time(c.AlphaPeriod)
	}
	r.Cuts++
	r.restartIncrease(now)
}

func (r *RP) restartIncrease(now clock.Time) {
	r.timerStage, r.byteStage, r.bytes = 0, 0, 0
	r.incNext = now + clock.Time(r.cfg.TimerPeriod)
}

// increase is one rate-increase event (timer or byte counter), whose stage
// counter has already been incremented.
func (r *RP) increase() {
	c := &r.cfg
	T, BC, F := r.timerStage, r.byteStage, c.Threshold
	var i int // hyper-increase multiplier; 0 = not HAI
	ai := false
	switch c.Stages {
	case StagesTimerOnly:
		switch {
		case T <= F:
		case T == F+1:
			ai = true
		default:
			i = T - F - 1
		}
	default:
		mx, mn := max(T, BC), min(T, BC)
		switch {
		case mx <= F:
		case mn > F:
			i = mn - F
		default:
			ai = true
		}
	}
	switch {
	case i > 0:
		switch c.Hyper {
		case HyperConstant:
			i = 1
		case HyperLinearPlusOne:
			i++
		case HyperLinear:
			// i as counted above: the step grows with every event.
		}
		r.rt += congestion.Rate(float64(i) * float64(c.HAIRate))
		r.HyperIncrease++
	case ai:
		r.rt += c.AIRate
		r.AdditiveIncrease++
	default:
		r.FastRecovery++
	}
	r.rt = min(r.rt, c.LineRate)
	r.rc = min((r.rt+r.rc)/2, c.LineRate)
	if r.rt-r.rc < 1 {
		// Within a bit per second: snap, so that averaging ends.
		r.rc = r.rt
	}
}

// ewmaUp is α ← (1−g)·α + g. The conversion rounds the product on its own,
// which stops the compiler fusing it into a multiply-add on architectures
// that have one (arm64, ppc64, s390x): the simulator's traces must be
// byte-identical across machines, not only across runs.
func ewmaUp(alpha, g float64) float64 { return float64((1-g)*alpha) + g }

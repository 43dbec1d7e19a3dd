// Package dcqcn implements DCQCN (Zhu et al., SIGCOMM 2015), the congestion
// control of RoCEv2 NICs: the reaction point (RP, the sender's per-QP rate
// controller) and the notification point (NP, the receiver's per-QP CNP
// generator). The congestion point (the switch's ECN marker) lives in the
// simulator and the live lab, not here.
//
// Two DCQCNs exist: the one the paper describes and the one ConnectX
// firmware runs (α updated on a 1 µs clock, at most one cut per 4 µs, one
// fast-recovery step, ...). Both are special cases of Config, built by
// Paper and ConnectX.Config; every point where published implementations
// disagree is an explicit option whose default is documented on the field.
//
// Rates and α are float64 (the paper's real-number equations); the NIC's
// fixed-point registers (10-bit α, integer Mb/s) are not emulated.
package dcqcn

import (
	"errors"
	"fmt"
	"time"

	"github.com/softrnic/softrnic/congestion"
)

// AlphaMode says when α, the RP's estimate of the fraction of marked
// packets, is updated.
type AlphaMode uint8

const (
	// AlphaOnCNP is the paper's rule: every rate cut raises α
	// (α ← (1−g)α + g) and α decays (α ← (1−g)α) every AlphaPeriod (K)
	// without a CNP; the decay clock restarts at each cut.
	AlphaOnCNP AlphaMode = iota
	// AlphaPeriodic is ConnectX's (dce_tcp_rtt/dce_tcp_g) and HPCC ns-3's:
	// every AlphaPeriod, on a clock started by the first CNP,
	// α ← (1−g)α + g·[a CNP arrived in the period].
	AlphaPeriodic
)

// CutOrder is the order of the α update and the rate cut on a CNP, for
// AlphaOnCNP.
type CutOrder uint8

const (
	// CutThenAlpha cuts with the α of before the CNP, then raises α: the
	// paper's equation 1 as written and htsim. Default.
	CutThenAlpha CutOrder = iota
	// AlphaThenCut raises α first and cuts with the new α (Yibo Zhu's
	// ns3-rdma).
	AlphaThenCut
)

// StageRule decides whether a rate-increase event is fast recovery (FR),
// additive (AI) or hyper (HAI) increase. T and BC are the timer and byte
// counter stage counts including the event being decided; F is Threshold.
type StageRule uint8

const (
	// StagesBoth is QCN's rule used by the paper and ConnectX: FR while
	// max(T, BC) ≤ F, HAI once min(T, BC) > F, AI otherwise. With F = 5
	// this gives exactly five FR steps after a cut (the paper's "F
	// successive iterations"). Default.
	StagesBoth StageRule = iota
	// StagesTimerOnly is HPCC ns-3's Mellanox model, which has no byte
	// counter: FR while T ≤ F, AI at T = F+1, HAI from T = F+2.
	StagesTimerOnly
)

// HyperStep is how much a hyper-increase event raises the target rate, in
// multiples i of HAIRate.
type HyperStep uint8

const (
	// HyperLinear: i = min(T, BC) − F (timer-only rule: T − F − 1), so the
	// step grows with every event in HAI, as QCN intends (htsim). Default.
	HyperLinear HyperStep = iota
	// HyperLinearPlusOne: i = min(T, BC) − F + 1 (ns3-rdma).
	HyperLinearPlusOne
	// HyperConstant: i = 1 (ConnectX hai_rate, HPCC ns-3).
	HyperConstant
)

// Config is every parameter of the reaction point.
type Config struct {
	// LineRate is the start rate and the ceiling of both R_C and R_T
	// (rpg_max_rate, 0 there meaning the port's line rate).
	LineRate congestion.Rate
	// MinRate is the floor of R_C (rpg_min_rate).
	MinRate congestion.Rate

	// G is α's EWMA gain: 1/256 in the paper, (1024−dce_tcp_g)/1024 on
	// ConnectX.
	G float64
	// Alpha selects the α update rule; AlphaPeriod is K (paper, 55 µs) or
	// dce_tcp_rtt (ConnectX, 1 µs).
	Alpha       AlphaMode
	AlphaPeriod time.Duration
	// Order applies to AlphaOnCNP only.
	Order CutOrder
	// InitialAlpha is α when the first CNP arrives (paper: 1; ConnectX:
	// initial_alpha_value/1024). AlphaMax caps α (1, or 1023/1024 for a
	// 10-bit register).
	InitialAlpha, AlphaMax float64

	// DecreaseFactor is the fraction of α a cut takes off:
	// R_C ← R_C·(1 − DecreaseFactor·α). 1/2 is the paper's equation 1 and
	// ConnectX's rpg_gd = 11 (α_fx ≫ 11); rpg_gd = 10 gives 1.
	DecreaseFactor float64
	// MinDecFactor bounds one cut: R_C ≥ old R_C·MinDecFactor
	// (rpg_min_dec_fac/100). 0 means no bound (paper).
	MinDecFactor float64
	// ReduceMonitorPeriod, when > 0, coalesces CNPs: a CNP only marks a cut
	// as pending, and the cut happens at the next boundary of a grid of
	// this period that starts at the first CNP; CNPs arriving while a cut is
	// pending are counted as ignored (rate_reduce_monitor_period, ConnectX 4
	// µs). 0: every CNP cuts at once (paper).
	ReduceMonitorPeriod time.Duration
	// RateOnFirstCNP, when > 0, replaces the first cut: R_C = R_T = this
	// rate (rate_to_set_on_first_cnp; 0 = unused, the NIC default).
	RateOnFirstCNP congestion.Rate
	// ClampTargetRate sets R_T ← R_C on every cut (the paper: always).
	// Without it R_T is clamped only if a byte-counter increase happened
	// since the last cut, or a timer increase did and
	// ClampTargetRateAfterTimeInc is set (clamp_tgt_rate,
	// clamp_tgt_rate_after_time_inc; ConnectX defaults 0 and 1).
	ClampTargetRate, ClampTargetRateAfterTimeInc bool

	// TimerPeriod is T (paper 55 µs; rpg_time_reset, 300 µs).
	TimerPeriod time.Duration
	// ByteCounter is B in bytes (paper 10 MB; rpg_byte_reset×64 B); 0
	// disables byte-counter increases.
	ByteCounter int64
	// Threshold is F, the number of fast-recovery steps (paper 5,
	// rpg_threshold 1).
	Threshold int
	// AIRate and HAIRate are R_AI and R_HAI.
	AIRate, HAIRate congestion.Rate
	Stages          StageRule
	Hyper           HyperStep
}

// Validate reports a Config that cannot run: a zero period would make a
// timer fire forever at one instant.
func (c *Config) Validate() error {
	switch {
	case !(c.LineRate > 0):
		return errors.New("dcqcn: LineRate must be > 0")
	case c.MinRate < 0 || c.MinRate > c.LineRate:
		return fmt.Errorf("dcqcn: MinRate %v outside [0, LineRate]", c.MinRate)
	case !(c.G > 0 && c.G <= 1):
		return fmt.Errorf("dcqcn: G %v outside (0,1]", c.G)
	case c.AlphaPeriod <= 0:
		return errors.New("dcqcn: AlphaPeriod must be > 0")
	case c.TimerPeriod <= 0:
		return errors.New("dcqcn: TimerPeriod must be > 0")
	case c.ReduceMonitorPeriod < 0 || c.ByteCounter < 0 || c.Threshold < 0:
		return errors.New("dcqcn: negative ReduceMonitorPeriod, ByteCounter or Threshold")
	case !(c.InitialAlpha >= 0 && c.InitialAlpha <= c.AlphaMax && c.AlphaMax <= 1):
		return errors.New("dcqcn: need 0 ≤ InitialAlpha ≤ AlphaMax ≤ 1")
	case !(c.DecreaseFactor > 0 && c.DecreaseFactor <= 1):
		return errors.New("dcqcn: DecreaseFactor outside (0,1]")
	case !(c.MinDecFactor >= 0 && c.MinDecFactor <= 1):
		return errors.New("dcqcn: MinDecFactor outside [0,1]")
	case c.AIRate < 0 || c.HAIRate < 0 || c.RateOnFirstCNP < 0:
		return errors.New("dcqcn: negative rate step")
	}
	return nil
}

// Paper is the SIGCOMM 2015 parameter set at the given line rate: g = 1/256,
// K = T = 55 µs, B = 10 MB, F = 5, R_AI = 40 Mb/s. The paper does not pin
// R_HAI; 200 Mb/s (5·R_AI) is what the authors' ns3-rdma sample
// configuration uses. R_AI and R_HAI are the paper's 40 Gb/s values and
// are not scaled with LineRate. MinRate is 1 Mb/s, ConnectX's floor.
func Paper(lineRate congestion.Rate) Config {
	return Config{
		LineRate:        lineRate,
		MinRate:         1 * congestion.Mbps,
		G:               1.0 / 256,
		Alpha:           AlphaOnCNP,
		AlphaPeriod:     55 * time.Microsecond,
		Order:           CutThenAlpha,
		InitialAlpha:    1,
		AlphaMax:        1,
		DecreaseFactor:  0.5,
		ClampTargetRate: true,
		TimerPeriod:     55 * time.Microsecond,
		ByteCounter:     10_000_000,
		Threshold:       5,
		AIRate:          40 * congestion.Mbps,
		HAIRate:         200 * congestion.Mbps,
		Stages:          StagesBoth,
		Hyper:           HyperLinear,
	}
}

// HPCCMellanox is the DCQCN of HPCC's ns-3 (alibaba-edu, run.py "dcqcn"),
// the Mellanox model most published comparisons use: α every 1 µs with
// g = 1/256, one cut per 4 µs, T = 300 µs, F = 1, timer-only stages,
// constant hyper step, R_AI = 5·C/25 Gb/s Mb/s, R_HAI = 10·R_AI, min rate
// 1 Gb/s, no target clamp at timer stage 0.
func HPCCMellanox(lineRate congestion.Rate) Config {
	ai := 5 * congestion.Mbps * lineRate / (25 * congestion.Gbps)
	return Config{
		LineRate:                    lineRate,
		MinRate:                     1 * congestion.Gbps,
		G:                           1.0 / 256,
		Alpha:                       AlphaPeriodic,
		AlphaPeriod:                 1 * time.Microsecond,
		InitialAlpha:                1,
		AlphaMax:                    1,
		DecreaseFactor:              0.5,
		ReduceMonitorPeriod:         4 * time.Microsecond,
		ClampTargetRateAfterTimeInc: true,
		TimerPeriod:                 300 * time.Microsecond,
		Threshold:                   1,
		AIRate:                      ai,
		HAIRate:                     10 * ai,
		Stages:                      StagesTimerOnly,
		Hyper:                       HyperConstant,
	}
}

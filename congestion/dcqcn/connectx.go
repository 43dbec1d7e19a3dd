package dcqcn

import (
	"fmt"
	"sort"
	"time"

	"github.com/softrnic/softrnic/congestion"
)

// ConnectX holds the mlx5 DCQCN knobs under their sysfs/mlxconfig names
// (/sys/class/net/IF/ecn/roce_rp and roce_np), in the NIC's own units, so a
// configuration read off a real NIC can be replayed here unchanged.
type ConnectX struct {
	RPGTimeReset             uint32 // rpg_time_reset, µs: rate-increase timer T
	RPGByteReset             uint32 // rpg_byte_reset, 64-byte units: byte counter B
	RPGThreshold             uint32 // rpg_threshold: F, fast-recovery steps
	RPGAIRate                uint32 // rpg_ai_rate, Mb/s: R_AI
	RPGHAIRate               uint32 // rpg_hai_rate, Mb/s: R_HAI
	RPGMaxRate               uint32 // rpg_max_rate, Mb/s, 0 = line rate
	RPGMinRate               uint32 // rpg_min_rate, Mb/s: floor of R_C
	RPGMinDecFac             uint32 // rpg_min_dec_fac, %: a cut keeps at least this much of R_C
	RPGGD                    uint32 // rpg_gd: cut = R_C·α_fx ≫ rpg_gd (11 ⇒ α/2)
	RateReduceMonitorPeriod  uint32 // rate_reduce_monitor_period, µs: at most one cut per period
	DCETCPG                  uint32 // dce_tcp_g: α ← α·g/1024 + (1024−g)/1024·[CNP]
	DCETCPRTT                uint32 // dce_tcp_rtt, µs: α update period
	InitialAlphaValue        uint32 // initial_alpha_value, /1024: α at the first CNP
	RateToSetOnFirstCNP      uint32 // rate_to_set_on_first_cnp, Mb/s, 0 = not used
	ClampTgtRate             uint32 // clamp_tgt_rate, 0/1
	ClampTgtRateAfterTimeInc uint32 // clamp_tgt_rate_after_time_inc, 0/1
	MinTimeBetweenCNPs       uint32 // min_time_between_cnps, µs (NP)
	CNPDSCP                  uint32 // cnp_dscp (NP)
	CNP802pPrio              uint32 // cnp_802p_prio (NP)
}

// DefaultConnectX returns the ConnectX-4-and-later firmware defaults.
func DefaultConnectX() ConnectX {
	return ConnectX{
		RPGTimeReset:             300,
		RPGByteReset:             32767,
		RPGThreshold:             1,
		RPGAIRate:                5,
		RPGHAIRate:               50,
		RPGMaxRate:               0,
		RPGMinRate:               1,
		RPGMinDecFac:             50,
		RPGGD:                    11,
		RateReduceMonitorPeriod:  4,
		DCETCPG:                  1019,
		DCETCPRTT:                1,
		InitialAlphaValue:        1023,
		RateToSetOnFirstCNP:      0,
		ClampTgtRate:             0,
		ClampTgtRateAfterTimeInc: 1,
		MinTimeBetweenCNPs:       4,
		CNPDSCP:                  48,
		CNP802pPrio:              6,
	}
}

// knob is one named field and its valid range, from the mlx5 documentation.
type knob struct {
	field    func(c *ConnectX) *uint32
	min, max uint32
}

var knobs = map[string]knob{
	"rpg_time_reset":                {func(c *ConnectX) *uint32 { return &c.RPGTimeReset }, 1, 131071},
	"rpg_byte_reset":                {func(c *ConnectX) *uint32 { return &c.RPGByteReset }, 0, 32767},
	"rpg_threshold":                 {func(c *ConnectX) *uint32 { return &c.RPGThreshold }, 1, 31},
	"rpg_ai_rate":                   {func(c *ConnectX) *uint32 { return &c.RPGAIRate }, 0, 1 << 31},
	"rpg_hai_rate":                  {func(c *ConnectX) *uint32 { return &c.RPGHAIRate }, 0, 1 << 31},
	"rpg_max_rate":                  {func(c *ConnectX) *uint32 { return &c.RPGMaxRate }, 0, 1 << 31},
	"rpg_min_rate":                  {func(c *ConnectX) *uint32 { return &c.RPGMinRate }, 0, 1 << 31},
	"rpg_min_dec_fac":               {func(c *ConnectX) *uint32 { return &c.RPGMinDecFac }, 0, 100},
	"rpg_gd":                        {func(c *ConnectX) *uint32 { return &c.RPGGD }, 10, 11},
	"rate_reduce_monitor_period":    {func(c *ConnectX) *uint32 { return &c.RateReduceMonitorPeriod }, 0, 1 << 31},
	"dce_tcp_g":                     {func(c *ConnectX) *uint32 { return &c.DCETCPG }, 0, 1023},
	"dce_tcp_rtt":                   {func(c *ConnectX) *uint32 { return &c.DCETCPRTT }, 1, 131071},
	"initial_alpha_value":           {func(c *ConnectX) *uint32 { return &c.InitialAlphaValue }, 0, 1023},
	"rate_to_set_on_first_cnp":      {func(c *ConnectX) *uint32 { return &c.RateToSetOnFirstCNP }, 0, 1 << 31},
	"clamp_tgt_rate":                {func(c *ConnectX) *uint32 { return &c.ClampTgtRate }, 0, 1},
	"clamp_tgt_rate_after_time_inc": {func(c *ConnectX) *uint32 { return &c.ClampTgtRateAfterTimeInc }, 0, 1},
	"min_time_between_cnps":         {func(c *ConnectX) *uint32 { return &c.MinTimeBetweenCNPs }, 0, 4095},
	"cnp_dscp":                      {func(c *ConnectX) *uint32 { return &c.CNPDSCP }, 0, 63},
	"cnp_802p_prio":                 {func(c *ConnectX) *uint32 { return &c.CNP802pPrio }, 0, 7},
}

// KnobNames lists the mlx5 knob names Set accepts, sorted.
func KnobNames() []string {
	names := make([]string, 0, len(knobs))
	for n := range knobs {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Set assigns one knob by its mlx5 name, checking the documented range.
func (c *ConnectX) Set(name string, v uint32) error {
	k, ok := knobs[name]
	if !ok {
		return fmt.Errorf("dcqcn: unknown ConnectX knob %q", name)
	}
	if v < k.min || v > k.max {
		return fmt.Errorf("dcqcn: %s = %d outside [%d, %d]", name, v, k.min, k.max)
	}
	*k.field(c) = v
	return nil
}

// Get returns one knob by its mlx5 name.
func (c *ConnectX) Get(name string) (uint32, bool) {
	k, ok := knobs[name]
	if !ok {
		return 0, false
	}
	return *k.field(c), true
}

// Config translates the knobs into a reaction-point Config for a port of
// the given line rate. Semantics follow Google Isekai's ConnectX model:
// byte counter in 64-byte units, stages on both counters with F =
// rpg_threshold, constant hyper step, α on a dce_tcp_rtt clock.
func (c ConnectX) Config(lineRate congestion.Rate) Config {
	max := lineRate
	if c.RPGMaxRate != 0 && congestion.Rate(c.RPGMaxRate)*congestion.Mbps < lineRate {
		max = congestion.Rate(c.RPGMaxRate) * congestion.Mbps
	}
	minRate := congestion.Rate(c.RPGMinRate) * congestion.Mbps
	if minRate > max {
		minRate = max
	}
	gd := c.RPGGD
	if gd < 10 {
		gd = 10
	}
	return Config{
		LineRate:                    max,
		MinRate:                     minRate,
		G:                           float64(1024-min(c.DCETCPG, 1023)) / 1024,
		Alpha:                       AlphaPeriodic,
		AlphaPeriod:                 time.Duration(max32(c.DCETCPRTT, 1)) * time.Microsecond,
		InitialAlpha:                float64(min(c.InitialAlphaValue, 1023)) / 1024,
		AlphaMax:                    1023.0 / 1024,
		DecreaseFactor:              1 / float64(uint64(1)<<(gd-10)),
		MinDecFactor:                float64(min(c.RPGMinDecFac, 100)) / 100,
		ReduceMonitorPeriod:         time.Duration(c.RateReduceMonitorPeriod) * time.Microsecond,
		RateOnFirstCNP:              congestion.Rate(c.RateToSetOnFirstCNP) * congestion.Mbps,
		ClampTargetRate:             c.ClampTgtRate != 0,
		ClampTargetRateAfterTimeInc: c.ClampTgtRateAfterTimeInc != 0,
		TimerPeriod:                 time.Duration(max32(c.RPGTimeReset, 1)) * time.Microsecond,
		ByteCounter:                 int64(c.RPGByteReset) * 64,
		Threshold:                   int(c.RPGThreshold),
		AIRate:                      congestion.Rate(c.RPGAIRate) * congestion.Mbps,
		HAIRate:                     congestion.Rate(c.RPGHAIRate) * congestion.Mbps,
		Stages:                      StagesBoth,
		Hyper:                       HyperConstant,
	}
}

// NPConfig translates the NP knobs. Whether ConnectX defers or drops a CNP
// suppressed by min_time_between_cnps is not documented; this model drops
// it (the spacing is a rate limiter), which is what Defer = false means.
func (c ConnectX) NPConfig() NPConfig {
	return NPConfig{
		MinInterval: time.Duration(c.MinTimeBetweenCNPs) * time.Microsecond,
		Defer:       false,
		DSCP:        uint8(c.CNPDSCP & 63),
		Prio:        uint8(c.CNP802pPrio & 7),
	}
}

func max32(a, b uint32) uint32 {
	if a > b {
		return a
	}
	return b
}

package sim

import (
	"fmt"
	"strings"
	"time"

	"github.com/softrnic/softrnic/congestion/dcqcn"
)

// RunConfig is what a run actually ran with, written into summary.json so a
// result never has to be matched to a command line: the profile, its
// ConnectX knobs by mlx5 name, the reaction- and notification-point
// parameters they became, and the switch's marking.
type RunConfig struct {
	Profile string `json:"profile"`
	// Knobs are the connectx profile's mlx5 knobs (absent for the others).
	Knobs map[string]uint32 `json:"knobs,omitempty"`
	// Custom is set when Options.RP or Options.NP replaced the profile's.
	Custom bool      `json:"custom,omitempty"`
	RP     RPSummary `json:"rp"`
	NP     NPSummary `json:"np"`

	LinkGbps    float64 `json:"link_gbps"`
	LinkDelayUs float64 `json:"link_delay_us"`
	PacketBytes int     `json:"packet_bytes"`
	Marking     string  `json:"marking"` // dequeue, enqueue or off
	KminKB      float64 `json:"kmin_kb"`
	KmaxKB      float64 `json:"kmax_kb"`
	Pmax        float64 `json:"pmax"`
	BufferKB    float64 `json:"buffer_kb"`
	PFC         bool    `json:"pfc"`
	// Retime: an RP rate change re-times the pacer's pending gap (HPCC
	// ns-3); false: it applies from the next packet (ns3-rdma).
	Retime    bool    `json:"pacer_retime"`
	PFCXoffKB float64 `json:"pfc_xoff_kb,omitempty"`
	PFCXonKB  float64 `json:"pfc_xon_kb,omitempty"`
}

// RPSummary is a dcqcn.Config in the units papers use.
type RPSummary struct {
	LineGbps          float64 `json:"line_gbps"`
	MinRateMbps       float64 `json:"min_rate_mbps"`
	G                 float64 `json:"g"`
	Alpha             string  `json:"alpha"` // on-cnp or periodic
	AlphaPeriodUs     float64 `json:"alpha_period_us"`
	Order             string  `json:"order"` // cut-then-alpha or alpha-then-cut
	InitialAlpha      float64 `json:"initial_alpha"`
	DecreaseFactor    float64 `json:"decrease_factor"`
	MinDecFactor      float64 `json:"min_dec_factor"`
	ReduceMonitorUs   float64 `json:"reduce_monitor_period_us"`
	RateOnFirstCNP    float64 `json:"rate_on_first_cnp_mbps"`
	ClampTarget       bool    `json:"clamp_target_rate"`
	ClampAfterTimeInc bool    `json:"clamp_target_rate_after_time_inc"`
	TimerUs           float64 `json:"timer_us"`
	ByteCounter       int64   `json:"byte_counter_bytes"`
	F                 int     `json:"threshold_f"`
	AIMbps            float64 `json:"ai_mbps"`
	HAIMbps           float64 `json:"hai_mbps"`
	Stages            string  `json:"stages"` // both or timer-only
	Hyper             string  `json:"hyper"`  // linear, linear+1 or constant
}

// NPSummary is a dcqcn.NPConfig.
type NPSummary struct {
	MinIntervalUs float64 `json:"min_interval_us"`
	Defer         bool    `json:"defer"`
	Grid          bool    `json:"grid"`
}

func us(d time.Duration) float64 { return float64(d) / 1e3 }

func describe(o *Options, rp dcqcn.Config, np dcqcn.NPConfig) RunConfig {
	c := RunConfig{Profile: o.Profile, Custom: o.RP != nil || o.NP != nil,
		LinkGbps: o.LinkRate.Gbps(), LinkDelayUs: us(o.LinkDelay), PacketBytes: o.PacketSize,
		Marking: [...]string{"dequeue", "enqueue", "off"}[min(int(o.Marking), 2)],
		KminKB:  float64(o.RED.Kmin) / 1e3, KmaxKB: float64(o.RED.Kmax) / 1e3, Pmax: o.RED.Pmax,
		BufferKB: float64(o.Buffer) / 1e3, PFC: o.PFC, Retime: o.Retime}
	if o.PFC {
		c.PFCXoffKB, c.PFCXonKB = float64(o.PFCXoff)/1e3, float64(o.PFCXon)/1e3
	}
	if o.Profile == "connectx" {
		cx := dcqcn.DefaultConnectX()
		if o.ConnectX != nil {
			cx = *o.ConnectX
		}
		c.Knobs = map[string]uint32{}
		for _, name := range dcqcn.KnobNames() {
			c.Knobs[name], _ = cx.Get(name)
		}
	}
	c.RP = RPSummary{LineGbps: rp.LineRate.Gbps(), MinRateMbps: float64(rp.MinRate) / 1e6, G: rp.G,
		Alpha: [...]string{"on-cnp", "periodic"}[min(int(rp.Alpha), 1)], AlphaPeriodUs: us(rp.AlphaPeriod),
		Order:        [...]string{"cut-then-alpha", "alpha-then-cut"}[min(int(rp.Order), 1)],
		InitialAlpha: rp.InitialAlpha, DecreaseFactor: rp.DecreaseFactor, MinDecFactor: rp.MinDecFactor,
		ReduceMonitorUs: us(rp.ReduceMonitorPeriod), RateOnFirstCNP: float64(rp.RateOnFirstCNP) / 1e6,
		ClampTarget: rp.ClampTargetRate, ClampAfterTimeInc: rp.ClampTargetRateAfterTimeInc,
		TimerUs: us(rp.TimerPeriod), ByteCounter: rp.ByteCounter, F: rp.Threshold,
		AIMbps: float64(rp.AIRate) / 1e6, HAIMbps: float64(rp.HAIRate) / 1e6,
		Stages: [...]string{"both", "timer-only"}[min(int(rp.Stages), 1)],
		Hyper:  [...]string{"linear", "linear+1", "constant"}[min(int(rp.Hyper), 2)]}
	c.NP = NPSummary{MinIntervalUs: us(np.MinInterval), Defer: np.Defer, Grid: np.Grid}
	return c
}

// String is the configuration in a few lines, for the command's output.
func (c *RunConfig) String() string {
	var b strings.Builder
	custom := ""
	if c.Custom {
		custom = " (RP/NP replaced by the caller)"
	}
	fmt.Fprintf(&b, "profile %s%s: line %g Gb/s, g %g, α %s every %g µs (%s), T %g µs, B %d B, F %d, R_AI %g Mb/s, R_HAI %g Mb/s, min rate %g Mb/s",
		c.Profile, custom, c.RP.LineGbps, c.RP.G, c.RP.Alpha, c.RP.AlphaPeriodUs, c.RP.Order, c.RP.TimerUs, c.RP.ByteCounter, c.RP.F, c.RP.AIMbps, c.RP.HAIMbps, c.RP.MinRateMbps)
	fmt.Fprintf(&b, "\n  NP: CNP at most every %g µs (defer %v, grid %v); pacer retime %v; switch: %s marking, RED %g/%g KB/%g %%, buffer %g KB, PFC %v",
		c.NP.MinIntervalUs, c.NP.Defer, c.NP.Grid, c.Retime, c.Marking, c.KminKB, c.KmaxKB, c.Pmax*100, c.BufferKB, c.PFC)
	if len(c.Knobs) > 0 {
		b.WriteString("\n  knobs:")
		for _, name := range dcqcn.KnobNames() {
			fmt.Fprintf(&b, " %s=%d", name, c.Knobs[name])
		}
	}
	return b.String()
}

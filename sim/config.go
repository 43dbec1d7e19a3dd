package sim

import (
	"fmt"
	"strings"
	"time"

	"github.com/softrnic/softrnic/congestion/dcqcn"
)

// RunConfig is what a run actually ran with, written into summary.json so a
// result never has to be matched to a command line: the algorithm and
// profile, DCQCN's ConnectX knobs by mlx5 name, the parameters the
// algorithm ran with, the packet sizes and the switch's marking.
type RunConfig struct {
	Algorithm string `json:"algorithm"`
	Profile   string `json:"profile"`
	// Knobs are the connectx profile's mlx5 knobs (absent for the others).
	Knobs map[string]uint32 `json:"knobs,omitempty"`
	// Custom is set when Options.RP, NP, HPCC, TIMELY or Swift replaced
	// the profile's.
	Custom bool           `json:"custom,omitempty"`
	RP     *RPSummary     `json:"rp,omitempty"`
	NP     *NPSummary     `json:"np,omitempty"`
	HPCC   *HPCCSummary   `json:"hpcc,omitempty"`
	TIMELY *TIMELYSummary `json:"timely,omitempty"`
	Swift  *SwiftSummary  `json:"swift,omitempty"`

	LinkGbps    float64 `json:"link_gbps"`
	LinkDelayUs float64 `json:"link_delay_us"`
	// PacketBytes is a full data packet on the wire (payload, headers and
	// INT); PayloadBytes its payload.
	PacketBytes  int     `json:"packet_bytes"`
	PayloadBytes int     `json:"payload_bytes"`
	AckBytes     int     `json:"ack_bytes,omitempty"`
	AckInterval  int     `json:"ack_interval,omitempty"`
	INTHops      int     `json:"int_hops,omitempty"`
	BaseRTTUs    float64 `json:"max_base_rtt_us"`
	Marking      string  `json:"marking"` // dequeue, enqueue or off
	KminKB       float64 `json:"kmin_kb"`
	KmaxKB       float64 `json:"kmax_kb"`
	Pmax         float64 `json:"pmax"`
	ScaleRED     bool    `json:"red_scaled_by_rate,omitempty"`
	BufferKB     float64 `json:"buffer_kb"`
	SwitchBufKB  float64 `json:"switch_buffer_kb,omitempty"`
	PFC          bool    `json:"pfc"`
	// Retime: a rate change re-times the pacer's pending gap (HPCC
	// ns-3); false: it applies from the next packet (ns3-rdma).
	Retime    bool    `json:"pacer_retime"`
	PFCXoffKB float64 `json:"pfc_xoff_kb,omitempty"`
	PFCXonKB  float64 `json:"pfc_xon_kb,omitempty"`
}

// HPCCSummary is an hpcc.Config in the units papers use.
type HPCCSummary struct {
	LineGbps    float64 `json:"line_gbps"`
	MinRateMbps float64 `json:"min_rate_mbps"`
	BaseRTTUs   float64 `json:"base_rtt_us"`
	Eta         float64 `json:"eta"`
	MaxStage    int     `json:"max_stage"`
	AIMbps      float64 `json:"ai_mbps"`
	WAIBytes    float64 `json:"w_ai_bytes"`
	FastReact   bool    `json:"fast_react"`
}

// TIMELYSummary is a timely.Config.
type TIMELYSummary struct {
	LineGbps       float64 `json:"line_gbps"`
	MinRateMbps    float64 `json:"min_rate_mbps"`
	TLowUs         float64 `json:"t_low_us"`
	THighUs        float64 `json:"t_high_us"`
	MinRTTUs       float64 `json:"min_rtt_us"`
	Alpha          float64 `json:"alpha"`
	Beta           float64 `json:"beta"`
	AddMbps        float64 `json:"delta_mbps"`
	HAIThreshold   int     `json:"hai_threshold"`
	HAIFactor      int     `json:"hai_factor"`
	HAIAnyIncrease bool    `json:"hai_any_increase"`
	SegmentBytes   int64   `json:"segment_bytes"`
}

// SwiftSummary is a swift.Config.
type SwiftSummary struct {
	MSS              int     `json:"mss_bytes"`
	LineGbps         float64 `json:"line_gbps"`
	BaseTargetUs     float64 `json:"base_target_us"`
	HopScaleUs       float64 `json:"hop_scale_us"`
	FSRangeUs        float64 `json:"fs_range_us"`
	FSMinCwnd        float64 `json:"fs_min_cwnd"`
	FSMaxCwnd        float64 `json:"fs_max_cwnd"`
	EndpointTargetUs float64 `json:"endpoint_target_us"`
	AI               float64 `json:"ai"`
	Beta             float64 `json:"beta"`
	MaxMDF           float64 `json:"max_mdf"`
	MinCwnd          float64 `json:"min_cwnd"`
	MaxCwnd          float64 `json:"max_cwnd"`
	InitCwnd         float64 `json:"init_cwnd"`
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

func describe(o *Options, a *algorithm, fb fabric, n *net) RunConfig {
	c := RunConfig{Algorithm: a.name, Profile: o.Profile,
		Custom:   o.RP != nil || o.NP != nil || o.HPCC != nil || o.TIMELY != nil || o.Swift != nil,
		LinkGbps: o.LinkRate.Gbps(), LinkDelayUs: us(o.LinkDelay), PacketBytes: n.pktSize, PayloadBytes: n.payload,
		BaseRTTUs: us(fb.baseRTT),
		Marking:   [...]string{"dequeue", "enqueue", "off"}[min(int(o.Marking), 2)],
		KminKB:    float64(o.RED.Kmin) / 1e3, KmaxKB: float64(o.RED.Kmax) / 1e3, Pmax: o.RED.Pmax, ScaleRED: o.ScaleRED,
		BufferKB: float64(o.Buffer) / 1e3, SwitchBufKB: float64(o.SwitchBuffer) / 1e3, PFC: o.PFC, Retime: o.Retime}
	if a.acks {
		c.AckBytes, c.AckInterval = n.ackSize, o.AckInterval
	}
	c.INTHops = n.intStride
	if o.PFC {
		c.PFCXoffKB, c.PFCXonKB = float64(o.PFCXoff)/1e3, float64(o.PFCXon)/1e3
	}
	switch a.name {
	case DCQCN:
		c.describeDCQCN(o, a.rp, a.np)
	case HPCC:
		h := a.hp
		c.HPCC = &HPCCSummary{LineGbps: h.LineRate.Gbps(), MinRateMbps: float64(h.MinRate) / 1e6, BaseRTTUs: us(h.BaseRTT),
			Eta: h.Eta, MaxStage: h.MaxStage, AIMbps: float64(h.AIRate) / 1e6, WAIBytes: float64(h.AIRate) * h.BaseRTT.Seconds() / 8,
			FastReact: h.FastReact}
	case TIMELY:
		t := a.tm
		c.TIMELY = &TIMELYSummary{LineGbps: t.LineRate.Gbps(), MinRateMbps: float64(t.MinRate) / 1e6, TLowUs: us(t.TLow),
			THighUs: us(t.THigh), MinRTTUs: us(t.MinRTT), Alpha: t.Alpha, Beta: t.Beta, AddMbps: float64(t.AddStep) / 1e6,
			HAIThreshold: t.HAIThreshold, HAIFactor: t.HAIFactor, HAIAnyIncrease: t.HAIAnyIncrease, SegmentBytes: t.Segment}
	case Swift:
		w := a.sw
		c.Swift = &SwiftSummary{MSS: w.MSS, LineGbps: w.LineRate.Gbps(), BaseTargetUs: us(w.BaseTarget), HopScaleUs: us(w.HopScale),
			FSRangeUs: us(w.FSRange), FSMinCwnd: w.FSMinCwnd, FSMaxCwnd: w.FSMaxCwnd, EndpointTargetUs: us(w.EndpointTarget),
			AI: w.AI, Beta: w.Beta, MaxMDF: w.MaxMDF, MinCwnd: w.MinCwnd, MaxCwnd: w.MaxCwnd, InitCwnd: w.InitCwnd}
	}
	return c
}

func (c *RunConfig) describeDCQCN(o *Options, rp dcqcn.Config, np dcqcn.NPConfig) {
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
	c.RP = &RPSummary{LineGbps: rp.LineRate.Gbps(), MinRateMbps: float64(rp.MinRate) / 1e6, G: rp.G,
		Alpha: [...]string{"on-cnp", "periodic"}[min(int(rp.Alpha), 1)], AlphaPeriodUs: us(rp.AlphaPeriod),
		Order:        [...]string{"cut-then-alpha", "alpha-then-cut"}[min(int(rp.Order), 1)],
		InitialAlpha: rp.InitialAlpha, DecreaseFactor: rp.DecreaseFactor, MinDecFactor: rp.MinDecFactor,
		ReduceMonitorUs: us(rp.ReduceMonitorPeriod), RateOnFirstCNP: float64(rp.RateOnFirstCNP) / 1e6,
		ClampTarget: rp.ClampTargetRate, ClampAfterTimeInc: rp.ClampTargetRateAfterTimeInc,
		TimerUs: us(rp.TimerPeriod), ByteCounter: rp.ByteCounter, F: rp.Threshold,
		AIMbps: float64(rp.AIRate) / 1e6, HAIMbps: float64(rp.HAIRate) / 1e6,
		Stages: [...]string{"both", "timer-only"}[min(int(rp.Stages), 1)],
		Hyper:  [...]string{"linear", "linear+1", "constant"}[min(int(rp.Hyper), 2)]}
	c.NP = &NPSummary{MinIntervalUs: us(np.MinInterval), Defer: np.Defer, Grid: np.Grid}
}

// String is the configuration in a few lines, for the command's output.
func (c *RunConfig) String() string {
	var b strings.Builder
	custom := ""
	if c.Custom {
		custom = " (replaced by the caller)"
	}
	switch {
	case c.RP != nil:
		fmt.Fprintf(&b, "profile %s%s: line %g Gb/s, g %g, α %s every %g µs (%s), T %g µs, B %d B, F %d, R_AI %g Mb/s, R_HAI %g Mb/s, min rate %g Mb/s",
			c.Profile, custom, c.RP.LineGbps, c.RP.G, c.RP.Alpha, c.RP.AlphaPeriodUs, c.RP.Order, c.RP.TimerUs, c.RP.ByteCounter, c.RP.F, c.RP.AIMbps, c.RP.HAIMbps, c.RP.MinRateMbps)
		fmt.Fprintf(&b, "\n  NP: CNP at most every %g µs (defer %v, grid %v); pacer retime %v", c.NP.MinIntervalUs, c.NP.Defer, c.NP.Grid, c.Retime)
	case c.HPCC != nil:
		h := c.HPCC
		fmt.Fprintf(&b, "hpcc profile %s%s: line %g Gb/s, T %g µs, η %g, maxStage %d, W_AI %.1f B (%g Mb/s), fast react %v, min rate %g Mb/s, INT %d hops",
			c.Profile, custom, h.LineGbps, h.BaseRTTUs, h.Eta, h.MaxStage, h.WAIBytes, h.AIMbps, h.FastReact, h.MinRateMbps, c.INTHops)
	case c.TIMELY != nil:
		t := c.TIMELY
		fmt.Fprintf(&b, "timely profile %s%s: line %g Gb/s, T_low %g µs, T_high %g µs, minRTT %g µs, α %g, β %g, δ %g Mb/s, HAI ×%d after %d (any increase %v), segment %d B, min rate %g Mb/s",
			c.Profile, custom, t.LineGbps, t.TLowUs, t.THighUs, t.MinRTTUs, t.Alpha, t.Beta, t.AddMbps, t.HAIFactor, t.HAIThreshold, t.HAIAnyIncrease, t.SegmentBytes, t.MinRateMbps)
	case c.Swift != nil:
		w := c.Swift
		fmt.Fprintf(&b, "swift%s: MSS %d B, base target %.3f µs + %.3f µs/hop + flow scaling ≤ %.3f µs (cwnd %g–%g), endpoint target %.3f µs, ai %g, β %g, max_mdf %g, cwnd %.4g–%.4g packets (start %.1f)",
			custom, w.MSS, w.BaseTargetUs, w.HopScaleUs, w.FSRangeUs, w.FSMinCwnd, w.FSMaxCwnd, w.EndpointTargetUs, w.AI, w.Beta, w.MaxMDF, w.MinCwnd, w.MaxCwnd, w.InitCwnd)
	}
	fmt.Fprintf(&b, "\n  switch: %s marking, RED %g/%g KB/%g %%, buffer %g KB, PFC %v; packets %d B on the wire, max base RTT %.3f µs",
		c.Marking, c.KminKB, c.KmaxKB, c.Pmax*100, c.BufferKB, c.PFC, c.PacketBytes, c.BaseRTTUs)
	if len(c.Knobs) > 0 {
		b.WriteString("\n  knobs:")
		for _, name := range dcqcn.KnobNames() {
			fmt.Fprintf(&b, " %s=%d", name, c.Knobs[name])
		}
	}
	return b.String()
}

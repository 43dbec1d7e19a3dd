package rnic

import (
	"fmt"
	"math"

	"github.com/softrnic/softrnic/congestion"
	"github.com/softrnic/softrnic/congestion/dcqcn"
	"github.com/softrnic/softrnic/frame"
	"github.com/softrnic/softrnic/transport/rc"
)

// Congestion is a device's congestion-control setting. The zero value is
// off. Build one with NewCongestion; RP and NP may then be edited field by
// field for experiments.
type Congestion struct {
	// Profile is "off" (or empty), "paper" or "connectx": which DCQCN
	// parameter set RP and NP hold. Any other value is refused by
	// NewDevice.
	Profile string
	// Scale is the time dilation RP and NP were built with (1: none); it
	// is recorded for the stats output, NewCongestion has applied it.
	Scale float64
	// RP and NP are the reaction and notification point parameters every
	// RC/UC QP starts with. NP.DSCP is the DSCP of the CNPs the device
	// sends (cnp_dscp); NP.Prio is not used (the port sends untagged).
	RP dcqcn.Config
	NP dcqcn.NPConfig
	// DataDSCP, if not 0, replaces the DSCP of the QPs' frames; 0 keeps
	// the DSCP of the address vector's TrafficClass (what perftest's
	// --tclass sets). Either way the ECN bits become ECT(0).
	DataDSCP uint8
	// PacerBurst is how many bytes a QP may send back to back after an
	// idle period on top of one packet (congestion.Pacer.Burst); 0 paces
	// every packet at the rate.
	PacerBurst int
}

// NewCongestion returns the setting of a profile: "off", "paper"
// (dcqcn.Paper, dcqcn.PaperNP), "connectx" (the ConnectX knobs of cx, or
// their defaults if cx is nil) or "hpcc-mlx" (dcqcn.HPCCMellanox, a CNP
// for every marked packet), at lineRate (0: the profile's own, 40 Gb/s
// for paper and 100 Gb/s for the others), dilated by scale (0 or 1: none;
// see dcqcn.Config.Dilate). The line rate is the undilated one, as the
// lab's plans give it.
func NewCongestion(profile string, lineRate congestion.Rate, scale float64, cx *dcqcn.ConnectX) (Congestion, error) {
	if scale == 0 {
		scale = 1
	}
	if !(scale >= 1) || math.IsInf(scale, 0) {
		return Congestion{}, fmt.Errorf("rnic: congestion scale %v, want >= 1", scale)
	}
	if lineRate < 0 {
		return Congestion{}, fmt.Errorf("rnic: negative line rate %v", lineRate)
	}
	c := Congestion{Profile: profile, Scale: scale}
	switch profile {
	case "", "off":
		return Congestion{Profile: "off"}, nil
	case "paper":
		if lineRate == 0 {
			lineRate = 40 * congestion.Gbps
		}
		c.RP, c.NP = dcqcn.Paper(lineRate), dcqcn.PaperNP()
	case "connectx":
		if lineRate == 0 {
			lineRate = 100 * congestion.Gbps
		}
		k := dcqcn.DefaultConnectX()
		if cx != nil {
			k = *cx
		}
		c.RP, c.NP = k.Config(lineRate), k.NPConfig()
	case "hpcc-mlx":
		if lineRate == 0 {
			lineRate = 100 * congestion.Gbps
		}
		c.RP, c.NP = dcqcn.HPCCMellanox(lineRate), dcqcn.NPConfig{}
	default:
		return Congestion{}, fmt.Errorf("rnic: unknown congestion profile %q (off, paper, connectx, hpcc-mlx)", profile)
	}
	c.RP, c.NP = c.RP.Dilate(scale), c.NP.Dilate(scale)
	return c, c.validate()
}

// On reports whether DCQCN runs.
func (c *Congestion) On() bool { return c.Profile != "" && c.Profile != "off" }

func (c *Congestion) validate() error {
	if !c.On() {
		return nil
	}
	if c.Profile != "paper" && c.Profile != "connectx" && c.Profile != "hpcc-mlx" {
		return fmt.Errorf("rnic: unknown congestion profile %q", c.Profile)
	}
	if err := c.RP.Validate(); err != nil {
		return err
	}
	if c.DataDSCP > 63 || c.NP.DSCP > 63 || c.PacerBurst < 0 || c.NP.MinInterval < 0 {
		return fmt.Errorf("rnic: DSCP above 63 or negative pacer burst or CNP interval")
	}
	return nil
}

// ccConfig is the transport's congestion control of setting c, nil when
// it is off.
func (c *Congestion) ccConfig() *rc.CCConfig {
	if !c.On() {
		return nil
	}
	return &rc.CCConfig{RP: c.RP, NP: c.NP, PacerBurst: c.PacerBurst}
}

// ccHeaders marks the QP's header template ECT(0), with the profile's data
// DSCP if it has one, and derives the CNP header from it (q.mu held).
func (q *QP) ccHeaders() {
	c := &q.dev.cfg.Congestion
	dscp := q.hdr.TOS() >> 2
	if c.DataDSCP != 0 {
		dscp = c.DataDSCP
	}
	q.hdr.SetTOS(dscp<<2 | frame.ECT0)
	q.cnpHdr = q.hdr
	q.cnpHdr.SetTOS(c.NP.DSCP<<2 | frame.ECT0)
}

// CongestionProfile implements verbs.CongestionProfiler.
func (d *Device) CongestionProfile() (string, float64) {
	c := &d.cfg.Congestion
	if !c.On() {
		return "off", 1
	}
	return c.Profile, c.Scale
}

// ccReporter is a transport that runs congestion control.
type ccReporter interface {
	CongestionState() (dcqcn.State, bool)
}

// CongestionState returns the QP's DCQCN state, false if the QP runs none
// (profile off, UD/GSI, or not yet in RTR). It takes the QP lock: for
// tests and stats, not for the data path.
func (q *QP) CongestionState() (dcqcn.State, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if c, ok := q.tr.(ccReporter); ok {
		return c.CongestionState()
	}
	return dcqcn.State{}, false
}

package rnic

import (
	"fmt"
	"math"
	"time"

	"github.com/softrnic/softrnic/congestion"
	"github.com/softrnic/softrnic/congestion/dcqcn"
	"github.com/softrnic/softrnic/congestion/swift"
	"github.com/softrnic/softrnic/congestion/timely"
	"github.com/softrnic/softrnic/frame"
	"github.com/softrnic/softrnic/transport/rc"
)

// Congestion is a device's congestion-control setting: which algorithm
// every RC and UC QP runs, and its parameters. The zero value is off.
// Build one with NewCongestion; the parameters may then be edited field
// by field for experiments.
type Congestion struct {
	// Algorithm is "off" (or empty), "dcqcn", "swift" or "timely". Any
	// other value is refused by NewDevice.
	Algorithm string
	// Profile names the parameter set the algorithm's fields hold (see
	// NewCongestion).
	Profile string
	// Scale is the time dilation the parameters were built with (1:
	// none); it is recorded for the stats output, NewCongestion has
	// applied it.
	Scale float64
	// RP and NP are DCQCN's reaction and notification point parameters.
	// NP.DSCP is the DSCP of the CNPs the device sends (cnp_dscp);
	// NP.Prio is not used (the port sends untagged).
	RP dcqcn.Config
	NP dcqcn.NPConfig
	// Swift and TIMELY are those algorithms' parameters (Swift's MSS is
	// each QP's full packet); Hops is the switches between the device and
	// its peers, Swift's topology scaling (RoCE's ACK does not echo the
	// data's hop count).
	Swift  swift.Config
	TIMELY timely.Config
	Hops   int
	// DataDSCP, if not 0, replaces the DSCP of the QPs' frames; 0 keeps
	// the DSCP of the address vector's TrafficClass (what perftest's
	// --tclass sets). Under DCQCN the ECN bits become ECT(0); under the
	// delay-based algorithms Not-ECT, so that no ECN marker and no DCQCN
	// notification point acts on their frames.
	DataDSCP uint8
	// HostCC is when the device signals host congestion under DCQCN (its
	// port's receive rings near the point where frames are dropped, as the
	// driver reports with SetRxLevel): the notification point then answers
	// the data packets of its QPs as if they were CE-marked, at most one
	// per QP per CNP interval, so that their senders slow down before the
	// port drops (recv.go). Zero: the defaults of dcqcn.HostCCConfig.
	HostCC dcqcn.HostCCConfig
	// PacerBurst is how many bytes a QP may send back to back after an
	// idle period on top of one packet (congestion.Pacer.Burst); 0 paces
	// every packet at the rate.
	PacerBurst int
}

// Algorithms are the congestion-control algorithms a device runs, and
// each one's profiles, the first its default.
var Algorithms = map[string][]string{
	"dcqcn":  {"connectx", "paper", "hpcc-mlx"},
	"swift":  {"default"},
	"timely": {"artifact", "paper"},
}

// The fabric the Swift and TIMELY profiles assume unless told otherwise:
// the DCQCN paper's two-flow testbed as the simulator builds it (40 Gb/s
// hosts, 1 µs links, one switch, 1000-byte packets), so that a dilated
// live run and `softrnic sim swift --scenario two-flow` run the same
// parameters.
const (
	DelayLineRate  = 40 * congestion.Gbps
	delayLinkDelay = time.Microsecond
	delayPacket    = 1000
)

// NewCongestion returns the setting of an algorithm ("off", "dcqcn",
// "swift", "timely") and one of its profiles ("": the default) at
// lineRate (0: the profile's own), dilated by scale (0 or 1: none; rates
// ÷ scale, delays and periods × scale, bytes and packets unchanged; see
// dcqcn.Config.Dilate). The line rate is the undilated one, as the lab's
// plans give it.
//
//   - dcqcn: "connectx" (the ConnectX knobs of cx, or their defaults if cx
//     is nil; 100 Gb/s), "paper" (dcqcn.Paper, dcqcn.PaperNP; 40 Gb/s) or
//     "hpcc-mlx" (dcqcn.HPCCMellanox, a CNP for every marked packet;
//     100 Gb/s);
//   - swift: "default", swift.Fabric on a fabric of 1 µs links through
//     one switch (hop RTT two link delays plus a 1000-byte packet at the
//     line rate, base RTT two hop RTTs), 40 Gb/s;
//   - timely: "artifact" (timely.Artifact, HPCC ns-3's: an update per RTT)
//     or "paper" (timely.Paper: an update per 16 KB), 40 Gb/s.
func NewCongestion(algorithm, profile string, lineRate congestion.Rate, scale float64, cx *dcqcn.ConnectX) (Congestion, error) {
	if scale == 0 {
		scale = 1
	}
	if !(scale >= 1) || math.IsInf(scale, 0) {
		return Congestion{}, fmt.Errorf("rnic: congestion scale %v, want >= 1", scale)
	}
	if lineRate < 0 || math.IsInf(float64(lineRate), 0) || math.IsNaN(float64(lineRate)) {
		return Congestion{}, fmt.Errorf("rnic: line rate %v", lineRate)
	}
	if algorithm == "" || algorithm == "off" {
		return Congestion{Algorithm: "off"}, nil
	}
	profiles, ok := Algorithms[algorithm]
	if !ok {
		return Congestion{}, fmt.Errorf("rnic: unknown congestion control %q (off, dcqcn, swift, timely)", algorithm)
	}
	if profile == "" {
		profile = profiles[0]
	}
	c := Congestion{Algorithm: algorithm, Profile: profile, Scale: scale}
	rate := func(def congestion.Rate) congestion.Rate {
		if lineRate == 0 {
			return def
		}
		return lineRate
	}
	switch algorithm + "/" + profile {
	case "dcqcn/paper":
		c.RP, c.NP = dcqcn.Paper(rate(40*congestion.Gbps)), dcqcn.PaperNP()
	case "dcqcn/connectx":
		k := dcqcn.DefaultConnectX()
		if cx != nil {
			k = *cx
		}
		c.RP, c.NP = k.Config(rate(100*congestion.Gbps)), k.NPConfig()
	case "dcqcn/hpcc-mlx":
		c.RP, c.NP = dcqcn.HPCCMellanox(rate(100*congestion.Gbps)), dcqcn.NPConfig{}
	case "swift/default":
		r := rate(DelayLineRate)
		hop := 2*delayLinkDelay + r.TxTime(delayPacket)
		c.Swift, c.Hops = swift.Fabric(delayPacket, r, 2*hop, hop), 1
	case "timely/artifact":
		c.TIMELY = timely.Artifact(rate(DelayLineRate))
	case "timely/paper":
		c.TIMELY = timely.Paper(rate(DelayLineRate))
	default:
		return Congestion{}, fmt.Errorf("rnic: unknown %s profile %q (%v)", algorithm, profile, profiles)
	}
	c.RP, c.NP = c.RP.Dilate(scale), c.NP.Dilate(scale)
	c.Swift, c.TIMELY = c.Swift.Dilate(scale), c.TIMELY.Dilate(scale)
	return c, c.validate()
}

// On reports whether congestion control runs.
func (c *Congestion) On() bool { return c.Algorithm != "" && c.Algorithm != "off" }

// LineRate is the rate the algorithm starts at (dilated).
func (c *Congestion) LineRate() congestion.Rate {
	switch c.Algorithm {
	case "swift":
		return c.Swift.LineRate
	case "timely":
		return c.TIMELY.LineRate
	case "dcqcn":
		return c.RP.LineRate
	}
	return 0
}

func (c *Congestion) validate() error {
	if !c.On() {
		return nil
	}
	var err error
	switch c.Algorithm {
	case "dcqcn":
		err = c.RP.Validate()
	case "swift":
		err = c.Swift.Validate()
		if c.Hops < 0 || c.Hops > 64 {
			err = fmt.Errorf("rnic: %d hops", c.Hops)
		}
	case "timely":
		err = c.TIMELY.Validate()
	default:
		return fmt.Errorf("rnic: unknown congestion control %q (off, dcqcn, swift, timely)", c.Algorithm)
	}
	if err != nil {
		return err
	}
	if c.DataDSCP > 63 || c.NP.DSCP > 63 || c.PacerBurst < 0 || c.NP.MinInterval < 0 {
		return fmt.Errorf("rnic: DSCP above 63 or negative pacer burst or CNP interval")
	}
	return nil
}

// frameOverhead is the wire bytes around a transport packet in an IPv4
// frame: Ethernet 14, IPv4 20, UDP 8, ICRC 4. The window's packets count
// it (an IPv6 frame is 20 bytes longer than the unit it is counted in).
const frameOverhead = 14 + 20 + 8 + 4

// ccConfig is the transport's congestion control of setting c, nil when
// it is off.
func (c *Congestion) ccConfig() *rc.CCConfig {
	if !c.On() {
		return nil
	}
	cfg := &rc.CCConfig{RP: c.RP, NP: c.NP, Swift: c.Swift, TIMELY: c.TIMELY, Hops: c.Hops,
		PacketOverhead: frameOverhead, PacerBurst: c.PacerBurst}
	switch c.Algorithm {
	case "swift":
		cfg.Algorithm = rc.Swift
	case "timely":
		cfg.Algorithm = rc.TIMELY
	}
	return cfg
}

// ccHeaders sets the ECN bits of the QP's header template, ECT(0) under
// DCQCN and Not-ECT under the delay-based algorithms, with the setting's
// data DSCP if it has one, and derives the CNP header from it (q.mu held).
func (q *QP) ccHeaders() {
	c := &q.dev.cfg.Congestion
	dscp := q.hdr.TOS() >> 2
	if c.DataDSCP != 0 {
		dscp = c.DataDSCP
	}
	if c.Algorithm != "dcqcn" {
		q.hdr.SetTOS(dscp << 2)
		return
	}
	q.hdr.SetTOS(dscp<<2 | frame.ECT0)
	q.cnpHdr = q.hdr
	q.cnpHdr.SetTOS(c.NP.DSCP<<2 | frame.ECT0)
}

// CongestionProfile implements verbs.CongestionProfiler.
func (d *Device) CongestionProfile() (algorithm, profile string, scale float64) {
	c := &d.cfg.Congestion
	if !c.On() {
		return "off", "", 1
	}
	return c.Algorithm, c.Profile, c.Scale
}

// ccReporter is a transport that runs congestion control.
type ccReporter interface {
	CongestionState() (congestion.State, bool)
}

// CongestionState returns the QP's congestion-control state, false if the
// QP runs none (off, UD/GSI, or not yet in RTR). It takes the QP lock: for
// tests and stats, not for the data path.
func (q *QP) CongestionState() (congestion.State, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if c, ok := q.tr.(ccReporter); ok {
		return c.CongestionState()
	}
	return congestion.State{}, false
}

// SetRxAway tells the device how long its engine was away from the port
// before the poll whose frames it hands to the next Receive (0: it waited
// in the port and the frames woke it). The congestion control of the QPs
// that receive them splits end-host delay from fabric delay with it
// (transport.Meta.RxAway). A driver that does not call it gets 0.
func (d *Device) SetRxAway(away time.Duration) { d.rxAway = away }

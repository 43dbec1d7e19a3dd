package testbed

import (
	"fmt"

	"github.com/softrnic/softrnic/congestion"
	"github.com/softrnic/softrnic/congestion/dcqcn"
	"github.com/softrnic/softrnic/lab/dcqcnlive/internal/ecnmark"
)

// Time dilation (dcqcn-anchors §5.6): two cores cannot forward 40 Gb/s, so
// the live experiment divides every rate by S and multiplies every time
// constant by S, leaving byte quantities (MTU, Kmin/Kmax, the byte counter,
// buffer sizes) alone. The DCQCN fluid model is invariant under this map
// (rates/C, queue in bytes, t/S), so the normalised traces of a dilated run
// are comparable with the undilated simulation.

// DefaultScale is S when none is given: the paper's 40 Gb/s becomes a
// 100 Mb/s bottleneck (about 11.6 kpps of 1 KiB RoCE packets), which the
// two shared cores of the development machines carry with room for the
// senders, kernel forwarding and the receiver; K = T = 22 ms, N = 20 ms.
const DefaultScale = 400

// DilateRP returns c with rates divided by s and periods multiplied by s
// (dcqcn.Config.Dilate, kept here so that the lab reads as before).
func DilateRP(c dcqcn.Config, s float64) dcqcn.Config { return c.Dilate(s) }

// DilateNP returns n with its CNP interval multiplied by s
// (dcqcn.NPConfig.Dilate).
func DilateNP(n dcqcn.NPConfig, s float64) dcqcn.NPConfig { return n.Dilate(s) }

// Plan is a dilated experiment's parameters: the bottleneck for Build and
// the congestion control congestion-controlled endpoints must run.
type Plan struct {
	// Algorithm is "dcqcn", "swift" or "timely"; Profile its profile
	// (softrnic's --cc ALGORITHM:PROFILE).
	Algorithm  string
	Profile    string
	Scale      float64
	LineRate   congestion.Rate // undilated line rate of the profile
	Bottleneck Bottleneck
	RP         dcqcn.Config   // DCQCN's, dilated
	NP         dcqcn.NPConfig // DCQCN's, dilated
}

// CC is the plan's congestion control as softrnic's --cc takes it.
func (p *Plan) CC() string { return p.Algorithm + ":" + p.Profile }

// PlanForCC returns the plan of an algorithm at scale s: DCQCN's is
// PlanFor's of its profile ("": paper); Swift and TIMELY run on the
// paper profile's bottleneck (the DCQCN paper's two-flow fabric, which the
// simulator's two-flow scenario and softrnic's Swift and TIMELY profiles
// assume: 40 Gb/s), whose ECN marker they leave alone (their frames are
// not ECN capable).
func PlanForCC(algorithm, profile string, s float64, seed uint64) (Plan, error) {
	switch algorithm {
	case "", "dcqcn":
		if profile == "" {
			profile = "paper"
		}
		return PlanFor(profile, s, seed)
	case "swift", "timely":
	default:
		return Plan{}, fmt.Errorf("testbed: unknown congestion control %q (dcqcn, swift, timely)", algorithm)
	}
	p, err := PlanFor("paper", s, seed)
	if err != nil {
		return p, err
	}
	p.Algorithm, p.Profile = algorithm, profile
	if p.Profile == "" {
		p.Profile = map[string]string{"swift": "default", "timely": "artifact"}[algorithm]
	}
	p.RP, p.NP = dcqcn.Config{}, dcqcn.NPConfig{}
	return p, nil
}

// PlanFor returns the plan of a profile at scale s:
//   - paper: 40 Gb/s line and bottleneck, RED Kmin 5 KB, Kmax 200 KB,
//     Pmax 1 % (the paper's §5.3 values), dcqcn.Paper and dcqcn.PaperNP;
//   - connectx: 100 Gb/s, the ConnectX defaults (dcqcn.DefaultConnectX)
//     and the ECN thresholds the anchors give for a ConnectX fabric,
//     400 KB / 1600 KB / 20 %.
//
// The tbf burst is 3 frames of 1500-byte MTU, its limit 4 × Kmax.
func PlanFor(profile string, s float64, seed uint64) (Plan, error) {
	if !(s >= 1) {
		return Plan{}, fmt.Errorf("testbed: scale %v below 1", s)
	}
	p := Plan{Algorithm: "dcqcn", Profile: profile, Scale: s}
	var kmin, kmax uint64
	var pmax float64
	switch profile {
	case "paper":
		p.LineRate = 40 * congestion.Gbps
		p.RP, p.NP = dcqcn.Paper(p.LineRate), dcqcn.PaperNP()
		kmin, kmax, pmax = 5_000, 200_000, 0.01
	case "connectx":
		p.LineRate = 100 * congestion.Gbps
		cx := dcqcn.DefaultConnectX()
		p.RP, p.NP = cx.Config(p.LineRate), cx.NPConfig()
		kmin, kmax, pmax = 400_000, 1_600_000, 0.2
	default:
		return Plan{}, fmt.Errorf("testbed: unknown profile %q (paper, connectx)", profile)
	}
	p.RP, p.NP = p.RP.Dilate(s), p.NP.Dilate(s)
	rate := uint64(float64(p.LineRate) / s)
	p.Bottleneck = Bottleneck{
		RateBitsPerSec: rate,
		BurstBytes:     3 * 1514,
		LimitBytes:     4 * kmax,
		Marker:         ecnmark.Config{KminBytes: kmin, KmaxBytes: kmax, Pmax: pmax, Seed: seed},
	}
	return p, nil
}

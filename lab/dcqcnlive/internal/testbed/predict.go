package testbed

import (
	"fmt"
	"time"

	"github.com/softrnic/softrnic/sim"
)

// Prediction is the simulator's run of the live experiment's scenario,
// undilated: softrnic sim's two-flow scenario (one bottleneck at the
// plan's undilated line rate, flow 2 joining at 10 ms) with the plan's
// algorithm, profile and ECN ramp (marking at enqueue, as the live
// marker does), for the live run's duration ÷ S, measured over the same
// last 20 %. Rates normalised to the bottleneck, Jain's index,
// utilisation and queue bytes are what a dilated run preserves, so they
// are what the live figures are held against.
type Prediction struct {
	Algorithm  string     `json:"algorithm"`
	Profile    string     `json:"profile"`
	LineGbps   float64    `json:"line_gbps"`
	DurationMs float64    `json:"duration_ms"`
	WindowMs   [2]float64 `json:"window_ms"`
	// Normalised is each flow's mean rate in the window over the
	// bottleneck; LiveMbps the same at the live bottleneck.
	Normalised  []float64 `json:"normalised"`
	LiveMbps    []float64 `json:"live_mbps"`
	Jain        float64   `json:"jain"`
	Utilization float64   `json:"utilization"`
	QueueMeanKB float64   `json:"queue_mean_kb"`
	QueueP5KB   float64   `json:"queue_p5_kb"`
	QueueP95KB  float64   `json:"queue_p95_kb"`
	QueuePeakKB float64   `json:"queue_peak_kb"`
	// Note says where the simulated scenario is not the live one.
	Note string `json:"note"`
}

// Predict runs the simulator for plan p and a live run of duration d
// whose second flow joins at join (wall time).
func Predict(p Plan, d, join time.Duration) (*Prediction, error) {
	ms := time.Millisecond
	sd := time.Duration(float64(d)/p.Scale/float64(ms)+0.5) * ms
	ws := time.Duration(0.8*float64(sd)/float64(ms)+0.5) * ms
	if sd < 12*ms || ws+ms > sd || ws < 10*ms {
		return nil, fmt.Errorf("testbed: a %v run at S=%g is %v undilated: too short for the two-flow scenario (flow 2 joins at 10 ms)", d, p.Scale, sd)
	}
	m := p.Bottleneck.Marker
	o := sim.Options{Scenario: sim.TwoFlow, Algorithm: p.Algorithm, Profile: p.Profile, LinkRate: p.LineRate,
		Duration: sd, WindowStart: ws, Marking: sim.MarkEnqueue,
		RED: sim.RED{Kmin: int64(m.KminBytes), Kmax: int64(m.KmaxBytes), Pmax: m.Pmax}, Seed: m.Seed}
	r, err := sim.Run(o)
	if err != nil {
		return nil, err
	}
	s := &r.Summary
	pr := &Prediction{Algorithm: p.Algorithm, Profile: p.Profile, LineGbps: p.LineRate.Gbps(), DurationMs: s.DurationMs, WindowMs: s.WindowMs,
		Jain: s.Jain, Utilization: s.Utilization, QueueMeanKB: s.QueueMeanKB, QueueP5KB: s.QueueP5KB, QueueP95KB: s.QueueP95KB,
		QueuePeakKB: s.QueuePeakKB,
		Note:        "1000-byte packets and an ACK per packet (live: about 1080 bytes, an ACK per AckReq); hosts that answer at once"}
	live := float64(p.Bottleneck.RateBitsPerSec) / 1e6
	for _, f := range s.Flows {
		n := f.MeanGbps / p.LineRate.Gbps()
		pr.Normalised = append(pr.Normalised, n)
		pr.LiveMbps = append(pr.LiveMbps, n*live)
	}
	if want := time.Duration(p.Scale * float64(10*ms)); join != want {
		pr.Note += fmt.Sprintf("; the live second flow joins at %v, the simulated one at 10 ms (S × 10 ms = %v)", join, want)
	}
	return pr, nil
}

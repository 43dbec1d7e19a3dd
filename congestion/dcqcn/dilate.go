package dcqcn

import (
	"time"

	"github.com/softrnic/softrnic/congestion"
)

// Time dilation (dcqcn-anchors §5.6): a host that cannot carry the
// profile's line rate runs DCQCN with every rate divided by s and every
// time constant multiplied by s, leaving byte quantities (MTU, the byte
// counter, ECN thresholds, buffers) alone. The DCQCN fluid model is
// invariant under this map (rates/C, queue in bytes, t/s), so a dilated
// run's normalised traces compare with the undilated simulation. The live
// lab (lab/dcqcnlive) and the device (package rnic) both dilate through
// these two methods so that they agree on what "scale s" means.

// Dilate returns c with its rates divided by s and its periods multiplied
// by s. s ≤ 0 or NaN leaves c unchanged.
func (c Config) Dilate(s float64) Config {
	if !(s > 0) {
		return c
	}
	r := func(x congestion.Rate) congestion.Rate { return congestion.Rate(float64(x) / s) }
	d := func(x time.Duration) time.Duration { return time.Duration(float64(x) * s) }
	c.LineRate, c.MinRate, c.RateOnFirstCNP = r(c.LineRate), r(c.MinRate), r(c.RateOnFirstCNP)
	c.AIRate, c.HAIRate = r(c.AIRate), r(c.HAIRate)
	c.AlphaPeriod, c.ReduceMonitorPeriod, c.TimerPeriod = d(c.AlphaPeriod), d(c.ReduceMonitorPeriod), d(c.TimerPeriod)
	return c
}

// Dilate returns n with its CNP interval multiplied by s. s ≤ 0 or NaN
// leaves n unchanged.
func (n NPConfig) Dilate(s float64) NPConfig {
	if !(s > 0) {
		return n
	}
	n.MinInterval = time.Duration(float64(n.MinInterval) * s)
	return n
}

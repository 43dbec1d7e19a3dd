package timely

import (
	"time"

	"github.com/softrnic/softrnic/congestion"
)

// Dilate returns c with its rates divided by s and its delays multiplied
// by s, the segment (bytes) and gains unchanged (congestion/dcqcn's
// Dilate, for DCQCN): the gradient (an RTT difference over MinRTT) and
// the rate normalised to the line rate then follow the undilated run.
// s ≤ 0 or NaN leaves c unchanged.
func (c Config) Dilate(s float64) Config {
	if !(s > 0) {
		return c
	}
	r := func(x congestion.Rate) congestion.Rate { return congestion.Rate(float64(x) / s) }
	d := func(x time.Duration) time.Duration { return time.Duration(float64(x) * s) }
	c.LineRate, c.MinRate, c.AddStep = r(c.LineRate), r(c.MinRate), r(c.AddStep)
	c.TLow, c.THigh, c.MinRTT = d(c.TLow), d(c.THigh), d(c.MinRTT)
	return c
}

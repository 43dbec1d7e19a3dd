package swift

import (
	"time"

	"github.com/softrnic/softrnic/congestion"
)

// Fabric is Swift on a fabric whose base RTT between two hosts is baseRTT
// and to which each switch hop adds hopRTT (two link delays and a packet's
// serialisation), for packets of mss wire bytes from hosts of lineRate:
// the base target is one hop's RTT plus ten packets of queueing at the line
// rate (the paper's "queuing delay for a small number of flows"), the
// per-hop scale is hopRTT, so every path gets the same queueing allowance
// on top of its own base RTT, and flow scaling adds up to 5× the base
// target (htsim's choice). The simulator derives its Swift from its fabric
// this way, and the RNIC's live Swift (package host) from the fabric it is
// told of.
func Fabric(mss int, lineRate congestion.Rate, baseRTT, hopRTT time.Duration) Config {
	base := hopRTT + 10*lineRate.TxTime(mss)
	return Default(mss, lineRate, baseRTT, base, hopRTT, 5*base)
}

// Dilate returns c with its rate divided by s and its delays multiplied by
// s, windows (packets) and MSS (bytes) unchanged: the map under which a
// Swift flow's window, queue in bytes and normalised rate are invariant
// (a bandwidth-delay product does not change when the rate falls and the
// delays grow by the same factor), so that a host that cannot carry the
// line rate runs the dynamics of the undilated fabric (congestion/dcqcn's
// Dilate, for DCQCN). s ≤ 0 or NaN leaves c unchanged.
func (c Config) Dilate(s float64) Config {
	if !(s > 0) {
		return c
	}
	d := func(x time.Duration) time.Duration { return time.Duration(float64(x) * s) }
	c.LineRate = congestion.Rate(float64(c.LineRate) / s)
	c.BaseTarget, c.HopScale, c.FSRange, c.EndpointTarget = d(c.BaseTarget), d(c.HopScale), d(c.FSRange), d(c.EndpointTarget)
	return c
}

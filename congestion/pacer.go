package congestion

import (
	"math"

	"github.com/softrnic/softrnic/clock"
)

// Pacer holds one QP to its congestion-control rate: a token bucket whose
// fill rate is the controller's current rate and whose depth is Burst bytes.
// It answers the engine's one question per packet — may I send n bytes now,
// and if not, when? — without allocating and without reading a clock.
//
// It is kept in GCRA form (a theoretical arrival time, tat): sending n bytes
// moves tat forward by n bytes' worth of time at the current rate, and a
// send is allowed while tat is no later than now plus the burst's worth of
// time. A rate change therefore applies from the next packet on, exactly as
// the "next available time" pacers of the reference simulators do. The
// sub-nanosecond part of each packet's cost is carried in rem, so that long
// runs at rates that do not divide a nanosecond keep the exact mean rate.
//
// The zero Pacer (Burst 0) sends one packet at a time at the exact rate.
type Pacer struct {
	// Burst is how many bytes may leave back to back after an idle period
	// on top of the first packet (a bucket of depth Burst plus one packet).
	// 0 means strict pacing: a packet may go when the previous one's time
	// at the current rate has elapsed.
	Burst int

	tat clock.Time // theoretical arrival time of the next byte
	rem float64    // fraction of a nanosecond owed on top of tat, in [0,1)
}

// Next returns the earliest time >= now at which n bytes may be sent at rate
// r. A rate <= 0 never allows sending: Next returns clock.Never.
func (p *Pacer) Next(now clock.Time, r Rate, n int) clock.Time {
	if r <= 0 {
		return clock.Never
	}
	slack := clock.Time(float64(p.Burst) * 8e9 / float64(r))
	at := p.tat - slack
	if at < now {
		return now
	}
	return at
}

// Allow reports whether n bytes may be sent at now at rate r; if so it
// charges them, if not it returns the time to ask again.
func (p *Pacer) Allow(now clock.Time, r Rate, n int) (ok bool, retry clock.Time) {
	at := p.Next(now, r, n)
	if at > now {
		return false, at
	}
	p.Sent(now, r, n)
	return true, now
}

// Sent charges n bytes sent at now at rate r, whether or not Allow was asked
// (the engine may send a retransmission or a control packet unpaced and
// still want it counted).
func (p *Pacer) Sent(now clock.Time, r Rate, n int) {
	if r <= 0 {
		return
	}
	if p.tat < now {
		// Idle time earns no more than Burst: the bucket is full.
		p.tat, p.rem = now, 0
	}
	cost := float64(n)*8e9/float64(r) + p.rem
	whole := math.Floor(cost)
	if whole >= float64(clock.Never-p.tat) {
		p.tat, p.rem = clock.Never, 0
		return
	}
	p.tat += clock.Time(whole)
	p.rem = cost - whole
}

// Retime applies a rate change to the gap still pending after the last
// packet: the last packet's n bytes are re-costed at the new rate, so a
// cut lengthens the wait in progress and an increase shortens it, as HPCC's
// ns-3 does (RdmaHw::ChangeRate moves m_nextAvail by the difference of the
// last packet's transmission times). Without Retime a rate change applies
// from the next packet on, as in the paper authors' ns3-rdma, whose NIC
// computes each gap when a packet leaves. Nothing happens when no gap is
// pending (tat ≤ now). The theoretical arrival time never moves before now.
func (p *Pacer) Retime(now clock.Time, old, new Rate, n int) {
	if p.tat <= now || old <= 0 || new <= 0 || old == new || p.tat == clock.Never {
		return
	}
	d := float64(n)*8e9/float64(new) - float64(n)*8e9/float64(old) + p.rem
	if d >= float64(clock.Never-p.tat) {
		p.tat, p.rem = clock.Never, 0
		return
	}
	whole := math.Floor(d)
	p.tat += clock.Time(whole)
	p.rem = d - whole
	if p.tat < now {
		p.tat, p.rem = now, 0
	}
}

// Reset forgets all history: the bucket is full again.
func (p *Pacer) Reset() { p.tat, p.rem = 0, 0 }

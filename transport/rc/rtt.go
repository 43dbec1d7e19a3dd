package rc

import (
	"time"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/clock"
)

// Adaptive retransmission timing. README ("Loss recovery") explains the
// choices; in short, the RTO, like the tail-loss probe that reacts first,
// resends one packet (a harmless duplicate if it was not needed) and lets
// the answer decide, so its floor need not stand above the stalls a
// software host sees: it bounds how long a requester whose window is full
// waits when a probe or its answer was lost, and backs off on a peer that
// stalled.
const (
	// RTOMin floors the adaptive retransmission timeout.
	RTOMin = 300 * time.Microsecond
	// PTOMin floors the tail-loss probe timeout.
	PTOMin = 100 * time.Microsecond
	// InitialRTO is the retransmission timeout before the first RTT
	// sample (never longer than the local ACK timeout).
	InitialRTO = 10 * time.Millisecond
	// MaxRTO caps the backed-off RTO of a QP whose local ACK timeout is 0
	// (wait forever); otherwise the local ACK timeout caps it.
	MaxRTO = time.Second
	// minRTTWindow is how long a minimum RTT sample is trusted before a
	// larger one may replace it (a path that got longer).
	minRTTWindow = 10 * time.Second
)

// rttEstimator is RFC 6298's smoothed RTT and variance, plus the minimum
// RTT that RACK's reordering window and the BDP estimate use. Samples obey
// Karn's rule: the caller never offers one for a retransmitted packet.
type rttEstimator struct {
	srtt, rttvar time.Duration
	minRTT       time.Duration
	minAt        clock.Time
	samples      uint64
	last         time.Duration // the last sample
}

func (e *rttEstimator) sample(now clock.Time, r time.Duration) {
	if r <= 0 {
		r = 1
	}
	if e.samples == 0 {
		e.srtt, e.rttvar = r, r/2
	} else {
		d := e.srtt - r
		if d < 0 {
			d = -d
		}
		e.rttvar += (d - e.rttvar) / 4
		e.srtt += (r - e.srtt) / 8
	}
	e.samples++
	e.last = r
	if e.minRTT == 0 || r <= e.minRTT || now.Sub(e.minAt) > minRTTWindow {
		e.minRTT, e.minAt = r, now
	}
}

// rto is the retransmission timeout before backoff: SRTT + 4·RTTVAR, at
// least RTOMin and a round trip beyond the tail-loss probe's timeout (on a
// steady path RTTVAR decays, and the probe, which neither backs off nor
// counts as a timeout, should still come first), at most limit.
func (e *rttEstimator) rto(limit time.Duration) time.Duration {
	d := InitialRTO
	if e.samples > 0 {
		d = max(e.srtt+4*e.rttvar, RTOMin, e.probeWait()+e.srtt)
	}
	return min(d, limit)
}

// pto is the tail-loss probe timeout: two smoothed RTTs (RFC 8985), at
// least PTOMin, never beyond the RTO. (QUIC's SRTT+4·RTTVAR spared a
// jittery software peer a repeated packet now and then, but delayed every
// tail-loss recovery: in the goodput model, adaptive go-back-N at 3 % loss
// fell from 0.38 to 0.25 of lossless. A spurious probe costs one packet;
// the stall it met still teaches SRTT, see sampleRTT.)
func (e *rttEstimator) pto(limit time.Duration) time.Duration {
	if e.samples == 0 {
		return min(InitialRTO/2, limit)
	}
	return min(e.probeWait(), limit)
}

// probeWait is the tail-loss probe timeout once the RTT is known, before
// the RTO caps it: two SRTTs, at least PTOMin.
func (e *rttEstimator) probeWait() time.Duration { return max(2*e.srtt, PTOMin) }

// txRec is what the requester remembers of one PSN it sent a packet for
// (SEND/WRITE packets, READ requests at their first PSN, atomics).
type txRec struct {
	psn   bth.PSN
	flags uint8
	at    clock.Time // last transmission
	first clock.Time // first transmission
	// Delivery-rate sampling (BBR's): the packets delivered and when, as
	// of this transmission.
	delivered   uint64
	deliveredAt clock.Time
}

const (
	txSent      uint8 = 1 << iota // the record is in use
	txRetx                        // sent more than once: no RTT sample (Karn)
	txDelivered                   // selectively acknowledged (or its READ answered)
	txLost                        // declared lost, awaiting a selective retransmission
	txSampled                     // gave its RTT sample already
	txAckReq                      // a transmission other than a probe asked for an ACK
)

// txRing holds the records of the PSNs in flight, indexed by PSN modulo its
// size. The window keeps every PSN in flight within half the ring of the
// oldest unacknowledged one, so a live record is never overwritten; a
// record left behind by a completed WQE is cleared when the WQE completes.
type txRing struct {
	recs []txRec
	mask uint32
}

func newTxRing(n int) txRing {
	return txRing{recs: make([]txRec, n), mask: uint32(n - 1)}
}

// get returns p's record, or nil when none is live for p.
func (t *txRing) get(p bth.PSN) *txRec {
	r := &t.recs[uint32(p)&t.mask]
	if r.flags&txSent == 0 || r.psn != p {
		return nil
	}
	return r
}

// sent records a transmission of p at now; a second one marks the record
// retransmitted. The caller has settled a pending loss mark first.
func (t *txRing) sent(p bth.PSN, now clock.Time, delivered uint64, deliveredAt clock.Time) *txRec {
	r := &t.recs[uint32(p)&t.mask]
	if r.flags&txSent != 0 && r.psn == p {
		r.flags |= txRetx
	} else {
		*r = txRec{psn: p, flags: txSent, first: now}
	}
	r.at, r.delivered, r.deliveredAt = now, delivered, deliveredAt
	return r
}

// clear forgets p's record.
func (t *txRing) clear(p bth.PSN) {
	r := &t.recs[uint32(p)&t.mask]
	if r.psn == p {
		r.flags = 0
	}
}

// grow resizes the ring to n records, keeping the live ones.
func (t *txRing) grow(n int) {
	if len(t.recs) >= n {
		return
	}
	old := t.recs
	*t = newTxRing(n)
	for _, r := range old {
		if r.flags&txSent != 0 {
			t.recs[uint32(r.psn)&t.mask] = r
		}
	}
}

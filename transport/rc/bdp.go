package rc

import (
	"math"
	"time"

	"github.com/softrnic/softrnic/clock"
)

// srMinWindow floors the BDP window: four ACK intervals of four packets, so
// that a short path still keeps the pipe full between acknowledgements.
const srMinWindow = 128

// bdpEst is IRN's BDP flow control without a configured BDP: the
// selective-repeat requester keeps at most about two bandwidth-delay
// products of PSNs unacknowledged, the bandwidth being the largest delivery
// rate measured over the last few RTTs (BBR's per-packet delivery-rate
// samples) and the delay the minimum RTT. Beyond that a window only queues
// packets on the path and in the responder's reorder buffer, where a loss
// costs more; below it the pipe runs dry.
type bdpEst struct {
	delivered   uint64     // packets delivered (acknowledged cumulatively or selectively)
	deliveredAt clock.Time // when delivered last grew
	maxRate     [2]float64 // packets per ns: the current filter window's maximum and the last one's
	winStart    clock.Time
}

// deliver counts n newly delivered packets and takes a delivery-rate sample
// from rec, the most recently sent of them: the packets delivered between
// its transmission and now, over the time between the delivery that
// preceded its transmission and now.
func (b *bdpEst) deliver(now clock.Time, n uint64, rec *txRec, filter time.Duration) {
	b.delivered += n
	b.deliveredAt = now
	if rec == nil || rec.deliveredAt == 0 {
		return
	}
	dt := now.Sub(rec.deliveredAt)
	if dt <= 0 {
		return
	}
	rate := float64(b.delivered-rec.delivered) / float64(dt)
	if now.Sub(b.winStart) > filter {
		b.maxRate[1], b.maxRate[0], b.winStart = b.maxRate[0], 0, now
	}
	b.maxRate[0] = max(b.maxRate[0], rate)
}

// window is the BDP window in PSNs for a minimum RTT of minRTT: twice the
// bandwidth-delay product, within [srMinWindow, SRWindow]; def before any
// measurement.
func (b *bdpEst) window(minRTT time.Duration, def int) int {
	rate := max(b.maxRate[0], b.maxRate[1])
	if rate == 0 || minRTT == 0 {
		return def
	}
	w := math.Ceil(2 * rate * float64(minRTT))
	return int(min(max(w, srMinWindow), SRWindow))
}

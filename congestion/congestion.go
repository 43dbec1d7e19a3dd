package congestion

import (
	"math"
	"time"

	"github.com/softrnic/softrnic/clock"
)

// Rate is a sending rate in bits per second. It is a float64 because the
// published algorithms are defined on real numbers (DCQCN halves and
// averages rates); the pacer converts it to integer time.
type Rate float64

// Common rate units.
const (
	BitPerSecond Rate = 1
	Kbps         Rate = 1e3
	Mbps         Rate = 1e6
	Gbps         Rate = 1e9
)

// Gbps returns r in Gb/s, the unit papers quote.
func (r Rate) Gbps() float64 { return float64(r) / 1e9 }

// TxTime is the time to put n bytes on a wire of rate r, in nanoseconds,
// rounded to the nearest nanosecond. A non-positive rate never finishes.
func (r Rate) TxTime(n int) time.Duration {
	if r <= 0 {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(math.Round(float64(n) * 8e9 / float64(r)))
}

// NoWindow is what Window returns for a purely rate-based algorithm.
const NoWindow int64 = math.MaxInt64

// Ack is the feedback an acknowledgement carries, for algorithms that use it
// (DCQCN does not: its feedback is the CNP). It is passed by value and holds
// no memory of its own: INT is a view of the caller's buffer.
type Ack struct {
	// Bytes newly acknowledged, counted as OnPacketSent counts them (wire
	// bytes of the acknowledged packets). The ACK-clocked algorithms keep
	// their own sent and acknowledged totals from these two, and from
	// them tell when a round trip's worth of data has been acknowledged.
	Bytes int
	// ECNEcho reports that the acknowledged data was CE-marked (DCTCP-style).
	ECNEcho bool
	// RTT is the round-trip sample this ACK gives, 0 if none (TIMELY, Swift):
	// from the acknowledged packet leaving the sender's NIC to the ACK
	// reaching it.
	RTT time.Duration
	// HostDelay is the part of RTT spent in the end hosts rather than the
	// fabric: the receiver's time from the data's arrival to the ACK's
	// departure (echoed in the ACK) plus the sender's time from the ACK's
	// arrival to this call. Swift splits RTT into fabric delay (RTT −
	// HostDelay) and endpoint delay (HostDelay). 0 if unknown.
	HostDelay time.Duration
	// Hops is how many switches the acknowledged packet crossed (from its
	// IP TTL); 0 if unknown. Swift scales its target delay with it.
	Hops int
	// INT is the in-band network telemetry the acknowledged data packet
	// collected, one record per switch egress port in path order, echoed
	// by the receiver (HPCC). A view of the caller's memory, valid only
	// for the duration of the call: a controller copies what it keeps.
	INT []INTHop
}

// INTHop is one switch egress port's in-band telemetry record, pushed when
// the data packet left the port (HPCC's IntHop: link rate, timestamp,
// transmitted bytes, queue length).
type INTHop struct {
	// Rate is the port's line rate.
	Rate Rate
	// TS is when the packet left the port.
	TS clock.Time
	// TxBytes is the port's running count of bytes transmitted before this
	// packet; the difference between two records is what the port sent
	// in between.
	TxBytes int64
	// QLen is the bytes left queued at the port as the packet left.
	QLen int64
}

// LossReactor is implemented by controllers that react to loss recovery
// (Swift). The transport calls OnRetransmit once per retransmission event:
// timeout is true for a retransmission timeout, false for a retransmission
// a NAK (sequence error) or a selective acknowledgement triggered.
type LossReactor interface {
	OnRetransmit(now clock.Time, timeout bool)
}

// Controller is a rate-based congestion controller for one flow (one QP).
//
// The caller must call OnTimer at (or after) Deadline; calling it early is
// harmless. Every method takes the current time and never reads a clock;
// times passed to one Controller must not go backwards. Implementations must
// not allocate in these methods: the engine calls them per packet.
type Controller interface {
	// OnPacketSent reports that n bytes (wire bytes of one packet) were sent.
	OnPacketSent(now clock.Time, n int)
	// OnCNP reports a Congestion Notification Packet for this flow.
	OnCNP(now clock.Time)
	// OnAck reports an acknowledgement and what it tells about the path.
	OnAck(now clock.Time, ack Ack)
	// OnTimer lets the controller run the timers that are due at now.
	OnTimer(now clock.Time)
	// Rate is the rate the pacer must hold this flow to.
	Rate() Rate
	// Window is the cap on bytes in flight, NoWindow for rate-only control.
	Window() int64
	// Deadline is when OnTimer must next be called, clock.Never if no timer
	// is armed.
	Deadline() clock.Time
}

package congestion

import "time"

// Counters count, per flow (and summed per device), what a connected
// transport's congestion control saw and did, whatever the algorithm.
type Counters struct {
	// RTTSamples are the round-trip samples handed to the controller:
	// one per acknowledgement of a packet sent once (Karn's rule: a
	// retransmitted packet's acknowledgement is ambiguous and gives none).
	RTTSamples uint64
	// Decreases counts the events after which the controller's rate or
	// window was lower than before (a CNP's cut, a delay above target, a
	// loss).
	Decreases uint64
	// LossEvents counts the retransmission events reported to the
	// controller (a timeout, a NAK, a selective or fast retransmission).
	LossEvents uint64
	// WindowFull counts the times the window held a send back: the
	// transition from "may send" to "bytes in flight reached the window".
	WindowFull uint64
}

// Add adds o to c.
func (c *Counters) Add(o Counters) {
	c.RTTSamples += o.RTTSamples
	c.Decreases += o.Decreases
	c.LossEvents += o.LossEvents
	c.WindowFull += o.WindowFull
}

// State is a snapshot of one flow's congestion control, for stats, tools
// and tests: the figures every algorithm has, then each algorithm's own
// (zero where they do not apply).
type State struct {
	// Algorithm is "dcqcn", "swift" or "timely".
	Algorithm string
	// Rate is what the pacer holds the flow to; Window the cap on bytes
	// in flight (NoWindow for a rate-only algorithm) and InFlight the
	// bytes in flight as the window counts them.
	Rate     Rate
	Window   int64
	InFlight int64
	// SRTT and MinRTT are the transport's RTT estimates (RFC 6298's
	// smoothed RTT and the windowed minimum), 0 before the first sample;
	// LastRTT the last sample handed to the controller and HostDelay the
	// part of it attributed to the end hosts.
	SRTT, MinRTT, LastRTT, HostDelay time.Duration
	Counters

	// Swift: the window in packets (min of the fabric and endpoint
	// windows) and the last fabric target delay.
	Cwnd   float64
	Target time.Duration
	// TIMELY: the last normalised RTT gradient.
	Gradient float64
	// DCQCN's reaction point: target rate and α; its counts and the
	// notification point's.
	TargetRate Rate
	Alpha      float64
	Cuts       uint64 // rate cuts
	// Notification point (every algorithm's QP answers CE marks only
	// under DCQCN): CE-marked packets received, CNPs asked for; reaction
	// point: CNPs acted on, CNPs coalesced into a pending cut.
	ECNMarked, CNPSent     uint64
	CNPHandled, CNPIgnored uint64
}

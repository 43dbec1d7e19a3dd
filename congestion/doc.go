// Package congestion defines how softrnic's senders are rate-controlled: a
// small, pure interface that a congestion-control algorithm implements per
// flow (per QP), and the per-QP pacer that turns its rate into departure
// times.
//
// The interface follows quic-go's SendAlgorithm in spirit: the caller hands
// in events with an explicit now (clock.Time, integer nanoseconds) and reads
// back the current rate and the next deadline at which it must call OnTimer.
// Nothing here starts a goroutine or reads a clock, so the engine (live
// traffic) and the simulator (virtual time) drive the very same code.
//
// DCQCN (package congestion/dcqcn) is the first implementation. The event set
// is already wide enough for the usual second algorithms: a DCTCP-style
// window controller uses OnAck's ECN echo and Window, TIMELY uses OnAck's RTT
// sample, and both ignore OnCNP.
package congestion

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
// Four algorithms implement it: DCQCN (congestion/dcqcn), fed by CNPs;
// HPCC (congestion/hpcc), fed by the in-band telemetry its ACKs echo; TIMELY
// (congestion/timely) and Swift (congestion/swift), fed by the RTT samples
// ACKs give. The ACK-clocked ones also bound the bytes in flight (Window).
//
// What a connected transport calls, per QP:
//   - OnPacketSent for every data packet put on the wire (first transmission
//     or retransmission), with its wire bytes;
//   - OnAck for every ACK that acknowledges new data, with the wire bytes it
//     newly acknowledges, the RTT of the packet it acknowledges, and
//     whatever else the ACK carries (ECN echo, INT records, host delay,
//     hops);
//   - OnCNP for every RoCEv2 CNP addressed to the QP;
//   - OnRetransmit (LossReactor, when implemented) on a retransmission
//     timeout or a NAK-triggered retransmission;
//   - OnTimer at Deadline.
//
// It sends a packet only when the pacer allows it at Rate and, for a window
// algorithm, when the bytes in flight (sent minus acknowledged) are below
// Window: a packet may overshoot the window, as in HPCC's ns-3 and TCP.
package congestion

// Package ud implements the Unreliable Datagram transport as a pure state
// machine: SEND and SEND_WITH_IMM of at most one path MTU, carried in a
// single UD_SEND_ONLY packet with a DETH, Q_Key checked on receipt, and the
// 40-byte GRH slot at the start of every receive buffer.
//
// Like transport/rc it sees only IB transport packets (BTH to the end of
// the pad), and names the payload it sends rather than copying it; the
// device frames them, checks addresses, P_Key and ICRC, and hands Receive
// the GRH to place. A QP implements transport.Transport and
// transport.Addressed (the device frames each datagram for its WQE's
// address handle). No goroutines, clock reads, locks or per-packet
// allocations.
package ud

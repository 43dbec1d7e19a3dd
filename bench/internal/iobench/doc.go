// Package iobench measures softrnic's raw packet I/O between two network
// namespaces joined by a veth pair: transmit-only and receive-only rates and
// the ping-pong round-trip time through the AF_XDP port and the AF_PACKET
// port. It is the measuring code of the bench/io program, kept importable so
// that other benches (bench/rnic) put the same raw figures beside theirs
// from the same run rather than copying it. It needs root.
//
// Rates count whole Ethernet frames (no preamble, FCS or gap): Gbit/s is
// frames/s × frame bytes × 8. On a small machine the sender, the receiver
// and the kernel's softirq share the cores, so figures are a floor.
package iobench

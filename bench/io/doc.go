// Command io is softrnic's raw packet I/O bench: the baseline the engine's
// figures are compared against. It builds two network namespaces joined
// by a veth pair and measures, through the AF_XDP port and through the
// AF_PACKET port, transmit-only and receive-only rates and the ping-pong
// round-trip time for 64-byte, 1 KiB and 4 KiB frames. It prints a table and
// writes JSON. It needs root (namespaces, XDP).
//
// tx-only sends into bpf.Sink on the peer (an XDP program that drops every
// frame and counts the RoCE ones): over veth the sender's sendto runs the
// peer's receive path, so the peer's cost is part of the transmit figure,
// and the sink is the cheapest peer (-tx-port: the old peer, a port that
// does not read). The sink's count is reported as Delivered. tx-threaded is
// the same with the peer veth's NAPI threaded (netnstest SetThreadedNAPI),
// its thread on one CPU and the sender on the other: the peer's receive
// then runs as it would on another host, and the row measures what the port
// transmits (README's bench notes have what that changed).
//
// Two receive rows: rx-only is fed by the other port sending flat out, so on
// veth in copy mode it is bounded by the sender (whose sendto also runs the
// receiver's NAPI poll); rx-gen (AF_XDP only) is fed by a kernel-side
// generator (bpf.Generator: XDP live frames redirected out of the peer veth
// end), which costs far less per frame, so it measures the receive path.
//
//	go run ./bench/io -json out/bench-io.json
//
// Rates count whole Ethernet frames (no preamble, FCS or gap): Gbit/s is
// frames/s × frame bytes × 8. On a small machine the sender, the receiver
// and the kernel's softirq share the cores, so figures are a floor.
package main

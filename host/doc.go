// Package host assembles an RNIC on a network interface of this machine,
// the one way every tool and the daemon do it: the interface looked up
// (its MAC, MTU and addresses as the GID table; errors name the interface
// as given), the port (AF_XDP on every receive queue, or AF_PACKET, or
// AF_XDP falling back to AF_PACKET), the rnic device with its congestion
// control, the engine loop driving it in a goroutine of its own (with a
// capture tap if asked), neighbour resolution through the kernel's tables
// (package internal/route), and an rdma_cm agent on the device. Open makes one,
// Close takes it down in order.
//
// Congestion builds the device's congestion control (DCQCN, Swift or
// TIMELY, a profile, a time dilation, knobs) from a CC, as the tools'
// --cc (ParseCC) and the daemon's cc keys give it.
package host

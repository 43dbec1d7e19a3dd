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
// Congestion builds the device's DCQCN setting from a profile name, as
// `softrnic perf --dcqcn` and the daemon's dcqcn.profile give it.
package host

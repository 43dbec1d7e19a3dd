// Package testbed builds the live DCQCN testbed on one Linux host
// and runs experiments on it:
//
//	h1 ─┐
//	    sw (IPv4 forwarding; tbf bottleneck + ECN marker on sw→r egress) ── r
//	h2 ─┘
//
// Four network namespaces with unique names, veth pairs with GRO/GSO/TSO off
// (frames stay the size they were sent at, as on a real wire), static
// neighbour entries (no ARP in the measurement), a tbf qdisc on sw's
// interface toward r with a burst of a few MTUs so that it behaves as a
// constant-rate FIFO server, and the tc-bpf marker of package ecnmark at the
// same interface's clsact egress. Everything lives in the namespaces, so
// Close (or the process dying before it, see netnstest's sweep) removes it.
//
// The flows are behind the Endpoints interface (flow.go); a passive monitor
// on sw→r (monitor.go) measures what every flow gets through the bottleneck
// and the CNPs coming back, whoever the endpoints are.
package testbed

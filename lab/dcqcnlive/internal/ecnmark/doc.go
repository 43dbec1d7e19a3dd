// Package ecnmark is the congestion point of the live DCQCN testbed: a tc
// (clsact egress, direct-action) BPF program that keeps a virtual queue
// mirroring a tbf bottleneck and marks ECN-capable packets CE with the RED
// ramp DCQCN switches use (Kmin, Kmax, Pmax).
//
// This host's kernel has no sch_red and no netem, and clsact egress runs
// before the root qdisc, so the program cannot see tbf's backlog: it models
// it instead, as a constant-rate server draining at the tbf rate. See
// ecn_vq.c for the program; Model is the same algorithm in Go, used by the
// tests as an oracle and by the runner to explain a trace.
package ecnmark

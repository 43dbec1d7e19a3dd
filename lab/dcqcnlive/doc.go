// Command dcqcnlive runs the live DCQCN experiment on this host:
// two flows, h1→r and h2→r, through a forwarding namespace sw whose sw→r
// egress is a tbf bottleneck with a tc-bpf ECN marker (a RED ramp on a
// virtual queue mirroring tbf), with rates and timers dilated by S so that
// two cores suffice. It needs root (namespaces, veth, tc, BPF).
//
//	go run ./lab/dcqcnlive [-profile paper|connectx] [-scale S] [-duration D]
//	                       [-join J] [-endpoints softrnic|raw] [-softrnic BIN]
//	                       [-out DIR] [-trace]
//
// It prints and writes (to DIR) per-flow rates at the bottleneck's output
// over the last 20 % of the run, Jain's index, utilisation, CNP counts, tbf
// drops, the marker's counters and the queue trace (tbf backlog and the
// marker's estimate every 5 ms; with -trace also every packet's backlog and
// verdict).
//
// The default endpoints are softrnic's: `softrnic perf write_bw` with
// DCQCN, one server in r serving both flows (--clients 2) and a client in
// each of h1 and h2 (testbed.SoftrnicServer and SoftrnicClient;
// -server-cmd/-client-cmd adapt the command lines). -endpoints raw runs
// ECT(0) senders at a fixed rate instead, which are not
// congestion-controlled (the summary says so): they exercise the
// bottleneck and the marker alone.
package main

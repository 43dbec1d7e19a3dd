// Command rnic is the "data path" bench table of softrnic: softrnic against
// softrnic over a veth pair between two network namespaces, beside the raw
// AF_XDP frame rate and the kernel's UDP ping-pong (sockperf) over the same
// veth, from one run, with the ratios the engine's goals are stated in:
//
//	WRITE 64 KiB goodput ÷ raw AF_XDP rx rate at 4 KiB in bytes/s   goal ≥ 0.8
//	softrnic SEND 64 B half-RTT p50 ÷ sockperf 64 B half-RTT p50     goal ≤ 1
//
// It prints one table and writes JSON with every figure, the load average
// at start and end and the AF_XDP mode obtained. It needs root
// (namespaces, XDP) and Debian's sockperf.
//
//	go run ./bench/rnic -json out/bench-rnic.json
//
// Each softrnic end (server in one namespace, client in the other) runs
// the perf runner's RunCLI (internal/perftest/runner), the code of
// `softrnic perf`. All four figures are taken with both ends in this
// process, as runner's BenchmarkPerfVeth does and as the raw AF_XDP
// rates are (-cpuprofile profiles them); then, by default, send_lat again
// with each end in a child process of its own (this program under `ip
// netns exec`), as on two hosts and as sockperf's
// two ends run (-procs all does all four that way; -profdir collects the
// children's profiles). Both latency ratios are shown: in one process each
// perftest loop is pinned to the thread that entered its namespace, and
// every completion then wakes a locked thread, which lengthens the half
// round trip (README's bench notes). Then, by default (-daemon), all four
// again with the client's QPs in a daemon, a third child process serving
// B's interface, and the daemon's goals held against the rows with one
// process per end:
//
//	WRITE 64 KiB goodput through the daemon ÷ with 2 processes   ≥ 0.9
//	SEND 64 B message rate through the daemon ÷ 2 processes      ≥ 0.7
//	SEND 64 B half-RTT p50 (p99) through the daemon ÷ 2 procs    ≤ 1.5 (3)
//
// On a 2-core machine sender, receiver and softirq share the cores: the
// figures are a floor.
package main

// Command loss measures softrnic on a lossy path and with many QPs, black
// box: it drives the softrnic binary (`softrnic perf` server and client,
// `softrnic daemon`, `softrnic stats`) and the kernel (ip, nft, ethtool),
// each end a process in its own network namespace on an AF_XDP port. It
// prints three tables and writes JSON:
//
//  1. Goodput under loss: `perf write_bw -s 65536 --verify` from A to B
//     through a bridge namespace that drops RoCEv2 frames at random in both
//     directions (netnstest.LossyPath), at each loss rate and local ACK
//     timeout (-u), as a ratio to the same run without loss, for each
//     retransmission mode the binary supports (-modes; a mode whose flags
//     `perf --help` does not list is shown as n/a).
//  2. Aggregate goodput by QP count (`write_bw -s 65536 -q N`) over a plain
//     veth pair at each MTU, runs that end in an error completion or time
//     out marked as such, with the receiver's drops: the frames its veth
//     redirected (ethtool -S) and what its AF_XDP socket dropped for want
//     of FILL ring entries, read from outside the perf process (a duplicate
//     of its socket taken with pidfd_getfd, XDP_STATISTICS).
//  3. The same run at -daemon-qps with B's side in `softrnic daemon`, with
//     its `softrnic stats` counters over the run.
//
// Then its goals, met or not. Rows are measured in
// interleaved rounds and show their median round; the load average at start
// and end is printed. It needs root (namespaces, XDP) and nft(8).
//
//	go run ./bench/loss -softrnic bin/softrnic -json out/bench-loss.json
package main

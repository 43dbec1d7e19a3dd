// Command stock measures stock RDMA programs on softrnic against softrnic's
// own in-process tool, on the same veth in the same run: Debian's
// ib_send_lat -s 64, ib_send_bw -s 64 and ib_write_bw -s 65536, unchanged,
// through `softrnic run` on a daemon at each end of a veth pair between two
// namespaces, beside `softrnic perf` (the same test) in process at each end
// on the same veth. Rounds are interleaved (in process, then through the
// daemons: the stock program, then softrnic perf through the same daemons,
// which separates the daemon's share from the library's and the copies'),
// each row shows its median round and the ratio stock / in process, with
// the goals: latency p50 at most 1.5 times, WRITE bandwidth at least 0.9
// times. The load average at start and end is printed. Root.
//
//	go run ./bench/stock -softrnic bin/softrnic -clib c/build/lib -json out/bench-stock.json
package main

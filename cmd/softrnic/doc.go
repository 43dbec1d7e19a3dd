// Command softrnic is the software RoCEv2 RNIC's one binary: its daemon, its
// tools (pcap, perf, rping, sim, stats, capture) and its lab helpers.
//
// Each subcommand lives in its own file of this package and registers itself
// from an init function, so adding one never touches this file.
package main

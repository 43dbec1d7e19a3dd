// Package runner runs perftest's eight test programs on softrnic: it is the
// device side (perftest.Local) of `softrnic perf`. It is an ordinary verbs
// application — a PD, an MR over its buffer at a random IOVA, a CQ and an
// RC, UC or UD QP per perftest QP, moved to INIT, RTR and RTS with the key
// records the peer announced over the side channel — on a rnic.Device
// that engine.Run drives on the interface's port. It runs perftest's loops
// (bandwidth with a TX depth and CQ moderation, ping-pong latency) with an
// optional check of every byte received (--verify). It speaks to the RNIC
// through package verbs only, so the same test runs on a device in this
// process or, with --daemon, on a softrnic daemon's device (its QPs in the
// daemon), and connects with -R through rdmacm.CM either way.
package runner

// Package perftest speaks the TCP side channel of linux-rdma/perftest
// (ib_write_bw, ib_read_bw, ib_send_bw, ib_atomic_bw and their _lat
// siblings) byte for byte, so that a stock perftest on a ConnectX or rxe host
// can be the other end of `softrnic perf`, and reports results in perftest's
// own table format.
//
// The package is pure protocol and arithmetic: it moves bytes over an
// io.ReadWriter and calls back into the caller (the Local interface) for
// everything that touches a device. That keeps it testable against the TCP
// streams of real captures.
package perftest

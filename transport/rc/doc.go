// Package rc implements the connected transports, RC and UC, as pure state
// machines: the requester (segmentation, PSNs, AckReq, the window and the
// READ/ATOMIC credit), the completer (coalesced ACKs, NAKs, go-back-N, RNR
// and local ACK timeouts, retry counting) and the responder (PSN checks,
// opcode sequence, access/rkey/bounds checks, duplicates with a bounded
// READ/ATOMIC resource table, RNR NAK, MSN), following the InfiniBand
// specification and, where it leaves room, the Linux kernel's rxe.
//
// A QP here deals only with IB transport packets: the bytes from the BTH to
// the end of the payload and pad, without the ICRC. The device wraps them
// in Ethernet/IP/UDP, checks addresses, P_Key and the ICRC before calling
// Receive, and computes the ICRC after Build. A QP implements
// transport.Transport.
//
// A QP owns its congestion control (cc.go), as quic-go's sent-packet
// handler owns its SendAlgorithm: the DCQCN notification point over what it
// receives, the CNPs it owes, the reaction point its CNPs drive and the
// pacer that holds it to that rate. The device only configures it.
//
// Nothing in this package starts goroutines, reads a clock, takes a lock or
// allocates per packet: packets and now go in (Receive, Expire, Post);
// packets (Build), completions (Completions) and the next deadline
// (Deadline) come out. The caller serialises all calls on one QP.
package rc

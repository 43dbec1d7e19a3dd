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
// in Ethernet/IP/UDP and checks addresses, P_Key and the ICRC before
// calling Receive; sending, a QP writes a packet's headers (BuildHeader)
// and names its payload in the memory it comes from, which the device
// gathers behind them while it computes the ICRC. A QP implements
// transport.Transport.
//
// A QP owns its congestion control (cc.go), as quic-go's sent-packet
// handler owns its SendAlgorithm: the DCQCN notification point over what it
// receives, the CNPs it owes, the reaction point its CNPs drive and the
// pacer that holds it to that rate. The device only configures it.
//
// Nothing in this package starts goroutines, reads a clock, takes a lock or
// allocates per packet: packets and now go in (Receive, Expire, Post);
// packets (BuildHeader), completions (Completions) and the next deadline
// (Deadline) come out. The caller serialises all calls on one QP. (The
// only lock is the device-wide ReorderPool's, taken when a packet arrives
// out of order under selective repeat.)
//
// # Loss recovery
//
// rxe's requester goes back N on a sequence NAK and otherwise waits a whole
// local ACK timeout (ib.RecoveryTimeout). By default a QP, toward any peer,
// also retransmits on the RTT it measures (retransmit.go): a tail-loss
// probe, an RTO of a few RTTs that resends one packet as a probe too, and
// fast retransmission from a probe's answer, none of which spends
// retry_cnt; the local ACK timer alone decides when to give up, at the same
// moment as before. Toward a go-back-N peer these are only retransmissions
// of packets it handles as duplicates or as the one it expects, and a peer
// that only paused costs one packet per expiry: a late ACK does not send
// back N at once, and a READ reply in progress is asked for one response
// at a time, never the whole rest again.
//
// Between two softrnic QPs it adds selective repeat (IRN's, SIGCOMM 2018):
// the responder holds out-of-order requests in the device's ReorderPool and
// executes each, with every check, once the packets before it have come, so
// data placement and completions stay in PSN order; its ACKs carry a
// SACKETH (bth/sack.go) with the receive window its device grants
// (transport.Meta.RecvWindow), and it acknowledges every quarter of that
// window; the requester resends only what RACK (RFC 8985) declares lost,
// asks again only for the missing ranges of a READ reply (held likewise),
// and keeps outstanding the smaller of about two bandwidth-delay products
// (bdp.go, at least 128 PSNs) and the receive window. Its RTO and local
// ACK timeouts resend the oldest unacknowledged packet rather than going
// back N. The pool buffer of a held packet goes back only at
// TakeCompletions, once the device's copies into memory are done.
//
// # Agreeing on selective repeat
//
// Agreement is in band, so it works however the QPs were connected
// (perftest's side channel, rdma_cm, an application's own exchange of QPN
// and PSN). A requester marks its requests with the SR bit (BTH Resv7 bit
// 6, covered by the ICRC) only toward a QP number in softrnic's range
// (SoftQPN) and only if it has a reorder pool; a responder that may use
// selective repeat itself switches to it on the first marked request and
// then marks every response; the requester switches on the first marked
// response. A peer that does not agree never sees anything but IBA packets
// from its side of the exchange and keeps both directions on go-back-N.
//
// Why a reserved bit and not a probe with a manufacturer-specific opcode
// (0xC0-0xFF): rxe before January 2021 tested an RC QP's opcodes with
// opcode & IB_OPCODE_RC, which is opcode & 0, so it accepted any opcode
// and handed one without a request mask to its completer, whose check_ack
// ends on "unexpected opcode" in COMPST_ERROR: the WQE fails and the QP goes
// to ERR (fixed by Bob Pearson's check_type_state patch,
// lore 20210127214500.3707-1-rpearson@hpe.com; Ubuntu 20.04's 5.4 and RHEL
// 8's 4.18 kernels predate it). Today's rxe drops it silently, and
// ConnectX's handling is undocumented. rxe's header check (rxe_recv.c
// hdr_check: TVer, DestQP, the opcode's transport bits, QP state,
// addresses, P_Key, Q_Key) never reads Resv7, and its ICRC masks only BTH
// byte 4 (FECN/BECN/Resv6, which a switch may rewrite, so no flag can live
// there). ConnectX negotiates its own selective repeat out of band
// (rdma-core's ECE, ibv_set_ece, carried in the CM REQ/REP), so no in-band
// use of Resv7 by it is known. The QP-number gate keeps the bit away from
// rxe altogether (its QP numbers are below 0x100000), and from a ConnectX
// unless its QP number happens to fall in softrnic's range.
package rc

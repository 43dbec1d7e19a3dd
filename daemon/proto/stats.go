package proto

import "github.com/softrnic/softrnic/ib"

// CounterDef names one counter the way Linux RDMA tools name it (rdma
// statistic, /sys/class/infiniband/*/ports/1/hw_counters), or, where no
// Linux driver counts the same event, with a name of ours in the same style.
type CounterDef struct {
	Name string
	Help string // one line, for softrnic stats --help and Prometheus HELP
}

// Device counters: the index of each in StatsResp.Device. The order is the
// contract between daemon and clients; new counters go at the end.
const (
	CtrRxPackets               = iota // frames handed to the device
	CtrTxPackets                      // frames the device built
	CtrRxBytes                        // bytes of the frames received (Ethernet header to ICRC)
	CtrTxBytes                        // bytes of the frames the port took
	CtrDuplicateRequest               // RC responder: duplicate requests (sum over QPs)
	CtrOutOfSequence                  // RC: requests beyond the expected PSN, READ response gaps
	CtrRnrNakRetryErr                 // RC requester: RNR NAKs received
	CtrLocalAckTimeoutErr             // RC requester: local ACK timer expiries
	CtrOutOfBuffer                    // RC RNR NAKs sent + UD packets dropped, no receive WQE
	CtrRxICRCEncapsulated             // frames dropped for a bad ICRC
	CtrNpECNMarkedRoCEPackets         // CE-marked packets on DCQCN QPs
	CtrNpCNPSent                      // CNPs sent
	CtrRpCNPHandled                   // CNPs acted upon
	CtrRpCNPIgnored                   // CNPs not acted upon
	CtrRxMalformed                    // not RoCEv2 or malformed
	CtrRxNotLocal                     // destination address not ours
	CtrRxBadHeader                    // TVer or P_Key
	CtrRxUnknownQP                    // destination QP does not exist
	CtrRxBadOpcode                    // opcode of another transport than the QP's
	CtrRxBadSource                    // RC/UC frame not from the connected peer
	CtrRxBadQPState                   // QP not in a state that receives
	CtrRxQPDropped                    // dropped by a QP's transport (sum over QPs)
	CtrRxBadQKey                      // UD: wrong Q_Key (sum over QPs)
	CtrNakSent                        // RC responder: NAKs sent (sum over QPs)
	CtrRetransmits                    // RC requester: go-back-N restarts (sum over QPs)
	CtrTxBackpressure                 // port sends that took fewer frames than offered
	CtrXDPSteered                     // XDP program: redirected to an AF_XDP socket
	CtrXDPPassed                      // XDP program: not RoCEv2, left to the kernel
	CtrXDPMalformed                   // XDP program: truncated or invalid IP/UDP header
	CtrXDPUnbound                     // XDP program: RoCEv2 on a queue without socket
	CtrXDPForeign                     // XDP program: RoCEv2 to a non-local address
	CtrXskRxDropped                   // AF_XDP: dropped by the kernel for other reasons
	CtrXskRxInvalidDescs              // AF_XDP: invalid RX descriptors
	CtrXskTxInvalidDescs              // AF_XDP: invalid TX descriptors
	CtrXskRxRingFull                  // AF_XDP: dropped because the RX ring was full
	CtrXskRxFillRingEmpty             // AF_XDP: the kernel found no frame on FILL
	CtrXskTxRingEmptyDescs            // AF_XDP: TX ring found empty
	CtrXskRxOversize                  // AF_XDP: multi-buffer frames over the frame size
	CtrPacketSeqErr                   // RC requester: PSN sequence error NAKs received
	CtrImpliedNakSeqErr               // RC requester: READ response gaps that restarted a READ
	CtrRxWriteRequests                // RC/UC responder: WRITE messages received
	CtrRxReadRequests                 // RC responder: READ requests received
	CtrRxAtomicRequests               // RC responder: atomic requests received
	CtrReqCQEError                    // send-queue completions in error, flushes apart
	CtrReqCQEFlushError               // send-queue completions flushed
	CtrRespCQEError                   // receive-queue completions in error, flushes apart
	CtrRespCQEFlushError              // receive-queue completions flushed
	CtrReqRemoteAccessErrors          // RC requester: remote access error NAKs received
	CtrReqRemoteInvalidRequest        // RC requester: invalid request NAKs received
	CtrRespRemoteAccessErrors         // RC/UC responder: requests refused for rkey, range or access
	CtrRespLocalLengthError           // RC/UC responder: SENDs longer than the receive WQE
	CtrCCRTTSamples                   // congestion control: RTT samples handed to a controller
	CtrCCDecreases                    // congestion control: rate or window decreases
	CtrCCLossEvents                   // congestion control: retransmission events reported as loss
	CtrCCWindowFull                   // congestion control: sends the window held back
	CtrRoCEAdpRetrans                 // RC requester: adaptive retransmission events (probes, fast retransmissions, RTOs)
	CtrRoCEAdpRetransTO               // RC requester: adaptive retransmission timeouts
	CtrRxSACKs                        // RC requester: selective acknowledgements received
	CtrTxSACKs                        // RC responder: selective acknowledgements sent
	CtrSelRetrans                     // RC requester: packets resent selectively (holes, READ ranges)
	CtrSRHeld                         // RC: packets held out of order for selective repeat
	CtrSRDropped                      // RC: out-of-order packets not held (reorder pool empty)
	CtrRetransPackets                 // RC requester: request packets sent more than once
	CtrAsyncEventsLost                // asynchronous events dropped, a bounded queue full
	NumDeviceCounters
)

// DeviceCounters are the device counters' names, by index.
var DeviceCounters = [NumDeviceCounters]CounterDef{
	CtrRxPackets:               {"rx_packets", "frames the port delivered to the device (rx_malformed: those not RoCEv2)"},
	CtrTxPackets:               {"tx_packets", "RoCEv2 frames sent by the device"},
	CtrRxBytes:                 {"rx_bytes", "bytes of the frames received, Ethernet header to ICRC"},
	CtrTxBytes:                 {"tx_bytes", "bytes of the frames sent, Ethernet header to ICRC"},
	CtrDuplicateRequest:        {"duplicate_request", "RC duplicate requests received"},
	CtrOutOfSequence:           {"out_of_sequence", "RC packets received beyond the expected PSN"},
	CtrRnrNakRetryErr:          {"rnr_nak_retry_err", "RC RNR NAKs received"},
	CtrLocalAckTimeoutErr:      {"local_ack_timeout_err", "RC local ACK timer expiries"},
	CtrOutOfBuffer:             {"out_of_buffer", "packets that found no receive WQE (RC RNR NAK sent, UD dropped)"},
	CtrRxICRCEncapsulated:      {"rx_icrc_encapsulated", "RoCEv2 frames dropped for a bad ICRC"},
	CtrNpECNMarkedRoCEPackets:  {"np_ecn_marked_roce_packets", "CE-marked packets received on DCQCN QPs"},
	CtrNpCNPSent:               {"np_cnp_sent", "CNPs sent"},
	CtrRpCNPHandled:            {"rp_cnp_handled", "CNPs a reaction point acted upon"},
	CtrRpCNPIgnored:            {"rp_cnp_ignored", "CNPs received and not acted upon"},
	CtrRxMalformed:             {"rx_malformed", "frames dropped: not RoCEv2 or malformed"},
	CtrRxNotLocal:              {"rx_not_local", "frames dropped: destination address not ours"},
	CtrRxBadHeader:             {"rx_bad_header", "frames dropped: bad TVer or P_Key"},
	CtrRxUnknownQP:             {"rx_unknown_qp", "frames dropped: no such destination QP"},
	CtrRxBadOpcode:             {"rx_bad_opcode", "frames dropped: opcode of another transport than the QP's"},
	CtrRxBadSource:             {"rx_bad_source", "frames dropped: RC/UC frame not from the connected peer"},
	CtrRxBadQPState:            {"rx_bad_qp_state", "frames dropped: QP not in a receiving state"},
	CtrRxQPDropped:             {"rx_qp_dropped", "packets dropped by a QP's transport (unexpected, out of state)"},
	CtrRxBadQKey:               {"rx_bad_qkey", "UD packets dropped for a wrong Q_Key"},
	CtrNakSent:                 {"nak_sent", "RC NAKs sent"},
	CtrRetransmits:             {"retransmits", "RC go-back-N restarts (NAK, timeout, RNR, lost response)"},
	CtrTxBackpressure:          {"tx_backpressure", "port sends that took fewer frames than offered"},
	CtrXDPSteered:              {"xdp_steered", "XDP program: frames redirected to an AF_XDP socket"},
	CtrXDPPassed:               {"xdp_passed", "XDP program: frames not RoCEv2, left to the kernel"},
	CtrXDPMalformed:            {"xdp_malformed", "XDP program: truncated or invalid IP/UDP headers, passed"},
	CtrXDPUnbound:              {"xdp_unbound", "XDP program: RoCEv2 on a queue with no socket, passed"},
	CtrXDPForeign:              {"xdp_foreign", "XDP program: RoCEv2 to a non-local address, passed"},
	CtrXskRxDropped:            {"xsk_rx_dropped", "AF_XDP: frames the kernel dropped for other reasons"},
	CtrXskRxInvalidDescs:       {"xsk_rx_invalid_descs", "AF_XDP: invalid RX descriptors"},
	CtrXskTxInvalidDescs:       {"xsk_tx_invalid_descs", "AF_XDP: invalid TX descriptors"},
	CtrXskRxRingFull:           {"xsk_rx_ring_full", "AF_XDP: frames dropped because the RX ring was full"},
	CtrXskRxFillRingEmpty:      {"xsk_rx_fill_ring_empty_descs", "AF_XDP: times the kernel found the FILL ring empty"},
	CtrXskTxRingEmptyDescs:     {"xsk_tx_ring_empty_descs", "AF_XDP: times the kernel found the TX ring empty"},
	CtrXskRxOversize:           {"xsk_rx_oversize", "AF_XDP: multi-buffer frames dropped, over the frame size"},
	CtrPacketSeqErr:            {"packet_seq_err", "RC PSN sequence error NAKs received"},
	CtrImpliedNakSeqErr:        {"implied_nak_seq_err", "RC READ response gaps that made the requester ask again (implied NAK)"},
	CtrRxWriteRequests:         {"rx_write_requests", "RDMA WRITE messages received (duplicates not included)"},
	CtrRxReadRequests:          {"rx_read_requests", "RDMA READ requests received (duplicates not included)"},
	CtrRxAtomicRequests:        {"rx_atomic_requests", "atomic requests received (duplicates not included)"},
	CtrReqCQEError:             {"req_cqe_error", "send queue completions with an error other than flush"},
	CtrReqCQEFlushError:        {"req_cqe_flush_error", "send queue completions flushed"},
	CtrRespCQEError:            {"resp_cqe_error", "receive queue completions with an error other than flush"},
	CtrRespCQEFlushError:       {"resp_cqe_flush_error", "receive queue completions flushed"},
	CtrReqRemoteAccessErrors:   {"req_remote_access_errors", "RC remote access error NAKs received"},
	CtrReqRemoteInvalidRequest: {"req_remote_invalid_request", "RC invalid request NAKs received"},
	CtrRespRemoteAccessErrors:  {"resp_remote_access_errors", "requests refused: rkey, range or access rights"},
	CtrRespLocalLengthError:    {"resp_local_length_error", "SENDs longer than the receive WQE"},
	CtrCCRTTSamples:            {"cc_rtt_samples", "RTT samples (Karn's rule) handed to a QP's congestion controller"},
	CtrCCDecreases:             {"cc_decreases", "events after which a QP's congestion-control rate or window was lower"},
	CtrCCLossEvents:            {"cc_loss_events", "retransmission events reported to a QP's congestion controller as loss"},
	CtrCCWindowFull:            {"cc_window_full", "times a QP's congestion window held a send back"},
	CtrRoCEAdpRetrans:          {"roce_adp_retrans", "RC adaptive retransmissions: tail-loss probes, fast retransmissions, RTO expiries"},
	CtrRoCEAdpRetransTO:        {"roce_adp_retrans_to", "RC adaptive retransmission timeouts (RTO expiries)"},
	CtrRxSACKs:                 {"rx_sacks", "RC selective acknowledgements received (selective repeat)"},
	CtrTxSACKs:                 {"tx_sacks", "RC selective acknowledgements sent (selective repeat)"},
	CtrSelRetrans:              {"sel_retrans", "RC packets retransmitted selectively: holes and READ ranges asked again"},
	CtrSRHeld:                  {"sr_held", "RC packets held out of order in the reorder pool (selective repeat)"},
	CtrSRDropped:               {"sr_dropped", "RC out-of-order packets dropped: the reorder pool was empty"},
	CtrRetransPackets:          {"retrans_packets", "RC request packets sent more than once (at most what peers count as duplicate_request)"},
	CtrAsyncEventsLost:         {"async_events_lost", "asynchronous events dropped because a consumer's bounded queue was full"},
}

// rdma_cm counters: the index of each in StatsResp.CM. The daemon's CM
// (its GSI QP, the connections it sets up for its clients) is counted
// apart from the device, as Linux counts its CM apart
// (/sys/class/infiniband_cm/DEV/PORT: cm_rx_msgs, cm_tx_msgs,
// cm_tx_retries, cm_rx_duplicates, whose names these follow), and every
// one is counted whenever the daemon runs a CM. New counters go at the
// end.
const (
	CMRxMsgs        = iota // MADs received on QP1
	CMTxMsgs               // CM MADs sent
	CMTxRetries            // REQ, REP, DREQ, SIDR_REQ sent again on timeout
	CMRxDuplicates         // duplicate REQ, REP, DREQ, SIDR_REQ answered or dropped
	CMRxMalformed          // MADs dropped: wrong length, not a CM MAD, truncated
	CMRxUnsupported        // MADs of attributes the CM does not serve (LAP, APR, ClassPortInfo, unknown)
	CMRxUnmatched          // MADs for no connection, another peer's, or the wrong state
	CMReqDropped           // new REQs and SIDR_REQs dropped at the half-open caps (a flood)
	CMRejNoListener        // requests refused: nobody listens on the port (REJ 8, SIDR unsupported)
	CMBacklogFull          // requests refused: the listener's backlog (or its client) was full
	CMTimeouts             // exchanges given up: REQ, REP, DREQ or SIDR_REQ unanswered, a request never answered
	CMTornDown             // connections and requests of clients that went away, refused or disconnected
	CMUnresolved           // peers whose MAC did not resolve
	CMEventsLost           // events dropped because a client did not read its event channel
	NumCMCounters
)

// CMCounters are the rdma_cm counters' names, by index.
var CMCounters = [NumCMCounters]CounterDef{
	CMRxMsgs:        {"cm_rx_msgs", "MADs received on the GSI QP (QP1)"},
	CMTxMsgs:        {"cm_tx_msgs", "CM MADs sent"},
	CMTxRetries:     {"cm_tx_retries", "REQ, REP, DREQ and SIDR_REQ sent again on timeout"},
	CMRxDuplicates:  {"cm_rx_duplicates", "duplicate REQ, REP, DREQ and SIDR_REQ received"},
	CMRxMalformed:   {"cm_rx_malformed", "MADs dropped: wrong length, not a CM MAD, or truncated"},
	CMRxUnsupported: {"cm_rx_unsupported", "MADs of attributes the CM does not serve (LAP, APR, ClassPortInfo, unknown)"},
	CMRxUnmatched:   {"cm_rx_unmatched", "MADs for no connection, from another peer, or in the wrong state"},
	CMReqDropped:    {"cm_req_dropped", "new REQs and SIDR_REQs dropped at the half-open caps"},
	CMRejNoListener: {"cm_rej_no_listener", "requests refused because nobody listens on the port"},
	CMBacklogFull:   {"cm_backlog_full", "requests refused because the listener's backlog was full"},
	CMTimeouts:      {"cm_timeouts", "CM exchanges given up: a REQ, REP, DREQ or SIDR_REQ unanswered"},
	CMTornDown:      {"cm_torn_down", "connections and requests of clients that went away, refused or disconnected"},
	CMUnresolved:    {"cm_unresolved", "peers whose MAC address did not resolve"},
	CMEventsLost:    {"cm_events_lost", "rdma_cm events dropped because a client did not read its event channel"},
}

// Daemon counters: the index of each in StatsResp.Daemon. What the
// daemon's clients did to it, and what became of their asynchronous
// events and completions. New counters go at the end.
const (
	DCtrRejectedConnections   = iota // connections refused: not root, the daemon's user or the control group
	DCtrAcceptErrors                 // accept failures (out of fds or memory)
	DCtrShedConnections              // connections closed: silent before OPEN, or turned away out of fds
	DCtrLimitRefusals                // client requests refused by a limit
	DCtrBadWQEs                      // WRs in client rings that do not decode or fail the device's checks, corrupted indexes
	DCtrCQRingDropped                // completions dropped on a full client CQ ring
	DCtrControlledQKeyRefused        // controlled Q_Keys refused to clients without CAP_NET_RAW
	DCtrCQOverruns                   // CQs that overflowed
	NumDaemonCounters
)

// DaemonCounters are the daemon counters' names, by index.
var DaemonCounters = [NumDaemonCounters]CounterDef{
	DCtrRejectedConnections:   {"rejected_connections", "client connections refused: neither root, the daemon's user nor the control group"},
	DCtrAcceptErrors:          {"accept_errors", "client connections the daemon failed to accept (out of file descriptors or memory)"},
	DCtrShedConnections:       {"shed_connections", "client connections closed to keep serving: silent before OPEN, or turned away out of file descriptors"},
	DCtrLimitRefusals:         {"limit_refusals", "client requests refused by a limit (daemon [limits])"},
	DCtrBadWQEs:               {"bad_wqes", "work requests in client rings that do not decode or fail the device's checks, and corrupted ring indexes"},
	DCtrCQRingDropped:         {"cq_ring_dropped", "completions dropped because a client's CQ ring was full"},
	DCtrControlledQKeyRefused: {"controlled_qkey_refused", "controlled Q_Keys (high bit set) refused to clients without CAP_NET_RAW"},
	DCtrCQOverruns:            {"cq_overruns", "CQs that overflowed (their QPs went to the error state)"},
}

// Per-QP counters: the index of each in QPStats.Values.
const (
	QCtrRxPackets               = iota // UD only: packets delivered
	QCtrDuplicateRequest               // RC
	QCtrOutOfSequence                  // RC
	QCtrRnrNakRetryErr                 // RC
	QCtrLocalAckTimeoutErr             // RC
	QCtrOutOfBuffer                    // RC RNR NAKs sent, UD drops without receive WQE
	QCtrRxQPDropped                    // both
	QCtrRxBadQKey                      // UD
	QCtrNakSent                        // RC
	QCtrRetransmits                    // RC
	QCtrRxGhostResponse                // RC: responses for nothing outstanding
	QCtrPacketSeqErr                   // RC
	QCtrImpliedNakSeqErr               // RC
	QCtrRxWriteRequests                // RC, UC
	QCtrRxReadRequests                 // RC
	QCtrRxAtomicRequests               // RC
	QCtrReqCQEError                    // all types
	QCtrReqCQEFlushError               // all types
	QCtrRespCQEError                   // all types
	QCtrRespCQEFlushError              // all types
	QCtrReqRemoteAccessErrors          // RC
	QCtrReqRemoteInvalidRequest        // RC
	QCtrRespRemoteAccessErrors         // RC, UC
	QCtrRespLocalLengthError           // RC, UC
	QCtrDCQCNECNMarked                 // RC, UC with DCQCN: CE-marked packets received (NP)
	QCtrDCQCNCNPSent                   // RC, UC with DCQCN: CNPs the NP asked for
	QCtrDCQCNCNPHandled                // RC, UC with DCQCN: CNPs the RP acted on
	QCtrDCQCNCNPIgnored                // RC, UC with DCQCN: CNPs coalesced into a pending cut
	QCtrDCQCNRateCuts                  // RC, UC with DCQCN: the RP's rate cuts
	QCtrCCRTTSamples                   // RC, UC with congestion control (every algorithm)
	QCtrCCDecreases                    // RC, UC with congestion control
	QCtrCCLossEvents                   // RC, UC with congestion control
	QCtrCCWindowFull                   // RC, UC with a window algorithm (Swift)
	QCtrCCRateKbps                     // gauge: RC, UC with congestion control
	QCtrCCWindowBytes                  // gauge: RC, UC with a window algorithm
	QCtrCCSRTTNs                       // gauge: RC, UC with congestion control
	QCtrCCCwndMilli                    // gauge: RC, UC with Swift
	QCtrCCTargetNs                     // gauge: RC, UC with Swift
	QCtrRoCEAdpRetrans                 // RC
	QCtrRoCEAdpRetransTO               // RC
	QCtrTLPProbes                      // RC
	QCtrFastRetrans                    // RC
	QCtrRxSACKs                        // RC
	QCtrTxSACKs                        // RC
	QCtrSelRetrans                     // RC
	QCtrSRHeld                         // RC
	QCtrSRDropped                      // RC
	QCtrRetransPackets                 // RC
	QCtrNpHostCCMarks                  // RC, UC with DCQCN: packets the NP answered as CE-marked for host congestion
	QCtrLocalAckTimeoutExcused         // RC
	NumQPCounters
)

// QPGauges are the per-QP values that are figures, not counts: they go up
// and down (Prometheus gauges, without _total).
const QPGauges = uint64(1)<<QCtrCCRateKbps | 1<<QCtrCCWindowBytes | 1<<QCtrCCSRTTNs | 1<<QCtrCCCwndMilli | 1<<QCtrCCTargetNs

// QPCounters are the per-QP counters' names, by index.
var QPCounters = [NumQPCounters]CounterDef{
	QCtrRxPackets:               {"rx_packets", "UD packets delivered to the QP"},
	QCtrDuplicateRequest:        {"duplicate_request", "RC duplicate requests received"},
	QCtrOutOfSequence:           {"out_of_sequence", "RC packets received beyond the expected PSN"},
	QCtrRnrNakRetryErr:          {"rnr_nak_retry_err", "RC RNR NAKs received"},
	QCtrLocalAckTimeoutErr:      {"local_ack_timeout_err", "RC local ACK timer expiries"},
	QCtrOutOfBuffer:             {"out_of_buffer", "packets that found no receive WQE"},
	QCtrRxQPDropped:             {"rx_qp_dropped", "packets dropped by the QP's transport"},
	QCtrRxBadQKey:               {"rx_bad_qkey", "UD packets dropped for a wrong Q_Key"},
	QCtrNakSent:                 {"nak_sent", "RC NAKs sent"},
	QCtrRetransmits:             {"retransmits", "RC go-back-N restarts"},
	QCtrRxGhostResponse:         {"rx_ghost_response", "RC responses for nothing outstanding"},
	QCtrPacketSeqErr:            {"packet_seq_err", "RC PSN sequence error NAKs received"},
	QCtrImpliedNakSeqErr:        {"implied_nak_seq_err", "RC READ response gaps that made the requester ask again"},
	QCtrRxWriteRequests:         {"rx_write_requests", "RDMA WRITE messages received"},
	QCtrRxReadRequests:          {"rx_read_requests", "RDMA READ requests received"},
	QCtrRxAtomicRequests:        {"rx_atomic_requests", "atomic requests received"},
	QCtrReqCQEError:             {"req_cqe_error", "send queue completions with an error other than flush"},
	QCtrReqCQEFlushError:        {"req_cqe_flush_error", "send queue completions flushed"},
	QCtrRespCQEError:            {"resp_cqe_error", "receive queue completions with an error other than flush"},
	QCtrRespCQEFlushError:       {"resp_cqe_flush_error", "receive queue completions flushed"},
	QCtrReqRemoteAccessErrors:   {"req_remote_access_errors", "RC remote access error NAKs received"},
	QCtrReqRemoteInvalidRequest: {"req_remote_invalid_request", "RC invalid request NAKs received"},
	QCtrRespRemoteAccessErrors:  {"resp_remote_access_errors", "requests refused: rkey, range or access rights"},
	QCtrRespLocalLengthError:    {"resp_local_length_error", "SENDs longer than the receive WQE"},
	// A QP's own DCQCN counts, under names of their own so that a tool
	// summing the mlx5 names over a device does not count them twice.
	QCtrDCQCNECNMarked:  {"dcqcn_ecn_marked", "CE-marked packets this QP received (DCQCN NP)"},
	QCtrDCQCNCNPSent:    {"dcqcn_cnp_sent", "CNPs this QP's NP asked for"},
	QCtrDCQCNCNPHandled: {"dcqcn_cnp_handled", "CNPs this QP's RP acted on"},
	QCtrDCQCNCNPIgnored: {"dcqcn_cnp_ignored", "CNPs coalesced into a rate cut already pending"},
	QCtrDCQCNRateCuts:   {"dcqcn_rate_cuts", "rate cuts of this QP's RP"},
	// Every algorithm's, and the QP's congestion-control figures now.
	QCtrCCRTTSamples:           {"cc_rtt_samples", "RTT samples (Karn's rule) handed to this QP's congestion controller"},
	QCtrCCDecreases:            {"cc_decreases", "events after which this QP's rate or window was lower"},
	QCtrCCLossEvents:           {"cc_loss_events", "retransmission events reported to this QP's controller as loss"},
	QCtrCCWindowFull:           {"cc_window_full", "times this QP's congestion window held a send back"},
	QCtrCCRateKbps:             {"cc_rate_kbps", "this QP's congestion-control rate, kb/s"},
	QCtrCCWindowBytes:          {"cc_window_bytes", "this QP's congestion window, bytes"},
	QCtrCCSRTTNs:               {"cc_srtt_ns", "this QP's smoothed RTT, ns"},
	QCtrCCCwndMilli:            {"cc_cwnd_milli", "this QP's Swift window, thousandths of a packet"},
	QCtrCCTargetNs:             {"cc_target_ns", "this QP's Swift fabric target delay, ns"},
	QCtrRoCEAdpRetrans:         DeviceCounters[CtrRoCEAdpRetrans],
	QCtrRoCEAdpRetransTO:       DeviceCounters[CtrRoCEAdpRetransTO],
	QCtrTLPProbes:              {"tlp_probes", "RC tail-loss probes sent"},
	QCtrFastRetrans:            {"fast_retrans", "RC go-back-N restarts a probe's answer called for"},
	QCtrRxSACKs:                DeviceCounters[CtrRxSACKs],
	QCtrTxSACKs:                DeviceCounters[CtrTxSACKs],
	QCtrSelRetrans:             DeviceCounters[CtrSelRetrans],
	QCtrSRHeld:                 DeviceCounters[CtrSRHeld],
	QCtrSRDropped:              DeviceCounters[CtrSRDropped],
	QCtrRetransPackets:         DeviceCounters[CtrRetransPackets],
	QCtrNpHostCCMarks:          {"np_host_cc_marks", "packets DCQCN's notification point answered as CE-marked because the host's receive rings ran low (host congestion), at most one per CNP interval; each asked for a CNP"},
	QCtrLocalAckTimeoutExcused: {"local_ack_timeout_excused", "RC local ACK timer expiries that spent no retry: the peer's device was heard from meanwhile (also in local_ack_timeout_err)"},
}

// NotCounted are counters Linux RDMA drivers report that softrnic does not
// count, with why: softrnic stats lists them instead of printing zeros that
// would mean nothing.
var NotCounted = []CounterDef{
	{"rx_dct_connect", "softrnic has no DC (dynamically connected) transport"},
	{"roce_slow_restart", "ConnectX slow restart is not implemented"},
	{"roce_slow_restart_cnps", "ConnectX slow restart is not implemented"},
	{"roce_slow_restart_trans", "ConnectX slow restart is not implemented"},
	{"retry_exceeded_err", "rxe's name: these completions are counted in req_cqe_error, not apart"},
	{"retry_rnr_exceeded_err", "rxe's name: these completions are counted in req_cqe_error, not apart"},
}

// The device counters valid for this port (StatsResp.Valid): the XDP and
// AF_XDP ones only with an AF_XDP port.
const (
	ValidAll = ^uint64(0) >> (64 - NumDeviceCounters)
	ValidXDP = uint64(1)<<(CtrXskRxOversize+1) - uint64(1)<<CtrXDPSteered
)

// StatsReq is the body of OpStats. The reply lists the QPs whose QPN is at
// least FromQPN, at most MaxStatsQPs of them; a client pages with FromQPN
// set past the last QPN listed while More is set.
type StatsReq struct {
	FromQPN  uint32
	QPN      uint32
	FilterQP uint8 // only QPN
	_        [7]byte
}

// QPStats is one QP's counters. Valid says which of Values the QP's
// transport counts (bit i for Values[i]).
type QPStats struct {
	QPN    uint32
	Type   ib.QPType
	State  ib.QPState
	_      [2]byte
	Valid  uint64
	Values [NumQPCounters]uint64
}

// MaxStatsQPs is how many QPs one StatsResp lists: as many as fit one
// control message (MaxMessage).
const MaxStatsQPs = 7

// StatsResp is the reply to OpStats. Root sees every QP; others only the
// QPs of their own connection. Device counters are the whole device's.
type StatsResp struct {
	Name   [16]byte // interface name, NUL padded
	Valid  uint64   // bit i: Device[i] is counted on this port
	Device [NumDeviceCounters]uint64
	Listed uint32
	More   uint8 // more QPs after the last listed
	_      [3]byte
	QPs    [MaxStatsQPs]QPStats
	// NumQueues is how many receive queues an AF_XDP port serves, one
	// socket each (0 for other ports); the first MaxStatsQueues are
	// detailed in Queues.
	NumQueues uint32
	_         uint32
	Queues    [MaxStatsQueues]QueueStats
	// HasCM says whether the daemon runs an rdma_cm agent, whose counters
	// CM holds.
	HasCM uint8
	_     [7]byte
	CM    [NumCMCounters]uint64
	// Daemon are the daemon's own counters (DaemonCounters).
	Daemon [NumDaemonCounters]uint64
}

// MaxStatsQueues is how many receive queues one StatsResp details.
const MaxStatsQueues = 16

// QueueStats is one receive queue's share of the traffic: how RSS (or the
// peer's transmit queues) spread RoCEv2 over the queues, and which queue's
// ring overflows.
type QueueStats struct {
	RxPackets  uint64 // frames the port took from this queue's socket
	RxRingFull uint64 // frames dropped because this queue's RX ring was full
}

// UC is the unreliable connected QP type (ibv_qp_type numbering), which

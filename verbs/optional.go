package verbs

import (
	"context"

	"github.com/softrnic/softrnic/congestion"
	"github.com/softrnic/softrnic/ib"
)

// Optional abilities: what only some RNICs have, found with a type
// assertion.

// AsyncEventer is a Device that reports asynchronous events
// (ibv_get_async_event): QP errors, COMM_EST, CQ overruns, SRQ limits,
// link changes, and EventDeviceFatal when the device is gone. The channel
// is bounded: the RNIC counts what a reader that falls behind loses.
type AsyncEventer interface {
	Events() <-chan AsyncEvent
}

// CongestionProfiler is a Device that says which congestion control its
// QPs run ("off", "dcqcn", "swift", "timely"), with which profile
// ("connectx", "paper", ...), and its time dilation.
type CongestionProfiler interface {
	CongestionProfile() (algorithm, profile string, scale float64)
}

// CongestionCounter is a Device that counts congestion control events
// under the mlx5 names (np_ecn_marked_roce_packets, np_cnp_sent,
// rp_cnp_handled, rp_cnp_ignored) and every algorithm's (cc_rtt_samples,
// cc_decreases, cc_loss_events, cc_window_full), safe from any goroutine.
type CongestionCounter interface {
	CongestionCounters() CongestionCounters
}

// CongestionCounters are a device's congestion control counters.
type CongestionCounters struct {
	ECNMarked, CNPSent, CNPHandled, CNPIgnored uint64
	congestion.Counters
}

// ProgressCounter is a Device that can report its QPs' transport progress
// (acknowledged or answered packets), which moves even when a CQ-moderated
// run has no completion for a long time.
type ProgressCounter interface {
	// TransportProgress sums the progress of the QPs numbered in qpns.
	TransportProgress(qpns []uint32) uint64
}

// RecoveryCounter is a Device that counts its RC QPs' loss recovery:
// retransmissions of every kind and the selective-repeat exchange.
type RecoveryCounter interface {
	// RecoveryCounters sums the counters of the QPs numbered in qpns.
	RecoveryCounters(qpns []uint32) RecoveryCounters
}

// RecoveryCounters are RC QPs' loss recovery counters, named in the json
// tags as softrnic stats names them (mlx5's names where mlx5 counts the
// same).
type RecoveryCounters struct {
	Timeouts       uint64 `json:"local_ack_timeout_err"`
	Excused        uint64 `json:"local_ack_timeout_excused"` // of Timeouts, those that spent no retry
	Retransmits    uint64 `json:"retransmits"`
	SeqNAKs        uint64 `json:"packet_seq_err"`
	Duplicates     uint64 `json:"duplicate_request"`
	AdpRetrans     uint64 `json:"roce_adp_retrans"`
	AdpRetransTO   uint64 `json:"roce_adp_retrans_to"`
	TLPProbes      uint64 `json:"tlp_probes"`
	FastRetrans    uint64 `json:"fast_retrans"`
	RxSACKs        uint64 `json:"rx_sacks"`
	TxSACKs        uint64 `json:"tx_sacks"`
	SelRetrans     uint64 `json:"sel_retrans"`
	SRHeld         uint64 `json:"sr_held"`
	SRDropped      uint64 `json:"sr_dropped"`
	RetransPackets uint64 `json:"retrans_packets"`
}

// CongestionStater is a QP whose congestion control state can be read.
type CongestionStater interface {
	CongestionState() (congestion.State, bool)
}

// Notifier is a CQ that signals new completions on a channel (a
// coalescing doorbell: one value may stand for many).
type Notifier interface {
	Notify() <-chan struct{}
}

// Poller is a device that an application busy-polling its CQs calls
// when it found them empty: an in-process device runs its engine's step
// in the caller (rnic.Device.Poll), the daemon's client waits for a
// completion with its CPU given up to the daemon meanwhile
// (client.Client.Poll). It reports whether anything moved.
type Poller interface {
	Poll() bool
}

// Locker is a QP under whose lock the RNIC writes its memory, so that an
// application watching memory a peer writes (perftest's write_lat polls a
// byte) sees each packet's bytes whole.
type Locker interface {
	WithLock(fn func())
}

// RecvSyncer is a QP whose posted receives reach the device
// asynchronously (through the daemon's rings). SyncRecv returns once every
// receive posted so far is in the device's RQ: an application about to
// tell its peer "send now" calls it first, since a UC or UD SEND that
// finds no receive is dropped.
type RecvSyncer interface {
	SyncRecv(ctx context.Context) error
}

// AsyncEvent is an asynchronous event (ibv_async_event): of a QP (QPN),
// of a CQ, of an SRQ, or of the port or device (none of them set).
type AsyncEvent struct {
	Type ib.EventType
	QPN  uint32
	CQ   CQ  // EventCQErr only
	SRQ  SRQ // EventSRQLimitReached and EventSRQErr only
}

// DeviceObject is an object that knows its device (ibv_qp.context): the
// QPs of both RNICs. rdma_cm refuses a QP of another device than its
// agent's.
type DeviceObject interface {
	Device() Device
}

package dcqcn

import (
	"time"

	"github.com/softrnic/softrnic/clock"
)

// NPConfig is the notification point's configuration.
type NPConfig struct {
	// MinInterval is the least time between two CNPs for one QP: N = 50 µs
	// in the paper, min_time_between_cnps (4 µs) on ConnectX. 0: a CNP per
	// CE-marked packet (HPCC ns-3 behaviour).
	MinInterval time.Duration
	// Defer chooses what happens to a CE mark that arrives within
	// MinInterval of the last CNP. true (the paper, htsim): remember it and
	// send one CNP when the interval ends, so every interval with a mark
	// produces a CNP. false: drop it; only a mark that arrives after the
	// interval produces a CNP (a plain rate limiter; ConnectX's behaviour is
	// undocumented).
	Defer bool
	// Grid, when set, replaces "immediately, then at most one per
	// MinInterval" by a fixed per-QP clock: CNPs leave only at the ticks
	// of a MinInterval grid that starts at the QP's first received
	// packet, one per tick whose interval saw a CE mark. This is the NP of
	// the authors' own simulator (ns3-rdma, QbbNetDevice::CheckandSendQCN);
	// the first CNP then waits up to MinInterval for its tick. Defer is
	// implied. Default false (the paper's and htsim's immediate first CNP).
	Grid bool
	// DSCP and Prio are the IP DSCP and 802.1p priority the engine gives
	// CNPs (cnp_dscp, cnp_802p_prio); the NP itself does not use them.
	DSCP, Prio uint8
}

// PaperNP is the paper's NP: at most one CNP per 50 µs per QP, deferred.
func PaperNP() NPConfig {
	return NPConfig{MinInterval: 50 * time.Microsecond, Defer: true, DSCP: 48, Prio: 6}
}

// NPCounters are the notification point's counters, with mlx5 names.
type NPCounters struct {
	// NPECNMarkedRoCEPackets (np_ecn_marked_roce_packets) counts CE-marked
	// RoCE packets received.
	NPECNMarkedRoCEPackets uint64
	// NPCNPSent (np_cnp_sent) counts CNPs the NP asked to send.
	NPCNPSent uint64
	// CNPSuppressed counts marks that produced no CNP of their own (no
	// mlx5 equivalent).
	CNPSuppressed uint64
}

// NP is DCQCN's notification point for one QP: it decides, for each
// received packet, whether a CNP goes back to the sender. The caller (the
// engine or the simulator) builds and sends the CNP. It never allocates.
type NP struct {
	cfg     NPConfig
	sent    bool       // a CNP was ever sent (so last is meaningful)
	last    clock.Time // when the last CNP was sent
	pending bool       // a deferred mark waits for the interval to end
	origin  clock.Time // Grid: the QP's first packet, the grid's origin
	seen    bool       // Grid: origin is set
	NPCounters
}

// NewNP returns a notification point.
func NewNP(cfg NPConfig) *NP { n := new(NP); n.Init(cfg); return n }

// Init (re)initialises n in place.
func (n *NP) Init(cfg NPConfig) {
	if cfg.MinInterval < 0 {
		cfg.MinInterval = 0
	}
	*n = NP{cfg: cfg}
}

// Config returns the NP's configuration.
func (n *NP) Config() NPConfig { return n.cfg }

// OnPacket reports a received data packet of this QP and whether it was
// CE-marked; it returns true if a CNP must be sent now.
func (n *NP) OnPacket(now clock.Time, ce bool) (sendCNP bool) {
	if n.cfg.Grid {
		return n.onGridPacket(now, ce)
	}
	if n.OnTimer(now) {
		// A deferred CNP was due at or before now: it covers this mark.
		if ce {
			n.NPECNMarkedRoCEPackets++
			n.CNPSuppressed++
		}
		return true
	}
	if !ce {
		return false
	}
	n.NPECNMarkedRoCEPackets++
	if !n.sent || now-n.last >= clock.Time(n.cfg.MinInterval) {
		n.send(now)
		return true
	}
	n.CNPSuppressed++
	if n.cfg.Defer {
		n.pending = true
	}
	return false
}

// onGridPacket is OnPacket for Grid: a mark is only remembered; the CNP
// leaves at the tick that ends the mark's interval.
func (n *NP) onGridPacket(now clock.Time, ce bool) (sendCNP bool) {
	if !n.seen {
		n.seen, n.origin = true, now
	}
	due := n.OnTimer(now)
	if ce {
		n.NPECNMarkedRoCEPackets++
		if n.pending {
			n.CNPSuppressed++
		} else if p := clock.Time(n.cfg.MinInterval); p <= 0 {
			n.send(now) // no interval: a CNP per mark
			return true
		} else {
			n.pending = true
			// The tick that closes the interval holding now: a mark
			// exactly on a tick belongs to the interval it opens.
			n.last = n.origin + (now-n.origin)/p*p
		}
	}
	return due
}

// Deadline is when a deferred CNP is due, clock.Never if none.
func (n *NP) Deadline() clock.Time {
	if !n.pending {
		return clock.Never
	}
	return n.last + clock.Time(n.cfg.MinInterval)
}

// OnTimer returns true if a deferred CNP is due at now; the caller sends it.
func (n *NP) OnTimer(now clock.Time) (sendCNP bool) {
	if !n.pending || now < n.Deadline() {
		return false
	}
	// Sent at its due time, not at now, so that a late caller does not
	// stretch the CNP grid.
	n.send(n.Deadline())
	return true
}

func (n *NP) send(at clock.Time) {
	n.pending = false
	n.sent = true
	n.last = at
	n.NPCNPSent++
}

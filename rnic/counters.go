package rnic

import (
	"cmp"
	"reflect"
	"slices"

	"github.com/softrnic/softrnic/congestion"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/transport/rc"
	"github.com/softrnic/softrnic/transport/ud"
	"github.com/softrnic/softrnic/verbs"
)

// Stats counts what the step functions dropped and moved. The engine
// goroutine owns them; read them from it (or after it stopped).
type Stats struct {
	RxFrames    uint64
	RxParseErr  uint64 // not RoCEv2 or malformed
	RxNotLocal  uint64 // destination address not ours
	RxBadHeader uint64 // TVer or P_Key
	RxNoQP      uint64 // unknown destination QP
	RxBadICRC   uint64
	RxBadType   uint64 // opcode of another transport than the QP's
	RxBadSrc    uint64 // RC/UC source address is not the connected peer
	RxBadState  uint64 // QP not in a state that receives
	TxFrames    uint64
	LoopFrames  uint64 // built for a QP of the device itself and received without the wire
	CongestionStats
	DMAStats
}

// CongestionStats are the device's congestion-control counters: DCQCN's,
// named (in Counters) as the mlx5 hw_counters that count the same events,
// and every algorithm's (cc_*). The QPs' transports count into CCCounters
// (transport/rc); the device counts the CNPs that reach no transport.
type CongestionStats struct {
	rc.CCCounters
	// RxCNP counts every CNP that passed the receive checks (no mlx5
	// equivalent: the sum of the two rp_ counters).
	RxCNP uint64
	// NPHostCCMarks (np_host_cc_marks) counts the data packets the
	// notification point answered as CE-marked for host congestion
	// (Congestion.HostCC), at most one per QP per CNP interval: each asked its
	// QP for a CNP (counted in np_cnp_sent with the others).
	NPHostCCMarks uint64
}

// PublishStats makes Stats as they are now what StatsSnapshot returns. The
// goroutine running the step functions calls it after a step (the engine
// does, every iteration); it takes a lock only when a counter changed.
func (d *Device) PublishStats() {
	if d.Stats == d.seen {
		return
	}
	d.seen = d.Stats
	d.pubMu.Lock()
	d.pub = d.Stats
	d.pubMu.Unlock()
}

// StatsSnapshot returns the counters as of the last PublishStats, safe
// from any goroutine (Stats itself belongs to the step functions).
func (d *Device) StatsSnapshot() Stats {
	d.pubMu.Lock()
	defer d.pubMu.Unlock()
	return d.pub
}

// CongestionCounters implements verbs.CongestionCounter.
func (d *Device) CongestionCounters() verbs.CongestionCounters {
	s := d.StatsSnapshot()
	return verbs.CongestionCounters{ECNMarked: s.NPECNMarkedRoCEPackets, CNPSent: s.NPCNPSent,
		CNPHandled: s.RPCNPHandled, CNPIgnored: s.RPCNPIgnored, Counters: s.CCCounters.Counters}
}

// TransportProgress implements verbs.ProgressCounter: the progress of the
// RC and UC QPs numbered in qpns.
func (d *Device) TransportProgress(qpns []uint32) uint64 {
	var n uint64
	d.EachQPCounters(func(c *QPCounters) {
		if slices.Contains(qpns, c.QPN) {
			n += c.RC.Progress
		}
	})
	return n
}

// RCCounters sums the transport counters of the device's RC and UC QPs
// over its life: the live QPs' and those of the QPs destroyed or reset
// before (safe from any goroutine). What a tool reports when it exits,
// after its QPs are gone.
func (d *Device) RCCounters() rc.Counters {
	d.retiredMu.Lock()
	c := d.retired
	d.retiredMu.Unlock()
	d.EachQPCounters(func(q *QPCounters) {
		if q.Type.Connected() {
			c.Add(&q.RC)
		}
	})
	return c
}

// RecoveryCounters implements verbs.RecoveryCounter.
func (d *Device) RecoveryCounters(qpns []uint32) verbs.RecoveryCounters {
	var c rc.Counters
	d.EachQPCounters(func(q *QPCounters) {
		if q.Type.Connected() && slices.Contains(qpns, q.QPN) {
			c.Add(&q.RC)
		}
	})
	return RecoveryCountersOf(&c)
}

// RecoveryCountersOf picks the loss recovery counters out of c.
func RecoveryCountersOf(c *rc.Counters) verbs.RecoveryCounters {
	return verbs.RecoveryCounters{Timeouts: c.Timeouts, Excused: c.TimeoutsExcused, Retransmits: c.Retransmits, SeqNAKs: c.RxNAKSeqErr,
		Duplicates: c.RxDuplicate, AdpRetrans: c.AdpRetrans, AdpRetransTO: c.AdpRetransTO, TLPProbes: c.TLPProbes,
		FastRetrans: c.FastRetrans, RxSACKs: c.RxSACKs, TxSACKs: c.TxSACKs, SelRetrans: c.SelRetrans, SRHeld: c.SRHeld,
		SRDropped: c.SRDropped, RetransPackets: c.RetransPkts}
}

// ReorderInUse is how many buffers of the device's reorder pool hold a
// packet now.
func (d *Device) ReorderInUse() int { return d.reorder.InUse() }

// Counter is one named counter.
type Counter struct {
	Name  string
	Value uint64
}

// Counters returns the DCQCN counters under their mlx5 names, in the order
// rdma statistic prints them, then every algorithm's.
func (s *CongestionStats) Counters() [8]Counter {
	c := &s.CCCounters.Counters
	return [8]Counter{
		{"np_ecn_marked_roce_packets", s.NPECNMarkedRoCEPackets},
		{"np_cnp_sent", s.NPCNPSent},
		{"rp_cnp_handled", s.RPCNPHandled},
		{"rp_cnp_ignored", s.RPCNPIgnored},
		{"cc_rtt_samples", c.RTTSamples},
		{"cc_decreases", c.Decreases},
		{"cc_loss_events", c.LossEvents},
		{"cc_window_full", c.WindowFull},
	}
}

// QPCounters is a snapshot of one QP's transport counters, for the
// daemon's counters (softrnic stats, /metrics): RC and UC QPs fill RC, UD
// and GSI QPs fill UD.
type QPCounters struct {
	QPN   uint32
	Type  ib.QPType
	State ib.QPState
	// Recovery is an RC QP's loss recovery mode, and whether selective
	// repeat is in use for the requests it sends (SRReq) and receives
	// (SRResp).
	Recovery      ib.Recovery
	SRReq, SRResp bool
	RC            rc.Counters
	UD            ud.Counters
	CQE           CQECounters
	// CC is the QP's congestion-control state when CCOn (an RC or UC QP
	// of a device that runs congestion control).
	CC   congestion.State
	CCOn bool
	// HostCCMarks counts the QP's packets marked for host congestion
	// (np_host_cc_marks; Congestion.HostCC).
	HostCCMarks uint64
}

// CQECounters counts a QP's error completions the way mlx5 does
// (req_cqe_error, req_cqe_flush_error, resp_cqe_error,
// resp_cqe_flush_error): send queue (requester) and receive queue
// (responder) apart, flushed WRs apart from WRs that failed themselves.
// Counted in verbs, where every completion of every transport passes,
// including the flushes verbs itself produces.
type CQECounters struct {
	ReqErr, ReqFlushErr   uint64
	RespErr, RespFlushErr uint64
}

// add counts one completion; successful ones are not counted.
func (c *CQECounters) add(w *ib.WC) {
	switch {
	case w.Status == ib.Success:
	case w.IsRecv && w.Status == ib.WRFlushErr:
		c.RespFlushErr++
	case w.IsRecv:
		c.RespErr++
	case w.Status == ib.WRFlushErr:
		c.ReqFlushErr++
	default:
		c.ReqErr++
	}
}

// EachQPCounters calls fn with a snapshot of every live QP's counters, in
// QPN order. Safe from any goroutine: each QP's counters are copied under
// its mutex, which the step functions hold while they count, so a snapshot
// never shows half an update. fn must not call into the device.
func (d *Device) EachQPCounters(fn func(*QPCounters)) {
	var qps []*QP
	d.qps.each(func(q *QP) { qps = append(qps, q) })
	slices.SortFunc(qps, func(a, b *QP) int { return cmp.Compare(a.qpn, b.qpn) })
	var c QPCounters
	for _, q := range qps {
		if q.destroyed.Load() {
			continue
		}
		q.counters(&c)
		fn(&c)
	}
}

// counters copies q's counters into c.
func (q *QP) counters(c *QPCounters) {
	*c = QPCounters{QPN: q.qpn, Type: q.init.Type}
	q.mu.Lock()
	defer q.mu.Unlock()
	c.State = q.state
	c.CQE = q.cqe
	c.HostCCMarks = q.hostMark.Marks
	switch t := q.tr.(type) {
	case *rc.QP:
		c.RC = t.Counters
		if q.init.Type == ib.RC {
			c.Recovery = q.init.Recovery
			c.SRReq, c.SRResp = t.SelectiveRepeat()
		}
	case *ud.QP:
		c.UD = t.Counters
	}
	if r, ok := q.tr.(ccReporter); ok {
		c.CC, c.CCOn = r.CongestionState()
	}
}

// RetiredQPs are the summed counters of the device's destroyed QPs (RC
// and UC ones in RC, UD and GSI ones in UD), so that device totals built
// from per-QP counters never go down when a QP goes.
type RetiredQPs struct {
	QPs uint64
	RC  rc.Counters
	UD  ud.Counters
	CQE CQECounters
}

// retire marks q destroyed and adds its final counters to the device's
// retired sums, once, before q leaves the live QPs; true for that once.
func (d *Device) retire(q *QP) bool {
	var c QPCounters
	d.retMu.Lock()
	defer d.retMu.Unlock()
	if q.destroyed.Load() {
		return false
	}
	q.counters(&c)
	d.retiredQPs.QPs++
	addCounts(&d.retiredQPs.RC, &c.RC)
	addCounts(&d.retiredQPs.UD, &c.UD)
	addCounts(&d.retiredQPs.CQE, &c.CQE)
	d.retireGen++
	q.destroyed.Store(true)
	return true
}

// QPCounterTotals calls fn with every live QP's counters, as
// EachQPCounters, and returns the counters of the QPs destroyed so far:
// each QP is in exactly one of the two (a QP destroyed meanwhile makes
// it take the snapshot again), so their sum is the device's total.
func (d *Device) QPCounterTotals(fn func(*QPCounters)) RetiredQPs {
	var live []QPCounters
	for try := 0; ; try++ {
		d.retMu.Lock()
		gen, retired := d.retireGen, d.retiredQPs
		d.retMu.Unlock()
		live = live[:0]
		d.EachQPCounters(func(c *QPCounters) { live = append(live, *c) })
		d.retMu.Lock()
		same := d.retireGen == gen
		d.retMu.Unlock()
		if same || try == 3 {
			for i := range live {
				fn(&live[i])
			}
			return retired
		}
	}
}

// addCounts adds every uint64 field of *src (a struct of counters) to
// *dst's: the transports' counter sets grow, and a field missed here would
// silently vanish from the totals.
func addCounts[T any](dst, src *T) {
	dv, sv := reflect.ValueOf(dst).Elem(), reflect.ValueOf(src).Elem()
	for i := 0; i < dv.NumField(); i++ {
		if f := dv.Field(i); f.Kind() == reflect.Uint64 && f.CanSet() {
			f.SetUint(f.Uint() + sv.Field(i).Uint())
		}
	}
}

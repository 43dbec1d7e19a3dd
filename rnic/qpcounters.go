package rnic

import (
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/transport/rc"
	"github.com/softrnic/softrnic/transport/ud"
)

// QPCounters is a snapshot of one QP's transport counters, for the
// daemon's counters (softrnic stats, /metrics): RC and UC QPs fill RC, UD
// and GSI QPs fill UD.
type QPCounters struct {
	QPN   uint32
	Type  ib.QPType
	State ib.QPState
	RC    rc.Counters
	UD    ud.Counters
	CQE   CQECounters
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
// creation order. Safe from any goroutine: each QP's counters are copied
// under its mutex, which the step functions hold while they count, so a
// snapshot never shows half an update. fn must not call into the device.
func (d *Device) EachQPCounters(fn func(*QPCounters)) {
	var c QPCounters
	for _, q := range *d.list.Load() {
		if q.destroyed.Load() {
			continue
		}
		c = QPCounters{QPN: q.qpn, Type: q.init.Type}
		q.mu.Lock()
		c.State = q.state
		c.CQE = q.cqe
		switch t := q.tr.(type) {
		case *rc.QP:
			c.RC = t.Counters
		case *ud.QP:
			c.UD = t.Counters
		}
		q.mu.Unlock()
		fn(&c)
	}
}

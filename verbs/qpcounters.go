package verbs

import (
	"github.com/softrnic/softrnic/transport/rc"
	"github.com/softrnic/softrnic/transport/ud"
)

// QPCounters is a snapshot of one QP's transport counters, for the
// daemon's counters (softrnic stats, /metrics): RC and UC QPs fill RC, UD
// and GSI QPs fill UD.
type QPCounters struct {
	QPN   uint32
	Type  QPType
	State State
	RC    rc.Counters
	UD    ud.Counters
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
		if q.rc != nil {
			c.RC = q.rc.Counters
		}
		if q.ud != nil {
			c.UD = q.ud.Counters
		}
		q.mu.Unlock()
		fn(&c)
	}
}

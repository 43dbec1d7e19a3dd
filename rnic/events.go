package rnic

import (
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/verbs"
)

// Events delivers asynchronous events (ibv_get_async_event). Events are
// dropped, and counted by LostEvents, when nobody reads them.
func (d *Device) Events() <-chan verbs.AsyncEvent { return d.events }

// LostEvents counts events dropped because Events was full.
func (d *Device) LostEvents() uint64 { return d.lostEv.Load() }

func (d *Device) event(t ib.EventType, qpn uint32) {
	d.asyncEvent(verbs.AsyncEvent{Type: t, QPN: qpn})
}

func (d *Device) asyncEvent(e verbs.AsyncEvent) {
	select {
	case d.events <- e:
	default:
		d.lostEv.Add(1)
	}
}

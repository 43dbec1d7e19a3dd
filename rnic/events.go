package rnic

import (
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/verbs"
)

// Events delivers asynchronous events (ibv_get_async_event). Events are
// dropped, and counted by LostEvents, when nobody reads them.
func (d *Device) Events() <-chan verbs.AsyncEvent { return d.events }

// Subscribe adds a consumer of the device's asynchronous events besides
// Events (the daemon, which hands each client the events of its own
// objects, while the rdma_cm agent reads Events): every event goes to
// Events and to every subscriber, each through a buffer of n of its own. A
// subscriber that lets its buffer fill loses events, counted by
// LostEvents. cancel ends the subscription; the channel is not closed.
func (d *Device) Subscribe(n int) (events <-chan verbs.AsyncEvent, cancel func()) {
	ch := make(chan verbs.AsyncEvent, n)
	d.subMu.Lock()
	subs := append(append([]chan verbs.AsyncEvent(nil), *d.subs.Load()...), ch)
	d.subs.Store(&subs)
	d.subMu.Unlock()
	return ch, func() {
		d.subMu.Lock()
		defer d.subMu.Unlock()
		var rest []chan verbs.AsyncEvent
		for _, c := range *d.subs.Load() {
			if c != ch {
				rest = append(rest, c)
			}
		}
		d.subs.Store(&rest)
	}
}

// LostEvents counts events dropped because Events or a subscriber's
// channel was full.
func (d *Device) LostEvents() uint64 { return d.lostEv.Load() }

// SetPortActive records the port's link state (the host watches its
// interface) and reports a change as EventPortActive or EventPortErr;
// Query's PortActive follows it. It returns whether the state changed.
func (d *Device) SetPortActive(active bool) bool {
	if d.portDown.Swap(!active) == !active {
		return false
	}
	if active {
		d.event(ib.EventPortActive, 0)
	} else {
		d.event(ib.EventPortErr, 0)
	}
	return true
}

func (d *Device) event(t ib.EventType, qpn uint32) {
	d.asyncEvent(verbs.AsyncEvent{Type: t, QPN: qpn})
}

// asyncEvent hands e to every consumer without ever blocking: it runs on
// the engine goroutine, often under a QP's lock.
func (d *Device) asyncEvent(e verbs.AsyncEvent) {
	send := func(ch chan verbs.AsyncEvent) {
		select {
		case ch <- e:
		default:
			d.lostEv.Add(1)
		}
	}
	send(d.events)
	for _, ch := range *d.subs.Load() {
		send(ch)
	}
}

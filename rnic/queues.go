package rnic

import (
	"github.com/softrnic/softrnic/clock"
)

// Queues are work queues of the device that live outside it: the
// daemon's client rings in shared memory, which a client writes and the
// device reads, as a hardware RNIC reads the WQEs an application writes
// into host memory and rings it only when the RNIC has gone idle. The
// goroutine that runs the device's step functions fetches from them at
// every step (FetchQueues), and arms them before it sleeps, so that work
// arriving while it sleeps wakes it (Wake).
type Queues interface {
	// Fetch takes posted work into the device and reports whether it
	// took anything. It runs in the goroutine of the step functions.
	Fetch(now clock.Time) bool
	// Arm is called before that goroutine sleeps: from now on new work
	// must call Device.Wake. It reports false if work arrived meanwhile,
	// and the goroutine then does not sleep.
	Arm() bool
	// Disarm is called when the goroutine is awake again: new work needs
	// no wake-up.
	Disarm()
}

// SetQueues attaches q to the device (nil detaches). The step's goroutine
// may be in q.Fetch until the next step after SetQueues returns: q stops
// answering on its own side when it is being shut down.
func (d *Device) SetQueues(q Queues) {
	if q == nil {
		d.queues.Store(nil)
		return
	}
	d.queues.Store(&q)
}

// FetchQueues runs the attached Queues' Fetch (engine goroutine).
func (d *Device) FetchQueues(now clock.Time) bool {
	q := d.queues.Load()
	return q != nil && (*q).Fetch(now)
}

// ArmQueues arms the attached Queues before the engine sleeps; false
// means work arrived and the engine must not sleep.
func (d *Device) ArmQueues() bool {
	q := d.queues.Load()
	return q == nil || (*q).Arm()
}

// DisarmQueues disarms them when the engine is awake again.
func (d *Device) DisarmQueues() {
	if q := d.queues.Load(); q != nil {
		(*q).Disarm()
	}
}

// SetWaker installs w as the way to wake the engine while it sleeps
// where the doorbell channel cannot reach it (in its port); nil removes
// it. The engine installs it once and says when it sleeps (SetAsleep):
// posts, Wake and completions for attached Queues then call it.
func (d *Device) SetWaker(w func()) {
	if w == nil {
		d.waker.Store(nil)
		return
	}
	d.waker.Store(&w)
}

// SetAsleep says whether the engine sleeps where only the waker reaches
// it. Set before the engine looks at its doorbell a last time, so that a
// post after that look finds it set.
func (d *Device) SetAsleep(asleep bool) { d.asleep.Store(asleep) }

// Wake rings the engine from outside the verbs: attached Queues that got
// work while armed, or a control operation whose completions they must
// fetch. Cheap while the engine is awake (a channel send that does not
// block); a syscall while it sleeps in its port.
func (d *Device) Wake() {
	select {
	case d.doorbell <- struct{}{}:
	default:
	}
	if d.asleep.Load() {
		if w := d.waker.Load(); w != nil {
			(*w)()
		}
	}
}

// HasQueues reports whether Queues are attached.
func (d *Device) HasQueues() bool { return d.queues.Load() != nil }

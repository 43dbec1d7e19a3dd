package rnic

import (
	"time"

	"github.com/softrnic/softrnic/clock"
)

// SetPoller installs step as the device's inline step, which Poll runs;
// nil removes it. engine.Loop.Run installs its own for as long as it
// runs: step must try to run the step functions in the caller's goroutine
// and give up at once when another goroutine is running them (a try-lock
// per call, never a lock per packet), reporting whether it ran and
// whether it moved anything.
func (d *Device) SetPoller(step func() (moved, ran bool)) {
	if step == nil {
		d.poller.Store(nil)
		return
	}
	d.poller.Store(&step)
}

// Poll drives the device from the calling goroutine, as ibv_poll_cq on an
// mlx5 or rxe device processes the rings in the caller's context: when no
// other goroutine is running the step functions, it receives one batch,
// runs due timers and sends what the QPs have, and reports whether any
// frame moved. An application that busy-polls its CQ calls it whenever
// the CQ is empty: a ping-pong then needs no hand-off to the engine
// goroutine in either direction (see also Config.PollFresh). While its
// steps move nothing it keeps stepping for up to pollSpin, so that a
// caller that yields between calls yields less often; it returns at once
// when a step moved something, when the engine goroutine holds the step,
// and when no engine loop runs the device.
func (d *Device) Poll() bool {
	p := d.poller.Load()
	if p == nil {
		return false
	}
	start := clock.Now()
	d.polledAt.Store(int64(start))
	for {
		moved, ran := (*p)()
		if moved || !ran {
			return moved
		}
		if t := clock.Now(); t.Sub(start) >= pollSpin {
			d.polledAt.Store(int64(t)) // still polling: posts need no doorbell
			return false
		}
	}
}

// pollSpin bounds Poll's busy polling while nothing moves (as
// SO_BUSY_POLL bounds a socket's). A goroutine locked to its OS thread,
// as perf's are in their network namespaces, pays for each
// runtime.Gosched with two thread hand-offs (futex calls, several µs):
// polling the port for a few µs first catches the answer of a ping-pong
// or the ACK that reopens a WRITE window before yielding.
const pollSpin = 5 * time.Microsecond

// PolledAt is when an application last called Poll (0: never); the
// engine naps longer while applications poll for it.
func (d *Device) PolledAt() clock.Time { return clock.Time(d.polledAt.Load()) }

// RingsSkipped counts posts that left the doorbell alone because the
// application was polling (safe from any goroutine).
func (d *Device) RingsSkipped() uint64 { return d.ringsSkipped.Load() }

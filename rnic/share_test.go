package rnic

import (
	"testing"
	"time"

	"github.com/softrnic/softrnic/clock"
)

// shareRun drives an rxShare as the engine does: every step, the port's
// level (SetRxLevel), the frames taken (Receive), and a sweep when due.
type shareRun struct {
	s      rxShare
	now    clock.Time
	frames int // the port's receive frames
}

func (r *shareRun) step(d time.Duration, queued, taken int) {
	r.now = r.now.Add(d)
	r.s.level(r.now, queued)
	if r.s.sweep(r.now, r.frames) {
		r.s.n = 128
	}
	r.s.took(r.now, taken)
}

// TestRecvWindowBoundedInTime: receive windows together hold the port's
// frames to what the device drains in maxQueueDelay once frames wait
// longer than that (a loaded host's engine, taking a few thousand frames
// a second), and grow back, doubling each interval, once they do not;
// bursts the device takes at once bound nothing.
func TestRecvWindowBoundedInTime(t *testing.T) {
	r := &shareRun{now: clock.Time(time.Second), frames: 4096}
	r.step(0, 0, 0)
	full := r.s.window(r.frames)
	if full != 4096/2/128 {
		t.Fatalf("window %d before any queue", full)
	}
	// Bursts of 64 frames, taken as they come: no standing queue.
	for i := 0; i < 100; i++ {
		r.step(time.Millisecond, 64, 64)
	}
	if w := r.s.window(r.frames); w != full || r.s.budget != 0 {
		t.Fatalf("bursts bound the window to %d (budget %d)", w, r.s.budget)
	}
	// A standing queue of 2 000 buffers drained at 6 400 frames a second.
	for i := 0; i < 30; i++ {
		r.step(10*time.Millisecond, 2000, 64)
	}
	// 64 frames per 10 ms, in maxQueueDelay: far below the QPs' floor,
	// so every window is at its minimum.
	if drained := int(64 * maxQueueDelay / (10 * time.Millisecond)); r.s.budget != drained {
		t.Fatalf("budget %d under a standing queue, want %d", r.s.budget, drained)
	}
	if w := r.s.window(r.frames); w != minRecvWindow {
		t.Fatalf("window %d under a standing queue, want %d", w, minRecvWindow)
	}
	// The queue gone: the bound doubles each interval back to none.
	sweeps := 0
	for i := 0; i < 1000 && r.s.budget != 0; i++ {
		before := r.s.swept
		r.step(time.Millisecond, 0, 0)
		if r.s.swept != before {
			sweeps++
		}
	}
	if r.s.budget != 0 || sweeps > 10 {
		t.Fatalf("budget %d after %d sweeps without a queue", r.s.budget, sweeps)
	}
	if w := r.s.window(r.frames); w != full {
		t.Fatalf("window %d once recovered, want %d", w, full)
	}
}

// TestRecvWindowUnboundedWithoutGauge: a port that reports no level (no
// SetRxLevel: memlink, AF_PACKET) leaves the windows to the frames.
func TestRecvWindowUnboundedWithoutGauge(t *testing.T) {
	r := &shareRun{now: clock.Time(time.Second), frames: 4096}
	for i := 0; i < 100; i++ {
		r.now = r.now.Add(10 * time.Millisecond)
		if r.s.sweep(r.now, r.frames) {
			r.s.n = 128
		}
		r.s.took(r.now, 64)
	}
	if r.s.budget != 0 {
		t.Fatalf("budget %d without levels", r.s.budget)
	}
}

package engine

import (
	"testing"
	"time"
)

// TestSpinPolicy drives the adaptive spin window through the traffic it is
// meant for: a dense stream seen late (frames queued up behind a nap's
// oversleep), short gaps, then sparse single frames.
func TestSpinPolicy(t *testing.T) {
	const us = time.Microsecond
	p := spinPolicy{min: 2 * us, max: 200 * us}
	if w := p.window(); w != 2*us {
		t.Fatalf("initial window %v, want min", w)
	}
	// A WRITE stream behind 1 ms naps: every spell ends with a batch queued.
	for i, want := range []time.Duration{4, 8, 16, 32, 64, 128, 200, 200} {
		p.observe(time.Millisecond, 64)
		if w := p.window(); w != want*us {
			t.Fatalf("queued batch %d: window %v, want %v", i, w, want*us)
		}
	}
	// Gaps the window covers leave it alone.
	p.observe(150*us, 1)
	if w := p.window(); w != 200*us {
		t.Fatalf("covered gap: window %v", w)
	}
	// Sparse single frames (a ping each ms) shrink it back to min.
	for i, want := range []time.Duration{100 * us, 50 * us, 25 * us, 12500 * time.Nanosecond} {
		p.observe(time.Millisecond, 1)
		if w := p.window(); w != want {
			t.Fatalf("sparse frame %d: window %v, want %v", i, w, want)
		}
	}
	for i := 0; i < 10; i++ {
		p.observe(time.Millisecond, 1)
	}
	if w := p.window(); w != 2*us {
		t.Fatalf("sparse traffic: window %v, want min", w)
	}
	// A single frame just after the window: a longer window would have
	// caught it without a nap.
	p.observe(3*us, 1)
	if w := p.window(); w != 4*us {
		t.Fatalf("gap just over the window: %v, want 4µs", w)
	}
	// A long gap with a queued batch but within the window: no change.
	p.observe(3*us, 5)
	if w := p.window(); w != 4*us {
		t.Fatalf("covered gap with a batch: %v", w)
	}
	// Adaptation off.
	off := spinPolicy{min: 2 * us, max: -1}
	off.observe(time.Millisecond, 64)
	if w := off.window(); w != 2*us {
		t.Fatalf("adaptation off: window %v", w)
	}
}

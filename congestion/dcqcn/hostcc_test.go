package dcqcn

import (
	"slices"
	"testing"
	"time"

	"github.com/softrnic/softrnic/clock"
)

// The thresholds: a FILL ring under a quarter of the buffers or an RX ring
// at half of them is congestion, anything else is not.
func TestHostCCThresholds(t *testing.T) {
	for _, c := range []struct {
		fill, queued int
		want         bool
	}{
		{4096, 0, false},
		{1025, 2000, false},
		{1024, 2047, false},
		{1023, 0, true},    // FILL running low
		{3000, 2048, true}, // RX ring backing up
		{0, 4000, true},
	} {
		h := NewHostCC(HostCCConfig{})
		h.Observe(10*us, c.fill, c.queued, 4096)
		if got := h.Congested(10 * us); got != c.want {
			t.Errorf("fill %d, queued %d of 4096: congested %v, want %v", c.fill, c.queued, got, c.want)
		}
	}
}

// Congestion lasts Hold after the last reading over a threshold; readings
// under it do not end it early; an unknown size is no reading; Off never
// signals.
func TestHostCCHold(t *testing.T) {
	h := NewHostCC(HostCCConfig{Hold: 100 * time.Microsecond})
	h.Observe(0, 0, 100, 100)
	h.Observe(50*us, 100, 0, 100) // calm reading inside the hold
	if !h.Congested(99 * us) {
		t.Fatal("congestion ended before its hold")
	}
	h.Observe(99*us, 10, 0, 100) // renewed
	if !h.Congested(198*us) || h.Congested(199*us) {
		t.Fatalf("hold after the renewal: congested at 198 µs %v, at 199 µs %v", h.Congested(198*us), h.Congested(199*us))
	}
	if h.Episodes != 1 || h.Readings != 2 {
		t.Fatalf("episodes %d readings %d, want 1 and 2", h.Episodes, h.Readings)
	}
	h.Observe(300*us, 0, 100, 100)
	if h.Episodes != 2 {
		t.Fatalf("episodes %d after a second crossing, want 2", h.Episodes)
	}
	h.Observe(500*us, 0, 100, 0)
	if h.Congested(500 * us) {
		t.Fatal("a reading without a buffer count signalled congestion")
	}
	off := NewHostCC(HostCCConfig{Off: true})
	off.Observe(0, 0, 100, 100)
	if off.Congested(0) || off.Mark(0, &HostMark{}, 0) {
		t.Fatal("an Off detector signalled")
	}
}

// Mark answers at most one packet per QP per interval while congested,
// each QP on its own, and none once the congestion is over.
func TestHostCCMarkPerQP(t *testing.T) {
	h := NewHostCC(HostCCConfig{Hold: time.Millisecond})
	var a, b HostMark
	interval := 50 * time.Microsecond
	if h.Mark(0, &a, interval) {
		t.Fatal("marked before any congestion")
	}
	h.Observe(0, 0, 10, 10)
	var marksA, marksB []clock.Time
	for now := clock.Time(0); now < 200*us; now += us {
		if h.Mark(now, &a, interval) {
			marksA = append(marksA, now)
		}
		if now%(10*us) == 5*us && h.Mark(now, &b, interval) {
			marksB = append(marksB, now)
		}
	}
	wantA := []clock.Time{0, 50 * us, 100 * us, 150 * us}
	wantB := []clock.Time{5 * us, 55 * us, 105 * us, 155 * us}
	if !slices.Equal(marksA, wantA) || !slices.Equal(marksB, wantB) {
		t.Fatalf("marks A %v, B %v; want %v and %v", marksA, marksB, wantA, wantB)
	}
	if h.Marks != 8 || a.Marks != 4 || b.Marks != 4 {
		t.Fatalf("Marks %d (A %d, B %d), want 8 (4 each)", h.Marks, a.Marks, b.Marks)
	}
	if h.Mark(2*ms, &a, interval) {
		t.Fatal("marked after the congestion's hold")
	}
	// Interval 0: the hold spaces the marks.
	h.Observe(3*ms, 0, 10, 10)
	var c HostMark
	if !h.Mark(3*ms, &c, 0) || h.Mark(3*ms+999*us, &c, 0) {
		t.Fatal("interval 0 did not space marks by the hold")
	}
}

func TestHostCCNoAlloc(t *testing.T) {
	h := NewHostCC(HostCCConfig{})
	var m HostMark
	now := clock.Time(0)
	if n := testing.AllocsPerRun(100, func() {
		now += us
		h.Observe(now, 0, 10, 10)
		h.Mark(now, &m, 4*time.Microsecond)
	}); n != 0 {
		t.Fatalf("%v allocations per packet", n)
	}
}

const ms = clock.Time(time.Millisecond)

// ParseHostCC: on/off, each key alone keeping the other defaults, and
// what it refuses; String writes what it parses back.
func TestParseHostCC(t *testing.T) {
	for _, c := range []struct {
		in   string
		want HostCCConfig
		str  string
	}{
		{"", HostCCConfig{}, "fill=0.25,rx=0.5,hold=100µs"},
		{"on", HostCCConfig{}, "fill=0.25,rx=0.5,hold=100µs"},
		{"off", HostCCConfig{Off: true}, "off"},
		{"fill=1", HostCCConfig{FillLow: 1}, "fill=1,rx=0.5,hold=100µs"},
		{"rx=0.75,hold=2ms", HostCCConfig{RxHigh: 0.75, Hold: 2 * time.Millisecond}, "fill=0.25,rx=0.75,hold=2ms"},
		{"hold=1s,fill=0.5,rx=0.125", HostCCConfig{FillLow: 0.5, RxHigh: 0.125, Hold: time.Second}, "fill=0.5,rx=0.125,hold=1s"},
	} {
		got, err := ParseHostCC(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseHostCC(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
			continue
		}
		if s := got.String(); s != c.str {
			t.Errorf("ParseHostCC(%q).String() = %q, want %q", c.in, s, c.str)
		}
		if back, err := ParseHostCC(got.String()); err != nil || back.String() != c.str {
			t.Errorf("%q does not parse back: %+v, %v", got.String(), back, err)
		}
	}
	for _, bad := range []string{"of", "fill", "fill=0", "fill=1.5", "rx=-1", "rx=NaN", "hold=0", "hold=2s", "hold=x",
		"fill=0.5,", "drop=1", "fill=0.5,,rx=0.5"} {
		if c, err := ParseHostCC(bad); err == nil {
			t.Errorf("ParseHostCC(%q) = %+v, want an error", bad, c)
		}
	}
}

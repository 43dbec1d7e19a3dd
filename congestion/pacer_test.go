package congestion

import (
	"testing"

	"github.com/softrnic/softrnic/clock"
)

// At 40 Gb/s a 1000-byte packet takes exactly 200 ns; strict pacing must
// space packets by exactly that and refuse earlier sends.
func TestPacerStrictSpacing(t *testing.T) {
	var p Pacer
	r := 40 * Gbps
	now := clock.Time(1000)
	for i := 0; i < 100; i++ {
		ok, retry := p.Allow(now, r, 1000)
		if !ok {
			t.Fatalf("packet %d refused at %v (retry %v)", i, now, retry)
		}
		if ok2, retry := p.Allow(now+199, r, 1000); ok2 || retry != now+200 {
			t.Fatalf("packet %d: early send allowed=%v retry=%v, want refused until %v", i, ok2, retry, now+200)
		}
		now += 200
	}
}

// A rate that does not divide a nanosecond (3 Gb/s: 1000 B = 2666.67 ns)
// must still average exactly: 3000 packets take 8,000,000 ns.
func TestPacerFractionalMeanRate(t *testing.T) {
	var p Pacer
	r := 3 * Gbps
	now := clock.Time(0)
	sent := 0
	for sent < 3000 {
		at := p.Next(now, r, 1000)
		now = at
		p.Sent(now, r, 1000)
		sent++
	}
	// The 3000th packet departs at the time 2999 packets' worth has passed.
	want := clock.Time(2999 * 8000 / 3)
	if d := now - want; d < -1 || d > 1 {
		t.Fatalf("3000th departure at %d ns, want %d±1", now, want)
	}
}

// After idling, Burst bytes may go back to back, then pacing resumes.
func TestPacerBurst(t *testing.T) {
	p := Pacer{Burst: 4000}
	r := 10 * Gbps // 800 ns per 1000 B
	now := clock.Time(1_000_000)
	n := 0
	for {
		ok, _ := p.Allow(now, r, 1000)
		if !ok {
			break
		}
		n++
		if n > 100 {
			t.Fatal("burst never ended")
		}
	}
	if n != 5 { // the first packet plus Burst/1000 more
		t.Fatalf("back-to-back packets after idle = %d, want 5", n)
	}
	if at := p.Next(now, r, 1000); at != now+800 {
		t.Fatalf("next departure %v, want %v", at, now+800)
	}
}

func TestPacerZeroRateNeverSends(t *testing.T) {
	var p Pacer
	if ok, retry := p.Allow(5, 0, 100); ok || retry != clock.Never {
		t.Fatalf("zero rate: ok=%v retry=%v", ok, retry)
	}
	if ok, _ := p.Allow(5, -1, 100); ok {
		t.Fatal("negative rate allowed a send")
	}
}

func TestPacerAllocFree(t *testing.T) {
	var p Pacer
	now := clock.Time(0)
	allocs := testing.AllocsPerRun(1000, func() {
		if ok, at := p.Allow(now, 25*Gbps, 1024); !ok {
			now = at
		}
		now += 100
	})
	if allocs != 0 {
		t.Fatalf("Pacer.Allow allocates %.1f times per call", allocs)
	}
}

func TestRateHelpers(t *testing.T) {
	if got := (40 * Gbps).TxTime(1000); got != 200 {
		t.Fatalf("TxTime = %v", got)
	}
	if got := (20 * Gbps).Gbps(); got != 20 {
		t.Fatalf("Gbps = %v", got)
	}
}

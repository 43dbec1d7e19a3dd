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

// Retime re-costs the last packet at the new rate: at 40 Gb/s a 1000-byte
// packet sent at 0 frees the pacer at 200 ns; a cut to 20 Gb/s at 50 ns
// moves that to 400 ns, a rise back to 40 Gb/s to 200 ns again; a cut
// when no gap is pending changes nothing, and tat never falls before now.
func TestPacerRetime(t *testing.T) {
	var p Pacer
	p.Sent(0, 40*Gbps, 1000)
	p.Retime(50, 40*Gbps, 20*Gbps, 1000)
	if at := p.Next(50, 20*Gbps, 1000); at != 400 {
		t.Fatalf("after a cut the next packet may leave at %v, want 400", at)
	}
	p.Retime(60, 20*Gbps, 40*Gbps, 1000)
	if at := p.Next(60, 40*Gbps, 1000); at != 200 {
		t.Fatalf("after the rise back the next packet may leave at %v, want 200", at)
	}
	p.Retime(300, 40*Gbps, 10*Gbps, 1000) // gap over: nothing pending
	if at := p.Next(300, 10*Gbps, 1000); at != 300 {
		t.Fatalf("a retime with no gap pending delayed the next packet to %v", at)
	}
	var q Pacer
	q.Sent(0, 1*Gbps, 1000)               // free at 8000 ns
	q.Retime(7990, 1*Gbps, 40*Gbps, 1000) // 7800 ns earlier would be in the past
	if at := q.Next(7990, 40*Gbps, 1000); at != 7990 {
		t.Fatalf("retimed into the past: next at %v, want now (7990)", at)
	}
}

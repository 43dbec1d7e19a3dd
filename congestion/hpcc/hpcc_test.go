package hpcc

import (
	"math"
	"testing"
	"time"

	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/congestion"
)

const us = time.Microsecond

func near(got, want, tol float64) bool { return math.Abs(got-want) <= tol }

func mustNew(t *testing.T, cfg Config) *CC {
	t.Helper()
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// hop is one 100 Gb/s INT record.
func hop(ts clock.Time, tx, q int64) []congestion.INTHop {
	return []congestion.INTHop{{Rate: 100 * congestion.Gbps, TS: ts, TxBytes: tx, QLen: q}}
}

func sendN(c *CC, n int) {
	for i := 0; i < n; i++ {
		c.OnPacketSent(0, 1000)
	}
}

// The golden single-flow trace, by hand from Algorithm 1, C = 100 Gb/s,
// T = 10 µs (B·T = 125,000 bytes), η = 0.95, W_AI/T = 40 Mb/s, one hop:
//
//	sent 100,000 B.
//	ACK1 (1000 B): the first ACK stores its record {ts 1000, tx 0, q 0}
//	  and sets lastUpdateSeq = 100,000; R = 100 Gb/s.
//	ACK2 (1000 B; acked 2000 ≤ 100,000: fast reaction) {1080, 1000, 40000}:
//	  τ = 80 ns, txRate = 1000·8/80 ns = 100 Gb/s, q = min(40000, 0) = 0,
//	  u = 1.0; U = (1·(10000−80) + 1.0·80)/10000 = 1.0;
//	  R = Wc/(U/η) + W_AI = 100·0.95/1.0 + 0.04 = 95.04 Gb/s (Wc stays 100).
//	ACK3 (fast) {1160, 2000, 40000}: txRate 100 Gb/s, q = 40000:
//	  u = 1 + 40000·8/(100e9·10e-6) = 1 + 0.32 = 1.32;
//	  U = (1.0·9920 + 1.32·80)/10000 = 1.00256;
//	  R = 100·0.95/1.00256 + 0.04 = 94.757421… + 0.04 = 94.797421… Gb/s.
//	sent 50,000 B more (snd_nxt 150,000).
//	ACK4 (98,000 B; acked 101,000 > 100,000: per-RTT update)
//	  {11160, 102000, 20000}: τ = 10,000 ns = T, txRate = 100,000·8/10 µs
//	  = 80 Gb/s → 0.8, q = min(20000, 40000) = 20000 → 0.16; u = 0.96;
//	  U = (1.00256·0 + 0.96·10000)/10000 = 0.96 ≥ η:
//	  R = Wc = 100·0.95/0.96 + 0.04 = 98.958333… + 0.04 = 98.998333… Gb/s,
//	  incStage 0, lastUpdateSeq = 150,000; W = R·T = 123,747.9 → 123,747 B.
//	ACK5 (1000 B, fast) {12160, 112000, 0}: τ = 1000, 10,000 B → 80 Gb/s,
//	  q = min(0, 20000) = 0; u = 0.8; U = (0.96·9000 + 0.8·1000)/10000 = 0.944
//	  < η. Artifact (maxStage 0): incStage 0 ≥ 0 → multiplicative:
//	  R = 98.998333·0.95/0.944 + 0.04 = 99.667560… Gb/s.
//	  Paper (maxStage 5): additive: R = Wc + W_AI = 99.038333… Gb/s.
//	ACK6 (50,000 B; acked 152,000 > 150,000: update) {22160, 202000, 0}:
//	  τ = T, 90,000 B → 72 Gb/s; u = U = 0.72 < η.
//	  Artifact: R = 98.998333·0.95/0.72 + 0.04 = 130.66 → capped 100 Gb/s.
//	  Paper: R = Wc = 98.998333 + 0.04 = 99.038333… Gb/s, incStage 1.
func TestGoldenTrace(t *testing.T) {
	for _, p := range []struct {
		name       string
		cfg        Config
		r5, r6     float64
		stage6     int
		mult, addi uint64
	}{
		{"artifact", Artifact(100*congestion.Gbps, 10*us), 99.66756002824862, 100, 0, 5, 0},
		{"paper", Paper(100*congestion.Gbps, 10*us), 99.03833333333333, 99.03833333333333, 1, 3, 2},
	} {
		c := mustNew(t, p.cfg)
		check := func(step string, rate float64) {
			t.Helper()
			if !near(c.Rate().Gbps(), rate, 1e-9) {
				t.Fatalf("%s %s: R = %.12f Gb/s, want %.12f", p.name, step, c.Rate().Gbps(), rate)
			}
		}
		sendN(c, 100)
		c.OnAck(0, congestion.Ack{Bytes: 1000, INT: hop(1000, 0, 0)})
		check("ACK1", 100)
		c.OnAck(0, congestion.Ack{Bytes: 1000, INT: hop(1080, 1000, 40000)})
		check("ACK2", 95.04)
		if c.U() != 1 || c.Reference().Gbps() != 100 {
			t.Fatalf("%s ACK2: U %v Wc/T %v", p.name, c.U(), c.Reference().Gbps())
		}
		c.OnAck(0, congestion.Ack{Bytes: 1000, INT: hop(1160, 2000, 40000)})
		check("ACK3", 94.79742100223427)
		if !near(c.U(), 1.00256, 1e-15) {
			t.Fatalf("%s ACK3: U = %v", p.name, c.U())
		}
		sendN(c, 50)
		c.OnAck(0, congestion.Ack{Bytes: 98000, INT: hop(11160, 102000, 20000)})
		check("ACK4", 98.99833333333333)
		if c.U() != 0.96 || c.Reference() != c.Rate() || c.Updates != 1 || c.Window() != 123747 {
			t.Fatalf("%s ACK4: U %v Wc/T %v updates %d window %d", p.name, c.U(), c.Reference().Gbps(), c.Updates, c.Window())
		}
		c.OnAck(0, congestion.Ack{Bytes: 1000, INT: hop(12160, 112000, 0)})
		check("ACK5", p.r5)
		if !near(c.U(), 0.944, 1e-15) || !near(c.Reference().Gbps(), 98.99833333333333, 1e-9) {
			t.Fatalf("%s ACK5: U %v, Wc/T %v moved on a fast reaction", p.name, c.U(), c.Reference().Gbps())
		}
		c.OnAck(0, congestion.Ack{Bytes: 50000, INT: hop(22160, 202000, 0)})
		check("ACK6", p.r6)
		if !near(c.U(), 0.72, 1e-15) || c.Stage() != p.stage6 || c.Updates != 2 || c.FastReacts != 3 {
			t.Fatalf("%s ACK6: U %v stage %d updates %d fast %d", p.name, c.U(), c.Stage(), c.Updates, c.FastReacts)
		}
		if c.Multiplicative != p.mult || c.Additive != p.addi {
			t.Fatalf("%s: multiplicative/additive %d/%d, want %d/%d", p.name, c.Multiplicative, c.Additive, p.mult, p.addi)
		}
	}
}

// The most loaded hop decides, with its own τ; FastReact off leaves the
// rate alone between per-RTT updates.
func TestBottleneckHopAndNoFastReact(t *testing.T) {
	cfg := Artifact(100*congestion.Gbps, 10*us)
	cfg.FastReact = false
	c := mustNew(t, cfg)
	two := func(ts1 clock.Time, tx1, q1 int64, ts2 clock.Time, tx2, q2 int64) []congestion.INTHop {
		return []congestion.INTHop{
			{Rate: 400 * congestion.Gbps, TS: ts1, TxBytes: tx1, QLen: q1},
			{Rate: 100 * congestion.Gbps, TS: ts2, TxBytes: tx2, QLen: q2},
		}
	}
	sendN(c, 10)
	c.OnAck(0, congestion.Ack{Bytes: 1000, INT: two(0, 0, 0, 500, 0, 0)})
	c.OnAck(0, congestion.Ack{Bytes: 1000, INT: two(100, 1000, 0, 600, 1000, 0)})
	if c.Rate().Gbps() != 100 || c.FastReacts != 0 {
		t.Fatalf("without fast reaction an ACK inside the RTT changed the rate: %v", c.Rate().Gbps())
	}
	// Per-RTT update. Without fast reaction the ACK inside the RTT was not
	// looked at, so the records compared are those of ACK1 (as in the
	// artifact, where FastReactHp does nothing). Hop 1 (400G): τ = 2100 ns,
	// 51,000 B → 194.3 Gb/s → u 0.486. Hop 2 (100G): τ = 1100 ns, 11,000 B →
	// 80 Gb/s → 0.8, plus min(25000, 0) = 0 of queue: u = 0.8, hop 2
	// decides with dt = 1100: U = (1·8900 + 0.8·1100)/10000 = 0.978 ≥ η:
	// R = 100·0.95/0.978 + 0.04 = 97.137014… + 0.04 = 97.177014… Gb/s.
	c.OnAck(0, congestion.Ack{Bytes: 9000, INT: two(2100, 51000, 0, 1600, 11000, 25000)})
	if want := 100*0.95/0.978 + 0.04; !near(c.Rate().Gbps(), want, 1e-9) || !near(c.U(), 0.978, 1e-15) {
		t.Fatalf("R = %v (want %v), U = %v", c.Rate().Gbps(), want, c.U())
	}
}

// Rates stay within [MinRate, LineRate] whatever the INT says.
func TestBounds(t *testing.T) {
	c := mustNew(t, Artifact(100*congestion.Gbps, 10*us))
	sendN(c, 1)
	c.OnAck(0, congestion.Ack{Bytes: 1000, INT: hop(0, 0, 0)})
	// A 10 MB standing queue: u ≈ 80, the rate falls to the floor.
	ts := clock.Time(0)
	for i := 0; i < 50; i++ {
		ts += 10_000
		sendN(c, 1)
		c.OnAck(0, congestion.Ack{Bytes: 1000, INT: hop(ts, int64(i+1)*125000, 10_000_000)})
	}
	if c.Rate() != c.Config().MinRate {
		t.Fatalf("rate %v under a 10 MB queue, want the floor %v", c.Rate(), c.Config().MinRate)
	}
	if c.Window() != int64(float64(c.Config().MinRate)*1e-5/8) {
		t.Fatalf("window %d at the floor", c.Window())
	}
}

func TestValidate(t *testing.T) {
	bad := []func(*Config){
		func(c *Config) { c.LineRate = 0 },
		func(c *Config) { c.BaseRTT = 0 },
		func(c *Config) { c.Eta = 1.5 },
		func(c *Config) { c.Eta = math.NaN() },
		func(c *Config) { c.MaxStage = -1 },
		func(c *Config) { c.MinRate = 200 * congestion.Gbps },
		func(c *Config) { c.AIRate = congestion.Rate(math.NaN()) },
	}
	for i, f := range bad {
		c := Artifact(100*congestion.Gbps, 10*us)
		f(&c)
		if _, err := New(c); err == nil {
			t.Errorf("bad config %d accepted", i)
		}
	}
}

func TestAllocFree(t *testing.T) {
	c := mustNew(t, Artifact(100*congestion.Gbps, 10*us))
	var ints [5]congestion.INTHop
	ts := clock.Time(0)
	allocs := testing.AllocsPerRun(1000, func() {
		ts += 80
		c.OnPacketSent(ts, 1000)
		for i := range ints {
			ints[i] = congestion.INTHop{Rate: 100 * congestion.Gbps, TS: ts, TxBytes: int64(ts), QLen: int64(ts % 7000)}
		}
		c.OnAck(ts, congestion.Ack{Bytes: 1000, RTT: 5 * us, INT: ints[:]})
		_, _ = c.Rate(), c.Window()
	})
	if allocs != 0 {
		t.Fatalf("%.1f allocations per ACK", allocs)
	}
}

package timely

import (
	"math"
	"testing"
	"time"

	"github.com/softrnic/softrnic/congestion"
)

func near(got, want, tol float64) bool { return math.Abs(got-want) <= tol }

func mustNew(t *testing.T, cfg Config) *CC {
	t.Helper()
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// The golden single-flow trace, by hand from Algorithm 1 at C = 10 Gb/s
// (the paper's setting): δ = 10 Mb/s, T_low 50 µs, T_high 500 µs, minRTT
// 20 µs, α 0.875, β 0.8, N = 5. Every ACK acknowledges 10,000 bytes and is
// one update event (per-RTT events: each ACK acknowledges data sent after
// the last event; paper: Segment = 10,000 bytes). RTT samples in µs and
// what they do (rtt_diff in µs, g = rtt_diff/20):
//
//	 1   30: first event, prev_rtt = 30; rate 10 Gb/s.
//	 2  600: diff = 0.875·570 = 498.75, g 24.94; 600 > T_high:
//	         rate = 10·(1 − 0.8·(1 − 500/600)) = 10·(1 − 0.8/6) = 8.666667.
//	 3  400: diff = 0.125·498.75 + 0.875·(−200) = −112.65625, g −5.63 ≤ 0:
//	         rate + δ = 8.676667.
//	 4  420: diff = 0.125·(−112.65625) + 0.875·20 = 3.41796875,
//	         g = 0.1708984375 > 0: rate·(1 − 0.8·g) = 8.676667·0.86328125
//	         = 7.490404.
//	 5–10 40: below T_low, diff → −332.07, −41.5, −5.19, −0.65, −0.081,
//	         −0.0101: rate + δ each → 7.500404 … 7.550404; HPCC's ns-3
//	         counts increases of any kind, so its sixth (event 10) is hyper:
//	         + 5δ → 7.590404.
//	11   60: diff = 0.125·(−0.0101341) + 0.875·20 = 17.498733, g 0.874937:
//	         rate·(1 − 0.699949) → paper 7.550404·0.300051 = 2.265504,
//	         ns-3 7.590404·0.300051 = 2.277506.
//	12   58: diff 0.437342, g 0.0218671: ×0.982507 → 2.225872 / 2.237664.
//	13–16 56, 54, 52, 51: g < 0 in the gradient region: + δ each →
//	         2.265872 / 2.277664.
//	17 50.5: g −0.0289 ≤ 0. Paper: the fifth event in a row with g ≤ 0
//	         (13–17): hyper, + 5δ = 2.315872. ns-3: fifth increase since
//	         the cut at 12: + δ = 2.287664.
//	18 50.25: paper still hyper: 2.365872; ns-3 sixth increase: + 5δ =
//	         2.337664.
func TestGoldenTrace(t *testing.T) {
	rtts := []float64{30, 600, 400, 420, 40, 40, 40, 40, 40, 40, 60, 58, 56, 54, 52, 51, 50.5, 50.25}
	paper := Paper(10 * congestion.Gbps)
	paper.Segment = 10_000
	for _, p := range []struct {
		name string
		cfg  Config
		want []float64
	}{
		{"paper", paper, []float64{10, 8.666666666666666, 8.676666666666666, 7.490403645833333,
			7.500403645833333, 7.510403645833333, 7.520403645833333, 7.530403645833333, 7.540403645833333, 7.550403645833333,
			2.265503674824795, 2.225871709728852, 2.2358717097288516, 2.245871709728852, 2.2558717097288516, 2.265871709728852,
			2.3158717097288517, 2.365871709728852}},
		{"artifact", Artifact(10 * congestion.Gbps), []float64{10, 8.666666666666666, 8.676666666666666, 7.490403645833333,
			7.500403645833333, 7.510403645833333, 7.520403645833333, 7.530403645833333, 7.540403645833333, 7.590403645833333,
			2.277505701636037, 2.237663777089156, 2.2476637770891563, 2.257663777089156, 2.2676637770891563, 2.277663777089156,
			2.2876637770891564, 2.337663777089156}},
	} {
		c := mustNew(t, p.cfg)
		for i, r := range rtts {
			c.OnPacketSent(0, 10_000)
			c.OnAck(0, congestion.Ack{Bytes: 10_000, RTT: time.Duration(r * 1000)})
			if !near(c.Rate().Gbps(), p.want[i], 1e-9) {
				t.Fatalf("%s event %d (RTT %v µs): rate %.12f Gb/s, want %.12f", p.name, i+1, r, c.Rate().Gbps(), p.want[i])
			}
			switch i + 1 {
			case 3:
				if c.RTTDiff() != -112656*time.Nanosecond || c.Gradient() != -5.6328125 {
					t.Fatalf("%s event 3: rtt_diff %v gradient %v", p.name, c.RTTDiff(), c.Gradient())
				}
			case 4:
				if c.Gradient() != 0.1708984375 {
					t.Fatalf("%s event 4: gradient %v", p.name, c.Gradient())
				}
			}
		}
		hyper := uint64(2)
		if c.Events != 17 || c.HighDecreases != 1 || c.GradientDecreases != 3 || c.LowIncreases != 6 || c.HyperIncreases != hyper {
			t.Fatalf("%s: counters %+v", p.name, c.Counters)
		}
	}
}

// Per-RTT events: only the first ACK acknowledging data sent after the last
// event is one; the ACKs before it change nothing.
func TestOneEventPerRTT(t *testing.T) {
	c := mustNew(t, Artifact(100*congestion.Gbps))
	for i := 0; i < 10; i++ {
		c.OnPacketSent(0, 1000)
	}
	c.OnAck(0, congestion.Ack{Bytes: 1000, RTT: 10 * time.Microsecond}) // first: records
	for i := 0; i < 9; i++ {
		c.OnAck(0, congestion.Ack{Bytes: 1000, RTT: 600 * time.Microsecond})
	}
	if c.Events != 0 || c.Rate().Gbps() != 100 {
		t.Fatalf("ACKs inside the first RTT made %d events, rate %v", c.Events, c.Rate().Gbps())
	}
	c.OnPacketSent(0, 1000)
	c.OnAck(0, congestion.Ack{Bytes: 1000, RTT: 600 * time.Microsecond})
	if c.Events != 1 || c.HighDecreases != 1 {
		t.Fatalf("the ACK past the RTT made no event: %+v", c.Counters)
	}
	// Segment events: 16 KB segments, 1000-byte ACKs: an event at the
	// boundaries 0 (first), 16384, 32768, …
	s := mustNew(t, Paper(100*congestion.Gbps))
	for i := 0; i < 40; i++ {
		s.OnPacketSent(0, 1000)
		s.OnAck(0, congestion.Ack{Bytes: 1000, RTT: 30 * time.Microsecond})
	}
	if s.Events != 2 { // acked 1000 (first), 17000, 33000 — 40,000 bytes: two events after the first
		t.Fatalf("segment events %d, want 2", s.Events)
	}
}

func TestBoundsAndValidate(t *testing.T) {
	c := mustNew(t, Artifact(100*congestion.Gbps))
	c.OnPacketSent(0, 1000)
	c.OnAck(0, congestion.Ack{Bytes: 1000, RTT: 100 * time.Microsecond})
	for i := 0; i < 100; i++ {
		c.OnPacketSent(0, 1000)
		c.OnAck(0, congestion.Ack{Bytes: 1000, RTT: time.Duration(100+50*i) * time.Microsecond})
	}
	if c.Rate() != c.Config().MinRate {
		t.Fatalf("rising RTTs left the rate at %v, want the floor", c.Rate())
	}
	bad := []func(*Config){
		func(c *Config) { c.LineRate = 0 },
		func(c *Config) { c.THigh = c.TLow },
		func(c *Config) { c.MinRTT = 0 },
		func(c *Config) { c.Alpha = 0 },
		func(c *Config) { c.Beta = math.NaN() },
		func(c *Config) { c.HAIFactor = 0 },
		func(c *Config) { c.Segment = -1 },
	}
	for i, f := range bad {
		cfg := Paper(10 * congestion.Gbps)
		f(&cfg)
		if _, err := New(cfg); err == nil {
			t.Errorf("bad config %d accepted", i)
		}
	}
}

func TestAllocFree(t *testing.T) {
	c := mustNew(t, Artifact(100*congestion.Gbps))
	i := 0
	allocs := testing.AllocsPerRun(1000, func() {
		i++
		c.OnPacketSent(0, 1000)
		c.OnAck(0, congestion.Ack{Bytes: 1000, RTT: time.Duration(20+i%40) * time.Microsecond})
		_ = c.Rate()
	})
	if allocs != 0 {
		t.Fatalf("%.1f allocations per ACK", allocs)
	}
}

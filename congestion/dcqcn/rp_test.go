package dcqcn

import (
	"math"
	"testing"
	"time"

	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/congestion"
)

const us = clock.Time(time.Microsecond)

func near(got, want, tol float64) bool { return math.Abs(got-want) <= tol }

func mustRP(t *testing.T, cfg Config) *RP {
	t.Helper()
	r, err := NewRP(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// runTo drives r's timers the way the engine does: OnTimer at each
// deadline up to end.
func runTo(r *RP, end clock.Time) {
	for d := r.Deadline(); d <= end; d = r.Deadline() {
		r.OnTimer(d)
	}
}

// Golden numbers: paper profile at 40 Gb/s, one CNP at t = 0.
func TestPaperSingleCNPGolden(t *testing.T) {
	r := mustRP(t, Paper(40*congestion.Gbps))
	if r.Deadline() != clock.Never {
		t.Fatalf("a QP that never saw a CNP arms a timer at %v", r.Deadline())
	}
	r.OnCNP(0)
	if r.Rate().Gbps() != 20 || r.Target().Gbps() != 40 || r.Alpha() != 1 {
		t.Fatalf("after CNP: R_C %v R_T %v α %v, want 20, 40, 1", r.Rate().Gbps(), r.Target().Gbps(), r.Alpha())
	}
	want := []struct {
		at   clock.Time
		rate float64
	}{
		{55 * us, 30}, {110 * us, 35}, {165 * us, 37.5}, {220 * us, 38.75}, {275 * us, 39.375},
		{330 * us, 39.6875}, {385 * us, 39.84375},
	}
	for _, w := range want {
		if d := r.Deadline(); d != w.at {
			t.Fatalf("next increase at %v, want %v", d, w.at)
		}
		r.OnTimer(w.at)
		if got := r.Rate().Gbps(); got != w.rate {
			t.Fatalf("at %v: R_C = %v Gb/s, want exactly %v", w.at, got, w.rate)
		}
		if w.at == 275*us {
			// α after five K periods: (255/256)^5 = 0.980621.
			a := r.Alpha()
			if !near(a, math.Pow(255.0/256, 5), 1e-15) || !near(a, 0.980621, 5e-7) {
				t.Fatalf("α(275 µs) = %.9f, want 0.980621", a)
			}
		}
	}
	if r.FastRecovery != 5 || r.AdditiveIncrease != 2 || r.HyperIncrease != 0 {
		t.Fatalf("stages FR/AI/HAI = %d/%d/%d, want 5/2/0", r.FastRecovery, r.AdditiveIncrease, r.HyperIncrease)
	}
	if r.Target().Gbps() != 40 {
		t.Fatalf("R_T = %v, want capped at 40", r.Target().Gbps())
	}
	if a := r.AlphaAt(385 * us); !near(a, math.Pow(255.0/256, 7), 1e-15) {
		t.Fatalf("α(385 µs) = %.9f, want seven decays", a)
	}
	if r.RPCNPHandled != 1 || r.Cuts != 1 {
		t.Fatalf("counters %+v", r.RPCounters)
	}
}

// §5.2: CNPs at 0 and 100 µs; the α timer fired once (55 µs) in between.
func TestPaperTwoCNPGolden(t *testing.T) {
	r := mustRP(t, Paper(40*congestion.Gbps))
	r.OnCNP(0)
	runTo(r, 100*us)
	r.OnCNP(100 * us)
	if !near(r.Rate().Gbps(), 15.058594, 5e-7) || r.Rate().Gbps() != 15.05859375 {
		t.Fatalf("R_C = %.9f, want 15.058594 (exactly 15.05859375)", r.Rate().Gbps())
	}
	if r.Target().Gbps() != 30 {
		t.Fatalf("R_T = %v, want 30", r.Target().Gbps())
	}
	if !near(r.Alpha(), 0.996109, 5e-7) {
		t.Fatalf("α = %.9f, want 0.996109", r.Alpha())
	}
	// K restarts at the cut: next decay at 155 µs, next increase at 155 µs.
	if r.Deadline() != 155*us {
		t.Fatalf("deadline %v, want 155µs", r.Deadline())
	}
	if a := r.AlphaAt(154 * us); a != r.Alpha() {
		t.Fatalf("α decayed before K elapsed: %v", a)
	}
}

// ns3-rdma's order: α is raised before the cut, which then uses the new α.
func TestAlphaThenCutOrder(t *testing.T) {
	cfg := Paper(40 * congestion.Gbps)
	cfg.Order = AlphaThenCut
	r := mustRP(t, cfg)
	r.OnCNP(0)
	runTo(r, 100*us)
	r.OnCNP(100 * us)
	a := (255.0/256)*(255.0/256) + 1.0/256
	if want := 30 * (1 - a/2); !near(r.Rate().Gbps(), want, 1e-9) {
		t.Fatalf("R_C = %v, want %v", r.Rate().Gbps(), want)
	}
}

// §5.2 hpcc-mlx at 100 Gb/s: α on a 1 µs clock, cut at the 4 µs boundary,
// no target clamp at timer stage 0, timer-only stages with F = 1.
func TestHPCCMellanoxGolden(t *testing.T) {
	r := mustRP(t, HPCCMellanox(100*congestion.Gbps))
	r.OnCNP(0)
	if r.Rate().Gbps() != 100 || r.Deadline() != 4*us {
		t.Fatalf("first CNP must only schedule the cut: rate %v deadline %v", r.Rate().Gbps(), r.Deadline())
	}
	r.OnTimer(4 * us)
	if !near(r.Alpha(), 0.984466, 5e-7) {
		t.Fatalf("α at the cut = %.7f, want 0.984466", r.Alpha())
	}
	if !near(r.Rate().Gbps(), 50.776684, 5e-7) || r.Target().Gbps() != 100 {
		t.Fatalf("after cut R_C %.7f R_T %v, want 50.776684, 100", r.Rate().Gbps(), r.Target().Gbps())
	}
	steps := []struct {
		at   clock.Time
		rate float64
	}{{304 * us, 75.388342}, {604 * us, 87.694171}, {904 * us, 93.847086}, {1204 * us, 96.923543}, {1504 * us, 98.461771}}
	for _, s := range steps {
		if r.Deadline() != s.at {
			t.Fatalf("next event %v, want %v", r.Deadline(), s.at)
		}
		r.OnTimer(s.at)
		if !near(r.Rate().Gbps(), s.rate, 5e-7) {
			t.Fatalf("at %v R_C = %.7f, want %v", s.at, r.Rate().Gbps(), s.rate)
		}
		if s.at == 304*us && !near(r.Alpha(), 0.304274, 5e-7) {
			t.Fatalf("α(304 µs) = %.7f, want 0.304274", r.Alpha())
		}
	}
	if r.FastRecovery != 1 || r.AdditiveIncrease != 1 || r.HyperIncrease != 3 {
		t.Fatalf("FR/AI/HAI = %d/%d/%d, want 1/1/3", r.FastRecovery, r.AdditiveIncrease, r.HyperIncrease)
	}
}

// CNPs inside one rate_reduce_monitor_period are coalesced into one cut and
// counted as rp_cnp_ignored; a CNP after the cut arms the next boundary.
func TestMonitorPeriodCoalescing(t *testing.T) {
	r := mustRP(t, HPCCMellanox(100*congestion.Gbps))
	r.OnCNP(0)
	r.OnCNP(1 * us)
	r.OnCNP(3 * us)
	r.OnTimer(4 * us)
	if r.Cuts != 1 || r.RPCNPHandled != 1 || r.RPCNPIgnored != 2 {
		t.Fatalf("after 3 CNPs in one period: %+v", r.RPCounters)
	}
	r.OnCNP(5 * us) // on the grid 0,4,8,...: cut at 8 µs
	if r.Deadline() != 8*us {
		t.Fatalf("cut scheduled at %v, want 8µs", r.Deadline())
	}
	before := r.Rate()
	r.OnTimer(8 * us)
	if r.Cuts != 2 || r.Rate() >= before {
		t.Fatalf("second cut missing: %+v rate %v→%v", r.RPCounters, before, r.Rate())
	}
	// α ticks every µs; a tick raises α if a CNP arrived since the previous
	// one, except the first CNP, which only set α to 1. CNPs at 1 (after
	// that instant's tick), 3 and 5 µs raise the ticks at 2, 4 and 6 µs.
	g := 1.0 / 256
	a := 1.0
	for tick := 1; tick <= 8; tick++ {
		if tick == 2 || tick == 4 || tick == 6 {
			a = (1-g)*a + g
		} else {
			a *= 1 - g
		}
	}
	if !near(r.Alpha(), a, 1e-12) {
		t.Fatalf("α = %v, want %v", r.Alpha(), a)
	}
}

// ConnectX knobs: rpg_min_dec_fac bounds a cut; α saturates in its 10-bit
// range; defaults carry the mlx5 names and values.
func TestConnectXKnobs(t *testing.T) {
	cx := DefaultConnectX()
	for name, want := range map[string]uint32{
		"rpg_time_reset": 300, "rpg_byte_reset": 32767, "rpg_threshold": 1, "rpg_ai_rate": 5,
		"rpg_hai_rate": 50, "rpg_min_dec_fac": 50, "rpg_min_rate": 1, "rpg_gd": 11,
		"rate_reduce_monitor_period": 4, "dce_tcp_g": 1019, "dce_tcp_rtt": 1, "initial_alpha_value": 1023,
		"rate_to_set_on_first_cnp": 0, "clamp_tgt_rate": 0, "clamp_tgt_rate_after_time_inc": 1,
		"min_time_between_cnps": 4, "cnp_dscp": 48, "cnp_802p_prio": 6,
	} {
		if got, ok := cx.Get(name); !ok || got != want {
			t.Errorf("%s = %d (known %v), want %d", name, got, ok, want)
		}
	}
	if err := cx.Set("rpg_gd", 12); err == nil {
		t.Error("rpg_gd = 12 accepted")
	}
	if err := cx.Set("no_such_knob", 1); err == nil {
		t.Error("unknown knob accepted")
	}

	// With rpg_min_dec_fac = 95 the first cut is exactly 5 %.
	if err := cx.Set("rpg_min_dec_fac", 95); err != nil {
		t.Fatal(err)
	}
	r := mustRP(t, cx.Config(100*congestion.Gbps))
	r.OnCNP(0)
	runTo(r, 4*us)
	if r.Cuts != 1 || !near(r.Rate().Gbps(), 95, 1e-9) {
		t.Fatalf("cut with min_dec_fac 95: %v Gb/s, want 95", r.Rate().Gbps())
	}
	// With the default 50 the cut is α/2.
	r = mustRP(t, DefaultConnectX().Config(100*congestion.Gbps))
	r.OnCNP(0)
	runTo(r, 4*us)
	a := 1023.0 / 1024 * math.Pow(1019.0/1024, 4)
	if !near(r.Rate().Gbps(), 100*(1-a/2), 1e-9) {
		t.Fatalf("cut = %v Gb/s, want %v", r.Rate().Gbps(), 100*(1-a/2))
	}
	// α with a CNP in every dce_tcp_rtt from 1023/1024 saturates there.
	r = mustRP(t, DefaultConnectX().Config(100*congestion.Gbps))
	r.OnCNP(0)
	for i := clock.Time(1); i <= 3; i++ {
		r.OnCNP(i*us - 1)
	}
	r.OnTimer(3 * us)
	if got := r.Alpha(); got != 1023.0/1024 && got > 1023.0/1024 {
		t.Fatalf("α = %v exceeds 1023/1024", got)
	}
	r2 := mustRP(t, DefaultConnectX().Config(100*congestion.Gbps))
	r2.OnCNP(0)
	r2.OnCNP(500) // flag for the tick at 1 µs
	r2.OnTimer(1 * us)
	if r2.AlphaAt(1*us) != 1023.0/1024 {
		t.Fatalf("α after a period with a CNP = %v, want saturated 1023/1024", r2.AlphaAt(1*us))
	}
}

// rate_to_set_on_first_cnp replaces the first cut.
func TestRateOnFirstCNP(t *testing.T) {
	cx := DefaultConnectX()
	if err := cx.Set("rate_to_set_on_first_cnp", 85000); err != nil {
		t.Fatal(err)
	}
	r := mustRP(t, cx.Config(100*congestion.Gbps))
	r.OnCNP(0)
	if r.Rate().Gbps() != 85 || r.Target().Gbps() != 85 || r.Cuts != 0 {
		t.Fatalf("rate %v target %v cuts %d", r.Rate().Gbps(), r.Target().Gbps(), r.Cuts)
	}
}

// The byte counter: every B bytes is an increase event; with both counters
// past F the RP enters hyper increase with a step growing by R_HAI.
func TestByteCounterAndHyperIncrease(t *testing.T) {
	cfg := Paper(40 * congestion.Gbps)
	cfg.ByteCounter = 10_000
	cfg.TimerPeriod = time.Hour // the byte counter alone
	r := mustRP(t, cfg)
	r.OnCNP(0)
	r.OnCNP(1) // R_C 20 → ~10, R_T 20
	now := clock.Time(2)
	for i := 0; i < 5*10; i++ { // 5 byte events: FR
		r.OnPacketSent(now, 1000)
	}
	if r.FastRecovery != 5 || r.AdditiveIncrease != 0 {
		t.Fatalf("after 5 byte events FR/AI = %d/%d", r.FastRecovery, r.AdditiveIncrease)
	}
	rt := r.Target()
	r.OnPacketSent(now, 10_000) // BC = 6 > F, T = 0: AI
	if r.AdditiveIncrease != 1 || r.Target() != rt+cfg.AIRate {
		t.Fatalf("AI: R_T %v → %v", rt, r.Target())
	}
	// Now let the timer also pass F: the next event is HAI with i = min−F.
	cfg2 := Paper(40 * congestion.Gbps)
	cfg2.ByteCounter = 10_000
	r = mustRP(t, cfg2)
	r.OnCNP(0)
	r.OnCNP(1)
	for k := clock.Time(1); k <= 6; k++ {
		r.OnTimer(1 + k*55*us) // T = 6
		r.OnPacketSent(1+k*55*us, 10_000)
	}
	// Events alternate timer/byte; the byte event of k=6 is the first with
	// min(T,BC) = 6 > 5: i = 1.
	if r.HyperIncrease != 1 {
		t.Fatalf("HAI events = %d, want 1 (%+v)", r.HyperIncrease, r.RPCounters)
	}
	rt = r.Target()
	r.OnTimer(1 + 7*55*us)            // T = 7, BC = 6: i = 1
	r.OnPacketSent(1+7*55*us, 10_000) // T = 7, BC = 7: i = 2
	if want := min(rt+3*cfg2.HAIRate, cfg2.LineRate); r.Target() != want {
		t.Fatalf("R_T after HAI steps of 1 and 2 R_HAI: %v, want %v", r.Target(), want)
	}
}

// Rates never fall below MinRate, and the timer stops once the rate is back
// at line rate.
func TestMinRateAndSaturation(t *testing.T) {
	cfg := Paper(40 * congestion.Gbps)
	cfg.MinRate = 5 * congestion.Gbps
	r := mustRP(t, cfg)
	for i := clock.Time(0); i < 20; i++ {
		r.OnCNP(i)
	}
	if r.Rate() != cfg.MinRate {
		t.Fatalf("rate %v after 20 CNPs, want floor %v", r.Rate(), cfg.MinRate)
	}
	runTo(r, 100*clock.Time(time.Millisecond))
	if r.Rate() != cfg.LineRate || r.Deadline() != clock.Never {
		t.Fatalf("after recovery rate %v deadline %v", r.Rate(), r.Deadline())
	}
	// A caller that sleeps through many expiries catches up in one call.
	r2 := mustRP(t, Paper(40*congestion.Gbps))
	r2.OnCNP(0)
	r2.OnTimer(1 * clock.Time(time.Second))
	if r2.Rate() != 40*congestion.Gbps || r2.Deadline() != clock.Never {
		t.Fatalf("late caller: rate %v deadline %v", r2.Rate(), r2.Deadline())
	}
}

func TestValidate(t *testing.T) {
	bad := []func(*Config){
		func(c *Config) { c.LineRate = 0 },
		func(c *Config) { c.G = 0 },
		func(c *Config) { c.AlphaPeriod = 0 },
		func(c *Config) { c.TimerPeriod = -1 },
		func(c *Config) { c.DecreaseFactor = 2 },
		func(c *Config) { c.InitialAlpha = 2 },
		func(c *Config) { c.MinRate = 100 * congestion.Gbps },
		func(c *Config) { c.G = math.NaN() },
	}
	for i, f := range bad {
		c := Paper(40 * congestion.Gbps)
		f(&c)
		if _, err := NewRP(c); err == nil {
			t.Errorf("bad config %d accepted", i)
		}
	}
	for _, c := range []Config{Paper(40 * congestion.Gbps), HPCCMellanox(100 * congestion.Gbps), DefaultConnectX().Config(25 * congestion.Gbps)} {
		if err := c.Validate(); err != nil {
			t.Errorf("profile rejected: %v", err)
		}
	}
}

func TestRPAllocFree(t *testing.T) {
	for _, cfg := range []Config{Paper(40 * congestion.Gbps), DefaultConnectX().Config(100 * congestion.Gbps)} {
		r := mustRP(t, cfg)
		now := clock.Time(0)
		allocs := testing.AllocsPerRun(2000, func() {
			now += 700
			r.OnPacketSent(now, 1024)
			if now%(7*us) < 700 {
				r.OnCNP(now)
			}
			if d := r.Deadline(); d <= now {
				r.OnTimer(now)
			}
			_ = r.Rate()
		})
		if allocs != 0 {
			t.Fatalf("RP allocates %.1f per event", allocs)
		}
	}
}

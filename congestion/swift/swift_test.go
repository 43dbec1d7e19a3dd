package swift

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

// golden is the trace's configuration: flow scaling over 0.25–100 packets
// with a 19 µs range gives round numbers, α = 19/(1/√0.25 − 1/√100) = 19/1.9
// = 10 µs and β' = −10/√100 = −1 µs, so the flow-scaling term is
// 10/√cwnd − 1 µs: 4 µs at 0.25 packets, 1 µs at 25, 1.5 at 16, 3 at 6.25.
func golden() Config {
	c := Default(1000, 100*congestion.Gbps, 10*us, 8*us, 1*us, 19*us)
	c.FSMinCwnd, c.FSMaxCwnd = 0.25, 100
	c.EndpointTarget = 50 * us
	c.InitCwnd, c.MaxCwnd = 25, 1000
	return c
}

// The golden single-flow trace, by hand from Algorithm 1 (target =
// 8 µs + 2 hops·1 µs + (10/√fcwnd − 1) µs; srtt ← srtt + (rtt − srtt)/8;
// HostDelay 0, so the endpoint window only grows, by 1/ecwnd per packet):
//
//	t=100 µs RTT 20: srtt 20; target(25) = 8+2+(2−1) = 11; 20 ≥ 11 and no
//	  decrease yet: fcwnd = 25·max(1 − 0.8·9/20, 0.5) = 25·0.64 = 16;
//	  t_last_decrease = 100.
//	t=110 RTT 12: srtt 19; target(16) = 10 + 2.5 − 1 = 11.5; 12 ≥ 11.5 but
//	  110 − 100 = 10 < 19: no decrease, fcwnd 16.
//	t=111 RTT 11, 144 packets acknowledged: srtt 18; 11 < 11.5:
//	  fcwnd = 16 + 1/16·144 = 25.
//	t=130 RTT 30: srtt 19.5; 30 ≥ 19.5 since the last decrease; target 11:
//	  1 − 0.8·19/30 = 0.4933 < 1 − max_mdf: fcwnd = 25·0.5 = 12.5.
//	t=200, 250, 300, 360, RTT 100 each: srtt 29.5625, 38.3671875,
//	  46.0712890625, 52.8123779296875; each time ≥ srtt since the last cut
//	  and 100 ≫ target, so max_mdf binds: 6.25, 3.125, 1.5625, 0.78125.
//	  Below one packet Swift paces: rate = 0.78125·1000·8 bits per
//	  52.8123779296875 µs = 118.343469 Mb/s; window 781 bytes.
//	t=361 RTT 15: srtt 48.0858306884765625; target(0.78125) = 10 +
//	  10/0.883883 − 1 = 20.3137 > 15: below one packet AI adds ai per
//	  packet: fcwnd = 0.78125 + 1 = 1.78125; rate back to line rate.
func TestGoldenTrace(t *testing.T) {
	c := mustNew(t, golden())
	step := func(at, rtt time.Duration, bytes int, f float64) {
		t.Helper()
		c.OnAck(clock.Time(at), congestion.Ack{Bytes: bytes, RTT: rtt, Hops: 2})
		if !near(c.FabricCwnd(), f, 1e-12) {
			t.Fatalf("t=%v: fcwnd %.15f, want %v", at, c.FabricCwnd(), f)
		}
	}
	step(100*us, 20*us, 1000, 16)
	if c.Target() != 11*us || c.SRTT() != 20*us || c.EndpointCwnd() != 25.04 {
		t.Fatalf("t=100: target %v srtt %v ecwnd %v", c.Target(), c.SRTT(), c.EndpointCwnd())
	}
	step(110*us, 12*us, 1000, 16)
	if c.Target() != 11500*time.Nanosecond || c.Blocked != 1 {
		t.Fatalf("t=110: target %v, blocked %d", c.Target(), c.Blocked)
	}
	step(111*us, 11*us, 144_000, 25)
	step(130*us, 30*us, 1000, 12.5)
	for _, s := range []struct {
		at   time.Duration
		srtt float64
		f    float64
	}{{200 * us, 29.5625, 6.25}, {250 * us, 38.3671875, 3.125}, {300 * us, 46.0712890625, 1.5625}, {360 * us, 52.8123779296875, 0.78125}} {
		step(s.at, 100*us, 1000, s.f)
		if c.srtt != s.srtt*1000 {
			t.Fatalf("t=%v: srtt %v, want %v µs", s.at, c.SRTT(), s.srtt)
		}
	}
	if c.Cwnd() != 0.78125 || c.Window() != 781 || !near(float64(c.Rate())/1e6, 118.343469, 5e-7) {
		t.Fatalf("below one packet: cwnd %v window %d rate %v Mb/s, want 0.78125, 781, 118.343469", c.Cwnd(), c.Window(), float64(c.Rate())/1e6)
	}
	if want := 6250 / 52.8123779296875e-6; float64(c.Rate()) != want {
		t.Fatalf("pacing rate %v, want cwnd·MSS·8/srtt = %v", float64(c.Rate()), want)
	}
	step(361*us, 15*us, 1000, 1.78125)
	if c.Rate() != 100*congestion.Gbps || !near(c.lastTarget/1e3, 20.3137, 5e-5) {
		t.Fatalf("t=361: rate %v target %v", c.Rate(), c.Target())
	}
	// Nine ACKs: the endpoint window grew on each, the fabric window grew at
	// 111 and 361, was cut six times and held back once.
	if c.Decreases != 6 || c.Increases != 9+2 || c.Blocked != 1 {
		t.Fatalf("counters %+v", c.Counters)
	}
}

// The endpoint window answers the host delay against its own target, and
// the sender uses the smaller window.
func TestEndpointWindow(t *testing.T) {
	cfg := golden()
	cfg.EndpointTarget = 20 * us
	c := mustNew(t, cfg)
	c.OnAck(clock.Time(100*us), congestion.Ack{Bytes: 1000, RTT: 40 * us, HostDelay: 30 * us, Hops: 2})
	// Fabric delay 10 µs < target(25) = 11: fcwnd = 25 + 1/25 = 25.04.
	// Endpoint delay 30 µs ≥ 20: ecwnd = 25·max(1 − 0.8·10/30, 0.5) = 18.333….
	if !near(c.FabricCwnd(), 25.04, 1e-12) || !near(c.EndpointCwnd(), 25*(1-0.8/3), 1e-12) || c.Cwnd() != c.EndpointCwnd() {
		t.Fatalf("fcwnd %v ecwnd %v cwnd %v", c.FabricCwnd(), c.EndpointCwnd(), c.Cwnd())
	}
	if c.Window() != int64(c.EndpointCwnd()*1000) {
		t.Fatalf("window %d follows the smaller window", c.Window())
	}
}

// Loss: fast recovery and a timeout cut by max_mdf once per RTT; five
// timeouts in a row reset the window to its minimum.
func TestRetransmit(t *testing.T) {
	c := mustNew(t, golden())
	c.OnAck(0, congestion.Ack{Bytes: 1000, RTT: 10 * us, Hops: 2}) // srtt 10 µs, +1/25
	c.OnRetransmit(clock.Time(1*us), false)
	if !near(c.Cwnd(), 25.04*0.5, 1e-12) {
		t.Fatalf("fast recovery: cwnd %v", c.Cwnd())
	}
	c.OnRetransmit(clock.Time(2*us), true) // within one RTT of the cut: held
	if !near(c.Cwnd(), 12.52, 1e-12) {
		t.Fatalf("second cut inside an RTT: cwnd %v", c.Cwnd())
	}
	for i := 0; i < 4; i++ {
		c.OnRetransmit(clock.Time(time.Duration(100+100*i)*us), true)
	}
	if c.Cwnd() != c.Config().MinCwnd || c.Resets != 1 {
		t.Fatalf("after five timeouts cwnd %v resets %d", c.Cwnd(), c.Resets)
	}
	if r := c.Rate(); !(r > 0 && r < c.Config().LineRate) {
		t.Fatalf("pacing rate at the minimum window: %v", r)
	}
}

// The paper's flow scaling range: α/√cwnd + β' is fs_range at fs_min_cwnd
// and 0 at fs_max_cwnd, clamped outside; hops add h each.
func TestFlowAndTopologyScaling(t *testing.T) {
	cfg := Default(1000, 100*congestion.Gbps, 10*us, 10*us, 2*us, 50*us)
	c := mustNew(t, cfg)
	for _, x := range []struct {
		hops int
		w    float64
		want time.Duration
	}{{0, 0.1, 60 * us}, {0, 0.01, 60 * us}, {0, 100, 10 * us}, {0, 1000, 10 * us}, {3, 100, 16 * us}} {
		if got := c.FabricTarget(x.hops, x.w); got < x.want-1 || got > x.want+1 {
			t.Errorf("target(%d hops, cwnd %v) = %v, want %v", x.hops, x.w, got, x.want)
		}
	}
	// In between it is monotone: smaller windows get more room.
	if !(c.FabricTarget(0, 1) > c.FabricTarget(0, 10)) {
		t.Error("flow scaling does not grow as the window shrinks")
	}
}

func TestValidate(t *testing.T) {
	bad := []func(*Config){
		func(c *Config) { c.MSS = 0 },
		func(c *Config) { c.BaseTarget = 0 },
		func(c *Config) { c.FSMinCwnd = c.FSMaxCwnd },
		func(c *Config) { c.MaxMDF = 1 },
		func(c *Config) { c.InitCwnd = 0 },
		func(c *Config) { c.RTTGain = 0 },
		func(c *Config) { c.Beta = math.NaN() },
	}
	for i, f := range bad {
		cfg := golden()
		f(&cfg)
		if _, err := New(cfg); err == nil {
			t.Errorf("bad config %d accepted", i)
		}
	}
}

func TestAllocFree(t *testing.T) {
	c := mustNew(t, golden())
	now := clock.Time(0)
	allocs := testing.AllocsPerRun(1000, func() {
		now += 1000
		c.OnPacketSent(now, 1000)
		c.OnAck(now, congestion.Ack{Bytes: 1000, RTT: time.Duration(5+now%20_000/1000) * us, Hops: 3})
		_, _ = c.Rate(), c.Window()
	})
	if allocs != 0 {
		t.Fatalf("%.1f allocations per ACK", allocs)
	}
}

package swift

import (
	"math"
	"testing"
	"time"

	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/congestion"
)

// Fabric on the DCQCN paper's two-flow fabric as the simulator builds it
// (40 Gb/s, 1000-byte packets, hop RTT 2.2 µs, base RTT 4.4 µs): base
// target 2.2 µs + ten packets (2 µs) = 4.2 µs, 2.2 µs per hop, flow
// scaling up to 21 µs, a start window of one BDP (22 packets).
func TestFabric(t *testing.T) {
	c := Fabric(1000, 40*congestion.Gbps, 4400*time.Nanosecond, 2200*time.Nanosecond)
	if c.BaseTarget != 4200*time.Nanosecond || c.HopScale != 2200*time.Nanosecond || c.FSRange != 21*us ||
		c.EndpointTarget != c.BaseTarget || c.InitCwnd != 22 || c.MSS != 1000 {
		t.Fatalf("%+v", c)
	}
}

// A dilated Swift sees the same windows when every delay it is fed is s
// times longer, at a rate s times lower.
func TestDilate(t *testing.T) {
	const s = 400
	base := Fabric(1000, 40*congestion.Gbps, 4400*time.Nanosecond, 2200*time.Nanosecond)
	a, b := mustNew(t, base), mustNew(t, base.Dilate(s))
	if b.Config().LineRate != 100*congestion.Mbps || b.Config().BaseTarget != 1680*us || b.Config().InitCwnd != 22 {
		t.Fatalf("dilated %+v", b.Config())
	}
	now := time.Duration(0)
	for i := 0; i < 2000; i++ {
		now += time.Duration(1+i%7) * us
		rtt := time.Duration(4000+(i*7919)%9000) * time.Nanosecond
		host := time.Duration(i%5) * time.Microsecond / 2
		a.OnAck(clock.Time(now), congestion.Ack{Bytes: 1000 * (1 + i%3), RTT: rtt, HostDelay: host, Hops: 1})
		b.OnAck(clock.Time(now*s), congestion.Ack{Bytes: 1000 * (1 + i%3), RTT: rtt * s, HostDelay: host * s, Hops: 1})
		if i%300 == 0 {
			a.OnRetransmit(clock.Time(now), i%600 == 0)
			b.OnRetransmit(clock.Time(now*s), i%600 == 0)
		}
		if d := math.Abs(a.Cwnd()-b.Cwnd()) / a.Cwnd(); d > 1e-9 {
			t.Fatalf("step %d: cwnd %v dilated %v", i, a.Cwnd(), b.Cwnd())
		}
		if d := math.Abs(float64(a.Rate())/s-float64(b.Rate())) / float64(b.Rate()); d > 1e-9 {
			t.Fatalf("step %d: rate %v dilated %v", i, a.Rate(), b.Rate())
		}
	}
	if a.Decreases == 0 || a.Increases == 0 || a.Decreases != b.Decreases {
		t.Fatalf("counters %+v, dilated %+v", a.Counters, b.Counters)
	}
	if c := base.Dilate(0); c != base {
		t.Fatal("Dilate(0) changed the config")
	}
}

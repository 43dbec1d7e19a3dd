package timely

import (
	"math"
	"testing"
	"time"

	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/congestion"
)

// A dilated TIMELY takes the same branches, at a rate s times lower, when
// every RTT it is fed is s times longer.
func TestDilate(t *testing.T) {
	const s = 400
	for _, base := range []Config{Paper(40 * congestion.Gbps), Artifact(40 * congestion.Gbps)} {
		a, _ := New(base)
		b, err := New(base.Dilate(s))
		if err != nil || b.Config().TLow != 20*time.Millisecond || b.Config().LineRate != 100*congestion.Mbps {
			t.Fatalf("dilated %+v, %v", b.Config(), err)
		}
		now := time.Duration(0)
		for i := 0; i < 3000; i++ {
			now += 3 * time.Microsecond
			rtt := time.Duration(30_000+(i*7919)%500_000) * time.Nanosecond
			a.OnPacketSent(clock.Time(now), 4000)
			b.OnPacketSent(clock.Time(now*s), 4000)
			a.OnAck(clock.Time(now), congestion.Ack{Bytes: 4000, RTT: rtt})
			b.OnAck(clock.Time(now*s), congestion.Ack{Bytes: 4000, RTT: rtt * s})
			if d := math.Abs(float64(a.Rate())/s-float64(b.Rate())) / float64(b.Rate()); d > 1e-9 {
				t.Fatalf("step %d: rate %v dilated %v", i, a.Rate(), b.Rate())
			}
		}
		if a.Counters != b.Counters || a.HighDecreases == 0 || a.GradientDecreases == 0 {
			t.Fatalf("counters %+v, dilated %+v", a.Counters, b.Counters)
		}
	}
}

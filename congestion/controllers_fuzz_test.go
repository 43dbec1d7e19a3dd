package congestion_test

import (
	"encoding/binary"
	"math"
	"testing"
	"time"

	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/congestion"
	"github.com/softrnic/softrnic/congestion/hpcc"
	"github.com/softrnic/softrnic/congestion/swift"
	"github.com/softrnic/softrnic/congestion/timely"
)

// FuzzControllers drives HPCC, TIMELY and Swift with arbitrary ACKs — any
// byte counts, RTTs, host delays, hop counts and INT records, including
// records whose time or byte counters go backwards and paths that change
// length — and checks what the transport relies on: the rate stays a
// finite number within (0, line rate] (and above the floor where there is
// one), the window is at least one byte, and no timer is asked for.
func FuzzControllers(f *testing.F) {
	f.Add([]byte{1, 0, 10, 0, 0, 5, 3, 200, 1, 1, 0, 0, 20, 9, 9, 9})
	f.Add([]byte{0, 255, 255, 255, 255, 255, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, prog []byte) {
		line := 100 * congestion.Gbps
		hp, _ := hpcc.New(hpcc.Paper(line, 10*time.Microsecond))
		tm, _ := timely.New(timely.Paper(line))
		ta, _ := timely.New(timely.Artifact(line))
		sw, _ := swift.New(swift.Default(1000, line, 10*time.Microsecond, 5*time.Microsecond, 2*time.Microsecond, 25*time.Microsecond))
		ccs := []congestion.Controller{hp, tm, ta, sw}
		floors := []congestion.Rate{hp.Config().MinRate, tm.Config().MinRate, ta.Config().MinRate, 0}
		var ints [hpcc.MaxHops + 2]congestion.INTHop
		now := clock.Time(0)
		for i := 0; i+8 <= len(prog) && i < 8*2048; i += 8 {
			op := prog[i] % 4
			a := int64(binary.BigEndian.Uint16(prog[i+1:]))
			b := int64(binary.BigEndian.Uint16(prog[i+3:]))
			hops := int(prog[i+5]) % len(ints)
			now += clock.Time(prog[i+6]) * 37
			for h := 0; h < hops; h++ {
				ints[h] = congestion.INTHop{Rate: congestion.Rate(prog[i+7]%5) * 100 * congestion.Gbps,
					TS: now - clock.Time(b*int64(h)), TxBytes: a * int64(i-h), QLen: b * int64(prog[i+7]) * 100}
			}
			for k, c := range ccs {
				switch op {
				case 0:
					c.OnPacketSent(now, int(a))
				case 1:
					c.OnAck(now, congestion.Ack{Bytes: int(a) - 1000, RTT: time.Duration(b) * 7 * time.Nanosecond,
						HostDelay: time.Duration(a) * time.Nanosecond, Hops: hops, INT: ints[:hops], ECNEcho: a&1 == 1})
				case 2:
					c.OnCNP(now)
					c.OnTimer(now)
				case 3:
					if lr, ok := c.(congestion.LossReactor); ok {
						lr.OnRetransmit(now, a&1 == 1)
					}
				}
				r := c.Rate()
				if math.IsNaN(float64(r)) || !(r > 0 && r <= line) || r < floors[k] {
					t.Fatalf("controller %d: rate %v outside (%v, %v]", k, r, floors[k], line)
				}
				if w := c.Window(); w < 1 {
					t.Fatalf("controller %d: window %d", k, w)
				}
				if c.Deadline() != clock.Never {
					t.Fatalf("controller %d asks for a timer", k)
				}
			}
		}
	})
}

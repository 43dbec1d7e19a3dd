package dcqcn

import (
	"encoding/binary"
	"testing"

	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/congestion"
)

// FuzzRP drives reaction points of every profile with arbitrary event
// sequences — including time going backwards and absurd byte counts — and
// checks the invariants the pacer and the engine rely on: the rate stays in
// [MinRate, LineRate], the target within LineRate, α within [0, AlphaMax],
// and a deadline is never in the past of the last event.
func FuzzRP(f *testing.F) {
	f.Add([]byte{0, 0, 0, 1, 1, 0, 0, 2, 2, 0, 200, 3})
	f.Add([]byte{1, 255, 255, 255, 0, 0, 0, 0, 2, 1, 1, 1, 3, 0, 0, 0})
	f.Fuzz(func(t *testing.T, prog []byte) {
		cfgs := []Config{Paper(40 * congestion.Gbps), HPCCMellanox(100 * congestion.Gbps), DefaultConnectX().Config(25 * congestion.Gbps)}
		for _, cfg := range cfgs {
			r := mustRP(t, cfg)
			n := NewNP(PaperNP())
			now := clock.Time(0)
			for i := 0; i+4 <= len(prog) && i < 4096; i += 4 {
				op := prog[i] % 5
				arg := int64(binary.BigEndian.Uint16(prog[i+1:i+3]))*int64(prog[i+3]%8+1) - 1000
				t1 := now + clock.Time(arg)*7
				if t1 >= now { // a well-behaved caller's clock never goes back
					now = t1
				}
				switch op {
				case 0:
					r.OnCNP(now)
				case 1:
					r.OnPacketSent(now, int(arg)*100)
				case 2:
					r.OnTimer(now)
				case 3: // the engine's loop: service the deadline, jumping to it
					if d := r.Deadline(); d != clock.Never && d > now {
						now = d
					}
					r.OnTimer(now)
				case 4:
					n.OnPacket(now, arg&1 == 1)
					n.OnTimer(now)
					r.OnAck(now, congestion.Ack{Bytes: int(arg)})
				}
				rc, rt, a := r.Rate(), r.Target(), r.AlphaAt(now)
				if !(rc >= cfg.MinRate && rc <= cfg.LineRate) || !(rt <= cfg.LineRate) {
					t.Fatalf("rate %v target %v outside [%v, %v]", rc, rt, cfg.MinRate, cfg.LineRate)
				}
				if !(a >= 0 && a <= cfg.AlphaMax) {
					t.Fatalf("α = %v", a)
				}
				if d := r.Deadline(); d < now {
					t.Fatalf("deadline %v before now %v", d, now)
				}
			}
		}
	})
}

// FuzzNP drives notification points of every kind (the paper's deferred
// NP, a drop-style limiter, ns3-rdma's grid, no interval) with arbitrary
// packet sequences, serviced as the engine does, and checks that no CNP
// is sent without a mark, that CNPs are at least MinInterval apart (a
// grid NP's sit on its grid), and that a pending deadline is never in the
// past.
func FuzzNP(f *testing.F) {
	f.Add([]byte{1, 0, 1, 3, 1, 200, 0, 50, 1, 1})
	f.Add([]byte{0, 255, 1, 0, 1, 0, 1, 49, 1, 51})
	f.Fuzz(func(t *testing.T, prog []byte) {
		grid := PaperNP()
		grid.Grid = true
		drop := PaperNP()
		drop.Defer = false
		for _, cfg := range []NPConfig{PaperNP(), drop, grid, {}} {
			n := NewNP(cfg)
			p := clock.Time(cfg.MinInterval)
			now, marks := clock.Time(0), uint64(0)
			var first clock.Time = -1
			last := clock.Time(-1)
			sent := func(at clock.Time) {
				if last >= 0 && p > 0 && at-last < p {
					t.Fatalf("%+v: CNPs at %v and %v, closer than %v", cfg, last, at, p)
				}
				if cfg.Grid && p > 0 && (at-first)%p != 0 {
					t.Fatalf("grid NP: CNP at %v off the grid from %v", at, first)
				}
				last = at
			}
			for i := 0; i+2 <= len(prog) && i < 2048; i += 2 {
				now += clock.Time(prog[i]) * 1000 // up to 255 µs apart
				if d := n.Deadline(); d <= now {
					if d < last {
						t.Fatalf("deadline %v before the last CNP %v", d, last)
					}
					if n.OnTimer(d) {
						sent(d)
					}
				}
				if first < 0 {
					first = now
				}
				ce := prog[i+1]&1 == 1
				if ce {
					marks++
				}
				if n.OnPacket(now, ce) {
					sent(now)
				}
				if n.NPCNPSent > marks || n.NPECNMarkedRoCEPackets != marks {
					t.Fatalf("%+v: %d CNPs, %d marks counted, %d marks", cfg, n.NPCNPSent, n.NPECNMarkedRoCEPackets, marks)
				}
			}
		}
	})
}

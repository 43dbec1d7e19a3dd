package rc

import (
	"fmt"
	"testing"
	"time"

	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/ib"
)

// TestAllocsPerPacket: once warm, a WRITE stream between two QPs allocates
// nothing per packet in any recovery mode, lossless or losing about one
// packet in 37 (selective repeat then holds, SACKs, retransmits holes and drains;
// go-back-N NAKs and resends).
func TestAllocsPerPacket(t *testing.T) {
	modes := []pairOpts{{recovery: ib.RecoveryTimeout}, {recovery: ib.RecoveryAdaptive}, {sr: true}}
	for _, m := range modes {
		for _, lossy := range []bool{false, true} {
			name := m.recovery.String()
			if m.sr {
				name = "selective"
			}
			t.Run(fmt.Sprintf("%s_lossy%v", name, lossy), func(t *testing.T) {
				o := m
				o.mtu, o.timeout = 1024, 14
				p := newPairOpts(o)
				mr := &testMR{va: 0x100000, buf: make([]byte, 16<<10), access: ib.RemoteWrite, valid: true}
				p.memB.mrs[1] = mr
				w := ib.SendWQE{ID: 1, Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: segs(fill(16<<10, 1)), Length: 16 << 10,
					RemoteAddr: mr.va, RKey: 1}
				var now clock.Time
				x := uint32(12345) // xorshift: a loss pattern that does not line up with go-back-N
				sent := 0
				run := func() {
					for i := 0; i < 4; i++ {
						p.a.Post(&w)
					}
					for steps := 0; p.a.Outstanding() > 0; steps++ {
						if steps > 100000 {
							r := &p.a.req
							panic(fmt.Sprintf("stream stalled: now %v comp %d psn %d max %d head %d next %d tail %d B ePSN %d deadline %v %+v", now, r.compPSN, r.psn, r.maxPSN, r.head, r.next, r.tail, p.b.resp.ePSN, p.a.Deadline(), p.a.Counters))
						}
						moved := false
						for n := p.a.Build(now, p.bufA); n > 0; n = p.a.Build(now, p.bufA) {
							moved = true
							sent++
							x ^= x << 13
							x ^= x >> 17
							x ^= x << 5
							if lossy && x%37 == 0 {
								continue
							}
							p.b.Receive(now, p.bufA[:n], nil)
						}
						for n := p.b.Build(now, p.bufB); n > 0; n = p.b.Build(now, p.bufB) {
							moved = true
							p.a.Receive(now, p.bufB[:n], nil)
						}
						p.a.TakeCompletions()
						p.b.TakeCompletions()
						now = now.Add(time.Microsecond)
						if !moved {
							now = max(now, p.a.Deadline())
							p.a.Expire(now)
						}
					}
				}
				for i := 0; i < 20; i++ {
					run()
				}
				if n := testing.AllocsPerRun(20, run); n != 0 {
					t.Fatalf("%v allocations per 4 WRITEs of 16 packets", n)
				}
				if r, _ := p.a.SelectiveRepeat(); r != m.sr {
					t.Fatalf("selective repeat %v", r)
				}
				if lossy && p.a.Retransmits+p.a.SelRetrans == 0 || lossy && m.sr && p.b.SRHeld == 0 {
					t.Fatalf("nothing was retransmitted or held: %+v", p.a.Counters)
				}
			})
		}
	}
}

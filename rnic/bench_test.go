package rnic

import (
	"fmt"
	"testing"
	"time"

	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/port/memlink"
	"github.com/softrnic/softrnic/verbs"
)

// pingPair is one RC QP pair set up for streaming one kind of message.
type pingPair struct {
	tb      *testbed
	qa, qb  *QP
	src     *MR
	dst     *MR
	send    verbs.SendWR
	recv    verbs.RecvWR
	wcs     [64]ib.WC
	sent    int
	done    int
	packets int
}

func newPingPair(tb testing.TB, op ib.WROpcode, size, mtu int) *pingPair {
	p := &pingPair{tb: newTestbed(tb, memlink.Impairments{}, 1, mtu)}
	p.qa, p.qb = p.tb.connect(ib.RC, mtu, ib.LocalWrite|ib.RemoteWrite, 256)
	p.src, _ = p.tb.a.pd.RegBytes(make([]byte, size), 0, ib.LocalWrite)
	p.dst, _ = p.tb.b.pd.RegBytes(make([]byte, size), 0, ib.LocalWrite|ib.RemoteWrite)
	p.send = verbs.SendWR{Opcode: op, Flags: ib.Signaled, SG: []ib.SGE{{Addr: p.src.IOVA(), Length: uint32(size), LKey: p.src.LKey()}},
		RemoteAddr: p.dst.IOVA(), RKey: p.dst.RKey()}
	p.recv = verbs.RecvWR{SG: []ib.SGE{{Addr: p.dst.IOVA(), Length: uint32(size), LKey: p.dst.LKey()}}}
	return p
}

// stream keeps up to 128 messages in flight until n have completed, driving
// both devices in virtual time from this goroutine.
func (p *pingPair) stream(n int) {
	tb := p.tb
	target := p.done + n
	for p.done < target {
		for p.sent < target && p.sent-p.done < 128 {
			if p.send.Opcode == ib.Send {
				if _, err := p.qb.PostRecv([]verbs.RecvWR{p.recv}); err != nil {
					break
				}
			}
			if _, err := p.qa.PostSend([]verbs.SendWR{p.send}); err != nil {
				panic(err)
			}
			p.sent++
		}
		before := tb.bytes
		moved := tb.step()
		p.packets += int(tb.a.dev.Stats.TxFrames + tb.b.dev.Stats.TxFrames)
		tb.a.dev.Stats.TxFrames, tb.b.dev.Stats.TxFrames = 0, 0
		for {
			k := p.qa.init.SendCQ.Poll(p.wcs[:])
			if k == 0 {
				break
			}
			p.done += k
		}
		for p.qb.init.RecvCQ.Poll(p.wcs[:]) > 0 {
		}
		if moved {
			tb.clk.Advance(time.Duration(float64(tb.bytes-before) * nsPerByte))
			continue
		}
		next := min(tb.a.port.NextDelivery(), tb.b.port.NextDelivery(), tb.a.dev.NextDeadline(), tb.b.dev.NextDeadline())
		if next <= tb.clk.Now() {
			next = tb.clk.Now() + 1
		}
		tb.clk.Set(next)
	}
}

// TestSteadyStateAllocs asserts the per-packet path allocates nothing: a
// stream of 64-byte SENDs and of 4 KiB WRITEs through one RC pair, with
// posting, both engines, the link and polling.
func TestSteadyStateAllocs(t *testing.T) {
	for _, c := range []struct {
		op   ib.WROpcode
		size int
	}{{ib.Send, 64}, {ib.RDMAWrite, 4096}} {
		p := newPingPair(t, c.op, c.size, 4096)
		p.stream(2000) // warm up: rings and slices reach their size
		p.packets = 0
		allocs := testing.AllocsPerRun(20, func() { p.stream(100) })
		perPkt := allocs * 21 / float64(p.packets)
		t.Logf("%v %d B: %.3f allocations per packet (%d packets)", c.op, c.size, perPkt, p.packets)
		if perPkt > 0.01 {
			t.Errorf("%v: %.3f allocations per packet", c.op, perPkt)
		}
	}
}

// BenchmarkRCPair measures packets per second through one RC QP pair over
// the in-memory link (both engines, the link and the application on one
// goroutine, so the figure is the whole system's on one core).
func BenchmarkRCPair(b *testing.B) {
	for _, c := range []struct {
		name string
		op   ib.WROpcode
		size int
	}{{"SEND64B", ib.Send, 64}, {"WRITE4KiB", ib.RDMAWrite, 4096}} {
		b.Run(c.name, func(b *testing.B) {
			p := newPingPair(b, c.op, c.size, 4096)
			p.stream(1000)
			p.packets = 0
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			p.stream(b.N)
			el := time.Since(start).Seconds()
			b.ReportMetric(float64(p.packets)/el, "pkts/s")
			b.ReportMetric(float64(b.N)/el, "msgs/s")
			b.ReportMetric(float64(p.packets)/float64(b.N), "pkts/msg")
		})
	}
}

// BenchmarkGoodputLoss reports the goodput of 64 KiB RDMA WRITEs on one QP
// (MTU 4096) over a 10 Gb/s virtual link with 2 µs one-way delay at 0 %, 1 %
// and 5 % frame loss in both directions, and its ratio to the lossless
// figure (virtual time: deterministic, machine-independent). The local ACK
// timeout is sized to the link by runE2E (over 4× the drain time of a full
// window: 2^9 × 4.096 µs ≈ 2.1 ms here).
func BenchmarkGoodputLoss(b *testing.B) {
	base := 0.0
	for _, loss := range []float64{0, 0.01, 0.05} {
		b.Run(fmt.Sprintf("loss=%g", loss), func(b *testing.B) {
			// The mean over five seeds: one seed's figure swings with
			// where its few tail losses fall.
			var g float64
			for i := 0; i < b.N; i++ {
				g = 0
				for seed := uint64(42); seed < 47; seed++ {
					g += runE2E(b, e2eCase{mtu: 4096, qps: 1, msgs: 1000, sizes: []int{65536}, seed: seed, lossOnly: loss}) / 5
				}
			}
			if loss == 0 {
				base = g
			}
			b.ReportMetric(g*8/1e9, "Gb/s")
			if base > 0 {
				b.ReportMetric(g/base, "ratio")
			}
		})
	}
}

package rnic

import (
	"net/netip"
	"testing"
	"time"

	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/congestion"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/port/memlink"
	"github.com/softrnic/softrnic/verbs"
)

// ccLink is two DCQCN devices on a memlink in virtual time with one RC QP
// pair streaming RDMA WRITEs from a to b, as ib_write_bw does (or, built
// with newCCLinkOp(…, RDMARead), a reading b's memory, as ib_read_bw).
type ccLink struct {
	t       testing.TB
	tb      *testbed
	qa, qb  *QP
	wr      verbs.SendWR
	wcs     [64]ib.WC
	posted  int
	done    int
	txA     int64 // bytes a put on the wire
	packets int   // frames both devices put on the wire
}

func newCCLink(t testing.TB, cong Congestion, seed uint64) *ccLink {
	return newCCLinkOp(t, cong, seed, ib.RDMAWrite)
}

func newCCLinkOp(t testing.TB, cong Congestion, seed uint64, op ib.WROpcode) *ccLink {
	clk := &memlink.VirtualClock{}
	pa, pb := memlink.NewPair(memlink.Config{Impairments: memlink.Impairments{Delay: 2 * time.Microsecond}, Seed: seed, Clock: clk.Now, Frames: 4096})
	mk := func(p *memlink.Port, mac [6]byte, addr netip.Addr) *node {
		d, err := NewDevice(Config{MAC: mac, Addrs: []netip.Addr{addr}, PortMTU: 4096, Congestion: cong})
		if err != nil {
			t.Fatal(err)
		}
		return &node{dev: d, port: p, pd: d.allocPD(), rx: make([][]byte, 64), out: make([][]byte, 64)}
	}
	l := &ccLink{t: t, tb: &testbed{t: t, clk: clk, a: mk(pa, macA, addrA), b: mk(pb, macB, addrB)}}
	l.qa, l.qb = l.tb.connect(ib.RC, 4096, ib.LocalWrite|ib.RemoteWrite|ib.RemoteRead, 64)
	const size = 64 << 10
	src, _ := l.tb.a.pd.RegBytes(make([]byte, size), 0, ib.LocalWrite)
	dst, _ := l.tb.b.pd.RegBytes(make([]byte, size), 0, ib.LocalWrite|ib.RemoteWrite|ib.RemoteRead)
	l.wr = verbs.SendWR{Opcode: op, Flags: ib.Signaled, SG: []ib.SGE{{Addr: src.IOVA(), Length: size, LKey: src.LKey()}},
		RemoteAddr: dst.IOVA(), RKey: dst.RKey()}
	return l
}

// run streams until virtual time reaches until: 16 WRITEs of 64 KiB kept
// outstanding, both engines stepped, the clock moved to the next event
// when nothing moves (the pacers decide when a's frames leave).
func (l *ccLink) run(until clock.Time) {
	tb := l.tb
	for i := 0; tb.clk.Now() < until; i++ {
		if i > 10_000_000 {
			l.t.Fatal("run did not reach its end")
		}
		for l.posted-l.done < 16 {
			if _, err := l.qa.PostSend([]verbs.SendWR{l.wr}); err != nil {
				l.t.Fatal(err)
			}
			l.posted++
		}
		now := tb.clk.Now()
		moved := false
		for _, n := range []*node{tb.a, tb.b} {
			k, _ := n.port.Recv(n.rx, 0)
			if k > 0 {
				n.dev.Receive(now, n.rx[:k])
				moved = true
			}
			n.dev.Expire(now)
			if k, b := n.transmit(l.t, now); k > 0 {
				if n == tb.a {
					l.txA += b
				}
				l.packets += k
				moved = true
			}
		}
		for {
			k := l.qa.init.SendCQ.Poll(l.wcs[:])
			if k == 0 {
				break
			}
			for _, wc := range l.wcs[:k] {
				if wc.Status != 0 {
					l.t.Fatalf("WRITE completed with %v", wc.Status)
				}
			}
			l.done += k
		}
		if moved {
			continue
		}
		next := min(tb.a.port.NextDelivery(), tb.b.port.NextDelivery(), tb.a.dev.NextDeadline(), tb.b.dev.NextDeadline(), until)
		if next <= now {
			next = now + 1
		}
		tb.clk.Set(next)
	}
}

// window runs for d and returns a's wire rate over it and the RP's rate at
// its end.
func (l *ccLink) window(d time.Duration) (wire, rp congestion.Rate) {
	start, bytes := l.tb.clk.Now(), l.txA
	l.run(start.Add(d))
	cs, ok := l.qa.CongestionState()
	if !ok {
		l.t.Fatal("no DCQCN state on the sender")
	}
	return congestion.Rate(float64(l.txA-bytes) * 8e9 / float64(d)), cs.Rate
}

// TestDCQCNOverMemlink: one RC QP pair at a 10 Gb/s line rate runs at line
// rate; behind a 5 Gb/s virtual queue that marks above 40 KB it is cut to
// about the bottleneck's rate; once marking stops it recovers to line rate
// (paper: within 20 ms; connectx, whose rpg_time_reset is 300 µs and
// rpg_ai_rate 5 Mb/s, within 40 ms). CNPs counted by b's NP all reach a's
// RP, and b's NP saw exactly the marks the link made.
func TestDCQCNOverMemlink(t *testing.T) {
	for _, c := range []struct {
		profile  string
		recovery int // ms
	}{{"paper", 20}, {"connectx", 40}} {
		t.Run(c.profile, func(t *testing.T) {
			line := 10 * congestion.Gbps
			l := newCCLink(t, mustCC(t, c.profile, line), 1)
			ms := time.Millisecond

			wire, rp := l.window(ms)
			t.Logf("unmarked:    wire %.3f Gb/s, RP %.3f Gb/s", wire.Gbps(), rp.Gbps())
			if wire < 0.95*line || rp != line {
				t.Fatalf("unmarked: wire %.3f Gb/s, RP %.3f Gb/s; want line rate", wire.Gbps(), rp.Gbps())
			}

			l.tb.a.port.SetImpairments(memlink.Impairments{Delay: 2 * time.Microsecond, CEQueueRate: 5e9, CEQueueBytes: 40_000})
			var marked []congestion.Rate
			for i := 0; i < 6; i++ {
				wire, rp = l.window(ms)
				marked = append(marked, wire)
				t.Logf("marked %d:    wire %.3f Gb/s, RP %.3f Gb/s", i, wire.Gbps(), rp.Gbps())
			}
			a, b := l.tb.a.dev.Stats, l.tb.b.dev.Stats
			t.Logf("b: np_ecn_marked_roce_packets %d, np_cnp_sent %d; a: rp_cnp_handled %d, rp_cnp_ignored %d; link marked %d",
				b.NPECNMarkedRoCEPackets, b.NPCNPSent, a.RPCNPHandled, a.RPCNPIgnored, l.tb.a.port.Stats().Marked)
			if b.NPCNPSent == 0 || a.RPCNPHandled+a.RPCNPIgnored != b.NPCNPSent || a.RxCNP != b.NPCNPSent ||
				b.NPECNMarkedRoCEPackets != l.tb.a.port.Stats().Marked {
				t.Fatalf("counters disagree: a %+v b %+v", a.CongestionStats, b.CongestionStats)
			}
			// After the first millisecond the flow sits near the 5 Gb/s bottleneck.
			for i, w := range marked[1:] {
				if w > 0.7*line || w < 0.3*line {
					t.Fatalf("marked window %d: wire %.3f Gb/s, want near 5", i+1, w.Gbps())
				}
			}

			l.tb.a.port.SetImpairments(memlink.Impairments{Delay: 2 * time.Microsecond})
			for i := 0; i < c.recovery; i++ {
				wire, rp = l.window(ms)
				if i%(c.recovery/5) == c.recovery/5-1 {
					t.Logf("recovery %2d: wire %.3f Gb/s, RP %.3f Gb/s", i+1, wire.Gbps(), rp.Gbps())
				}
			}
			if wire < 0.9*line || rp < 0.9*line {
				t.Fatalf("after %d ms unmarked: wire %.3f Gb/s, RP %.3f Gb/s; want near line rate", c.recovery, wire.Gbps(), rp.Gbps())
			}
			if l.done == 0 {
				t.Fatal("no WRITE completed")
			}
		})
	}
}

// TestDCQCNMarkedAcks: the NP answers CE on the packets whose sender a CNP
// can slow, never on acknowledgements. a streams WRITEs to b and the link
// marks every ECN-capable frame b sends — all of them ACKs (ECT(0), as the
// QP's frames are): a counts them as CE-marked ACKs, sends no CNP, b's RP
// is never cut, and the stream keeps its line rate. Then a READs from b with
// the same marking: now b's frames are READ responses, data that b's RP
// paces, and every CNP a sends reaches b's RP and cuts it.
func TestDCQCNMarkedAcks(t *testing.T) {
	line := 10 * congestion.Gbps
	ms := time.Millisecond
	markAll := memlink.Impairments{Delay: 2 * time.Microsecond, CEMark: 1}

	l := newCCLink(t, mustCC(t, "paper", line), 1)
	l.tb.b.port.SetImpairments(markAll)
	wire, rp := l.window(3 * ms)
	a, b := l.tb.a.dev.Stats, l.tb.b.dev.Stats
	marked := l.tb.b.port.Stats().Marked
	t.Logf("WRITE, ACKs marked: wire %.3f Gb/s, RP %.3f; link marked %d; a: CE ACKs %d, np_ecn_marked %d, np_cnp_sent %d; b: CNPs received %d, rp_cnp_handled %d",
		wire.Gbps(), rp.Gbps(), marked, a.RxCEAck, a.NPECNMarkedRoCEPackets, a.NPCNPSent, b.RxCNP, b.RPCNPHandled)
	if marked == 0 || a.RxCEAck != marked {
		t.Fatalf("link marked %d ACKs, a counted %d", marked, a.RxCEAck)
	}
	if a.NPECNMarkedRoCEPackets != 0 || a.NPCNPSent != 0 || b.RxCNP != 0 || b.RPCNPHandled != 0 {
		t.Fatalf("a CE-marked ACK was answered: a %+v, b %+v", a.CongestionStats, b.CongestionStats)
	}
	if cs, _ := l.qb.CongestionState(); cs.Rate != line || cs.Cuts != 0 {
		t.Fatalf("b's RP at %.3f Gb/s after %d cuts, want untouched line rate", cs.Rate.Gbps(), cs.Cuts)
	}
	if wire < 0.95*line || rp != line {
		t.Fatalf("WRITE stream at %.3f Gb/s (RP %.3f), want line rate", wire.Gbps(), rp.Gbps())
	}

	l = newCCLinkOp(t, mustCC(t, "paper", line), 1, ib.RDMARead)
	l.tb.b.port.SetImpairments(markAll)
	l.run(l.tb.clk.Now().Add(3 * ms))
	a, b = l.tb.a.dev.Stats, l.tb.b.dev.Stats
	cs, _ := l.qb.CongestionState()
	t.Logf("READ, responses marked: link marked %d; a: CE ACKs %d, np_ecn_marked %d, np_cnp_sent %d; b: rp_cnp_handled %d, RP %.3f Gb/s; %d READs done",
		l.tb.b.port.Stats().Marked, a.RxCEAck, a.NPECNMarkedRoCEPackets, a.NPCNPSent, b.RPCNPHandled, cs.Rate.Gbps(), l.done)
	if a.NPECNMarkedRoCEPackets == 0 || a.NPCNPSent == 0 || b.RPCNPHandled != a.NPCNPSent || cs.Cuts == 0 || cs.Rate >= line/2 {
		t.Fatalf("marked READ responses did not cut the responder: a %+v, b %+v, b's RP %.3f Gb/s", a.CongestionStats, b.CongestionStats, cs.Rate.Gbps())
	}
	if l.done == 0 {
		t.Fatal("no READ completed")
	}
}

// TestDCQCNSteadyStateAllocs: with DCQCN on and the link marking, the
// per-packet path (both engines, NP, RP, pacer, CNPs, link, posting and
// polling) allocates nothing.
func TestDCQCNSteadyStateAllocs(t *testing.T) {
	l := newCCLink(t, mustCC(t, "paper", 10*congestion.Gbps), 2)
	// Marks both ways (a's data, b's ACKs): both NPs and RPs work.
	imp := memlink.Impairments{Delay: 2 * time.Microsecond, CEMark: 0.01, CEQueueRate: 5e9, CEQueueBytes: 40_000}
	l.tb.a.port.SetImpairments(imp)
	l.tb.b.port.SetImpairments(imp)
	l.run(clock.Time(2 * time.Millisecond))
	l.packets = 0
	cnps := l.tb.b.dev.Stats.NPCNPSent
	allocs := testing.AllocsPerRun(5, func() { l.run(l.tb.clk.Now().Add(2 * time.Millisecond)) })
	perPkt := allocs * 6 / float64(l.packets)
	t.Logf("%.4f allocations per packet over %d packets, %d CNPs", perPkt, l.packets, l.tb.b.dev.Stats.NPCNPSent-cnps)
	if l.tb.b.dev.Stats.NPCNPSent == cnps {
		t.Fatal("no CNP in the measured window")
	}
	if perPkt > 0.01 {
		t.Fatalf("%.4f allocations per packet", perPkt)
	}
}

// BenchmarkDCQCNPair measures packets per second through one RC pair
// streaming 64 KiB WRITEs over memlink in virtual time: DCQCN off; on
// (paper at a 1000 Gb/s line rate) without marks, where the pacer lets one
// packet go per Transmit call and the loop must step virtual time between
// packets; on with a 64 KiB pacer burst, where frames leave in batches
// again; and on with a 1 % CE marker, where NP, RP, CNPs and the cut rates
// all run.
func BenchmarkDCQCNPair(b *testing.B) {
	for _, c := range []struct {
		name  string
		on    bool
		burst int
		mark  float64
	}{{"off", false, 0, 0}, {"paper", true, 0, 0}, {"paper-burst64k", true, 64 << 10, 0}, {"paper-ce1%", true, 0, 0.01}} {
		b.Run(c.name, func(b *testing.B) {
			var cong Congestion
			if c.on {
				cong = mustCC(b, "paper", 1000*congestion.Gbps)
				cong.PacerBurst = c.burst
			}
			l := newCCLink(b, cong, 3)
			l.tb.a.port.SetImpairments(memlink.Impairments{Delay: 2 * time.Microsecond, CEMark: c.mark})
			l.run(clock.Time(100 * time.Microsecond))
			l.packets = 0
			b.ResetTimer()
			for l.packets < b.N {
				l.run(l.tb.clk.Now().Add(50 * time.Microsecond))
			}
			b.StopTimer()
			b.ReportMetric(float64(l.packets)/b.Elapsed().Seconds(), "pkt/s")
			b.ReportMetric(float64(l.tb.b.dev.Stats.NPCNPSent), "CNPs")
		})
	}
}

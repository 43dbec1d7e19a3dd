package rnic

import (
	"math"
	"net/netip"
	"testing"
	"time"

	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/congestion"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/ibtest"
	"github.com/softrnic/softrnic/port"
	"github.com/softrnic/softrnic/port/memlink"
	"github.com/softrnic/softrnic/verbs"
)

// ccFabric is senders h1…hn and a receiver r, each on a memlink to a
// switch, in virtual time: the switch forwards r's frames to the senders
// at once and queues the senders' frames to r behind a bottleneck of rate
// C (one FIFO, tail drop), whose backlog it integrates over time. Every
// sender streams 64 KiB RDMA WRITEs to r on an RC QP once it has started,
// 16 outstanding, as ib_write_bw does. Everything runs from the test
// goroutine and nothing allocates per packet once warm.
type ccFabric struct {
	t     testing.TB
	clk   *memlink.VirtualClock
	hosts []*ccHost
	r     *node
	// the switch: its port towards each sender, towards r, and the
	// bottleneck queue of frames for r
	swHost []*memlink.Port
	swR    *memlink.Port
	sw     port.Copier // the switch copies frames from one port to another
	rx     [][]byte
	one    [1][]byte
	rate   congestion.Rate
	q      [][]byte
	qAt    []clock.Time // when each queued frame has left the bottleneck
	qHead  int
	qLen   int
	qBytes int64
	qFree  clock.Time // when the bottleneck finishes what it has
	drops  int
	// statistics since the last reset: ∫backlog dt, its peak, and the
	// bytes each flow got through the bottleneck
	since   clock.Time
	qLast   clock.Time
	qArea   float64
	qPeak   int64
	through []int64
	packets int
}

// ccHost is one sender with its QP to r.
type ccHost struct {
	n        *node
	qp, peer *QP
	wr       verbs.SendWR
	wcs      [64]ib.WC
	posted   int
	done     int
	start    clock.Time // when it starts posting
	mac      [6]byte
}

const (
	fabricLinkDelay = time.Microsecond
	fabricMTU       = 1024
	fabricQueue     = 2048 // frames the bottleneck holds
)

// newCCFabric builds the fabric: n senders at congestion control cong,
// r, a bottleneck of rate c.
func newCCFabric(t testing.TB, cong Congestion, n int, c congestion.Rate, seed uint64) *ccFabric {
	clk := &memlink.VirtualClock{}
	f := &ccFabric{t: t, clk: clk, rate: c, rx: make([][]byte, 64), through: make([]int64, n)}
	link := func(i int) (*memlink.Port, *memlink.Port) {
		return memlink.NewPair(memlink.Config{Impairments: memlink.Impairments{Delay: fabricLinkDelay}, Seed: seed + uint64(i),
			Clock: clk.Now, Frames: 4096})
	}
	mk := func(p *memlink.Port, mac [6]byte, addr netip.Addr) *node {
		d, err := NewDevice(Config{MAC: mac, Addrs: []netip.Addr{addr}, PortMTU: fabricMTU, Congestion: cong})
		if err != nil {
			t.Fatal(err)
		}
		return &node{dev: d, port: p, pd: d.allocPD(), rx: make([][]byte, 64), out: make([][]byte, 64)}
	}
	rp, swR := link(0)
	f.swR = swR
	macR := [6]byte{2, 0, 0, 0, 1, 0}
	f.r = mk(rp, macR, netip.MustParseAddr("10.78.0.1"))
	for i := 0; i < n; i++ {
		hp, sw := link(i + 1)
		mac := [6]byte{2, 0, 0, 0, 0, byte(i + 1)}
		h := &ccHost{n: mk(hp, mac, netip.AddrFrom4([4]byte{10, 78, 0, byte(10 + i)})), mac: mac}
		f.hosts = append(f.hosts, h)
		f.swHost = append(f.swHost, sw)
		h.qp, h.peer = f.connect(h, macR)
	}
	f.q, f.qAt = make([][]byte, fabricQueue), make([]clock.Time, fabricQueue)
	for i := range f.q {
		f.q[i] = make([]byte, 0, swR.MaxFrame())
	}
	return f
}

// connect makes an RC QP pair between h and r and the WRITE h streams.
func (f *ccFabric) connect(h *ccHost, macR [6]byte) (qa, qb *QP) {
	t := f.t
	mk := func(n *node) *QP {
		q, err := n.pd.newQP(testQP{Type: ib.RC, SendCQ: n.dev.newCQ(256), RecvCQ: n.dev.newCQ(256), MaxSendWR: 64, MaxRecvWR: 64, MaxSGE: 4})
		if err != nil {
			t.Fatal(err)
		}
		return q
	}
	qa, qb = mk(h.n), mk(f.r)
	access := ib.LocalWrite | ib.RemoteWrite
	conn := func(q, peer *QP, av ib.AddressVector, psnOut, psnIn uint32) {
		must(t, ibtest.Modify(q, ib.Init, &ib.QPAttr{Access: access}))
		must(t, ibtest.Modify(q, ib.RTR, &ib.QPAttr{PathMTU: fabricMTU, DestQPN: peer.QPN(), RQPSN: psnIn, MaxDestRdAtomic: 16, MinRNRTimer: 1, AV: av}))
		must(t, ibtest.Modify(q, ib.RTS, &ib.QPAttr{SQPSN: psnOut, Timeout: 10, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 16}))
	}
	conn(qa, qb, ib.AddressVector{DMAC: macR, DGID: ib.GIDFrom(f.r.dev.cfg.Addrs[0])}, 100, 200)
	conn(qb, qa, ib.AddressVector{DMAC: h.mac, DGID: ib.GIDFrom(h.n.dev.cfg.Addrs[0])}, 200, 100)
	const size = 64 << 10
	src, _ := h.n.pd.RegBytes(make([]byte, size), 0, ib.LocalWrite)
	dst, _ := f.r.pd.RegBytes(make([]byte, size), 0, access)
	h.wr = verbs.SendWR{Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: []ib.SGE{{Addr: src.IOVA(), Length: size, LKey: src.LKey()}},
		RemoteAddr: dst.IOVA(), RKey: dst.RKey()}
	return qa, qb
}

// step runs every device once at now: receive, timers, transmit.
func (f *ccFabric) step(n *node, now clock.Time) bool {
	moved := false
	if k, _ := n.port.Recv(n.rx, 0); k > 0 {
		n.dev.Receive(now, n.rx[:k])
		moved = true
	}
	n.dev.Expire(now)
	if k, _ := n.transmit(f.t, now); k > 0 {
		f.packets += k
		moved = true
	}
	return moved
}

// account integrates the backlog up to now.
func (f *ccFabric) account(now clock.Time) {
	if now > f.qLast {
		f.qArea += float64(f.qBytes) * float64(now-f.qLast)
		f.qLast = now
	}
}

// switchStep moves frames through the switch at now.
func (f *ccFabric) switchStep(now clock.Time) bool {
	moved := false
	f.account(now)
	// Frames that have left the bottleneck go on to r.
	for f.qLen > 0 && f.qAt[f.qHead] <= now {
		b := f.q[f.qHead]
		f.one[0] = b
		if sent, err := f.sw.Send(f.swR, f.one[:]); err != nil || sent != 1 {
			f.t.Fatalf("switch to r: %d, %v", sent, err)
		}
		f.qBytes -= int64(len(b))
		f.qHead = (f.qHead + 1) % len(f.q)
		f.qLen--
		moved = true
	}
	// r's frames go to their sender at once.
	if k, _ := f.swR.Recv(f.rx, 0); k > 0 {
		for _, b := range f.rx[:k] {
			for i, h := range f.hosts {
				if [6]byte(b[:6]) == h.mac {
					f.one[0] = b
					if sent, err := f.sw.Send(f.swHost[i], f.one[:]); err != nil || sent != 1 {
						f.t.Fatalf("switch to h%d: %v", i+1, err)
					}
				}
			}
		}
		moved = true
	}
	// The senders' frames join the bottleneck queue.
	for i, p := range f.swHost {
		k, _ := p.Recv(f.rx, 0)
		for _, b := range f.rx[:k] {
			if f.qLen == len(f.q) {
				f.drops++
				continue
			}
			j := (f.qHead + f.qLen) % len(f.q)
			f.q[j] = append(f.q[j][:0], b...)
			f.qFree = max(f.qFree, now) + clock.Time(f.rate.TxTime(len(b)))
			f.qAt[j] = f.qFree
			f.qLen++
			f.qBytes += int64(len(b))
			f.qPeak = max(f.qPeak, f.qBytes)
			if now >= f.since {
				f.through[i] += int64(len(b))
			}
		}
		moved = moved || k > 0
	}
	return moved
}

// run steps everything until virtual time reaches until.
func (f *ccFabric) run(until clock.Time) {
	for i := 0; f.clk.Now() < until; i++ {
		if i > 20_000_000 {
			f.t.Fatal("run did not reach its end")
		}
		now := f.clk.Now()
		moved := false
		for _, h := range f.hosts {
			for now >= h.start && h.posted-h.done < 16 {
				if _, err := h.qp.PostSend([]verbs.SendWR{h.wr}); err != nil {
					f.t.Fatal(err)
				}
				h.posted++
			}
			if f.step(h.n, now) {
				moved = true
			}
			for {
				k := h.qp.init.SendCQ.Poll(h.wcs[:])
				if k == 0 {
					break
				}
				for _, wc := range h.wcs[:k] {
					if wc.Status != ib.Success {
						f.t.Fatalf("WRITE completed with %v", wc.Status)
					}
				}
				h.done += k
			}
		}
		if f.step(f.r, now) {
			moved = true
		}
		if f.switchStep(now) {
			moved = true
		}
		if moved {
			continue
		}
		next := until
		for i, h := range f.hosts {
			next = min(next, h.n.port.NextDelivery(), h.n.dev.NextDeadline(), f.swHost[i].NextDelivery())
			if h.start > now {
				next = min(next, h.start)
			}
		}
		next = min(next, f.r.port.NextDelivery(), f.r.dev.NextDeadline(), f.swR.NextDelivery())
		if f.qLen > 0 {
			next = min(next, f.qAt[f.qHead])
		}
		if next <= now {
			next = now + 1
		}
		f.clk.Set(next)
	}
	f.account(f.clk.Now())
}

// window resets the statistics, runs for d and returns each flow's rate
// through the bottleneck, the mean and peak backlog.
func (f *ccFabric) window(d time.Duration) (rates []congestion.Rate, qMean float64, qPeak int64) {
	now := f.clk.Now()
	f.since, f.qLast, f.qArea, f.qPeak = now, now, 0, f.qBytes
	clear(f.through)
	f.run(now.Add(d))
	for _, b := range f.through {
		rates = append(rates, congestion.Rate(float64(b)*8e9/float64(d)))
	}
	return rates, f.qArea / float64(d), f.qPeak
}

func jain(x []congestion.Rate) float64 {
	var s, s2 float64
	for _, v := range x {
		s += float64(v)
		s2 += float64(v) * float64(v)
	}
	return s * s / (float64(len(x)) * s2)
}

func sum(x []congestion.Rate) (s congestion.Rate) {
	for _, v := range x {
		s += v
	}
	return s
}

// mustCCAlgo is algorithm algo with profile at the tests' 40 Gb/s line rate.
func mustCCAlgo(t testing.TB, algo, profile string) Congestion {
	t.Helper()
	c, err := NewCongestion(algo, profile, 40*congestion.Gbps, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestSwiftUncongested: one Swift flow whose path has no bottleneck below
// its 40 Gb/s line rate runs at that rate; its RTT stays at the path's base
// (the four link delays and a packet's serialisation), below the target,
// so the window never shrinks; every ACK of a packet sent once gives a
// sample.
func TestSwiftUncongested(t *testing.T) {
	line := 40 * congestion.Gbps
	f := newCCFabric(t, mustCCAlgo(t, "swift", ""), 1, line, 1)
	f.run(clock.Time(200 * time.Microsecond))
	rates, qMean, _ := f.window(time.Millisecond)
	cs, _ := f.hosts[0].qp.CongestionState()
	t.Logf("rate %.2f Gb/s, queue mean %.0f B; srtt %v, target %v, cwnd %.2f, samples %d, decreases %d, window full %d",
		rates[0].Gbps(), qMean, cs.SRTT, cs.Target, cs.Cwnd, cs.RTTSamples, cs.Decreases, cs.WindowFull)
	if rates[0] < 0.95*line {
		t.Fatalf("uncongested Swift at %.2f Gb/s, want line rate", rates[0].Gbps())
	}
	if cs.Algorithm != "swift" || cs.Decreases != 0 || cs.RTTSamples == 0 || cs.SRTT > cs.Target || cs.LossEvents != 0 {
		t.Fatalf("state %+v", cs)
	}
	// Every RTT sample was taken by the transport's estimator: the device
	// counted each one.
	if st := f.hosts[0].n.dev.Stats; st.RTTSamples != cs.RTTSamples || st.Decreases != 0 {
		t.Fatalf("device counts %+v, QP %+v", st.CongestionStats, cs.Counters)
	}
}

// TestSwiftBottleneck: one flow at 40 Gb/s through a 10 Gb/s bottleneck.
// Without congestion control the bottleneck holds what the transport's
// 128-packet window puts in flight; Swift shrinks its window to what the
// bottleneck carries at its target delay: the smoothed RTT settles near
// the target, the link stays busy, and the mean queue is a small fraction
// of the uncontrolled one.
func TestSwiftBottleneck(t *testing.T) {
	c := 10 * congestion.Gbps
	off := newCCFabric(t, Congestion{}, 1, c, 1)
	off.run(clock.Time(time.Millisecond))
	offRates, offQ, offPeak := off.window(2 * time.Millisecond)
	t.Logf("uncontrolled: %.2f Gb/s, queue mean %.1f KB peak %.1f KB", offRates[0].Gbps(), offQ/1e3, float64(offPeak)/1e3)

	cong := mustCCAlgo(t, "swift", "")
	f := newCCFabric(t, cong, 1, c, 1)
	init := cong.Swift.InitCwnd
	f.run(clock.Time(time.Millisecond))
	rates, qMean, qPeak := f.window(2 * time.Millisecond)
	cs, _ := f.hosts[0].qp.CongestionState()
	t.Logf("swift: %.2f Gb/s, queue mean %.1f KB peak %.1f KB, drops %d; cwnd %.2f (start %.0f), srtt %v, target %v, min RTT %v; samples %d decreases %d window-full %d",
		rates[0].Gbps(), qMean/1e3, float64(qPeak)/1e3, f.drops, cs.Cwnd, init, cs.SRTT, cs.Target, cs.MinRTT, cs.RTTSamples, cs.Decreases, cs.WindowFull)
	if rates[0] < 0.9*c || rates[0] > 1.01*c {
		t.Fatalf("Swift through the bottleneck at %.2f Gb/s, want about %.0f", rates[0].Gbps(), c.Gbps())
	}
	if !(cs.Cwnd < init/2) || cs.Decreases == 0 || cs.WindowFull == 0 {
		t.Fatalf("the window did not shrink and hold the flow: cwnd %.2f from %.0f, %d decreases, %d window-full", cs.Cwnd, init, cs.Decreases, cs.WindowFull)
	}
	if d := math.Abs(float64(cs.SRTT-cs.Target)) / float64(cs.Target); d > 0.25 {
		t.Fatalf("smoothed RTT %v, %.0f %% from the target %v", cs.SRTT, 100*d, cs.Target)
	}
	if !(qMean < offQ/5) || f.drops != 0 {
		t.Fatalf("mean queue %.1f KB against %.1f KB uncontrolled, %d drops", qMean/1e3, offQ/1e3, f.drops)
	}
}

// TestSwiftTwoFlows: a second Swift flow joins the first at the 10 Gb/s
// bottleneck and the two converge to the fair share: Jain's index over
// the last 4 ms at least 0.99, the link busy, the queue near the target's.
func TestSwiftTwoFlows(t *testing.T) {
	c := 10 * congestion.Gbps
	f := newCCFabric(t, mustCCAlgo(t, "swift", ""), 2, c, 1)
	f.hosts[1].start = clock.Time(time.Millisecond)
	f.run(clock.Time(6 * time.Millisecond))
	rates, qMean, qPeak := f.window(4 * time.Millisecond)
	a, _ := f.hosts[0].qp.CongestionState()
	b, _ := f.hosts[1].qp.CongestionState()
	j := jain(rates)
	t.Logf("flows %.3f / %.3f Gb/s, Jain %.4f, utilisation %.3f, queue mean %.1f KB peak %.1f KB; cwnd %.2f / %.2f, srtt %v / %v",
		rates[0].Gbps(), rates[1].Gbps(), j, float64(sum(rates)/c), qMean/1e3, float64(qPeak)/1e3, a.Cwnd, b.Cwnd, a.SRTT, b.SRTT)
	if j < 0.99 || sum(rates) < 0.9*c || f.drops != 0 {
		t.Fatalf("two Swift flows: Jain %.4f, utilisation %.3f, %d drops", j, float64(sum(rates)/c), f.drops)
	}
}

// TestTIMELYBottleneck: TIMELY (HPCC ns-3's, an update per RTT) through the
// 10 Gb/s bottleneck. Below T_low (50 µs) it only increases, so it lets
// the queue grow until the RTT passes T_low; from there the RTT's gradient
// steers its rate, below the 40 Gb/s line rate, with the RTT kept between
// T_low and T_high and the link busy.
func TestTIMELYBottleneck(t *testing.T) {
	line, c := 40*congestion.Gbps, 10*congestion.Gbps
	cong := mustCCAlgo(t, "timely", "artifact")
	f := newCCFabric(t, cong, 1, c, 1)
	f.run(clock.Time(time.Millisecond))
	rates, qMean, qPeak := f.window(2 * time.Millisecond)
	cs, _ := f.hosts[0].qp.CongestionState()
	t.Logf("timely: %.2f Gb/s, queue mean %.1f KB peak %.1f KB; rate %.2f Gb/s, gradient %.3f, srtt %v, samples %d, decreases %d",
		rates[0].Gbps(), qMean/1e3, float64(qPeak)/1e3, cs.Rate.Gbps(), cs.Gradient, cs.SRTT, cs.RTTSamples, cs.Decreases)
	if cs.Algorithm != "timely" || cs.Decreases == 0 || cs.RTTSamples == 0 || cs.Rate >= line || cs.Window != congestion.NoWindow {
		t.Fatalf("TIMELY state %+v", cs)
	}
	if cs.SRTT < cong.TIMELY.TLow || cs.SRTT > cong.TIMELY.THigh || rates[0] < 0.9*c {
		t.Fatalf("TIMELY at %.2f Gb/s through a %.0f Gb/s bottleneck, srtt %v", rates[0].Gbps(), c.Gbps(), cs.SRTT)
	}
}

// TestSwiftLoss: frames the path drops make the requester retransmit, and
// each retransmission event reaches Swift as a loss, which cuts its window.
func TestSwiftLoss(t *testing.T) {
	line := 40 * congestion.Gbps
	f := newCCFabric(t, mustCCAlgo(t, "swift", ""), 1, line, 1)
	f.run(clock.Time(100 * time.Microsecond))
	before, _ := f.hosts[0].qp.CongestionState()
	data := f.hosts[0].n.port
	data.SetImpairments(memlink.Impairments{Delay: fabricLinkDelay, Loss: 0.01})
	f.run(clock.Time(300 * time.Microsecond))
	cs, _ := f.hosts[0].qp.CongestionState()
	rc := f.hosts[0].qp.rcQP()
	t.Logf("lost %d frames; retransmits %d (selective %d), NAKs %d, timeouts %d; loss events %d, decreases %d, cwnd %.2f (was %.2f)",
		data.Stats().Lost, rc.Retransmits, rc.SelRetrans, rc.RxNAKSeqErr, rc.Timeouts, cs.LossEvents, cs.Decreases, cs.Cwnd, before.Cwnd)
	if data.Stats().Lost == 0 || rc.Retransmits+rc.SelRetrans == 0 {
		t.Fatal("no loss happened (seed)")
	}
	if cs.LossEvents == 0 || cs.Decreases == 0 || f.hosts[0].n.dev.Stats.LossEvents != cs.LossEvents || !(cs.Cwnd < before.Cwnd) {
		t.Fatalf("retransmissions did not reach Swift: %+v", cs)
	}
}

// TestDelayCCSteadyStateAllocs: two Swift flows at the bottleneck (and one
// TIMELY flow) — engines, pacer, window, RTT samples, controller, the
// switch — allocate nothing per packet.
func TestDelayCCSteadyStateAllocs(t *testing.T) {
	for _, algo := range []string{"swift", "timely"} {
		f := newCCFabric(t, mustCCAlgo(t, algo, ""), 2, 10*congestion.Gbps, 2)
		f.run(clock.Time(time.Millisecond))
		f.packets = 0
		allocs := testing.AllocsPerRun(5, func() { f.run(f.clk.Now().Add(200 * time.Microsecond)) })
		perPkt := allocs * 6 / float64(f.packets)
		t.Logf("%s: %.4f allocations per packet over %d packets", algo, perPkt, f.packets)
		if perPkt > 0.001 {
			t.Fatalf("%s: %.4f allocations per packet", algo, perPkt)
		}
	}
}

package testbed

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/netnstest"
	"github.com/softrnic/softrnic/lab/dcqcnlive/internal/ecnmark"
)

// A small bottleneck keeps the test light on two shared cores: 40 Mb/s,
// 1082-byte frames (1 KiB payload), about 4.6 kpps through sw. Kmin is
// above the largest queue two raw senders below the rate can build: at
// 12 Mb/s each sends at most debtLimit = 8 frames back to back after a
// stall, so the queue stays under 16 frames (17.3 KB) minus tbf's burst.
var testBottleneck = Bottleneck{
	RateBitsPerSec: 40e6,
	BurstBytes:     4 * 1514,
	LimitBytes:     120_000,
	Marker:         ecnmark.Config{KminBytes: 20_000, KmaxBytes: 60_000, Pmax: 0.2, Seed: 1},
}

func buildTest(t *testing.T) *Topology {
	t.Helper()
	netnstest.SkipUnlessRoot(t)
	topo, err := Build(testBottleneck, 0)
	if err != nil {
		t.Fatalf("build: %v", err)
	}
	t.Cleanup(func() {
		if err := topo.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return topo
}

// phase runs two raw ECT(0) flows h1→r and h2→r at rate each for d, polling
// the bottleneck, and returns the flows' counters, the marker's counters
// accumulated during the phase, tbf's drops during it and the polls.
func phase(t *testing.T, topo *Topology, ep *RawECT, qp uint32, rate uint64, d time.Duration) ([2]EndpointCounters, ecnmark.Counters, uint32, []QueuePoint) {
	t.Helper()
	m0, err := topo.Marker.Counters()
	if err != nil {
		t.Fatal(err)
	}
	s0, err := topo.BottleneckStats()
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	done := make(chan []QueuePoint, 1)
	go func() {
		pts, err := topo.PollQueue(nil, 5*time.Millisecond, false, stop)
		if err != nil {
			t.Errorf("poll: %v", err)
		}
		done <- pts
	}()
	var flows []Flow
	for i, h := range []*Host{&topo.H1, &topo.H2} {
		f, err := ep.StartFlow(topo, FlowSpec{ID: i + 1, Src: h, Dst: &topo.R, RateBitsPerSec: rate, PayloadBytes: 1024, TClass: 26<<2 | 2, DestQP: qp + uint32(i)})
		if err != nil {
			close(stop)
			<-done
			t.Fatalf("flow %d: %v", i+1, err)
		}
		flows = append(flows, f)
	}
	time.Sleep(d)
	for _, f := range flows {
		if err := f.Stop(); err != nil {
			t.Errorf("stop: %v", err)
		}
	}
	close(stop)
	pts := <-done
	// Drain (bounded): 120 KB at 40 Mb/s is 24 ms.
	for i := 0; i < 50; i++ {
		if st, err := topo.BottleneckStats(); err != nil || st.BacklogBytes == 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
	m1, _ := topo.Marker.Counters()
	s1, _ := topo.BottleneckStats()
	var c [2]EndpointCounters
	for i, f := range flows {
		c[i] = f.Counters()
	}
	d1 := ecnmark.Counters{Packets: m1.Packets - m0.Packets, ECT: m1.ECT - m0.ECT, Marked: m1.Marked - m0.Marked,
		MarkFailed: m1.MarkFailed - m0.MarkFailed, VQDrops: m1.VQDrops - m0.VQDrops, NotECT: m1.NotECT - m0.NotECT}
	return c, d1, s1.Drops - s0.Drops, pts
}

// TestBottleneckMarks proves the testbed with ordinary traffic: two raw
// ECT(0) senders whose total is below the tbf rate get no mark and no drop;
// above it the queue builds, the marker marks, r receives CE-marked frames
// whose ICRC is still valid, and the marker's virtual queue tracks tbf's
// backlog.
func TestBottleneckMarks(t *testing.T) {
	topo := buildTest(t)
	ep := &RawECT{}
	t.Cleanup(func() { ep.Close() })

	// Below: 2 × 12 Mb/s = 60 % of the bottleneck.
	under, mu, dropsU, ptsU := phase(t, topo, ep, 0x10, 12e6, 1500*time.Millisecond)
	t.Logf("under: flows %+v %+v; marker %+v; tbf drops %d; %d polls, tracking error %.0f B",
		under[0], under[1], mu, dropsU, len(ptsU), TrackError(ptsU))
	for i, c := range under {
		if c.SentFrames < 1000 || c.RecvFrames < c.SentFrames*95/100 {
			t.Errorf("under, flow %d: sent %d, received %d", i+1, c.SentFrames, c.RecvFrames)
		}
		if c.RecvCE != 0 || c.RecvBadICRC != 0 {
			t.Errorf("under, flow %d: %d CE, %d bad ICRC at r", i+1, c.RecvCE, c.RecvBadICRC)
		}
	}
	if mu.Marked != 0 || dropsU != 0 || mu.VQDrops != 0 {
		t.Errorf("under the bottleneck rate: %d marked, %d tbf drops, %d virtual drops", mu.Marked, dropsU, mu.VQDrops)
	}
	if mu.ECT < under[0].SentFrames+under[1].SentFrames {
		t.Errorf("marker saw %d ECT packets, senders sent %d", mu.ECT, under[0].SentFrames+under[1].SentFrames)
	}

	// Above: 2 × 30 Mb/s = 150 %, with the monitor tapping sw→r.
	mon, err := topo.StartMonitor(uint64(100*time.Millisecond), 100)
	if err != nil {
		t.Fatal(err)
	}
	over, mo, dropsO, ptsO := phase(t, topo, ep, 0x20, 30e6, 2*time.Second)
	if err := mon.Stop(); err != nil {
		t.Fatal(err)
	}
	// The monitor saw what left the bottleneck: what r received, marks
	// included, with every byte in a bin.
	traces, _, _ := mon.Snapshot()
	for i, h := range []*Host{&topo.H1, &topo.H2} {
		var tr *FlowTrace
		for k := range traces {
			if traces[k].Src == h.Link.Addr && traces[k].DestQP == 0x20+uint32(i) {
				tr = &traces[k]
			}
		}
		if tr == nil {
			t.Fatalf("monitor did not see flow %d: %+v", i+1, traces)
		}
		var binned uint64
		for _, b := range tr.Bins {
			binned += b
		}
		if tr.Frames != over[i].RecvFrames || tr.CE != over[i].RecvCE || tr.Bytes != over[i].RecvBytes || binned != tr.Bytes {
			t.Errorf("flow %d: monitor %d frames (%d CE, %d bytes, %d binned), r received %d (%d CE, %d bytes)",
				i+1, tr.Frames, tr.CE, tr.Bytes, binned, over[i].RecvFrames, over[i].RecvCE, over[i].RecvBytes)
		}
	}
	t.Logf("over: flows %+v %+v; marker %+v; tbf drops %d", over[0], over[1], mo, dropsO)
	var ce, recv, sent uint64
	for i, c := range over {
		if c.RecvBadICRC != 0 {
			t.Errorf("over, flow %d: %d frames with a bad ICRC at r", i+1, c.RecvBadICRC)
		}
		ce += c.RecvCE
		recv += c.RecvFrames
		sent += c.SentFrames
	}
	if mo.Marked == 0 || ce == 0 {
		t.Fatalf("over the bottleneck rate: marker marked %d, r saw %d CE", mo.Marked, ce)
	}
	if ce > mo.Marked || mo.MarkFailed != 0 {
		t.Errorf("r saw %d CE, marker marked %d (%d failed)", ce, mo.Marked, mo.MarkFailed)
	}
	// What r got is what left tbf: about 40 Mb/s for 2 s.
	if recv+uint64(dropsO) < sent*95/100 || dropsO == 0 {
		t.Errorf("sent %d, received %d, tbf dropped %d", sent, recv, dropsO)
	}
	// Drops happen when the real queue is full; the marker predicts them.
	if mo.VQDrops == 0 {
		t.Errorf("tbf dropped %d, the marker predicted no drop", dropsO)
	}
	t.Logf("over: sent %d, received %d (%d CE), tbf drops %d, marker virtual drops %d", sent, recv, ce, dropsO, mo.VQDrops)

	// Tracking: during the overload the backlog ramps up to the limit; the
	// marker's estimate must follow it within a few frames.
	var diffs []float64
	var maxQ uint32
	for _, p := range ptsO {
		diffs = append(diffs, math.Abs(float64(p.VQBacklog)-float64(p.TbfBacklog)))
		maxQ = max(maxQ, p.TbfBacklog)
	}
	for i, p := range ptsO {
		if i%40 == 0 {
			t.Logf("poll %3d: +%6.1f ms tbf %6d B marker %6d B", i, float64(p.Ns-ptsO[0].Ns)/1e6, p.TbfBacklog, p.VQBacklog)
		}
	}
	slices.Sort(diffs)
	if len(diffs) < 100 {
		t.Fatalf("only %d polls in 2 s", len(diffs))
	}
	med, p90 := diffs[len(diffs)/2], diffs[len(diffs)*9/10]
	t.Logf("tracking over %d polls: median |marker − tbf| %.0f B, p90 %.0f B, mean %.0f B; max tbf backlog %d B",
		len(diffs), med, p90, TrackError(ptsO), maxQ)
	if maxQ < uint32(testBottleneck.Marker.KmaxBytes) {
		t.Errorf("tbf backlog never passed Kmax (max %d B)", maxQ)
	}
	if med > 3*1082 {
		t.Errorf("marker's backlog is off tbf's by %.0f B (median)", med)
	}
}

func TestJain(t *testing.T) {
	for _, c := range []struct {
		xs   []float64
		want float64
	}{{[]float64{1, 1}, 1}, {[]float64{1, 0}, 0.5}, {[]float64{3, 1}, 0.8}, {[]float64{2, 2, 2, 2}, 1}, {[]float64{0, 0}, 0}} {
		if got := Jain(c.xs); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("Jain(%v) = %v, want %v", c.xs, got, c.want)
		}
	}
}

package testbed

import (
	"math"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/congestion"
	"github.com/softrnic/softrnic/congestion/dcqcn"
	"github.com/softrnic/softrnic/frame"
	"golang.org/x/sys/unix"
)

// TestDilatedPaperGolden: the paper's single-CNP trajectory, dilated by S,
// is the undilated one with rates ÷ S at times × S (the map the live
// experiment relies on), checked through the real reaction point.
func TestDilatedPaperGolden(t *testing.T) {
	const s = DefaultScale
	p, err := PlanFor("paper", s, 1)
	if err != nil {
		t.Fatal(err)
	}
	if p.Bottleneck.RateBitsPerSec != 100e6 || p.RP.TimerPeriod != 22*time.Millisecond ||
		p.RP.AlphaPeriod != 22*time.Millisecond || p.NP.MinInterval != 20*time.Millisecond ||
		p.RP.ByteCounter != 10_000_000 || p.RP.AIRate != 100e3 {
		t.Fatalf("dilated plan %+v", p)
	}
	r, err := dcqcn.NewRP(p.RP)
	if err != nil {
		t.Fatal(err)
	}
	r.OnCNP(0)
	for i, g := range []float64{20, 30, 35, 37.5, 38.75, 39.375, 39.6875} {
		at := clock.Time(int64(i) * int64(55*time.Microsecond) * s)
		if i > 0 {
			if d := r.Deadline(); d != at {
				t.Fatalf("increase %d at %v, want %v", i, d, at)
			}
			r.OnTimer(at)
		}
		if want := congestion.Rate(g * 1e9 / s); math.Abs(float64(r.Rate()-want)) > 1e-6 {
			t.Fatalf("at %v: R_C %v b/s, want %v", at, float64(r.Rate()), float64(want))
		}
		if a := r.Alpha(); i == 5 && math.Abs(a-math.Pow(255.0/256, 5)) > 1e-12 {
			t.Fatalf("α after five dilated K periods = %v", a)
		}
	}
	if _, err := PlanFor("connectx", s, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := PlanFor("nope", s, 1); err == nil {
		t.Fatal("unknown profile accepted")
	}
	if _, err := PlanFor("paper", 0.5, 1); err == nil {
		t.Fatal("scale below 1 accepted")
	}
}

func testSpec() frame.Spec {
	return frame.Spec{
		DstMAC: [6]byte{2, 0, 0, 0, 0, 2}, SrcMAC: [6]byte{2, 0, 0, 0, 0, 1},
		Src: netip.MustParseAddr("10.77.1.2"), Dst: netip.MustParseAddr("10.77.3.2"), TOS: 26<<2 | 2, SrcPort: 0xC001,
		BTH: bth.BTHFields{Opcode: bth.RCSendOnly, PKey: bth.DefaultPKey, DestQP: 0x101},
	}
}

// TestHotPathsDoNotAllocate: the raw sender's frame build, the raw
// receiver's and the monitor's per-frame accounting allocate nothing.
func TestHotPathsDoNotAllocate(t *testing.T) {
	s := testSpec()
	buf := make([]byte, frame.Size(&s, 1024))
	var b frame.Builder
	var psn uint32
	if a := testing.AllocsPerRun(1000, func() {
		psn++
		s.BTH.PSN = bth.PSN(psn)
		if err := buildRaw(&b, buf, &s, 1024); err != nil {
			t.Fatal(err)
		}
	}); a != 0 {
		t.Errorf("buildRaw: %v allocations per frame", a)
	}
	var f frame.Frame
	if err := frame.Parse(buf, &f); err != nil || !f.VerifyICRC() {
		t.Fatalf("built frame: %v, ICRC %v", err, f.VerifyICRC())
	}

	sink := &rawSink{per: map[flowKey]*EndpointCounters{}}
	sink.register(flowKey{s.Src, 0x101})
	frames := [][]byte{buf, buf, make([]byte, 60)}
	if a := testing.AllocsPerRun(1000, func() { sink.account(frames, &f) }); a != 0 {
		t.Errorf("rawSink.account: %v allocations per batch", a)
	}
	c := sink.counts(flowKey{s.Src, 0x101})
	if c.RecvFrames != 2002 || c.RecvCE != 0 || c.RecvBadICRC != 0 || sink.other.Load() != 1001 {
		t.Errorf("sink counted %+v, other %d", c, sink.other.Load())
	}

	m := &Monitor{binNs: 1e6, maxBins: 10, cnps: map[cnpKey]uint64{}, startNs: 1000}
	m.account(buf, unix.PACKET_OUTGOING, 2000, &f) // creates the flow and its first bin
	if a := testing.AllocsPerRun(1000, func() { m.account(buf, unix.PACKET_OUTGOING, 2000, &f) }); a != 0 {
		t.Errorf("Monitor.account: %v allocations per frame", a)
	}
}

// TestMonitorAccounting: bins, CE marks, CNPs back to the sender.
func TestMonitorAccounting(t *testing.T) {
	s := testSpec()
	data := make([]byte, frame.Size(&s, 1024))
	if _, err := frame.Build(data, &s, make([]byte, 1024)); err != nil {
		t.Fatal(err)
	}
	marked := append([]byte(nil), data...)
	marked[15] |= 3 // CE (the IPv4 checksum is not the monitor's business)
	cnpSpec := testSpec()
	cnpSpec.Src, cnpSpec.Dst = s.Dst, s.Src
	cnp := make([]byte, 128)
	n, err := frame.BuildCNP(cnp, &cnpSpec, 0x55)
	if err != nil {
		t.Fatal(err)
	}
	cnp = cnp[:n]

	m := &Monitor{binNs: 1e6, maxBins: 3, cnps: map[cnpKey]uint64{}, startNs: 1e9}
	var f frame.Frame
	m.account(data, unix.PACKET_OUTGOING, 1e9+10, &f)
	m.account(marked, unix.PACKET_OUTGOING, 1e9+2e6+5, &f)
	m.account(data, unix.PACKET_OUTGOING, 1e9+9e6, &f) // past the last bin: totals only
	m.account(cnp, unix.PACKET_HOST, 1e9+3e6, &f)
	m.account(cnp, unix.PACKET_OUTGOING, 1e9+3e6, &f) // a CNP leaving sw toward r is not r's
	m.account(make([]byte, 60), unix.PACKET_HOST, 1e9, &f)
	flows, cnps, other := m.Snapshot()
	if len(flows) != 2 { // the outgoing CNP is a "flow" from r: the monitor does not judge
		t.Fatalf("%d flows: %+v", len(flows), flows)
	}
	ft := flows[0]
	l := uint64(len(data))
	if ft.Src != s.Src || ft.DestQP != 0x101 || ft.Frames != 3 || ft.CE != 1 || ft.Bytes != 3*l ||
		len(ft.Bins) != 3 || ft.Bins[0] != l || ft.Bins[1] != 0 || ft.Bins[2] != l {
		t.Fatalf("flow trace %+v", ft)
	}
	if cnps[s.Src] != 1 || len(cnps) != 1 || other != 1 {
		t.Fatalf("cnps %v, other %d", cnps, other)
	}
}

func TestQueueStats(t *testing.T) {
	var pts []QueuePoint
	for i := range 100 {
		pts = append(pts, QueuePoint{Ns: uint64(i), TbfBacklog: uint32(i * 1000), VQBacklog: uint64(i*1000 + 100)})
	}
	q := queueStats(pts, 0, 100)
	if q.Polls != 100 || q.MeanKB != 49.5 || q.P5KB != 5 || q.P95KB != 95 || q.TrackMAEBytes != 100 {
		t.Fatalf("%+v", q)
	}
	if q := queueStats(pts, 200, 300); q.Polls != 0 {
		t.Fatalf("empty window: %+v", q)
	}
}

func TestDebtLimit(t *testing.T) {
	bits := uint64(1082 * 8)
	if got := debtLimit(12e6, bits); got != maxDebt {
		t.Errorf("12 Mb/s: %d frames, want %d", got, maxDebt)
	}
	// 75 Mb/s for 3 ms is 28125 bytes: 25 frames of 1082.
	if got := debtLimit(75e6, bits); got != 25 {
		t.Errorf("75 Mb/s: %d frames, want 25", got)
	}
}

// TestReceiverTimestamps reads datagrams through the monitor's recvmsg
// path (a Unix socket pair stands in for the packet socket): data, the
// kernel's SCM_TIMESTAMPNS, no allocation.
func TestReceiverTimestamps(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	if err := unix.SetsockoptInt(fds[1], unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1); err != nil {
		t.Fatal(err)
	}
	var r receiver
	r.init(2048)
	msg := []byte("frame")
	var rt unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_REALTIME, &rt); err != nil {
		t.Fatal(err)
	}
	before := rt.Nano()
	if _, err := unix.Write(fds[0], msg); err != nil {
		t.Fatal(err)
	}
	n, _, ts, err := r.recv(fds[1])
	if err != nil || string(r.buf[:n]) != "frame" {
		t.Fatalf("recv: %q, %v", r.buf[:n], err)
	}
	if err := unix.ClockGettime(unix.CLOCK_REALTIME, &rt); err != nil {
		t.Fatal(err)
	}
	if ts < before || ts > rt.Nano() {
		t.Fatalf("timestamp %d outside [%d, %d]", ts, before, rt.Nano())
	}
	if a := testing.AllocsPerRun(100, func() {
		if _, err := unix.Write(fds[0], msg); err != nil {
			t.Fatal(err)
		}
		if _, _, ts, err := r.recv(fds[1]); err != nil || ts == 0 {
			t.Fatalf("recv: ts %d, %v", ts, err)
		}
	}); a != 0 {
		t.Errorf("recv: %v allocations per frame", a)
	}
	if timestampNs(nil) != 0 || timestampNs(make([]byte, 8)) != 0 {
		t.Error("timestamp from nothing")
	}
}

// PlanForCC: DCQCN's plans as PlanFor's; Swift and TIMELY on the paper
// profile's bottleneck (40 Gb/s ÷ S) with their default profiles, and the
// --cc value the endpoints run.
func TestPlanForCC(t *testing.T) {
	for _, c := range []struct{ algo, profile, cc string }{
		{"", "", "dcqcn:paper"}, {"dcqcn", "connectx", "dcqcn:connectx"}, {"swift", "", "swift:default"}, {"timely", "paper", "timely:paper"},
	} {
		p, err := PlanForCC(c.algo, c.profile, DefaultScale, 1)
		if err != nil || p.CC() != c.cc || p.Scale != DefaultScale {
			t.Fatalf("%s:%s: %+v %v", c.algo, c.profile, p, err)
		}
		if c.algo == "swift" && (p.Bottleneck.RateBitsPerSec != 100e6 || p.LineRate != 40*congestion.Gbps || p.RP.LineRate != 0) {
			t.Fatalf("swift plan %+v", p)
		}
	}
	if _, err := PlanForCC("hpcc", "", DefaultScale, 1); err == nil {
		t.Fatal("hpcc accepted")
	}
}

// Predict runs the simulator's two-flow scenario undilated for the live
// run's duration ÷ S, over the same last 20 %: Swift's flows share the
// bottleneck fairly and fill it, with its small standing queue; a live
// join other than S × 10 ms is noted.
func TestPredict(t *testing.T) {
	p, err := PlanForCC("swift", "", DefaultScale, 1)
	if err != nil {
		t.Fatal(err)
	}
	pr, err := Predict(p, 30*time.Second, 4*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", *pr)
	if pr.DurationMs != 75 || pr.WindowMs != [2]float64{60, 75} || len(pr.Normalised) != 2 || pr.Jain < 0.99 ||
		pr.Utilization < 0.95 || pr.QueueMeanKB <= 0 || pr.QueueMeanKB > 50 || math.Abs(pr.LiveMbps[0]-100*pr.Normalised[0]) > 1e-9 {
		t.Fatalf("prediction %+v", *pr)
	}
	if strings.Contains(pr.Note, "joins") {
		t.Fatalf("note %q for the default join", pr.Note)
	}
	if pr, err = Predict(p, 30*time.Second, 5*time.Second); err != nil || !strings.Contains(pr.Note, "joins at 5s") {
		t.Fatalf("other join: %v, %v", pr, err)
	}
	if _, err := Predict(p, time.Second, 0); err == nil {
		t.Fatal("a run too short to simulate accepted")
	}
}

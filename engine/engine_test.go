package engine

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/gopacket/gopacket/pcapgo"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/frame"
	"github.com/softrnic/softrnic/icrc"
	"github.com/softrnic/softrnic/port"
	"github.com/softrnic/softrnic/port/memlink"
	"github.com/softrnic/softrnic/transport/rc"
	"github.com/softrnic/softrnic/verbs/wr"
)

// --- memory and receive queue for real rc.QPs -------------------------------

type testMR struct {
	va     uint64
	buf    []byte
	access wr.Access
}

type testMem struct{ mrs map[uint32]*testMR }

func (m *testMem) Resolve(rkey uint32, va, n uint64, acc wr.Access) ([]byte, bool) {
	r := m.mrs[rkey]
	if r == nil || r.access&acc != acc || va < r.va || va+n > r.va+uint64(len(r.buf)) || va+n < va {
		return nil, false
	}
	return r.buf[va-r.va : va-r.va+n], true
}
func (m *testMem) Invalidate(uint32) bool { return false }

type testRQ struct{ q []wr.RecvWQE }

func (r *testRQ) Take(dst *wr.RecvWQE) bool {
	if len(r.q) == 0 {
		return false
	}
	w := r.q[0]
	r.q = r.q[1:]
	sg := append(dst.SG[:0], w.SG...)
	*dst = w
	dst.SG = sg
	return true
}

// --- a port that records what goes through it -------------------------------

// spyPort wraps a port, keeps a copy of the first frames sent, and can
// limit how many frames each Send takes (back-pressure).
type spyPort struct {
	port.Port
	mu      sync.Mutex
	sent    [][]byte
	keep    int
	perSend int
}

func (s *spyPort) Send(frames [][]byte) (int, error) {
	if s.perSend > 0 && len(frames) > s.perSend {
		frames = frames[:s.perSend]
	}
	n, err := s.Port.Send(frames)
	s.mu.Lock()
	for _, f := range frames[:n] {
		if len(s.sent) < s.keep {
			s.sent = append(s.sent, bytes.Clone(f))
		}
	}
	s.mu.Unlock()
	return n, err
}

// --- hosts -----------------------------------------------------------------

var (
	macA  = [6]byte{0x02, 0, 0, 0, 0, 0xa}
	macB  = [6]byte{0x02, 0, 0, 0, 0, 0xb}
	addrA = netip.MustParseAddr("10.9.0.1")
	addrB = netip.MustParseAddr("10.9.0.2")
)

// rcHost is one side of an RC connection over the engine.
type rcHost struct {
	eng  *Engine
	qp   *rc.QP
	mu   sync.Mutex
	mem  *testMem
	rq   *testRQ
	buf  []byte
	spy  *spyPort
	path Path
}

func newRCHost(t *testing.T, p port.Port, now func() clock.Time, local, remote uint32, src, dst netip.Addr,
	srcMAC, dstMAC [6]byte, mtu int, tclass, hop uint8) *rcHost {
	t.Helper()
	h := &rcHost{mem: &testMem{mrs: map[uint32]*testMR{}}, rq: &testRQ{}, spy: &spyPort{Port: p, keep: 4096}}
	eng, err := New(Config{Port: h.spy, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	h.eng = eng
	h.buf = make([]byte, 1<<20)
	h.mem.mrs[0x1234] = &testMR{va: 0x10000, buf: h.buf, access: wr.LocalWrite | wr.RemoteWrite | wr.RemoteRead}
	h.qp = rc.New(local, 256, 4, h.mem, h.rq)
	cfg := rc.Config{QPN: local, DestQPN: remote, MTU: mtu, SQPSN: 100, RQPSN: 100, Timeout: 5, RetryCnt: 7, RNRRetry: 7,
		MinRNRTimer: 12, MaxRdAtomic: 16, MaxDestRdAtomic: 16, Access: wr.LocalWrite | wr.RemoteWrite | wr.RemoteRead, SQDepth: 256, MaxSGE: 4}
	h.qp.Receiver(cfg)
	h.qp.Sender(cfg)
	h.path = Path{SrcMAC: srcMAC, DstMAC: dstMAC, Src: src, Dst: dst, TrafficClass: tclass, HopLimit: hop,
		UDPSrcPort: UDPSourcePort(local, remote)}
	if err := eng.Attach(Attachment{QPN: local, Type: RC, Path: h.path, QP: h.qp, Lock: &h.mu}); err != nil {
		t.Fatal(err)
	}
	return h
}

// TestRCWriteOverMemlink moves RDMA WRITEs between two engines driving real
// RC QPs over an in-memory link in virtual time, with 2% loss in both
// directions so that the QPs' retransmit timers must fire, and checks the
// data and every frame put on the wire.
func TestRCWriteOverMemlink(t *testing.T) {
	vc := &memlink.VirtualClock{}
	pa, pb := memlink.NewPair(memlink.Config{Clock: vc.Now, Seed: 7, Impairments: memlink.Impairments{Loss: 0.02}})
	a := newRCHost(t, pa, vc.Now, 0x11, 0x12, addrA, addrB, macA, macB, 1024, 0x68, 33)
	b := newRCHost(t, pb, vc.Now, 0x12, 0x11, addrB, addrA, macB, macA, 1024, 0, 0)

	const msgs, size = 20, 65536
	src := make([]byte, size)
	for i := range src {
		src[i] = byte(i*7 + i>>8)
	}
	posted := 0
	var wcs []wr.WC
	for step := 0; step < 200000 && len(wcs) < msgs; step++ {
		a.mu.Lock()
		for posted < msgs && a.qp.SendQueueFree() > 0 {
			w := &wr.SendWQE{ID: uint64(posted), Opcode: wr.RDMAWrite, Flags: wr.Signaled, SG: [][]byte{src}, Length: size,
				RemoteAddr: 0x10000 + uint64(posted%8)*size, RKey: 0x1234}
			if !a.qp.Post(w) {
				break
			}
			posted++
		}
		wcs = append(wcs, a.qp.TakeCompletions()...)
		a.mu.Unlock()
		if len(wcs) == msgs {
			break
		}
		a.eng.Kick()
		wa, err := a.eng.Step(vc.Now(), 0)
		if err != nil {
			t.Fatal(err)
		}
		wb, err := b.eng.Step(vc.Now(), 0)
		if err != nil {
			t.Fatal(err)
		}
		if !wa && !wb {
			// Nothing to do now: jump to the next frame or timer.
			next := clock.Min(clock.Min(pa.NextDelivery(), pb.NextDelivery()), clock.Min(a.eng.nextDeadline(), b.eng.nextDeadline()))
			if next == clock.Never {
				t.Fatalf("stalled after %d completions", len(wcs))
			}
			if d := next.Sub(vc.Now()); d > 0 {
				vc.Advance(d)
			} else {
				vc.Advance(time.Microsecond)
			}
		}
	}
	if len(wcs) != msgs {
		t.Fatalf("%d of %d WRITEs completed", len(wcs), msgs)
	}
	for _, w := range wcs {
		if w.Status != wr.Success {
			t.Fatalf("completion %+v", w)
		}
	}
	for i := 0; i < 8; i++ {
		if !bytes.Equal(b.buf[i*size:(i+1)*size], src) {
			t.Fatalf("slot %d differs", i)
		}
	}
	ca, cb := a.eng.Counters(), b.eng.Counters()
	if pa.Stats().Lost == 0 || a.qp.Counters.Retransmits == 0 && a.qp.Counters.Timeouts == 0 {
		t.Errorf("loss %d but no retransmission: %+v", pa.Stats().Lost, a.qp.Counters)
	}
	if cb.RxDelivered == 0 || cb.RxBadICRC+cb.RxUnknownQP+cb.RxWrongPeer+cb.RxMalformed != 0 || ca.TxFrames == 0 {
		t.Errorf("counters A %+v B %+v", ca, cb)
	}
	checkFrames(t, a.spy.sent, a.path, 1024)
	checkFrames(t, b.spy.sent, b.path, 1024)
}

// checkFrames checks what the engine put on the wire for a QP.
func checkFrames(t *testing.T, frames [][]byte, p Path, mtu int) {
	t.Helper()
	if len(frames) == 0 {
		t.Fatal("no frames")
	}
	var f frame.Frame
	for i, b := range frames {
		if err := frame.Parse(b, &f); err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		ip := f.IPv4()
		if !f.VerifyICRC() || !icrc.Verify(f.Packet()) {
			t.Fatalf("frame %d: bad ICRC", i)
		}
		if f.UDP().Checksum() != 0 || f.UDP().SrcPort() != p.UDPSrcPort || f.UDP().DstPort() != 4791 {
			t.Fatalf("frame %d: UDP % x", i, f.UDP())
		}
		hop := p.HopLimit
		if hop == 0 {
			hop = 64
		}
		if !ip.DF() || ip.TOS() != p.TrafficClass || ip.TTL() != hop || !ip.ChecksumValid() {
			t.Fatalf("frame %d: IP DF %v TOS %#x TTL %d checksum ok %v", i, ip.DF(), ip.TOS(), ip.TTL(), ip.ChecksumValid())
		}
		if f.Src() != p.Src || f.Dst() != p.Dst || !bytes.Equal(f.Ethernet().Dst(), p.DstMAC[:]) {
			t.Fatalf("frame %d: addressed %v → %v", i, f.Src(), f.Dst())
		}
		if f.PayloadLen() > mtu || f.BTH().PKey() != 0xFFFF {
			t.Fatalf("frame %d: payload %d P_Key %#x", i, f.PayloadLen(), f.BTH().PKey())
		}
	}
}

// --- a fake QP for the drop and fairness tests -----------------------------

type fakeQP struct {
	got      [][]byte
	srcs     []netip.Addr
	out      int // packets left to send; -1: forever
	built    int
	dest     uint32
	deadline clock.Time
	expired  int
	to       *Path
}

func (q *fakeQP) Receive(now clock.Time, pkt []byte) { q.got = append(q.got, bytes.Clone(pkt)) }
func (q *fakeQP) ReceiveFrom(now clock.Time, pkt []byte, src netip.Addr) {
	q.Receive(now, pkt)
	q.srcs = append(q.srcs, src)
}
func (q *fakeQP) HasOutput() bool { return q.out != 0 }
func (q *fakeQP) Build(now clock.Time, buf []byte) int {
	if q.out == 0 {
		return 0
	}
	if q.out > 0 {
		q.out--
	}
	var h [12]byte
	bth.BTH(h[:]).Encode(&bth.BTHFields{Opcode: bth.RCSendOnly, PKey: 0xFFFF, DestQP: q.dest, PSN: bth.PSN(q.built)})
	n := copy(buf, h[:])
	n += copy(buf[n:], "payload!")
	q.built++
	return n
}
func (q *fakeQP) BuildTo(now clock.Time, buf []byte) (int, *Path) { return q.Build(now, buf), q.to }
func (q *fakeQP) Deadline() clock.Time {
	if q.deadline == 0 {
		return clock.Never
	}
	return q.deadline
}
func (q *fakeQP) Expire(now clock.Time) { q.expired++; q.deadline = 0 }

// craft builds a frame from src to dst for DestQP qpn with the given BTH tweaks.
func craft(t *testing.T, src, dst netip.Addr, qpn uint32, mod func(*frame.Spec)) []byte {
	t.Helper()
	s := frame.Spec{SrcMAC: macA, DstMAC: macB, Src: src, Dst: dst, SrcPort: 0xc001,
		BTH: bth.BTHFields{Opcode: bth.RCSendOnly, PKey: 0xFFFF, DestQP: qpn, PSN: 5}}
	if mod != nil {
		mod(&s)
	}
	buf := make([]byte, 2048)
	n, err := frame.Build(buf, &s, []byte("hello, RoCE"))
	if err != nil {
		t.Fatal(err)
	}
	return buf[:n]
}

// TestDropsDefects sends one frame with each defect the engine must catch
// and checks that each is counted, none reaches a QP, and nothing answers.
func TestDropsDefects(t *testing.T) {
	vc := &memlink.VirtualClock{}
	wire, pb := memlink.NewPair(memlink.Config{Clock: vc.Now})
	eng, err := New(Config{Port: pb, Now: vc.Now})
	if err != nil {
		t.Fatal(err)
	}
	rcq, udq := &fakeQP{}, &fakeQP{}
	if err := eng.Attach(Attachment{QPN: 0x20, Type: RC, QP: rcq, Path: Path{Src: addrB, Dst: addrA}}); err != nil {
		t.Fatal(err)
	}
	if err := eng.Attach(Attachment{QPN: 0x21, Type: UD, QP: udq, Path: Path{Src: addrB}}); err != nil {
		t.Fatal(err)
	}
	other := netip.MustParseAddr("10.9.0.99")
	badICRC := craft(t, addrA, addrB, 0x20, nil)
	badICRC[len(badICRC)-1] ^= 1
	badPKey := craft(t, addrA, addrB, 0x20, func(s *frame.Spec) { s.BTH.PKey = 0x8001 })
	badTVer := craft(t, addrA, addrB, 0x20, nil)
	bth.BTH(badTVer[frame.EthernetLen+frame.IPv4Len+frame.UDPLen:]).SetTVer(1)
	icrc.Stamp(badTVer[frame.EthernetLen:]) // only the TVer is wrong
	truncated := craft(t, addrA, addrB, 0x20, nil)
	truncated = truncated[:len(truncated)-6]
	cases := []struct {
		name  string
		frame []byte
		count func(Counters) uint64
	}{
		{"bad ICRC", badICRC, func(c Counters) uint64 { return c.RxBadICRC }},
		{"P_Key", badPKey, func(c Counters) uint64 { return c.RxBadPKey }},
		{"TVer", badTVer, func(c Counters) uint64 { return c.RxBadTVer }},
		{"DestQP 0", craft(t, addrA, addrB, 0, nil), func(c Counters) uint64 { return c.RxQP0 }},
		{"unknown QP", craft(t, addrA, addrB, 0x99, nil), func(c Counters) uint64 { return c.RxUnknownQP }},
		{"not the connected peer", craft(t, other, addrB, 0x20, nil), func(c Counters) uint64 { return c.RxWrongPeer }},
		{"not our address", craft(t, addrA, other, 0x20, nil), func(c Counters) uint64 { return c.RxWrongDst }},
		{"UD not our address", craft(t, addrA, other, 0x21, func(s *frame.Spec) {
			s.BTH.Opcode = bth.UDSendOnly
			s.DETH = frame.DETHFields{QKey: 0x11111111, SrcQP: 5}
		}), func(c Counters) uint64 { return c.RxWrongDst }},
		{"truncated", truncated, func(c Counters) uint64 { return c.RxMalformed }},
		{"not RoCE", append(append(make([]byte, 12), 0x08, 0x06), make([]byte, 46)...), func(c Counters) uint64 { return c.RxNotRoCE }},
	}
	for _, c := range cases {
		before := c.count(eng.Counters())
		if n, err := wire.Send([][]byte{c.frame}); n != 1 || err != nil {
			t.Fatal(n, err)
		}
		if _, err := eng.Step(vc.Now(), 0); err != nil {
			t.Fatal(err)
		}
		if got := c.count(eng.Counters()) - before; got != 1 {
			t.Errorf("%s: counted %d times", c.name, got)
		}
		if len(rcq.got)+len(udq.got) != 0 {
			t.Fatalf("%s: delivered to a QP", c.name)
		}
	}
	// The good ones get through, and UD reports the source.
	wire.Send([][]byte{craft(t, addrA, addrB, 0x20, nil), craft(t, other, addrB, 0x21, func(s *frame.Spec) {
		s.BTH.Opcode = bth.UDSendOnly
		s.DETH = frame.DETHFields{QKey: 0x11111111, SrcQP: 5}
	})})
	eng.Step(vc.Now(), 0)
	if len(rcq.got) != 1 || len(udq.got) != 1 || udq.srcs[0] != other {
		t.Fatalf("good frames: RC %d UD %d %v", len(rcq.got), len(udq.got), udq.srcs)
	}
	if !bytes.HasSuffix(rcq.got[0], []byte("hello, RoCE\x00")) && !bytes.Contains(rcq.got[0], []byte("hello, RoCE")) {
		t.Errorf("packet handed over: % x", rcq.got[0])
	}
	if wire.InFlight() != 0 {
		t.Errorf("the engine answered %d dropped frames", wire.InFlight())
	}
	c := eng.Counters()
	if c.RxFrames != uint64(len(cases)+2) || c.RxDelivered != 2 {
		t.Errorf("counters %+v", c)
	}
}

// TestFairAndBackPressure serves four always-busy QPs through a port that
// takes at most 10 frames per Send: every QP gets the same share, and no
// frame the QPs built is lost or reordered.
func TestFairAndBackPressure(t *testing.T) {
	vc := &memlink.VirtualClock{}
	pa, pb := memlink.NewPair(memlink.Config{Clock: vc.Now, Frames: 4096})
	spy := &spyPort{Port: pa, perSend: 10, keep: 1 << 20}
	eng, err := New(Config{Port: spy, Now: vc.Now, Quantum: 4})
	if err != nil {
		t.Fatal(err)
	}
	qps := make([]*fakeQP, 4)
	for i := range qps {
		qps[i] = &fakeQP{out: -1, dest: uint32(0x40 + i)}
		if err := eng.Attach(Attachment{QPN: uint32(0x30 + i), Type: RC, QP: qps[i], Path: Path{Src: addrA, Dst: addrB}}); err != nil {
			t.Fatal(err)
		}
	}
	var rx [64][]byte
	for i := 0; i < 100; i++ {
		if _, err := eng.Step(vc.Now(), 0); err != nil {
			t.Fatal(err)
		}
		for { // drain the far end so the link never fills
			n, _ := pb.Recv(rx[:], 0)
			if n == 0 {
				break
			}
		}
	}
	c := eng.Counters()
	if c.TxFrames != 1000 || c.TxBackPress == 0 {
		t.Fatalf("sent %d frames, back-pressure %d", c.TxFrames, c.TxBackPress)
	}
	for i, q := range qps {
		if q.built < 240 || q.built > 272 {
			t.Errorf("QP %d built %d of ~256", i, q.built)
		}
	}
	// Each QP's PSNs leave in order and without gaps.
	next := map[uint32]bth.PSN{}
	var f frame.Frame
	for i, b := range spy.sent {
		if err := frame.Parse(b, &f); err != nil || !f.VerifyICRC() {
			t.Fatalf("frame %d: %v", i, err)
		}
		q := f.BTH().DestQP()
		if f.BTH().PSN() != next[q] {
			t.Fatalf("frame %d: QP %#x PSN %d, want %d", i, q, f.BTH().PSN(), next[q])
		}
		next[q]++
	}
}

// TestTimers checks that due deadlines are expired and later ones are not.
func TestTimers(t *testing.T) {
	vc := &memlink.VirtualClock{}
	pa, _ := memlink.NewPair(memlink.Config{Clock: vc.Now})
	eng, _ := New(Config{Port: pa, Now: vc.Now})
	early, late := &fakeQP{deadline: 1000}, &fakeQP{deadline: 5000}
	eng.Attach(Attachment{QPN: 1, QP: early, Path: Path{Src: addrA, Dst: addrB}})
	eng.Attach(Attachment{QPN: 2, QP: late, Path: Path{Src: addrA, Dst: addrB}})
	if eng.nextDeadline() != 1000 {
		t.Fatalf("next deadline %v", eng.nextDeadline())
	}
	vc.Advance(2 * time.Microsecond)
	eng.Step(vc.Now(), 0)
	if early.expired != 1 || late.expired != 0 || eng.nextDeadline() != 5000 {
		t.Fatalf("expired early %d late %d next %v", early.expired, late.expired, eng.nextDeadline())
	}
	eng.Detach(2)
	if eng.nextDeadline() != clock.Never {
		t.Fatal("detached QP's timer still counted")
	}
}

func TestAttachRejects(t *testing.T) {
	pa, _ := memlink.NewPair(memlink.Config{})
	eng, _ := New(Config{Port: pa})
	q := &fakeQP{}
	for name, a := range map[string]Attachment{
		"QPN 0":           {QPN: 0, QP: q, Path: Path{Src: addrA, Dst: addrB}},
		"QPN > 24 bits":   {QPN: 1 << 24, QP: q, Path: Path{Src: addrA, Dst: addrB}},
		"no QP":           {QPN: 5, Path: Path{Src: addrA, Dst: addrB}},
		"no source":       {QPN: 5, QP: q, Path: Path{Dst: addrB}},
		"RC without peer": {QPN: 5, QP: q, Path: Path{Src: addrA}},
		"mixed families":  {QPN: 5, QP: q, Path: Path{Src: addrA, Dst: netip.MustParseAddr("fd00::1")}},
		"UD not datagram": {QPN: 5, Type: UD, QP: struct{ QP }{q}, Path: Path{Src: addrA}},
	} {
		if err := eng.Attach(a); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if err := eng.Attach(Attachment{QPN: 5, QP: q, Path: Path{Src: addrA, Dst: addrB}}); err != nil {
		t.Fatal(err)
	}
	if err := eng.Attach(Attachment{QPN: 5, QP: q, Path: Path{Src: addrA, Dst: addrB}}); err == nil {
		t.Error("duplicate QPN accepted")
	}
}

// TestNoAllocsPerPacket asserts that a loop iteration receiving and sending
// full batches allocates nothing.
func TestNoAllocsPerPacket(t *testing.T) {
	vc := &memlink.VirtualClock{}
	pa, pb := memlink.NewPair(memlink.Config{Clock: vc.Now, Frames: 1024})
	a, _ := New(Config{Port: pa, Now: vc.Now})
	b, _ := New(Config{Port: pb, Now: vc.Now})
	var mu sync.Mutex
	src, cnt := &fakeQP{out: -1, dest: 0x51}, &countQP{}
	a.Attach(Attachment{QPN: 0x50, QP: src, Path: Path{Src: addrA, Dst: addrB, UDPSrcPort: 0xc123}, Lock: &mu})
	b.Attach(Attachment{QPN: 0x51, QP: cnt, Path: Path{Src: addrB, Dst: addrA}, Lock: &mu})
	step := func() {
		a.Step(vc.Now(), 0)
		b.Step(vc.Now(), 0)
	}
	for i := 0; i < 10; i++ {
		step()
	}
	allocs := testing.AllocsPerRun(100, step)
	if allocs != 0 {
		t.Errorf("%.1f allocations per loop of %d frames", allocs, port.BatchSize)
	}
	if cnt.n < 100*port.BatchSize || b.Counters().RxDelivered != uint64(cnt.n) {
		t.Errorf("delivered %d, counters %+v", cnt.n, b.Counters())
	}
}

type countQP struct{ n int }

func (q *countQP) Receive(clock.Time, []byte)   { q.n++ }
func (q *countQP) Build(clock.Time, []byte) int { return 0 }
func (q *countQP) HasOutput() bool              { return false }
func (q *countQP) Deadline() clock.Time         { return clock.Never }
func (q *countQP) Expire(clock.Time)            {}

// TestRunConcurrent runs two engines in real time with Run, each in its
// own goroutine, while the test goroutine posts and polls through the QP
// locks: the race detector checks the locking.
func TestRunConcurrent(t *testing.T) {
	pa, pb := memlink.NewPair(memlink.Config{})
	a := newRCHost(t, pa, nil, 0x11, 0x12, addrA, addrB, macA, macB, 4096, 0, 0)
	b := newRCHost(t, pb, nil, 0x12, 0x11, addrB, addrA, macB, macA, 4096, 0, 0)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for _, h := range []*rcHost{a, b} {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- h.eng.Run(ctx) }()
	}
	defer func() { cancel(); pa.Close(); pb.Close(); wg.Wait() }()
	b.mu.Lock()
	for i := 0; i < 4; i++ {
		b.rq.q = append(b.rq.q, wr.RecvWQE{ID: uint64(i), SG: [][]byte{b.buf[i*8192 : (i+1)*8192]}, Length: 8192})
	}
	b.mu.Unlock()
	msg := bytes.Repeat([]byte("0123456789abcdef"), 500)
	for i := 0; i < 4; i++ {
		a.mu.Lock()
		a.qp.Post(&wr.SendWQE{ID: uint64(i), Opcode: wr.Send, Flags: wr.Signaled, SG: [][]byte{msg}, Length: uint32(len(msg))})
		a.mu.Unlock()
		a.eng.Kick()
	}
	var got []wr.WC
	deadline := time.Now().Add(10 * time.Second)
	for len(got) < 4 && time.Now().Before(deadline) {
		b.mu.Lock()
		got = append(got, b.qp.TakeCompletions()...)
		b.mu.Unlock()
		time.Sleep(100 * time.Microsecond)
	}
	if len(got) != 4 {
		t.Fatalf("%d of 4 receives completed", len(got))
	}
	for i, w := range got {
		if w.Status != wr.Success || w.ByteLen != uint32(len(msg)) || !bytes.Equal(b.buf[i*8192:i*8192+len(msg)], msg) {
			t.Fatalf("receive %d: %+v", i, w)
		}
	}
}

// TestUDPSourcePortMatchesRxe checks UDPSourcePort against every RC and UD
// frame of the reference rxe captures.
func TestUDPSourcePortMatchesRxe(t *testing.T) {
	dir := filepath.Join("..", "..", "shared", "vectors")
	files, _ := filepath.Glob(filepath.Join(dir, "*.pcap"))
	if len(files) == 0 {
		t.Skip("reference captures not available")
	}
	checked := 0
	for _, name := range files {
		frames := readPcap(t, name)
		// The QPN each address sends to, to know both ends of an RC pair.
		dests := map[netip.Addr]map[uint32]bool{}
		var f frame.Frame
		for _, b := range frames {
			if frame.Parse(b, &f) != nil {
				continue
			}
			if dests[f.Src()] == nil {
				dests[f.Src()] = map[uint32]bool{}
			}
			dests[f.Src()][f.BTH().DestQP()] = true
		}
		for _, b := range frames {
			if frame.Parse(b, &f) != nil || f.Opcode() == bth.CNP {
				continue
			}
			var want uint16
			if d := f.DETH(); d != nil {
				if f.BTH().DestQP() == 1 { // CM MADs from QP1 use a port of their own
					continue
				}
				want = UDPSourcePort(d.SrcQP(), 0)
			} else {
				// An RC pair: this end's QPN is the one the peer sends to.
				back := dests[f.Dst()]
				if len(back) != 1 {
					continue // several QPs between the hosts: pairing is ambiguous
				}
				var local uint32
				for q := range back {
					local = q
				}
				want = UDPSourcePort(local, f.BTH().DestQP())
			}
			if got := f.UDP().SrcPort(); got != want {
				t.Fatalf("%s: QP %#x: capture's source port %d, ours %d", filepath.Base(name), f.BTH().DestQP(), got, want)
			}
			checked++
		}
	}
	if checked < 1000 {
		t.Fatalf("only %d frames checked", checked)
	}
	if UDPSourcePort(0x11, 0x11) != 49441 || UDPSourcePort(0x14, 0) != 59626 {
		t.Error("known values")
	}
}

func readPcap(t *testing.T, name string) [][]byte {
	t.Helper()
	fh, err := os.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	r, err := pcapgo.NewReader(fh)
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for {
		data, _, err := r.ReadPacketData()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, bytes.Clone(data))
	}
}

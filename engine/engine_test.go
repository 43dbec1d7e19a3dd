package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/frame"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/icrc"
	"github.com/softrnic/softrnic/internal/checker"
	"github.com/softrnic/softrnic/internal/ibtest"
	"github.com/softrnic/softrnic/internal/rnictest"
	"github.com/softrnic/softrnic/port"
	"github.com/softrnic/softrnic/port/memlink"
	"github.com/softrnic/softrnic/rnic"
	"github.com/softrnic/softrnic/verbs"
)

var (
	macA  = [6]byte{0x02, 0, 0, 0, 0, 0xa}
	macB  = [6]byte{0x02, 0, 0, 0, 0, 0xb}
	addrA = netip.MustParseAddr("10.9.0.1")
	addrB = netip.MustParseAddr("10.9.0.2")
)

func newDevice(t testing.TB, mac [6]byte, addr netip.Addr, mtu int) *rnic.Device {
	t.Helper()
	d, err := rnic.NewDevice(rnic.Config{MAC: mac, Addrs: []netip.Addr{addr}, PortMTU: mtu})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// host is a device with one MR and one CQ.
type host struct {
	dev *rnic.Device
	pd  *rnic.PD
	mr  *rnic.MR
	cq  *rnic.CQ
}

func newHost(t testing.TB, mac [6]byte, addr netip.Addr, mtu, memSize int) *host {
	return newHostOn(t, newDevice(t, mac, addr, mtu), memSize)
}

// newHostOn is newHost on a device of the caller's.
func newHostOn(t testing.TB, dev *rnic.Device, memSize int) *host {
	h := &host{dev: dev}
	h.pd = rnictest.PD(h.dev)
	var err error
	h.mr, err = h.pd.RegBytes(make([]byte, memSize), 0, ib.LocalWrite|ib.RemoteWrite|ib.RemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	h.cq = rnictest.CQ(h.dev, 4096)
	return h
}

func (h *host) createQP(t testing.TB, typ ib.QPType) *rnic.QP {
	t.Helper()
	q, err := rnictest.QP(h.pd, rnictest.QPAttr{Type: typ, SendCQ: h.cq, RecvCQ: h.cq, MaxSendWR: 1024, MaxRecvWR: 1024, MaxSGE: 1})
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// connect moves q through INIT, RTR and RTS towards the peer QP peerQPN at
// peerMAC/peerAddr, with receive PSN rqpsn and send PSN sqpsn.
func connect(t testing.TB, q *rnic.QP, mtu int, peerQPN uint32, peerMAC [6]byte, peerAddr netip.Addr, rqpsn, sqpsn uint32) {
	t.Helper()
	steps := []struct {
		s ib.QPState
		a ib.QPAttr
	}{
		{ib.Init, ib.QPAttr{Access: ib.RemoteWrite}},
		{ib.RTR, ib.QPAttr{PathMTU: uint32(mtu), DestQPN: peerQPN, RQPSN: rqpsn, MaxDestRdAtomic: 16, MinRNRTimer: 12,
			AV: ib.AddressVector{DMAC: peerMAC, DGID: ib.GIDFrom(peerAddr)}}},
		{ib.RTS, ib.QPAttr{SQPSN: sqpsn, Timeout: 8, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 16}},
	}
	for _, s := range steps {
		if err := ibtest.Modify(q, s.s, &s.a); err != nil {
			t.Fatalf("QP %#x to %v: %v", q.QPN(), s.s, err)
		}
	}
}

// craft builds a RoCEv2 frame from src to dst for DestQP qpn.
func craft(t *testing.T, src, dst netip.Addr, qpn, psn uint32, mod func(*frame.Spec)) []byte {
	t.Helper()
	s := frame.Spec{SrcMAC: macA, DstMAC: macB, Src: src, Dst: dst, SrcPort: 0xc001,
		BTH: bth.BTHFields{Opcode: bth.RCSendOnly, PKey: 0xFFFF, DestQP: qpn, PSN: bth.PSN(psn), AckReq: true}}
	if mod != nil {
		mod(&s)
	}
	buf := make([]byte, 2048)
	n, err := frame.Build(buf, &s, []byte("hello, RoCE!"))
	if err != nil {
		t.Fatal(err)
	}
	return buf[:n]
}

// drops sums every drop counter of a device.
func drops(s rnic.Stats) uint64 {
	return s.RxParseErr + s.RxNotLocal + s.RxBadHeader + s.RxNoQP + s.RxBadICRC + s.RxBadType + s.RxBadSrc + s.RxBadState
}

// TestDropsDefects sends a device driven by a Loop one frame with each
// defect the engine issue lists (and a few more), through a raw wire: each
// is counted exactly once, under its own reason, in the device's Stats;
// none completes a receive; none is answered. Then a good frame is
// delivered and answered, so the test can tell a drop from a deaf device.
func TestDropsDefects(t *testing.T) {
	vc := &memlink.VirtualClock{}
	wire, pb := memlink.NewPair(memlink.Config{Clock: vc.Now})
	b, rq, cases := defectSetup(t)
	loop, err := NewLoop(b.dev, pb, Options{Now: vc.Now})
	if err != nil {
		t.Fatal(err)
	}
	var wcs [4]ib.WC
	for _, c := range cases {
		before, beforeAll := c.count(b.dev.Stats), drops(b.dev.Stats)
		if n, err := port.Send(wire, [][]byte{c.frame}); n != 1 || err != nil {
			t.Fatal(n, err)
		}
		for i := 0; i < 3; i++ {
			vc.Advance(time.Microsecond)
			if _, err := loop.Step(vc.Now(), 0); err != nil {
				t.Fatal(err)
			}
		}
		if got := c.count(b.dev.Stats) - before; got != 1 {
			t.Errorf("%s: counted %d times under its reason", c.name, got)
		}
		if got := drops(b.dev.Stats) - beforeAll; got != 1 {
			t.Errorf("%s: counted %d times in all (%+v)", c.name, got, b.dev.Stats)
		}
		if n := b.cq.Poll(wcs[:]); n != 0 {
			t.Fatalf("%s: completed %+v", c.name, wcs[:n])
		}
		if wire.InFlight() != 0 {
			t.Fatalf("%s: answered", c.name)
		}
	}
	if ds := loop.DeviceStats(); ds != b.dev.Stats {
		t.Errorf("published stats %+v, device %+v", ds, b.dev.Stats)
	}
	// A good frame is delivered (the receive completes with its bytes) and
	// answered (an ACK, since it asks for one).
	if _, err := port.Send(wire, [][]byte{craft(t, addrA, addrB, rq, 5, nil)}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		vc.Advance(time.Microsecond)
		if _, err := loop.Step(vc.Now(), 0); err != nil {
			t.Fatal(err)
		}
	}
	if n := b.cq.Poll(wcs[:]); n != 1 || wcs[0].ID != 7 || wcs[0].Status != ib.Success || string(b.mr.Bytes()[:12]) != "hello, RoCE!" {
		t.Fatalf("good frame: %d completions %+v", n, wcs[0])
	}
	in := make([][]byte, 4)
	n, _ := wire.Recv(in, 0)
	if n != 1 {
		t.Fatalf("answer to the good frame: %d frames", n)
	}
	checker.Frame(t, in[0], checker.Dst(addrA), checker.TransportIs(checker.Opcode(bth.RCAcknowledge)))
	if c := loop.Counters(); c.TxSent != 1 || c.Loops == 0 {
		t.Errorf("loop counters %+v", c)
	}
}

// TestDropsDefectsRun is TestDropsDefects through engine.Run in real time:
// every defective frame at once, then a good one; once the good one has
// completed and Run has ended, each reason counted its frames, and the one
// frame sent back is the good one's ACK.
func TestDropsDefectsRun(t *testing.T) {
	wire, pb := memlink.NewPair(memlink.Config{})
	defer wire.Close()
	b, rq, cases := defectSetup(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, b.dev, pb, Options{}) }()
	want := map[string]uint64{}
	reasons := map[string]func(rnic.Stats) uint64{}
	for _, c := range cases {
		if n, err := port.Send(wire, [][]byte{c.frame}); n != 1 || err != nil {
			t.Fatal(n, err)
		}
		want[c.name]++
		reasons[c.name] = c.count
	}
	if _, err := port.Send(wire, [][]byte{craft(t, addrA, addrB, rq, 5, nil)}); err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	var wcs [4]ib.WC
	n, err := b.cq.PollWait(wctx, wcs[:])
	cancel()
	if rerr := <-done; rerr != nil {
		t.Fatalf("Run: %v", rerr)
	}
	if err != nil || n != 1 || wcs[0].ID != 7 || wcs[0].Status != ib.Success {
		t.Fatalf("good frame: %d completions %+v, %v", n, wcs[0], err)
	}
	st := b.dev.Stats // Run has ended: the device's counters are ours to read
	if drops(st) != uint64(len(cases)) || st.RxFrames != uint64(len(cases)+1) {
		t.Errorf("%d frames, %d drops counted, want %d and %d: %+v", st.RxFrames, drops(st), len(cases)+1, len(cases), st)
	}
	// Each reason's counter holds at least the frames sent for it (several
	// cases share a counter; TestDropsDefects checks them one at a time).
	for name, count := range reasons {
		if count(st) < want[name] {
			t.Errorf("%s: counter %d", name, count(st))
		}
	}
	in := make([][]byte, 8)
	got, _ := wire.Recv(in, 100*time.Millisecond)
	if got != 1 {
		t.Fatalf("%d frames sent back, want the good frame's ACK alone", got)
	}
	checker.Frame(t, in[0], checker.TransportIs(checker.Opcode(bth.RCAcknowledge)))
}

type defectCase struct {
	name  string
	frame []byte
	count func(rnic.Stats) uint64
}

// defectSetup makes the receiving host of the drop tests — an RC QP
// connected to 0x99 at addrA with a receive posted (WR 7), a UD QP — and one
// frame per defect with the counter that must count it.
func defectSetup(t *testing.T) (*host, uint32, []defectCase) {
	b := newHost(t, macB, addrB, 1024, 1<<16)
	rcQP := b.createQP(t, ib.RC)
	connect(t, rcQP, 1024, 0x99, macA, addrA, 5, 1000)
	if _, err := rcQP.PostRecv([]verbs.RecvWR{{ID: 7, SG: []ib.SGE{{Addr: b.mr.IOVA(), Length: 256, LKey: b.mr.LKey()}}}}); err != nil {
		t.Fatal(err)
	}
	udQP := b.createQP(t, ib.UD)
	for _, s := range []struct {
		s ib.QPState
		a ib.QPAttr
	}{{ib.Init, ib.QPAttr{QKey: 0x11111111}}, {ib.RTR, ib.QPAttr{}}, {ib.RTS, ib.QPAttr{}}} {
		if err := ibtest.Modify(udQP, s.s, &s.a); err != nil {
			t.Fatal(err)
		}
	}
	rq := rcQP.QPN()
	other := netip.MustParseAddr("10.9.0.99")
	hdr := frame.EthernetLen + frame.IPv4Len + frame.UDPLen
	badICRC := craft(t, addrA, addrB, rq, 5, nil)
	badICRC[len(badICRC)-1] ^= 1
	badTVer := craft(t, addrA, addrB, rq, 5, nil)
	bth.BTH(badTVer[hdr:]).SetTVer(1)
	// only the TVer is wrong
	if err := icrc.Stamp(badTVer[frame.EthernetLen:]); err != nil {
		t.Fatal(err)
	}
	truncated := craft(t, addrA, addrB, rq, 5, nil)
	truncated = truncated[:len(truncated)-6]
	udSend := func(s *frame.Spec) {
		s.BTH.Opcode = bth.UDSendOnly
		s.DETH = frame.DETHFields{QKey: 0x11111111, SrcQP: 5}
	}
	cases := []defectCase{
		{"bad ICRC", badICRC, func(s rnic.Stats) uint64 { return s.RxBadICRC }},
		{"P_Key 0x8001", craft(t, addrA, addrB, rq, 5, func(s *frame.Spec) { s.BTH.PKey = 0x8001 }), func(s rnic.Stats) uint64 { return s.RxBadHeader }},
		{"P_Key 0x0000", craft(t, addrA, addrB, rq, 5, func(s *frame.Spec) { s.BTH.PKey = 0 }), func(s rnic.Stats) uint64 { return s.RxBadHeader }},
		{"TVer 1", badTVer, func(s rnic.Stats) uint64 { return s.RxParseErr + s.RxBadHeader }},
		{"DestQP 0", craft(t, addrA, addrB, 0, 5, nil), func(s rnic.Stats) uint64 { return s.RxNoQP }},
		{"unknown QP", craft(t, addrA, addrB, 0xabcde, 5, nil), func(s rnic.Stats) uint64 { return s.RxNoQP }},
		{"RC source not the connected peer", craft(t, other, addrB, rq, 5, nil), func(s rnic.Stats) uint64 { return s.RxBadSrc }},
		{"not our address", craft(t, addrA, other, rq, 5, nil), func(s rnic.Stats) uint64 { return s.RxNotLocal }},
		{"UD not our address", craft(t, addrA, other, udQP.QPN(), 0, udSend), func(s rnic.Stats) uint64 { return s.RxNotLocal }},
		{"UD opcode to an RC QP", craft(t, addrA, addrB, rq, 5, udSend), func(s rnic.Stats) uint64 { return s.RxBadType }},
		{"truncated", truncated, func(s rnic.Stats) uint64 { return s.RxParseErr }},
		{"not RoCE", append(append(make([]byte, 12), 0x08, 0x06), make([]byte, 46)...), func(s rnic.Stats) uint64 { return s.RxParseErr }},
	}
	return b, rq, cases
}

// limitPort takes at most max frames per Submit, to exercise back-pressure.
type limitPort struct {
	port.Port
	max int
}

func (p *limitPort) Submit(frames [][]byte) (int, error) {
	if len(frames) > p.max {
		frames = frames[:p.max]
	}
	return p.Port.Submit(frames)
}

// pair is two hosts whose Loops are stepped from the test goroutine in
// virtual time.
type pair struct {
	vc       *memlink.VirtualClock
	a, b     *host
	la, lb   *Loop
	pa, pb   *memlink.Port
	qpA, qpB []*rnic.QP
}

func newPair(t testing.TB, mtu, qps, memSize, sendLimit int) *pair {
	p := &pair{vc: &memlink.VirtualClock{}}
	p.pa, p.pb = memlink.NewPair(memlink.Config{Clock: p.vc.Now, Frames: 2048})
	p.a = newHost(t, macA, addrA, mtu, memSize)
	p.b = newHost(t, macB, addrB, mtu, memSize)
	var pa, pb port.Port = p.pa, p.pb
	if sendLimit > 0 {
		pa, pb = &limitPort{Port: p.pa, max: sendLimit}, &limitPort{Port: p.pb, max: sendLimit}
	}
	var err error
	if p.la, err = NewLoop(p.a.dev, pa, Options{Now: p.vc.Now}); err != nil {
		t.Fatal(err)
	}
	if p.lb, err = NewLoop(p.b.dev, pb, Options{Now: p.vc.Now}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < qps; i++ {
		qa, qb := p.a.createQP(t, ib.RC), p.b.createQP(t, ib.RC)
		connect(t, qa, mtu, qb.QPN(), macB, addrB, 77, 55)
		connect(t, qb, mtu, qa.QPN(), macA, addrA, 55, 77)
		p.qpA, p.qpB = append(p.qpA, qa), append(p.qpB, qb)
	}
	return p
}

func (p *pair) step(t testing.TB) {
	p.vc.Advance(time.Microsecond)
	if _, err := p.la.Step(p.vc.Now(), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := p.lb.Step(p.vc.Now(), 0); err != nil {
		t.Fatal(err)
	}
}

// TestWritesUnderBackPressure moves RDMA WRITEs on four QPs through ports
// that take at most 5 frames per Send: the frames the port refused are
// kept and sent first, in order, so every byte arrives and every WRITE
// completes without a retransmission.
func TestWritesUnderBackPressure(t *testing.T) {
	const qps, chunk = 4, 1 << 16
	p := newPair(t, 1024, qps, qps*chunk, 5)
	src := p.a.mr.Bytes()
	for i := range src {
		src[i] = byte(i*13 + i>>9)
	}
	for i, q := range p.qpA {
		off := uint64(i * chunk)
		if _, err := q.PostSend([]verbs.SendWR{{ID: uint64(i), Opcode: ib.RDMAWrite, Flags: ib.Signaled,
			SG: []ib.SGE{{Addr: p.a.mr.IOVA() + off, Length: chunk, LKey: p.a.mr.LKey()}}, RemoteAddr: p.b.mr.IOVA() + off, RKey: p.b.mr.RKey()}}); err != nil {
			t.Fatal(err)
		}
	}
	var wcs [8]ib.WC
	done := 0
	for i := 0; i < 100000 && done < qps; i++ {
		p.step(t)
		for _, w := range wcs[:p.a.cq.Poll(wcs[:])] {
			if w.Status != ib.Success {
				t.Fatalf("WRITE %d: %v", w.ID, w.Status)
			}
			done++
		}
	}
	if done != qps {
		t.Fatalf("%d of %d WRITEs completed", done, qps)
	}
	if !bytes.Equal(p.b.mr.Bytes(), src) {
		t.Fatal("the peer's memory differs from what was written")
	}
	ca := p.la.Counters()
	if ca.TxBackPress == 0 || ca.TxSent != p.a.dev.Stats.TxFrames {
		t.Errorf("sender: counters %+v, device built %d frames", ca, p.a.dev.Stats.TxFrames)
	}
	want := uint64(qps * chunk / 1024)
	if p.a.dev.Stats.TxFrames != want || p.b.dev.Stats.RxFrames != want {
		t.Errorf("sent %d frames, peer received %d, want %d (no loss, no retransmission)", p.a.dev.Stats.TxFrames, p.b.dev.Stats.RxFrames, want)
	}
	if drops(p.b.dev.Stats) != 0 || drops(p.a.dev.Stats) != 0 {
		t.Errorf("drops: %+v %+v", p.a.dev.Stats, p.b.dev.Stats)
	}
}

// TestNoAllocsPerLoop asserts that the loop's steady state — full batches
// of WRITE segments one way, ACKs the other, through both devices and the
// link — allocates nothing per iteration.
func TestNoAllocsPerLoop(t *testing.T) {
	const msg = 4 << 20
	p := newPair(t, 4096, 1, msg, 0)
	post := func(id uint64) {
		if _, err := p.qpA[0].PostSend([]verbs.SendWR{{ID: id, Opcode: ib.RDMAWrite,
			SG: []ib.SGE{{Addr: p.a.mr.IOVA(), Length: msg, LKey: p.a.mr.LKey()}}, RemoteAddr: p.b.mr.IOVA(), RKey: p.b.mr.RKey()}}); err != nil {
			t.Fatal(err)
		}
	}
	for i := uint64(0); i < 4; i++ { // 4 × 1024 packets: more than the runs below move
		post(i)
	}
	for i := 0; i < 20; i++ {
		p.step(t)
	}
	before := p.b.dev.Stats.RxFrames
	allocs := testing.AllocsPerRun(200, func() { p.step(t) })
	moved := p.b.dev.Stats.RxFrames - before
	if allocs != 0 {
		t.Errorf("%.2f allocations per loop iteration", allocs)
	}
	if moved < 201*8 {
		t.Errorf("only %d frames moved in 201 iterations: not a steady state", moved)
	}
}

// TestRunConcurrent runs two engines in real time with Run, each in its
// own goroutine, while the test goroutine posts and polls, and reads the
// counters: the race detector checks the sharing. Cancelling the context
// ends both loops without error.
func TestRunConcurrent(t *testing.T) {
	r := runHosts(t, 1<<16)
	a, b, la, lb, errs, stop := r.a, r.b, r.la, r.lb, r.errs, r.stop
	defer stop()
	qa, qb := a.createQP(t, ib.UC), b.createQP(t, ib.UC)
	connect(t, qa, 4096, qb.QPN(), macB, addrB, 1, 2)
	connect(t, qb, 4096, qa.QPN(), macA, addrA, 2, 1)
	const n, size = 8, 6000
	for i := 0; i < n; i++ {
		if _, err := qb.PostRecv([]verbs.RecvWR{{ID: uint64(i), SG: []ib.SGE{{Addr: b.mr.IOVA() + uint64(i*size), Length: size, LKey: b.mr.LKey()}}}}); err != nil {
			t.Fatal(err)
		}
	}
	src := a.mr.Bytes()
	for i := range src {
		src[i] = byte(i * 3)
	}
	for i := 0; i < n; i++ {
		if _, err := qa.PostSend([]verbs.SendWR{{ID: uint64(i), Opcode: ib.Send, Flags: ib.Signaled,
			SG: []ib.SGE{{Addr: a.mr.IOVA() + uint64(i*size), Length: size, LKey: a.mr.LKey()}}}}); err != nil {
			t.Fatal(err)
		}
	}
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	var wcs [n]ib.WC
	for got := 0; got < n; {
		k, err := b.cq.PollWait(wctx, wcs[got:])
		if err != nil {
			t.Fatalf("%d of %d receives: %v", got, n, err)
		}
		for _, w := range wcs[got : got+k] {
			if w.Status != ib.Success || w.ByteLen != size {
				t.Fatalf("receive %+v", w)
			}
		}
		got += k
		_ = lb.DeviceStats() // from another goroutine than the loop's
		_ = la.Counters()
	}
	if !bytes.Equal(b.mr.Bytes()[:n*size], src[:n*size]) {
		t.Fatal("received bytes differ")
	}
	stop()
	for i := 0; i < 2; i++ {
		if err := <-errs; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
	if s := lb.DeviceStats(); s.RxFrames == 0 || drops(s) != 0 {
		t.Errorf("receiver stats %+v", s)
	}
}

// running is two hosts joined by a memlink pair, each driven by Run in a
// goroutine of its own, in real time.
type running struct {
	a, b   *host
	la, lb *Loop
	errs   <-chan error // each Run's return, after stop
	stop   func()       // ends both loops and closes the ports; idempotent
}

// runHosts starts two hosts (MTU 4096, memSize bytes of MR each) with
// their loops running.
func runHosts(t *testing.T, memSize int) *running {
	pa, pb := memlink.NewPair(memlink.Config{})
	r := &running{a: newHost(t, macA, addrA, 4096, memSize), b: newHost(t, macB, addrB, 4096, memSize)}
	r.la, _ = NewLoop(r.a.dev, pa, Options{})
	r.lb, _ = NewLoop(r.b.dev, pb, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	errs := make(chan error, 2)
	var wg sync.WaitGroup
	for _, l := range []*Loop{r.la, r.lb} {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- l.Run(ctx) }()
	}
	var once sync.Once
	r.errs, r.stop = errs, func() {
		once.Do(func() {
			cancel()
			wg.Wait()
			pa.Close()
			pb.Close()
		})
	}
	return r
}

// TestRunPortError: a port that fails ends Run with its error.
func TestRunPortError(t *testing.T) {
	pa, _ := memlink.NewPair(memlink.Config{})
	dev := newDevice(t, macA, addrA, 1024)
	pa.Close()
	err := Run(context.Background(), dev, pa, Options{})
	if !errors.Is(err, port.ErrClosed) {
		t.Fatalf("Run on a closed port: %v", err)
	}
}

// TestNewLoopRejects: frames too small for the device's MTU, no device.
func TestNewLoopRejects(t *testing.T) {
	small, _ := memlink.NewPair(memlink.Config{MaxFrame: 1200})
	if _, err := NewLoop(newDevice(t, macA, addrA, 4096), small, Options{}); err == nil {
		t.Error("a 4096 MTU device on 1200-byte frames accepted")
	}
	if _, err := NewLoop(newDevice(t, macA, addrA, 1024), small, Options{}); err != nil {
		t.Errorf("1024 MTU on 1200-byte frames: %v", err)
	}
	if _, err := NewLoop(nil, small, Options{}); err == nil {
		t.Error("nil device accepted")
	}
	_ = fmt.Sprint(clock.Never)
}

// TestPostWakesNap: a napping loop is woken by the device's doorbell, not
// by the end of its nap. With naps of an hour, a SEND posted while the
// loop naps still reaches the wire (within the test's bound of seconds).
func TestPostWakesNap(t *testing.T) {
	wire, pa := memlink.NewPair(memlink.Config{})
	defer wire.Close()
	a := newHost(t, macA, addrA, 1024, 1<<16)
	q := a.createQP(t, ib.RC)
	connect(t, q, 1024, 0x99, macB, addrB, 1, 1)
	l, err := NewLoop(a.dev, pa, Options{IdleWait: time.Hour, DeepIdleAfter: 2 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	defer func() {
		cancel() // ends the nap through ctx.Done
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	for i := 0; l.Counters().Naps == 0; i++ {
		if i > 5000 {
			t.Fatal("the idle loop never napped")
		}
		time.Sleep(time.Millisecond)
	}
	naps := l.Counters().Naps
	if _, err := q.PostSend([]verbs.SendWR{{ID: 1, Opcode: ib.Send, SG: []ib.SGE{{Addr: a.mr.IOVA(), Length: 100, LKey: a.mr.LKey()}}}}); err != nil {
		t.Fatal(err)
	}
	in := make([][]byte, 4)
	n, err := wire.Recv(in, 10*time.Second)
	// A slow test goroutine (race detector, load) may also find the SEND's
	// retransmission, 1 ms later: the first frame is the SEND.
	if err != nil || n < 1 {
		t.Fatalf("after the post: %d frames, %v; counters %+v", n, err, l.Counters())
	}
	checker.Frame(t, in[0], checker.TransportIs(checker.Opcode(bth.RCSendOnly)))
	if l.Counters().Naps < naps {
		t.Fatal("counters went back")
	}
}

// TestPollDrivesPingPong runs two loops whose naps last an hour while the
// test goroutine, as both applications, plays 200 rounds of RC SEND
// ping-pong and busy-polls with rnic.Device.Poll: the inline steps move
// every frame (the naps never end, timers lie seconds ahead, and posts
// made after a Poll do not ring the doorbell), with no allocation per
// Poll. Once Run has returned, Poll does nothing. The devices count a
// Poll as fresh for an hour, not DefaultPollFresh, so that whether a post
// rings does not depend on how fast the test goroutine runs.
func TestPollDrivesPingPong(t *testing.T) {
	pa, pb := memlink.NewPair(memlink.Config{})
	defer pa.Close()
	defer pb.Close()
	polled := func(mac [6]byte, addr netip.Addr) *host {
		d, err := rnic.NewDevice(rnic.Config{MAC: mac, Addrs: []netip.Addr{addr}, PortMTU: 1024, PollFresh: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return newHostOn(t, d, 1<<16)
	}
	a, b := polled(macA, addrA), polled(macB, addrB)
	opt := Options{IdleWait: time.Hour, PolledWait: time.Hour, DeepIdleAfter: 2 * time.Hour}
	la, _ := NewLoop(a.dev, pa, opt)
	lb, _ := NewLoop(b.dev, pb, opt)
	qa, qb := a.createQP(t, ib.RC), b.createQP(t, ib.RC)
	slowConnect := func(q *rnic.QP, peer uint32, mac [6]byte, addr netip.Addr) {
		for _, s := range []struct {
			s ib.QPState
			a ib.QPAttr
		}{
			{ib.Init, ib.QPAttr{}},
			{ib.RTR, ib.QPAttr{PathMTU: 1024, DestQPN: peer, RQPSN: 5, MinRNRTimer: 12, AV: ib.AddressVector{DMAC: mac, DGID: ib.GIDFrom(addr)}}},
			{ib.RTS, ib.QPAttr{SQPSN: 5, Timeout: 20, RetryCnt: 7, RNRRetry: 7}}, // a 4 s timer: never due here
		} {
			if err := ibtest.Modify(q, s.s, &s.a); err != nil {
				t.Fatal(err)
			}
		}
	}
	slowConnect(qa, qb.QPN(), macB, addrB)
	slowConnect(qb, qa.QPN(), macA, addrA)
	const rounds, size = 200, 64
	for i := 0; i < 4; i++ {
		for _, h := range []struct {
			q *rnic.QP
			m *rnic.MR
		}{{qa, a.mr}, {qb, b.mr}} {
			if _, err := h.q.PostRecv([]verbs.RecvWR{{ID: uint64(i), SG: []ib.SGE{{Addr: h.m.IOVA() + 4096, Length: size, LKey: h.m.LKey()}}}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	errs := make(chan error, 2)
	var wg sync.WaitGroup
	for _, l := range []*Loop{la, lb} {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- l.Run(ctx) }()
	}
	stop := sync.OnceFunc(func() { cancel(); wg.Wait() })
	defer stop()
	// Let both loops reach their hour-long nap.
	for i := 0; la.Counters().Naps == 0 || lb.Counters().Naps == 0; i++ {
		if i > 5000 {
			t.Fatal("the idle loops never napped")
		}
		time.Sleep(time.Millisecond)
	}
	var wcs [8]ib.WC
	// await polls h (driving both devices) until a receive completes.
	await := func(h *host) {
		t.Helper()
		for i := 0; ; i++ {
			if i > 2_000_000 {
				t.Fatalf("round trip stuck: loop A %+v, loop B %+v", la.Counters(), lb.Counters())
			}
			n := h.cq.Poll(wcs[:])
			got := false
			for _, w := range wcs[:n] {
				if w.Status != ib.Success {
					t.Fatalf("completion %+v", w)
				}
				if w.IsRecv {
					got = true
					q := qa
					if h == b {
						q = qb
					}
					if _, err := q.PostRecv([]verbs.RecvWR{{ID: w.ID, SG: []ib.SGE{{Addr: h.mr.IOVA() + 4096, Length: size, LKey: h.mr.LKey()}}}}); err != nil {
						t.Fatal(err)
					}
				}
			}
			if got {
				return
			}
			a.dev.Poll()
			b.dev.Poll()
			if i%64 == 63 {
				runtime.Gosched()
			}
		}
	}
	send := func(q *rnic.QP, m *rnic.MR, i int) {
		if _, err := q.PostSend([]verbs.SendWR{{ID: uint64(i), Opcode: ib.Send, SG: []ib.SGE{{Addr: m.IOVA(), Length: size, LKey: m.LKey()}}}}); err != nil {
			t.Fatal(err)
		}
	}
	skipped := a.dev.RingsSkipped() + b.dev.RingsSkipped()
	a.dev.Poll() // the first post finds a fresh poll too
	for i := 0; i < rounds; i++ {
		send(qa, a.mr, i)
		await(b)
		send(qb, b.mr, i)
		await(a)
	}
	ca, cb := la.Counters(), lb.Counters()
	if ca.Polls == 0 || cb.Polls == 0 {
		t.Errorf("no inline steps: A %+v, B %+v", ca, cb)
	}
	// Every post follows a Poll of its device.
	if s := a.dev.RingsSkipped() + b.dev.RingsSkipped() - skipped; s != 2*rounds {
		t.Errorf("%d of %d posts rang the doorbell while the application polled", 2*rounds-int(s), 2*rounds)
	}
	if allocs := testing.AllocsPerRun(100, func() { a.dev.Poll() }); allocs != 0 {
		t.Errorf("%.1f allocations per Poll", allocs)
	}
	stop()
	for i := 0; i < 2; i++ {
		if err := <-errs; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
	polls := la.Counters().Polls
	if a.dev.Poll() || la.Counters().Polls != polls {
		t.Error("Poll stepped a loop that no longer runs")
	}
}

// sendLog records the frames of each Submit call that carried any.
type sendLog struct {
	port.Port
	batches []int
}

func (p *sendLog) Submit(frames [][]byte) (int, error) {
	n, err := p.Port.Submit(frames)
	if n > 0 {
		p.batches = append(p.batches, n)
	}
	return n, err
}

// TestReplyLeavesWithAck: a step that received a request builds nothing,
// so the ACK the request asked for leaves in one batch with the reply the
// application posts meanwhile (one port Send, that is one sendto(2) on
// AF_XDP, per half round trip instead of two), and the requester gets
// both. With EagerTx the ACK leaves alone in the step that received.
func TestReplyLeavesWithAck(t *testing.T) {
	for _, eager := range []bool{false, true} {
		vc := &memlink.VirtualClock{}
		pa, pb := memlink.NewPair(memlink.Config{Clock: vc.Now})
		a := newHost(t, macA, addrA, 1024, 1<<16)
		b := newHost(t, macB, addrB, 1024, 1<<16)
		logB := &sendLog{Port: pb}
		la, err := NewLoop(a.dev, pa, Options{Now: vc.Now, EagerTx: eager})
		if err != nil {
			t.Fatal(err)
		}
		lb, err := NewLoop(b.dev, logB, Options{Now: vc.Now, EagerTx: eager})
		if err != nil {
			t.Fatal(err)
		}
		qa, qb := a.createQP(t, ib.RC), b.createQP(t, ib.RC)
		connect(t, qa, 1024, qb.QPN(), macB, addrB, 3, 9)
		connect(t, qb, 1024, qa.QPN(), macA, addrA, 9, 3)
		for _, x := range []struct {
			q *rnic.QP
			h *host
		}{{qa, a}, {qb, b}} {
			if _, err := x.q.PostRecv([]verbs.RecvWR{{ID: 7, SG: []ib.SGE{{Addr: x.h.mr.IOVA() + 1024, Length: 64, LKey: x.h.mr.LKey()}}}}); err != nil {
				t.Fatal(err)
			}
		}
		step := func(l *Loop) {
			t.Helper()
			vc.Advance(time.Microsecond)
			if _, err := l.Step(vc.Now(), 0); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := qa.PostSend([]verbs.SendWR{{ID: 1, Opcode: ib.Send, Flags: ib.Signaled, SG: []ib.SGE{{Addr: a.mr.IOVA(), Length: 64, LKey: a.mr.LKey()}}}}); err != nil {
			t.Fatal(err)
		}
		step(la) // the request
		step(lb) // B receives it
		var wcs [4]ib.WC
		if n := b.cq.Poll(wcs[:]); n != 1 || !wcs[0].IsRecv || wcs[0].Status != ib.Success {
			t.Fatalf("eager %v: B's completions %v", eager, wcs[:n])
		}
		wantFirst := 0
		if eager {
			wantFirst = 1
		}
		if len(logB.batches) != wantFirst {
			t.Fatalf("eager %v: B sent %v in the step that received", eager, logB.batches)
		}
		if _, err := qb.PostSend([]verbs.SendWR{{ID: 2, Opcode: ib.Send, SG: []ib.SGE{{Addr: b.mr.IOVA(), Length: 64, LKey: b.mr.LKey()}}}}); err != nil {
			t.Fatal(err)
		}
		step(lb)
		want := []int{2}
		if eager {
			want = []int{1, 1}
		}
		if fmt.Sprint(logB.batches) != fmt.Sprint(want) {
			t.Fatalf("eager %v: B's batches %v, want %v", eager, logB.batches, want)
		}
		step(la)
		step(la)
		n := a.cq.Poll(wcs[:])
		var sendDone, recvDone bool
		for _, w := range wcs[:n] {
			if w.Status != ib.Success {
				t.Fatalf("eager %v: completion %+v", eager, w)
			}
			sendDone = sendDone || !w.IsRecv && w.ID == 1
			recvDone = recvDone || w.IsRecv && w.ID == 7
		}
		if !sendDone || !recvDone {
			t.Fatalf("eager %v: A's completions %+v", eager, wcs[:n])
		}
		pa.Close()
		pb.Close()
	}
}

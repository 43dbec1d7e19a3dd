package engine

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/frame"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/port"
	"github.com/softrnic/softrnic/port/memlink"
	"github.com/softrnic/softrnic/verbs"
)

// TestSpinPolicy drives the adaptive spin window through the traffic it is
// meant for: a dense stream seen late (frames queued up behind a nap's
// oversleep), short gaps, then sparse single frames.
func TestSpinPolicy(t *testing.T) {
	const us = time.Microsecond
	p := spinPolicy{min: 2 * us, max: 200 * us}
	if w := p.window(); w != 2*us {
		t.Fatalf("initial window %v, want min", w)
	}
	// A WRITE stream behind 1 ms naps: every spell ends with a batch queued.
	for i, want := range []time.Duration{4, 8, 16, 32, 64, 128, 200, 200} {
		p.observe(time.Millisecond, 64)
		if w := p.window(); w != want*us {
			t.Fatalf("queued batch %d: window %v, want %v", i, w, want*us)
		}
	}
	// Gaps the window covers leave it alone.
	p.observe(150*us, 1)
	if w := p.window(); w != 200*us {
		t.Fatalf("covered gap: window %v", w)
	}
	// Sparse single frames (a ping each ms) shrink it back to min.
	for i, want := range []time.Duration{100 * us, 50 * us, 25 * us, 12500 * time.Nanosecond} {
		p.observe(time.Millisecond, 1)
		if w := p.window(); w != want {
			t.Fatalf("sparse frame %d: window %v, want %v", i, w, want)
		}
	}
	for i := 0; i < 10; i++ {
		p.observe(time.Millisecond, 1)
	}
	if w := p.window(); w != 2*us {
		t.Fatalf("sparse traffic: window %v, want min", w)
	}
	// A single frame just after the window: a longer window would have
	// caught it without a nap.
	p.observe(3*us, 1)
	if w := p.window(); w != 4*us {
		t.Fatalf("gap just over the window: %v, want 4µs", w)
	}
	// A long gap with a queued batch but within the window: no change.
	p.observe(3*us, 5)
	if w := p.window(); w != 4*us {
		t.Fatalf("covered gap with a batch: %v", w)
	}
	// Adaptation off.
	off := spinPolicy{min: 2 * us, max: -1}
	off.observe(time.Millisecond, 64)
	if w := off.window(); w != 2*us {
		t.Fatalf("adaptation off: window %v", w)
	}
}

// TestRunGoesIdleAfterTraffic: whatever the adaptive spin window grew to
// under traffic, a loop with nothing to do stops spinning and ends up
// asleep in the port: over 100 ms of idleness it runs a bounded number of
// steps (a spinning loop runs millions). Counts, not wall-clock figures.
func TestRunGoesIdleAfterTraffic(t *testing.T) {
	r := runHosts(t, 1<<20)
	a, b, la, lb := r.a, r.b, r.la, r.lb
	defer r.stop()
	// UC: the stream needs no ACK timer, which real time under -race can
	// run out (RETRY_EXC_ERR in 30 ms with the 1 ms timeout of connect).
	qa, qb := a.createQP(t, ib.UC), b.createQP(t, ib.UC)
	connect(t, qa, 4096, qb.QPN(), macB, addrB, 1, 2)
	connect(t, qb, 4096, qa.QPN(), macA, addrA, 2, 1)
	// A stream of 64 KiB WRITEs, the traffic that grows the window.
	const n, size = 64, 1 << 16
	wctx, wcancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer wcancel()
	var wcs [16]ib.WC
	for i, done := 0, 0; done < n; {
		for ; i < n && i-done < 8; i++ {
			if _, err := qa.PostSend([]verbs.SendWR{{ID: uint64(i), Opcode: ib.RDMAWrite, Flags: ib.Signaled,
				SG:         []ib.SGE{{Addr: a.mr.IOVA() + uint64(i%16*size), Length: size, LKey: a.mr.LKey()}},
				RemoteAddr: b.mr.IOVA() + uint64(i%16*size), RKey: b.mr.RKey()}}); err != nil {
				t.Fatal(err)
			}
		}
		k, err := a.cq.PollWait(wctx, wcs[:])
		if err != nil {
			t.Fatalf("%d of %d WRITEs: %v", done, n, err)
		}
		for _, w := range wcs[:k] {
			if w.Status != ib.Success {
				t.Fatalf("WRITE %+v", w)
			}
		}
		done += k
	}
	t.Logf("spin windows after the stream: requester %v, responder %v",
		time.Duration(la.Counters().SpinWindowNs), time.Duration(lb.Counters().SpinWindowNs))
	// Past DeepIdleAfter (10 ms) both sleep in the port, 200 µs at a time.
	time.Sleep(30 * time.Millisecond)
	a0, b0 := la.Counters().Loops, lb.Counters().Loops
	time.Sleep(100 * time.Millisecond)
	if da, db := la.Counters().Loops-a0, lb.Counters().Loops-b0; da > 5000 || db > 5000 {
		t.Errorf("steps in 100 ms of idleness: requester %d, responder %d", da, db)
	}
}

// TestRunYieldsOnlyWhileSpinningUnpolled: a loop spinning idle gives its
// CPU away between polls (Options.Yield), and stops as soon as an
// application polls the device, which then steps the device itself and
// must not find the loop holding the step while it is off the CPU.
func TestRunYieldsOnlyWhileSpinningUnpolled(t *testing.T) {
	pa, pb := memlink.NewPair(memlink.Config{})
	defer pb.Close()
	dev := newDevice(t, macA, addrA, 1024)
	var yields atomic.Uint64
	l, err := NewLoop(dev, pa, Options{SpinFor: time.Hour, SpinMax: -1, PolledWait: time.Hour, Yield: func() { yields.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
		pa.Close()
		if c := l.Counters(); c.Yields != yields.Load() {
			t.Errorf("Yield called %d times, counted %d", yields.Load(), c.Yields)
		}
	}()
	// waitLoops waits until the loop has stepped n more times.
	waitLoops := func(n uint64) {
		t.Helper()
		start := l.Counters().Loops
		for deadline := time.Now().Add(10 * time.Second); l.Counters().Loops-start < n; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the loop stepped %d times in 10 s", l.Counters().Loops-start)
			}
		}
	}
	c0 := l.Counters()
	waitLoops(1000)
	c1 := l.Counters()
	if steps, y := c1.Loops-c0.Loops, c1.Yields-c0.Yields; y < steps/2 {
		t.Fatalf("spinning idle, unpolled: %d yields in %d steps", y, steps)
	}
	dev.Poll()   // the loop holds the step: Poll only marks the device polled
	waitLoops(2) // a step that began after the mark
	c2 := l.Counters()
	waitLoops(1000)
	if c3 := l.Counters(); c3.Yields != c2.Yields {
		t.Fatalf("polled: %d yields in %d steps", c3.Yields-c2.Yields, c3.Loops-c2.Loops)
	}
}

// submits records how many frames each Submit call offered.
type submits struct {
	port.Port
	mu    sync.Mutex
	sizes []int
}

func (s *submits) Submit(frames [][]byte) (int, error) {
	s.mu.Lock()
	s.sizes = append(s.sizes, len(frames))
	s.mu.Unlock()
	return s.Port.Submit(frames)
}

func (s *submits) calls() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.sizes)
}

// TestRunYieldsForTheReply: after a step that received a SEND, and before
// the step that sends its ACK, an unpolled loop gives its CPU away
// (Options.Yield), so that the client it completed to, if it shares the
// CPU, posts its reply first: ACK and reply then leave in one Submit. The
// test's Yield plays that client. Before the yield was there, the ACK left
// alone and the reply in a second Submit.
func TestRunYieldsForTheReply(t *testing.T) {
	wire, pa := memlink.NewPair(memlink.Config{})
	defer wire.Close()
	a := newHost(t, macA, addrA, 1024, 1<<16)
	q := a.createQP(t, ib.RC)
	const peerQPN = 0x99
	connect(t, q, 1024, peerQPN, macB, addrB, 1, 1)
	if _, err := q.PostRecv([]verbs.RecvWR{{ID: 1, SG: []ib.SGE{{Addr: a.mr.IOVA(), Length: 256, LKey: a.mr.LKey()}}}}); err != nil {
		t.Fatal(err)
	}
	rec := &submits{Port: pa}
	var replied atomic.Bool
	var replyErr error
	client := func() { // runs on the loop's goroutine, in its Yield
		var wcs [1]ib.WC
		if replied.Load() || a.cq.Poll(wcs[:]) == 0 {
			return
		}
		if wcs[0].Status != ib.Success || !wcs[0].IsRecv {
			replyErr = fmt.Errorf("completion %+v", wcs[0])
		} else {
			_, replyErr = q.PostSend([]verbs.SendWR{{ID: 2, Opcode: ib.Send, Flags: ib.Signaled,
				SG: []ib.SGE{{Addr: a.mr.IOVA() + 512, Length: 64, LKey: a.mr.LKey()}}}})
		}
		replied.Store(true)
	}
	l, err := NewLoop(a.dev, rec, Options{SpinFor: time.Hour, SpinMax: -1, Yield: client})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
		pa.Close()
	}()
	send := craft(t, addrB, addrA, q.QPN(), 1, func(s *frame.Spec) { s.SrcMAC, s.DstMAC = macB, macA })
	if n, err := port.Send(wire, [][]byte{send}); n != 1 || err != nil {
		t.Fatal(n, err)
	}
	var got [][]byte
	in := make([][]byte, 4)
	for deadline := time.Now().Add(10 * time.Second); len(got) < 2; {
		n, err := wire.Recv(in, 10*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range in[:n] {
			got = append(got, slices.Clone(f))
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d frames in 10 s; Submits %v", len(got), rec.calls())
		}
	}
	if replyErr != nil {
		t.Fatal(replyErr)
	}
	var ops []bth.Opcode
	for _, f := range got[:2] {
		var p frame.Frame
		if err := frame.Parse(f, &p); err != nil {
			t.Fatal(err)
		}
		ops = append(ops, p.Opcode())
	}
	if !slices.Contains(ops, bth.RCAcknowledge) || !slices.Contains(ops, bth.RCSendOnly) {
		t.Fatalf("frames on the wire %v, want the ACK and the reply", ops)
	}
	// Later Submits, if any, are the reply's retransmissions: the test's
	// wire does not answer.
	if c := rec.calls(); c[0] != 2 {
		t.Fatalf("Submit calls %v, want the first of both frames", c)
	}
}

// TestRunNoYieldWithoutCompletion: a received WRITE completes nothing, so
// the loop does not give its CPU away before sending its ACK (a WRITE
// stream's receiver would otherwise yield at every step).
func TestRunNoYieldWithoutCompletion(t *testing.T) {
	wire, pa := memlink.NewPair(memlink.Config{})
	defer wire.Close()
	a := newHost(t, macA, addrA, 1024, 1<<16)
	q := a.createQP(t, ib.RC)
	connect(t, q, 1024, 0x99, macB, addrB, 1, 1)
	rec := &submits{Port: pa}
	var early atomic.Uint64 // yields between the WRITE's receipt and its ACK's Submit
	var l *Loop
	hook := func() {
		if l.dev.Stats.RxFrames > 0 && len(rec.calls()) == 0 {
			early.Add(1)
		}
	}
	l, err := NewLoop(a.dev, rec, Options{SpinFor: time.Hour, SpinMax: -1, Yield: hook})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
		pa.Close()
	}()
	write := craft(t, addrB, addrA, q.QPN(), 1, func(s *frame.Spec) {
		s.SrcMAC, s.DstMAC = macB, macA
		s.BTH.Opcode = bth.RCRDMAWriteOnly
		s.RETH = frame.RETHFields{VA: a.mr.IOVA(), RKey: a.mr.RKey(), DMALen: uint32(len("hello, RoCE!"))}
	})
	if n, err := port.Send(wire, [][]byte{write}); n != 1 || err != nil {
		t.Fatal(n, err)
	}
	in := make([][]byte, 4)
	for deadline := time.Now().Add(10 * time.Second); ; {
		n, err := wire.Recv(in, 10*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			var f frame.Frame
			if err := frame.Parse(in[0], &f); err != nil || f.Opcode() != bth.RCAcknowledge {
				t.Fatalf("answer %v (%v), want an ACK", f.Opcode(), err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no ACK in 10 s")
		}
	}
	if e := early.Load(); e != 0 {
		t.Fatalf("%d yields before the WRITE's ACK", e)
	}
}

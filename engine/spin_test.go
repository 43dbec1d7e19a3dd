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
	"github.com/softrnic/softrnic/rnic"
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

// startLoop runs l in a goroutine of its own and returns what stops it:
// it ends Run, fails the test on Run's error and closes p. It is
// idempotent and also registered as a cleanup.
func startLoop(t *testing.T, l *Loop, p port.Port) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Error(err)
			}
			p.Close()
		})
	}
	t.Cleanup(stop)
	return stop
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
	stop := startLoop(t, l, pa)
	defer func() {
		stop()
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

// yieldRig is host A's RC QP, connected to a peer at B that the test
// plays on wire, under a loop that spins without napping and calls
// yield as its Options.Yield (on the loop's goroutine); rec records the
// loop's Submits.
type yieldRig struct {
	wire port.Port
	a    *host
	q    *rnic.QP
	rec  *submits
	l    *Loop
}

func newYieldRig(t *testing.T, yield func(r *yieldRig)) *yieldRig {
	t.Helper()
	wire, pa := memlink.NewPair(memlink.Config{})
	r := &yieldRig{wire: wire, a: newHost(t, macA, addrA, 1024, 1<<16), rec: &submits{Port: pa}}
	r.q = r.a.createQP(t, ib.RC)
	connect(t, r.q, 1024, 0x99, macB, addrB, 1, 1)
	l, err := NewLoop(r.a.dev, r.rec, Options{SpinFor: time.Hour, SpinMax: -1, Yield: func() { yield(r) }})
	if err != nil {
		t.Fatal(err)
	}
	r.l = l
	t.Cleanup(func() { wire.Close() })
	startLoop(t, l, pa)
	return r
}

// send puts a frame from B to the QP on the wire, built by craft with mod.
func (r *yieldRig) send(t *testing.T, mod func(*frame.Spec)) {
	t.Helper()
	f := craft(t, addrB, addrA, r.q.QPN(), 1, func(s *frame.Spec) {
		s.SrcMAC, s.DstMAC = macB, macA
		if mod != nil {
			mod(s)
		}
	})
	if n, err := port.Send(r.wire, [][]byte{f}); n != 1 || err != nil {
		t.Fatal(n, err)
	}
}

// answers waits for the first n frames the QP sends and returns their
// opcodes.
func (r *yieldRig) answers(t *testing.T, n int) []bth.Opcode {
	t.Helper()
	var ops []bth.Opcode
	in := make([][]byte, 4)
	for deadline := time.Now().Add(10 * time.Second); len(ops) < n; {
		k, err := r.wire.Recv(in, 10*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range in[:k] {
			var f frame.Frame
			if err := frame.Parse(b, &f); err != nil {
				t.Fatal(err)
			}
			ops = append(ops, f.Opcode())
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d frames in 10 s; Submits %v", len(ops), r.rec.calls())
		}
	}
	return ops[:n]
}

// TestRunYieldsForTheReply: after a step that received a SEND, and before
// the step that sends its ACK, an unpolled loop gives its CPU away
// (Options.Yield), so that the client it completed to, if it shares the
// CPU, posts its reply first: ACK and reply then leave in one Submit. The
// test's Yield plays that client. Before the yield was there, the ACK left
// alone and the reply in a second Submit.
func TestRunYieldsForTheReply(t *testing.T) {
	var replied atomic.Bool
	var replyErr error
	r := newYieldRig(t, func(r *yieldRig) {
		var wcs [1]ib.WC
		if replied.Load() || r.a.cq.Poll(wcs[:]) == 0 {
			return
		}
		if wcs[0].Status != ib.Success || !wcs[0].IsRecv {
			replyErr = fmt.Errorf("completion %+v", wcs[0])
		} else {
			_, replyErr = r.q.PostSend([]verbs.SendWR{{ID: 2, Opcode: ib.Send, Flags: ib.Signaled,
				SG: []ib.SGE{{Addr: r.a.mr.IOVA() + 512, Length: 64, LKey: r.a.mr.LKey()}}}})
		}
		replied.Store(true)
	})
	if _, err := r.q.PostRecv([]verbs.RecvWR{{ID: 1, SG: []ib.SGE{{Addr: r.a.mr.IOVA(), Length: 256, LKey: r.a.mr.LKey()}}}}); err != nil {
		t.Fatal(err)
	}
	r.send(t, nil)
	ops := r.answers(t, 2)
	if replyErr != nil {
		t.Fatal(replyErr)
	}
	if !slices.Contains(ops, bth.RCAcknowledge) || !slices.Contains(ops, bth.RCSendOnly) {
		t.Fatalf("frames on the wire %v, want the ACK and the reply", ops)
	}
	// Later Submits, if any, are the reply's retransmissions: the test's
	// wire does not answer.
	if c := r.rec.calls(); c[0] != 2 {
		t.Fatalf("Submit calls %v, want the first of both frames", c)
	}
}

// TestRunNoYieldWithoutCompletion: a received WRITE completes nothing, so
// the loop does not give its CPU away before sending its ACK (a WRITE
// stream's receiver would otherwise yield at every step).
func TestRunNoYieldWithoutCompletion(t *testing.T) {
	var early atomic.Uint64 // yields between the WRITE's receipt and its ACK's Submit
	r := newYieldRig(t, func(r *yieldRig) {
		if r.l.dev.Stats.RxFrames > 0 && len(r.rec.calls()) == 0 {
			early.Add(1)
		}
	})
	r.send(t, func(s *frame.Spec) {
		s.BTH.Opcode = bth.RCRDMAWriteOnly
		s.RETH = frame.RETHFields{VA: r.a.mr.IOVA(), RKey: r.a.mr.RKey(), DMALen: uint32(len("hello, RoCE!"))}
	})
	if ops := r.answers(t, 1); ops[0] != bth.RCAcknowledge {
		t.Fatalf("answer %v, want an ACK", ops[0])
	}
	if e := early.Load(); e != 0 {
		t.Fatalf("%d yields before the WRITE's ACK", e)
	}
}

// TestRunNapsWhileFramesStream: an unpolled loop that receives frames
// densely (StreamFrames in a StreamWindow) naps (Options.Nap) between idle
// polls instead of yielding, and yields again once they stop; single
// frames a millisecond apart, as a ping-pong's, never make it nap.
func TestRunNapsWhileFramesStream(t *testing.T) {
	wire, pa := memlink.NewPair(memlink.Config{})
	defer wire.Close()
	dev := newDevice(t, macA, addrA, 1024)
	var naps, yields atomic.Uint64
	l, err := NewLoop(dev, pa, Options{SpinFor: time.Hour, SpinMax: -1,
		Yield: func() { yields.Add(1) }, Nap: func(time.Duration) { naps.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	stop := startLoop(t, l, pa)
	defer func() {
		stop()
		if c := l.Counters(); c.StreamNaps != naps.Load() {
			t.Errorf("Nap called %d times, counted %d", naps.Load(), c.StreamNaps)
		}
	}()
	// Frames for no QP: dropped, but received all the same.
	frame := craft(t, addrB, addrA, 0x4242, 1, func(s *frame.Spec) { s.SrcMAC, s.DstMAC = macB, macA })
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(100 * time.Microsecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not in 10 s (naps %d, yields %d, received %d)", what, naps.Load(), yields.Load(), dev.StatsSnapshot().RxFrames)
			}
		}
	}
	for i := 0; i < 20; i++ {
		if n, err := port.Send(wire, [][]byte{frame}); n != 1 || err != nil {
			t.Fatal(n, err)
		}
		time.Sleep(time.Millisecond)
	}
	waitFor("sparse frames received", func() bool { return dev.StatsSnapshot().RxNoQP == 20 })
	if n := naps.Load(); n != 0 {
		t.Fatalf("%d naps for single frames a millisecond apart", n)
	}
	burst := make([][]byte, 64)
	for i := range burst {
		burst[i] = frame
	}
	if n, err := port.Send(wire, burst); n != len(burst) || err != nil {
		t.Fatal(n, err)
	}
	waitFor("a nap after the burst", func() bool { return naps.Load() > 0 })
	y := yields.Load()
	waitFor("yields after the burst", func() bool { return yields.Load() > y+1000 })
	n := naps.Load()
	y = yields.Load()
	waitFor("more yields", func() bool { return yields.Load() > y+1000 })
	if m := naps.Load(); m != n {
		t.Fatalf("%d more naps with no frames coming", m-n)
	}
}

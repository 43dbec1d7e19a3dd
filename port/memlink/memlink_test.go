package memlink

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/port"
)

// seqFrame builds a 64-byte test frame carrying its sequence number.
func seqFrame(buf []byte, seq uint32) []byte {
	for i := range buf {
		buf[i] = byte(i)
	}
	binary.BigEndian.PutUint32(buf[20:], seq)
	return buf
}

func seqOf(f []byte) uint32 { return binary.BigEndian.Uint32(f[20:]) }

// pump sends n frames from a to b one batch at a time in virtual time,
// advancing the clock to every delivery, and returns the sequence numbers
// b received, in order, and the received frames' bytes.
func pump(t testing.TB, vc *VirtualClock, a, b *Port, n int) (seqs []uint32, got [][]byte) {
	t.Helper()
	out := make([][]byte, port.BatchSize)
	in := make([][]byte, port.BatchSize)
	bufs := make([][]byte, port.BatchSize)
	for i := range bufs {
		bufs[i] = make([]byte, 64)
	}
	drain := func() {
		for {
			k, err := b.Recv(in, 0)
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range in[:k] {
				seqs = append(seqs, seqOf(f))
				got = append(got, append([]byte(nil), f...))
			}
			if k == 0 {
				return
			}
		}
	}
	for sent := 0; sent < n; {
		k := min(port.BatchSize, n-sent)
		for i := range k {
			out[i] = seqFrame(bufs[i], uint32(sent+i))
		}
		m, err := port.Send(a, out[:k])
		if err != nil {
			t.Fatal(err)
		}
		sent += m
		vc.Advance(time.Microsecond)
		drain()
	}
	for guard := 0; b.InFlight() > 0; guard++ {
		if guard > n+10 {
			t.Fatal("frames never became due")
		}
		vc.Set(max(vc.Now(), b.NextDelivery()))
		drain()
	}
	return seqs, got
}

func virtualPair(imp Impairments, seed uint64) (*VirtualClock, *Port, *Port) {
	vc := &VirtualClock{}
	a, b := NewPair(Config{Impairments: imp, Seed: seed, Clock: vc.Now})
	return vc, a, b
}

func TestCleanLinkIsByteExactAndInOrder(t *testing.T) {
	vc, a, b := virtualPair(Impairments{}, 1)
	seqs, got := pump(t, vc, a, b, 10000)
	if len(seqs) != 10000 {
		t.Fatalf("received %d frames, want 10000", len(seqs))
	}
	want := make([]byte, 64)
	for i, s := range seqs {
		if s != uint32(i) {
			t.Fatalf("frame %d has seq %d", i, s)
		}
		if !bytes.Equal(got[i], seqFrame(want, s)) {
			t.Fatalf("frame %d differs", i)
		}
	}
	st := a.Stats()
	if st.Sent != 10000 || st.Delivered != 10000 || st.Lost+st.Duplicated+st.Reordered+st.Corrupted != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// binomialOK reports whether k successes out of n trials at probability p are
// within 6 standard deviations of the mean: a fair coin essentially never
// fails it, a wrong probability (or a broken knob) always does.
func binomialOK(k, n uint64, p float64) bool {
	mean := float64(n) * p
	sd := math.Sqrt(float64(n) * p * (1 - p))
	return math.Abs(float64(k)-mean) <= 6*sd
}

func TestLossRate(t *testing.T) {
	const n = 100000
	vc, a, b := virtualPair(Impairments{Loss: 0.05}, 42)
	seqs, _ := pump(t, vc, a, b, n)
	st := a.Stats()
	t.Logf("lost %d of %d frames (expected 5000 ± 6σ = ±413)", st.Lost, n)
	if !binomialOK(st.Lost, n, 0.05) {
		t.Fatalf("lost %d of %d, want about 5%%", st.Lost, n)
	}
	if uint64(len(seqs)) != n-st.Lost || st.Delivered != n-st.Lost {
		t.Fatalf("received %d, lost %d, of %d", len(seqs), st.Lost, n)
	}
	for i := 1; i < len(seqs); i++ {
		if seqs[i] <= seqs[i-1] {
			t.Fatalf("loss alone reordered frames: %d after %d", seqs[i], seqs[i-1])
		}
	}
}

func TestSameSeedSameImpairments(t *testing.T) {
	imp := Impairments{Loss: 0.03, Duplicate: 0.02, Reorder: 0.02, Corrupt: 0.02, Delay: 5 * time.Microsecond, Jitter: 2 * time.Microsecond}
	run := func(seed uint64) ([]uint32, [][]byte, Stats) {
		vc, a, b := virtualPair(imp, seed)
		s, g := pump(t, vc, a, b, 20000)
		return s, g, a.Stats()
	}
	s1, g1, st1 := run(7)
	s2, g2, st2 := run(7)
	if st1 != st2 || len(s1) != len(s2) {
		t.Fatalf("same seed, different runs: %+v vs %+v", st1, st2)
	}
	for i := range s1 {
		if s1[i] != s2[i] || !bytes.Equal(g1[i], g2[i]) {
			t.Fatalf("same seed, runs differ at frame %d", i)
		}
	}
	s3, _, st3 := run(8)
	if st3 == st1 && len(s3) == len(s1) {
		same := true
		for i := range s1 {
			same = same && s1[i] == s3[i]
		}
		if same {
			t.Fatal("different seeds gave identical runs")
		}
	}
}

func TestCorruptionChangesExactlyOneByteOneBit(t *testing.T) {
	const n = 20000
	vc, a, b := virtualPair(Impairments{Corrupt: 0.1, CorruptSkip: 14}, 3)
	_, got := pump(t, vc, a, b, n)
	if len(got) != n {
		t.Fatalf("received %d of %d", len(got), n)
	}
	want := make([]byte, 64)
	var corrupted uint64
	for idx, f := range got {
		// Corruption alone keeps order, so the idx-th frame is seq idx
		// (even when the flip lands in the seq field itself).
		diff, bits := 0, 0
		seqFrame(want, uint32(idx))
		for i := range f {
			if f[i] != want[i] {
				if i < 14 {
					t.Fatalf("byte %d corrupted despite CorruptSkip 14", i)
				}
				diff++
				x := f[i] ^ want[i]
				for ; x != 0; x &= x - 1 {
					bits++
				}
			}
		}
		if diff > 1 || bits > 1 {
			t.Fatalf("frame differs in %d bytes, %d bits", diff, bits)
		}
		if diff == 1 {
			corrupted++
		}
	}
	st := a.Stats()
	if corrupted != st.Corrupted {
		t.Fatalf("found %d corrupted frames, counter says %d", corrupted, st.Corrupted)
	}
	if !binomialOK(st.Corrupted, n, 0.1) {
		t.Fatalf("corrupted %d of %d, want about 10%%", st.Corrupted, n)
	}
}

func TestReorderKeepsEveryFrame(t *testing.T) {
	const n = 20000
	vc, a, b := virtualPair(Impairments{Reorder: 0.05}, 5)
	seqs, _ := pump(t, vc, a, b, n)
	if len(seqs) != n {
		t.Fatalf("received %d of %d", len(seqs), n)
	}
	seen := make([]bool, n)
	inversions := 0
	for i, s := range seqs {
		if seen[s] {
			t.Fatalf("seq %d twice", s)
		}
		seen[s] = true
		if i > 0 && s < seqs[i-1] {
			inversions++
		}
	}
	st := a.Stats()
	if !binomialOK(st.Reordered, n, 0.05) {
		t.Fatalf("reordered %d of %d", st.Reordered, n)
	}
	if inversions == 0 {
		t.Fatal("Reorder 5% produced no out-of-order delivery")
	}
}

func TestDuplicationAddsCopies(t *testing.T) {
	const n = 20000
	vc, a, b := virtualPair(Impairments{Duplicate: 0.04}, 9)
	seqs, _ := pump(t, vc, a, b, n)
	st := a.Stats()
	if uint64(len(seqs)) != n+st.Duplicated {
		t.Fatalf("received %d, want %d + %d duplicates", len(seqs), n, st.Duplicated)
	}
	count := make([]int, n)
	for _, s := range seqs {
		count[s]++
	}
	var twice uint64
	for s, c := range count {
		switch c {
		case 1:
		case 2:
			twice++
		default:
			t.Fatalf("seq %d received %d times", s, c)
		}
	}
	if twice != st.Duplicated || !binomialOK(twice, n, 0.04) {
		t.Fatalf("%d frames twice, counter %d, want about 4%%", twice, st.Duplicated)
	}
}

func TestDelayAndJitterInVirtualTime(t *testing.T) {
	vc, a, b := virtualPair(Impairments{Delay: 100 * time.Microsecond, Jitter: 10 * time.Microsecond}, 11)
	in := make([][]byte, port.BatchSize)
	buf := make([]byte, 64)
	for i := range 200 {
		if n, err := port.Send(a, [][]byte{seqFrame(buf, uint32(i))}); n != 1 || err != nil {
			t.Fatal(n, err)
		}
	}
	// Nothing is due before Delay-Jitter.
	vc.Set(clock.Time(90*time.Microsecond - 1))
	if k, _ := b.Recv(in, time.Second); k != 0 {
		t.Fatalf("%d frames before the minimum delay", k)
	}
	nd := b.NextDelivery()
	if nd < clock.Time(90*time.Microsecond) || nd > clock.Time(110*time.Microsecond) {
		t.Fatalf("NextDelivery %v outside [90µs, 110µs]", nd)
	}
	vc.Set(nd)
	if k, _ := b.Recv(in, 0); k < 1 {
		t.Fatal("frame due at NextDelivery not delivered")
	}
	vc.Set(clock.Time(110 * time.Microsecond))
	total := 1
	for {
		k, _ := b.Recv(in, 0)
		if k == 0 {
			break
		}
		total += k
	}
	if total != 200 || b.NextDelivery() != clock.Never {
		t.Fatalf("by Delay+Jitter got %d of 200, next %v", total, b.NextDelivery())
	}
}

func TestBackPressureAndNotLent(t *testing.T) {
	vc := &VirtualClock{}
	a, b := NewPair(Config{Frames: 8, MaxFrame: 128, Clock: vc.Now})
	buf := make([]byte, 64)
	out := make([][]byte, 10)
	for i := range out {
		out[i] = buf
	}
	n, err := port.Send(a, out)
	if n != 8 || err != nil {
		t.Fatalf("Send into 8 buffers took %d, %v", n, err)
	}
	if st := a.Stats(); st.Full != 1 {
		t.Fatalf("Full = %d", st.Full)
	}
	in := make([][]byte, 4)
	if k, _ := b.Recv(in, 0); k != 4 {
		t.Fatalf("Recv %d", k)
	}
	// The 4 lent frames are still the receiver's until its next Recv.
	if n, _ := port.Send(a, out); n != 0 {
		t.Fatalf("Send reused buffers still lent to the receiver: %d", n)
	}
	if k, _ := b.Recv(in, 0); k != 4 {
		t.Fatalf("Recv %d", k)
	}
	if n, _ := port.Send(a, out); n != 4 {
		t.Fatalf("after recycling, Send took %d, want 4", n)
	}
	if _, err := b.Recv(in, 0); err != nil {
		t.Fatal(err)
	}
	// all buffers free again
	if _, err := b.Recv(in, 0); err != nil {
		t.Fatal(err)
	}
	lent := make([][]byte, 2)
	if a.Lend(lent) != 2 || len(lent[0]) != 128 || a.MaxFrame() != 128 {
		t.Fatalf("Lend: %d-byte buffers, MaxFrame %d", len(lent[0]), a.MaxFrame())
	}
	if n, err := a.Submit([][]byte{lent[0][:60], buf, lent[1][:60]}); n != 1 || !errors.Is(err, port.ErrNotLent) {
		t.Fatalf("a buffer that was not lent: %d, %v", n, err)
	}
	if n, err := a.Submit([][]byte{lent[0][:60]}); n != 0 || !errors.Is(err, port.ErrNotLent) {
		t.Fatalf("a buffer submitted twice: %d, %v", n, err)
	}
	if n, err := a.Submit([][]byte{lent[1][:0]}); n != 1 || err != nil || a.Stats().Sent != 13 {
		t.Fatalf("an empty frame gives its buffer back: %d, %v, sent %d", n, err, a.Stats().Sent)
	}
}

func TestRecvViewValidUntilNextRecv(t *testing.T) {
	vc, a, b := virtualPair(Impairments{}, 1)
	buf := make([]byte, 64)
	mustSend(t, a, [][]byte{seqFrame(buf, 1)})
	in := make([][]byte, 1)
	if _, err := b.Recv(in, 0); err != nil {
		t.Fatal(err)
	}
	view := in[0]
	// The sender reusing its buffer and sending more must not touch the view.
	for i := range 500 {
		mustSend(t, a, [][]byte{seqFrame(buf, uint32(100+i))})
	}
	_ = vc
	if seqOf(view) != 1 {
		t.Fatalf("view changed under the caller: seq %d", seqOf(view))
	}
	if cap(view) != len(view) {
		t.Fatal("view capacity exposes the rest of the buffer")
	}
}

func TestCloseSemantics(t *testing.T) {
	_, a, b := virtualPair(Impairments{}, 1)
	buf := make([]byte, 64)
	mustSend(t, a, [][]byte{buf})
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Recv(make([][]byte, 1), 0); !errors.Is(err, port.ErrClosed) {
		t.Fatal(err)
	}
	if _, err := port.Send(b, [][]byte{buf}); !errors.Is(err, port.ErrClosed) {
		t.Fatal(err)
	}
	if n, err := port.Send(a, [][]byte{buf, buf}); n != 2 || err != nil {
		t.Fatal(n, err)
	}
	if st := a.Stats(); st.PeerClosed != 2 {
		t.Fatalf("PeerClosed %d", st.PeerClosed)
	}
	if b.Close() != nil {
		t.Fatal("second Close failed")
	}
}

func TestSetImpairmentsOneDirection(t *testing.T) {
	vc, a, b := virtualPair(Impairments{}, 1)
	a.SetImpairments(Impairments{Loss: 1})
	seqs, _ := pump(t, vc, a, b, 100)
	back, _ := pump(t, vc, b, a, 100)
	if len(seqs) != 0 || len(back) != 100 {
		t.Fatalf("a→b got %d (want 0), b→a got %d (want 100)", len(seqs), len(back))
	}
}

// TestRealTimeConcurrent runs each end in its own goroutine, as the live
// engine would, with delay and jitter: every frame arrives, Recv blocks and
// wakes. It asserts counts, never durations.
func TestRealTimeConcurrent(t *testing.T) {
	a, b := NewPair(Config{Impairments: Impairments{Delay: 20 * time.Microsecond, Jitter: 5 * time.Microsecond}, Frames: 256})
	defer a.Close()
	defer b.Close()
	const n = 20000
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		out := make([][]byte, 16)
		buf := make([]byte, 64)
		for sent := 0; sent < n; {
			k := min(len(out), n-sent)
			for i := range k {
				out[i] = buf
			}
			m, err := port.Send(a, out[:k])
			if err != nil {
				t.Error(err)
				return
			}
			sent += m
			if m == 0 {
				time.Sleep(10 * time.Microsecond) // back-pressure
			}
		}
	}()
	in := make([][]byte, port.BatchSize)
	got := 0
	for idle := 0; got < n && idle < 50; {
		k, err := b.Recv(in, 100*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if k == 0 {
			idle++
		}
		got += k
	}
	wg.Wait()
	if got != n {
		t.Fatalf("received %d of %d", got, n)
	}
}

func TestRealTimeRecvWaitsForDueFrame(t *testing.T) {
	a, b := NewPair(Config{Impairments: Impairments{Delay: 2 * time.Millisecond}})
	defer a.Close()
	defer b.Close()
	in := make([][]byte, 4)
	if k, _ := b.Recv(in, 0); k != 0 {
		t.Fatal("frame from nowhere")
	}
	mustSend(t, a, [][]byte{make([]byte, 60)})
	// A generous timeout: Recv must return the frame once due, not time out.
	k, err := b.Recv(in, 10*time.Second)
	if k != 1 || err != nil {
		t.Fatalf("Recv %d, %v", k, err)
	}
	// Close from another goroutine wakes a blocked Recv.
	go func() { time.Sleep(time.Millisecond); b.Close() }()
	if _, err := b.Recv(in, 10*time.Second); !errors.Is(err, port.ErrClosed) {
		t.Fatalf("blocked Recv after Close: %v", err)
	}
}

func TestNoAllocationsPerFrame(t *testing.T) {
	vc, a, b := virtualPair(Impairments{Loss: 0.01, Duplicate: 0.01, Reorder: 0.01, Corrupt: 0.01, Jitter: time.Microsecond}, 1)
	out := make([][]byte, port.BatchSize)
	in := make([][]byte, port.BatchSize)
	buf := make([]byte, 256)
	for i := range out {
		out[i] = buf
	}
	lent := make([][]byte, port.BatchSize)
	send := func(p port.Port) {
		n := p.Lend(lent)
		for i := range lent[:n] {
			lent[i] = lent[i][:copy(lent[i], out[i])]
		}
		if _, err := p.Submit(lent[:n]); err != nil {
			t.Fatal(err)
		}
	}
	allocs := testing.AllocsPerRun(200, func() {
		send(a)
		vc.Advance(20 * time.Microsecond)
		for {
			if k, _ := b.Recv(in, 0); k == 0 {
				break
			}
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per batch, want 0", allocs)
	}
	// Real-time mode too (no blocking: timeout 0).
	ra, rb := NewPair(Config{})
	defer ra.Close()
	defer rb.Close()
	allocs = testing.AllocsPerRun(200, func() {
		send(ra)
		for {
			if k, _ := rb.Recv(in, 0); k == 0 {
				break
			}
		}
	})
	if allocs != 0 {
		t.Fatalf("real time: %v allocations per batch, want 0", allocs)
	}
}

func BenchmarkVirtualSendRecv(b *testing.B) {
	for _, size := range []int{64, 1024, 4096} {
		b.Run(sizeName(size), func(b *testing.B) {
			vc := &VirtualClock{}
			x, y := NewPair(Config{Clock: vc.Now})
			out := make([][]byte, port.BatchSize)
			in := make([][]byte, port.BatchSize)
			buf := make([]byte, size)
			for i := range out {
				out[i] = buf
			}
			b.SetBytes(int64(size) * port.BatchSize)
			b.ReportAllocs()
			lent := make([][]byte, port.BatchSize)
			for b.Loop() {
				n := x.Lend(lent)
				for i := range lent[:n] {
					lent[i] = lent[i][:copy(lent[i], out[i])]
				}
				if _, err := x.Submit(lent[:n]); err != nil {
					b.Fatal(err)
				}
				if _, err := y.Recv(in, 0); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)*port.BatchSize/b.Elapsed().Seconds(), "frames/s")
		})
	}
}

func BenchmarkRealTimeTwoGoroutines(b *testing.B) {
	x, y := NewPair(Config{})
	defer x.Close()
	defer y.Close()
	const size = 64
	total := b.N * port.BatchSize
	done := make(chan struct{})
	go func() {
		defer close(done)
		in := make([][]byte, port.BatchSize)
		for got := 0; got < total; {
			k, err := y.Recv(in, time.Second)
			if err != nil || k == 0 {
				return
			}
			got += k
		}
	}()
	out := make([][]byte, port.BatchSize)
	buf := make([]byte, size)
	for i := range out {
		out[i] = buf
	}
	b.SetBytes(size * port.BatchSize)
	b.ResetTimer()
	for sent := 0; sent < total; {
		n, _ := port.Send(x, out[:min(port.BatchSize, total-sent)])
		sent += n
		if n == 0 {
			time.Sleep(time.Microsecond)
		}
	}
	<-done
	b.ReportMetric(float64(total)/b.Elapsed().Seconds(), "frames/s")
}

func sizeName(n int) string {
	switch n {
	case 64:
		return "64B"
	case 1024:
		return "1KiB"
	default:
		return "4KiB"
	}
}

func TestExactDelayWithoutJitter(t *testing.T) {
	vc, a, b := virtualPair(Impairments{Delay: 100 * time.Microsecond}, 1)
	vc.Set(clock.Time(5 * time.Microsecond))
	if b.NextDelivery() != clock.Never {
		t.Fatal("NextDelivery with nothing queued")
	}
	mustSend(t, a, [][]byte{make([]byte, 64)})
	due := clock.Time(105 * time.Microsecond)
	if b.NextDelivery() != due || b.InFlight() != 1 {
		t.Fatalf("NextDelivery %v, want %v", b.NextDelivery(), due)
	}
	in := make([][]byte, 1)
	vc.Set(due - 1)
	if k, _ := b.Recv(in, 0); k != 0 {
		t.Fatal("delivered 1 ns early")
	}
	vc.Set(due)
	if k, _ := b.Recv(in, 0); k != 1 || b.NextDelivery() != clock.Never {
		t.Fatal("not delivered when due")
	}
}

// mustSend sends frames of the test's memory through p, all of them.
func mustSend(t *testing.T, p port.Port, frames [][]byte) {
	t.Helper()
	if n, err := port.Send(p, frames); n != len(frames) || err != nil {
		t.Fatalf("send: %d of %d, %v", n, len(frames), err)
	}
}

package afxdp

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/netnstest"
	"github.com/softrnic/softrnic/port"
)

// fakeQueue is a receive queue for the scheduling tests: it holds pending
// frames, hands out views that it invalidates (overwrites) on the next
// Recv, as a real queue's FILL ring does.
type fakeQueue struct {
	id      byte
	pending int
	calls   int
	lent    [][]byte
	buf     [port.BatchSize][4]byte
}

func (f *fakeQueue) Recv(frames [][]byte, _ time.Duration) (int, error) {
	f.calls++
	for _, b := range f.lent {
		b[0] = 0xff // the previous views are dead
	}
	f.lent = f.lent[:0]
	n := min(len(frames), f.pending)
	for i := 0; i < n; i++ {
		b := f.buf[i][:]
		b[0], b[1] = f.id, byte(i)
		frames[i] = b
		f.lent = append(f.lent, b)
	}
	f.pending -= n
	return n, nil
}
func (f *fakeQueue) Send(frames [][]byte) (int, error) { return len(frames), nil }
func (f *fakeQueue) MaxFrame() int                     { return 4 }
func (f *fakeQueue) Close() error                      { return nil }

func fakeMulti(qs ...*fakeQueue) (*Multi, *int) {
	waits := new(int)
	m := &Multi{received: make([]uint64, len(qs))}
	for _, q := range qs {
		m.subs = append(m.subs, q)
	}
	m.wait = func(time.Duration) error { *waits++; return nil }
	return m, waits
}

// TestMultiNoStarvation: one queue flooded without end never keeps a
// frame waiting on another queue for more than len(queues) calls, every
// queue is asked on every call (so its previous views are released), and
// the views one call returns are all alive when it returns.
func TestMultiNoStarvation(t *testing.T) {
	flood := &fakeQueue{id: 0, pending: 1 << 30}
	qs := []*fakeQueue{flood, {id: 1}, {id: 2}, {id: 3}}
	m, _ := fakeMulti(qs...)
	frames := make([][]byte, port.BatchSize)
	for round := 0; round < 20; round++ {
		for _, q := range qs[1:] {
			q.pending = 3
		}
		seen := map[byte]int{}
		for call := 0; call < len(qs); call++ {
			n, err := m.Recv(frames, 0)
			if err != nil {
				t.Fatal(err)
			}
			if n != len(frames) {
				t.Fatalf("round %d call %d: %d frames, want a full batch with queue 0 flooded", round, call, n)
			}
			for _, f := range frames[:n] {
				if f[0] == 0xff {
					t.Fatalf("round %d call %d: Recv returned a released view", round, call)
				}
				seen[f[0]]++
			}
		}
		for _, q := range qs[1:] {
			if seen[q.id] != 3 || q.pending != 0 {
				t.Errorf("round %d: queue %d delivered %d of 3 within %d calls", round, q.id, seen[q.id], len(qs))
			}
		}
	}
	for _, q := range qs {
		if q.calls != 20*len(qs) {
			t.Errorf("queue %d asked %d times in %d calls", q.id, q.calls, 20*len(qs))
		}
	}
	for i, r := range m.received {
		if i > 0 && r != 60 {
			t.Errorf("queue %d: %d frames counted, want 60", i, r)
		}
	}
}

// TestMultiWaitsOnlyWhenIdle: Recv sleeps (polls every socket) only when
// no queue had frames, then looks again.
func TestMultiWaitsOnlyWhenIdle(t *testing.T) {
	a, b := &fakeQueue{id: 0}, &fakeQueue{id: 1}
	m, waits := fakeMulti(a, b)
	frames := make([][]byte, 8)
	if n, _ := m.Recv(frames, time.Millisecond); n != 0 || *waits != 1 {
		t.Fatalf("idle: %d frames, %d waits; want 0 and 1", n, *waits)
	}
	b.pending = 2
	if n, _ := m.Recv(frames, time.Millisecond); n != 2 || *waits != 1 {
		t.Fatalf("busy: %d frames, %d waits; want 2 and still 1", n, *waits)
	}
	if n, _ := m.Recv(frames, 0); n != 0 || *waits != 1 {
		t.Fatalf("timeout 0 must never wait: %d frames, %d waits", n, *waits)
	}
	if a.calls != b.calls {
		t.Errorf("queues asked %d and %d times", a.calls, b.calls)
	}
	if got := testing.AllocsPerRun(100, func() { m.Recv(frames, 0) }); got != 0 {
		t.Errorf("Recv allocates %.1f times per call", got)
	}
}

// TestMultiAllQueues: a port over all four queues of a veth end receives,
// byte for byte, frames sent from each of the peer's four transmit queues
// (on veth, the peer's transmit queue q lands on receive queue q), counts
// them on the queue they arrived on, and does not allocate per batch.
func TestMultiAllQueues(t *testing.T) {
	const nq = 4
	pair := netnstest.NewTestPair(t, netnstest.PairOptions{Queues: nq})
	var a, b *Multi
	for _, side := range []struct {
		l *netnstest.Link
		m **Multi
	}{{&pair.A, &a}, {&pair.B, &b}} {
		if err := side.l.NS.Do(func() error {
			n, err := RxQueues(side.l.Index)
			if err != nil {
				return err
			}
			if n != nq {
				return fmt.Errorf("RxQueues(%s) = %d, want %d", side.l.Name, n, nq)
			}
			// From ethtool, not from the sysfs fallback.
			if n, err := ethtoolRxQueues(side.l.Name); n != nq || err != nil {
				return fmt.Errorf("ethtool channels of %s: %d, %v", side.l.Name, n, err)
			}
			*side.m, err = OpenMulti(MultiConfig{Config: Config{IfIndex: side.l.Index}})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		m := *side.m
		t.Cleanup(func() { m.Close() })
	}
	if b.NumQueues() != nq {
		t.Fatalf("serving %d queues, want %d", b.NumQueues(), nq)
	}

	size := func(seq uint32) int { return 60 + int(seq*131)%(1514-60+1) }
	const rounds, perQueue = 40, 16
	want := map[uint32]bool{}
	frames := make([][]byte, port.BatchSize)
	out := make([][]byte, perQueue)
	for i := range out {
		out[i] = make([]byte, 1514)
	}
	expect := make([]byte, 1514)
	sent := [nq]int{}
	for r := 0; r < rounds; r++ {
		for q := 0; q < nq; q++ {
			for i := range out {
				seq := uint32(q)<<24 | uint32(r*perQueue+i)
				out[i] = netnstest.RoCEFrame(out[i][:size(seq)], &pair.A, &pair.B, seq)
				want[seq] = true
			}
			k, err := a.Queue(q).Send(out)
			if err != nil || k != len(out) {
				t.Fatalf("send on queue %d: %d of %d, %v", q, k, len(out), err)
			}
			sent[q] += k
		}
		deadline := time.Now().Add(5 * time.Second)
		for len(want) > 0 && time.Now().Before(deadline) {
			n, err := b.Recv(frames, 5*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range frames[:n] {
				if len(f) < 46 {
					t.Fatalf("runt frame of %d bytes", len(f))
				}
				seq := uint32(f[42])<<24 | uint32(f[43])<<16 | uint32(f[44])<<8 | uint32(f[45])
				if !want[seq] {
					t.Fatalf("unexpected or duplicate frame seq %#x", seq)
				}
				delete(want, seq)
				if !bytes.Equal(f, netnstest.RoCEFrame(expect[:size(seq)], &pair.A, &pair.B, seq)) {
					t.Fatalf("frame seq %#x differs from what was sent", seq)
				}
			}
		}
		if len(want) > 0 {
			t.Fatalf("round %d: %d frames never arrived", r, len(want))
		}
	}
	qs, err := b.QueueStats()
	if err != nil {
		t.Fatal(err)
	}
	for i, q := range qs {
		t.Logf("queue %d: received %d, rx descs %d", q.Queue, q.Received, q.Socket.RxDescs)
		if int(q.Received) != sent[i] {
			t.Errorf("queue %d received %d frames, its peer queue sent %d", q.Queue, q.Received, sent[i])
		}
	}
	st, err := b.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.Program.Unbound != 0 || st.Socket.RxDescs != uint64(rounds*perQueue*nq) {
		t.Errorf("stats %+v: want no unbound frames and %d descriptors", st, rounds*perQueue*nq)
	}

	// Zero allocations per batch: a frame on every queue, sent and received.
	one := [][]byte{netnstest.RoCEFrame(make([]byte, 128), &pair.A, &pair.B, 7)}
	allocs := testing.AllocsPerRun(200, func() {
		for q := 0; q < nq; q++ {
			a.Queue(q).Send(one)
		}
		for got, tries := 0, 0; got < nq && tries < 100; tries++ {
			n, _ := b.Recv(frames, time.Millisecond)
			got += n
		}
	})
	if allocs != 0 {
		t.Errorf("%.1f allocations per batch, want 0", allocs)
	}
}

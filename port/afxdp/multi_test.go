package afxdp

import (
	"bytes"
	"fmt"
	"strings"
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
	room    int      // Submit takes at most this many frames (-1: all)
	sent    [][]byte // what Submit took (frames given back empty are not)
	kicks   int
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
func (f *fakeQueue) Lend(bufs [][]byte) int { return 0 }
func (f *fakeQueue) Submit(frames [][]byte) (int, error) {
	n := 0
	for _, b := range frames {
		if len(b) > 0 {
			if f.room == 0 {
				break
			}
			if f.room > 0 {
				f.room--
			}
			f.sent = append(f.sent, b)
		}
		n++
	}
	return n, nil
}
func (f *fakeQueue) post(frames [][]byte) (int, error) { return f.Submit(frames) }

// postCopy takes the frames themselves: the fake has no memory of its own
// to copy them into.
func (f *fakeQueue) postCopy(frames, _ [][]byte) (int, error) { return f.Submit(frames) }
func (f *fakeQueue) kickTx() error                            { f.kicks++; return nil }
func (f *fakeQueue) MaxFrame() int                            { return 4 }
func (f *fakeQueue) Close() error                             { return nil }

func fakeMulti(qs ...*fakeQueue) (*Multi, *int) {
	waits := new(int)
	m := &Multi{received: make([]uint64, len(qs)), kick: make([]bool, len(qs)),
		scratch: make([][]byte, port.BatchSize), back: make([][]byte, port.BatchSize)}
	for _, q := range qs {
		m.subs = append(m.subs, q)
		m.txq = append(m.txq, q)
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
	if got := testing.AllocsPerRun(100, func() { _, _ = m.Recv(frames, 0) }); got != 0 {
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
		l      *netnstest.Link
		m      **Multi
		spread bool
	}{{&pair.A, &a, true}, {&pair.B, &b, false}} {
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
				return fmt.Errorf("ethtool channels of %s: %d, %w", side.l.Name, n, err)
			}
			*side.m, err = OpenMulti(MultiConfig{Config: Config{IfIndex: side.l.Index}, SpreadTx: side.spread})
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
	if err := pair.B.NS.Do(func() error {
		m, err := OpenMulti(MultiConfig{Config: Config{IfIndex: pair.B.Index}, Queues: nq + 1})
		if err == nil {
			m.Close()
			return fmt.Errorf("%d queues served on a %d-queue interface", nq+1, nq)
		}
		if !strings.Contains(err.Error(), fmt.Sprintf("has %d receive queues; cannot serve %d", nq, nq+1)) {
			return fmt.Errorf("unclear refusal: %w", err)
		}
		return nil
	}); err != nil {
		t.Error(err)
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
			k, err := port.Send(a.Queue(q), out)
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

	// SpreadTx: frames sent through the Multi leave on their source
	// port's queue, which on veth is the queue they arrive on; frames of one
	// source port (one QP) keep their order.
	before := make([]uint64, nq)
	for i, q := range qs {
		before[i] = q.Received
	}
	var perQueue2 [nq]uint64
	batch := make([][]byte, 0, 48)
	for i := 0; i < 48; i++ {
		seq := uint32(0x7f000000) | uint32(i*7)
		batch = append(batch, netnstest.RoCEFrame(make([]byte, size(seq)), &pair.A, &pair.B, seq))
		perQueue2[flowQueue(uint16(49152+seq%1024), nq)]++
	}
	kicks := func() (n uint64) {
		qs, err := a.QueueStats()
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range qs {
			n += q.Socket.Kicks
		}
		return n
	}
	k0 := kicks()
	if k, err := port.Send(a, batch); k != len(batch) || err != nil {
		t.Fatalf("spread send: %d of %d, %v", k, len(batch), err)
	}
	// The 48 frames alternate between queues (runs of about one frame);
	// each queue is woken once (a wakeup may take a second sendto when the
	// kernel sends in budgets), not once per run.
	if k := kicks() - k0; k > 2*nq {
		t.Errorf("%d sendto wakeups for one spread Send over %d queues", k, nq)
	} else {
		t.Logf("spread Send of %d frames: %d wakeups", len(batch), k)
	}
	lastSeq := map[uint16]uint32{}
	for got, deadline := 0, time.Now().Add(5*time.Second); got < len(batch); {
		if time.Now().After(deadline) {
			t.Fatalf("spread: %d of %d frames arrived", got, len(batch))
		}
		n, err := b.Recv(frames, 5*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range frames[:n] {
			seq := uint32(f[42])<<24 | uint32(f[43])<<16 | uint32(f[44])<<8 | uint32(f[45])
			sport := uint16(f[34])<<8 | uint16(f[35])
			if last, ok := lastSeq[sport]; ok && seq <= last {
				t.Errorf("source port %d: seq %#x after %#x", sport, seq, last)
			}
			lastSeq[sport] = seq
			got++
		}
	}
	if qs, err = b.QueueStats(); err != nil {
		t.Fatal(err)
	}
	for i, q := range qs {
		if q.Received-before[i] != perQueue2[i] {
			t.Errorf("spread: queue %d received %d, want %d (by source port)", i, q.Received-before[i], perQueue2[i])
		}
	}

	// Zero allocations per batch: a frame on every queue, sent and received.
	one := [][]byte{netnstest.RoCEFrame(make([]byte, 128), &pair.A, &pair.B, 7)}
	var c port.Copier
	allocs := testing.AllocsPerRun(200, func() {
		for q := 0; q < nq; q++ {
			if _, err := c.Send(a.Queue(q), one); err != nil {
				t.Fatal(err)
			}
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

// udpFrame is an Ethernet frame (tagged or not) carrying IPv4 or IPv6 UDP
// from source port sport.
func udpFrame(v6, vlan bool, sport uint16) []byte {
	var f []byte
	f = append(f, make([]byte, 12)...)
	if vlan {
		f = append(f, 0x81, 0x00, 0, 5)
	}
	if v6 {
		f = append(f, 0x86, 0xdd)
		ip := make([]byte, 40)
		ip[0], ip[6] = 0x60, 17
		f = append(f, ip...)
	} else {
		f = append(f, 0x08, 0x00)
		ip := make([]byte, 24) // with 4 bytes of options: IHL 6
		ip[0], ip[9] = 0x46, 17
		f = append(f, ip...)
	}
	return append(f, byte(sport>>8), byte(sport), 0x12, 0xb7, 0, 8, 0, 0)
}

// TestFlowQueue: consecutive source ports (neighbouring QPs) spread evenly.
func TestFlowQueue(t *testing.T) {
	for _, n := range []int{2, 3, 4, 8} {
		count := make([]int, n)
		for p := 0xC000; p < 0xC000+64*n; p++ {
			q := flowQueue(uint16(p), n)
			if q < 0 || q >= n {
				t.Fatalf("flowQueue(%#x, %d) = %d", p, n, q)
			}
			count[q]++
		}
		for q, c := range count {
			if c < 48 || c > 80 {
				t.Errorf("%d queues: queue %d got %d of %d consecutive ports", n, q, c, 64*n)
			}
		}
	}
}

// TestUDPSourcePort: the transmit queue follows the UDP source port of
// IPv4 (with options) and IPv6 frames, tagged or not; anything else, and
// truncated headers, fall back without reading past the frame.
func TestUDPSourcePort(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		for _, vlan := range []bool{false, true} {
			f := udpFrame(v6, vlan, 0xC123)
			if p, ok := udpSourcePort(f); !ok || p != 0xC123 {
				t.Errorf("v6 %v vlan %v: %#x %v", v6, vlan, p, ok)
			}
			for n := 0; n < len(f)-6; n++ {
				if _, ok := udpSourcePort(f[:n]); ok {
					t.Errorf("v6 %v vlan %v: truncated to %d bytes accepted", v6, vlan, n)
				}
			}
		}
	}
	tcp := udpFrame(false, false, 1)
	tcp[14+9] = 6
	arp := udpFrame(false, false, 1)
	arp[12], arp[13] = 0x08, 0x06
	for _, f := range [][]byte{tcp, arp} {
		if _, ok := udpSourcePort(f); ok {
			t.Errorf("non-UDP frame %x accepted", f[:16])
		}
	}
}

// TestMultiSpreadTx: with SpreadTx each frame leaves on its source port's
// queue; runs for one queue go out as one batch, each queue is woken once
// per Submit however its runs interleave with others'; when a queue takes
// fewer than offered, Submit stops there, so no later frame (of any QP)
// overtakes the one the engine will offer again.
func TestMultiSpreadTx(t *testing.T) {
	qs := []*fakeQueue{{id: 0, room: -1}, {id: 1, room: -1}, {id: 2, room: -1}}
	m, _ := fakeMulti(qs...)
	m.spread, m.txDefault = true, 1
	arp := udpFrame(false, false, 0)
	arp[12], arp[13] = 0x08, 0x06
	// Source ports for queues 0, 1 and 2 of three.
	var sport [3]uint16
	for p, found := uint16(0xC000), 0; found < 3; p++ {
		if q := flowQueue(p, 3); sport[q] == 0 {
			sport[q] = p
			found++
		}
	}
	frames := [][]byte{
		udpFrame(false, false, sport[0]),
		udpFrame(true, false, sport[0]),
		udpFrame(false, true, sport[1]),
		arp, // TxQueue: 1
		udpFrame(false, false, sport[2]),
		udpFrame(false, false, sport[0]),
	}
	if n, err := m.Submit(frames); n != len(frames) || err != nil {
		t.Fatalf("Submit: %d, %v", n, err)
	}
	want := [][]int{{0, 1, 5}, {2, 3}, {4}}
	for q, idx := range want {
		if qs[q].kicks != 1 {
			t.Errorf("queue %d woken %d times for one Submit, want once", q, qs[q].kicks)
		}
		if len(qs[q].sent) != len(idx) {
			t.Fatalf("queue %d sent %d frames, want %d", q, len(qs[q].sent), len(idx))
		}
		for i, k := range idx {
			if &qs[q].sent[i][0] != &frames[k][0] {
				t.Errorf("queue %d frame %d is not frame %d", q, i, k)
			}
		}
	}
	// Back-pressure on queue 1 after one frame: frames 0, 1, 2 go, 3 is
	// refused, 4 and 5 are not offered.
	for _, q := range qs {
		q.sent = q.sent[:0]
	}
	qs[1].room = 1
	for _, q := range qs {
		q.kicks = 0
	}
	if n, err := m.Submit(frames); n != 3 || err != nil {
		t.Fatalf("Submit under back-pressure: %d, %v; want 3", n, err)
	}
	if qs[0].kicks != 1 || qs[1].kicks != 1 || qs[2].kicks != 0 {
		t.Errorf("wakeups under back-pressure %d %d %d, want 1 1 0 (only queues posted to)", qs[0].kicks, qs[1].kicks, qs[2].kicks)
	}
	if len(qs[2].sent) != 0 || len(qs[0].sent) != 2 {
		t.Errorf("frames after the refused one went out: queue 0 %d, queue 2 %d", len(qs[0].sent), len(qs[2].sent))
	}
	qs[1].room = -1
	if got := testing.AllocsPerRun(100, func() {
		for _, q := range qs {
			q.sent = q.sent[:0]
		}
		if _, err := m.Submit(frames); err != nil {
			t.Fatal(err)
		}
	}); got != 0 {
		t.Errorf("Submit allocates %.1f times per batch", got)
	}
}

// BenchmarkIdleRecv is what an engine iteration pays to look at its
// queues when none has a frame: one queue (Port) against four (Multi),
// on a veth end with four queues.
func BenchmarkIdleRecv(b *testing.B) {
	pair := netnstest.NewTestPair(b, netnstest.PairOptions{Queues: 4})
	for _, n := range []int{1, 4} {
		b.Run(fmt.Sprintf("queues%d", n), func(b *testing.B) {
			var p port.Port
			if err := pair.B.NS.Do(func() (err error) {
				if n == 1 {
					p, err = Open(Config{IfIndex: pair.B.Index})
				} else {
					p, err = OpenMulti(MultiConfig{Config: Config{IfIndex: pair.B.Index}, Queues: n})
				}
				return err
			}); err != nil {
				b.Fatal(err)
			}
			defer p.Close()
			frames := make([][]byte, port.BatchSize)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if k, err := p.Recv(frames, 0); k != 0 || err != nil {
					b.Fatalf("idle queue returned %d frames, %v", k, err)
				}
			}
		})
	}
}

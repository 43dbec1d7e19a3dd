package xsk

import (
	"bytes"
	"errors"
	"testing"

	"golang.org/x/sys/unix"
)

// fakeSocket is a Socket over fake rings and a heap UMEM of 2 KiB frames;
// its fd is one end of a socketpair so that wakeups (sendto, recvfrom) are
// harmless.
func fakeSocket(t *testing.T, numFrames uint32, start uint32, multi bool) *Socket {
	t.Helper()
	const frameSize = 2048
	half := numFrames / 2
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fds[0]); unix.Close(fds[1]) })
	s := &Socket{fd: fds[0], umem: make([]byte, numFrames*frameSize)}
	s.cfg = Config{FrameSize: frameSize, NumFrames: numFrames, MultiBuffer: multi, MaxFrame: 5000}
	s.cfg.RxChunks = 1
	s.info = Info{NeedWakeup: true, MultiBuffer: multi, FrameSize: frameSize, RxFrames: half, RxBuffers: half, TxFrames: numFrames - half}
	for _, r := range []struct {
		init  func([]byte, unix.XDPRingOffset)
		entry uint64
	}{
		{func(m []byte, o unix.XDPRingOffset) { s.fill.init(m, o, half, true) }, 8},
		{func(m []byte, o unix.XDPRingOffset) { s.comp.init(m, o, half, false) }, 8},
		{func(m []byte, o unix.XDPRingOffset) { s.rx.init(m, o, half, false) }, 16},
		{func(m []byte, o unix.XDPRingOffset) { s.tx.init(m, o, half, true) }, 16},
	} {
		m, o := fakeMapping(half, r.entry)
		setIndexes(m, o, start, start)
		r.init(m, o)
	}
	if err := s.txSlots.init(&s.cfg, half, half); err != nil {
		t.Fatal(err)
	}
	return s
}

// transmit sends frames of the caller's memory as port.Send does: it
// borrows slots, copies the frames into them and submits them. It returns
// how many went.
func transmit(s *Socket, frames [][]byte) (int, error) {
	bufs := make([][]byte, len(frames))
	n := s.Lend(bufs)
	for i := range bufs[:n] {
		if len(frames[i]) > len(bufs[i]) {
			return 0, ErrFrameTooLarge
		}
		bufs[i] = bufs[i][:copy(bufs[i], frames[i])]
	}
	return s.Submit(bufs[:n])
}

// kernelRX plays the kernel: it puts descriptors on the RX ring.
func kernelRX(s *Socket, descs ...unix.XDPDesc) {
	p := s.rx.producer.Load()
	for i, d := range descs {
		s.rx.descs[(p+uint32(i))&s.rx.mask] = d
	}
	s.rx.producer.Store(p + uint32(len(descs)))
}

// kernelTX plays the kernel: it takes everything from TX and completes it.
func kernelTX(s *Socket) []unix.XDPDesc {
	var out []unix.XDPDesc
	c, p := s.tx.consumer.Load(), s.tx.producer.Load()
	cp := s.comp.producer.Load()
	for ; c != p; c++ {
		d := s.tx.descs[c&s.tx.mask]
		out = append(out, d)
		s.comp.addrs[cp&s.comp.mask] = d.Addr
		cp++
	}
	s.tx.consumer.Store(c)
	s.comp.producer.Store(cp)
	return out
}

// TestRingWrap runs the RX/FILL and TX/COMPLETION protocol across the 2^32
// wrap of the free-running indexes.
func TestRingWrap(t *testing.T) {
	s := fakeSocket(t, 16, ^uint32(0)-20, false)
	descs := make([]unix.XDPDesc, 8)
	for round := 0; round < 10; round++ {
		// RX: the kernel delivers 5 frames, we take them and give them back.
		var in []unix.XDPDesc
		for i := 0; i < 5; i++ {
			in = append(in, unix.XDPDesc{Addr: uint64(i)*2048 + 256, Len: uint32(60 + round + i)})
		}
		kernelRX(s, in...)
		if n := s.Receive(descs); n != 5 {
			t.Fatalf("round %d: Receive %d, want 5", round, n)
		}
		for i := range in {
			if descs[i] != in[i] {
				t.Fatalf("round %d: desc %d = %+v, want %+v", round, i, descs[i], in[i])
			}
		}
		if n := s.Receive(descs); n != 0 {
			t.Fatalf("round %d: second Receive %d, want 0", round, n)
		}
		s.Fill(descs[:5])
		p := s.fill.producer.Load()
		for i := 0; i < 5; i++ {
			if a := s.fill.addrs[(p-5+uint32(i))&s.fill.mask]; a != uint64(i)*2048 {
				t.Fatalf("round %d: FILL got %#x, want the chunk base %#x", round, a, i*2048)
			}
		}
		s.fill.consumer.Store(p) // the kernel takes them

		// TX: 3 frames go out, byte for byte, and come back on COMPLETION.
		frames := [][]byte{bytes.Repeat([]byte{1}, 60), bytes.Repeat([]byte{2}, 2048), bytes.Repeat([]byte{byte(round)}, 100)}
		n, err := transmit(s, frames)
		if err != nil || n != 3 {
			t.Fatalf("round %d: transmit %d, %v", round, n, err)
		}
		for i, d := range kernelTX(s) {
			if got := s.umem[d.Addr : d.Addr+uint64(d.Len)]; !bytes.Equal(got, frames[i]) || d.Options != 0 {
				t.Fatalf("round %d: TX frame %d differs", round, i)
			}
		}
		if s.Complete() != 3 || s.TxPending() != 0 {
			t.Fatalf("round %d: completions not reaped: pending %d", round, s.TxPending())
		}
	}
}

// TestLendBackPressure: with every slot lent or on the wire Lend lends
// fewer, or none; completions make room again. Submit refuses what it did
// not lend, and takes an empty frame's slot back.
func TestLendBackPressure(t *testing.T) {
	s := fakeSocket(t, 16, 0, false) // 8 slots of one chunk
	bufs := make([][]byte, 12)
	if n := s.Lend(bufs); n != 8 || len(bufs[0]) != 2048 {
		t.Fatalf("Lend: %d slots of %d bytes; want the 8 of the pool, 2048 bytes", n, len(bufs[0]))
	}
	if n := s.Lend(bufs[8:]); n != 0 {
		t.Fatalf("Lend with every slot lent: %d", n)
	}
	if n, err := s.Submit([][]byte{make([]byte, 64)}); n != 0 || !errors.Is(err, ErrNotLent) {
		t.Fatalf("Submit of a foreign buffer: %d, %v", n, err)
	}
	for i := range bufs[:8] {
		bufs[i] = bufs[i][:60]
	}
	bufs[7] = bufs[7][:0] // given back unsent
	if n, err := s.Submit(bufs[:8]); n != 8 || err != nil {
		t.Fatalf("Submit: %d, %v", n, err)
	}
	if n, err := s.Submit(bufs[:1]); n != 0 || !errors.Is(err, ErrNotLent) {
		t.Fatalf("Submit of a slot already sent: %d, %v", n, err)
	}
	if n := s.Lend(bufs[8:]); n != 1 || s.TxPending() != 7 {
		t.Fatalf("Lend after one slot came back unsent: %d, pending %d", n, s.TxPending())
	}
	if out := kernelTX(s); len(out) != 7 {
		t.Fatalf("%d descriptors on TX, want 7", len(out))
	}
	if n := s.Lend(bufs[9:]); n != 3 || s.TxPending() != 0 {
		t.Fatalf("Lend after completion: %d, pending %d; want 3, 0", n, s.TxPending())
	}
}

// TestSubmitMultiBuffer: a slot is contiguous chunks; a frame larger than
// a chunk goes out as one descriptor per chunk, all but the last marked
// XDP_PKT_CONTD, and its slot is free only when all are completed.
func TestSubmitMultiBuffer(t *testing.T) {
	s := fakeSocket(t, 16, 0, true) // MaxFrame 5000: slots of 3 chunks, 2 of them
	if s.MaxTxFrame() != 5000 || len(s.txSlots.state) != 2 {
		t.Fatalf("MaxTxFrame %d, %d slots", s.MaxTxFrame(), len(s.txSlots.state))
	}
	f := make([]byte, 4154)
	for i := range f {
		f[i] = byte(i * 7)
	}
	if n, err := transmit(s, [][]byte{f}); err != nil || n != 1 {
		t.Fatalf("transmit: %d, %v", n, err)
	}
	out := kernelTX(s)
	if len(out) != 3 {
		t.Fatalf("%d segments, want 3", len(out))
	}
	var got []byte
	for i, d := range out {
		wantOpt := uint32(unix.XDP_PKT_CONTD)
		if i == 2 {
			wantOpt = 0
		}
		if d.Options != wantOpt || d.Addr != out[0].Addr+uint64(i)*2048 {
			t.Errorf("segment %d at %#x options %#x", i, d.Addr, d.Options)
		}
		got = append(got, s.umem[d.Addr:d.Addr+uint64(d.Len)]...)
	}
	if !bytes.Equal(got, f) {
		t.Error("segments do not reassemble to the frame")
	}
	// Two of the three completions: the slot stays in flight.
	bufs := make([][]byte, 2)
	c := s.comp.producer.Load()
	s.comp.producer.Store(c - 1)
	if n := s.Lend(bufs); n != 1 || s.TxPending() != 1 {
		t.Fatalf("with a segment outstanding: lent %d, pending %d", n, s.TxPending())
	}
	s.comp.producer.Store(c)
	if n := s.Lend(bufs[1:]); n != 1 || s.TxPending() != 0 {
		t.Fatalf("after the last segment: lent %d, pending %d", n, s.TxPending())
	}
}

func TestFrameBounds(t *testing.T) {
	s := fakeSocket(t, 16, 0, false)
	if f := s.Frame(unix.XDPDesc{Addr: uint64(len(s.umem)) - 10, Len: 20}); f != nil {
		t.Error("out-of-UMEM descriptor produced a slice")
	}
	if f := s.Frame(unix.XDPDesc{Addr: ^uint64(0) - 5, Len: 20}); f != nil {
		t.Error("descriptor whose end wraps around produced a slice")
	}
	if f := s.Frame(unix.XDPDesc{Addr: 256, Len: 60}); len(f) != 60 || cap(f) != 60 {
		t.Errorf("frame view len %d cap %d, want 60/60", len(f), cap(f))
	}
}

func TestHotPathAllocs(t *testing.T) {
	s := fakeSocket(t, 64, 0, true)
	descs := make([]unix.XDPDesc, 16)
	bufs := make([][]byte, 2)
	allocs := testing.AllocsPerRun(100, func() {
		kernelRX(s, unix.XDPDesc{Addr: 256, Len: 64}, unix.XDPDesc{Addr: 2048 + 256, Len: 64})
		n := s.Receive(descs)
		s.Fill(descs[:n])
		s.fill.consumer.Store(s.fill.producer.Load())
		if s.Lend(bufs) != 2 {
			t.Fatal("Lend")
		}
		bufs[0], bufs[1] = bufs[0][:64], bufs[1][:3000]
		if _, err := s.Submit(bufs); err != nil {
			t.Fatal(err)
		}
		if err := s.Kick(); err != nil {
			t.Fatal(err)
		}
		c, p := s.tx.consumer.Load(), s.tx.producer.Load()
		cp := s.comp.producer.Load()
		for ; c != p; c++ {
			s.comp.addrs[cp&s.comp.mask] = s.tx.descs[c&s.tx.mask].Addr
			cp++
		}
		s.tx.consumer.Store(c)
		s.comp.producer.Store(cp)
	})
	if allocs != 0 {
		t.Errorf("Receive/Fill/Lend/Submit/Kick allocate %.1f times per round, want 0", allocs)
	}
}

func TestOpenValidation(t *testing.T) {
	for _, c := range []Config{
		{FrameSize: 1000},
		{NumFrames: 100},
		{FrameSize: 2048, Headroom: 2000},
		{FrameSize: 4096, Headroom: 0xffffff00}, // would wrap a sum
		{NumFrames: 1 << 20},
	} {
		if s, err := Open(c); err == nil {
			s.Close()
			t.Errorf("Open(%+v) accepted", c)
		}
	}
}

// TestRxSpan: a received descriptor's span reaches the end of its receive
// buffer (RxChunks chunks), never past the receive pool.
func TestRxSpan(t *testing.T) {
	s := &Socket{umem: make([]byte, 24*2048)}
	s.cfg = Config{FrameSize: 2048, RxChunks: 3}
	s.info = Info{RxFrames: 8 * 3, RxBuffers: 8}
	for _, c := range []struct {
		d       unix.XDPDesc
		cap     int
		invalid bool
	}{
		{d: unix.XDPDesc{Addr: 256, Len: 1792}, cap: 3*2048 - 256},
		{d: unix.XDPDesc{Addr: 7*3*2048 + 256, Len: 100}, cap: 3*2048 - 256},
		{d: unix.XDPDesc{Addr: 3*2048 + 2048 + 10, Len: 60}, cap: 2*2048 - 10},
		{d: unix.XDPDesc{Addr: 8 * 3 * 2048, Len: 60}, invalid: true},     // past the pool
		{d: unix.XDPDesc{Addr: 3*2048 - 10, Len: 60}, invalid: true},      // runs into the next buffer
		{d: unix.XDPDesc{Addr: ^uint64(0) - 100, Len: 60}, invalid: true}, // wraps
	} {
		b := s.RxSpan(c.d)
		if c.invalid {
			if b != nil {
				t.Errorf("%+v: a span of %d/%d bytes", c.d, len(b), cap(b))
			}
			continue
		}
		if len(b) != int(c.d.Len) || cap(b) != c.cap || &b[0] != &s.umem[c.d.Addr] {
			t.Errorf("%+v: span len %d cap %d, want %d %d", c.d, len(b), cap(b), c.d.Len, c.cap)
		}
	}
}

// RxLevel follows the buffers from FILL to RX to the reader, across the
// 32-bit wrap of the ring indexes.
func TestRxLevel(t *testing.T) {
	s := fakeSocket(t, 32, ^uint32(0)-2, false)
	if f, q, b := s.RxLevel(); f != 0 || q != 0 || b != 16 {
		t.Fatalf("fresh: fill %d queued %d buffers %d, want 0 0 16", f, q, b)
	}
	descs := make([]unix.XDPDesc, 8)
	for i := range descs {
		descs[i].Addr = uint64(i) * 2048
	}
	s.Fill(descs)
	// The kernel takes 5 buffers from FILL and receives into them.
	s.fill.consumer.Store(s.fill.consumer.Load() + 5)
	kernelRX(s, descs[:5]...)
	if f, q, _ := s.RxLevel(); f != 3 || q != 5 {
		t.Fatalf("after 5 receives: fill %d queued %d, want 3 and 5", f, q)
	}
	got := make([]unix.XDPDesc, 2)
	if n := s.Receive(got); n != 2 {
		t.Fatalf("received %d, want 2", n)
	}
	if f, q, _ := s.RxLevel(); f != 3 || q != 3 {
		t.Fatalf("after the reader took 2: fill %d queued %d, want 3 and 3", f, q)
	}
	s.Fill(got)
	if f, q, _ := s.RxLevel(); f != 5 || q != 3 {
		t.Fatalf("after 2 went back: fill %d queued %d, want 5 and 3", f, q)
	}
}

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
	s.cfg = Config{FrameSize: frameSize, NumFrames: numFrames, MultiBuffer: multi, MaxFrame: 9018}
	s.info = Info{NeedWakeup: true, MultiBuffer: multi, FrameSize: frameSize, RxFrames: half, TxFrames: numFrames - half}
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
	for i := numFrames - 1; i >= half; i-- {
		s.txFree = append(s.txFree, uint64(i)*uint64(frameSize))
	}
	return s
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
		n, err := s.Transmit(frames)
		if err != nil || n != 3 {
			t.Fatalf("round %d: Transmit %d, %v", round, n, err)
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

// TestTransmitBackPressure: with no free frame left Transmit takes fewer
// frames and says so with a nil error; completions make room again.
func TestTransmitBackPressure(t *testing.T) {
	s := fakeSocket(t, 16, 0, false) // 8 TX frames
	frames := make([][]byte, 12)
	for i := range frames {
		frames[i] = make([]byte, 64)
	}
	n, err := s.Transmit(frames)
	if err != nil || n != 8 {
		t.Fatalf("Transmit: %d, %v; want 8 (the TX pool)", n, err)
	}
	if n, err := s.Transmit(frames[8:]); err != nil || n != 0 {
		t.Fatalf("Transmit with no frame: %d, %v; want 0, nil", n, err)
	}
	kernelTX(s)
	if n, err := s.Transmit(frames[8:]); err != nil || n != 4 {
		t.Fatalf("Transmit after completion: %d, %v; want 4", n, err)
	}
	if _, err := s.Transmit([][]byte{make([]byte, 2049)}); !errors.Is(err, ErrFrameTooLarge) {
		t.Errorf("2049 bytes without multi-buffer: %v, want ErrFrameTooLarge", err)
	}
}

// TestTransmitMultiBuffer: a frame larger than a chunk is split into chunk
// sized segments, all but the last marked XDP_PKT_CONTD.
func TestTransmitMultiBuffer(t *testing.T) {
	s := fakeSocket(t, 16, 0, true)
	f := make([]byte, 4154)
	for i := range f {
		f[i] = byte(i * 7)
	}
	if n, err := s.Transmit([][]byte{f}); err != nil || n != 1 {
		t.Fatalf("Transmit: %d, %v", n, err)
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
		if d.Options != wantOpt {
			t.Errorf("segment %d options %#x, want %#x", i, d.Options, wantOpt)
		}
		got = append(got, s.umem[d.Addr:d.Addr+uint64(d.Len)]...)
	}
	if !bytes.Equal(got, f) {
		t.Error("segments do not reassemble to the frame")
	}
	// A frame needing more segments than free TX frames waits whole.
	big := make([][]byte, 3)
	for i := range big {
		big[i] = make([]byte, 4000) // 2 segments each: 6 of 8 frames
	}
	s.Complete()
	n, err := s.Transmit(append(big, make([]byte, 5000))) // the 4th needs 3 more
	if err != nil || n != 3 {
		t.Fatalf("Transmit: %d, %v; want 3 whole frames", n, err)
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
	frames := [][]byte{make([]byte, 64), make([]byte, 3000)}
	allocs := testing.AllocsPerRun(100, func() {
		kernelRX(s, unix.XDPDesc{Addr: 256, Len: 64}, unix.XDPDesc{Addr: 2048 + 256, Len: 64})
		n := s.Receive(descs)
		s.Fill(descs[:n])
		s.fill.consumer.Store(s.fill.producer.Load())
		if _, err := s.Transmit(frames); err != nil {
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
		t.Errorf("Receive/Fill/Transmit allocate %.1f times per round, want 0", allocs)
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

func TestTransmitEmpty(t *testing.T) {
	s := fakeSocket(t, 16, 0, false)
	n, err := s.Transmit([][]byte{make([]byte, 60), nil, make([]byte, 60)})
	if n != 1 || !errors.Is(err, ErrEmptyFrame) {
		t.Errorf("Transmit with an empty frame: %d, %v; want 1, ErrEmptyFrame", n, err)
	}
}

package xsk

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// txPool is the transmit half of the UMEM, lent to the caller in slots of
// contiguous chunks so that a frame is built in place, in the memory the
// kernel sends it from: one chunk per slot, or with multi-buffer as many
// as MaxTxFrame needs (a 4154-byte frame in 4096-byte chunks: two). A
// frame goes on the TX ring as one descriptor per chunk it covers (all but
// the last marked XDP_PKT_CONTD); its slot is free again once the kernel
// has completed every one of them.
type txPool struct {
	base   uint64 // UMEM offset of slot 0
	size   uint64 // bytes per slot: chunks × FrameSize
	chunks int    // chunks per slot
	max    int    // the largest frame (MaxTxFrame)
	free   []uint32
	state  []uint8 // per slot: slotFree, slotLent or slotSent
	segs   []uint8 // per sent slot: descriptors not yet completed
	sent   int     // slots sent and not yet completed
}

const (
	slotFree = iota
	slotLent
	slotSent
)

// init lays the pool over n chunks of cfg's UMEM from chunk first on.
func (t *txPool) init(cfg *Config, first, n uint32) error {
	fs := int(cfg.FrameSize)
	t.max = min(cfg.MaxFrame, fs)
	if cfg.MultiBuffer {
		t.max = min(cfg.MaxFrame, maxSegments*fs)
	}
	t.chunks = (t.max + fs - 1) / fs
	slots := int(n) / t.chunks
	if slots == 0 {
		return fmt.Errorf("xsk: %d transmit chunks of %d bytes cannot hold one %d-byte frame", n, fs, t.max)
	}
	t.base = uint64(first) * uint64(fs)
	t.size = uint64(t.chunks) * uint64(fs)
	t.free = make([]uint32, 0, slots)
	for i := slots - 1; i >= 0; i-- {
		t.free = append(t.free, uint32(i))
	}
	t.state = make([]uint8, slots)
	t.segs = make([]uint8, slots)
	return nil
}

// MaxTxFrame is the largest frame Submit accepts, and the length of the
// buffers Lend lends.
func (s *Socket) MaxTxFrame() int { return s.txSlots.max }

// Lend stores in bufs up to len(bufs) free transmit slots, each
// MaxTxFrame bytes of UMEM, and returns how many: fewer when no more are
// free (their frames are on the TX ring or not yet completed). It reaps
// completions first. A lent slot is the caller's until Submit takes it
// back.
func (s *Socket) Lend(bufs [][]byte) int {
	if s.closed {
		return 0
	}
	s.Complete()
	t := &s.txSlots
	n := min(len(bufs), len(t.free))
	for i := 0; i < n; i++ {
		k := t.free[len(t.free)-1]
		t.free = t.free[:len(t.free)-1]
		t.state[k] = slotLent
		a := t.base + uint64(k)*t.size
		bufs[i] = s.umem[a : a+uint64(t.max) : a+uint64(t.max)]
	}
	if n < len(bufs) {
		s.stats.TxNoFrame++
	}
	return n
}

// Submit posts frames on the TX ring, in order, without waking the kernel
// (Kick does), and returns how many it took. Each frame is a slot Lend
// lent, resliced from its start to the frame's length; an empty one gives
// its slot back unsent. A frame that is not a lent slot, or is longer than
// MaxTxFrame, stops the batch with ErrNotLent or ErrFrameTooLarge, the
// frames before it taken. Fewer taken with a nil error means the TX ring
// is full, which a caller that only submits lent slots never sees: the
// ring has an entry for every chunk of the pool.
func (s *Socket) Submit(frames [][]byte) (int, error) {
	if s.closed {
		return 0, ErrClosed
	}
	t := &s.txSlots
	fs := int(s.cfg.FrameSize)
	free := s.tx.free(uint32(len(frames) * t.chunks))
	p := s.tx.cachedProducer
	posted := uint32(0)
	taken := 0
	var err error
	for _, f := range frames {
		k, ok := s.slotOf(f)
		if !ok || t.state[k] != slotLent {
			err = ErrNotLent
			break
		}
		if len(f) > t.max {
			err = ErrFrameTooLarge
			break
		}
		if len(f) == 0 {
			t.state[k] = slotFree
			t.free = append(t.free, k)
			taken++
			continue
		}
		segs := (len(f) + fs - 1) / fs
		if uint32(segs) > free-posted {
			break
		}
		a := t.base + uint64(k)*t.size
		for off := 0; off < len(f); off += fs {
			d := &s.tx.descs[(p+posted)&s.tx.mask]
			end := min(off+fs, len(f))
			d.Addr, d.Len, d.Options = a+uint64(off), uint32(end-off), 0
			if end < len(f) {
				d.Options = unix.XDP_PKT_CONTD
			}
			posted++
		}
		t.state[k], t.segs[k] = slotSent, uint8(segs)
		t.sent++
		taken++
	}
	if posted > 0 {
		s.tx.cachedProducer = p + posted
		s.tx.producer.Store(s.tx.cachedProducer)
		s.stats.TxDescs += uint64(posted)
	}
	return taken, err
}

// Complete takes the descriptors the kernel has sent from the COMPLETION
// ring, frees the slots whose every descriptor is back, and returns how
// many descriptors it took.
func (s *Socket) Complete() int {
	if s.closed {
		return 0
	}
	n := s.comp.available(s.comp.size)
	if n == 0 {
		return 0
	}
	t := &s.txSlots
	c := s.comp.cachedConsumer
	for i := uint32(0); i < n; i++ {
		a := s.comp.addrs[(c+i)&s.comp.mask]
		if a < t.base {
			continue // not ours: the kernel only completes what we posted
		}
		k := (a - t.base) / t.size
		if k >= uint64(len(t.state)) || t.state[k] != slotSent || t.segs[k] == 0 {
			continue
		}
		t.segs[k]--
		if t.segs[k] == 0 {
			t.state[k] = slotFree
			t.free = append(t.free, uint32(k))
			t.sent--
		}
	}
	s.comp.cachedConsumer = c + n
	s.comp.consumer.Store(s.comp.cachedConsumer)
	s.stats.TxCompleted += uint64(n)
	return int(n)
}

// TxPending is the number of frames submitted and not yet completed.
func (s *Socket) TxPending() int { return s.txSlots.sent }

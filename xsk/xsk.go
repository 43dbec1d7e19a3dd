package xsk

import (
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

// Mode asks for a bind mode.
type Mode int

const (
	// ModeAuto tries zero-copy and falls back to copy (the kernel's default).
	ModeAuto Mode = iota
	// ModeCopy forces copy mode (XDP_COPY).
	ModeCopy
	// ModeZeroCopy forces zero-copy (XDP_ZEROCOPY); bind fails without it.
	ModeZeroCopy
)

// Config describes a socket. Zero values take the defaults.
type Config struct {
	IfIndex int
	Queue   int
	// FrameSize is the UMEM chunk size: 2048 or 4096 (default 4096).
	FrameSize uint32
	// NumFrames is the number of UMEM frames, a power of two (default 4096);
	// half are receive buffers, half transmit chunks, unless RxBuffers
	// says how many receive buffers there are.
	NumFrames uint32
	// RxBuffers, if not 0, is the number of receive buffers, a power of
	// two up to MaxRxBuffers, and the size of the FILL and RX rings, apart
	// from the transmit half of NumFrames (the TX and COMPLETION rings):
	// a receiver that many peers send into needs far more buffers than it
	// sends frames. The UMEM holds both.
	RxBuffers uint32
	// Headroom is reserved by the kernel before each received frame.
	Headroom uint32
	// RxChunks is how many contiguous chunks a receive buffer spans
	// (default 1; the UMEM grows by the extra chunks). Only the first goes
	// on the FILL ring; the rest are the reader's, so that the later
	// segments of a multi-buffer frame can be copied in behind the first,
	// where the kernel put it (RxSpan), instead of the whole frame into a
	// buffer of the reader's own.
	RxChunks uint32
	// Mode selects zero-copy or copy.
	Mode Mode
	// MultiBuffer binds with XDP_USE_SG, so that a frame larger than one
	// chunk is carried in several descriptors (XDP_PKT_CONTD). The XDP
	// program must be loaded with frags support (ours is).
	MultiBuffer bool
	// NoNeedWakeup disables XDP_USE_NEED_WAKEUP (on by default: without it
	// every transmit needs a syscall and the driver spins on an empty FILL).
	NoNeedWakeup bool
	// MaxFrame bounds the frames Submit accepts (default 9018: a 9000-byte
	// MTU plus Ethernet and a VLAN tag); without MultiBuffer one chunk is
	// the limit too.
	MaxFrame int
	// BusyPoll, when non-zero, makes Wait and the wakeups run the driver's
	// NAPI loop from this thread for up to this long (SO_BUSY_POLL) instead
	// of sleeping until an interrupt: lower latency for a core's worth of
	// spinning. PreferBusyPoll (SO_PREFER_BUSY_POLL) keeps the softirq from
	// competing, and BusyPollBudget (SO_BUSY_POLL_BUDGET) is how many frames
	// one poll may process (0: the kernel's default).
	BusyPoll       time.Duration
	PreferBusyPoll bool
	BusyPollBudget int
}

// MaxRxBuffers bounds Config.RxBuffers: at 4 KiB chunks and two chunks a
// buffer, 512 MiB of UMEM.
const MaxRxBuffers = 1 << 16

// ErrFrameTooLarge is returned by Submit for a frame that does not fit.
var ErrFrameTooLarge = errors.New("xsk: frame larger than the socket can carry")

// ErrNotLent is returned by Submit for a frame that is not a slot Lend lent.
var ErrNotLent = errors.New("xsk: frame is not a lent transmit slot")

// ErrClosed is returned after Close.
var ErrClosed = errors.New("xsk: socket closed")

// maxSegments bounds the descriptors of one multi-buffer frame: the kernel's
// copy mode takes at most MAX_SKB_FRAGS+1 (18 is portable).
const maxSegments = 18

// Info says what the kernel gave us.
type Info struct {
	ZeroCopy    bool // XDP_OPTIONS_ZEROCOPY: frames are DMAed into the UMEM
	NeedWakeup  bool
	MultiBuffer bool
	FrameSize   uint32
	Headroom    uint32
	RxFrames    uint32 // chunks in the FILL/RX pool
	RxBuffers   uint32 // receive buffers they make (Config.RxChunks chunks each)
	TxFrames    uint32 // chunks in the TX/COMPLETION pool
	TxSlots     uint32 // frames they hold at once (slots of TxSlotChunks chunks)
	// TxSlotChunks is how many contiguous chunks a transmit slot has: one,
	// or with MultiBuffer enough for MaxTxFrame.
	TxSlotChunks uint32
	// MaxRxSegment is the largest frame (or segment of a multi-buffer
	// frame) the kernel can write into one chunk.
	MaxRxSegment int
}

// Stats are the kernel's XDP_STATISTICS plus our own counters.
type Stats struct {
	RxDropped        uint64 // dropped by the kernel for other reasons
	RxInvalidDescs   uint64
	TxInvalidDescs   uint64
	RxRingFull       uint64 // dropped because our RX ring was full
	RxFillRingEmpty  uint64 // the kernel found no frame on FILL
	TxRingEmptyDescs uint64

	RxDescs         uint64 // descriptors taken from RX
	TxDescs         uint64 // descriptors posted on TX
	TxCompleted     uint64 // descriptors returned on COMPLETION
	Kicks           uint64 // sendto wakeups issued
	KicksSuppressed uint64 // wakeups skipped because need_wakeup was clear
	Polls           uint64 // poll syscalls in Wait
	TxNoFrame       uint64 // Lend calls that found fewer free transmit slots than asked for
}

// Socket is one AF_XDP socket with its UMEM and rings.
type Socket struct {
	fd   int
	cfg  Config
	info Info
	umem []byte

	fill, comp addrRing
	rx, tx     descRing

	txSlots txPool // the transmit half of the UMEM, lent in slots (tx.go)
	pfd     []unix.PollFd
	ts      unix.Timespec // Wait's timeout, kept here so Ppoll does not allocate
	stats   Stats
	closed  bool
}

func pow2(v uint32) bool { return v != 0 && v&(v-1) == 0 }

// Open creates, maps and binds a socket (needs CAP_NET_RAW; binding to a
// queue without an XDP program attached succeeds but receives nothing).
func Open(cfg Config) (s *Socket, err error) {
	if cfg.FrameSize == 0 {
		cfg.FrameSize = 4096
	}
	if cfg.NumFrames == 0 {
		cfg.NumFrames = 4096
	}
	if cfg.MaxFrame == 0 {
		cfg.MaxFrame = 9018
	}
	if cfg.FrameSize != 2048 && cfg.FrameSize != 4096 {
		return nil, fmt.Errorf("xsk: frame size %d: must be 2048 or 4096", cfg.FrameSize)
	}
	if !pow2(cfg.NumFrames) || cfg.NumFrames < 8 || cfg.NumFrames > 1<<18 {
		return nil, fmt.Errorf("xsk: %d frames: must be a power of two from 8 to 262144", cfg.NumFrames)
	}
	if cfg.Headroom > cfg.FrameSize-unix.XDP_PACKET_HEADROOM-128 {
		return nil, fmt.Errorf("xsk: headroom %d leaves no room in a %d-byte frame", cfg.Headroom, cfg.FrameSize)
	}
	half := cfg.NumFrames / 2
	rxBufs := half
	if cfg.RxBuffers != 0 {
		if !pow2(cfg.RxBuffers) || cfg.RxBuffers < 8 || cfg.RxBuffers > MaxRxBuffers {
			return nil, fmt.Errorf("xsk: %d receive buffers: must be a power of two from 8 to %d", cfg.RxBuffers, MaxRxBuffers)
		}
		rxBufs = cfg.RxBuffers
	}
	if cfg.RxChunks == 0 {
		cfg.RxChunks = 1
	}
	if cfg.RxChunks > 8 {
		return nil, fmt.Errorf("xsk: receive buffers of %d chunks, at most 8", cfg.RxChunks)
	}
	rxChunks := rxBufs * cfg.RxChunks // the receive pool, then half for transmit
	fd, err := unix.Socket(unix.AF_XDP, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("xsk: socket: %w", err)
	}
	s = &Socket{fd: fd, cfg: cfg, pfd: []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}}
	defer func() {
		if err != nil {
			err = errors.Join(err, s.Close())
			s = nil
		}
	}()

	s.umem, err = unix.Mmap(-1, 0, int(uint64(rxChunks+half)*uint64(cfg.FrameSize)), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
	if err != nil {
		return s, fmt.Errorf("xsk: mmap UMEM: %w", err)
	}
	reg := unix.XDPUmemReg{
		Addr:     addrOf(s.umem),
		Len:      uint64(len(s.umem)),
		Size:     cfg.FrameSize,
		Headroom: cfg.Headroom,
	}
	if err := setsockopt(fd, unix.SOL_XDP, unix.XDP_UMEM_REG, &reg); err != nil {
		return s, fmt.Errorf("xsk: XDP_UMEM_REG: %w", err)
	}
	ringSize := half // TX and COMPLETION; FILL and RX hold every receive buffer
	for _, r := range []struct {
		opt  int
		size uint32
	}{{unix.XDP_UMEM_FILL_RING, rxBufs}, {unix.XDP_UMEM_COMPLETION_RING, ringSize}, {unix.XDP_RX_RING, rxBufs}, {unix.XDP_TX_RING, ringSize}} {
		if err := setsockopt(fd, unix.SOL_XDP, r.opt, &r.size); err != nil {
			return s, fmt.Errorf("xsk: ring size option %d: %w", r.opt, err)
		}
	}
	var off unix.XDPMmapOffsets
	if err := getsockopt(fd, unix.SOL_XDP, unix.XDP_MMAP_OFFSETS, &off); err != nil {
		return s, fmt.Errorf("xsk: XDP_MMAP_OFFSETS: %w", err)
	}
	mapRing := func(o unix.XDPRingOffset, pgoff int64, size uint32, entry uint64) ([]byte, error) {
		return unix.Mmap(fd, pgoff, int(o.Desc+uint64(size)*entry), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	}
	var m []byte
	if m, err = mapRing(off.Fr, unix.XDP_UMEM_PGOFF_FILL_RING, rxBufs, 8); err != nil {
		return s, fmt.Errorf("xsk: mmap FILL: %w", err)
	}
	s.fill.init(m, off.Fr, rxBufs, true)
	if m, err = mapRing(off.Cr, unix.XDP_UMEM_PGOFF_COMPLETION_RING, ringSize, 8); err != nil {
		return s, fmt.Errorf("xsk: mmap COMPLETION: %w", err)
	}
	s.comp.init(m, off.Cr, ringSize, false)
	if m, err = mapRing(off.Rx, unix.XDP_PGOFF_RX_RING, rxBufs, 16); err != nil {
		return s, fmt.Errorf("xsk: mmap RX: %w", err)
	}
	s.rx.init(m, off.Rx, rxBufs, false)
	if m, err = mapRing(off.Tx, unix.XDP_PGOFF_TX_RING, ringSize, 16); err != nil {
		return s, fmt.Errorf("xsk: mmap TX: %w", err)
	}
	s.tx.init(m, off.Tx, ringSize, true)

	// Chunks [0, rxChunks) are the receive pool, rxBufs buffers of
	// RxChunks whose first chunk feeds FILL; the half after them are the
	// TX pool. The FILL ring must be populated before bind: some drivers
	// assume it.
	for i := uint32(0); i < rxBufs; i++ {
		s.fill.addrs[(s.fill.cachedProducer+i)&s.fill.mask] = uint64(i) * uint64(cfg.RxChunks) * uint64(cfg.FrameSize)
	}
	s.fill.cachedProducer += rxBufs
	s.fill.producer.Store(s.fill.cachedProducer)
	if err := s.txSlots.init(&s.cfg, rxChunks, half); err != nil {
		return s, err
	}

	var flags uint16
	switch cfg.Mode {
	case ModeCopy:
		flags |= unix.XDP_COPY
	case ModeZeroCopy:
		flags |= unix.XDP_ZEROCOPY
	default:
		// ModeAuto: no flag, the kernel tries zero-copy, then copy.
	}
	if !cfg.NoNeedWakeup {
		flags |= unix.XDP_USE_NEED_WAKEUP
	}
	if cfg.MultiBuffer {
		flags |= unix.XDP_USE_SG
	}
	sa := &unix.SockaddrXDP{Flags: flags, Ifindex: uint32(cfg.IfIndex), QueueID: uint32(cfg.Queue)}
	// A socket closed on this queue a moment ago releases the queue from a
	// kernel work item: bind says EBUSY until then, for longer on a loaded
	// host (a tool run right after another on the same interface). Retry,
	// bounded at 3 s (a queue held by a live socket stays busy and the
	// error is reported). This is the one place that waits for it.
	for try := 0; ; try++ {
		err = unix.Bind(fd, sa)
		if !errors.Is(err, unix.EBUSY) || try == 300 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		return s, fmt.Errorf("xsk: bind ifindex %d queue %d (flags %#x): %w", cfg.IfIndex, cfg.Queue, flags, err)
	}
	if cfg.BusyPoll > 0 {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_BUSY_POLL, int(cfg.BusyPoll/time.Microsecond)); err != nil {
			return s, fmt.Errorf("xsk: SO_BUSY_POLL: %w", err)
		}
		if cfg.PreferBusyPoll {
			if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PREFER_BUSY_POLL, 1); err != nil {
				return s, fmt.Errorf("xsk: SO_PREFER_BUSY_POLL: %w", err)
			}
		}
		if cfg.BusyPollBudget > 0 {
			if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_BUSY_POLL_BUDGET, cfg.BusyPollBudget); err != nil {
				return s, fmt.Errorf("xsk: SO_BUSY_POLL_BUDGET: %w", err)
			}
		}
	}
	var opts uint32
	if err := getsockopt(fd, unix.SOL_XDP, unix.XDP_OPTIONS, &opts); err != nil {
		return s, fmt.Errorf("xsk: XDP_OPTIONS: %w", err)
	}
	// Copy mode sends at most a budget of frames per sendto; a larger
	// budget (kernel 6.17+) means fewer syscalls. Older kernels refuse the
	// option, which only costs kicks.
	budget := uint32(ringSize)
	_ = setsockopt(fd, unix.SOL_XDP, unix.XDP_MAX_TX_SKB_BUDGET, &budget)

	s.info = Info{
		ZeroCopy:     opts&unix.XDP_OPTIONS_ZEROCOPY != 0,
		NeedWakeup:   !cfg.NoNeedWakeup,
		MultiBuffer:  cfg.MultiBuffer,
		FrameSize:    cfg.FrameSize,
		Headroom:     cfg.Headroom,
		RxFrames:     rxChunks,
		RxBuffers:    rxBufs,
		TxFrames:     half,
		TxSlots:      uint32(len(s.txSlots.state)),
		TxSlotChunks: uint32(s.txSlots.chunks),
		MaxRxSegment: int(cfg.FrameSize - cfg.Headroom - unix.XDP_PACKET_HEADROOM),
	}
	return s, nil
}

// FD is the socket's descriptor, to register in the XSKMAP.
func (s *Socket) FD() int { return s.fd }

// Info reports the mode obtained and the geometry.
func (s *Socket) Info() Info { return s.info }

// Receive takes up to len(descs) descriptors from the RX ring into descs and
// returns how many. The frames they point to belong to the caller until it
// gives them back with Fill. A descriptor with XDP_PKT_CONTD in Options is
// followed by the next segment of the same frame (multi-buffer only).
func (s *Socket) Receive(descs []unix.XDPDesc) int {
	if s.closed {
		return 0
	}
	n := s.rx.available(uint32(len(descs)))
	if n > uint32(len(descs)) {
		n = uint32(len(descs))
	}
	if n == 0 {
		return 0
	}
	c := s.rx.cachedConsumer
	for i := uint32(0); i < n; i++ {
		descs[i] = s.rx.descs[(c+i)&s.rx.mask]
	}
	s.rx.cachedConsumer = c + n
	s.rx.consumer.Store(s.rx.cachedConsumer)
	s.stats.RxDescs += uint64(n)
	return int(n)
}

// Frame returns the bytes of a received descriptor: a view into the UMEM,
// valid until the frame is given back with Fill.
func (s *Socket) Frame(d unix.XDPDesc) []byte {
	// The kernel only writes in-bounds descriptors; the check keeps a
	// corrupted ring from turning into a wild slice.
	if size := uint64(len(s.umem)); d.Addr > size || uint64(d.Len) > size-d.Addr {
		return nil
	}
	return s.umem[d.Addr : d.Addr+uint64(d.Len) : d.Addr+uint64(d.Len)]
}

// RxSpan returns the data of a received descriptor, as Frame does, with
// the capacity of the rest of its receive buffer (Config.RxChunks chunks),
// which is the reader's to write until the frame goes back with Fill; nil
// for a descriptor outside the receive pool.
func (s *Socket) RxSpan(d unix.XDPDesc) []byte {
	buf := uint64(s.cfg.RxChunks) * uint64(s.cfg.FrameSize)
	rx := uint64(s.info.RxFrames) * uint64(s.cfg.FrameSize)
	if buf == 0 || d.Addr >= rx {
		return nil
	}
	end := (d.Addr/buf + 1) * buf
	if end > rx || uint64(d.Len) > end-d.Addr {
		return nil
	}
	return s.umem[d.Addr : d.Addr+uint64(d.Len) : end]
}

// Fill gives received frames back to the kernel through the FILL ring. The
// FILL ring is as large as the receive pool, so it always has room.
func (s *Socket) Fill(descs []unix.XDPDesc) {
	if s.closed || len(descs) == 0 {
		return
	}
	n := uint32(len(descs))
	if free := s.fill.free(n); free < n {
		// Cannot happen while frames are only ever given back once; refuse
		// rather than overwrite entries the kernel has not read.
		n = free
	}
	p := s.fill.cachedProducer
	mask := ^uint64(s.cfg.FrameSize - 1)
	for i := uint32(0); i < n; i++ {
		s.fill.addrs[(p+i)&s.fill.mask] = descs[i].Addr & mask
	}
	s.fill.cachedProducer = p + n
	s.fill.producer.Store(s.fill.cachedProducer)
	if s.info.NeedWakeup && s.fill.needWakeup() {
		// The driver ran dry and sleeps until told the FILL ring has
		// frames again: recvfrom is the cheapest wakeup. Its result tells
		// nothing: the kernel reads the FILL ring whatever it returns.
		_, _, _ = unix.Syscall6(unix.SYS_RECVFROM, uintptr(s.fd), 0, 0, unix.MSG_DONTWAIT, 0, 0)
	}
}

// RxLevel reads how the receive buffers stand: fill of them wait on the
// FILL ring for the kernel to receive into, queued hold frames the kernel
// received and the reader has not taken from the RX ring yet, out of
// buffers (Info.RxBuffers). A FILL ring that runs dry is where an AF_XDP
// socket drops frames; an RX ring that backs up is a reader falling behind.
// Two loads of indexes shared with the kernel.
func (s *Socket) RxLevel() (fill, queued, buffers int) {
	if s.closed {
		return 0, 0, 0
	}
	fill = int(s.fill.cachedProducer - s.fill.consumer.Load())
	queued = int(s.rx.producer.Load() - s.rx.cachedConsumer)
	return fill, queued, int(s.info.RxBuffers)
}

// SetWakeFD makes Wait also return when fd (an eventfd, say) is readable:
// the owner of the socket wakes its sleeping reader through it. -1 removes
// it.
func (s *Socket) SetWakeFD(fd int) {
	s.pfd = s.pfd[:1]
	if fd >= 0 {
		s.pfd = append(s.pfd, unix.PollFd{Fd: int32(fd), Events: unix.POLLIN})
	}
}

// Wait blocks until the RX ring has descriptors, timeout passes or the wake
// descriptor (SetWakeFD) is readable; it returns at once when descriptors
// are already there.
func (s *Socket) Wait(timeout time.Duration) (bool, error) {
	if s.closed {
		return false, ErrClosed
	}
	if s.rx.available(1) > 0 {
		return true, nil
	}
	if timeout <= 0 {
		return false, nil
	}
	// ppoll keeps sub-millisecond timeouts (an engine idling for 50 µs must
	// not sleep a whole millisecond); the timespec lives in the Socket so
	// that the call does not allocate.
	s.ts = unix.NsecToTimespec(int64(timeout))
	s.stats.Polls++
	n, err := unix.Ppoll(s.pfd, &s.ts, nil)
	if err != nil && err != unix.EINTR {
		return false, fmt.Errorf("xsk: poll: %w", err)
	}
	return n > 0 && s.rx.available(1) > 0, nil
}

// Kick wakes the kernel to send what the TX ring holds, if it needs waking.
// Busy conditions (EAGAIN, EBUSY, ENOBUFS) are not errors: the frames stay on
// the ring and the next Kick sends them.
func (s *Socket) Kick() error {
	if s.closed {
		return ErrClosed
	}
	if s.tx.cachedProducer == s.tx.consumer.Load() {
		return nil
	}
	if s.info.NeedWakeup && !s.tx.needWakeup() {
		s.stats.KicksSuppressed++
		return nil
	}
	// Copy mode sends a budget of frames per call and says EAGAIN while more
	// remain: go round while each call makes progress, bounded by the ring.
	for i := uint32(0); i <= s.tx.size; i++ {
		before := s.tx.consumer.Load()
		s.stats.Kicks++
		_, _, e := unix.Syscall6(unix.SYS_SENDTO, uintptr(s.fd), 0, 0, unix.MSG_DONTWAIT, 0, 0)
		switch e {
		case 0:
			return nil
		case unix.EAGAIN:
			after := s.tx.consumer.Load()
			if after == s.tx.cachedProducer || after == before {
				return nil
			}
		case unix.EBUSY, unix.ENOBUFS, unix.EINTR:
			return nil
		default:
			return fmt.Errorf("xsk: sendto: %w", e)
		}
	}
	return nil
}

// Stats reads XDP_STATISTICS and returns it with our counters.
func (s *Socket) Stats() (Stats, error) {
	if s.closed {
		return s.stats, ErrClosed
	}
	var k unix.XDPStatistics
	if err := getsockopt(s.fd, unix.SOL_XDP, unix.XDP_STATISTICS, &k); err != nil {
		return s.stats, fmt.Errorf("xsk: XDP_STATISTICS: %w", err)
	}
	st := s.stats
	st.RxDropped = k.Rx_dropped
	st.RxInvalidDescs = k.Rx_invalid_descs
	st.TxInvalidDescs = k.Tx_invalid_descs
	st.RxRingFull = k.Rx_ring_full
	st.RxFillRingEmpty = k.Rx_fill_ring_empty_descs
	st.TxRingEmptyDescs = k.Tx_ring_empty_descs
	return st, nil
}

// Close unbinds the socket and releases the rings and the UMEM.
func (s *Socket) Close() error {
	if s.closed {
		return nil
	}
	s.closed = true
	err := unix.Close(s.fd)
	for _, m := range [][]byte{s.fill.mem, s.comp.mem, s.rx.mem, s.tx.mem, s.umem} {
		if m != nil {
			if e := unix.Munmap(m); e != nil && err == nil {
				err = e
			}
		}
	}
	s.fill, s.comp, s.rx, s.tx = addrRing{}, addrRing{}, descRing{}, descRing{}
	s.umem = nil
	return err
}

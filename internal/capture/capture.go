package capture

import (
	"bufio"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"

	"github.com/softrnic/softrnic/frame"
)

// Direction is which way a frame crossed the port.
type Direction uint8

// Directions.
const (
	In  Direction = iota + 1 // received
	Out                      // sent
)

// Format is the file format.
type Format uint8

// Formats.
const (
	// PCAP is classic libpcap with nanosecond timestamps: every tool reads
	// it, but it cannot say which way a frame went.
	PCAP Format = iota
	// PCAPNG records each frame's direction (EPB flags), which Wireshark
	// shows and filters on (frame.packet_flags_direction).
	PCAPNG
)

// Options configure a capture.
type Options struct {
	Format Format
	// Count stops the capture after this many frames are written; 0 = until
	// Stop.
	Count int
	// QPN, when FilterQP is set, keeps only the frames of that QP: frames
	// the engine attributes to it, and frames whose BTH names it as the
	// destination QP.
	QPN      uint32
	FilterQP bool
	// SnapLen is the most bytes kept per frame (default 9216: whole
	// frames up to a jumbo MTU, so every RoCE frame, path MTU 4096
	// included, is kept whole and its ICRC stays checkable).
	SnapLen int
	// QueueFrames is the queue between the data path and the writer
	// (default 1024; rounded up to a power of two). The queue holds
	// QueueFrames × SnapLen bytes, allocated and touched by Start.
	QueueFrames int
}

// DefaultSnapLen keeps whole frames up to a 9000-byte MTU.
const DefaultSnapLen = 9216

// Stats count what a capture did.
type Stats struct {
	Written uint64 // frames in the file
	Dropped uint64 // frames lost because the writer fell behind
}

// ErrBusy is returned by Start while another capture runs.
var ErrBusy = errors.New("capture: a capture is already running")

// Tap is where the engine offers frames. The zero Tap is ready and idle.
type Tap struct {
	cur atomic.Pointer[Session]
}

// Session returns the running capture, or nil: the data path's only cost
// when no capture runs. Call it once per batch.
func (t *Tap) Session() *Session { return t.cur.Load() }

// Start begins a capture written to w, which Stop (or reaching Count)
// flushes but does not close. Only one capture runs at a time.
func (t *Tap) Start(w io.Writer, opt Options) (*Session, error) {
	if opt.SnapLen <= 0 || opt.SnapLen > 65535 {
		opt.SnapLen = DefaultSnapLen
	}
	if opt.QueueFrames <= 0 {
		opt.QueueFrames = 1024
	}
	if t.cur.Load() != nil {
		return nil, ErrBusy // before writing a file header into w
	}
	n := 1
	for n < opt.QueueFrames {
		n <<= 1
	}
	s := &Session{tap: t, opt: opt, done: make(chan struct{}), wake: make(chan struct{}, 1)}
	s.q.init(n, opt.SnapLen)
	bw := bufio.NewWriterSize(w, 1<<16)
	s.bw = bw
	switch opt.Format {
	case PCAPNG:
		ng, err := pcapgo.NewNgWriterInterface(bw, pcapgo.NgInterface{Name: "softrnic", LinkType: layers.LinkTypeEthernet, SnapLength: uint32(opt.SnapLen), TimestampResolution: 9}, pcapgo.DefaultNgWriterOptions)
		if err != nil {
			return nil, err
		}
		s.ng = ng
	default:
		pw := pcapgo.NewWriterNanos(bw)
		if err := pw.WriteFileHeader(uint32(opt.SnapLen), layers.LinkTypeEthernet); err != nil {
			return nil, err
		}
		s.pw = pw
	}
	if !t.cur.CompareAndSwap(nil, s) {
		return nil, ErrBusy
	}
	go s.run()
	return s, nil
}

// Session is one running capture.
type Session struct {
	tap     *Tap
	opt     Options
	q       queue
	bw      *bufio.Writer
	pw      *pcapgo.Writer
	ng      *pcapgo.NgWriter
	stopped atomic.Bool
	sleepy  atomic.Bool
	wake    chan struct{}
	done    chan struct{}
	written atomic.Uint64
	dropped atomic.Uint64
	errMu   sync.Mutex
	err     error
}

// Frames offers a batch of frames that went one way. The frames are copied
// before Frames returns. Safe for concurrent use by several engine loops.
func (s *Session) Frames(dir Direction, frames [][]byte) {
	now := time.Now().UnixNano() // one clock read per batch, only while capturing
	for _, f := range frames {
		s.offer(dir, 0, f, now)
	}
}

// Frame offers one frame the engine attributes to local QP qpn (0 if it
// does not know), for captures filtered by QP.
func (s *Session) Frame(dir Direction, qpn uint32, f []byte) {
	s.offer(dir, qpn, f, time.Now().UnixNano())
}

func (s *Session) offer(dir Direction, qpn uint32, f []byte, ts int64) {
	if s.stopped.Load() {
		return
	}
	if s.opt.FilterQP && qpn != s.opt.QPN && !destQPIs(f, s.opt.QPN) {
		return
	}
	if !s.q.put(dir, f, ts) {
		s.dropped.Add(1)
		return
	}
	if s.sleepy.Load() {
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}

// destQPIs reports whether f is a RoCEv2 frame whose BTH names qpn.
func destQPIs(f []byte, qpn uint32) bool {
	var fr frame.Frame
	if frame.Parse(f, &fr) != nil {
		return false
	}
	return fr.BTH().DestQP() == qpn
}

// run is the writer goroutine.
func (s *Session) run() {
	defer close(s.done)
	var flags pcapgo.NgEpbFlags
	opts := pcapgo.NgPacketOptions{Flags: &flags}
	idle := time.NewTimer(time.Hour)
	defer idle.Stop()
	for {
		n := 0
		for {
			e := s.q.peek()
			if e == nil {
				break
			}
			if s.opt.Count == 0 || s.written.Load() < uint64(s.opt.Count) {
				ci := gopacket.CaptureInfo{Timestamp: time.Unix(0, e.ts), CaptureLength: e.n, Length: e.orig}
				var err error
				if s.ng != nil {
					flags.Direction = pcapgo.NgEpbFlagDirectionInbound
					if e.dir == Out {
						flags.Direction = pcapgo.NgEpbFlagDirectionOutbound
					}
					err = s.ng.WritePacketWithOptions(ci, e.buf[:e.n], opts)
				} else {
					err = s.pw.WritePacket(ci, e.buf[:e.n])
				}
				if err != nil {
					s.fail(err)
				} else {
					s.written.Add(1)
				}
			}
			s.q.release()
			n++
		}
		if s.opt.Count > 0 && s.written.Load() >= uint64(s.opt.Count) {
			s.stopped.Store(true)
		}
		if s.stopped.Load() && s.q.peek() == nil {
			s.tap.cur.CompareAndSwap(s, nil)
			s.flush()
			return
		}
		if n == 0 {
			s.flush()
			s.sleepy.Store(true)
			if s.q.peek() == nil && !s.stopped.Load() {
				idle.Reset(100 * time.Millisecond)
				select {
				case <-s.wake:
				case <-idle.C:
				}
			}
			s.sleepy.Store(false)
		}
	}
}

func (s *Session) flush() {
	var err error
	if s.ng != nil {
		err = s.ng.Flush()
	}
	if err == nil {
		err = s.bw.Flush()
	}
	if err != nil {
		s.fail(err)
	}
}

func (s *Session) fail(err error) {
	s.errMu.Lock()
	if s.err == nil {
		s.err = err
	}
	s.errMu.Unlock()
	s.stopped.Store(true)
}

// Done is closed when the capture has ended and the file is flushed.
func (s *Session) Done() <-chan struct{} { return s.done }

// Stop ends the capture: the tap goes idle at once, frames already queued
// are written, the file is flushed. It returns the first write error.
func (s *Session) Stop() (Stats, error) {
	s.stopped.Store(true)
	s.tap.cur.CompareAndSwap(s, nil)
	select {
	case s.wake <- struct{}{}:
	default:
	}
	<-s.done
	return s.Stats(), s.Err()
}

// Stats returns the counts so far.
func (s *Session) Stats() Stats {
	return Stats{Written: s.written.Load(), Dropped: s.dropped.Load()}
}

// Err returns the first write error, if any.
func (s *Session) Err() error {
	s.errMu.Lock()
	defer s.errMu.Unlock()
	return s.err
}

// queue is a bounded multi-producer single-consumer queue of frame copies
// (Vyukov's sequence-numbered slots): producers claim a slot with one CAS
// and publish it with one store; nothing allocates.
type queue struct {
	slots []entry
	mask  uint64
	head  atomic.Uint64 // next slot producers claim
	_     [56]byte
	tail  uint64 // next slot the consumer reads (consumer only)
}

type entry struct {
	seq  atomic.Uint64
	dir  Direction
	n    int
	orig int
	ts   int64
	buf  []byte
}

func (q *queue) init(n, snap int) {
	q.slots = make([]entry, n)
	q.mask = uint64(n - 1)
	backing := make([]byte, n*snap)
	// Fault the pages in now, so that the data path's first copies into
	// them do not.
	for i := 0; i < len(backing); i += 4096 {
		backing[i] = 1
	}
	for i := range q.slots {
		q.slots[i].seq.Store(uint64(i))
		q.slots[i].buf = backing[i*snap : (i+1)*snap : (i+1)*snap]
	}
}

func (q *queue) put(dir Direction, f []byte, ts int64) bool {
	pos := q.head.Load()
	for {
		e := &q.slots[pos&q.mask]
		seq := e.seq.Load()
		switch d := int64(seq - pos); {
		case d == 0:
			if q.head.CompareAndSwap(pos, pos+1) {
				e.dir, e.ts, e.orig = dir, ts, len(f)
				e.n = copy(e.buf, f)
				e.seq.Store(pos + 1)
				return true
			}
			pos = q.head.Load()
		case d < 0:
			return false // full
		default:
			pos = q.head.Load()
		}
	}
}

func (q *queue) peek() *entry {
	e := &q.slots[q.tail&q.mask]
	if e.seq.Load() != q.tail+1 {
		return nil
	}
	return e
}

func (q *queue) release() {
	e := &q.slots[q.tail&q.mask]
	e.seq.Store(q.tail + q.mask + 1)
	q.tail++
}

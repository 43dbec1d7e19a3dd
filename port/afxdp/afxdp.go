package afxdp

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/softrnic/softrnic/bpf"
	"github.com/softrnic/softrnic/port"
	"github.com/softrnic/softrnic/xsk"
	"golang.org/x/sys/unix"
)

// Config describes an AF_XDP port.
type Config struct {
	// IfIndex is the interface; it must be visible in the calling thread's
	// network namespace.
	IfIndex int
	// Queue is the receive queue the port serves; a multi-queue NIC needs a
	// port per queue sharing one Program.
	Queue int
	// Program is the attached steering program. Nil: the port loads one,
	// attaches it to IfIndex and detaches it on Close.
	Program *bpf.Program
	// LocalAddrs, when the port loads the program itself and the list is not
	// empty, restricts steering to RoCEv2 addressed to these addresses (the
	// rest, e.g. RoCEv2 this host routes, stays with the kernel).
	LocalAddrs []netip.Addr
	// XDPMode, when the port attaches the program: bpf.DriverMode or
	// bpf.GenericMode, or zero for driver mode with a generic fallback.
	XDPMode bpf.AttachMode
	// FrameSize, NumFrames, RxBuffers, Headroom, Mode and the busy-poll settings are
	// passed to xsk.Config.
	FrameSize      uint32
	NumFrames      uint32
	RxBuffers      uint32
	Headroom       uint32
	Mode           xsk.Mode
	BusyPoll       time.Duration
	PreferBusyPoll bool
	BusyPollBudget int
	// NoMultiBuffer refuses XDP multi-buffer: Open then fails when the
	// interface's MTU does not fit one chunk.
	NoMultiBuffer bool
}

// Stats is what the daemon publishes for an AF_XDP port.
type Stats struct {
	AttachMode bpf.AttachMode // driver or generic XDP
	ZeroCopy   bool           // zero-copy or copy AF_XDP
	Multi      bool           // multi-buffer in use
	Socket     xsk.Stats
	Program    bpf.Counters // summed over CPUs; shared by all queues of the interface
	Oversize   uint64       // received multi-buffer frames dropped: over MaxFrame or too many segments
	// Copied counts multi-buffer frames put together in a buffer of the
	// port's own (a whole copy) rather than behind their first segment.
	Copied uint64
}

// Port is an AF_XDP port.port.Port.
type Port struct {
	sock     *xsk.Socket
	prog     *bpf.Program
	ownsProg bool
	queue    int
	maxFrame int

	descs []unix.XDPDesc // Receive scratch
	held  []unix.XDPDesc // frames lent to the caller until the next Recv

	// Multi-buffer reassembly: part collects the segments of the frame in
	// progress (it may span Recv calls): in the receive buffer of its
	// first segment, which spans enough chunks for a whole frame (partUMEM),
	// or else in a buffer of the port's own; lent holds the port's buffers
	// handed out by the current Recv; spare holds them free for reuse.
	part     []byte
	partSegs int
	partBad  bool
	partUMEM bool
	lent     [][]byte
	spare    [][]byte
	oversize uint64
	copied   uint64
	wake     *port.Wakeup // Waker: polled beside the socket
	closed   bool
}

var (
	_ port.Port    = (*Port)(nil)
	_ port.Waker   = (*Port)(nil)
	_ port.RxGauge = (*Port)(nil)
)

// l2Overhead is Ethernet plus one VLAN tag: what a frame adds to the MTU.
const l2Overhead = 14 + 4

// Open creates the socket, attaches (or reuses) the steering program and
// registers the socket for its queue.
func Open(cfg Config) (p *Port, err error) {
	ifc, err := net.InterfaceByIndex(cfg.IfIndex)
	if err != nil {
		return nil, fmt.Errorf("afxdp: interface %d: %w", cfg.IfIndex, err)
	}
	fs := cfg.FrameSize
	if fs == 0 {
		fs = 4096
	}
	oneChunk := int(fs) - int(cfg.Headroom) - unix.XDP_PACKET_HEADROOM
	need := ifc.MTU + l2Overhead
	multi := need > oneChunk
	// A multi-buffer frame is put together in the receive buffer of its
	// first segment: buffers span the chunks a whole frame needs behind
	// the kernel's headroom, so only the later segments are copied.
	rxChunks := uint32(1)
	if multi {
		rxChunks = uint32((need + int(cfg.Headroom) + unix.XDP_PACKET_HEADROOM + int(fs) - 1) / int(fs))
	}
	if multi && cfg.NoMultiBuffer {
		return nil, fmt.Errorf("afxdp: %s has MTU %d (frames up to %d bytes) but one %d-byte UMEM frame receives at most %d bytes; lower the MTU to %d or allow multi-buffer",
			ifc.Name, ifc.MTU, need, fs, oneChunk, oneChunk-l2Overhead)
	}
	p = &Port{queue: cfg.Queue, prog: cfg.Program}
	defer func() {
		if err != nil {
			err = errors.Join(err, p.Close())
			p = nil
		}
	}()
	if p.prog == nil {
		if p.prog, err = bpf.Load(bpf.Options{Queues: max(cfg.Queue+1, 1), FilterLocal: len(cfg.LocalAddrs) > 0}); err != nil {
			return p, fmt.Errorf("afxdp: %w", err)
		}
		p.ownsProg = true
		for _, a := range cfg.LocalAddrs {
			if err = p.prog.AddLocal(a); err != nil {
				return p, fmt.Errorf("afxdp: local address %v: %w", a, err)
			}
		}
		if _, err = p.prog.AttachWith(cfg.IfIndex, cfg.XDPMode); err != nil {
			return p, fmt.Errorf("afxdp: %w", err)
		}
	}
	p.sock, err = xsk.Open(xsk.Config{
		IfIndex: cfg.IfIndex, Queue: cfg.Queue,
		FrameSize: fs, NumFrames: cfg.NumFrames, RxBuffers: cfg.RxBuffers, Headroom: cfg.Headroom, RxChunks: rxChunks,
		Mode: cfg.Mode, MultiBuffer: multi, MaxFrame: need,
		BusyPoll: cfg.BusyPoll, PreferBusyPoll: cfg.PreferBusyPoll, BusyPollBudget: cfg.BusyPollBudget,
	})
	if err != nil {
		return p, fmt.Errorf("afxdp: %w", err)
	}
	// The interface's MTU (plus Ethernet and a VLAN tag) bounds the frames,
	// whether or not they fit one chunk.
	p.maxFrame = need
	if p.sock.MaxTxFrame() < need {
		return p, fmt.Errorf("afxdp: %d-byte transmit slots cannot hold %d-byte frames", p.sock.MaxTxFrame(), need)
	}
	if err = p.prog.Register(cfg.Queue, p.sock.FD()); err != nil {
		return p, fmt.Errorf("afxdp: %w", err)
	}
	if p.wake, err = port.NewWakeup(); err != nil {
		return p, fmt.Errorf("afxdp: %w", err)
	}
	p.sock.SetWakeFD(p.wake.FD())
	p.descs = make([]unix.XDPDesc, port.BatchSize)
	p.held = make([]unix.XDPDesc, 0, port.BatchSize)
	return p, nil
}

// Wake implements port.Waker.
func (p *Port) Wake() error { return p.wake.Wake() }

// Recv implements port.Port. Frames from the previous Recv go back to the
// kernel first: that is what makes their views invalid.
func (p *Port) Recv(frames [][]byte, timeout time.Duration) (int, error) {
	if p.closed {
		return 0, port.ErrClosed
	}
	p.sock.Fill(p.held)
	p.held = p.held[:0]
	p.spare = append(p.spare, p.lent...)
	clear(p.lent)
	p.lent = p.lent[:0]
	if len(frames) == 0 {
		return 0, nil
	}
	if cap(p.descs) < len(frames) {
		p.descs = make([]unix.XDPDesc, len(frames))
		p.held = make([]unix.XDPDesc, 0, len(frames))
	}
	if ok, err := p.sock.Wait(timeout); err != nil || !ok {
		if timeout > 0 {
			p.wake.Drain() // woken, or timed out: a wake-up is used up either way
		}
		return 0, err
	}
	n := 0
	// Each descriptor yields at most one frame, so taking len(frames)-n
	// never overflows frames; a multi-buffer frame may need several passes.
	// Bounded: each pass takes at least one descriptor or stops.
	for pass := 0; pass <= maxSegs && n < len(frames); pass++ {
		got := p.sock.Receive(p.descs[:len(frames)-n])
		if got == 0 {
			break
		}
		for _, d := range p.descs[:got] {
			p.held = append(p.held, d)
			contd := d.Options&unix.XDP_PKT_CONTD != 0
			if p.part == nil && !contd {
				if f := p.sock.Frame(d); f != nil {
					frames[n] = f
					n++
				}
				continue
			}
			if f, done := p.segment(d, contd); done && f != nil {
				frames[n] = f
				n++
			}
		}
	}
	if p.partUMEM {
		// The frame goes on in the next Recv, after its first segment's
		// buffer has gone back to the kernel: move it to one of ours.
		b := p.spareBuf()
		p.part = append(b, p.part...)
		p.partUMEM = false
		p.copied++
	}
	return n, nil
}

// spareBuf is an empty buffer of the port's own, reused when it can be.
func (p *Port) spareBuf() []byte {
	if k := len(p.spare); k > 0 {
		b := p.spare[k-1][:0]
		p.spare = p.spare[:k-1]
		return b
	}
	return make([]byte, 0, p.maxFrame) // warm-up only: buffers are reused
}

// maxSegs is the most segments one received frame may have (the kernel's
// copy-mode limit is MAX_SKB_FRAGS+1).
const maxSegs = 18

// segment adds one descriptor of a multi-buffer frame to the frame in
// progress; done reports the frame's last segment, f is nil if it was
// dropped.
func (p *Port) segment(d unix.XDPDesc, contd bool) (f []byte, done bool) {
	seg := p.sock.Frame(d)
	if p.part == nil {
		p.partSegs, p.partBad = 1, false
		if b := p.sock.RxSpan(d); b != nil && cap(b) >= p.maxFrame {
			// The first segment stays where the kernel put it; the
			// others are copied in behind it.
			p.part, p.partUMEM = b, true
		} else {
			p.part = append(p.spareBuf(), seg...)
			p.copied++
		}
	} else {
		p.partSegs++
		if p.partBad || p.partSegs > maxSegs || len(p.part)+len(seg) > p.maxFrame {
			p.partBad = true
		} else {
			p.part = append(p.part, seg...) // within the capacity: in place
		}
	}
	if contd {
		return nil, false
	}
	f, umem := p.part, p.partUMEM
	p.part, p.partUMEM = nil, false
	if p.partBad {
		p.oversize++
		if !umem {
			p.spare = append(p.spare, f[:0])
		}
		return nil, true
	}
	if !umem {
		p.lent = append(p.lent, f)
	}
	return f[:len(f):len(f)], true
}

// Lend implements port.Port: the buffers are transmit slots of the UMEM
// (as many contiguous chunks as MaxFrame needs). Short of free slots, it
// wakes the kernel: frames a busy kernel left on the TX ring hold them,
// and nothing else may come to send them.
func (p *Port) Lend(bufs [][]byte) int {
	if p.closed {
		return 0
	}
	n := p.sock.Lend(bufs)
	if n < len(bufs) {
		_ = p.sock.Kick() // a failed wakeup fails the next Submit's too, which reports it
	}
	return n
}

// Submit implements port.Port: the frames go on the TX ring as they are,
// and the kernel is woken if it asked to be.
func (p *Port) Submit(frames [][]byte) (int, error) {
	n, err := p.post(frames)
	if kerr := p.kickTx(); kerr != nil && err == nil {
		err = kerr
	}
	return n, err
}

// MaxFrame implements port.Port: the interface's MTU plus Ethernet and one
// VLAN tag, as for the AF_PACKET port.
func (p *Port) MaxFrame() int { return p.maxFrame }

// RxFrames is how many frames the port holds for its reader before the
// kernel must drop what arrives: the socket's receive buffers, in frames
// of the interface's MTU. With multi-buffer the kernel takes one buffer
// from FILL per segment (only a buffer's first chunk is ever on FILL; the
// chunks behind it are where Recv puts the later segments together), so
// a frame of several segments takes as many buffers.
func (p *Port) RxFrames() int {
	info := p.sock.Info()
	per := 1
	if info.MultiBuffer && info.MaxRxSegment > 0 {
		per = (p.maxFrame + info.MaxRxSegment - 1) / info.MaxRxSegment
	}
	return int(info.RxBuffers) / per
}

// RxLevel implements port.RxGauge: the socket's FILL and RX rings.
func (p *Port) RxLevel() (fill, queued, buffers int) { return p.sock.RxLevel() }

// Socket exposes the underlying socket (for benches and tests).
func (p *Port) Socket() *xsk.Socket { return p.sock }

// Program is the steering program in use.
func (p *Port) Program() *bpf.Program { return p.prog }

// Stats reads the socket's and the program's counters (slow path). Like
// every Port method it belongs to the goroutine that owns the port.
func (p *Port) Stats() (Stats, error) {
	if p.closed {
		return Stats{}, port.ErrClosed
	}
	info := p.sock.Info()
	st := Stats{AttachMode: p.prog.Mode(), ZeroCopy: info.ZeroCopy, Multi: info.MultiBuffer, Oversize: p.oversize, Copied: p.copied}
	var err1, err2 error
	st.Socket, err1 = p.sock.Stats()
	st.Program, err2 = p.prog.Counters()
	return st, errors.Join(err1, err2)
}

// Close unregisters and closes the socket, and detaches the program if the
// port attached it.
func (p *Port) Close() error {
	if p.closed {
		return nil
	}
	p.closed = true
	var errs []error
	if p.prog != nil && p.sock != nil {
		errs = append(errs, p.prog.Unregister(p.queue))
	}
	if p.sock != nil {
		errs = append(errs, p.sock.Close())
	}
	if p.ownsProg && p.prog != nil {
		errs = append(errs, p.prog.Close())
	}
	errs = append(errs, p.wake.Close())
	return errors.Join(errs...)
}

package port

import (
	"errors"
	"time"
)

// Port moves whole Ethernet frames (no FCS) in batches.
//
// A Port is owned by one goroutine (one engine loop per device, whatever the number of queues behind the port): its methods
// are not safe for concurrent use, which is what lets implementations run
// without a lock per packet.
//
// Frames go out from the port's own memory: the caller borrows buffers
// (Lend), builds frames in them and hands them back (Submit), so that a
// frame is written once, where the port sends it from (AF_XDP: the UMEM
// the kernel reads). Send does the same for frames already built in the
// caller's memory, with a copy.
type Port interface {
	// Recv waits at most timeout (0: do not wait) for frames and stores up to
	// len(frames) of them in frames, returning how many. The slices are views
	// into the port's own memory and stay valid only until the next call of
	// Recv on the same Port; a caller that keeps a frame copies it.
	Recv(frames [][]byte, timeout time.Duration) (int, error)

	// Lend stores in bufs up to len(bufs) of the port's transmit buffers,
	// each MaxFrame bytes long, and returns how many: fewer, or none, when
	// the port has no more free now, its transmit queue backed up
	// (back-pressure). A lent buffer is the caller's until Submit takes it
	// back; Recv does not touch it.
	Lend(bufs [][]byte) int

	// Submit queues frames for transmission, in order, and returns how
	// many it took. Each is a buffer Lend lent, resliced from its start to
	// the frame ([:n]); an empty one gives its buffer back unsent. n <
	// len(frames) with a nil error means the network takes no more now
	// (back-pressure): the frames not taken stay lent, to be submitted
	// again, in order, before later ones.
	Submit(frames [][]byte) (n int, err error)

	// MaxFrame is the largest frame, in bytes, the port can send or receive.
	MaxFrame() int

	// Close releases the port's resources. Recv, Lend and Submit fail
	// afterwards.
	Close() error
}

// Send transmits frames held in the caller's memory through p: it borrows
// buffers, copies the frames into them and submits them. It returns how
// many were taken, fewer with a nil error when p pushes back. For tools
// and tests whose frames are built elsewhere; it allocates its scratch (a
// Copier does not). The engine builds its frames in lent buffers instead.
func Send(p Port, frames [][]byte) (int, error) {
	var c Copier
	return c.Send(p, frames)
}

// Copier sends frames held in the caller's memory through a Port, as Send
// does, reusing its scratch from call to call. The zero Copier is ready.
type Copier struct{ bufs [][]byte }

// Send copies frames into buffers p lends and submits them; see Send.
func (c *Copier) Send(p Port, frames [][]byte) (int, error) {
	if cap(c.bufs) < len(frames) {
		c.bufs = make([][]byte, len(frames))
	}
	bufs := c.bufs[:len(frames)]
	n := p.Lend(bufs)
	var err error
	k := 0
	for ; k < n; k++ {
		f := frames[k]
		if len(f) == 0 || len(f) > len(bufs[k]) {
			err = ErrFrameSize
			break
		}
		bufs[k] = bufs[k][:copy(bufs[k], f)]
	}
	for i := k; i < n; i++ {
		bufs[i] = bufs[i][:0]
	}
	sent, serr := p.Submit(bufs[:n])
	if sent < n && serr == nil {
		// Back-pressure: the buffers not taken go back unsent.
		for i := sent; i < n; i++ {
			bufs[i] = bufs[i][:0]
		}
		_, _ = p.Submit(bufs[sent:n]) // empty lent buffers: taken back
	}
	clear(bufs)
	if serr != nil {
		err = serr
	}
	return min(sent, k), err
}

// RxGauge is a port that can tell how its receive buffers stand (AF_XDP:
// its FILL and RX rings), so that the device signals host congestion to
// its senders before the port drops frames for want of buffers.
type RxGauge interface {
	// RxLevel returns the buffers waiting for the network to receive
	// into, the frames received and not yet read, and the buffers in all
	// (0: not known).
	RxLevel() (fill, queued, buffers int)
}

// BatchSize is the batch the engine uses for Recv and Submit. Large enough to
// amortise a syscall or ring update, small enough to stay in L1 cache.
const BatchSize = 64

// ErrClosed is returned by Recv, Lend and Submit after Close.
var ErrClosed = errors.New("port: closed")

// ErrNotLent is returned by Submit for a frame that is not a buffer Lend
// lent (or was submitted already).
var ErrNotLent = errors.New("port: frame is not a lent buffer")

// ErrFrameSize is returned by Send for an empty frame or one longer than
// the port's MaxFrame.
var ErrFrameSize = errors.New("port: frame empty or longer than MaxFrame")

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
type Port interface {
	// Recv waits at most timeout (0: do not wait) for frames and stores up to
	// len(frames) of them in frames, returning how many. The slices are views
	// into the port's own memory and stay valid only until the next call of
	// Recv on the same Port; a caller that keeps a frame copies it.
	Recv(frames [][]byte, timeout time.Duration) (int, error)

	// Send queues frames for transmission and returns how many were taken.
	// The port copies them (or has consumed them) before returning, so the
	// caller may reuse its buffers at once. n < len(frames) with a nil error
	// means the transmit ring is full: back-pressure, to be retried later.
	Send(frames [][]byte) (n int, err error)

	// MaxFrame is the largest frame, in bytes, the port can send or receive.
	MaxFrame() int

	// Close releases the port's resources. Recv and Send fail afterwards.
	Close() error
}

// BatchSize is the batch the engine uses for Recv and Send. Large enough to
// amortise a syscall or ring update, small enough to stay in L1 cache.
const BatchSize = 64

// ErrClosed is returned by Recv and Send after Close.
var ErrClosed = errors.New("port: closed")

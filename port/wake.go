package port

import (
	"errors"
	"fmt"
	"sync"

	"golang.org/x/sys/unix"
)

// Waker is a Port whose waiting Recv another goroutine can cut short: the
// engine sleeps in the port once idle, and work that is not a frame (an
// application's post) wakes it there.
type Waker interface {
	// Wake makes a waiting Recv return at once, or the next Recv to wait
	// if none waits now (with or without frames). Safe from any goroutine.
	Wake() error
}

// Wakeup is the eventfd a port polls beside its sockets to implement
// Waker. Wake may race with Close (a goroutine that found the port still
// installed as the engine's waker): the lock keeps it off a closed, maybe
// reused, descriptor.
type Wakeup struct {
	mu   sync.RWMutex
	fd   int
	one  [8]byte
	sink [8]byte
}

// NewWakeup makes a wakeup (non-blocking, close-on-exec eventfd).
func NewWakeup() (*Wakeup, error) {
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("port: eventfd: %w", err)
	}
	w := &Wakeup{fd: fd}
	w.one[0] = 1 // host-endian counter; amd64 and arm64 are little-endian
	return w, nil
}

// FD is the descriptor to poll for POLLIN.
func (w *Wakeup) FD() int { return w.fd }

// Wake makes the descriptor readable until Drain.
func (w *Wakeup) Wake() error {
	w.mu.RLock()
	defer w.mu.RUnlock()
	if w.fd < 0 {
		return ErrClosed
	}
	_, err := unix.Write(w.fd, w.one[:])
	if errors.Is(err, unix.EAGAIN) { // saturated: readable anyway
		return nil
	}
	return err
}

// Drain makes the descriptor unreadable again (the poller calls it when
// it found it readable).
func (w *Wakeup) Drain() { _, _ = unix.Read(w.fd, w.sink[:]) } // EAGAIN: nothing to drain

// Close closes the eventfd.
func (w *Wakeup) Close() error {
	if w == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.fd < 0 {
		return nil
	}
	err := unix.Close(w.fd)
	w.fd = -1
	return err
}

package shmring

import (
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

// Doorbell wakes a sleeping consumer: an eventfd, written by producers that
// find the ring's wakeup flag set and read by the consumer when it wakes.
// It is non-blocking; Wait uses poll(2) for the timeout.
type Doorbell struct {
	fd   int
	one  [8]byte
	sink [8]byte
	pfd  [1]unix.PollFd
}

// NewDoorbell makes a new eventfd doorbell (close-on-exec, non-blocking).
func NewDoorbell() (*Doorbell, error) {
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("shmring: eventfd: %w", err)
	}
	return DoorbellFD(fd), nil
}

// DoorbellFD wraps an eventfd received from the peer and takes ownership of
// it. Operations on an fd that is not an eventfd fail with an error; they do
// not harm this process.
func DoorbellFD(fd int) *Doorbell {
	d := &Doorbell{fd: fd}
	d.one[0] = 1 // eventfd counters are host-endian; amd64 and arm64 are little-endian
	d.pfd[0] = unix.PollFd{Fd: int32(fd), Events: unix.POLLIN}
	return d
}

// FD is the eventfd, to pass to the peer. It stays owned by the Doorbell.
func (d *Doorbell) FD() int { return d.fd }

// Ring wakes the consumer.
func (d *Doorbell) Ring() error {
	_, err := unix.Write(d.fd, d.one[:])
	if err == unix.EAGAIN { // counter saturated: the consumer has a wakeup pending anyway
		return nil
	}
	return err
}

// Wait blocks until the doorbell rings or timeout passes (negative: forever),
// and resets it. It returns whether it was rung. Spurious returns are allowed:
// callers always recheck their rings.
func (d *Doorbell) Wait(timeout time.Duration) (bool, error) {
	ms := -1
	if timeout >= 0 {
		ms = int((timeout + time.Millisecond - 1) / time.Millisecond)
	}
	for {
		n, err := unix.Poll(d.pfd[:], ms)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return false, err
		}
		if n == 0 {
			return false, nil
		}
		break
	}
	return d.Drain()
}

// Drain resets the doorbell without blocking and reports whether it had rung.
func (d *Doorbell) Drain() (bool, error) {
	_, err := unix.Read(d.fd, d.sink[:])
	if errors.Is(err, unix.EAGAIN) {
		return false, nil
	}
	return err == nil, err
}

// Close closes the eventfd.
func (d *Doorbell) Close() error {
	if d.fd < 0 {
		return nil
	}
	err := unix.Close(d.fd)
	d.fd = -1
	return err
}

// Sleep is the consumer's idle step for one ring: arm the wakeup flag, and
// if the ring is still empty block on db for at most timeout; then disarm.
// Callers spin-poll for a while before calling Sleep, so that a busy queue
// never pays the syscall.
func (c *Consumer) Sleep(db *Doorbell, timeout time.Duration) error {
	if !c.Arm() {
		c.Disarm()
		return c.err
	}
	_, err := db.Wait(timeout)
	c.Disarm()
	return err
}

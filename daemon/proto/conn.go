package proto

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"

	"golang.org/x/sys/unix"
)

// Conn is one end of a control connection: whole messages with their file
// descriptors. Recv is used by one goroutine at a time; Send may be called
// concurrently.
type Conn struct {
	c   *net.UnixConn
	in  []byte
	oob []byte
	smu sync.Mutex // Send may be called from two goroutines (a capture's end)
	out []byte
}

// NewConn wraps a SOCK_SEQPACKET Unix connection ("unixpacket").
func NewConn(c *net.UnixConn) *Conn {
	return &Conn{c: c, in: make([]byte, MaxMessage+1), oob: make([]byte, unix.CmsgSpace(4*MaxFDs)), out: make([]byte, 0, MaxMessage)}
}

// UnixConn is the underlying connection.
func (c *Conn) UnixConn() *net.UnixConn { return c.c }

// Close closes the connection.
func (c *Conn) Close() error { return c.c.Close() }

// Send writes one message; fds are duplicated into the peer (the caller
// keeps and eventually closes its own). Safe for concurrent use.
func (c *Conn) Send(h Header, body any, fds ...int) error {
	c.smu.Lock()
	defer c.smu.Unlock()
	if len(fds) > MaxFDs {
		return fmt.Errorf("proto: %d fds exceed %d", len(fds), MaxFDs)
	}
	h.Version = Version
	msg, err := Encode(c.out, h, body)
	if err != nil {
		return err
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	n, oobn, err := c.c.WriteMsgUnix(msg, oob, nil)
	if err != nil {
		return err
	}
	if n != len(msg) || oobn != len(oob) {
		return fmt.Errorf("proto: short write (%d of %d bytes)", n, len(msg))
	}
	return nil
}

// Recv reads one message. The body aliases the Conn's buffer until the next
// Recv. The received fds are the caller's to close, even on error paths of
// its own; on a malformed message Recv closes them itself and fails.
func (c *Conn) Recv() (Header, []byte, []int, error) {
	n, oobn, flags, _, err := c.c.ReadMsgUnix(c.in, c.oob)
	if err != nil {
		return Header{}, nil, nil, err
	}
	var fds []int
	if oobn > 0 {
		fds, err = parseRights(c.oob[:oobn])
		if err != nil {
			closeAll(fds)
			return Header{}, nil, nil, err
		}
	}
	if flags&unix.MSG_CTRUNC != 0 {
		closeAll(fds)
		return Header{}, nil, nil, fmt.Errorf("%w: more than %d fds", ErrBadMessage, MaxFDs)
	}
	if flags&unix.MSG_TRUNC != 0 || n > MaxMessage {
		closeAll(fds)
		return Header{}, nil, nil, fmt.Errorf("%w: longer than %d bytes", ErrBadMessage, MaxMessage)
	}
	if n == 0 && oobn == 0 {
		// SOCK_SEQPACKET signals the peer's close as a zero-length read.
		return Header{}, nil, nil, errEOF
	}
	h, body, err := DecodeHeader(c.in[:n])
	if err == nil && h.Version != Version {
		err = fmt.Errorf("%w: protocol version %d, want %d", ErrBadMessage, h.Version, Version)
	}
	if err != nil {
		closeAll(fds)
		return Header{}, nil, nil, err
	}
	return h, body, fds, nil
}

var errEOF = fmt.Errorf("proto: connection closed: %w", net.ErrClosed)

// IsClosed reports whether err means the peer went away.
func IsClosed(err error) bool {
	return errors.Is(err, net.ErrClosed) || errors.Is(err, unix.ECONNRESET) || errors.Is(err, unix.EPIPE) || errors.Is(err, io.EOF)
}

func parseRights(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("%w: control message: %w", ErrBadMessage, err)
	}
	var fds []int
	for i := range msgs {
		if msgs[i].Header.Level != unix.SOL_SOCKET || msgs[i].Header.Type != unix.SCM_RIGHTS {
			continue
		}
		f, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			return fds, fmt.Errorf("%w: SCM_RIGHTS: %w", ErrBadMessage, err)
		}
		fds = append(fds, f...)
	}
	return fds, nil
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// CloseFDs closes received fds the caller did not take.
func CloseFDs(fds []int) { closeAll(fds) }

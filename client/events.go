package client

import (
	"errors"
	"net"
	"os"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/daemon/proto"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/verbs"
)

var _ verbs.AsyncEventer = (*Client)(nil)

// Events delivers the asynchronous events of this client's QPs, CQs and
// SRQs and of the daemon's port (verbs.AsyncEventer), and
// ib.EventDeviceFatal, last, when the daemon goes away. The first call
// asks the daemon for them (proto/async.go): events from before it are not
// delivered, so call it before creating the objects whose events matter.
// A QP event names the QP by QPN, a CQ or SRQ event by the object. While
// the channel is full the daemon holds the events back (up to
// proto.MaxPendingEvents, then drops them: LostEvents counts those).
func (c *Client) Events() <-chan verbs.AsyncEvent {
	c.evOnce.Do(func() {
		c.events = make(chan verbs.AsyncEvent, 256)
		c.evQuit, c.evDone = make(chan struct{}), make(chan struct{})
		conn, err := c.subscribe()
		if err != nil {
			// No events can come from a daemon that cannot be asked:
			// the device is unusable.
			c.events <- verbs.AsyncEvent{Type: ib.EventDeviceFatal}
			close(c.evDone)
			return
		}
		c.evConn = conn
		go c.readEvents(conn)
	})
	return c.events
}

// LostEvents counts the events the daemon dropped for this client, its
// queue full (the Lost field of the daemon's latest event).
func (c *Client) LostEvents() uint64 { return c.lost.Load() }

func (c *Client) subscribe() (*net.UnixConn, error) {
	_, fds, err := c.call(proto.OpAsyncEvents, nil, 1)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fds[0]), "softrnic-events")
	fc, err := net.FileConn(f) // a dup of the descriptor: f's own is closed now
	if cerr := f.Close(); err == nil && cerr != nil {
		fc.Close()
		return nil, cerr
	}
	if err != nil {
		return nil, err
	}
	uc, ok := fc.(*net.UnixConn)
	if !ok {
		fc.Close()
		return nil, errors.New("softrnic: the event socket is not a Unix socket")
	}
	return uc, nil
}

// readEvents turns the daemon's event messages into events until the
// daemon closes the socket (DEVICE_FATAL) or the client is closed.
func (c *Client) readEvents(conn *net.UnixConn) {
	defer close(c.evDone)
	buf := make([]byte, proto.MaxMessage)
	for {
		n, _, flags, _, err := conn.ReadMsgUnix(buf, nil)
		if err != nil || n == 0 {
			select {
			case <-c.evQuit: // closed by Close (before the socket): no event
				return
			default:
			}
			select {
			case <-c.evQuit:
			case c.events <- verbs.AsyncEvent{Type: ib.EventDeviceFatal}:
			}
			return
		}
		h, body, err := proto.DecodeHeader(buf[:n])
		var m proto.AsyncEventMsg
		if err != nil || flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 || h.Op != proto.OpAsyncEvent || proto.DecodeBody(body, &m) != nil {
			continue // not an event: ignored, as a malformed message is
		}
		if uint64(m.Lost) > c.lost.Load() {
			c.lost.Store(uint64(m.Lost))
		}
		e, ok := c.event(&m)
		if !ok {
			continue
		}
		select {
		case c.events <- e:
		case <-c.evQuit:
			return
		}
	}
}

// event converts a message; false for one of an object already destroyed.
func (c *Client) event(m *proto.AsyncEventMsg) (verbs.AsyncEvent, bool) {
	e := verbs.AsyncEvent{Type: m.Type}
	switch m.Type {
	case ib.EventPortActive:
		c.portState.Store(1)
	case ib.EventPortErr:
		c.portState.Store(2)
	case ib.EventCQErr:
		c.objMu.Lock()
		cq := c.cqs[m.Handle]
		c.objMu.Unlock()
		if cq == nil {
			return e, false
		}
		e.CQ = cq
	case ib.EventSRQLimitReached, ib.EventSRQErr:
		c.objMu.Lock()
		x := c.srqs[m.Handle]
		c.objMu.Unlock()
		if x == nil {
			return e, false
		}
		e.SRQ = x
	default:
		e.QPN = m.QPN
	}
	return e, true
}

// stopEvents ends the reader (Close).
func (c *Client) stopEvents() {
	c.evOnce.Do(func() {}) // waits for an Events in progress; none starts a reader after
	if c.evQuit == nil {
		return
	}
	close(c.evQuit)
	if c.evConn != nil {
		c.evConn.Close()
	}
	<-c.evDone
}

package proto

import "github.com/softrnic/softrnic/ib"

// Asynchronous events (ibv_get_async_event) travel as UCM's do: OpAsyncEvents
// hands the client one end of a SOCK_SEQPACKET socket pair, and the daemon
// writes each event of the connection's objects, and of the port, as one
// message, an OpAsyncEvent Header (Seq counting the connection's events
// from 1) followed by an AsyncEventMsg. The client's end is readable
// exactly while events wait (a library can make it its context's
// async_fd), a non-blocking reader gets EAGAIN, and end-of-file means the
// daemon is gone: ib.EventDeviceFatal.
//
// The daemon never blocks on the socket: what does not fit waits in order
// in memory, up to MaxPendingEvents; beyond that an event is dropped and
// counted, in the daemon's async_events_lost counter and in the Lost field
// of every later message, so that the client knows it missed some.
//
// Events name objects by handle: a QP (with its QPN), a CQ or an SRQ of the
// connection. One written before its object was destroyed may still be in
// the socket; the client drops those of handles it no longer has.

// MaxPendingEvents bounds the events of one connection that wait in the
// daemon for room in its event socket.
const MaxPendingEvents = 4096

// AsyncEventMsg follows an OpAsyncEvent header on the event socket.
type AsyncEventMsg struct {
	Type   ib.EventType
	_      [3]byte
	Handle Handle // the QP, CQ or SRQ; 0 for port events
	QPN    uint32 // QP events: the QP's number
	Lost   uint32 // events of this connection dropped so far, queue full
}

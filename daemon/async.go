package daemon

import (
	"errors"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/daemon/proto"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/rnic"
	"github.com/softrnic/softrnic/verbs"
)

// Asynchronous events (proto/async.go): the device's events (a
// subscription of the server's own, beside the rdma_cm agent's) go to the
// connection that owns the QP, CQ or SRQ they name, port events to every
// connection, and the daemon adds its own (a QP it moved to ERR because the
// client corrupted a ring, an SRQ it retired, a CQ ring that overflowed).
// One goroutine routes them all and writes each connection's event socket
// without ever blocking on it.

// eventSink is a connection's event socket and what waits for room in it.
type eventSink struct {
	mu      sync.Mutex
	fd      int // the daemon's end, non-blocking; -1 before OpAsyncEvents and after the session
	seq     uint32
	pending []pendingEvent
	lost    uint32 // events dropped, the queue full (sent in every later message)
}

type pendingEvent struct {
	seq uint32
	msg proto.AsyncEventMsg
}

// ownEvent is an event the daemon raises itself, already resolved to its
// connection and handle.
type ownEvent struct {
	ss  *session
	msg proto.AsyncEventMsg
}

// eventRetry is how soon the router tries again to write events that did
// not fit in a connection's socket.
const eventRetry = 10 * time.Millisecond

// startEvents subscribes to the device's events and starts the router.
func (s *Server) startEvents() {
	s.evQPs, s.evCQs, s.evSRQs = map[uint32]*qpObj{}, map[*rnic.CQ]*cqObj{}, map[*rnic.SRQ]*srqObj{}
	s.evOwn = make(chan ownEvent, 256)
	s.evQuit, s.evDone = make(chan struct{}), make(chan struct{})
	evs, cancel := s.dev.Subscribe(1024)
	go func() {
		defer close(s.evDone)
		defer cancel()
		s.routeEvents(evs)
	}()
}

// stopEvents ends the router (after the sessions closed).
func (s *Server) stopEvents() {
	close(s.evQuit)
	<-s.evDone
}

func (s *Server) routeEvents(evs <-chan verbs.AsyncEvent) {
	waiting := map[*session]struct{}{} // sessions with events that did not fit
	var retry <-chan time.Time
	deliver := func(ss *session, msg proto.AsyncEventMsg) {
		if ss.events.push(msg) {
			s.AsyncEventsLost.Add(1)
		}
		if ss.events.waiting() {
			waiting[ss] = struct{}{}
		}
	}
	for {
		select {
		case e := <-evs:
			s.route(e, deliver)
		case o := <-s.evOwn:
			deliver(o.ss, o.msg)
		case <-retry:
			for ss := range waiting {
				if !ss.events.flush() {
					delete(waiting, ss)
				}
			}
		case <-s.evQuit:
			return
		}
		retry = nil
		if len(waiting) > 0 {
			retry = time.After(eventRetry)
		}
	}
}

// route finds the connection a device event is for.
func (s *Server) route(e verbs.AsyncEvent, deliver func(*session, proto.AsyncEventMsg)) {
	msg := proto.AsyncEventMsg{Type: e.Type}
	switch e.Type {
	case ib.EventPortActive, ib.EventPortErr:
		s.mu.Lock()
		all := make([]*session, 0, len(s.sessions))
		for ss := range s.sessions {
			all = append(all, ss)
		}
		s.mu.Unlock()
		for _, ss := range all {
			deliver(ss, msg)
		}
		return
	case ib.EventCQErr:
		cq, _ := e.CQ.(*rnic.CQ)
		s.evMu.Lock()
		c := s.evCQs[cq]
		s.evMu.Unlock()
		if c != nil {
			msg.Handle = c.h
			deliver(c.owner, msg)
		}
		return
	case ib.EventSRQLimitReached, ib.EventSRQErr:
		srq, _ := e.SRQ.(*rnic.SRQ)
		s.evMu.Lock()
		x := s.evSRQs[srq]
		s.evMu.Unlock()
		if x != nil {
			msg.Handle = x.h
			deliver(x.owner, msg)
		}
		return
	default:
	}
	// QP events; those of QPs no client owns (the CM agent's GSI QP) go
	// nowhere.
	s.evMu.Lock()
	q := s.evQPs[e.QPN]
	s.evMu.Unlock()
	if q != nil {
		msg.Handle, msg.QPN = q.h, e.QPN
		deliver(q.owner, msg)
	}
}

// ownEvent hands an event the daemon raises (from the engine fetching a
// client's rings, or a control operation) to the router, never blocking.
func (s *Server) ownEvent(ss *session, msg proto.AsyncEventMsg) {
	select {
	case s.evOwn <- ownEvent{ss, msg}:
	default:
		s.AsyncEventsLost.Add(1)
	}
}

// The index from the device's objects to the clients' (guarded by evMu):
// an object enters it once its handle exists and leaves it before it is
// destroyed, so that no event of a destroyed object reaches a client.
func (s *Server) indexQP(q *qpObj) {
	s.evMu.Lock()
	s.evQPs[q.qp.QPN()] = q
	s.evMu.Unlock()
}

func (s *Server) unindexQP(q *qpObj) {
	s.evMu.Lock()
	if s.evQPs[q.qp.QPN()] == q {
		delete(s.evQPs, q.qp.QPN())
	}
	s.evMu.Unlock()
}

func (s *Server) indexCQ(c *cqObj) {
	s.evMu.Lock()
	s.evCQs[c.cq] = c
	s.evMu.Unlock()
}

// unindexCQ forgets a destroyed CQ, keeping the completions its ring
// lost in CQRingDropped (cqRingDropped).
func (s *Server) unindexCQ(c *cqObj) {
	s.evMu.Lock()
	delete(s.evCQs, c.cq)
	s.CQRingDropped.Add(c.cq.Overflows())
	s.evMu.Unlock()
}

// cqRingDropped counts the completions lost on full client CQ rings: the
// overflows of the live CQs (each ring is its CQ's store, so a completion
// that finds it full overruns the CQ) and of the destroyed ones.
func (s *Server) cqRingDropped() uint64 {
	s.evMu.Lock()
	defer s.evMu.Unlock()
	n := s.CQRingDropped.Load()
	for cq := range s.evCQs {
		n += cq.Overflows()
	}
	return n
}

func (s *Server) indexSRQ(x *srqObj) {
	s.evMu.Lock()
	s.evSRQs[x.srq] = x
	s.evMu.Unlock()
}

func (s *Server) unindexSRQ(x *srqObj) {
	s.evMu.Lock()
	delete(s.evSRQs, x.srq)
	s.evMu.Unlock()
}

// asyncEvents serves OpAsyncEvents: the connection's event socket, made
// once. The client's end goes with the reply and is closed here after it.
func (ss *session) asyncEvents(body []byte) (any, []int, error) {
	if len(body) != 0 {
		return nil, nil, errf(unix.EINVAL, "ASYNC_EVENTS takes no body")
	}
	k := &ss.events
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.fd >= 0 {
		return nil, nil, errf(unix.EBUSY, "this connection has its event socket")
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, errf(unix.ENOMEM, "event socket: %v", err)
	}
	if err := unix.SetNonblock(fds[0], true); err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return nil, nil, errf(unix.ENOMEM, "event socket: %v", err)
	}
	k.fd = fds[0]
	ss.afterReply = append(ss.afterReply, fds[1])
	return nil, []int{fds[1]}, nil
}

// queryDevice serves OpQueryDevice: the attributes OPEN gave, with the
// port's state as it is now.
func (ss *session) queryDevice(body []byte) (any, []int, error) {
	if len(body) != 0 {
		return nil, nil, errf(unix.EINVAL, "QUERY_DEVICE takes no body")
	}
	in := ss.s.info
	in.DeviceAttr = ss.s.dev.Query()
	return &in, nil, nil
}

// push queues msg and writes what fits; it reports whether msg was
// dropped, the queue full. Events for a connection that has no event
// socket are not wanted: they are neither queued nor counted.
func (k *eventSink) push(msg proto.AsyncEventMsg) (dropped bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.fd < 0 {
		return false
	}
	if len(k.pending) >= proto.MaxPendingEvents {
		k.lost++
		return true
	}
	k.seq++
	msg.Lost = k.lost
	k.pending = append(k.pending, pendingEvent{k.seq, msg})
	k.flushLocked()
	return false
}

// flush writes what fits and reports whether events still wait.
func (k *eventSink) flush() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.flushLocked()
	return len(k.pending) > 0
}

func (k *eventSink) waiting() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.pending) > 0
}

func (k *eventSink) flushLocked() {
	for len(k.pending) > 0 {
		if k.fd < 0 {
			k.pending = nil
			return
		}
		p := &k.pending[0]
		b, err := proto.Encode(make([]byte, 0, proto.HeaderSize+16), proto.Header{Op: proto.OpAsyncEvent, Version: proto.Version, Seq: p.seq}, &p.msg)
		if err != nil {
			k.pending = k.pending[1:]
			continue
		}
		_, err = unix.SendmsgN(k.fd, b, nil, nil, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
		switch {
		case err == nil:
			k.pending = k.pending[1:]
		case errors.Is(err, unix.EINTR):
		case errors.Is(err, unix.EAGAIN):
			return
		default: // the client closed its end: nobody will read these
			k.pending = nil
			return
		}
	}
	if len(k.pending) == 0 {
		k.pending = nil // let a burst's backing array go
	}
}

// close ends the socket with the session: the client reads end-of-file
// (IBV_EVENT_DEVICE_FATAL if the daemon is going away).
func (k *eventSink) close() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.fd >= 0 {
		unix.Close(k.fd)
	}
	k.fd, k.pending = -1, nil
}

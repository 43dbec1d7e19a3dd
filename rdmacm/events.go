package rdmacm

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/cm"
)

// EventCM is the Agent's event interface: the CM exchange without the QP.
// Its owner (the daemon, serving rdma_cm to its clients) drives each
// connection's QP itself, as rdma-core's librdmacm does over the kernel's
// rdma_ucm, and learns what the peer did from the Manager's events, which
// the Agent hands to one EventSink. No call waits for the peer: each
// returns once the Manager has done its part and the MADs are posted.
//
// A connection of the event interface is named by its cm.ConnID. Active
// connections defer their RTU (cm.ConnectParams.DeferRTU): the REP comes
// as cm.EventConnResponse, and Establish sends the RTU once the owner's QP
// is in RTS. Requests for a service listened on with Listen come as
// cm.EventConnRequest or cm.EventSIDRRequest; the owner answers with
// Accept, Reject or SIDRReply. The owner only ever names its own
// connections: every call checks that the ID is one of the interface's.
type EventCM struct {
	a    *Agent
	sink EventSink
	// Guarded by a.mu.
	services map[uint64]bool      // service IDs listened on
	conns    map[cm.ConnID]uint32 // the interface's connections → the QPN of an accepted one (COMM_EST)
	byQPN    map[uint32]cm.ConnID // accepted connections by QPN
	stats    EventStats           // what the interface did
	sweepAt  int                  // len(conns) at which to sweep released IDs
	scratch  []cm.ConnID          // sweep buffer
}

// EventSink receives the events of the event interface's connections. It
// is called with the Agent's lock held, from the Agent's goroutine or from
// an EventCM call: it must copy what it keeps from the event, never block,
// and never call the Agent.
type EventSink func(e *cm.Event)

// EventStats counts what the event interface did.
type EventStats struct {
	Events   uint64 // events handed to the sink
	CommEst  uint64 // passive connections established by their QP's first packet (COMM_EST)
	Released uint64 // connections the Manager forgot (their events are over)
}

// Errors of the event interface.
var (
	ErrEventCM    = errors.New("rdmacm: the agent's event interface is already taken")
	ErrNotEventCM = errors.New("rdmacm: no such connection of the event interface")
	ErrUnresolved = errors.New("rdmacm: the peer's address is not resolved (ResolvePeer first)")
)

// EventCM starts the agent's event interface, whose events go to sink. An
// agent has at most one.
func (a *Agent) EventCM(sink EventSink) (*EventCM, error) {
	if sink == nil {
		return nil, errors.New("rdmacm: an event interface needs a sink")
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.ev != nil {
		return nil, ErrEventCM
	}
	if a.closed {
		return nil, ErrClosed
	}
	a.ev = &EventCM{a: a, sink: sink, services: map[uint64]bool{}, conns: map[cm.ConnID]uint32{},
		byQPN: map[uint32]cm.ConnID{}, sweepAt: 64}
	return a.ev, nil
}

// Close ends the event interface: its services are no longer listened
// on, its connections are aborted (a REJ or DREQ to each peer still
// there), and its sink gets nothing more. The agent may then start
// another.
func (e *EventCM) Close() {
	a := e.a
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.ev != e {
		return
	}
	for svc := range e.services {
		_ = a.m.Unlisten(svc) // closing: every service goes
	}
	if !a.closed {
		now := a.cfg.Now()
		for id := range e.conns {
			_ = a.m.Abort(now, id) // closing: every connection goes
		}
		a.flushLocked(now)
	}
	a.ev = nil
	clear(e.services)
	clear(e.conns)
	clear(e.byQPN)
}

// Stats returns the event interface's counters.
func (e *EventCM) Stats() EventStats {
	e.a.mu.Lock()
	defer e.a.mu.Unlock()
	return e.stats
}

// Listen takes the requests for serviceID (rdma_cm's port spaces: their
// REQs and SIDR_REQs carry the rdma_cm header, which the events hold). A
// service listened on by the Agent's own Listen cannot be taken here, nor
// the other way round (cm.ErrListening).
func (e *EventCM) Listen(serviceID uint64) error {
	a := e.a
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return ErrClosed
	}
	if err := a.m.Listen(serviceID, cm.ListenOptions{RDMACM: true}); err != nil {
		return err
	}
	e.services[serviceID] = true
	return nil
}

// Unlisten stops taking requests for serviceID; the requests already
// handed out stay the owner's.
func (e *EventCM) Unlisten(serviceID uint64) error {
	a := e.a
	a.mu.Lock()
	defer a.mu.Unlock()
	if !e.services[serviceID] {
		return cm.ErrNotListening
	}
	delete(e.services, serviceID)
	return a.m.Unlisten(serviceID)
}

// ResolvePeer resolves peer's MAC (ARP or ND, bounded by ctx and a few
// seconds), which Connect and Resolve need: call it without holding
// anything the sink takes.
func (e *EventCM) ResolvePeer(ctx context.Context, peer netip.Addr) error {
	return e.a.ensureMAC(ctx, peer.Unmap())
}

// Resolved reports whether peer's MAC is known (Connect and Resolve may
// go at once).
func (e *EventCM) Resolved(peer netip.Addr) bool {
	a := e.a
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.resolvedLocked(peer) == nil
}

// resolvedLocked checks that MADs to peer can leave.
func (a *Agent) resolvedLocked(peer netip.Addr) error {
	if _, ok := a.macs[peer.Unmap()]; !ok {
		return fmt.Errorf("%w: %v", ErrUnresolved, peer)
	}
	return nil
}

// Connect sends a REQ (p.RDMACM and p.DeferRTU are set here): the REP
// comes as cm.EventConnResponse, a refusal as cm.EventRejected, no answer
// as cm.EventTimeout. The peer must be resolved (ResolvePeer).
func (e *EventCM) Connect(p *cm.ConnectParams) (cm.ConnID, error) {
	a := e.a
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return 0, ErrClosed
	}
	if err := a.resolvedLocked(p.Peer); err != nil {
		return 0, err
	}
	q := *p
	q.RDMACM, q.DeferRTU = true, true
	now := a.cfg.Now()
	id, err := a.m.Connect(now, &q)
	if err != nil {
		return 0, err
	}
	e.adoptLocked(id)
	a.flushLocked(now)
	a.wake()
	return id, nil
}

// Resolve sends a SIDR_REQ (p.RDMACM is set here): the answer comes as
// cm.EventSIDRReply, no answer as cm.EventSIDRTimeout. The peer must be
// resolved (ResolvePeer).
func (e *EventCM) Resolve(p *cm.SIDRParams) (cm.ConnID, error) {
	a := e.a
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return 0, ErrClosed
	}
	if err := a.resolvedLocked(p.Peer); err != nil {
		return 0, err
	}
	q := *p
	q.RDMACM = true
	now := a.cfg.Now()
	id, err := a.m.ResolveService(now, &q)
	if err != nil {
		return 0, err
	}
	e.adoptLocked(id)
	a.flushLocked(now)
	a.wake()
	return id, nil
}

// adoptLocked makes id a connection of the event interface (an ID the
// Manager just made: a stale entry of a reused ID is replaced).
func (e *EventCM) adoptLocked(id cm.ConnID) {
	if qpn, ok := e.conns[id]; ok && qpn != 0 {
		delete(e.byQPN, qpn)
	}
	e.conns[id] = 0
	if len(e.conns) >= e.sweepAt {
		e.sweepLocked()
	}
}

// call runs f on one of the interface's connections, with the lock held,
// then sends what the Manager produced.
func (e *EventCM) call(id cm.ConnID, f func(now clock.Time) error) error {
	a := e.a
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return ErrClosed
	}
	if _, ok := e.conns[id]; !ok {
		return ErrNotEventCM
	}
	now := a.cfg.Now()
	err := f(now)
	a.flushLocked(now)
	a.wake()
	return err
}

// Accept answers a cm.EventConnRequest with a REP naming p.QPN, which
// must be in RTR with p.StartingPSN as its receive PSN. The RTU (or the
// QP's first packet: the device's COMM_EST event) brings
// cm.EventEstablished.
func (e *EventCM) Accept(id cm.ConnID, p *cm.AcceptParams) error {
	return e.call(id, func(now clock.Time) error {
		if err := e.a.m.Accept(now, id, p); err != nil {
			return err
		}
		if old := e.conns[id]; old != 0 {
			delete(e.byQPN, old)
		}
		e.conns[id] = p.QPN
		e.byQPN[p.QPN] = id
		return nil
	})
}

// Reject refuses a cm.EventConnRequest, or the REP of a
// cm.EventConnResponse, with a REJ.
func (e *EventCM) Reject(id cm.ConnID, reason cm.RejectReason, private []byte) error {
	return e.call(id, func(now clock.Time) error { return e.a.m.Reject(now, id, reason, private) })
}

// SIDRReply answers a cm.EventSIDRRequest.
func (e *EventCM) SIDRReply(id cm.ConnID, p *cm.SIDRReplyParams) error {
	return e.call(id, func(now clock.Time) error { return e.a.m.SIDRReply(now, id, p) })
}

// Establish sends the RTU of a cm.EventConnResponse: the owner's QP is in
// RTS.
func (e *EventCM) Establish(id cm.ConnID) error {
	return e.call(id, func(now clock.Time) error { return e.a.m.Establish(now, id) })
}

// Notify establishes an accepted connection whose QP received a packet
// before the RTU (the owner's COMM_EST, rdma_notify).
func (e *EventCM) Notify(id cm.ConnID) error {
	return e.call(id, func(now clock.Time) error { return e.a.m.NotifyEstablished(now, id) })
}

// Disconnect sends a DREQ: cm.EventDisconnected follows (TimedOut if
// nobody answered).
func (e *EventCM) Disconnect(id cm.ConnID, private []byte) error {
	return e.call(id, func(now clock.Time) error { return e.a.m.Disconnect(now, id, private) })
}

// Abort ends a connection in whatever state it is (cm.Manager.Abort: a
// REJ for one being set up, a DREQ for an established one); a SIDR
// request not yet answered is refused.
func (e *EventCM) Abort(id cm.ConnID) error {
	return e.call(id, func(now clock.Time) error {
		m := e.a.m
		if m.State(id) == cm.StateSIDRREQRcvd {
			return m.SIDRReply(now, id, &cm.SIDRReplyParams{Status: cm.SIDRReject})
		}
		return m.Abort(now, id)
	})
}

// State is the Manager's state of one of the interface's connections
// (cm.StateIdle once released).
func (e *EventCM) State(id cm.ConnID) cm.State {
	a := e.a
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := e.conns[id]; !ok {
		return cm.StateIdle
	}
	return a.m.State(id)
}

// eventLocked routes e to the sink if it belongs to the interface: a
// request for one of its services (which makes the request its
// connection) or any event of one of its connections. It reports whether
// it did.
func (e *EventCM) eventLocked(ev *cm.Event) bool {
	switch ev.Kind {
	case cm.EventConnRequest, cm.EventSIDRRequest:
		if !e.services[ev.ServiceID] {
			e.forgetLocked(ev.ID)
			return false
		}
		e.adoptLocked(ev.ID)
	default:
		if _, ok := e.conns[ev.ID]; !ok {
			return false
		}
	}
	e.stats.Events++
	e.sink(ev)
	if e.a.m.State(ev.ID) == cm.StateIdle {
		e.releaseLocked(ev.ID)
	}
	return true
}

// forgetLocked drops a stale entry for id, an ID the Manager has just
// given to one of the Agent's own connections (nil-safe: the Agent calls
// it whether or not the interface runs).
func (e *EventCM) forgetLocked(id cm.ConnID) {
	if e == nil {
		return
	}
	if _, ok := e.conns[id]; ok {
		e.releaseLocked(id)
	}
}

func (e *EventCM) releaseLocked(id cm.ConnID) {
	if qpn := e.conns[id]; qpn != 0 && e.byQPN[qpn] == id {
		delete(e.byQPN, qpn)
	}
	delete(e.conns, id)
	e.stats.Released++
}

// sweepLocked forgets the connections the Manager has released without
// an event (a rejected request leaving time-wait), and sets the next
// sweep at twice the live count, so that sweeps cost O(1) per connection.
func (e *EventCM) sweepLocked() {
	e.scratch = e.scratch[:0]
	for id := range e.conns {
		if e.a.m.State(id) == cm.StateIdle {
			e.scratch = append(e.scratch, id)
		}
	}
	for _, id := range e.scratch {
		e.releaseLocked(id)
	}
	e.sweepAt = max(64, 2*len(e.conns))
}

// commEstLocked establishes an accepted connection of the interface whose
// QP got its first packet before the RTU; it reports whether qpn was one.
func (e *EventCM) commEstLocked(now clock.Time, qpn uint32) bool {
	id, ok := e.byQPN[qpn]
	if !ok {
		return false
	}
	switch e.a.m.State(id) {
	case cm.StateREPSent, cm.StateMRAREPRcvd:
		if e.a.m.NotifyEstablished(now, id) == nil {
			e.stats.CommEst++
		}
	default: // no RTU awaited: nothing to fix
	}
	return true
}

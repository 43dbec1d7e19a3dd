package rdmacm

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/softrnic/softrnic/cm"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/verbs"
)

var _ CM = (*Agent)(nil)

func or7(v uint8) uint8 {
	if v == 0 {
		return 7
	}
	return min(v, 7)
}

func (p *ConnParam) minRNR() uint8 {
	if p.MinRNRTimer == 0 {
		return DefaultMinRNRTimer
	}
	return min(p.MinRNRTimer, 31)
}

// ErrNotRC is returned when a connection is given a QP that is not RC.
var ErrNotRC = errors.New("rdmacm: not an RC QP")

// initQP checks the QP a connection will drive and moves it to INIT with
// p's access (from RESET, or again in INIT, keeping its posted receives).
// owns checks that qp is a QP of the agent's device: the CM sends the
// QPN of its own device's QP in its MADs, and programs the QP with that
// device's addresses.
func (a *Agent) owns(qp verbs.QP) error {
	if d, ok := qp.(verbs.DeviceObject); ok && d.Device() != a.dev {
		return fmt.Errorf("rdmacm: QP %#x is another device's: %w", qp.QPN(), verbs.ErrOtherDevice)
	}
	return nil
}

func (a *Agent) initQP(qp verbs.QP, p *ConnParam) error {
	if qp == nil || qp.Type() != ib.RC {
		return ErrNotRC
	}
	if err := a.owns(qp); err != nil {
		return err
	}
	if s := qp.State(); s != ib.Reset && s != ib.Init {
		return fmt.Errorf("rdmacm: QP %#x is in %v, not RESET or INIT", qp.QPN(), s)
	}
	return InitQP(qp, p)
}

// conn is one RC connection of an Agent: its QP is connected (RTS) once
// Connect or Accept returns it.
type conn struct {
	agent   *Agent
	id      cm.ConnID
	active  bool
	peer    netip.Addr
	qp      verbs.QP
	minRNR  uint8
	private []byte

	// Guarded by agent.mu.
	result      chan error // one value: nil when established, or why not
	settled     bool
	established bool
	done        chan struct{}
	err         error
	finished    bool
}

func newConn(a *Agent, active bool, peer netip.Addr, qp verbs.QP, minRNR uint8) *conn {
	return &conn{agent: a, active: active, peer: peer, qp: qp, minRNR: minRNR,
		result: make(chan error, 1), done: make(chan struct{})}
}

// settleLocked gives the Connect or Accept waiting for c its answer, once.
func (c *conn) settleLocked(err error) {
	if !c.settled {
		c.settled = true
		c.result <- err
	}
}

// finishLocked ends the connection for its user: Done closes, Err says why.
func (c *conn) finishLocked(err error) {
	c.settleLocked(err)
	if !c.finished {
		c.finished, c.err = true, err
		close(c.done)
	}
}

func (c *conn) QP() verbs.QP          { return c.qp }
func (c *conn) Peer() netip.Addr      { return c.peer }
func (c *conn) PrivateData() []byte   { return c.private }
func (c *conn) Done() <-chan struct{} { return c.done }

// Err says why Done closed (ErrDisconnected for a normal disconnection).
func (c *conn) Err() error {
	c.agent.mu.Lock()
	defer c.agent.mu.Unlock()
	return c.err
}

// wait waits for c's answer; on ctx's end it aborts the attempt.
func (c *conn) wait(ctx context.Context) error {
	select {
	case err := <-c.result:
		return err
	case <-ctx.Done():
		a := c.agent
		a.mu.Lock()
		if !a.closed {
			now := a.cfg.Now()
			_ = a.m.Abort(now, c.id) // fails only for a connection already gone
			a.flushLocked(now)
		}
		c.finishLocked(ctx.Err())
		a.forgetLocked(c)
		a.mu.Unlock()
		return ctx.Err()
	}
}

// Disconnect sends a DREQ (rdma_disconnect) and waits until the peer's
// DREP arrives, the DREQ times out, or ctx ends. The QP goes to the error
// state, flushing the WRs still posted.
func (c *conn) Disconnect(ctx context.Context) error {
	a := c.agent
	a.mu.Lock()
	if c.finished || a.closed {
		a.mu.Unlock()
		return nil
	}
	now := a.cfg.Now()
	if err := a.m.Disconnect(now, c.id, nil); err != nil {
		_ = a.m.Abort(now, c.id) // fails only for a connection already gone
	}
	a.flushLocked(now)
	a.mu.Unlock()
	a.wake()
	select {
	case <-c.done:
		// Ended by the peer's DREQ crossing ours: the agent posts our DREP
		// in the flush that woke us. Wait for it (as Connect for the RTU),
		// so that a caller tearing everything down next does not race it.
		a.mu.Lock()
		a.mu.Unlock() //nolint:staticcheck // an empty critical section: a barrier
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close ends the connection without waiting (a DREQ or REJ goes to the
// peer if it is still up). The QP is the application's.
func (c *conn) Close() error {
	a := c.agent
	a.mu.Lock()
	if !c.finished && !a.closed {
		now := a.cfg.Now()
		_ = a.m.Abort(now, c.id) // fails only for a connection already gone
		a.flushLocked(now)
		c.finishLocked(ErrDisconnected)
	}
	a.mu.Unlock()
	a.wake()
	return nil
}

// forgetLocked drops c from the agent's tables (its attempt failed; its
// QP is the application's again).
func (a *Agent) forgetLocked(c *conn) {
	if a.conns[c.id] == c {
		delete(a.conns, c.id)
	}
	if a.byQPN[c.qp.QPN()] == c {
		delete(a.byQPN, c.qp.QPN())
	}
}

// Connect connects qp to port (rdma_cm TCP port space) at peer: the QP is
// moved through INIT, RTR and RTS as the REQ, REP and RTU go. It returns
// once the connection is established, the peer rejects it
// (*RejectedError; reason 8 when nobody listens), every REQ retry went
// unanswered (ErrTimeout), or ctx ends; the QP is then the caller's to
// reuse (after a RESET) or destroy.
func (a *Agent) Connect(ctx context.Context, qp verbs.QP, peer netip.Addr, port uint16, p *ConnParam) (Conn, error) {
	peer = peer.Unmap()
	_, local, err := a.sgid(peer)
	if err != nil {
		return nil, err
	}
	if err := a.ensureMAC(ctx, peer); err != nil {
		return nil, err
	}
	if err := a.initQP(qp, p); err != nil {
		return nil, err
	}
	c := newConn(a, true, peer, qp, p.minRNR())
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil, ErrClosed
	}
	now := a.cfg.Now()
	sport := uint16(32768 + a.rng.IntN(28232)) // the kernel's ephemeral range
	id, err := a.m.Connect(now, &cm.ConnectParams{Peer: peer, Local: local, ServiceID: cm.ServiceIDTCP(port),
		QPN: qp.QPN(), StartingPSN: a.rng.Uint32() & 0xFFFFFF, PathMTU: cm.MTUEnum(a.pmtu),
		ResponderResources: p.ResponderResources, InitiatorDepth: p.InitiatorDepth,
		RetryCount: or7(p.RetryCount), RNRRetry: or7(p.RNRRetry),
		RDMACM: true, SrcPort: sport, FlowLabel: RoCEFlowLabel(sport, port), PrivateData: p.PrivateData})
	if err != nil {
		a.mu.Unlock()
		return nil, err
	}
	c.id = id
	a.ev.forgetLocked(id)
	a.conns[id] = c
	a.byQPN[qp.QPN()] = c
	a.flushLocked(now)
	a.mu.Unlock()
	a.wake()
	if err := c.wait(ctx); err != nil {
		return nil, err
	}
	// The agent wakes us while it acts on the REP, and posts the RTU in
	// the same flush, under a.mu: wait for that flush, so that the
	// caller's first SEND is posted after the RTU (and follows it on the
	// wire, as with the kernel's CM) rather than racing it.
	a.mu.Lock()
	a.mu.Unlock() //nolint:staticcheck // an empty critical section: a barrier
	return c, nil
}

// RoCEFlowLabel is the flow label the kernel's rdma_cm puts in the path of
// an IPv4 RoCE connection (cma_get_roce_udp_flow_label): a hash of the
// rdma_cm ports. It travels in the REQ, and the UDP source port of the
// connection's packets derives from it on both sides.
func RoCEFlowLabel(sport, dport uint16) uint32 {
	return (uint32(sport)*31 + uint32(dport)) & 0xFFFFF
}

// listener receives connection requests for one port.
type listener struct {
	agent   *Agent
	port    uint16
	backlog chan *request
	closed  bool
	stop    chan struct{}
}

// Listen listens on port (rdma_cm TCP port space: service ID
// 0x0000000001060000 | port). REQs for it wait in a backlog of backlog
// entries (16 if 0) until GetRequest takes them; a REQ finding it full is
// rejected (no resources), one left there longer than the active side
// retries is rejected (timeout) by the CM.
func (a *Agent) Listen(port uint16, backlog int) (Listener, error) {
	if backlog <= 0 {
		backlog = 16
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil, ErrClosed
	}
	if a.listeners[port] != nil {
		return nil, ErrListening
	}
	if err := a.m.Listen(cm.ServiceIDTCP(port), cm.ListenOptions{RDMACM: true}); err != nil {
		return nil, err
	}
	l := &listener{agent: a, port: port, backlog: make(chan *request, backlog), stop: make(chan struct{})}
	a.listeners[port] = l
	return l, nil
}

func (l *listener) closeLocked() {
	if !l.closed {
		l.closed = true
		close(l.stop)
	}
}

// Close stops listening; requests not yet taken are rejected.
func (l *listener) Close() error {
	a := l.agent
	a.mu.Lock()
	defer a.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closeLocked()
	if a.listeners[l.port] == l {
		delete(a.listeners, l.port)
		_ = a.m.Unlisten(cm.ServiceIDTCP(l.port)) // registered with the listener: it cannot fail
	}
	now := a.cfg.Now()
	for {
		select {
		case r := <-l.backlog:
			_ = a.m.Reject(now, r.id, cm.RejConsumerDefined, nil) // fails only for a request that has timed out
		default:
			a.flushLocked(now)
			return nil
		}
	}
}

// request is a connection request waiting for Accept or Reject
// (RDMA_CM_EVENT_CONNECT_REQUEST).
type request struct {
	agent   *Agent
	l       *listener
	id      cm.ConnID
	peer    netip.Addr
	attr    cm.QPAttr
	cma     cm.CMAHeader
	private []byte
}

func (r *request) Peer() netip.Addr    { return r.peer }
func (r *request) SrcPort() uint16     { return r.cma.SrcPort }
func (r *request) PrivateData() []byte { return r.private }

// GetRequest waits for the next connection request.
func (l *listener) GetRequest(ctx context.Context) (Request, error) {
	select {
	case r := <-l.backlog:
		return r, nil
	case <-l.stop:
		return nil, ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// ErrRequestExpired is a Request accepted or rejected too late: the CM has
// already refused it (REJ timeout) because the active side gave up.
var ErrRequestExpired = errors.New("rdmacm: connection request expired")

// pendingLocked reports whether r still waits for an answer.
func (r *request) pendingLocked() bool {
	s := r.agent.m.State(r.id)
	return s == cm.StateREQRcvd || s == cm.StateMRAREQSent
}

// Reject refuses the request (consumer defined, with private data, as
// rdma_reject does).
func (r *request) Reject(private []byte) error {
	a := r.agent
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return ErrClosed
	}
	if !r.pendingLocked() {
		return ErrRequestExpired
	}
	now := a.cfg.Now()
	err := a.m.Reject(now, r.id, cm.RejConsumerDefined, private)
	a.flushLocked(now)
	return err
}

// Accept moves qp to RTR toward the requester and sends the REP; it
// returns once the RTU (or the peer's first packet) arrives, the REP times
// out, or ctx ends.
func (r *request) Accept(ctx context.Context, qp verbs.QP, p *ConnParam) (Conn, error) {
	a := r.agent
	a.mu.Lock()
	pending := r.pendingLocked()
	a.mu.Unlock()
	if !pending {
		return nil, ErrRequestExpired
	}
	if err := a.initQP(qp, p); err != nil {
		a.mu.Lock()
		now := a.cfg.Now()
		_ = a.m.Reject(now, r.id, cm.RejNoQP, nil) // fails only for a request that has timed out
		a.flushLocked(now)
		a.mu.Unlock()
		return nil, err
	}
	c := newConn(a, false, r.peer, qp, p.minRNR())
	c.id = r.id
	c.private = r.private
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil, ErrClosed
	}
	now := a.cfg.Now()
	attr := r.attr
	// Until Accept, MaxDestRdAtomic holds the REQ's initiator depth: what
	// our responder must hold is the smaller of it and ours.
	attr.MaxDestRdAtomic = min(attr.MaxDestRdAtomic, p.ResponderResources)
	// The PSN we receive from, which our REP carries as its Starting PSN:
	// the QP is in RTR with it before the REP goes.
	attr.RQPSN = a.rng.Uint32() & 0xFFFFFF
	if err := a.toRTR(c, &attr); err != nil {
		_ = a.m.Reject(now, r.id, cm.RejNoQP, nil) // fails only for a request that has timed out
		a.flushLocked(now)
		a.mu.Unlock()
		return nil, err
	}
	err := a.m.Accept(now, r.id, &cm.AcceptParams{QPN: qp.QPN(), StartingPSN: attr.RQPSN,
		ResponderResources: p.ResponderResources, InitiatorDepth: p.InitiatorDepth,
		RNRRetry: or7(p.RNRRetry), PrivateData: p.PrivateData})
	if err != nil {
		a.mu.Unlock()
		if errors.Is(err, cm.ErrNoConn) || errors.Is(err, cm.ErrBadState) {
			err = ErrRequestExpired // it timed out while the QP was made
		}
		return nil, err
	}
	a.conns[r.id] = c
	a.byQPN[qp.QPN()] = c
	a.flushLocked(now)
	a.mu.Unlock()
	a.wake()
	if err := c.wait(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

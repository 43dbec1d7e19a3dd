package rdmacm

import (
	"context"
	"errors"
	"net/netip"
	"sync"

	"github.com/softrnic/softrnic/cm"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/rnic"
)

// ConnParams describe the RC QP of a connection and what the CM
// negotiates for it (rdma_create_qp's attributes and rdma_conn_param).
type ConnParams struct {
	PD             *rnic.PD
	SendCQ, RecvCQ *rnic.CQ
	MaxSendWR      int // 0: rnic.DefaultDepth
	MaxRecvWR      int
	MaxSGE         int
	MaxInline      int
	// Access is what the peer may do to our memory through the QP.
	Access ib.Access
	// ResponderResources: RDMA READ/atomics the peer may have outstanding
	// at our QP; InitiatorDepth: those we may have outstanding at its.
	ResponderResources, InitiatorDepth uint8
	// RetryCount and RNRRetry of the peer's QP toward us (active side: both
	// go in the REQ; passive side: RNRRetry goes in the REP). 0 means 7,
	// what rdma_cm applications use.
	RetryCount, RNRRetry uint8
	// MinRNRTimer of our QP (0: DefaultMinRNRTimer).
	MinRNRTimer uint8
	// PrivateData goes in the REQ (after the rdma_cm header, at most
	// cm.CMAUserSize bytes) or the REP (at most cm.REPPrivateSize).
	PrivateData []byte
	// Setup, if set, is called with the QP in INIT before the CM exchange
	// goes on: post receives there, so that the peer's first SEND, which
	// may come right after the REP or RTU, finds one.
	Setup func(*rnic.QP) error
}

func (p *ConnParams) createQP() (*rnic.QP, error) {
	if p.PD == nil || p.SendCQ == nil || p.RecvCQ == nil {
		return nil, errors.New("rdmacm: ConnParams needs a PD and CQs")
	}
	q, err := p.PD.CreateQP(rnic.QPInitAttr{Type: ib.RC, SendCQ: p.SendCQ, RecvCQ: p.RecvCQ,
		MaxSendWR: p.MaxSendWR, MaxRecvWR: p.MaxRecvWR, MaxSGE: p.MaxSGE, MaxInline: p.MaxInline})
	if err != nil {
		return nil, err
	}
	if err := q.Modify(&ib.QPAttr{State: ib.Init, Port: 1, Access: p.Access},
		ib.AttrState|ib.AttrPKeyIndex|ib.AttrPort|ib.AttrAccessFlags); err != nil {
		q.Destroy()
		return nil, err
	}
	if p.Setup != nil {
		if err := p.Setup(q); err != nil {
			q.Destroy()
			return nil, err
		}
	}
	return q, nil
}

func or7(v uint8) uint8 {
	if v == 0 {
		return 7
	}
	return min(v, 7)
}

func (p *ConnParams) minRNR() uint8 {
	if p.MinRNRTimer == 0 {
		return DefaultMinRNRTimer
	}
	return min(p.MinRNRTimer, 31)
}

// Conn is one RC connection: its QP is connected (RTS) once Dial or Accept
// returns it.
type Conn struct {
	agent   *Agent
	id      cm.ConnID
	active  bool
	peer    netip.Addr
	qp      *rnic.QP
	minRNR  uint8
	private []byte

	// Guarded by agent.mu.
	result      chan error // one value: nil when established, or why not
	settled     bool
	established bool
	done        chan struct{}
	err         error
	finished    bool
	destroyOnce sync.Once
}

func newConn(a *Agent, active bool, peer netip.Addr, qp *rnic.QP, minRNR uint8) *Conn {
	return &Conn{agent: a, active: active, peer: peer, qp: qp, minRNR: minRNR,
		result: make(chan error, 1), done: make(chan struct{})}
}

// settleLocked gives the Dial or Accept waiting for c its answer, once.
func (c *Conn) settleLocked(err error) {
	if !c.settled {
		c.settled = true
		c.result <- err
	}
}

// finishLocked ends the connection for its user: Done closes, Err says why.
func (c *Conn) finishLocked(err error) {
	c.settleLocked(err)
	if !c.finished {
		c.finished, c.err = true, err
		close(c.done)
	}
}

// QP is the connection's RC QP.
func (c *Conn) QP() *rnic.QP { return c.qp }

// Peer is the remote address (GID).
func (c *Conn) Peer() netip.Addr { return c.peer }

// PrivateData is what the peer sent: the REP's private data on the active
// side, the REQ's (after the rdma_cm header) on the passive side.
func (c *Conn) PrivateData() []byte { return c.private }

// Done is closed when the connection is over: disconnected by either side,
// rejected, or the agent closed.
func (c *Conn) Done() <-chan struct{} { return c.done }

// Err says why Done closed (ErrDisconnected for a normal disconnection).
func (c *Conn) Err() error {
	c.agent.mu.Lock()
	defer c.agent.mu.Unlock()
	return c.err
}

// wait waits for c's answer; on ctx's end it aborts the attempt.
func (c *Conn) wait(ctx context.Context) error {
	select {
	case err := <-c.result:
		return err
	case <-ctx.Done():
		a := c.agent
		a.mu.Lock()
		if !a.closed {
			now := a.cfg.Now()
			a.m.Abort(now, c.id)
			a.flushLocked(now)
		}
		c.finishLocked(ctx.Err())
		a.mu.Unlock()
		return ctx.Err()
	}
}

// Disconnect sends a DREQ (rdma_disconnect) and waits until the peer's
// DREP arrives, the DREQ times out, or ctx ends. The QP goes to the error
// state, flushing the WRs still posted.
func (c *Conn) Disconnect(ctx context.Context) error {
	a := c.agent
	a.mu.Lock()
	if c.finished || a.closed {
		a.mu.Unlock()
		return nil
	}
	now := a.cfg.Now()
	if err := a.m.Disconnect(now, c.id, nil); err != nil {
		a.m.Abort(now, c.id)
	}
	a.flushLocked(now)
	a.mu.Unlock()
	a.wake()
	select {
	case <-c.done:
		// Ended by the peer's DREQ crossing ours: the agent posts our DREP
		// in the flush that woke us. Wait for it (as Dial for the RTU),
		// so that a caller tearing everything down next does not race it.
		a.mu.Lock()
		a.mu.Unlock() //nolint:staticcheck // an empty critical section: a barrier
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close ends the connection without waiting (a DREQ or REJ goes to the
// peer if it is still up) and destroys the QP.
func (c *Conn) Close() error {
	a := c.agent
	a.mu.Lock()
	if !c.finished && !a.closed {
		now := a.cfg.Now()
		a.m.Abort(now, c.id)
		a.flushLocked(now)
		c.finishLocked(ErrDisconnected)
	}
	a.mu.Unlock()
	a.wake()
	c.destroyOnce.Do(c.qp.Destroy)
	return nil
}

// Dial connects to port (rdma_cm TCP port space) at peer: an RC QP is
// created from p and moved through INIT, RTR and RTS as the REQ, REP and
// RTU go. It returns once the connection is established, the peer rejects
// it (*RejectedError; reason 8 when nobody listens), every REQ retry went
// unanswered (ErrTimeout), or ctx ends.
func (a *Agent) Dial(ctx context.Context, peer netip.Addr, port uint16, p *ConnParams) (*Conn, error) {
	peer = peer.Unmap()
	_, local, err := a.sgid(peer)
	if err != nil {
		return nil, err
	}
	if err := a.ensureMAC(ctx, peer); err != nil {
		return nil, err
	}
	qp, err := p.createQP()
	if err != nil {
		return nil, err
	}
	c := newConn(a, true, peer, qp, p.minRNR())
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		qp.Destroy()
		return nil, ErrClosed
	}
	now := a.cfg.Now()
	sport := uint16(32768 + a.rng.IntN(28232)) // the kernel's ephemeral range
	id, err := a.m.Connect(now, &cm.ConnectParams{Peer: peer, Local: local, ServiceID: cm.ServiceIDTCP(port),
		QPN: qp.QPN(), StartingPSN: a.rng.Uint32() & 0xFFFFFF, PathMTU: cm.MTUEnum(a.pmtu),
		ResponderResources: p.ResponderResources, InitiatorDepth: p.InitiatorDepth,
		RetryCount: or7(p.RetryCount), RNRRetry: or7(p.RNRRetry),
		RDMACM: true, SrcPort: sport, FlowLabel: roceFlowLabel(sport, port), PrivateData: p.PrivateData})
	if err != nil {
		a.mu.Unlock()
		qp.Destroy()
		return nil, err
	}
	c.id = id
	a.conns[id] = c
	a.byQPN[qp.QPN()] = c
	a.flushLocked(now)
	a.mu.Unlock()
	a.wake()
	if err := c.wait(ctx); err != nil {
		c.destroyOnce.Do(qp.Destroy)
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

// roceFlowLabel is the flow label the kernel's rdma_cm puts in the path of
// an IPv4 RoCE connection (cma_get_roce_udp_flow_label): a hash of the
// rdma_cm ports. It travels in the REQ, and the UDP source port of the
// connection's packets derives from it on both sides.
func roceFlowLabel(sport, dport uint16) uint32 {
	return (uint32(sport)*31 + uint32(dport)) & 0xFFFFF
}

// Listener receives connection requests for one port.
type Listener struct {
	agent   *Agent
	port    uint16
	backlog chan *Request
	closed  bool
	stop    chan struct{}
}

// Listen listens on port (rdma_cm TCP port space: service ID
// 0x0000000001060000 | port). REQs for it wait in a backlog of backlog
// entries (16 if 0) until Accept or GetRequest takes them; a REQ finding it
// full is rejected (no resources), one left there longer than the active
// side retries is rejected (timeout) by the CM.
func (a *Agent) Listen(port uint16, backlog int) (*Listener, error) {
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
	l := &Listener{agent: a, port: port, backlog: make(chan *Request, backlog), stop: make(chan struct{})}
	a.listeners[port] = l
	return l, nil
}

// Port is the port listened on.
func (l *Listener) Port() uint16 { return l.port }

func (l *Listener) closeLocked() {
	if !l.closed {
		l.closed = true
		close(l.stop)
	}
}

// Close stops listening; requests not yet taken are rejected.
func (l *Listener) Close() error {
	a := l.agent
	a.mu.Lock()
	defer a.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closeLocked()
	if a.listeners[l.port] == l {
		delete(a.listeners, l.port)
		a.m.Unlisten(cm.ServiceIDTCP(l.port))
	}
	now := a.cfg.Now()
	for {
		select {
		case r := <-l.backlog:
			a.m.Reject(now, r.id, cm.RejConsumerDefined, nil)
		default:
			a.flushLocked(now)
			return nil
		}
	}
}

// Request is a connection request waiting for Accept or Reject
// (RDMA_CM_EVENT_CONNECT_REQUEST).
type Request struct {
	agent   *Agent
	l       *Listener
	id      cm.ConnID
	peer    netip.Addr
	attr    cm.QPAttr
	cma     cm.CMAHeader
	private []byte
}

// Peer is the requesting side's address.
func (r *Request) Peer() netip.Addr { return r.peer }

// SrcPort is the active side's rdma_cm port.
func (r *Request) SrcPort() uint16 { return r.cma.SrcPort }

// PrivateData is the REQ's user private data.
func (r *Request) PrivateData() []byte { return r.private }

// GetRequest waits for the next connection request.
func (l *Listener) GetRequest(ctx context.Context) (*Request, error) {
	select {
	case r := <-l.backlog:
		return r, nil
	case <-l.stop:
		return nil, ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Accept waits for the next connection request and accepts it with p.
// Requests that expired in the backlog (the CM refused them as timed out:
// the active side had given up) are skipped.
func (l *Listener) Accept(ctx context.Context, p *ConnParams) (*Conn, error) {
	for {
		r, err := l.GetRequest(ctx)
		if err != nil {
			return nil, err
		}
		c, err := r.Accept(ctx, p)
		if errors.Is(err, ErrRequestExpired) {
			continue
		}
		return c, err
	}
}

// ErrRequestExpired is a Request accepted or rejected too late: the CM has
// already refused it (REJ timeout) because the active side gave up.
var ErrRequestExpired = errors.New("rdmacm: connection request expired")

// pendingLocked reports whether r still waits for an answer.
func (r *Request) pendingLocked() bool {
	s := r.agent.m.State(r.id)
	return s == cm.StateREQRcvd || s == cm.StateMRAREQSent
}

// Reject refuses the request (consumer defined, with private data, as
// rdma_reject does).
func (r *Request) Reject(private []byte) error {
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

// Accept creates the QP from p, moves it to RTR toward the requester and
// sends the REP; it returns once the RTU (or the peer's first packet)
// arrives, the REP times out, or ctx ends.
func (r *Request) Accept(ctx context.Context, p *ConnParams) (*Conn, error) {
	a := r.agent
	a.mu.Lock()
	pending := r.pendingLocked()
	a.mu.Unlock()
	if !pending {
		return nil, ErrRequestExpired
	}
	qp, err := p.createQP()
	if err != nil {
		a.mu.Lock()
		now := a.cfg.Now()
		a.m.Reject(now, r.id, cm.RejNoQP, nil)
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
		qp.Destroy()
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
		a.m.Reject(now, r.id, cm.RejNoQP, nil)
		a.flushLocked(now)
		a.mu.Unlock()
		qp.Destroy()
		return nil, err
	}
	err = a.m.Accept(now, r.id, &cm.AcceptParams{QPN: qp.QPN(), StartingPSN: attr.RQPSN,
		ResponderResources: p.ResponderResources, InitiatorDepth: p.InitiatorDepth,
		RNRRetry: or7(p.RNRRetry), PrivateData: p.PrivateData})
	if err != nil {
		a.mu.Unlock()
		qp.Destroy()
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
		c.destroyOnce.Do(qp.Destroy)
		return nil, err
	}
	return c, nil
}

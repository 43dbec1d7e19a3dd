package client

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/cm"
	"github.com/softrnic/softrnic/daemon/proto"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/rdmacm"
	"github.com/softrnic/softrnic/verbs"
)

// rdma_cm through the daemon: the daemon runs the CM exchange on its GSI
// QP (QP1), which no client can own, and reports what the peer did as
// events; the Client drives its own QPs with the attributes the events
// carry, as librdmacm does over the kernel. It speaks the daemon's
// event-based rdma_cm operations (proto/ucm.go), the same that softrnic's
// librdmacm.so.1 speaks: one event channel per Client, read by one
// goroutine that hands each event to the call or connection waiting for
// it. No call holds the control connection while the peer answers, so a
// Client serves any number of connection attempts at once, and a ctx
// ending only abandons its own attempt (the daemon refuses it to the
// peer).

var _ rdmacm.CM = (*Client)(nil)

// cmEvents is a Client's event channel and who waits for its events.
type cmEvents struct {
	ch   proto.Handle
	sock *net.UnixConn
	done chan struct{} // closed when the channel ends (the daemon or the Client went away)

	mu        sync.Mutex
	ids       map[proto.Handle]chan proto.UCMEvent
	listeners map[proto.Handle]chan *request
}

// idEvents is how many events of one ID may wait: a connection has a few
// at most (the answer, DISCONNECTED, TIMEWAIT_EXIT, DEVICE_REMOVAL).
const idEvents = 8

// ErrCMClosed is a connection call whose Client or daemon went away.
var ErrCMClosed = errors.New("softrnic: rdma_cm event channel closed (the daemon or the client went away)")

// cmChannel returns the Client's rdma_cm event channel, making it on first
// use.
func (c *Client) cmChannel() (*cmEvents, error) {
	c.cmMu.Lock()
	defer c.cmMu.Unlock()
	if c.cmev != nil {
		return c.cmev, nil
	}
	body, fds, err := c.call(proto.OpUCMCreateChannel, nil, 1)
	if err != nil {
		return nil, err
	}
	var m proto.HandleMsg
	if err := proto.DecodeBody(body, &m); err != nil {
		proto.CloseFDs(fds)
		return nil, err
	}
	f := os.NewFile(uintptr(fds[0]), "ucm-channel")
	fc, err := net.FileConn(f)
	_ = f.Close() // FileConn holds its own descriptor
	if err != nil {
		return nil, err
	}
	e := &cmEvents{ch: m.Handle, sock: fc.(*net.UnixConn), done: make(chan struct{}),
		ids: map[proto.Handle]chan proto.UCMEvent{}, listeners: map[proto.Handle]chan *request{}}
	c.cmev = e
	go e.read(c)
	return e, nil
}

// read hands each event to whoever waits for its ID; a connection request
// becomes a request of its listener.
func (e *cmEvents) read(c *Client) {
	defer close(e.done)
	buf := make([]byte, proto.MaxMessage)
	for {
		n, err := e.sock.Read(buf)
		if err != nil || n == 0 {
			return
		}
		h, body, err := proto.DecodeHeader(buf[:n])
		var ev proto.UCMEvent
		if err != nil || h.Op != proto.OpUCMEvent || proto.DecodeBody(body, &ev) != nil {
			continue
		}
		e.mu.Lock()
		if ev.Event == proto.UCMEventConnectRequest {
			l := e.listeners[ev.Listener]
			var r *request
			if l != nil {
				r = &request{c: c, e: e, ev: ev, evs: make(chan proto.UCMEvent, idEvents)}
				e.ids[ev.ID] = r.evs
			}
			e.mu.Unlock()
			select {
			case l <- r:
				continue
			default:
			}
			// No listener (closed meanwhile) or no room: refused.
			e.forget(ev.ID)
			go func() { _ = c.callHandle(proto.OpUCMDestroyID, ev.ID) }() // best effort: the daemon frees it with the session
			continue
		}
		w := e.ids[ev.ID]
		e.mu.Unlock()
		if w != nil {
			select {
			case w <- ev:
			default: // more than an ID can have: not ours to keep
			}
		}
	}
}

func (e *cmEvents) forget(h proto.Handle) {
	e.mu.Lock()
	delete(e.ids, h)
	e.mu.Unlock()
}

// destroyID ends the daemon's ID h (it refuses or disconnects what it
// holds) and stops its events.
func (c *Client) destroyID(e *cmEvents, h proto.Handle) error {
	e.forget(h)
	return c.callHandle(proto.OpUCMDestroyID, h)
}

// next waits for the next event of an ID.
func (e *cmEvents) next(ctx context.Context, w chan proto.UCMEvent) (proto.UCMEvent, error) {
	select {
	case ev := <-w:
		if ev.Event == proto.UCMEventDeviceRemoval {
			return ev, ErrCMClosed
		}
		return ev, nil
	case <-e.done:
		return proto.UCMEvent{}, ErrCMClosed
	case <-ctx.Done():
		return proto.UCMEvent{}, ctx.Err()
	}
}

// eventErr is a connection's end as rdmacm reports it.
func eventErr(ev *proto.UCMEvent) error {
	switch ev.Event {
	case proto.UCMEventRejected:
		return &rdmacm.RejectedError{Reason: cm.RejectReason(ev.Status), PrivateData: private(&ev.Param)}
	case proto.UCMEventUnreachable:
		if ev.Status == -int32(unix.ETIMEDOUT) {
			return rdmacm.ErrTimeout
		}
		if ev.Status > 0 { // a SIDR status
			return &rdmacm.SIDRError{Status: cm.SIDRStatus(ev.Status), PrivateData: private(&ev.Param)}
		}
		return fmt.Errorf("softrnic: peer unreachable: %w", unix.Errno(-ev.Status))
	default: // not an end of a connection
	}
	return fmt.Errorf("softrnic: unexpected rdma_cm event %d (status %d)", ev.Event, ev.Status)
}

func private(p *proto.UCMConnParam) []byte {
	return append([]byte(nil), p.PrivateData[:min(int(p.PrivateDataLen), len(p.PrivateData))]...)
}

func setPrivate(p *proto.UCMConnParam, b []byte, max int) error {
	if len(b) > max {
		return fmt.Errorf("softrnic: %d bytes of private data, at most %d: %w", len(b), max, cm.ErrPrivateTooBig)
	}
	p.PrivateDataLen = uint8(copy(p.PrivateData[:], b))
	return nil
}

func or7(v uint8) uint8 {
	if v == 0 {
		return 7
	}
	return min(v, 7)
}

func minRNR(p *rdmacm.ConnParam) uint8 {
	if p.MinRNRTimer == 0 {
		return rdmacm.DefaultMinRNRTimer
	}
	return min(p.MinRNRTimer, 31)
}

// ourQP checks that qp is one of c's QPs of type t.
func (c *Client) ourQP(qp verbs.QP, t ib.QPType) (*QP, error) {
	q, ok := qp.(*QP)
	if !ok || q.c != c {
		return nil, fmt.Errorf("softrnic: rdma_cm through a daemon drives a QP of the same client: %w", verbs.ErrOtherDevice)
	}
	if q.typ != t {
		if t == ib.UD {
			return nil, rdmacm.ErrNotUD
		}
		return nil, rdmacm.ErrNotRC
	}
	return q, nil
}

// connQP checks the RC QP a connection will drive and moves it to INIT
// with p's access (from RESET, or again in INIT, keeping its posted
// receives), then waits until the daemon's device holds those receives,
// which the peer's first SENDs must find.
func (c *Client) connQP(ctx context.Context, qp verbs.QP, p *rdmacm.ConnParam) (*QP, error) {
	q, err := c.ourQP(qp, ib.RC)
	if err != nil {
		return nil, err
	}
	if s := q.State(); s != ib.Reset && s != ib.Init {
		return nil, fmt.Errorf("softrnic: QP %#x is in %v, not RESET or INIT: %w", q.qpn, s, unix.EISCONN)
	}
	if err := rdmacm.InitQP(q, p); err != nil {
		return nil, err
	}
	return q, q.SyncRecv(ctx)
}

// sgid is the index of a in the daemon's GID table.
func (c *Client) sgid(a netip.Addr) (uint8, error) {
	for i, g := range c.GIDs() {
		if g == a.Unmap() {
			return uint8(i), nil
		}
	}
	return 0, fmt.Errorf("softrnic: %v is not one of the device's GIDs", a)
}

// toRTS moves q to RTR and RTS toward the peer an event names, receiving
// from rqpsn: what rdma_init_qp_attr gives librdmacm. Our READ/atomic
// depths are at most p's.
func (c *Client) toRTS(q *QP, ev *proto.UCMEvent, peer netip.Addr, rqpsn uint32, retry uint8, p *rdmacm.ConnParam) error {
	idx, err := c.sgid(netip.AddrFrom16(ev.Local))
	if err != nil {
		return err
	}
	mtu := min(cm.MTUBytes(max(ev.PathMTU, 1)), int(c.info.ActiveMTU))
	if err := q.Modify(&ib.QPAttr{State: ib.RTR, PathMTU: uint32(mtu), DestQPN: ev.Param.QPN, RQPSN: rqpsn,
		MaxDestRdAtomic: min(ev.Param.ResponderResources, p.ResponderResources), MinRNRTimer: minRNR(p),
		AV: ib.AddressVector{DGID: ib.GIDFrom(peer), SGIDIndex: idx, HopLimit: ev.HopLimit,
			TrafficClass: ev.TrafficClass, FlowLabel: ev.FlowLabel}},
		ib.AttrState|ib.AttrAV|ib.AttrPathMTU|ib.AttrDestQPN|ib.AttrRQPSN|ib.AttrMaxDestRdAtomic|ib.AttrMinRNRTimer); err != nil {
		return err
	}
	return q.Modify(&ib.QPAttr{State: ib.RTS, SQPSN: ev.Param.StartingPSN, Timeout: ev.ACKTimeout, RetryCnt: retry,
		RNRRetry: ev.Param.RNRRetryCount, MaxRdAtomic: min(ev.Param.InitiatorDepth, p.InitiatorDepth)},
		ib.AttrState|ib.AttrSQPSN|ib.AttrTimeout|ib.AttrRetryCnt|ib.AttrRNRRetry|ib.AttrMaxQPRdAtomic)
}

// ephemeral is an rdma_cm port of the kernel's ephemeral range, for the
// rdma_cm header of our requests.
func ephemeral() uint16 { return uint16(32768 + rand.IntN(28232)) }

// connect sends a REQ or SIDR_REQ; it returns the ID and its events. The
// reader waits meanwhile (e.mu), so that the peer's answer, which may
// reach the event channel before the reply is read here, finds the ID
// watched.
func (c *Client) connect(e *cmEvents, req *proto.UCMConnectReq) (proto.Handle, chan proto.UCMEvent, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	body, _, err := c.call(proto.OpUCMConnect, req, 0)
	if err != nil {
		return 0, nil, err
	}
	var m proto.HandleMsg
	if err := proto.DecodeBody(body, &m); err != nil {
		return 0, nil, err
	}
	w := make(chan proto.UCMEvent, idEvents)
	e.ids[m.Handle] = w
	return m.Handle, w, nil
}

// Connect implements rdmacm.CM: it connects qp, an RC QP of this client,
// to port at peer (the REQ and RTU go through the daemon's CM; the Client
// moves the QP), and returns once the connection is established.
func (c *Client) Connect(ctx context.Context, qp verbs.QP, peer netip.Addr, port uint16, p *rdmacm.ConnParam) (rdmacm.Conn, error) {
	peer = peer.Unmap()
	e, err := c.cmChannel()
	if err != nil {
		return nil, err
	}
	_, local, err := rdmacm.SourceGID(c.GIDs(), peer)
	if err != nil {
		return nil, err
	}
	q, err := c.connQP(ctx, qp, p)
	if err != nil {
		return nil, err
	}
	rqpsn := rand.Uint32() & 0xFFFFFF
	req := proto.UCMConnectReq{Channel: e.ch, Space: proto.PortSpaceTCP, SrcPort: ephemeral(), DstPort: port, QPType: ib.RC,
		PathMTU: cm.MTUEnum(int(c.info.ActiveMTU)), HopLimit: cm.DefaultHopLimit, Local: local.As16(), Peer: peer.As16(),
		Param: proto.UCMConnParam{QPN: q.qpn, StartingPSN: rqpsn, ResponderResources: p.ResponderResources,
			InitiatorDepth: p.InitiatorDepth, RetryCount: or7(p.RetryCount), RNRRetryCount: or7(p.RNRRetry)}}
	if err := setPrivate(&req.Param, p.PrivateData, proto.UCMConnectPrivateData); err != nil {
		return nil, err
	}
	h, w, err := c.connect(e, &req)
	if err != nil {
		return nil, err
	}
	ev, err := e.next(ctx, w)
	if err == nil && ev.Event != proto.UCMEventConnectResponse {
		err = eventErr(&ev)
	}
	if err == nil {
		if err = c.toRTS(q, &ev, peer, rqpsn, or7(p.RetryCount), p); err != nil {
			_, _, _ = c.call(proto.OpUCMReject, &proto.UCMRejectReq{ID: h, Reason: uint16(cm.RejConsumerDefined)}, 0)
		}
	}
	if err == nil {
		err = c.callHandle(proto.OpUCMEstablish, h)
	}
	if err != nil {
		_ = c.destroyID(e, h) // the first error is the one to report
		return nil, err
	}
	return c.newConn(e, h, w, q, peer, private(&ev.Param)), nil
}

// conn is a connection of one of the client's QPs: its ID in the daemon
// and a goroutine that waits for its end.
type conn struct {
	c       *Client
	e       *cmEvents
	h       proto.Handle
	q       *QP
	peer    netip.Addr
	private []byte

	mu       sync.Mutex
	err      error
	finished bool
	done     chan struct{}
	closed   chan struct{} // Close was called
}

func (c *Client) newConn(e *cmEvents, h proto.Handle, w chan proto.UCMEvent, q *QP, peer netip.Addr, private []byte) *conn {
	cn := &conn{c: c, e: e, h: h, q: q, peer: peer, private: private, done: make(chan struct{}), closed: make(chan struct{})}
	go cn.watch(w)
	return cn
}

// watch waits for the connection's end: the peer's DREQ (or the answer to
// ours), a REJ, or the daemon leaving. The QP goes to the error state,
// flushing what is still posted, and the daemon's ID is released.
func (cn *conn) watch(w chan proto.UCMEvent) {
	for {
		ev, err := cn.e.next(context.Background(), w)
		switch {
		case err != nil:
			cn.finish(err, false)
			return
		case ev.Event == proto.UCMEventDisconnected || ev.Event == proto.UCMEventRejected || ev.Event == proto.UCMEventUnreachable:
			cn.finish(rdmacm.ErrDisconnected, true)
			return
		}
		select {
		case <-cn.closed:
			return
		default:
		}
	}
}

func (cn *conn) finish(err error, toErr bool) {
	cn.mu.Lock()
	if cn.finished {
		cn.mu.Unlock()
		return
	}
	cn.finished, cn.err = true, err
	cn.mu.Unlock()
	if toErr {
		_ = cn.q.Modify(&ib.QPAttr{State: ib.Err}, ib.AttrState)
		_ = cn.c.destroyID(cn.e, cn.h)
	}
	close(cn.done)
}

func (cn *conn) QP() verbs.QP          { return cn.q }
func (cn *conn) Peer() netip.Addr      { return cn.peer }
func (cn *conn) PrivateData() []byte   { return cn.private }
func (cn *conn) Done() <-chan struct{} { return cn.done }

// Err says why Done closed (rdmacm.ErrDisconnected for a normal end).
func (cn *conn) Err() error {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	return cn.err
}

// Disconnect sends a DREQ (rdma_disconnect: the QP goes to the error
// state first, flushing what is still posted) and returns once the peer
// answered, the DREQ timed out, or ctx ended.
func (cn *conn) Disconnect(ctx context.Context) error {
	cn.mu.Lock()
	finished := cn.finished
	cn.mu.Unlock()
	if finished {
		return nil
	}
	if err := cn.q.Modify(&ib.QPAttr{State: ib.Err}, ib.AttrState); err != nil {
		return err
	}
	if err := cn.c.callHandle(proto.OpUCMDisconnect, cn.h); err != nil {
		return err
	}
	select {
	case <-cn.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close ends the connection without waiting (the daemon sends a DREQ, or
// a REJ, to the peer if it is still up). The QP stays the application's.
func (cn *conn) Close() error {
	cn.mu.Lock()
	if cn.finished {
		cn.mu.Unlock()
		return nil
	}
	cn.finished, cn.err = true, rdmacm.ErrDisconnected
	cn.mu.Unlock()
	close(cn.closed)
	err := cn.c.destroyID(cn.e, cn.h)
	close(cn.done)
	return err
}

// listener receives the requests of one port, of either port space.
type listener struct {
	c    *Client
	e    *cmEvents
	h    proto.Handle
	reqs chan *request
}

func (c *Client) listen(port uint16, space uint16, backlog int) (*listener, error) {
	e, err := c.cmChannel()
	if err != nil {
		return nil, err
	}
	if backlog <= 0 {
		backlog = 16
	}
	backlog = min(backlog, 1024)
	// Any of the device's addresses, IPv4 and IPv6, as rdmacm's Listen.
	// The reader waits (e.mu) until the listener is known to it.
	e.mu.Lock()
	defer e.mu.Unlock()
	body, _, err := c.call(proto.OpUCMListen, &proto.UCMListenReq{Channel: e.ch, Port: port, Space: space,
		Backlog: uint32(backlog), IPVersion: 6}, 0)
	if err != nil {
		return nil, err
	}
	var m proto.HandleMsg
	if err := proto.DecodeBody(body, &m); err != nil {
		return nil, err
	}
	// The daemon holds the backlog (requests not yet answered); this
	// queue also keeps those that expired before GetRequest took them,
	// hence the room.
	l := &listener{c: c, e: e, h: m.Handle, reqs: make(chan *request, 1024)}
	e.listeners[l.h] = l.reqs
	return l, nil
}

// Listen implements rdmacm.CM: it listens on an rdma_cm port (TCP port
// space) of the daemon's device, on all of its addresses.
func (c *Client) Listen(port uint16, backlog int) (rdmacm.Listener, error) {
	l, err := c.listen(port, proto.PortSpaceTCP, backlog)
	if err != nil {
		return nil, err
	}
	return l, nil
}

// Close stops listening; requests not yet taken are refused.
func (l *listener) Close() error {
	l.e.mu.Lock()
	delete(l.e.listeners, l.h)
	l.e.mu.Unlock()
	err := l.c.destroyID(l.e, l.h)
	for {
		select {
		case r := <-l.reqs:
			if r != nil {
				_ = l.c.destroyID(l.e, r.ev.ID)
			}
		default:
			return err
		}
	}
}

func (l *listener) getRequest(ctx context.Context) (*request, error) {
	select {
	case r := <-l.reqs:
		if r == nil {
			return nil, ErrCMClosed
		}
		return r, nil
	case <-l.e.done:
		return nil, ErrCMClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// GetRequest implements rdmacm.Listener.
func (l *listener) GetRequest(ctx context.Context) (rdmacm.Request, error) {
	r, err := l.getRequest(ctx)
	if err != nil {
		return nil, err
	}
	return r, nil
}

// request is a connection or SIDR request waiting in the daemon.
type request struct {
	c   *Client
	e   *cmEvents
	ev  proto.UCMEvent // the CONNECT_REQUEST
	evs chan proto.UCMEvent

	mu       sync.Mutex
	answered bool
}

// answer claims the request for one answer (EINVAL after the first, as
// the kernel refuses a second rdma_accept), before any QP is touched.
func (r *request) answer() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.answered {
		return fmt.Errorf("softrnic: connection request already answered: %w", unix.EINVAL)
	}
	r.answered = true
	return nil
}

func (r *request) Peer() netip.Addr    { return netip.AddrFrom16(r.ev.Peer).Unmap() }
func (r *request) SrcPort() uint16     { return r.ev.PeerPort }
func (r *request) PrivateData() []byte { return private(&r.ev.Param) }

// Reject refuses the request with private data (rdma_reject).
func (r *request) Reject(private []byte) error {
	req := proto.UCMRejectReq{ID: r.ev.ID, Reason: uint16(cm.RejConsumerDefined)}
	req.PrivateDataLen = uint8(copy(req.PrivateData[:], private))
	if len(private) > len(req.PrivateData) {
		return cm.ErrPrivateTooBig
	}
	if err := r.answer(); err != nil {
		return err
	}
	_, _, err := r.c.call(proto.OpUCMReject, &req, 0)
	if err != nil {
		return err
	}
	return r.c.destroyID(r.e, r.ev.ID)
}

// Accept implements rdmacm.Request: qp, an RC QP of this client, answers
// the request; the Client moves it to RTR and RTS before the REP goes, as
// librdmacm does, and Accept returns once the connection is established.
// A request the active side gave up on meanwhile is
// rdmacm.ErrRequestExpired.
func (r *request) Accept(ctx context.Context, qp verbs.QP, p *rdmacm.ConnParam) (rdmacm.Conn, error) {
	c := r.c
	q, err := c.connQP(ctx, qp, p)
	if err != nil {
		return nil, err
	}
	if err := r.answer(); err != nil {
		return nil, err
	}
	peer := r.Peer()
	rqpsn := rand.Uint32() & 0xFFFFFF
	if err := c.toRTS(q, &r.ev, peer, rqpsn, r.ev.Param.RetryCount, p); err != nil {
		return nil, err
	}
	req := proto.UCMAcceptReq{ID: r.ev.ID, Param: proto.UCMConnParam{QPN: q.qpn, StartingPSN: rqpsn,
		ResponderResources: min(r.ev.Param.ResponderResources, p.ResponderResources),
		InitiatorDepth:     min(r.ev.Param.InitiatorDepth, p.InitiatorDepth), RNRRetryCount: or7(p.RNRRetry)}}
	if err := setPrivate(&req.Param, p.PrivateData, proto.UCMAcceptPrivateData); err != nil {
		return nil, err
	}
	if _, _, err := c.call(proto.OpUCMAccept, &req, 0); err != nil {
		if errors.Is(err, unix.EINVAL) {
			select {
			case ev := <-r.evs: // it timed out, or the peer gave up
				err = fmt.Errorf("%w: %w", rdmacm.ErrRequestExpired, eventErr(&ev))
			default:
			}
		}
		return nil, err
	}
	ev, err := r.e.next(ctx, r.evs)
	if err == nil && ev.Event != proto.UCMEventEstablished {
		err = eventErr(&ev)
	}
	if err != nil {
		_ = q.Modify(&ib.QPAttr{State: ib.Err}, ib.AttrState)
		_ = c.destroyID(r.e, r.ev.ID) // the first error is the one to report
		return nil, err
	}
	return c.newConn(r.e, r.ev.ID, r.evs, q, peer, private(&r.ev.Param)), nil
}

// rdma_cm's UDP port space (RDMA_PS_UDP) through the daemon: SIDR, a
// lookup of a UD QP rather than a connection. The passive side listens
// with ListenUD and answers each request with one of its own UD QPs; the
// active side resolves the port (ResolveUD) and sends to the QPN with the
// Q_Key it learns. Both sides' UD QPs carry rdma_cm's Q_Key (PrepareUD).

// udListener takes SIDR requests through the daemon.
type udListener struct{ *listener }

// ListenUD implements rdmacm.CM: it listens on an rdma_cm port of the UDP
// port space.
func (c *Client) ListenUD(port uint16, backlog int) (rdmacm.UDListener, error) {
	l, err := c.listen(port, proto.PortSpaceUDP, backlog)
	if err != nil {
		return nil, err
	}
	return udListener{l}, nil
}

// GetRequest implements rdmacm.UDListener.
func (l udListener) GetRequest(ctx context.Context) (rdmacm.UDRequest, error) {
	r, err := l.getRequest(ctx)
	if err != nil {
		return nil, err
	}
	return udRequest{r}, nil
}

type udRequest struct{ *request }

// AV is an address vector back to the requester, for an AH (the daemon
// resolves its next hop when the AH is made).
func (r udRequest) AV() (ib.AddressVector, error) {
	idx, err := r.c.sgid(netip.AddrFrom16(r.ev.Local))
	if err != nil {
		return ib.AddressVector{}, err
	}
	return ib.AddressVector{DGID: ib.GIDFrom(r.Peer()), SGIDIndex: idx, HopLimit: cm.DefaultHopLimit}, nil
}

// Accept answers the SIDR request with qp, a UD QP of this client in RTS
// with rdma_cm's Q_Key (PrepareUD): the SIDR_REP names its QPN and that
// Q_Key. Receives the requester's first SENDs need are in the daemon's
// device before the answer goes.
func (r udRequest) Accept(qp verbs.QP, private []byte) error {
	q, err := r.c.ourQP(qp, ib.UD)
	if err != nil {
		return fmt.Errorf("%w: %w", err, unix.EINVAL)
	}
	if err := q.SyncRecv(context.Background()); err != nil {
		return err
	}
	req := proto.UCMAcceptReq{ID: r.ev.ID, QKey: rdmacm.UDPQKey, Param: proto.UCMConnParam{QPN: q.qpn}}
	if err := setPrivate(&req.Param, private, proto.UCMAcceptUDPrivateData); err != nil {
		return err
	}
	if _, _, err := r.c.call(proto.OpUCMAccept, &req, 0); err != nil {
		return err
	}
	return r.c.destroyID(r.e, r.ev.ID)
}

// ResolveUD implements rdmacm.CM: it looks port (UDP port space) up at
// peer through the daemon's CM.
func (c *Client) ResolveUD(ctx context.Context, peer netip.Addr, port uint16, priv []byte) (*rdmacm.UDPeer, error) {
	peer = peer.Unmap()
	e, err := c.cmChannel()
	if err != nil {
		return nil, err
	}
	idx, local, err := rdmacm.SourceGID(c.GIDs(), peer)
	if err != nil {
		return nil, err
	}
	req := proto.UCMConnectReq{Channel: e.ch, Space: proto.PortSpaceUDP, SrcPort: ephemeral(), DstPort: port, QPType: ib.UD,
		HopLimit: cm.DefaultHopLimit, Local: local.As16(), Peer: peer.As16()}
	if err := setPrivate(&req.Param, priv, proto.UCMResolvePrivateData); err != nil {
		return nil, err
	}
	h, w, err := c.connect(e, &req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = c.destroyID(e, h) }()
	ev, err := e.next(ctx, w)
	if err == nil && ev.Event != proto.UCMEventEstablished {
		err = eventErr(&ev)
	}
	if err != nil {
		return nil, err
	}
	return &rdmacm.UDPeer{Addr: peer, QPN: ev.Param.QPN, QKey: ev.QKey, PrivateData: private(&ev.Param),
		AV: ib.AddressVector{DGID: ib.GIDFrom(peer), SGIDIndex: uint8(idx), HopLimit: ev.HopLimit}}, nil
}

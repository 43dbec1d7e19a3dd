package daemon

import (
	"context"
	"encoding/binary"
	"errors"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/daemon/proto"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/rdmacm"
)

// rdma_cm for clients: the daemon's CM agent (Server.cm) runs on the
// device's GSI QP, which no client can own, and drives the client's own
// QPs: ACCEPT and CONNECT name an RC QP the client created (rdma_cm's
// order: create the QP, then connect naming it), a SIDR answer names one
// of its UD QPs. Only the session's own objects can be named.

// cmListener is a listener of either port space.
type cmListener struct {
	rc rdmacm.Listener
	ud rdmacm.UDListener
}

func (l cmListener) Close() error {
	if l.ud != nil {
		return l.ud.Close()
	}
	return l.rc.Close()
}

// cmRequest is a connection request (rc) or a SIDR request (ud).
type cmRequest struct {
	rc rdmacm.Request
	ud rdmacm.UDRequest
}

func (r cmRequest) Reject() error {
	if r.ud != nil {
		return r.ud.Reject(nil)
	}
	return r.rc.Reject(nil)
}

// Sizes of the UDP port space's bodies of CM_ACCEPT and CM_CONNECT (see
// proto.PortSpaceUDP), which tell them from CMConnReq.
var (
	cmUDAcceptSize = binary.Size(proto.CMUDAcceptReq{})
	cmResolveSize  = binary.Size(proto.CMResolveReq{})
)

// errDeferred is returned by an operation whose reply goes later, from its
// own goroutine (a CM exchange waiting for the peer): serve sends nothing.
var errDeferred = errors.New("reply deferred")

// cmTimeout bounds one CM exchange the daemon waits on for a client
// (rdmacm's own REQ/REP retries end sooner).
const cmTimeout = 2 * time.Minute

// agent is the server's CM agent, or an error for the client.
func (ss *session) agent() (rdmacm.CM, error) {
	if ss.s.cm == nil {
		return nil, errf(unix.EOPNOTSUPP, "this daemon runs no rdma_cm agent")
	}
	return ss.s.cm, nil
}

// deferReply runs f in its own goroutine, bounded by the session's life
// and cmTimeout, and sends its result as the reply to h.
func (ss *session) deferReply(h proto.Header, f func(ctx context.Context) (any, []int, error)) (any, []int, error) {
	ss.cmWG.Add(1)
	go func() {
		defer ss.cmWG.Done()
		ctx, cancel := context.WithTimeout(ss.ctx, cmTimeout)
		defer cancel()
		resp, fds, err := f(ctx)
		_ = ss.reply(h, resp, fds, err) // a broken connection ends the session in its loop
	}()
	return nil, nil, errDeferred
}

func (ss *session) cmListen(body []byte) (any, []int, error) {
	var req proto.CMListenReq
	if err := proto.DecodeBody(body, &req); err != nil {
		return nil, nil, err
	}
	a, err := ss.agent()
	if err != nil {
		return nil, nil, err
	}
	if req.Backlog > 1024 {
		return nil, nil, errf(unix.EINVAL, "backlog %d over 1024", req.Backlog)
	}
	var l cmListener
	switch req.Space {
	case proto.PortSpaceTCP:
		l.rc, err = a.Listen(req.Port, int(req.Backlog))
	case proto.PortSpaceUDP:
		l.ud, err = a.ListenUD(req.Port, int(req.Backlog))
	default:
		return nil, nil, errf(unix.EINVAL, "unknown rdma_cm port space %d", req.Space)
	}
	if errors.Is(err, rdmacm.ErrListening) {
		return nil, nil, errf(unix.EADDRINUSE, "rdma_cm port %d: %v", req.Port, err)
	}
	if err != nil {
		return nil, nil, err
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	h, err := ss.newHandle(true)
	if err != nil || ss.closing {
		ss.undo("CM_LISTEN", l.Close())
		if err == nil {
			err = errf(unix.ESHUTDOWN, "connection closing")
		}
		return nil, nil, err
	}
	ss.listeners[h] = l
	return &proto.HandleMsg{Handle: h}, nil, nil
}

func (ss *session) cmUnlisten(body []byte) (any, []int, error) {
	h, err := decodeHandle(body)
	if err != nil {
		return nil, nil, err
	}
	ss.mu.Lock()
	l, ok := ss.listeners[h]
	delete(ss.listeners, h)
	ss.mu.Unlock()
	if !ok {
		return nil, nil, errf(unix.ENOENT, "no listener %d on this connection", h)
	}
	return nil, nil, l.Close()
}

func (ss *session) cmGetRequest(hdr proto.Header, body []byte) (any, []int, error) {
	h, err := decodeHandle(body)
	if err != nil {
		return nil, nil, err
	}
	ss.mu.Lock()
	l, ok := ss.listeners[h]
	ss.mu.Unlock()
	if !ok {
		return nil, nil, errf(unix.ENOENT, "no listener %d on this connection", h)
	}
	return ss.deferReply(hdr, func(ctx context.Context) (any, []int, error) {
		var r cmRequest
		var peer netip.Addr
		var sport uint16
		var err error
		if l.ud != nil {
			if r.ud, err = l.ud.GetRequest(ctx); err == nil {
				peer, sport = r.ud.Peer(), r.ud.SrcPort()
			}
		} else if r.rc, err = l.rc.GetRequest(ctx); err == nil {
			peer, sport = r.rc.Peer(), r.rc.SrcPort()
		}
		if errors.Is(err, context.DeadlineExceeded) {
			return nil, nil, errf(unix.ETIMEDOUT, "no connection request within %v: ask again", cmTimeout)
		}
		if err != nil {
			return nil, nil, err
		}
		ss.mu.Lock()
		defer ss.mu.Unlock()
		rh, err := ss.newHandle(true)
		if err != nil || ss.closing {
			ss.undo("CM_GET_REQUEST", r.Reject())
			if err == nil {
				err = errf(unix.ESHUTDOWN, "connection closing")
			}
			return nil, nil, err
		}
		ss.requests[rh] = r
		return &proto.CMRequestResp{Request: rh, SrcPort: sport, Peer: peer.As16()}, nil, nil
	})
}

func (ss *session) cmReject(body []byte) (any, []int, error) {
	h, err := decodeHandle(body)
	if err != nil {
		return nil, nil, err
	}
	ss.mu.Lock()
	r, ok := ss.requests[h]
	delete(ss.requests, h)
	ss.mu.Unlock()
	if !ok {
		return nil, nil, errf(unix.ENOENT, "no connection request %d on this connection", h)
	}
	return nil, nil, r.Reject()
}

// cmConn is ACCEPT (accept true) and CONNECT: the connection drives the
// session's RC QP the request names, which the CM moves to INIT, RTR and
// RTS; the reply, without a body, goes once the connection is established.
func (ss *session) cmConn(hdr proto.Header, body []byte, accept bool) (any, []int, error) {
	switch {
	case accept && len(body) == cmUDAcceptSize:
		return ss.cmAcceptUD(body)
	case !accept && len(body) == cmResolveSize:
		return ss.cmResolveUD(hdr, body)
	}
	var req proto.CMConnReq
	if err := proto.DecodeBody(body, &req); err != nil {
		return nil, nil, err
	}
	a, err := ss.agent()
	if err != nil {
		return nil, nil, err
	}
	if req.Access&^(ib.LocalWrite|ib.RemoteWrite|ib.RemoteRead|ib.RemoteAtomic) != 0 {
		return nil, nil, errf(unix.EINVAL, "unknown access flags %#x", uint32(req.Access))
	}
	peer := netip.AddrFrom16(req.Peer).Unmap()
	if !accept && !peer.IsValid() {
		return nil, nil, errf(unix.EINVAL, "CONNECT without a peer")
	}
	ss.mu.Lock()
	q, okq := ss.qps[req.QP]
	var r cmRequest
	okr := true
	if accept {
		r, okr = ss.requests[req.Request]
	}
	var refuse error
	switch {
	case !okq:
		refuse = errf(unix.ENOENT, "no QP %d on this connection", req.QP)
	case !okr:
		refuse = errf(unix.ENOENT, "no connection request %d on this connection", req.Request)
	case accept && r.rc == nil:
		refuse = errf(unix.EINVAL, "request %d is a SIDR request: answer it with a UD QP (CMUDAcceptReq)", req.Request)
	case q.typ != ib.RC:
		refuse = errf(unix.EINVAL, "QP %d is %v: rdma_cm connects RC QPs", req.QP, q.typ)
	case q.cmBusy:
		refuse = errf(unix.EBUSY, "QP %d is in another rdma_cm exchange", req.QP)
	case q.conn != nil:
		refuse = errf(unix.EISCONN, "QP %d already has an rdma_cm connection", req.QP)
	}
	if refuse == nil {
		q.cmBusy = true // until the exchange ends: DESTROY_QP waits for it
		if accept {
			delete(ss.requests, req.Request)
		}
	}
	ss.mu.Unlock()
	if refuse != nil {
		return nil, nil, refuse
	}
	p := &rdmacm.ConnParam{Access: req.Access, ResponderResources: req.ResponderResources, InitiatorDepth: req.InitiatorDepth,
		RetryCount: req.RetryCount, RNRRetry: req.RNRRetry, MinRNRTimer: req.MinRNRTimer}
	return ss.deferReply(hdr, func(ctx context.Context) (any, []int, error) {
		var conn rdmacm.Conn
		var err error
		if accept {
			conn, err = r.rc.Accept(ctx, q.qp, p)
		} else {
			conn, err = a.Connect(ctx, q.qp, peer, req.Port, p)
		}
		ss.mu.Lock()
		q.cmBusy = false
		if err == nil {
			q.conn = conn
		}
		ss.mu.Unlock()
		if err != nil {
			var rej *rdmacm.RejectedError
			if errors.As(err, &rej) {
				// The reason goes to the client (proto.RejectReason).
				return nil, nil, errf(unix.ECONNREFUSED, "%s", proto.RejectMsg(uint16(rej.Reason), err.Error()))
			}
			if errors.Is(err, rdmacm.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) {
				return nil, nil, errf(unix.ETIMEDOUT, "%v", err)
			}
			return nil, nil, err
		}
		return nil, nil, nil
	})
}

// cmAcceptUD answers a SIDR request with one of the session's UD QPs:
// only its own, so that a client cannot steer a peer's SENDs to another's
// QP.
func (ss *session) cmAcceptUD(body []byte) (any, []int, error) {
	var req proto.CMUDAcceptReq
	if err := proto.DecodeBody(body, &req); err != nil {
		return nil, nil, err
	}
	ss.mu.Lock()
	r, okr := ss.requests[req.Request]
	isUD := r.ud != nil
	q, okq := ss.qps[req.QP]
	if okr && isUD && okq && q.typ == ib.UD {
		delete(ss.requests, req.Request)
	}
	ss.mu.Unlock()
	switch {
	case !okr:
		return nil, nil, errf(unix.ENOENT, "no connection request %d on this connection", req.Request)
	case !isUD:
		return nil, nil, errf(unix.EINVAL, "request %d is a connection request: accept it with a CMConnReq", req.Request)
	case !okq:
		return nil, nil, errf(unix.ENOENT, "no QP %d on this connection", req.QP)
	case q.typ != ib.UD:
		return nil, nil, errf(unix.EINVAL, "QP %d is not a UD QP", req.QP)
	}
	return nil, nil, r.ud.Accept(q.qp, nil)
}

// cmResolveUD is the SIDR lookup of CM_CONNECT in the UDP port space; the
// reply goes when the peer answered.
func (ss *session) cmResolveUD(hdr proto.Header, body []byte) (any, []int, error) {
	var req proto.CMResolveReq
	if err := proto.DecodeBody(body, &req); err != nil {
		return nil, nil, err
	}
	a, err := ss.agent()
	if err != nil {
		return nil, nil, err
	}
	peer := netip.AddrFrom16(req.Peer).Unmap()
	if !peer.IsValid() || peer.IsUnspecified() {
		return nil, nil, errf(unix.EINVAL, "SIDR lookup without a peer")
	}
	return ss.deferReply(hdr, func(ctx context.Context) (any, []int, error) {
		svc, err := a.ResolveUD(ctx, peer, req.Port, nil)
		if err != nil {
			var se *rdmacm.SIDRError
			if errors.As(err, &se) {
				return nil, nil, errf(unix.ECONNREFUSED, "%s", proto.SIDRMsg(uint8(se.Status), err.Error()))
			}
			if errors.Is(err, rdmacm.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) {
				return nil, nil, errf(unix.ETIMEDOUT, "%v", err)
			}
			return nil, nil, err
		}
		return &proto.CMResolveResp{QPN: svc.QPN, QKey: svc.QKey, Peer: svc.Addr.As16()}, nil, nil
	})
}

func (ss *session) cmDisconnect(hdr proto.Header, body []byte) (any, []int, error) {
	conn, err := ss.takeConn(body, false)
	if err != nil {
		return nil, nil, err
	}
	if conn == nil {
		return nil, nil, errf(unix.EINVAL, "the QP has no rdma_cm connection")
	}
	return ss.deferReply(hdr, func(ctx context.Context) (any, []int, error) {
		return nil, nil, conn.Disconnect(ctx)
	})
}

// takeConn returns the rdma_cm connection of the QP a HandleMsg body names
// (nil if it has none), forgetting it when take is set.
func (ss *session) takeConn(body []byte, take bool) (rdmacm.Conn, error) {
	h, err := decodeHandle(body)
	if err != nil {
		return nil, err
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	q, ok := ss.qps[h]
	if !ok {
		return nil, errf(unix.ENOENT, "no QP %d on this connection", h)
	}
	conn := q.conn
	if take {
		q.conn = nil
	}
	return conn, nil
}

// cmClose ends a QP's connection without waiting for the peer; the QP
// stays the client's. A QP without one is left as it is, as
// rdma_destroy_id leaves an unconnected ID's QP.
func (ss *session) cmClose(body []byte) (any, []int, error) {
	conn, err := ss.takeConn(body, true)
	if err != nil || conn == nil {
		return nil, nil, err
	}
	return nil, nil, conn.Close()
}

// closeCM ends what the session holds of rdma_cm, when its connection
// closes: listeners (their backlogs rejected), requests not answered
// (rejected), and the CM exchanges still waiting (their contexts end).
// Connections go with their QPs (releaseQP closes them: DREQ to the peer).
func (ss *session) closeCM() {
	ss.mu.Lock()
	ss.closing = true
	ls, rs := ss.listeners, ss.requests
	ss.listeners, ss.requests = map[proto.Handle]cmListener{}, map[proto.Handle]cmRequest{}
	ss.mu.Unlock()
	ss.cancel()
	ss.cmWG.Wait()
	for _, l := range ls {
		if err := l.Close(); err != nil {
			ss.log.Warn("closing a listener", "err", err)
		}
	}
	for _, r := range rs {
		if err := r.Reject(); err != nil {
			ss.log.Warn("rejecting a pending request", "err", err)
		}
	}
}

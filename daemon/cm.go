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
	"github.com/softrnic/softrnic/shmring"
)

// CMDevice is a Device whose RNIC runs rdma_cm for the daemon's clients:
// the CM agent on the device's GSI QP (which only the daemon can own)
// connects RC QPs it creates in a client's PD, which the client then uses
// like its others. VerbsDevice is one.
type CMDevice interface {
	CMListen(port uint16, backlog int) (CMListener, error)
	// CMDial connects to port at peer; it returns once established.
	CMDial(ctx context.Context, peer netip.Addr, port uint16, p *CMParams) (QP, CMConn, error)
}

// CMListener receives connection requests for one port.
type CMListener interface {
	GetRequest(ctx context.Context) (CMRequest, error)
	Close() error // requests not taken are rejected
}

// CMRequest is a connection request waiting for an answer.
type CMRequest interface {
	Peer() netip.Addr
	SrcPort() uint16
	// Accept creates the QP, answers and returns once established.
	Accept(ctx context.Context, p *CMParams) (QP, CMConn, error)
	Reject() error
}

// CMConn is an established connection.
type CMConn interface {
	// Disconnect sends a DREQ and waits for the DREP (or its timeout).
	Disconnect(ctx context.Context) error
	// Close aborts without waiting (DREQ or REJ to the peer) and
	// destroys the connection's QP.
	Close() error
}

// UDCMDevice is a CMDevice that also serves rdma_cm's UDP port space
// (RDMA_PS_UDP, SIDR): no connection, a lookup that names a UD QP the
// client made itself. VerbsDevice is one.
type UDCMDevice interface {
	// CMListenUD listens for SIDR requests on port; its requests are
	// CMUDRequests.
	CMListenUD(port uint16, backlog int) (CMListener, error)
	// CMResolveUD looks port up at peer (SIDR_REQ, SIDR_REP).
	CMResolveUD(ctx context.Context, peer netip.Addr, port uint16) (UDService, error)
}

// UDService is a peer's answer to a SIDR lookup: its UD QP and the Q_Key
// to send to it with.
type UDService struct {
	Addr      netip.Addr
	QPN, QKey uint32
}

// CMUDRequest is a SIDR request: answered with a UD QP of the session
// (AcceptUD) or refused (Reject). Its Accept, which would create an RC QP,
// fails.
type CMUDRequest interface {
	CMRequest
	AcceptUD(qp QP) error
}

// Sizes of the UDP port space's bodies of CM_ACCEPT and CM_CONNECT (see
// proto.PortSpaceUDP), which tell them from CMConnReq.
var (
	cmUDAcceptSize = binary.Size(proto.CMUDAcceptReq{})
	cmResolveSize  = binary.Size(proto.CMResolveReq{})
)

// CMParams is the QP the CM creates for a connection and the
// rdma_conn_param, in the objects of the requesting session.
type CMParams struct {
	PD                 PD
	SendCQ, RecvCQ     CQ
	Caps               proto.QPCaps
	Access             ib.Access
	ResponderResources uint8
	InitiatorDepth     uint8
	RetryCount         uint8
	RNRRetry           uint8
	InitRecv           *proto.RecvWR // posted before the CM exchange goes on
}

// errDeferred is returned by an operation whose reply goes later, from its
// own goroutine (a CM exchange waiting for the peer): serve sends nothing.
var errDeferred = errors.New("reply deferred")

// cmTimeout bounds one CM exchange the daemon waits on for a client
// (rdmacm's own REQ/REP retries end sooner).
const cmTimeout = 2 * time.Minute

// cmDevice is the server's device as a CMDevice, or an error for the client.
func (ss *session) cmDevice() (CMDevice, error) {
	d, ok := ss.s.dev.(CMDevice)
	if !ok {
		return nil, errf(unix.EOPNOTSUPP, "this daemon's device runs no rdma_cm")
	}
	return d, nil
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
		ss.reply(h, resp, fds, err)
	}()
	return nil, nil, errDeferred
}

func (ss *session) cmListen(body []byte) (any, []int, error) {
	var req proto.CMListenReq
	if err := proto.DecodeBody(body, &req); err != nil {
		return nil, nil, err
	}
	d, err := ss.cmDevice()
	if err != nil {
		return nil, nil, err
	}
	if req.Backlog > 1024 {
		return nil, nil, errf(unix.EINVAL, "backlog %d over 1024", req.Backlog)
	}
	var l CMListener
	switch req.Space {
	case proto.PortSpaceTCP:
		l, err = d.CMListen(req.Port, int(req.Backlog))
	case proto.PortSpaceUDP:
		ud, ok := d.(UDCMDevice)
		if !ok {
			return nil, nil, errf(unix.EOPNOTSUPP, "this daemon's device serves no rdma_cm UDP port space")
		}
		l, err = ud.CMListenUD(req.Port, int(req.Backlog))
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
	h, err := ss.newHandle()
	if err != nil || ss.closing {
		l.Close()
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
		r, err := l.GetRequest(ctx)
		if errors.Is(err, context.DeadlineExceeded) {
			return nil, nil, errf(unix.ETIMEDOUT, "no connection request within %v: ask again", cmTimeout)
		}
		if err != nil {
			return nil, nil, err
		}
		ss.mu.Lock()
		defer ss.mu.Unlock()
		rh, err := ss.newHandle()
		if err != nil || ss.closing {
			r.Reject()
			if err == nil {
				err = errf(unix.ESHUTDOWN, "connection closing")
			}
			return nil, nil, err
		}
		ss.requests[rh] = r
		return &proto.CMRequestResp{Request: rh, SrcPort: r.SrcPort(), Peer: r.Peer().As16()}, nil, nil
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

// cmConn is ACCEPT (accept true) and CONNECT: the QP's objects are the
// session's own, checked as CREATE_QP checks them; the reply, once the
// connection is established, is CREATE_QP's.
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
	d, err := ss.cmDevice()
	if err != nil {
		return nil, nil, err
	}
	c, err := ss.normCaps(req.Caps)
	if err != nil {
		return nil, nil, err
	}
	if req.Access&^(ib.LocalWrite|ib.RemoteWrite|ib.RemoteRead|ib.RemoteAtomic) != 0 {
		return nil, nil, errf(unix.EINVAL, "unknown access flags %#x", uint32(req.Access))
	}
	ss.mu.Lock()
	p, okp := ss.pds[req.PD]
	scq, oks := ss.cqs[req.SendCQ]
	rcq, okr := ss.cqs[req.RecvCQ]
	var r CMRequest
	okq := true
	if accept {
		r, okq = ss.requests[req.Request]
		delete(ss.requests, req.Request)
	}
	if okp && oks && okr && okq {
		// Held until the QP is installed (or the attempt fails), so that
		// the client cannot free them under the CM exchange.
		p.refs++
		scq.refs++
		rcq.refs++
	}
	ss.mu.Unlock()
	switch {
	case !okp:
		return nil, nil, errf(unix.ENOENT, "no PD %d on this connection", req.PD)
	case !oks:
		return nil, nil, errf(unix.ENOENT, "no CQ %d on this connection", req.SendCQ)
	case !okr:
		return nil, nil, errf(unix.ENOENT, "no CQ %d on this connection", req.RecvCQ)
	case !okq:
		return nil, nil, errf(unix.ENOENT, "no connection request %d on this connection", req.Request)
	}
	cp := &CMParams{PD: p.pd, SendCQ: scq.cq, RecvCQ: rcq.cq, Caps: c, Access: req.Access,
		ResponderResources: req.ResponderResources, InitiatorDepth: req.InitiatorDepth, RetryCount: req.RetryCount, RNRRetry: req.RNRRetry}
	if req.HasInitRecv != 0 {
		cp.InitRecv = &proto.RecvWR{ID: req.InitRecvID, SG: []proto.SGE{req.InitRecv}}
	}
	unref := func() {
		ss.mu.Lock()
		p.refs--
		scq.refs--
		rcq.refs--
		ss.mu.Unlock()
	}
	peer := netip.AddrFrom16(req.Peer).Unmap()
	if !accept && !peer.IsValid() {
		unref()
		return nil, nil, errf(unix.EINVAL, "CONNECT without a peer")
	}
	return ss.deferReply(hdr, func(ctx context.Context) (any, []int, error) {
		defer unref()
		var qp QP
		var conn CMConn
		var err error
		if accept {
			qp, conn, err = r.Accept(ctx, cp)
		} else {
			qp, conn, err = d.CMDial(ctx, peer, req.Port, cp)
		}
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
		return ss.installQP(p, scq, rcq, proto.RC, c, qp, conn)
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
	ur, isUD := r.(CMUDRequest)
	q, okq := ss.qps[req.QP]
	if okr && isUD && okq && q.typ == proto.UD {
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
	case q.typ != proto.UD:
		return nil, nil, errf(unix.EINVAL, "QP %d is not a UD QP", req.QP)
	}
	return nil, nil, ur.AcceptUD(q.qp)
}

// cmResolveUD is the SIDR lookup of CM_CONNECT in the UDP port space; the
// reply goes when the peer answered.
func (ss *session) cmResolveUD(hdr proto.Header, body []byte) (any, []int, error) {
	var req proto.CMResolveReq
	if err := proto.DecodeBody(body, &req); err != nil {
		return nil, nil, err
	}
	d, err := ss.cmDevice()
	if err != nil {
		return nil, nil, err
	}
	ud, ok := d.(UDCMDevice)
	if !ok {
		return nil, nil, errf(unix.EOPNOTSUPP, "this daemon's device serves no rdma_cm UDP port space")
	}
	peer := netip.AddrFrom16(req.Peer).Unmap()
	if !peer.IsValid() || peer.IsUnspecified() {
		return nil, nil, errf(unix.EINVAL, "SIDR lookup without a peer")
	}
	return ss.deferReply(hdr, func(ctx context.Context) (any, []int, error) {
		svc, err := ud.CMResolveUD(ctx, peer, req.Port)
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
	h, err := decodeHandle(body)
	if err != nil {
		return nil, nil, err
	}
	q, err := ss.lookupQP(h)
	if err != nil {
		return nil, nil, err
	}
	if q.conn == nil {
		return nil, nil, errf(unix.EINVAL, "QP %d has no rdma_cm connection", h)
	}
	return ss.deferReply(hdr, func(ctx context.Context) (any, []int, error) {
		return nil, nil, q.conn.Disconnect(ctx)
	})
}

// closeCM ends what the session holds of rdma_cm, when its connection
// closes: listeners (their backlogs rejected), requests not answered
// (rejected), and the CM exchanges still waiting (their contexts end).
// Connections go with their QPs (releaseQP closes them: DREQ to the peer).
func (ss *session) closeCM() {
	ss.mu.Lock()
	ss.closing = true
	ls, rs := ss.listeners, ss.requests
	ss.listeners, ss.requests = map[proto.Handle]CMListener{}, map[proto.Handle]CMRequest{}
	ss.mu.Unlock()
	ss.cancel()
	ss.cmWG.Wait()
	for _, l := range ls {
		l.Close()
	}
	for _, r := range rs {
		r.Reject()
	}
}

// installQP makes a QP the device created (a CM connection's) the
// session's, with its rings, as CREATE_QP does, and returns CREATE_QP's
// reply. On failure, or when the session is closing, the QP and its
// connection are released.
func (ss *session) installQP(p *pdObj, scq, rcq *cqObj, typ proto.QPType, c proto.QPCaps, qp QP, conn CMConn) (any, []int, error) {
	fail := func(err error) (any, []int, error) {
		if conn != nil {
			conn.Close()
		}
		qp.Destroy()
		return nil, nil, err
	}
	sqSlots, rqSlots := c.MaxSendWR, c.MaxRecvWR
	sq, err := shmring.Create("softrnic-sq", shmring.Geometry{SlotSize: proto.SendSlotSize(c), Slots: int(sqSlots)})
	if err != nil {
		return fail(err)
	}
	rq, err := shmring.Create("softrnic-rq", shmring.Geometry{SlotSize: proto.RecvSlotSize(c), Slots: int(rqSlots)})
	if err != nil {
		sq.Close()
		return fail(err)
	}
	q := &qpObj{owner: ss, qp: qp, typ: typ, pd: p, send: scq, recv: rcq, sq: sq, rq: rq, conn: conn,
		sqc: sq.Consumer(), rqc: rq.Consumer(),
		swr: proto.SendWR{SG: make([]proto.SGE, 0, c.MaxSendSGE)}, rwr: proto.RecvWR{SG: make([]proto.SGE, 0, c.MaxRecvSGE)}}
	ss.mu.Lock()
	h, err := ss.newHandle()
	if err == nil && ss.closing {
		err = errf(unix.ESHUTDOWN, "connection closing")
	}
	if err == nil {
		ss.qps[h] = q
		ss.liveQPs++
		p.refs++
		scq.refs++
		rcq.refs++
	}
	ss.mu.Unlock()
	if err != nil {
		sq.Close()
		rq.Close()
		return fail(err)
	}
	ss.s.ringsMu.Lock()
	ss.s.qpList = append(ss.s.qpList, q)
	ss.s.ringsMu.Unlock()
	return &proto.CreateQPResp{QP: h, QPN: qp.QPN(), SQSlots: sqSlots, RQSlots: rqSlots, Caps: c}, []int{sq.FD(), rq.FD()}, nil
}

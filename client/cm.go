package client

import (
	"errors"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/daemon/proto"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/shmring"
)

// rdma_cm through the daemon: the connection manager runs on the daemon's
// GSI QP (QP1), which no client can own, and connects RC QPs it creates in
// the client's PD; the client then uses them like its own. The calls that
// wait for the peer (GetRequest, Accept, Connect, Disconnect) hold this
// Client's control connection until the CM exchange is over (at most two
// minutes): use a Client per concurrent connection attempt.

// Listener receives rdma_cm connection requests for one port.
type Listener struct {
	c *Client
	h proto.Handle
}

// Listen listens on an rdma_cm port (TCP port space) of the daemon's
// device; at most backlog requests (16 if 0) wait for GetRequest.
func (c *Client) Listen(port uint16, backlog int) (*Listener, error) {
	body, _, err := c.call(proto.OpCMListen, &proto.CMListenReq{Port: port, Backlog: uint32(max(backlog, 0))}, 0)
	if err != nil {
		return nil, err
	}
	var m proto.HandleMsg
	if err := proto.DecodeBody(body, &m); err != nil {
		return nil, err
	}
	return &Listener{c: c, h: m.Handle}, nil
}

// Close stops listening; requests not yet taken are rejected.
func (l *Listener) Close() error { return l.c.callHandle(proto.OpCMUnlisten, l.h) }

// Request is a connection request to Accept or Reject.
type Request struct {
	c       *Client
	h       proto.Handle
	Peer    netip.Addr // the requester's address (GID)
	SrcPort uint16     // the requester's rdma_cm port
}

// GetRequest waits for the next connection request.
func (l *Listener) GetRequest() (*Request, error) {
	body, _, err := l.c.call(proto.OpCMGetRequest, &proto.HandleMsg{Handle: l.h}, 0)
	if err != nil {
		return nil, err
	}
	var r proto.CMRequestResp
	if err := proto.DecodeBody(body, &r); err != nil {
		return nil, err
	}
	return &Request{c: l.c, h: r.Request, Peer: netip.AddrFrom16(r.Peer).Unmap(), SrcPort: r.SrcPort}, nil
}

// Reject refuses the request.
func (r *Request) Reject() error { return r.c.callHandle(proto.OpCMReject, r.h) }

// ConnParams are the RC QP the CM creates for a connection (as CreateQP's
// attributes; the type is RC) and the rdma_conn_param.
type ConnParams struct {
	SendCQ, RecvCQ *CQ
	Caps           proto.QPCaps
	// Access is what the peer may do to this client's memory through the
	// QP.
	Access ib.Access
	// ResponderResources: READs and atomics the peer may have outstanding
	// at our QP; InitiatorDepth: ours at its. RetryCount, RNRRetry: 0 means 7.
	ResponderResources, InitiatorDepth uint8
	RetryCount, RNRRetry               uint8
	// InitRecv, if set (one SGE), is posted on the QP before the CM
	// exchange goes on, so that the peer's first SEND, which may come
	// right after the connection is up, finds it.
	InitRecv *proto.RecvWR
}

func (p *PD) connReq(cp *ConnParams) (proto.CMConnReq, error) {
	if cp.SendCQ == nil || cp.RecvCQ == nil || cp.SendCQ.c != p.c || cp.RecvCQ.c != p.c {
		return proto.CMConnReq{}, errors.New("softrnic: a connection's QP needs send and receive CQs of the same client")
	}
	req := proto.CMConnReq{PD: p.h, SendCQ: cp.SendCQ.h, RecvCQ: cp.RecvCQ.h, Caps: cp.Caps, Access: cp.Access,
		ResponderResources: cp.ResponderResources, InitiatorDepth: cp.InitiatorDepth, RetryCount: cp.RetryCount, RNRRetry: cp.RNRRetry}
	if r := cp.InitRecv; r != nil {
		if len(r.SG) != 1 {
			return req, errors.New("softrnic: the initial receive of a connection takes one SGE")
		}
		req.HasInitRecv, req.InitRecvID, req.InitRecv = 1, r.ID, r.SG[0]
	}
	return req, nil
}

// Accept accepts the request with a new RC QP in pd and returns it once
// the connection is established, in RTS.
func (r *Request) Accept(pd *PD, cp *ConnParams) (*QP, error) {
	req, err := pd.connReq(cp)
	if err != nil {
		return nil, err
	}
	req.Request = r.h
	return pd.connQP(proto.OpCMAccept, &req)
}

// Connect connects to port at peer with a new RC QP in pd and returns it
// once established, in RTS. A refusal is ECONNREFUSED, no answer
// ETIMEDOUT (errors.Is with unix errnos).
func (p *PD) Connect(peer netip.Addr, port uint16, cp *ConnParams) (*QP, error) {
	req, err := p.connReq(cp)
	if err != nil {
		return nil, err
	}
	req.Peer, req.Port = peer.As16(), port
	return p.connQP(proto.OpCMConnect, &req)
}

// connQP sends ACCEPT or CONNECT and maps the QP of the reply (as CreateQP).
func (p *PD) connQP(op proto.Op, req *proto.CMConnReq) (*QP, error) {
	body, fds, err := p.c.call(op, req, 2)
	if err != nil {
		return nil, err
	}
	var r proto.CreateQPResp
	if err := proto.DecodeBody(body, &r); err != nil {
		proto.CloseFDs(fds)
		return nil, err
	}
	q, err := p.mapQP(&r, fds, proto.RC)
	if err != nil {
		return nil, err
	}
	q.state = proto.RTS
	q.cm = true
	return q, nil
}

// Disconnect sends a DREQ (rdma_disconnect) and returns when the peer
// answered or the DREQ timed out; the QP is then in the error state, its
// outstanding WRs flushed.
func (q *QP) Disconnect() error {
	if !q.cm {
		return &proto.Error{Op: proto.OpCMDisconnect, Errno: unix.EINVAL, Msg: "the QP has no rdma_cm connection"}
	}
	return q.c.callHandle(proto.OpCMDisconnect, q.h)
}

// mapQP maps the rings of a QP the daemon created and returns it.
func (p *PD) mapQP(r *proto.CreateQPResp, fds []int, typ proto.QPType) (*QP, error) {
	sq, err := shmring.Map(fds[0], shmring.Geometry{SlotSize: proto.SendSlotSize(r.Caps), Slots: int(r.SQSlots)})
	if err != nil {
		unix.Close(fds[1])
		p.c.callHandle(proto.OpDestroyQP, r.QP)
		return nil, err
	}
	rq, err := shmring.Map(fds[1], shmring.Geometry{SlotSize: proto.RecvSlotSize(r.Caps), Slots: int(r.RQSlots)})
	if err != nil {
		sq.Close()
		p.c.callHandle(proto.OpDestroyQP, r.QP)
		return nil, err
	}
	return &QP{c: p.c, h: r.QP, QPN: r.QPN, Type: typ, Caps: r.Caps, sq: sq, rq: rq,
		sqp: sq.Producer(p.c.db), rqp: rq.Producer(p.c.db)}, nil
}

// rdma_cm's UDP port space (RDMA_PS_UDP) through the daemon: SIDR, a
// lookup of a UD QP rather than a connection. The passive side listens
// with ListenUD and answers each request with one of its own UD QPs
// (AcceptUD); the active side resolves the port (ResolveUD) and sends to
// the QPN with the Q_Key it learns. Both sides' UD QPs carry rdma_cm's
// Q_Key, 0x01234567 (the kernel's RDMA_UDP_QKEY).

// ListenUD listens on an rdma_cm port of the UDP port space; at most
// backlog SIDR requests (16 if 0) wait for GetRequest, whose requests are
// answered with AcceptUD or Reject.
func (c *Client) ListenUD(port uint16, backlog int) (*Listener, error) {
	body, _, err := c.call(proto.OpCMListen, &proto.CMListenReq{Port: port, Space: proto.PortSpaceUDP, Backlog: uint32(max(backlog, 0))}, 0)
	if err != nil {
		return nil, err
	}
	var m proto.HandleMsg
	if err := proto.DecodeBody(body, &m); err != nil {
		return nil, err
	}
	return &Listener{c: c, h: m.Handle}, nil
}

// AcceptUD answers a SIDR request (from a ListenUD listener) with qp, a
// UD QP of this client: the SIDR_REP names its QPN and rdma_cm's Q_Key.
// Receives the requester's first SENDs need must be in the daemon's RQ
// before (QP.RecvBacklog zero).
func (r *Request) AcceptUD(qp *QP) error {
	if qp == nil || qp.c != r.c {
		return errors.New("softrnic: AcceptUD takes a QP of the request's client")
	}
	_, _, err := r.c.call(proto.OpCMAccept, &proto.CMUDAcceptReq{Request: r.h, QP: qp.h}, 0)
	return err
}

// UDService is what a SIDR lookup tells: the peer's UD QP and the Q_Key
// to send to it with.
type UDService struct {
	Addr netip.Addr
	QPN  uint32
	QKey uint32
}

// ResolveUD looks up port (rdma_cm UDP port space) at peer through the
// daemon's CM. A refusal is ECONNREFUSED (proto.SIDRStatus reads the
// SIDR status), no answer ETIMEDOUT.
func (c *Client) ResolveUD(peer netip.Addr, port uint16) (*UDService, error) {
	body, _, err := c.call(proto.OpCMConnect, &proto.CMResolveReq{Peer: peer.As16(), Port: port}, 0)
	if err != nil {
		return nil, err
	}
	var r proto.CMResolveResp
	if err := proto.DecodeBody(body, &r); err != nil {
		return nil, err
	}
	return &UDService{Addr: netip.AddrFrom16(r.Peer).Unmap(), QPN: r.QPN, QKey: r.QKey}, nil
}

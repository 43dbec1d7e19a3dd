package client

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/cm"
	"github.com/softrnic/softrnic/daemon/proto"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/rdmacm"
	"github.com/softrnic/softrnic/verbs"
)

// rdma_cm through the daemon: the connection manager runs on the daemon's
// GSI QP (QP1), which no client can own, and drives the client's own QPs,
// as librdmacm drives the QP an application created: Connect and Accept
// name an RC QP of this client, a SIDR answer one of its UD QPs.
//
// The calls that wait for the peer (GetRequest, Accept, Connect,
// Disconnect, ResolveUD) hold this Client's control connection until the
// CM exchange is over (at most two minutes): use a Client per concurrent
// connection attempt. The daemon answers them later, so the only way to
// abort one is to close the connection: when ctx ends first, the Client is
// closed (everything it made is released) and the call returns ctx's
// error.

var _ rdmacm.CM = (*Client)(nil)

// callCtx is call bounded by ctx, which closes the Client if it ends
// before the daemon answered.
func (c *Client) callCtx(ctx context.Context, op proto.Op, req any) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { c.Close() })
	body, _, err := c.call(op, req, 0)
	if !stop() && ctx.Err() != nil {
		return nil, fmt.Errorf("softrnic %v: %w (the client was closed)", op, ctx.Err())
	}
	return body, err
}

// cmErr turns the daemon's refusal of a CM exchange into rdmacm's errors:
// a REJ into *rdmacm.RejectedError, a SIDR refusal into *rdmacm.SIDRError,
// no answer into rdmacm.ErrTimeout; errors.Is with the errno works too.
func cmErr(err error) error {
	if r, ok := proto.RejectReason(err); ok {
		return fmt.Errorf("%w: %w", &rdmacm.RejectedError{Reason: cm.RejectReason(r)}, err)
	}
	if st, ok := proto.SIDRStatus(err); ok {
		return fmt.Errorf("%w: %w", &rdmacm.SIDRError{Status: cm.SIDRStatus(st)}, err)
	}
	if errors.Is(err, unix.ETIMEDOUT) {
		return fmt.Errorf("%w: %w", rdmacm.ErrTimeout, err)
	}
	return err
}

// listener is a listener on the daemon's agent, of either port space.
type listener struct {
	c *Client
	h proto.Handle
}

func (c *Client) listen(port uint16, space uint16, backlog int) (*listener, error) {
	body, _, err := c.call(proto.OpCMListen, &proto.CMListenReq{Port: port, Space: space, Backlog: uint32(max(backlog, 0))}, 0)
	if err != nil {
		return nil, err
	}
	var m proto.HandleMsg
	if err := proto.DecodeBody(body, &m); err != nil {
		return nil, err
	}
	return &listener{c: c, h: m.Handle}, nil
}

// Listen implements rdmacm.CM: it listens on an rdma_cm port (TCP port
// space) of the daemon's device.
func (c *Client) Listen(port uint16, backlog int) (rdmacm.Listener, error) {
	l, err := c.listen(port, proto.PortSpaceTCP, backlog)
	if err != nil {
		return nil, err
	}
	return l, nil
}

// Close stops listening; requests not yet taken are rejected.
func (l *listener) Close() error { return l.c.callHandle(proto.OpCMUnlisten, l.h) }

func (l *listener) getRequest(ctx context.Context) (*request, error) {
	body, err := l.c.callCtx(ctx, proto.OpCMGetRequest, &proto.HandleMsg{Handle: l.h})
	if err != nil {
		return nil, err
	}
	var r proto.CMRequestResp
	if err := proto.DecodeBody(body, &r); err != nil {
		return nil, err
	}
	return &request{c: l.c, h: r.Request, peer: netip.AddrFrom16(r.Peer).Unmap(), sport: r.SrcPort}, nil
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
	c     *Client
	h     proto.Handle
	peer  netip.Addr
	sport uint16
}

func (r *request) Peer() netip.Addr { return r.peer }
func (r *request) SrcPort() uint16  { return r.sport }

// PrivateData is empty: the daemon does not pass private data yet.
func (r *request) PrivateData() []byte { return nil }

// Reject refuses the request (without private data: the daemon does not
// pass it yet).
func (r *request) Reject([]byte) error { return r.c.callHandle(proto.OpCMReject, r.h) }

// connReq checks that qp is an RC QP of c and waits until the daemon's
// device holds the receives posted on it, which the peer's first SENDs,
// right after the connection is up, must find.
func (c *Client) connReq(ctx context.Context, qp verbs.QP, p *rdmacm.ConnParam) (*QP, proto.CMConnReq, error) {
	q, ok := qp.(*QP)
	if !ok || q.c != c {
		return nil, proto.CMConnReq{}, fmt.Errorf("softrnic: rdma_cm through a daemon drives a QP of the same client: %w", verbs.ErrOtherDevice)
	}
	if q.typ != ib.RC {
		return nil, proto.CMConnReq{}, rdmacm.ErrNotRC
	}
	if err := q.SyncRecv(ctx); err != nil {
		return nil, proto.CMConnReq{}, err
	}
	return q, proto.CMConnReq{QP: q.h, Access: p.Access, ResponderResources: p.ResponderResources,
		InitiatorDepth: p.InitiatorDepth, RetryCount: p.RetryCount, RNRRetry: p.RNRRetry, MinRNRTimer: p.MinRNRTimer}, nil
}

// Accept implements rdmacm.Request: qp, an RC QP of this client, answers
// the request; it returns once the connection is established.
func (r *request) Accept(ctx context.Context, qp verbs.QP, p *rdmacm.ConnParam) (rdmacm.Conn, error) {
	q, req, err := r.c.connReq(ctx, qp, p)
	if err != nil {
		return nil, err
	}
	req.Request = r.h
	if _, err := r.c.callCtx(ctx, proto.OpCMAccept, &req); err != nil {
		return nil, cmErr(err)
	}
	q.setState(ib.RTS)
	return &conn{q: q, peer: r.peer}, nil
}

// Connect implements rdmacm.CM: it connects qp, an RC QP of this client,
// to port at peer, and returns once the connection is established.
func (c *Client) Connect(ctx context.Context, qp verbs.QP, peer netip.Addr, port uint16, p *rdmacm.ConnParam) (rdmacm.Conn, error) {
	q, req, err := c.connReq(ctx, qp, p)
	if err != nil {
		return nil, err
	}
	req.Peer, req.Port = peer.As16(), port
	if _, err := c.callCtx(ctx, proto.OpCMConnect, &req); err != nil {
		return nil, cmErr(err)
	}
	q.setState(ib.RTS)
	return &conn{q: q, peer: peer.Unmap()}, nil
}

// conn is a connection the daemon's agent established for one of the
// client's QPs.
type conn struct {
	q    *QP
	peer netip.Addr
}

func (c *conn) QP() verbs.QP     { return c.q }
func (c *conn) Peer() netip.Addr { return c.peer }

// PrivateData is empty: the daemon does not pass private data yet.
func (c *conn) PrivateData() []byte { return nil }

// Done is nil: through the daemon the end of a connection shows as the
// QP's error state (the flush completions of its receives).
func (c *conn) Done() <-chan struct{} { return nil }
func (c *conn) Err() error            { return nil }

// Disconnect sends a DREQ (rdma_disconnect) and returns when the peer
// answered or the DREQ timed out; the QP is then in the error state, its
// outstanding WRs flushed.
func (c *conn) Disconnect(ctx context.Context) error {
	_, err := c.q.c.callCtx(ctx, proto.OpCMDisconnect, &proto.HandleMsg{Handle: c.q.h})
	if err == nil {
		c.q.setState(ib.Err)
	}
	return err
}

// Close ends the connection without waiting; the QP stays.
func (c *conn) Close() error { return c.q.c.callHandle(proto.OpCMClose, c.q.h) }

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
	idx, _, err := rdmacm.SourceGID(r.c.GIDs(), r.peer)
	if err != nil {
		return ib.AddressVector{}, err
	}
	return ib.AddressVector{DGID: ib.GIDFrom(r.peer), SGIDIndex: uint8(idx)}, nil
}

// Accept answers the SIDR request with qp, a UD QP of this client: the
// SIDR_REP names its QPN and rdma_cm's Q_Key. Receives the requester's
// first SENDs need are in the daemon's device before the answer goes.
func (r udRequest) Accept(qp verbs.QP, _ []byte) error {
	q, ok := qp.(*QP)
	if !ok || q.c != r.c {
		return fmt.Errorf("softrnic: a SIDR answer names a UD QP of the same client: %w", verbs.ErrOtherDevice)
	}
	if err := q.SyncRecv(context.Background()); err != nil {
		return err
	}
	_, _, err := r.c.call(proto.OpCMAccept, &proto.CMUDAcceptReq{Request: r.h, QP: q.h}, 0)
	return err
}

// ResolveUD implements rdmacm.CM: it looks port (UDP port space) up at
// peer through the daemon's agent.
func (c *Client) ResolveUD(ctx context.Context, peer netip.Addr, port uint16, _ []byte) (*rdmacm.UDPeer, error) {
	peer = peer.Unmap()
	idx, _, err := rdmacm.SourceGID(c.GIDs(), peer)
	if err != nil {
		return nil, err
	}
	body, err := c.callCtx(ctx, proto.OpCMConnect, &proto.CMResolveReq{Peer: peer.As16(), Port: port})
	if err != nil {
		return nil, cmErr(err)
	}
	var r proto.CMResolveResp
	if err := proto.DecodeBody(body, &r); err != nil {
		return nil, err
	}
	addr := netip.AddrFrom16(r.Peer).Unmap()
	return &rdmacm.UDPeer{Addr: addr, QPN: r.QPN, QKey: r.QKey,
		AV: ib.AddressVector{DGID: ib.GIDFrom(addr), SGIDIndex: uint8(idx)}}, nil
}

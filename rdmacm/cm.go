package rdmacm

import (
	"context"
	"errors"
	"net/netip"

	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/verbs"
)

// CM is rdma_cm on an RNIC: the in-process Agent on a device of this
// process, and package client's Client through a softrnic daemon's agent.
// As with librdmacm, a connection drives a QP the application created in
// its own PD (rdma_create_qp, then rdma_connect or rdma_accept naming it):
// the CM moves it to INIT, RTR and RTS as the exchange goes, and the
// application keeps it — closing a connection never destroys its QP.
type CM interface {
	// Listen listens on port of rdma_cm's TCP port space (RC connection
	// requests); at most backlog requests (16 if 0) wait for GetRequest.
	Listen(port uint16, backlog int) (Listener, error)
	// Connect connects qp, an RC QP in RESET or INIT whose receives for
	// the peer's first SENDs are posted, to port at peer; it returns once
	// the connection is established, the peer rejected it
	// (*RejectedError), nobody answered (ErrTimeout), or ctx ended.
	Connect(ctx context.Context, qp verbs.QP, peer netip.Addr, port uint16, p *ConnParam) (Conn, error)
	// ListenUD listens on port of rdma_cm's UDP port space: SIDR
	// lookups, answered with a UD QP.
	ListenUD(port uint16, backlog int) (UDListener, error)
	// ResolveUD looks port (UDP port space) up at peer: its UD QP and
	// Q_Key, a *SIDRError when refused, ErrTimeout when nobody answered.
	ResolveUD(ctx context.Context, peer netip.Addr, port uint16, private []byte) (*UDPeer, error)
}

// Listener receives connection requests for one port.
type Listener interface {
	// GetRequest waits for the next request (RDMA_CM_EVENT_CONNECT_REQUEST).
	GetRequest(ctx context.Context) (Request, error)
	// Close stops listening; requests not yet taken are rejected.
	Close() error
}

// Request is a connection request waiting for Accept or Reject.
type Request interface {
	Peer() netip.Addr // the requesting side's address
	SrcPort() uint16  // its rdma_cm port
	PrivateData() []byte
	// Accept answers with qp (an RC QP in RESET or INIT, receives
	// posted): it returns once the connection is established. A request
	// the active side gave up on meanwhile is ErrRequestExpired.
	Accept(ctx context.Context, qp verbs.QP, p *ConnParam) (Conn, error)
	// Reject refuses the request with private data (rdma_reject).
	Reject(private []byte) error
}

// Conn is an established RC connection.
type Conn interface {
	QP() verbs.QP
	Peer() netip.Addr
	// PrivateData is what the peer sent: the REP's on the active side,
	// the REQ's on the passive side.
	PrivateData() []byte
	// Done is closed when the connection ends by the peer or the CM (the
	// QP then goes to the error state, flushing the receives still
	// posted).
	Done() <-chan struct{}
	// Err says why Done closed (ErrDisconnected for a normal end); nil
	// while the connection is up.
	Err() error
	// Disconnect sends a DREQ and waits for the DREP (or its timeout); the
	// QP goes to the error state, flushing what is still posted.
	Disconnect(ctx context.Context) error
	// Close ends the connection without waiting (DREQ or REJ to the peer
	// if it is still up). The QP stays the application's to destroy.
	Close() error
}

// UDListener takes SIDR requests for one port of the UDP port space.
type UDListener interface {
	GetRequest(ctx context.Context) (UDRequest, error)
	Close() error
}

// UDRequest is a SIDR request waiting for Accept or Reject.
type UDRequest interface {
	Peer() netip.Addr
	SrcPort() uint16
	PrivateData() []byte
	// AV is an address vector back to the requester, for an AH (the
	// kernel builds the same from the SIDR_REQ's path for the passive
	// side).
	AV() (ib.AddressVector, error)
	// Accept answers with qp, a UD QP of the same RNIC ready with
	// PrepareUD (rdma_cm's Q_Key): the SIDR_REP names its QPN.
	Accept(qp verbs.QP, private []byte) error
	Reject(private []byte) error
}

// ConnParam is rdma_conn_param, and the access the connection's QP grants.
type ConnParam struct {
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
}

// UDPeer is what a resolved UD service tells the active side: where to
// send (AV, for an AH), to which QP and with which Q_Key.
type UDPeer struct {
	Addr        netip.Addr
	QPN         uint32
	QKey        uint32
	AV          ib.AddressVector
	PrivateData []byte // the SIDR_REP's
}

// AcceptNext waits on l for the next request and accepts it with a QP from
// newQP, skipping requests that expired while they waited (the QP made for
// one is destroyed). It is a listener's usual loop.
func AcceptNext(ctx context.Context, l Listener, newQP func() (verbs.QP, error), p *ConnParam) (Conn, error) {
	for {
		r, err := l.GetRequest(ctx)
		if err != nil {
			return nil, err
		}
		qp, err := newQP()
		if err != nil {
			return nil, errors.Join(err, r.Reject(nil))
		}
		c, err := r.Accept(ctx, qp, p)
		if errors.Is(err, ErrRequestExpired) {
			if err := qp.Destroy(); err != nil {
				return nil, err
			}
			continue
		}
		if err != nil {
			return nil, errors.Join(err, qp.Destroy())
		}
		return c, nil
	}
}

// PrepareUD moves a freshly created UD QP through INIT, RTR and RTS with
// rdma_cm's Q_Key, as rdma_create_qp does for an RDMA_PS_UDP ID.
func PrepareUD(qp verbs.QP) error {
	if qp.Type() != ib.UD {
		return ErrNotUD
	}
	if err := qp.Modify(&ib.QPAttr{State: ib.Init, Port: 1, QKey: UDPQKey},
		ib.AttrState|ib.AttrPKeyIndex|ib.AttrPort|ib.AttrQKey); err != nil {
		return err
	}
	if err := qp.Modify(&ib.QPAttr{State: ib.RTR}, ib.AttrState); err != nil {
		return err
	}
	return qp.Modify(&ib.QPAttr{State: ib.RTS}, ib.AttrState|ib.AttrSQPSN)
}

// InitQP moves qp, an RC QP in RESET or INIT, to INIT with the access p
// grants: what Connect and Accept do first, for an application that wants
// its receives posted before it calls them (rdma_create_qp's INIT).
func InitQP(qp verbs.QP, p *ConnParam) error {
	if qp.Type() != ib.RC {
		return ErrNotRC
	}
	return qp.Modify(&ib.QPAttr{State: ib.Init, Port: 1, Access: p.Access},
		ib.AttrState|ib.AttrPKeyIndex|ib.AttrPort|ib.AttrAccessFlags)
}

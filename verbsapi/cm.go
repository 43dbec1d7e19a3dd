package verbsapi

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/cm"
	"github.com/softrnic/softrnic/daemon/proto"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/rdmacm"
	"github.com/softrnic/softrnic/rnic"
)

// CM is rdma_cm on an RNIC (RC connections through the CM on QP1): in
// process an rdmacm.Agent on the tool's own device (LocalCM), through the
// daemon the daemon's agent, which connects QPs it creates for the client
// (DaemonCM). Either way the connection's QP is a QP of this package.
type CM interface {
	Listen(port uint16) (Listener, error)
	// Dial connects to port at peer; it returns once established.
	Dial(ctx context.Context, peer netip.Addr, port uint16, p *ConnParams) (Conn, error)
}

// Listener accepts connections on one port.
type Listener interface {
	// Accept waits for the next request and accepts it with p.
	Accept(ctx context.Context, p *ConnParams) (Conn, error)
	Close() error
}

// Conn is an established RC connection.
type Conn interface {
	QP() QP
	Peer() netip.Addr
	// Done is closed when the connection ends by the peer or the CM (nil
	// through the daemon: its QP then goes to the error state, and the
	// flush completions of the receives the tool keeps posted tell).
	Done() <-chan struct{}
	// Disconnect sends a DREQ and waits for the DREP (or its timeout).
	Disconnect(ctx context.Context) error
	// Close aborts if still connected and destroys the QP.
	Close() error
}

// ConnParams are a connection's RC QP and rdma_conn_param.
type ConnParams struct {
	PD                   PD
	SendCQ, RecvCQ       CQ
	MaxSendWR, MaxRecvWR int
	MaxSGE, MaxInline    int
	Access               ib.Access // what the peer may do through the QP
	// ResponderResources, InitiatorDepth: READs and atomics outstanding
	// at our QP and at the peer's. RetryCount, RNRRetry: 0 means 7.
	ResponderResources, InitiatorDepth uint8
	RetryCount, RNRRetry               uint8
	// InitRecv (one SGE), if set, is posted before the CM exchange goes
	// on, so that the peer's first SEND finds it.
	InitRecv *RecvWR
	// MoreRecvs are posted after InitRecv: in process before the CM
	// exchange goes on too; through the daemon (which takes one receive
	// with the CM call) right after the connection is established, before
	// Dial or Accept returns.
	MoreRecvs []RecvWR
}

// LocalCM is rdma_cm through a in-process agent running on dev's device
// (the device of a Local Device).
func LocalCM(a *rdmacm.Agent) CM { return localCM{a} }

type localCM struct{ a *rdmacm.Agent }

func (p *ConnParams) local() (*rdmacm.ConnParams, error) {
	pd, scq, rcq := VerbsPD(p.PD), VerbsCQ(p.SendCQ), VerbsCQ(p.RecvCQ)
	if pd == nil || scq == nil || rcq == nil {
		return nil, errors.New("rnic: LocalCM takes a Local device's PD and CQs")
	}
	cp := &rdmacm.ConnParams{PD: pd, SendCQ: scq, RecvCQ: rcq, MaxSendWR: p.MaxSendWR, MaxRecvWR: p.MaxRecvWR,
		MaxSGE: p.MaxSGE, MaxInline: p.MaxInline, Access: p.Access, ResponderResources: p.ResponderResources,
		InitiatorDepth: p.InitiatorDepth, RetryCount: p.RetryCount, RNRRetry: p.RNRRetry}
	var ws []rnic.RecvWR
	if r := p.InitRecv; r != nil {
		ws = append(ws, rnic.RecvWR{ID: r.ID, SG: append([]ib.SGE(nil), r.SG...)})
	}
	for _, r := range p.MoreRecvs {
		ws = append(ws, rnic.RecvWR{ID: r.ID, SG: append([]ib.SGE(nil), r.SG...)})
	}
	if len(ws) > 0 {
		cp.Setup = func(q *rnic.QP) error {
			for _, w := range ws {
				if _, err := q.PostRecv(w); err != nil {
					return err
				}
			}
			return nil
		}
	}
	return cp, nil
}

func (c localCM) Listen(port uint16) (Listener, error) {
	l, err := c.a.Listen(port, 0)
	if err != nil {
		return nil, err
	}
	return localListener{l}, nil
}

func (c localCM) Dial(ctx context.Context, peer netip.Addr, port uint16, p *ConnParams) (Conn, error) {
	cp, err := p.local()
	if err != nil {
		return nil, err
	}
	conn, err := c.a.Dial(ctx, peer, port, cp)
	if err != nil {
		return nil, err
	}
	return &localConn{c: conn, qp: LocalQP(p.PD, conn.QP())}, nil
}

type localListener struct{ l *rdmacm.Listener }

func (l localListener) Close() error { return l.l.Close() }

func (l localListener) Accept(ctx context.Context, p *ConnParams) (Conn, error) {
	cp, err := p.local()
	if err != nil {
		return nil, err
	}
	conn, err := l.l.Accept(ctx, cp)
	if err != nil {
		return nil, err
	}
	return &localConn{c: conn, qp: LocalQP(p.PD, conn.QP())}, nil
}

type localConn struct {
	c  *rdmacm.Conn
	qp QP
}

func (c *localConn) QP() QP                               { return c.qp }
func (c *localConn) Peer() netip.Addr                     { return c.c.Peer() }
func (c *localConn) Done() <-chan struct{}                { return c.c.Done() }
func (c *localConn) Disconnect(ctx context.Context) error { return c.c.Disconnect(ctx) }
func (c *localConn) Close() error                         { return c.c.Close() }

// DaemonCM is rdma_cm through the daemon of dev (a Daemon device): the
// daemon's agent makes the connections' QPs in dev's PDs. Each waiting call
// (Accept, Dial, Disconnect) holds the client's control connection until
// its CM exchange is over. The end of ctx cannot cut one exchange short in
// the protocol: it closes the client's connection instead, which aborts
// the exchange in the daemon and frees everything the client made there
// (a tool waiting for a peer is ending anyway).
func DaemonCM(dev Device) (CM, error) {
	d, ok := dev.(*daemonDev)
	if !ok {
		return nil, errors.New("rnic: DaemonCM takes a Daemon device")
	}
	return daemonCM{d}, nil
}

type daemonCM struct{ d *daemonDev }

func (p *ConnParams) daemon() (*client.PD, *client.ConnParams, error) {
	pd, ok1 := p.PD.(*daemonPD)
	scq, ok2 := p.SendCQ.(daemonCQ)
	rcq, ok3 := p.RecvCQ.(daemonCQ)
	if !ok1 || !ok2 || !ok3 {
		return nil, nil, errors.New("rnic: DaemonCM takes a Daemon device's PD and CQs")
	}
	sge := uint32(max(p.MaxSGE, 1))
	cp := &client.ConnParams{SendCQ: scq.cq, RecvCQ: rcq.cq, Access: p.Access,
		Caps: proto.QPCaps{MaxSendWR: uint32(max(p.MaxSendWR, 1)), MaxRecvWR: uint32(max(p.MaxRecvWR, 1)),
			MaxSendSGE: sge, MaxRecvSGE: sge, MaxInline: uint32(max(p.MaxInline, 0))},
		ResponderResources: p.ResponderResources, InitiatorDepth: p.InitiatorDepth, RetryCount: p.RetryCount, RNRRetry: p.RNRRetry}
	if r := p.InitRecv; r != nil {
		if len(r.SG) != 1 {
			return nil, nil, fmt.Errorf("rnic: the initial receive takes one SGE, not %d", len(r.SG))
		}
		e := r.SG[0]
		cp.InitRecv = &proto.RecvWR{ID: r.ID, SG: []proto.SGE{{Addr: e.Addr, Length: e.Length, LKey: e.LKey}}}
	}
	return pd.pd, cp, nil
}

func (c daemonCM) Listen(port uint16) (Listener, error) {
	l, err := c.d.c.Listen(port, 0)
	if err != nil {
		return nil, err
	}
	return daemonListener{l, c.d.c}, nil
}

// abortOn closes c's client connection if ctx ends before stop is called.
func abortOn(ctx context.Context, c *client.Client) (stop func() bool) {
	return context.AfterFunc(ctx, func() { c.Close() })
}

// ctxErr prefers ctx's error to the one of a call abortOn cut short.
func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

func (c daemonCM) Dial(ctx context.Context, peer netip.Addr, port uint16, p *ConnParams) (Conn, error) {
	pd, cp, err := p.daemon()
	if err != nil {
		return nil, err
	}
	stop := abortOn(ctx, c.d.c)
	q, err := pd.Connect(peer, port, cp)
	stop()
	if r, ok := proto.RejectReason(err); ok && ctx.Err() == nil {
		// The same error as LocalCM's, so that a tool can act on the
		// reason either way (perftest -R dials again after reason 8).
		return nil, &rdmacm.RejectedError{Reason: cm.RejectReason(r)}
	}
	if err != nil {
		return nil, ctxErr(ctx, err)
	}
	return p.daemonConn(newDaemonQP(q, false, int(cp.Caps.MaxSendSGE)), peer)
}

type daemonListener struct {
	l *client.Listener
	c *client.Client
}

func (l daemonListener) Close() error { return l.l.Close() }

func (l daemonListener) Accept(ctx context.Context, p *ConnParams) (Conn, error) {
	pd, cp, err := p.daemon()
	if err != nil {
		return nil, err
	}
	stop := abortOn(ctx, l.c)
	defer stop()
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		r, err := l.l.GetRequest()
		if errors.Is(err, unix.ETIMEDOUT) {
			continue // the daemon bounds one wait; a listener waits on
		}
		if err != nil {
			return nil, ctxErr(ctx, err)
		}
		q, err := r.Accept(pd, cp)
		if errors.Is(err, rdmacm.ErrRequestExpired) || isExpired(err) {
			continue // the requester gave up while it waited
		}
		if err != nil {
			return nil, ctxErr(ctx, err)
		}
		return p.daemonConn(newDaemonQP(q, false, int(cp.Caps.MaxSendSGE)), r.Peer)
	}
}

// isExpired recognises rdmacm.ErrRequestExpired in the daemon's answer.
func isExpired(err error) bool {
	var pe *proto.Error
	return errors.As(err, &pe) && pe.Msg == rdmacm.ErrRequestExpired.Error()
}

// daemonConn posts p.MoreRecvs on the new connection's QP and returns it.
func (p *ConnParams) daemonConn(q *daemonQP, peer netip.Addr) (Conn, error) {
	for i := range p.MoreRecvs {
		if err := q.PostRecv(&p.MoreRecvs[i]); err != nil {
			q.Destroy()
			return nil, fmt.Errorf("rnic: posting the connection's receives: %w", err)
		}
	}
	return &daemonConn{q: q, peer: peer}, nil
}

type daemonConn struct {
	q    *daemonQP
	peer netip.Addr
}

func (c *daemonConn) QP() QP                           { return c.q }
func (c *daemonConn) Peer() netip.Addr                 { return c.peer }
func (c *daemonConn) Done() <-chan struct{}            { return nil }
func (c *daemonConn) Disconnect(context.Context) error { return c.q.q.Disconnect() }
func (c *daemonConn) Close() error                     { return c.q.Destroy() }

// UDCM is rdma_cm's UDP port space (RDMA_PS_UDP) on an RNIC: SIDR, a
// lookup of a UD QP, not a connection. DaemonCM's CM is one; in process
// the tools use rdmacm's ListenUD and ResolveUD on their agent directly.
type UDCM interface {
	// ListenUD listens for SIDR requests on port.
	ListenUD(port uint16) (UDListener, error)
	// ResolveUD looks port up at peer. A refusal is an *rdmacm.SIDRError
	// (as in process), no answer rdmacm.ErrTimeout.
	ResolveUD(ctx context.Context, peer netip.Addr, port uint16) (UDService, error)
}

// UDListener answers SIDR requests for one port.
type UDListener interface {
	// Accept waits for the next request and answers it with qp, a UD QP
	// of this RNIC prepared with PrepareUD; it returns the requester's
	// address.
	Accept(ctx context.Context, qp QP) (netip.Addr, error)
	Close() error
}

// UDService is a peer's UD QP as SIDR named it.
type UDService struct {
	Addr      netip.Addr
	QPN, QKey uint32
}

// PrepareUD moves a fresh UD QP through INIT, RTR and RTS with rdma_cm's
// Q_Key (rdmacm.UDPQKey), as rdmacm.PrepareUD does for a verbs QP.
func PrepareUD(qp QP) error {
	if err := qp.Modify(&ib.QPAttr{State: ib.Init, Port: 1, QKey: rdmacm.UDPQKey},
		ib.AttrState|ib.AttrPKeyIndex|ib.AttrPort|ib.AttrQKey); err != nil {
		return err
	}
	if err := qp.Modify(&ib.QPAttr{State: ib.RTR}, ib.AttrState); err != nil {
		return err
	}
	return qp.Modify(&ib.QPAttr{State: ib.RTS}, ib.AttrState|ib.AttrSQPSN)
}

var _ UDCM = daemonCM{}

func (c daemonCM) ListenUD(port uint16) (UDListener, error) {
	l, err := c.d.c.ListenUD(port, 0)
	if err != nil {
		return nil, err
	}
	return daemonUDListener{l, c.d.c}, nil
}

func (c daemonCM) ResolveUD(ctx context.Context, peer netip.Addr, port uint16) (UDService, error) {
	stop := abortOn(ctx, c.d.c)
	s, err := c.d.c.ResolveUD(peer, port)
	stop()
	if st, ok := proto.SIDRStatus(err); ok && ctx.Err() == nil {
		// The same error as in process, so that a tool acts on the status
		// either way (perftest -R resolves again while nobody listens).
		return UDService{}, &rdmacm.SIDRError{Status: cm.SIDRStatus(st)}
	}
	if errors.Is(err, unix.ETIMEDOUT) && ctx.Err() == nil {
		return UDService{}, fmt.Errorf("%w: %v", rdmacm.ErrTimeout, err)
	}
	if err != nil {
		return UDService{}, ctxErr(ctx, err)
	}
	return UDService{Addr: s.Addr, QPN: s.QPN, QKey: s.QKey}, nil
}

type daemonUDListener struct {
	l *client.Listener
	c *client.Client
}

func (l daemonUDListener) Close() error { return l.l.Close() }

func (l daemonUDListener) Accept(ctx context.Context, qp QP) (netip.Addr, error) {
	q, ok := qp.(*daemonQP)
	if !ok || !q.ud {
		return netip.Addr{}, errors.New("rnic: a daemon UD listener answers with a UD QP of the same Daemon device")
	}
	stop := abortOn(ctx, l.c)
	defer stop()
	for {
		if err := ctx.Err(); err != nil {
			return netip.Addr{}, err
		}
		r, err := l.l.GetRequest()
		if errors.Is(err, unix.ETIMEDOUT) {
			continue // the daemon bounds one wait; a listener waits on
		}
		if err != nil {
			return netip.Addr{}, ctxErr(ctx, err)
		}
		if err := r.AcceptUD(q.q); err != nil {
			return netip.Addr{}, ctxErr(ctx, err)
		}
		return r.Peer, nil
	}
}

package daemon

import (
	"context"
	"errors"
	"net/netip"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/rdmacm"
	"github.com/softrnic/softrnic/rnic"
)

var _ CMDevice = (*VerbsDevice)(nil)

// verbsCM is the rdma_cm agent of a VerbsDevice, started by StartCM when
// the daemon starts serving, or else on first use (the agent owns the
// device's GSI QP and its async events).
type verbsCM struct {
	once  sync.Once
	agent *rdmacm.Agent
	err   error
}

// cm returns the device's CM agent, starting it the first time.
func (v *VerbsDevice) cm() (*rdmacm.Agent, error) {
	v.cmAgent.once.Do(func() {
		v.cmAgent.agent, v.cmAgent.err = rdmacm.New(rdmacm.Config{Device: v.dev,
			Resolve: func(_ context.Context, peer netip.Addr) ([6]byte, error) { return v.resolveMAC(peer) }})
	})
	return v.cmAgent.agent, v.cmAgent.err
}

// StartCM starts the CM agent now rather than on a client's first CM
// call. The daemon calls it when it starts: until an agent owns the GSI QP
// nothing answers a peer's REQ, so a stock peer connecting to a port no
// client listens on would wait out its REQ retries (a minute) instead of
// getting REJ "invalid service ID" (reason 8) at once, which is what
// perftest and rping clients retry on or report.
func (v *VerbsDevice) StartCM() error {
	_, err := v.cm()
	return err
}

// CloseCM stops the CM agent if it runs (connections are aborted: REJ or
// DREQ to their peers). The daemon calls it when it stops serving.
func (v *VerbsDevice) CloseCM() error {
	v.cmAgent.once.Do(func() { v.cmAgent.err = rdmacm.ErrClosed })
	if v.cmAgent.agent != nil {
		return v.cmAgent.agent.Close()
	}
	return nil
}

// connParams turns the client's request into rdmacm's, on the verbs
// objects under the session's PD and CQs.
func (p *CMParams) connParams() (*rdmacm.ConnParams, error) {
	pd, ok1 := p.PD.(*verbsPD)
	scq, ok2 := p.SendCQ.(*verbsCQ)
	rcq, ok3 := p.RecvCQ.(*verbsCQ)
	if !ok1 || !ok2 || !ok3 {
		return nil, errors.New("daemon: CM objects of another device")
	}
	sge := int(max(p.Caps.MaxSendSGE, p.Caps.MaxRecvSGE))
	cp := &rdmacm.ConnParams{PD: pd.pd, SendCQ: scq.cq, RecvCQ: rcq.cq, MaxSendWR: int(p.Caps.MaxSendWR), MaxRecvWR: int(p.Caps.MaxRecvWR),
		MaxSGE: sge, MaxInline: int(p.Caps.MaxInline), Access: p.Access,
		ResponderResources: p.ResponderResources, InitiatorDepth: p.InitiatorDepth, RetryCount: p.RetryCount, RNRRetry: p.RNRRetry}
	if r := p.InitRecv; r != nil {
		sg := make([]ib.SGE, len(r.SG))
		for i, e := range r.SG {
			sg[i] = ib.SGE{Addr: e.Addr, Length: e.Length, LKey: e.LKey}
		}
		cp.Setup = func(q *rnic.QP) error {
			_, err := q.PostRecv(rnic.RecvWR{ID: r.ID, SG: sg})
			return err
		}
	}
	return cp, nil
}

// wrapConn makes the daemon's QP of a connection rdmacm established.
func wrapConn(p *CMParams, c *rdmacm.Conn) (QP, CMConn) {
	pd := p.PD.(*verbsPD)
	sge := max(p.Caps.MaxSendSGE, p.Caps.MaxRecvSGE)
	q := &verbsQP{p: pd, q: c.QP(), sg: make([]ib.SGE, 0, sge), ahs: map[[16]byte]ahResult{}, resolving: map[[16]byte]bool{}}
	return q, verbsConn{c}
}

type verbsConn struct{ c *rdmacm.Conn }

func (c verbsConn) Disconnect(ctx context.Context) error { return c.c.Disconnect(ctx) }
func (c verbsConn) Close() error                         { return c.c.Close() }

// CMListen implements CMDevice.
func (v *VerbsDevice) CMListen(port uint16, backlog int) (CMListener, error) {
	a, err := v.cm()
	if err != nil {
		return nil, err
	}
	l, err := a.Listen(port, backlog)
	if err != nil {
		return nil, err
	}
	return verbsListener{l}, nil
}

type verbsListener struct{ l *rdmacm.Listener }

func (l verbsListener) Close() error { return l.l.Close() }

func (l verbsListener) GetRequest(ctx context.Context) (CMRequest, error) {
	r, err := l.l.GetRequest(ctx)
	if err != nil {
		return nil, err
	}
	return verbsRequest{r}, nil
}

type verbsRequest struct{ r *rdmacm.Request }

func (r verbsRequest) Peer() netip.Addr { return r.r.Peer() }
func (r verbsRequest) SrcPort() uint16  { return r.r.SrcPort() }
func (r verbsRequest) Reject() error    { return r.r.Reject(nil) }

func (r verbsRequest) Accept(ctx context.Context, p *CMParams) (QP, CMConn, error) {
	cp, err := p.connParams()
	if err != nil {
		return nil, nil, err
	}
	c, err := r.r.Accept(ctx, cp)
	if err != nil {
		return nil, nil, err
	}
	q, conn := wrapConn(p, c)
	return q, conn, nil
}

// CMDial implements CMDevice.
func (v *VerbsDevice) CMDial(ctx context.Context, peer netip.Addr, port uint16, p *CMParams) (QP, CMConn, error) {
	a, err := v.cm()
	if err != nil {
		return nil, nil, err
	}
	cp, err := p.connParams()
	if err != nil {
		return nil, nil, err
	}
	c, err := a.Dial(ctx, peer, port, cp)
	if err != nil {
		return nil, nil, err
	}
	q, conn := wrapConn(p, c)
	return q, conn, nil
}

var _ UDCMDevice = (*VerbsDevice)(nil)

// CMListenUD implements UDCMDevice.
func (v *VerbsDevice) CMListenUD(port uint16, backlog int) (CMListener, error) {
	a, err := v.cm()
	if err != nil {
		return nil, err
	}
	l, err := a.ListenUD(port, backlog)
	if err != nil {
		return nil, err
	}
	return verbsUDListener{l}, nil
}

// CMResolveUD implements UDCMDevice.
func (v *VerbsDevice) CMResolveUD(ctx context.Context, peer netip.Addr, port uint16) (UDService, error) {
	a, err := v.cm()
	if err != nil {
		return UDService{}, err
	}
	p, err := a.ResolveUD(ctx, peer, port, nil)
	if err != nil {
		return UDService{}, err
	}
	return UDService{Addr: p.Addr, QPN: p.QPN, QKey: p.QKey}, nil
}

type verbsUDListener struct{ l *rdmacm.UDListener }

func (l verbsUDListener) Close() error { return l.l.Close() }

func (l verbsUDListener) GetRequest(ctx context.Context) (CMRequest, error) {
	r, err := l.l.GetRequest(ctx)
	if err != nil {
		return nil, err
	}
	return verbsUDRequest{r}, nil
}

type verbsUDRequest struct{ r *rdmacm.UDRequest }

func (r verbsUDRequest) Peer() netip.Addr { return r.r.Peer() }
func (r verbsUDRequest) SrcPort() uint16  { return r.r.SrcPort() }
func (r verbsUDRequest) Reject() error    { return r.r.Reject(nil) }

func (r verbsUDRequest) Accept(context.Context, *CMParams) (QP, CMConn, error) {
	return nil, nil, errf(unix.EINVAL, "a SIDR request is answered with a UD QP, not a connection")
}

func (r verbsUDRequest) AcceptUD(qp QP) error {
	q, ok := qp.(*verbsQP)
	if !ok {
		return errors.New("daemon: a QP of another device")
	}
	return r.r.Accept(q.q, nil)
}

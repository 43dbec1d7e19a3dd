package rdmacm

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/cm"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/verbs"
)

// rdma_cm's UDP port space (RDMA_PS_UDP): no connection, only a lookup. The
// active side sends a SIDR_REQ for service ID 0x0000000001110000 | port,
// carrying the rdma_cm IP header; the passive side answers with a SIDR_REP
// naming its UD QP and Q_Key (rdma_accept with a qp_num); the active side
// then addresses UD SENDs to that QPN with that Q_Key. The kernel's rdma_cm
// gives every UD QP of this port space the same Q_Key, RDMA_UDP_QKEY
// (cma_set_qkey), and puts it in its SIDR_REPs: a stock `ib_send_bw -R -c UD`
// sends to our QP with it, and expects ours to accept it.

// UDPQKey is RDMA_UDP_QKEY, the Q_Key of rdma_cm's UDP port space.
const UDPQKey uint32 = 0x01234567

// ErrNotUD is returned when a UD call is given a QP of another type.
var ErrNotUD = errors.New("rdmacm: not a UD QP")

// SIDRError is a SIDR_REP with a status other than success: nobody listens
// on the port (cm.SIDRUnsupported) or the listener refused (cm.SIDRReject).
type SIDRError struct {
	Status      cm.SIDRStatus
	PrivateData []byte
}

func (e *SIDRError) Error() string {
	return fmt.Sprintf("rdmacm: service lookup refused (SIDR status %d)", e.Status)
}

// sidrWait is one ResolveUD in flight.
type sidrWait struct {
	peer   netip.Addr
	result chan sidrResult
}

type sidrResult struct {
	p   *UDPeer
	err error
}

// ResolveUD looks up port (rdma_cm UDP port space) at peer: a SIDR_REQ with
// the rdma_cm header and private (at most cm.SIDRREQPrivateSize minus the
// header), retried as the CM's timeouts say. It returns the service's QPN
// and Q_Key with an address vector towards peer, a *SIDRError when the peer
// refused, ErrTimeout when nobody answered, or ctx's error.
func (a *Agent) ResolveUD(ctx context.Context, peer netip.Addr, port uint16, private []byte) (*UDPeer, error) {
	peer = peer.Unmap()
	_, local, err := a.sgid(peer)
	if err != nil {
		return nil, err
	}
	if err := a.ensureMAC(ctx, peer); err != nil {
		return nil, err
	}
	w := &sidrWait{peer: peer, result: make(chan sidrResult, 1)}
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil, ErrClosed
	}
	now := a.cfg.Now()
	sport := uint16(32768 + a.rng.IntN(28232))
	id, err := a.m.ResolveService(now, &cm.SIDRParams{Peer: peer, Local: local, ServiceID: cm.ServiceIDUDP(port),
		RDMACM: true, SrcPort: sport, PrivateData: private})
	if err != nil {
		a.mu.Unlock()
		return nil, err
	}
	a.ev.forgetLocked(id)
	a.sidr[id] = w
	a.flushLocked(now)
	a.mu.Unlock()
	a.wake()
	select {
	case r := <-w.result:
		return r.p, r.err
	case <-ctx.Done():
		a.mu.Lock()
		if a.sidr[id] == w {
			delete(a.sidr, id)
			if !a.closed {
				now := a.cfg.Now()
				_ = a.m.Abort(now, id) // fails only for a SIDR_REQ already answered
				a.flushLocked(now)
			}
		}
		a.mu.Unlock()
		return nil, ctx.Err()
	}
}

// sidrEventLocked finishes a ResolveUD on the SIDR_REP or its timeout.
func (a *Agent) sidrEventLocked(e *cm.Event) {
	w := a.sidr[e.ID]
	if w == nil {
		return
	}
	delete(a.sidr, e.ID)
	var r sidrResult
	switch {
	case e.Kind == cm.EventSIDRTimeout:
		r.err = ErrTimeout
	case e.SIDRStatus != cm.SIDRSuccess:
		r.err = &SIDRError{Status: e.SIDRStatus, PrivateData: append([]byte(nil), e.Private()...)}
	default:
		idx, _, err := a.sgid(w.peer)
		mac, ok := a.macs[w.peer]
		switch {
		case err != nil:
			r.err = err
		case !ok:
			r.err = fmt.Errorf("rdmacm: no MAC for %v", w.peer)
		default:
			r.p = &UDPeer{Addr: w.peer, QPN: e.QP.RemoteQPN, QKey: e.QKey,
				AV:          ib.AddressVector{DMAC: mac, DGID: ib.GIDFrom(w.peer), SGIDIndex: uint8(idx)},
				PrivateData: append([]byte(nil), e.Private()...)}
		}
	}
	w.result <- r
}

// udListener takes SIDR requests for one port of the UDP port space.
type udListener struct {
	agent   *Agent
	port    uint16
	backlog chan *udRequest
	closed  bool
	stop    chan struct{}
}

// udRequest is a SIDR request waiting for Accept or Reject
// (RDMA_CM_EVENT_CONNECT_REQUEST on an RDMA_PS_UDP listener).
type udRequest struct {
	agent   *Agent
	id      cm.ConnID
	peer    netip.Addr
	cma     cm.CMAHeader
	private []byte
	done    bool
}

// ListenUD listens on port of rdma_cm's UDP port space (service ID
// 0x0000000001110000 | port). Requests wait in a backlog of backlog
// entries (16 if 0); one finding it full is refused (SIDR status reject).
func (a *Agent) ListenUD(port uint16, backlog int) (UDListener, error) {
	if backlog <= 0 {
		backlog = 16
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil, ErrClosed
	}
	if a.udListeners[port] != nil {
		return nil, ErrListening
	}
	if err := a.m.Listen(cm.ServiceIDUDP(port), cm.ListenOptions{RDMACM: true}); err != nil {
		return nil, err
	}
	l := &udListener{agent: a, port: port, backlog: make(chan *udRequest, backlog), stop: make(chan struct{})}
	a.udListeners[port] = l
	return l, nil
}

// Port is the port listened on.
func (l *udListener) Port() uint16 { return l.port }

func (l *udListener) closeLocked() {
	if !l.closed {
		l.closed = true
		close(l.stop)
	}
}

// Close stops listening; requests not yet taken are refused.
func (l *udListener) Close() error {
	a := l.agent
	a.mu.Lock()
	defer a.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closeLocked()
	if a.udListeners[l.port] == l {
		delete(a.udListeners, l.port)
		_ = a.m.Unlisten(cm.ServiceIDUDP(l.port)) // registered with the listener: it cannot fail
	}
	now := a.cfg.Now()
	for {
		select {
		case r := <-l.backlog:
			_ = a.m.SIDRReply(now, r.id, &cm.SIDRReplyParams{Status: cm.SIDRReject}) // fails only for a request that has timed out
		default:
			a.flushLocked(now)
			return nil
		}
	}
}

// GetRequest waits for the next SIDR request.
func (l *udListener) GetRequest(ctx context.Context) (UDRequest, error) {
	select {
	case r := <-l.backlog:
		return r, nil
	case <-l.stop:
		return nil, ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Peer is the requesting side's address.
func (r *udRequest) Peer() netip.Addr { return r.peer }

// SrcPort is the active side's rdma_cm port.
func (r *udRequest) SrcPort() uint16 { return r.cma.SrcPort }

// PrivateData is the request's private data after the rdma_cm header.
func (r *udRequest) PrivateData() []byte { return r.private }

// AV is an address vector back to the requester, for an AH (the kernel
// builds the same from the SIDR_REQ's path for the passive side).
func (r *udRequest) AV() (ib.AddressVector, error) {
	a := r.agent
	a.mu.Lock()
	defer a.mu.Unlock()
	idx, _, err := a.sgid(r.peer)
	if err != nil {
		return ib.AddressVector{}, err
	}
	mac, ok := a.macs[r.peer]
	if !ok {
		return ib.AddressVector{}, fmt.Errorf("rdmacm: no MAC for %v", r.peer)
	}
	return ib.AddressVector{DMAC: mac, DGID: ib.GIDFrom(r.peer), SGIDIndex: uint8(idx)}, nil
}

// Accept answers with qp (a UD QP, prepared with PrepareUD) and rdma_cm's
// Q_Key: the SIDR_REP of rdma_accept. private goes in the reply (at most
// cm.SIDRREPPrivateSize bytes).
func (r *udRequest) Accept(qp verbs.QP, private []byte) error {
	if qp.Type() != ib.UD {
		return ErrNotUD
	}
	if err := r.agent.owns(qp); err != nil {
		return err
	}
	return r.reply(&cm.SIDRReplyParams{Status: cm.SIDRSuccess, QPN: qp.QPN(), QKey: UDPQKey, PrivateData: private})
}

// Reject refuses the request (SIDR status reject, rdma_reject).
func (r *udRequest) Reject(private []byte) error {
	return r.reply(&cm.SIDRReplyParams{Status: cm.SIDRReject, PrivateData: private})
}

func (r *udRequest) reply(p *cm.SIDRReplyParams) error {
	a := r.agent
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return ErrClosed
	}
	if r.done {
		return cm.ErrBadState
	}
	now := a.cfg.Now()
	if err := a.m.SIDRReply(now, r.id, p); err != nil {
		return err
	}
	r.done = true
	a.flushLocked(now)
	a.wake()
	return nil
}

// sidrRequestLocked queues a SIDR_REQ for its listener, or refuses it.
func (a *Agent) sidrRequestLocked(now clock.Time, e *cm.Event) {
	_, port, _ := cm.ServicePort(e.ServiceID)
	l := a.udListeners[port]
	if l == nil || l.closed {
		_ = a.m.SIDRReply(now, e.ID, &cm.SIDRReplyParams{Status: cm.SIDRUnsupported}) // a request just reported: it cannot fail
		return
	}
	r := &udRequest{agent: a, id: e.ID, peer: e.Peer, cma: e.CMA, private: append([]byte(nil), e.Private()...)}
	select {
	case l.backlog <- r:
	default:
		a.stats.BacklogFull++
		_ = a.m.SIDRReply(now, e.ID, &cm.SIDRReplyParams{Status: cm.SIDRReject}) // a request just reported: it cannot fail
	}
}

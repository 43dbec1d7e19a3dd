package rdmacm

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/softrnic/softrnic/cm"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/port"
	"github.com/softrnic/softrnic/port/memlink"
	"github.com/softrnic/softrnic/verbs"
)

// evHost is a host whose agent also serves the event interface, with the
// events its sink received.
type evHost struct {
	*host
	ev  *EventCM
	evs chan cm.Event
}

func (h *host) eventCM(t *testing.T) *evHost {
	t.Helper()
	evs := make(chan cm.Event, 64)
	ev, err := h.agent.EventCM(func(e *cm.Event) {
		select {
		case evs <- *e:
		default:
			t.Error("event sink full")
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.agent.EventCM(func(*cm.Event) {}); !errors.Is(err, ErrEventCM) {
		t.Fatalf("a second event interface: %v", err)
	}
	t.Cleanup(ev.Close)
	return &evHost{host: h, ev: ev, evs: evs}
}

// next waits for the sink's next event, which must be of kind.
func (h *evHost) next(t *testing.T, kind cm.EventKind) cm.Event {
	t.Helper()
	select {
	case e := <-h.evs:
		if e.Kind != kind {
			t.Fatalf("event %v (reason %d), want %v", e.Kind, e.Reason, kind)
		}
		return e
	case <-time.After(10 * time.Second):
		t.Fatalf("no %v event", kind)
	}
	panic("unreachable")
}

// drive moves qp to RTR and RTS with what the CM negotiated, receiving
// from rqpsn, as an owner of the event interface (librdmacm) does; to RTR
// only with rtrOnly.
func (h *evHost) drive(t *testing.T, qp verbs.QP, q *cm.QPAttr, rqpsn uint32, rtrOnly ...bool) {
	t.Helper()
	mac := macA
	if h.ip == ipA {
		mac = macB
	}
	if err := qp.Modify(&ib.QPAttr{State: ib.RTR, PathMTU: uint32(cm.MTUBytes(q.PathMTU)), DestQPN: q.RemoteQPN, RQPSN: rqpsn,
		MaxDestRdAtomic: q.MaxDestRdAtomic, MinRNRTimer: DefaultMinRNRTimer,
		AV: ib.AddressVector{DMAC: mac, DGID: ib.GIDFrom(q.Peer), HopLimit: 64, FlowLabel: q.FlowLabel}},
		ib.AttrState|ib.AttrAV|ib.AttrPathMTU|ib.AttrDestQPN|ib.AttrRQPSN|ib.AttrMaxDestRdAtomic|ib.AttrMinRNRTimer); err != nil {
		t.Fatal(err)
	}
	if len(rtrOnly) > 0 && rtrOnly[0] {
		return
	}
	if err := qp.Modify(&ib.QPAttr{State: ib.RTS, SQPSN: q.SQPSN, Timeout: q.Timeout, RetryCnt: 7, RNRRetry: 7,
		MaxRdAtomic: q.MaxRdAtomic}, ib.AttrState|ib.AttrSQPSN|ib.AttrTimeout|ib.AttrRetryCnt|ib.AttrRNRRetry|ib.AttrMaxQPRdAtomic); err != nil {
		t.Fatal(err)
	}
}

// The passive side of the event interface against the agent's own
// Connect: the request with its rdma_cm header and private data, the QP
// the owner moved, the REP, the RTU's ESTABLISHED, data, and a
// disconnection by the active side.
func TestEventCMAccept(t *testing.T) {
	a, b := pair(t, nil)
	eb := b.eventCM(t)
	svc := cm.ServiceIDTCP(7200)
	if err := eb.ev.Listen(svc); err != nil {
		t.Fatal(err)
	}
	if _, err := b.agent.Listen(7200, 0); !errors.Is(err, cm.ErrListening) {
		t.Fatalf("the agent's Listen on a service of the event interface: %v", err)
	}
	ctx := ctx10(t)
	pa, mra := a.params(t, 0)
	pa.PrivateData = []byte("req")
	type res struct {
		c   Conn
		err error
	}
	dialed := make(chan res, 1)
	go func() {
		c, err := dial(ctx, a.agent, ipB, 7200, pa)
		dialed <- res{c, err}
	}()
	req := eb.next(t, cm.EventConnRequest)
	if !req.HasCMA || req.CMA.Src != ipA || req.CMA.Dst != ipB || !bytes.HasPrefix(req.Private(), []byte("req")) {
		t.Fatalf("request %+v", req)
	}
	pb, mrb := b.params(t, 1)
	qp, err := pb.newQP()
	if err != nil {
		t.Fatal(err)
	}
	q := req.QP
	q.Peer = ipA
	const rqpsn = 0x123456
	eb.drive(t, qp, &q, rqpsn)
	if err := eb.ev.Accept(req.ID, &cm.AcceptParams{QPN: qp.QPN(), StartingPSN: rqpsn, ResponderResources: 4,
		InitiatorDepth: 4, RNRRetry: 7, PrivateData: []byte("rep")}); err != nil {
		t.Fatal(err)
	}
	r := <-dialed
	if r.err != nil {
		t.Fatal(r.err)
	}
	eb.next(t, cm.EventEstablished)
	if !bytes.HasPrefix(r.c.PrivateData(), []byte("rep")) {
		t.Fatalf("REP private data %q", r.c.PrivateData())
	}
	copy(mra.Bytes(), "over the event interface")
	if _, err := r.c.QP().PostSend([]verbs.SendWR{{ID: 1, Opcode: ib.Send, Flags: ib.Signaled,
		SG: []ib.SGE{{Addr: mra.IOVA(), Length: 24, LKey: mra.LKey()}}}}); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, b.cq, qp.QPN()); wc.Status != ib.Success || string(mrb.Bytes()[:24]) != "over the event interface" {
		t.Fatalf("receive %+v %q", wc, mrb.Bytes()[:24])
	}
	if err := r.c.Disconnect(ctx); err != nil {
		t.Fatal(err)
	}
	if e := eb.next(t, cm.EventDisconnectRequest); e.ID != req.ID {
		t.Fatalf("disconnect of %d, want %d", e.ID, req.ID)
	}
	if err := eb.ev.Accept(req.ID, &cm.AcceptParams{QPN: qp.QPN()}); !errors.Is(err, cm.ErrBadState) {
		t.Fatalf("accept after the end: %v", err)
	}
	if err := eb.ev.Establish(cm.ConnID(12345)); !errors.Is(err, ErrNotEventCM) {
		t.Fatalf("an ID that is not the interface's: %v", err)
	}
}

// The active side of the event interface: CONN_RESPONSE, no RTU until
// the owner establishes, then the agent's Accept returns; a refusal by
// nobody listening; an answer the owner rejects.
func TestEventCMConnect(t *testing.T) {
	a, b := pair(t, nil)
	eb := b.eventCM(t)
	ln, err := a.agent.Listen(7201, 0)
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctx10(t)
	pa, mra := a.params(t, 1)
	accepted := make(chan error, 1)
	go func() {
		_, err := accept(ctx, ln, pa)
		accepted <- err
	}()
	pb, mrb := b.params(t, 0)
	qp, err := pb.newQP()
	if err != nil {
		t.Fatal(err)
	}
	p := &cm.ConnectParams{Peer: ipA, Local: ipB, ServiceID: cm.ServiceIDTCP(7201), QPN: qp.QPN(), StartingPSN: 0x777,
		PathMTU: 3, ResponderResources: 4, InitiatorDepth: 4, RetryCount: 7, RNRRetry: 7, SrcPort: 40001}
	if _, err := eb.ev.Connect(p); !errors.Is(err, ErrUnresolved) {
		t.Fatalf("connect before resolving: %v", err)
	}
	if err := eb.ev.ResolvePeer(ctx, ipA); err != nil {
		t.Fatal(err)
	}
	id, err := eb.ev.Connect(p)
	if err != nil {
		t.Fatal(err)
	}
	resp := eb.next(t, cm.EventConnResponse)
	if resp.ID != id || eb.ev.State(id) != cm.StateREPRcvd {
		t.Fatalf("response for %d, state %v", resp.ID, eb.ev.State(id))
	}
	if _, st := b.agent.Stats(); st.Tx[cm.AttrRTU-cm.AttrREQ] != 0 {
		t.Fatal("an RTU before Establish")
	}
	q := resp.QP
	q.Peer = ipA
	eb.drive(t, qp, &q, 0x777)
	if err := eb.ev.Establish(id); err != nil {
		t.Fatal(err)
	}
	if err := <-accepted; err != nil {
		t.Fatal(err)
	}
	copy(mrb.Bytes(), "active over events")
	if _, err := qp.PostSend([]verbs.SendWR{{ID: 1, Opcode: ib.Send, Flags: ib.Signaled,
		SG: []ib.SGE{{Addr: mrb.IOVA(), Length: 18, LKey: mrb.LKey()}}}}); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, a.cq, pa.made.QPN()); wc.Status != ib.Success || string(mra.Bytes()[:18]) != "active over events" {
		t.Fatalf("receive %+v", wc)
	}
	if err := eb.ev.Disconnect(id, nil); err != nil {
		t.Fatal(err)
	}
	if e := eb.next(t, cm.EventDisconnected); e.TimedOut {
		t.Fatal("DREQ timed out")
	}
	eb.next(t, cm.EventTimeWaitExit)
	if eb.ev.State(id) != cm.StateIdle {
		t.Fatalf("state after time-wait %v", eb.ev.State(id))
	}

	// Nobody listens: REJ reason 8.
	p.ServiceID = cm.ServiceIDTCP(7299)
	id, err = eb.ev.Connect(p)
	if err != nil {
		t.Fatal(err)
	}
	if e := eb.next(t, cm.EventRejected); e.ID != id || e.Reason != cm.RejInvalidServiceID {
		t.Fatalf("refused %+v", e)
	}

	// The owner refuses the REP: the passive side's Accept fails.
	p.ServiceID = cm.ServiceIDTCP(7201)
	go func() {
		_, err := accept(ctx, ln, pa)
		accepted <- err
	}()
	id, err = eb.ev.Connect(p)
	if err != nil {
		t.Fatal(err)
	}
	eb.next(t, cm.EventConnResponse)
	if err := eb.ev.Reject(id, cm.RejConsumerDefined, nil); err != nil {
		t.Fatal(err)
	}
	var rej *RejectedError
	if err := <-accepted; !errors.As(err, &rej) || rej.Reason != cm.RejConsumerDefined {
		t.Fatalf("accept of a refused REP: %v", err)
	}
	if st, _ := b.agent.Stats(); st.QPErrors != 0 {
		t.Fatalf("the agent drove a QP of the event interface: %+v", st)
	}
}

// SIDR through the event interface, both ways, and COMM_EST: a passive
// connection whose RTU is lost is established by its QP's first packet.
func TestEventCMSIDRAndCommEst(t *testing.T) {
	dropRTU := false
	var dp *dropPort
	// testCM's REP retries (≈ 4 s) leave the first SEND time to come
	// before the passive side gives up on its REP.
	a, b := pairCM(t, testCM, memlink.Impairments{}, func(p port.Port) port.Port {
		dp = &dropPort{Port: p, drop: func(f []byte) bool { return dropRTU && madAttr(f) == cm.AttrRTU }}
		return dp
	}, nil)
	eb := b.eventCM(t)
	ctx := ctx10(t)
	// B's UD service, looked up by A's agent.
	if err := eb.ev.Listen(cm.ServiceIDUDP(7300)); err != nil {
		t.Fatal(err)
	}
	qb, _ := b.udQP(t, 1)
	looked := make(chan *UDPeer, 1)
	go func() {
		p, err := a.agent.ResolveUD(ctx, ipB, 7300, []byte("who"))
		if err != nil {
			t.Error(err)
		}
		looked <- p
	}()
	req := eb.next(t, cm.EventSIDRRequest)
	if !bytes.HasPrefix(req.Private(), []byte("who")) || req.CMA.Src != ipA {
		t.Fatalf("SIDR request %+v", req)
	}
	if err := eb.ev.SIDRReply(req.ID, &cm.SIDRReplyParams{QPN: qb.QPN(), QKey: UDPQKey}); err != nil {
		t.Fatal(err)
	}
	if p := <-looked; p == nil || p.QPN != qb.QPN() || p.QKey != UDPQKey {
		t.Fatalf("looked up %+v", p)
	}
	// A's UD service, looked up by B's event interface.
	la, err := a.agent.ListenUD(7301, 0)
	if err != nil {
		t.Fatal(err)
	}
	qa, _ := a.udQP(t, 1)
	go func() {
		if r, err := la.GetRequest(ctx); err == nil {
			_ = r.Accept(qa, nil)
		}
	}()
	id, err := eb.ev.Resolve(&cm.SIDRParams{Peer: ipA, Local: ipB, ServiceID: cm.ServiceIDUDP(7301), SrcPort: 40002})
	if err != nil {
		t.Fatal(err)
	}
	if e := eb.next(t, cm.EventSIDRReply); e.ID != id || e.SIDRStatus != cm.SIDRSuccess || e.QP.RemoteQPN != qa.QPN() || e.QKey != UDPQKey {
		t.Fatalf("SIDR reply %+v", e)
	}

	// COMM_EST: A's RTUs are lost; B's QP hears A's first SEND.
	dropRTU = true
	if err := eb.ev.Listen(cm.ServiceIDTCP(7302)); err != nil {
		t.Fatal(err)
	}
	pa, mra := a.params(t, 0)
	dialed := make(chan Conn, 1)
	go func() {
		c, err := dial(ctx, a.agent, ipB, 7302, pa)
		if err != nil {
			t.Error(err)
		}
		dialed <- c
	}()
	r := eb.next(t, cm.EventConnRequest)
	pb, _ := b.params(t, 1)
	qp, err := pb.newQP()
	if err != nil {
		t.Fatal(err)
	}
	q := r.QP
	q.Peer = ipA
	eb.drive(t, qp, &q, 0x4242, true) // COMM_EST is raised in RTR
	if err := eb.ev.Accept(r.ID, &cm.AcceptParams{QPN: qp.QPN(), StartingPSN: 0x4242, RNRRetry: 7}); err != nil {
		t.Fatal(err)
	}
	c := <-dialed
	if c == nil {
		t.FailNow()
	}
	if _, err := c.QP().PostSend([]verbs.SendWR{{ID: 1, Opcode: ib.Send, Flags: ib.Signaled,
		SG: []ib.SGE{{Addr: mra.IOVA(), Length: 4, LKey: mra.LKey()}}}}); err != nil {
		t.Fatal(err)
	}
	eb.next(t, cm.EventEstablished)
	if st := eb.ev.Stats(); st.CommEst != 1 || dp.dropped.Load() == 0 {
		t.Fatalf("COMM_EST %d, RTUs dropped %d", st.CommEst, dp.dropped.Load())
	}
}

// Closing the event interface releases its services (a request is then
// refused as for nobody listening) and lets the agent start another.
func TestEventCMClose(t *testing.T) {
	a, b := pair(t, nil)
	eb := b.eventCM(t)
	if err := eb.ev.Listen(cm.ServiceIDTCP(7400)); err != nil {
		t.Fatal(err)
	}
	eb.ev.Close()
	pa, _ := a.params(t, 0)
	_, err := dial(ctx10(t), a.agent, ipB, 7400, pa)
	var rej *RejectedError
	if !errors.As(err, &rej) || rej.Reason != cm.RejInvalidServiceID {
		t.Fatalf("connect to a closed interface's service: %v", err)
	}
	ev2, err := b.agent.EventCM(func(*cm.Event) {})
	if err != nil {
		t.Fatal(err)
	}
	if err := ev2.Listen(cm.ServiceIDTCP(7400)); err != nil {
		t.Fatalf("the service after Close: %v", err)
	}
}

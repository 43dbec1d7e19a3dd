package cm

import (
	"errors"
	"testing"
)

// A deferred RTU (rdma_cm's CONNECT_RESPONSE, then rdma_establish): the
// REP is reported, nothing answers it until Establish, a REP resent
// meanwhile is absorbed, and Establish sends the one RTU that establishes
// the passive side.
func TestDeferredRTU(t *testing.T) {
	n := newNet(t, Config{}, Config{})
	n.b.accept = &AcceptParams{QPN: 0x22, StartingPSN: 0x222222, ResponderResources: 1, InitiatorDepth: 1,
		RNRRetry: 7, PrivateData: []byte("rep")}
	if err := n.b.m.Listen(svc, ListenOptions{RDMACM: true}); err != nil {
		t.Fatal(err)
	}
	p := connectParams()
	p.DeferRTU = true
	id, err := n.a.m.Connect(n.now, p)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.a.m.Establish(n.now, id); !errors.Is(err, ErrBadState) {
		t.Fatalf("Establish before the REP: %v", err)
	}
	n.settle()
	e := n.a.last(EventConnResponse)
	if e == nil || n.a.last(EventEstablished) != nil || n.b.last(EventEstablished) != nil || n.a.m.State(id) != StateREPRcvd {
		t.Fatalf("after REP: a %v, b %v, state %v", n.a.kinds(), n.b.kinds(), n.a.m.State(id))
	}
	if e.QP.RemoteQPN != 0x22 || e.QP.SQPSN != 0x222222 || e.QP.RQPSN != 0x111111 || string(e.Private()[:3]) != "rep" {
		t.Fatalf("CONN_RESPONSE %+v", e.QP)
	}
	if count(n.sent, AttrRTU) != 0 {
		t.Fatal("an RTU before Establish")
	}
	// B resends its REP (the RTU is late): A absorbs it.
	n.advance()
	if count(n.sent, AttrREP) != 2 || count(n.sent, AttrRTU) != 0 || n.a.m.Stats().Duplicates != 1 {
		t.Fatalf("%d REPs, %d RTUs, %d duplicates", count(n.sent, AttrREP), count(n.sent, AttrRTU), n.a.m.Stats().Duplicates)
	}
	if err := n.a.m.Establish(n.now, id); err != nil {
		t.Fatal(err)
	}
	n.settle()
	if count(n.sent, AttrRTU) != 1 || n.b.last(EventEstablished) == nil || n.a.m.State(id) != StateEstablished {
		t.Fatalf("after Establish: %d RTUs, b %v, state %v", count(n.sent, AttrRTU), n.b.kinds(), n.a.m.State(id))
	}
	if err := n.a.m.Establish(n.now, id); !errors.Is(err, ErrBadState) {
		t.Fatalf("second Establish: %v", err)
	}
}

// The owner of a deferred connection refuses the REP (its QP could not be
// moved): the passive side hears a REJ of its REP, with the reason and
// private data given.
func TestDeferredRTURejected(t *testing.T) {
	n := newNet(t, Config{}, Config{})
	n.b.accept = &AcceptParams{QPN: 0x22, StartingPSN: 5}
	if err := n.b.m.Listen(svc, ListenOptions{RDMACM: true}); err != nil {
		t.Fatal(err)
	}
	p := connectParams()
	p.DeferRTU = true
	id, _ := n.a.m.Connect(n.now, p)
	n.settle()
	if err := n.a.m.Reject(n.now, id, RejConsumerDefined, []byte("qp")); err != nil {
		t.Fatal(err)
	}
	n.settle()
	e := n.b.last(EventRejected)
	if e == nil || e.Reason != RejConsumerDefined || string(e.Private()[:2]) != "qp" || n.a.m.State(id) != StateTimeWait {
		t.Fatalf("b %v, a state %v", n.b.kinds(), n.a.m.State(id))
	}
	var rej REJ
	for _, s := range n.sent {
		if MAD(s.MAD[:]).AttrID() == AttrREJ {
			rej.Decode(MAD(s.MAD[:]).Data())
		}
	}
	if rej.MessageRejected != MsgREP {
		t.Fatalf("REJ of message %d, want the REP's", rej.MessageRejected)
	}
}

// A DREQ that nobody answers ends in EventDisconnected marked TimedOut;
// one answered does not.
func TestDisconnectedTimedOut(t *testing.T) {
	n := newNet(t, Config{MaxCMRetries: 2}, Config{})
	n.b.accept = &AcceptParams{QPN: 0x22, StartingPSN: 5}
	if err := n.b.m.Listen(svc, ListenOptions{RDMACM: true}); err != nil {
		t.Fatal(err)
	}
	id, _ := n.a.m.Connect(n.now, connectParams())
	n.settle()
	n.drop = func(*node, MAD) bool { return true }
	if err := n.a.m.Disconnect(n.now, id, nil); err != nil {
		t.Fatal(err)
	}
	n.settle()
	for n.a.last(EventDisconnected) == nil {
		n.advance()
	}
	if e := n.a.last(EventDisconnected); !e.TimedOut || count(n.sent, AttrDREQ) != 3 || n.a.m.Stats().Timeouts != 1 {
		t.Fatalf("timed out %v after %d DREQs, %d timeouts counted", e.TimedOut, count(n.sent, AttrDREQ), n.a.m.Stats().Timeouts)
	}
	n2 := newNet(t, Config{}, Config{})
	n2.b.accept = &AcceptParams{QPN: 0x22, StartingPSN: 5}
	if err := n2.b.m.Listen(svc, ListenOptions{RDMACM: true}); err != nil {
		t.Fatal(err)
	}
	id2, _ := n2.a.m.Connect(n2.now, connectParams())
	n2.settle()
	if err := n2.a.m.Disconnect(n2.now, id2, nil); err != nil {
		t.Fatal(err)
	}
	n2.settle()
	if e := n2.a.last(EventDisconnected); e == nil || e.TimedOut {
		t.Fatalf("answered DREQ: %v", n2.a.kinds())
	}
}

package cm

import (
	"bytes"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/softrnic/softrnic/clock"
)

var (
	addrA = netip.MustParseAddr("10.0.0.1")
	addrB = netip.MustParseAddr("10.0.0.2")
)

// node is one side of an in-memory CM test: a Manager, its address, the
// events it produced, and a policy for EventConnRequest.
type node struct {
	m      *Manager
	addr   netip.Addr
	events []Event
	accept *AcceptParams // nil: leave requests unanswered
}

// net joins two nodes; drop decides, per MAD, whether the wire loses it.
type net struct {
	t    *testing.T
	now  clock.Time
	a, b *node
	drop func(from *node, mad MAD) bool
	sent []Send // every MAD that crossed (or was lost on) the wire
}

func newNet(t *testing.T, cfgA, cfgB Config) *net {
	cfgA.CAGUID, cfgB.CAGUID = 0xA, 0xB
	cfgA.Seed, cfgB.Seed = 1, 2
	return &net{t: t, a: &node{m: New(cfgA), addr: addrA}, b: &node{m: New(cfgB), addr: addrB}}
}

func (n *net) other(x *node) *node {
	if x == n.a {
		return n.b
	}
	return n.a
}

// settle moves MADs between the nodes, acting on events, until both are
// quiet. It never advances time.
func (n *net) settle() {
	for range 100 {
		moved := false
		for _, x := range []*node{n.a, n.b} {
			evs, sends := x.m.Drain()
			for _, e := range evs {
				x.events = append(x.events, e)
				if e.Kind == EventConnRequest && x.accept != nil {
					if err := x.m.Accept(n.now, e.ID, x.accept); err != nil {
						n.t.Fatal(err)
					}
					moved = true
				}
			}
			for _, s := range sends {
				moved = true
				n.sent = append(n.sent, s)
				if n.drop != nil && n.drop(x, MAD(s.MAD[:])) {
					continue
				}
				y := n.other(x)
				if s.To != y.addr {
					n.t.Fatalf("MAD to %v, peer is %v", s.To, y.addr)
				}
				if err := y.m.HandleMAD(n.now, x.addr, s.MAD[:]); err != nil {
					n.t.Fatal(err)
				}
			}
		}
		if !moved {
			return
		}
	}
	n.t.Fatal("CM exchange does not settle")
}

// advance moves virtual time to the earlier deadline of the two managers
// and runs their timers.
func (n *net) advance() clock.Time {
	d := clock.Min(n.a.m.NextDeadline(), n.b.m.NextDeadline())
	if d == clock.Never {
		n.t.Fatal("no timer pending")
	}
	n.now = max(n.now, d)
	n.a.m.Tick(n.now)
	n.b.m.Tick(n.now)
	n.settle()
	return n.now
}

func (x *node) kinds() []EventKind {
	var k []EventKind
	for _, e := range x.events {
		k = append(k, e.Kind)
	}
	return k
}

func (x *node) last(kind EventKind) *Event {
	for i := len(x.events) - 1; i >= 0; i-- {
		if x.events[i].Kind == kind {
			return &x.events[i]
		}
	}
	return nil
}

func count(sends []Send, attr AttrID) int {
	k := 0
	for _, s := range sends {
		if MAD(s.MAD[:]).AttrID() == attr {
			k++
		}
	}
	return k
}

var svc = ServiceIDTCP(7174)

func connectParams() *ConnectParams {
	return &ConnectParams{Peer: addrB, Local: addrA, ServiceID: svc, QPN: 0x11, StartingPSN: 0x111111,
		PathMTU: 5, ResponderResources: 4, InitiatorDepth: 8, RetryCount: 7, RNRRetry: 6,
		RDMACM: true, SrcPort: 40000, PrivateData: []byte("hello")}
}

func TestActiveAgainstPassiveInMemory(t *testing.T) {
	n := newNet(t, Config{}, Config{})
	n.b.accept = &AcceptParams{QPN: 0x22, StartingPSN: 0x222222, ResponderResources: 16, InitiatorDepth: 2,
		RNRRetry: 5, PrivateData: []byte("world")}
	if err := n.b.m.Listen(svc, ListenOptions{RDMACM: true, Addr: addrB}); err != nil {
		t.Fatal(err)
	}
	id, err := n.a.m.Connect(n.now, connectParams())
	if err != nil {
		t.Fatal(err)
	}
	n.settle()
	ea, eb := n.a.last(EventEstablished), n.b.last(EventEstablished)
	if ea == nil || eb == nil {
		t.Fatalf("events: a %v, b %v", n.a.kinds(), n.b.kinds())
	}
	req := n.b.last(EventConnRequest)
	if !req.HasCMA || req.CMA.SrcPort != 40000 || req.CMA.Src != addrA || string(req.Private()[:5]) != "hello" {
		t.Fatalf("REQ event %+v", req)
	}
	if string(ea.Private()[:5]) != "world" {
		t.Fatalf("REP private data %q", ea.Private()[:5])
	}
	qa, qb := ea.QP, eb.QP
	// Each QP points at the other, with the other's PSNs.
	if qa.QPN != 0x11 || qa.RemoteQPN != 0x22 || qb.QPN != 0x22 || qb.RemoteQPN != 0x11 ||
		qa.SQPSN != qb.RQPSN || qb.SQPSN != qa.RQPSN || qa.PathMTU != 5 || qb.PathMTU != 5 {
		t.Fatalf("QPs: a %+v, b %+v", qa, qb)
	}
	// As Linux: each side receives from the Starting PSN it put in its
	// own REQ/REP and sends from the peer's. B learns its send PSN from
	// the REQ, before it chooses its receive PSN.
	if qa.RQPSN != 0x111111 || qa.SQPSN != 0x222222 || qb.RQPSN != 0x222222 || qb.SQPSN != 0x111111 {
		t.Fatalf("PSNs: a send %#x recv %#x, b send %#x recv %#x", qa.SQPSN, qa.RQPSN, qb.SQPSN, qb.RQPSN)
	}
	if q := req.QP; q.SQPSN != 0x111111 || q.RQPSN != 0 {
		t.Fatalf("REQ event PSNs: send %#x recv %#x", q.SQPSN, q.RQPSN)
	}
	// READ/atomic depth: what one side may issue fits what the other holds.
	// B offered 16 responder resources but A only issues 8 → 8; B issues
	// 2 (≤ A's 4).
	if qb.MaxDestRdAtomic != 8 || qa.MaxRdAtomic != 8 || qb.MaxRdAtomic != 2 || qa.MaxDestRdAtomic != 2 {
		t.Fatalf("rd atomic: a %d/%d, b %d/%d", qa.MaxRdAtomic, qa.MaxDestRdAtomic, qb.MaxRdAtomic, qb.MaxDestRdAtomic)
	}
	// Retry policies cross over: the REQ's go to B's QP, the REP's to A's.
	if qb.RetryCount != 7 || qb.RNRRetry != 6 || qa.RNRRetry != 5 {
		t.Fatalf("retries: a %+v b %+v", qa, qb)
	}
	// One TID for REQ, REP and RTU.
	tid := MAD(n.sent[0].MAD[:]).TID()
	for _, s := range n.sent {
		if MAD(s.MAD[:]).TID() != tid {
			t.Fatalf("%v has TID %x, REQ had %x", MAD(s.MAD[:]).AttrID(), MAD(s.MAD[:]).TID(), tid)
		}
	}
	if len(n.sent) != 3 || n.a.m.NextDeadline() != clock.Never || n.b.m.NextDeadline() != clock.Never {
		t.Fatalf("%d MADs, deadlines %v %v", len(n.sent), n.a.m.NextDeadline(), n.b.m.NextDeadline())
	}
	// On the wire: each Starting PSN is the receive PSN of its sender.
	var reqMsg REQ
	var repMsg REP
	reqMsg.Decode(MAD(n.sent[0].MAD[:]).Data())
	repMsg.Decode(MAD(n.sent[1].MAD[:]).Data())
	if reqMsg.StartingPSN != qa.RQPSN || repMsg.StartingPSN != qb.RQPSN {
		t.Fatalf("REQ Starting PSN %#x, REP %#x", reqMsg.StartingPSN, repMsg.StartingPSN)
	}

	// B disconnects; A answers; both sit in time-wait, then release.
	if err := n.b.m.Disconnect(n.now, eb.ID, nil); err != nil {
		t.Fatal(err)
	}
	n.settle()
	if n.a.last(EventDisconnectRequest) == nil || n.b.last(EventDisconnected) == nil {
		t.Fatalf("events: a %v, b %v", n.a.kinds(), n.b.kinds())
	}
	if n.a.m.State(id) != StateTimeWait || n.b.m.State(eb.ID) != StateTimeWait {
		t.Fatal("not in time-wait")
	}
	for n.a.m.Conns()+n.b.m.Conns() > 0 {
		n.advance()
	}
	if n.a.last(EventTimeWaitExit) == nil || n.b.last(EventTimeWaitExit) == nil || n.a.m.Conns()+n.b.m.Conns() != 0 {
		t.Fatalf("time-wait not left: a %v, b %v", n.a.kinds(), n.b.kinds())
	}
}

func TestREQRetransmittedThenTimeout(t *testing.T) {
	n := newNet(t, Config{MaxCMRetries: 3}, Config{})
	n.drop = func(*node, MAD) bool { return true } // B is unreachable
	start := clock.Time(7)
	n.now = start
	id, err := n.a.m.Connect(n.now, connectParams())
	if err != nil {
		t.Fatal(err)
	}
	n.settle()
	// Retransmission every CM response timeout (20) plus two packet life
	// times (18): 4.096 µs × (2^20 + 2 × 2^18).
	period := Timeout(20) + 2*Timeout(18)
	for i := 1; i <= 3; i++ {
		if at := n.advance(); at != start.Add(time.Duration(i)*period) {
			t.Fatalf("retransmission %d at %v, want %v", i, at, start.Add(time.Duration(i)*period))
		}
	}
	if got := count(n.sent, AttrREQ); got != 4 {
		t.Fatalf("%d REQs, want 1 + 3 retries", got)
	}
	for _, s := range n.sent[1:] {
		if !bytes.Equal(s.MAD[:], n.sent[0].MAD[:]) {
			t.Fatal("a retransmitted REQ differs from the first")
		}
	}
	n.advance()
	e := n.a.last(EventTimeout)
	if e == nil || e.ID != id || n.a.m.State(id) != StateTimeWait {
		t.Fatalf("after retries: %v, state %v", n.a.kinds(), n.a.m.State(id))
	}
	last := n.sent[len(n.sent)-1]
	var rej REJ
	rej.Decode(MAD(last.MAD[:]).Data())
	if MAD(last.MAD[:]).AttrID() != AttrREJ || rej.Reason != RejTimeout || rej.LocalCommID != uint32(id) {
		t.Fatalf("give-up MAD %v %+v", MAD(last.MAD[:]).AttrID(), rej)
	}
	if st := n.a.m.Stats(); st.Retransmits != 3 {
		t.Fatalf("Retransmits %d", st.Retransmits)
	}
}

func TestUnknownServiceIsRejectedWithReason8(t *testing.T) {
	n := newNet(t, Config{}, Config{})
	id, _ := n.a.m.Connect(n.now, connectParams()) // B listens on nothing
	n.settle()
	rejMAD := MAD(n.sent[1].MAD[:])
	var rej REJ
	rej.Decode(rejMAD.Data())
	if rejMAD.AttrID() != AttrREJ || rej.Reason != RejInvalidServiceID || rej.MessageRejected != MsgREQ ||
		rej.RemoteCommID != uint32(id) || rej.LocalCommID != 0 || rejMAD.TID() != MAD(n.sent[0].MAD[:]).TID() {
		t.Fatalf("REJ %+v", rej)
	}
	e := n.a.last(EventRejected)
	if e == nil || e.Reason != RejInvalidServiceID || n.a.m.State(id) != StateIdle || n.b.m.Conns() != 0 {
		t.Fatalf("active side: %v, state %v", n.a.kinds(), n.a.m.State(id))
	}
	if RejInvalidServiceID.String() != "invalid service ID" {
		t.Fatal(RejInvalidServiceID.String())
	}
	if st := n.b.m.Stats(); st.NoListener != 1 || n.a.m.Stats().NoListener != 0 {
		t.Fatalf("no-listener counts: b %d, a %d", st.NoListener, n.a.m.Stats().NoListener)
	}
}

func TestWrongAddressOrMissingCMAHeaderRejected(t *testing.T) {
	n := newNet(t, Config{}, Config{})
	if err := n.b.m.Listen(svc, ListenOptions{RDMACM: true, Addr: netip.MustParseAddr("10.9.9.9")}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.a.m.Connect(n.now, connectParams()); err != nil {
		t.Fatal(err)
	}
	n.settle()
	if e := n.a.last(EventRejected); e == nil || e.Reason != RejConsumerDefined {
		t.Fatalf("wrong destination address: %v", n.a.kinds())
	}
	n2 := newNet(t, Config{}, Config{})
	if err := n2.b.m.Listen(svc, ListenOptions{RDMACM: true}); err != nil {
		t.Fatal(err)
	}
	p := connectParams()
	p.RDMACM = false
	if _, err := n2.a.m.Connect(n2.now, p); err != nil {
		t.Fatal(err)
	}
	n2.settle()
	if e := n2.a.last(EventRejected); e == nil || e.Reason != RejConsumerDefined {
		t.Fatalf("no cma_hdr: %v", n2.a.kinds())
	}
}

func TestLostREPIsResentOnDuplicateREQ(t *testing.T) {
	// B's longer packet life time makes its REP timer fire after A's REQ
	// timer, so that the duplicate REQ is what brings the REP back.
	n := newNet(t, Config{}, Config{PacketLifeTime: 20})
	n.b.accept = &AcceptParams{QPN: 0x22, StartingPSN: 5}
	if err := n.b.m.Listen(svc, ListenOptions{RDMACM: true}); err != nil {
		t.Fatal(err)
	}
	lost := false
	n.drop = func(from *node, mad MAD) bool {
		if mad.AttrID() == AttrREP && !lost {
			lost = true
			return true
		}
		return false
	}
	id, _ := n.a.m.Connect(n.now, connectParams())
	n.settle()
	// The active side's REQ timer fires first (B's REP timer counts from
	// B's response timeout too, but started later).
	n.advance()
	if n.a.m.State(id) != StateEstablished {
		t.Fatalf("not established after the REQ retry: %v", n.a.m.State(id))
	}
	reps := 0
	var first []byte
	for _, s := range n.sent {
		if MAD(s.MAD[:]).AttrID() == AttrREP {
			reps++
			if first == nil {
				first = s.MAD[:]
			} else if !bytes.Equal(first, s.MAD[:]) {
				t.Fatal("resent REP differs")
			}
		}
	}
	if reps != 2 || count(n.sent, AttrREQ) != 2 || n.b.m.Stats().Duplicates != 1 {
		t.Fatalf("%d REPs, %d REQs, %d duplicates", reps, count(n.sent, AttrREQ), n.b.m.Stats().Duplicates)
	}
	if len(n.b.events) != 2 { // one ConnRequest, one Established: the duplicate made no new connection
		t.Fatalf("passive events %v", n.b.kinds())
	}
}

func TestLostRTURecoveredByREPRetransmit(t *testing.T) {
	n := newNet(t, Config{}, Config{})
	n.b.accept = &AcceptParams{QPN: 0x22, StartingPSN: 5}
	if err := n.b.m.Listen(svc, ListenOptions{RDMACM: true}); err != nil {
		t.Fatal(err)
	}
	lost := false
	n.drop = func(from *node, mad MAD) bool {
		if mad.AttrID() == AttrRTU && !lost {
			lost = true
			return true
		}
		return false
	}
	if _, err := n.a.m.Connect(n.now, connectParams()); err != nil {
		t.Fatal(err)
	}
	n.settle()
	eb := n.b.last(EventConnRequest)
	if n.b.m.State(eb.ID) != StateREPSent {
		t.Fatal(n.b.m.State(eb.ID))
	}
	// REP retransmission after the REQ's local CM response timeout (20)
	// plus two packet life times; A answers the duplicate REP with RTU.
	n.advance()
	if n.b.m.State(eb.ID) != StateEstablished || count(n.sent, AttrRTU) != 2 || n.a.m.Stats().Duplicates != 1 {
		t.Fatalf("state %v, %d RTUs", n.b.m.State(eb.ID), count(n.sent, AttrRTU))
	}
}

func TestNotifyEstablishedWhenRTUNeverComes(t *testing.T) {
	n := newNet(t, Config{}, Config{})
	n.b.accept = &AcceptParams{QPN: 0x22, StartingPSN: 5}
	if err := n.b.m.Listen(svc, ListenOptions{RDMACM: true}); err != nil {
		t.Fatal(err)
	}
	n.drop = func(from *node, mad MAD) bool { return mad.AttrID() == AttrRTU }
	if _, err := n.a.m.Connect(n.now, connectParams()); err != nil {
		t.Fatal(err)
	}
	n.settle()
	id := n.b.last(EventConnRequest).ID
	// The QP saw the first data packet in RTR.
	if err := n.b.m.NotifyEstablished(n.now, id); err != nil {
		t.Fatal(err)
	}
	n.settle()
	if n.b.m.State(id) != StateEstablished || n.b.last(EventEstablished) == nil || n.b.m.NextDeadline() != clock.Never {
		t.Fatalf("state %v", n.b.m.State(id))
	}
}

func TestDuplicateDREQGetsDREPAgain(t *testing.T) {
	n := newNet(t, Config{}, Config{})
	n.b.accept = &AcceptParams{QPN: 0x22, StartingPSN: 5}
	if err := n.b.m.Listen(svc, ListenOptions{RDMACM: true}); err != nil {
		t.Fatal(err)
	}
	p := connectParams()
	p.LocalACKTimeout = 22 // ≈ 17 s
	id, _ := n.a.m.Connect(n.now, p)
	n.settle()
	lost := false
	n.drop = func(from *node, mad MAD) bool {
		if mad.AttrID() == AttrDREP && !lost {
			lost = true
			return true
		}
		return false
	}
	if err := n.a.m.Disconnect(n.now, id, []byte("bye")); err != nil {
		t.Fatal(err)
	}
	// B's time-wait lasts one local ACK timeout of the connection (from
	// the REQ), here longer than A's DREQ retry period, so that the
	// duplicate DREQ finds B in time-wait.
	n.settle()
	eb := n.b.last(EventDisconnectRequest)
	if eb == nil || string(eb.Private()[:3]) != "bye" || n.a.m.State(id) != StateDREQSent {
		t.Fatalf("after DREQ: b %v, a state %v", n.b.kinds(), n.a.m.State(id))
	}
	n.advance() // A resends DREQ; B, in time-wait, answers again
	if n.a.last(EventDisconnected) == nil || count(n.sent, AttrDREQ) != 2 || count(n.sent, AttrDREP) != 2 {
		t.Fatalf("a %v, %d DREQ, %d DREP", n.a.kinds(), count(n.sent, AttrDREQ), count(n.sent, AttrDREP))
	}
	if n.b.m.Stats().Duplicates != 1 || len(n.b.events) != 3 { // request, established, one disconnect request
		t.Fatalf("b events %v", n.b.kinds())
	}
}

func TestDREQForUnknownConnectionIsAnswered(t *testing.T) {
	m := New(Config{Seed: 3})
	var b [MADSize]byte
	mad := MAD(b[:])
	mad.InitCM(AttrDREQ, 0x77)
	(&DREQ{LocalCommID: 5, RemoteCommID: 9, RemoteQPN: 0x33}).Encode(mad.Data())
	if err := m.HandleMAD(0, addrA, b[:]); err != nil {
		t.Fatal(err)
	}
	_, sends := m.Drain()
	s := one(t, "DREP", sends)
	var drep DREP
	drep.Decode(MAD(s.MAD[:]).Data())
	if MAD(s.MAD[:]).AttrID() != AttrDREP || MAD(s.MAD[:]).TID() != 0x77 || drep.LocalCommID != 9 || drep.RemoteCommID != 5 || s.To != addrA {
		t.Fatalf("DREP %+v", drep)
	}
}

func TestMRAStopsREQRetriesAndIsRepeated(t *testing.T) {
	n := newNet(t, Config{}, Config{})
	// B accepts by hand
	if err := n.b.m.Listen(svc, ListenOptions{RDMACM: true}); err != nil {
		t.Fatal(err)
	}
	id, _ := n.a.m.Connect(n.now, connectParams())
	n.settle()
	reqID := n.b.last(EventConnRequest).ID
	// B needs 2^24 × 4.096 µs ≈ 69 s: it MRAs.
	if err := n.b.m.SendMRA(n.now, reqID, 24); err != nil {
		t.Fatal(err)
	}
	n.settle()
	if n.a.m.State(id) != StateMRAREQRcvd {
		t.Fatalf("active state %v", n.a.m.State(id))
	}
	// A now waits the service timeout plus a round trip before its retry.
	want := n.now.Add(Timeout(24) + 2*Timeout(18))
	if d := n.a.m.NextDeadline(); d != want {
		t.Fatalf("A's next retry at %v, want %v", d, want)
	}
	n.a.m.Tick(want)
	n.settle() // the duplicate REQ is answered with the MRA again
	if count(n.sent, AttrMRA) != 2 {
		t.Fatalf("%d MRAs", count(n.sent, AttrMRA))
	}
	if err := n.b.m.Accept(n.now, reqID, &AcceptParams{QPN: 0x22, StartingPSN: 1}); err != nil {
		t.Fatal(err)
	}
	n.settle()
	if n.a.m.State(id) != StateEstablished || n.b.m.State(reqID) != StateEstablished {
		t.Fatalf("states %v %v", n.a.m.State(id), n.b.m.State(reqID))
	}
}

func TestRejectByApplication(t *testing.T) {
	n := newNet(t, Config{}, Config{})
	if err := n.b.m.Listen(svc, ListenOptions{RDMACM: true}); err != nil {
		t.Fatal(err)
	}
	id, _ := n.a.m.Connect(n.now, connectParams())
	n.settle()
	reqID := n.b.last(EventConnRequest).ID
	if err := n.b.m.Reject(n.now, reqID, RejConsumerDefined, []byte("busy")); err != nil {
		t.Fatal(err)
	}
	n.settle()
	e := n.a.last(EventRejected)
	if e == nil || e.Reason != RejConsumerDefined || string(e.Private()[:4]) != "busy" || n.a.m.State(id) != StateIdle {
		t.Fatalf("a %v", n.a.kinds())
	}
	if err := n.b.m.Accept(n.now, reqID, &AcceptParams{QPN: 1}); !errors.Is(err, ErrBadState) {
		t.Fatalf("Accept after Reject: %v", err)
	}
	// The REJ is lost: A's REQ retry gets the same REJ from B, not a new
	// request to B's application.
	rej := n.sent[len(n.sent)-1]
	if err := n.b.m.HandleMAD(n.now, addrA, n.sent[0].MAD[:]); err != nil {
		t.Fatal(err)
	}
	evs, sends := n.b.m.Drain()
	if len(evs) != 0 || len(sends) != 1 || sends[0].MAD != rej.MAD {
		t.Fatalf("duplicate REQ after Reject: %d events, %d sends", len(evs), len(sends))
	}
	// B forgets it once A's retries would be over, with no event.
	n.b.events = nil
	for n.b.m.Conns() > 0 {
		n.advance()
	}
	if len(n.b.events) != 0 {
		t.Fatalf("events for a rejected request: %v", n.b.kinds())
	}
}

func TestUnansweredRequestTimesOutOnPassiveSide(t *testing.T) {
	n := newNet(t, Config{MaxCMRetries: 2}, Config{})
	if err := n.b.m.Listen(svc, ListenOptions{RDMACM: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.a.m.Connect(n.now, connectParams()); err != nil {
		t.Fatal(err)
	}
	n.settle()
	for range 10 {
		if n.b.m.Conns() == 0 {
			break
		}
		n.advance()
	}
	if n.b.m.Conns() != 0 || n.b.last(EventTimeout) == nil || n.a.last(EventTimeout) == nil {
		t.Fatalf("a %v, b %v, b conns %d", n.a.kinds(), n.b.kinds(), n.b.m.Conns())
	}
}

func TestTimeWaitKeepsCommIDFromReuse(t *testing.T) {
	n := newNet(t, Config{}, Config{})
	n.b.accept = &AcceptParams{QPN: 0x22, StartingPSN: 5}
	if err := n.b.m.Listen(svc, ListenOptions{RDMACM: true}); err != nil {
		t.Fatal(err)
	}
	id, _ := n.a.m.Connect(n.now, connectParams())
	n.settle()
	if err := n.a.m.Disconnect(n.now, id, nil); err != nil {
		t.Fatal(err)
	}
	n.settle()
	// Many new connections while id is in time-wait: none gets id.
	for range 2000 {
		nid, err := n.a.m.Connect(n.now, connectParams())
		if err != nil {
			t.Fatal(err)
		}
		if nid == id {
			t.Fatal("comm ID reused during time-wait")
		}
	}
	if n.a.m.State(id) != StateTimeWait {
		t.Fatal(n.a.m.State(id))
	}
}

func TestSIDR(t *testing.T) {
	n := newNet(t, Config{}, Config{})
	udp := ServiceIDUDP(4791)
	if err := n.b.m.Listen(udp, ListenOptions{RDMACM: true}); err != nil {
		t.Fatal(err)
	}
	lost := false
	n.drop = func(from *node, mad MAD) bool {
		if mad.AttrID() == AttrSIDRREP && !lost {
			lost = true
			return true
		}
		return false
	}
	id, err := n.a.m.ResolveService(n.now, &SIDRParams{Peer: addrB, Local: addrA, ServiceID: udp, RDMACM: true, SrcPort: 1})
	if err != nil {
		t.Fatal(err)
	}
	n.settle()
	req := n.b.last(EventSIDRRequest)
	if req == nil || !req.HasCMA || req.CMA.Src != addrA || req.ServiceID != udp {
		t.Fatalf("b %v", n.b.kinds())
	}
	if err := n.b.m.SIDRReply(n.now, req.ID, &SIDRReplyParams{Status: SIDRSuccess, QPN: 0x44, QKey: RDMAUDPQKey}); err != nil {
		t.Fatal(err)
	}
	n.settle()  // the reply is lost
	n.advance() // A retries; B repeats its reply
	rep := n.a.last(EventSIDRReply)
	if rep == nil || rep.ID != id || rep.SIDRStatus != SIDRSuccess || rep.QP.RemoteQPN != 0x44 || rep.QKey != RDMAUDPQKey {
		t.Fatalf("a %v %+v", n.a.kinds(), rep)
	}
	if count(n.sent, AttrSIDRREP) != 2 || len(n.b.events) != 1 {
		t.Fatalf("%d SIDR_REPs, b events %v", count(n.sent, AttrSIDRREP), n.b.kinds())
	}
	// Unknown service: status 1 at once, no event on the passive side.
	id2, _ := n.a.m.ResolveService(n.now, &SIDRParams{Peer: addrB, ServiceID: ServiceIDUDP(1)})
	n.settle()
	if e := n.a.last(EventSIDRReply); e.ID != id2 || e.SIDRStatus != SIDRUnsupported || len(n.b.events) != 1 {
		t.Fatalf("unknown service: %+v", e)
	}
}

func TestMalformedMADsAreCountedNotFatal(t *testing.T) {
	m := New(Config{})
	if err := m.Listen(svc, ListenOptions{RDMACM: true}); err != nil {
		t.Fatal(err)
	}
	if err := m.HandleMAD(0, addrA, make([]byte, 100)); err == nil {
		t.Fatal("short MAD accepted")
	}
	var b [MADSize]byte
	MAD(b[:]).InitCM(AttrLAP, 1)
	if err := m.HandleMAD(0, addrA, b[:]); err != nil {
		t.Fatal(err)
	}
	if st := m.Stats(); st.Malformed != 1 || st.Unsupported != 1 {
		t.Fatalf("%+v", st)
	}
}

func TestAckTimeoutRule(t *testing.T) {
	for _, c := range []struct{ delay, life, want uint8 }{
		{15, 16, 17}, // round trip 2^17 dominates; delay is far smaller
		{17, 16, 18}, // equal terms: the sum doubles
		{20, 16, 20}, // delay dominates
		{18, 16, 19}, // delay within a factor two of the round trip
		{31, 31, 31},
	} {
		if got := ackTimeout(c.delay, c.life); got != c.want {
			t.Errorf("ackTimeout(%d, %d) = %d, want %d", c.delay, c.life, got, c.want)
		}
	}
}

func TestMADsFromAThirdHostAreIgnored(t *testing.T) {
	n := newNet(t, Config{}, Config{})
	n.b.accept = &AcceptParams{QPN: 0x22, StartingPSN: 5}
	if err := n.b.m.Listen(svc, ListenOptions{RDMACM: true}); err != nil {
		t.Fatal(err)
	}
	id, _ := n.a.m.Connect(n.now, connectParams())
	n.settle()
	eb := n.b.last(EventEstablished)
	// A DREQ with the right comm IDs and QPN, from the wrong address.
	var b [MADSize]byte
	mad := MAD(b[:])
	mad.InitCM(AttrDREQ, 1)
	(&DREQ{LocalCommID: uint32(id), RemoteCommID: uint32(eb.ID), RemoteQPN: 0x22}).Encode(mad.Data())
	evil := netip.MustParseAddr("10.0.0.66")
	if err := n.b.m.HandleMAD(n.now, evil, b[:]); err != nil {
		t.Fatal(err)
	}
	evs, sends := n.b.m.Drain()
	if len(evs) != 0 || n.b.m.State(eb.ID) != StateEstablished {
		t.Fatalf("spoofed DREQ acted on: %v, state %v", evs, n.b.m.State(eb.ID))
	}
	// It is answered like any DREQ for an unknown connection (so that a
	// confused peer stops retrying), which tells the third host nothing.
	if len(sends) != 1 || sends[0].To != evil {
		t.Fatalf("sends %v", sends)
	}
	// The same DREQ from the real peer disconnects.
	if err := n.b.m.HandleMAD(n.now, addrA, b[:]); err != nil {
		t.Fatal(err)
	}
	if evs, _ := n.b.m.Drain(); len(evs) != 1 || evs[0].Kind != EventDisconnectRequest {
		t.Fatalf("real DREQ: %v", evs)
	}
}

func TestAbort(t *testing.T) {
	n := newNet(t, Config{}, Config{})
	if err := n.b.m.Listen(svc, ListenOptions{RDMACM: true}); err != nil {
		t.Fatal(err)
	}
	id, _ := n.a.m.Connect(n.now, connectParams())
	n.settle()
	reqID := n.b.last(EventConnRequest).ID
	// The active side gives up before the passive side answers.
	if err := n.a.m.Abort(n.now, id); err != nil {
		t.Fatal(err)
	}
	n.settle()
	if e := n.b.last(EventRejected); e == nil || e.ID != reqID || e.Reason != RejTimeout || n.b.m.State(reqID) != StateTimeWait {
		t.Fatalf("passive after abort: %v, state %v", n.b.kinds(), n.b.m.State(reqID))
	}
	if err := n.b.m.Accept(n.now, reqID, &AcceptParams{QPN: 1}); !errors.Is(err, ErrBadState) {
		t.Fatalf("Accept of an aborted request: %v", err)
	}
	// An established connection is aborted with a DREQ.
	n2 := newNet(t, Config{}, Config{})
	n2.b.accept = &AcceptParams{QPN: 0x22, StartingPSN: 5}
	if err := n2.b.m.Listen(svc, ListenOptions{RDMACM: true}); err != nil {
		t.Fatal(err)
	}
	id2, _ := n2.a.m.Connect(n2.now, connectParams())
	n2.settle()
	if err := n2.a.m.Abort(n2.now, id2); err != nil {
		t.Fatal(err)
	}
	n2.settle()
	if n2.b.last(EventDisconnectRequest) == nil || n2.a.last(EventDisconnected) == nil {
		t.Fatalf("a %v, b %v", n2.a.kinds(), n2.b.kinds())
	}
}

func TestNoAllocationsPerMAD(t *testing.T) {
	var d [DataSize]byte
	var req REQ
	var rep REP
	allocs := testing.AllocsPerRun(1000, func() {
		req.Decode(d[:])
		req.Encode(d[:])
		rep.Decode(d[:])
		rep.Encode(d[:])
		_, _ = DecodeCMAHeader(req.PrivateData[:])
	})
	if allocs != 0 {
		t.Fatalf("codec: %v allocations", allocs)
	}
	// Steady-state MAD handling (here: DREQs for unknown connections, each
	// answered with a DREP) allocates nothing once Drain's buffers grew.
	m := New(Config{Seed: 4})
	var b [MADSize]byte
	mad := MAD(b[:])
	mad.InitCM(AttrDREQ, 0x77)
	(&DREQ{LocalCommID: 5, RemoteCommID: 9, RemoteQPN: 0x33}).Encode(mad.Data())
	for range 4 {
		if err := m.HandleMAD(0, addrA, b[:]); err != nil {
			t.Fatal(err)
		}
		m.Drain()
	}
	allocs = testing.AllocsPerRun(1000, func() {
		if err := m.HandleMAD(0, addrA, b[:]); err != nil {
			t.Fatal(err)
		}
		m.Drain()
	})
	if allocs != 0 {
		t.Fatalf("HandleMAD: %v allocations", allocs)
	}
}

// BenchmarkConnectDisconnect measures whole connection lifetimes between
// two Managers in memory: REQ, REP, RTU, DREQ, DREP, time-wait exit.
func BenchmarkConnectDisconnect(b *testing.B) {
	t := &testing.T{}
	n := newNet(t, Config{}, Config{})
	n.b.accept = &AcceptParams{QPN: 0x22, StartingPSN: 5}
	if err := n.b.m.Listen(svc, ListenOptions{RDMACM: true}); err != nil {
		b.Fatal(err)
	}
	p := connectParams()
	b.ReportAllocs()
	for b.Loop() {
		id, err := n.a.m.Connect(n.now, p)
		if err != nil {
			b.Fatal(err)
		}
		n.settle()
		if err := n.a.m.Disconnect(n.now, id, nil); err != nil {
			b.Fatal(err)
		}
		n.settle()
		n.now += clock.Time(time.Hour)
		n.a.m.Tick(n.now)
		n.b.m.Tick(n.now)
		n.a.m.Drain()
		n.b.m.Drain()
		n.a.events, n.b.events, n.sent = n.a.events[:0], n.b.events[:0], n.sent[:0]
	}
	if n.a.m.Conns()+n.b.m.Conns() != 0 {
		b.Fatal("connections left")
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "conns/s")
}

func BenchmarkDecodeREQ(b *testing.B) {
	var d [MADSize]byte
	MAD(d[:]).InitCM(AttrREQ, 1)
	(&REQ{ServiceID: svc, LocalQPN: 0x11, PathMTU: 3}).Encode(MAD(d[:]).Data())
	var req REQ
	b.ReportAllocs()
	for b.Loop() {
		m, err := ParseMAD(d[:])
		if err != nil {
			b.Fatal(err)
		}
		req.Decode(m.Data())
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "MADs/s")
}

func TestStaleConnectionRejected(t *testing.T) {
	n := newNet(t, Config{}, Config{})
	n.b.accept = &AcceptParams{QPN: 0x22, StartingPSN: 5}
	if err := n.b.m.Listen(svc, ListenOptions{RDMACM: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.a.m.Connect(n.now, connectParams()); err != nil {
		t.Fatal(err)
	}
	n.settle()
	// A forgets the connection (a restart) and connects again from the same
	// QP: B still holds it, and refuses with "stale connection".
	restarted := New(Config{CAGUID: 0xA, Seed: 99})
	n.a.m = restarted
	n.a.events = nil
	if _, err := n.a.m.Connect(n.now, connectParams()); err != nil {
		t.Fatal(err)
	}
	n.settle()
	if e := n.a.last(EventRejected); e == nil || e.Reason != RejStaleConn {
		t.Fatalf("a %v", n.a.kinds())
	}
	// Once B's connection is gone, the same QP may connect.
	eb := n.b.last(EventEstablished)
	if err := n.b.m.Disconnect(n.now, eb.ID, nil); err != nil {
		t.Fatal(err)
	}
	n.settle()
	if _, err := n.a.m.Connect(n.now, connectParams()); err != nil {
		t.Fatal(err)
	}
	n.settle()
	if n.a.last(EventEstablished) == nil {
		t.Fatalf("reconnect after teardown: a %v", n.a.kinds())
	}
}

package client

import (
	"runtime"
	"testing"
	"time"

	"github.com/softrnic/softrnic/daemon"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/shmring"
	"github.com/softrnic/softrnic/verbs"
)

// nextEvent waits (bounded) for the next event of ch.
func nextEvent(t testing.TB, ch <-chan verbs.AsyncEvent) verbs.AsyncEvent {
	t.Helper()
	select {
	case e := <-ch:
		return e
	case <-time.After(10 * time.Second):
		t.Fatal("no event")
		return verbs.AsyncEvent{}
	}
}

// expectEvents waits (bounded) until every event of want arrived on ch,
// in any order, and fails on one that is not wanted.
func expectEvents(t testing.TB, ch <-chan verbs.AsyncEvent, want ...verbs.AsyncEvent) {
	t.Helper()
	left := map[verbs.AsyncEvent]bool{}
	for _, w := range want {
		left[w] = true
	}
	for len(left) > 0 {
		e := nextEvent(t, ch)
		if !left[e] {
			t.Fatalf("event %+v, want %v", e, want)
		}
		delete(left, e)
	}
}

// noEvent checks that ch stays quiet for a while (what the daemon would
// have sent is long written by then).
func noEvent(t testing.TB, ch <-chan verbs.AsyncEvent) {
	t.Helper()
	select {
	case e := <-ch:
		t.Fatalf("unexpected event %+v", e)
	case <-time.After(200 * time.Millisecond):
	}
}

// Each client gets the events of its own objects, and every client the
// port's: COMM_EST on a QP in RTR, QP_ACCESS_ERR on the responder that
// refused a WRITE and QP_FATAL on its requester, QP_FATAL when the daemon
// errors a QP whose ring holds garbage, CQ_ERR and QP_FATAL on a CQ
// overrun, SRQ_ERR for a garbled SRQ ring, PORT_ERR and PORT_ACTIVE with
// the link.
func TestAsyncEventsThroughDaemon(t *testing.T) {
	td := startDaemon(t, daemon.Options{})
	a, b := newEndpoint(t, td.path, allAccess), newEndpoint(t, td.path, allAccess)
	ea, eb := a.c.Events(), b.c.Events()

	// COMM_EST: b stays in RTR until a's SEND arrives.
	connect(t, a, b, ib.RemoteWrite)
	if err := b.qp.Modify(&ib.QPAttr{State: ib.Reset}, ib.AttrState); err != nil {
		t.Fatal(err)
	}
	for _, s := range []struct {
		attr ib.QPAttr
		mask ib.QPAttrMask
	}{
		{ib.QPAttr{State: ib.Init, Access: ib.RemoteWrite, Port: 1}, ib.AttrState | ib.AttrAccessFlags | ib.AttrPKeyIndex | ib.AttrPort},
		{ib.QPAttr{State: ib.RTR, DestQPN: a.qp.QPN(), PathMTU: 1024, RQPSN: 100, MaxDestRdAtomic: 4, MinRNRTimer: 1, AV: ib.AddressVector{DGID: gid}},
			ib.AttrState | ib.AttrAV | ib.AttrPathMTU | ib.AttrDestQPN | ib.AttrRQPSN | ib.AttrMaxDestRdAtomic | ib.AttrMinRNRTimer},
	} {
		if err := b.qp.Modify(&s.attr, s.mask); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.qp.PostRecv([]verbs.RecvWR{{ID: 1, SG: []ib.SGE{b.mr.SGE(0, 64)}}}); err != nil {
		t.Fatal(err)
	}
	if err := b.qp.SyncRecv(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := a.qp.PostSend([]verbs.SendWR{{ID: 1, Opcode: ib.Send, Flags: ib.Signaled, SG: []ib.SGE{a.mr.SGE(0, 8)}}}); err != nil {
		t.Fatal(err)
	}
	waitWC(t, a.cq)
	waitWC(t, b.cq)
	expectEvents(t, eb, verbs.AsyncEvent{Type: ib.EventCommEst, QPN: b.qp.QPN()})

	// A WRITE with a bad rkey: b's responder refuses it (QP_ACCESS_ERR),
	// a's requester fails on the NAK (QP_FATAL); each sees its own only.
	if _, err := a.qp.PostSend([]verbs.SendWR{{ID: 2, Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: []ib.SGE{a.mr.SGE(0, 8)},
		RemoteAddr: b.mr.IOVA(), RKey: b.mr.RKey() ^ 0x55}}); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, a.cq); wc.Status != ib.RemAccessErr {
		t.Fatalf("WRITE with a bad rkey: %+v", wc)
	}
	expectEvents(t, ea, verbs.AsyncEvent{Type: ib.EventQPFatal, QPN: a.qp.QPN()})
	expectEvents(t, eb, verbs.AsyncEvent{Type: ib.EventQPAccessErr, QPN: b.qp.QPN()})

	// Garbage in an SQ ring: the daemon errors the QP (QP_FATAL).
	c := newEndpoint(t, td.path, allAccess)
	ec := c.c.Events()
	connect(t, c, newEndpoint(t, td.path, allAccess), ib.RemoteWrite)
	s := c.qp.sqp.Reserve()
	for i := range s {
		s[i] = 0xff
	}
	if _, err := c.qp.sqp.Commit(); err != nil {
		t.Fatal(err)
	}
	waitWC(t, c.cq)
	expectEvents(t, ec, verbs.AsyncEvent{Type: ib.EventQPFatal, QPN: c.qp.QPN()})

	// A CQ overrun: eight signaled WRITEs into a CQ of two entries that
	// nobody polls. The CQ reports CQ_ERR, its QP goes to ERR (QP_FATAL).
	d, e := newEndpoint(t, td.path, allAccess), newEndpoint(t, td.path, allAccess)
	ed := d.c.Events()
	small := must(t)(d.c.CreateCQ(2)).(*CQ)
	d.qp = must(t)(d.pd.CreateQP(&verbs.QPInitAttr{Type: ib.RC, SendCQ: small, RecvCQ: small,
		Cap: ib.QPCaps{MaxSendWR: 16, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})).(*QP)
	connect(t, d, e, ib.RemoteWrite)
	for i := range 8 {
		if _, err := d.qp.PostSend([]verbs.SendWR{{ID: uint64(i), Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: []ib.SGE{d.mr.SGE(0, 8)},
			RemoteAddr: e.mr.IOVA(), RKey: e.mr.RKey()}}); err != nil {
			t.Fatal(err)
		}
	}
	expectEvents(t, ed, verbs.AsyncEvent{Type: ib.EventCQErr, CQ: small}, verbs.AsyncEvent{Type: ib.EventQPFatal, QPN: d.qp.QPN()})
	// The completions the full ring lost stay counted (cq_ring_dropped)
	// once the CQ is gone.
	if err := d.qp.Destroy(); err != nil {
		t.Fatal(err)
	}
	if err := small.Destroy(); err != nil {
		t.Fatal(err)
	}
	if n := td.srv.CQRingDropped.Load(); n == 0 {
		t.Fatal("completions lost on the full CQ ring not counted")
	}

	// A garbled SRQ ring: the daemon retires the SRQ (SRQ_ERR).
	srq := must(t)(c.pd.CreateSRQ(4, 1)).(*SRQ)
	slot := srq.prod.Reserve()
	slot[8] = 200 // SGEs the slot cannot hold
	if _, err := srq.prod.Commit(); err != nil {
		t.Fatal(err)
	}
	expectEvents(t, ec, verbs.AsyncEvent{Type: ib.EventSRQErr, SRQ: srq})

	// The link: every client hears of it, and Query follows.
	td.dev.SetPortActive(false)
	for _, ch := range []<-chan verbs.AsyncEvent{ea, eb, ec, ed} {
		expectEvents(t, ch, verbs.AsyncEvent{Type: ib.EventPortErr})
	}
	if a.c.Query().PortActive {
		t.Fatal("port active after PORT_ERR")
	}
	td.dev.SetPortActive(true)
	expectEvents(t, ea, verbs.AsyncEvent{Type: ib.EventPortActive})
	if !a.c.Query().PortActive {
		t.Fatal("port down after PORT_ACTIVE")
	}
	expectEvents(t, eb, verbs.AsyncEvent{Type: ib.EventPortActive})
	noEvent(t, eb) // once each
	if n := td.srv.AsyncEventsLost.Load(); n != 0 {
		t.Fatalf("%d events lost", n)
	}
}

// The daemon going away is DEVICE_FATAL, the client's last event; closing
// the client is none.
func TestDeviceFatalThroughDaemon(t *testing.T) {
	td := startDaemon(t, daemon.Options{})
	a := newEndpoint(t, td.path, allAccess)
	b := newEndpoint(t, td.path, allAccess)
	ea, eb := a.c.Events(), b.c.Events()
	b.c.Close()
	noEvent(t, eb)
	td.srv.Close(time.Second)
	expectEvents(t, ea, verbs.AsyncEvent{Type: ib.EventDeviceFatal})
	noEvent(t, ea)
}

// A client that does not read its events loses some once the daemon has
// queued proto.MaxPendingEvents for it, and every loss is counted: by the
// daemon (which tells the client with its next event) or by the device.
func TestLostEventsCounted(t *testing.T) {
	td := startDaemon(t, daemon.Options{})
	a := newEndpoint(t, td.path, allAccess)
	ev := a.c.Events()
	// Flap the port in bursts until the daemon has had to drop some: how
	// many that takes depends on how often the router ran meanwhile (the
	// device drops what it cannot hand over), which a loaded host or -race
	// changes.
	flaps := 0
	flap := func() {
		td.dev.SetPortActive(flaps%2 == 1)
		flaps++
	}
	for deadline := time.Now().Add(30 * time.Second); td.srv.AsyncEventsLost.Load() == 0; {
		if time.Now().After(deadline) {
			t.Fatalf("the daemon dropped none of %d events for a client that reads none (%d lost by the device)", flaps, td.dev.LostEvents())
		}
		for range 256 {
			flap()
		}
		time.Sleep(time.Millisecond) // the router keeps up with the device
	}
	// Read until every event is accounted for (received, or lost by the
	// daemon or the device) and the client has been told the daemon's
	// count, which comes with the next event the daemon writes after its
	// last drop. Whenever the channel stays empty a while, a flap pair is
	// such an event: the router may still be busy with the bursts, or
	// have written its whole queue before the last drop. How long the
	// channel stays empty only paces the pairs.
	got := 0
	var daemonLost, devLost uint64
	for deadline := time.Now().Add(30 * time.Second); ; {
		daemonLost = td.srv.AsyncEventsLost.Load() // the client is told at most this
		devLost = td.dev.LostEvents()
		if a.c.LostEvents() == daemonLost && uint64(got)+daemonLost+devLost >= uint64(flaps) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("received %d of %d; lost %d by the daemon (%d told), %d by the device: events lost uncounted or the client not told",
				got, flaps, daemonLost, a.c.LostEvents(), devLost)
		}
		select {
		case <-ev:
			got++
		case <-time.After(20 * time.Millisecond):
			flap()
			flap()
		}
	}
	if got >= flaps {
		t.Fatalf("received %d of %d; lost %d by the daemon (%d told), %d by the device", got, flaps, daemonLost, a.c.LostEvents(), devLost)
	}
	t.Logf("received %d of %d; lost %d by the daemon (%d told), %d by the device", got, flaps, daemonLost, a.c.LostEvents(), devLost)
}

// A client CQ ring armed for solicited completions only (what
// ibv_req_notify_cq with solicited_only does through the C library) is
// rung by the device writing completions into it only for a receive of a
// message with SE or a completion in error, once per arming; one armed
// for any completion is rung by the next. a's send completion comes after
// b's receive completion was written (the engine writes both, the ACK
// after the receive), so CQDoorbells is settled when a's is polled.
func TestSolicitedOnlyArming(t *testing.T) {
	td := startDaemon(t, daemon.Options{})
	a, b := newEndpoint(t, td.path, allAccess), newEndpoint(t, td.path, allAccess)
	connect(t, a, b, 0)
	rang := func() uint64 { return td.srv.CQDoorbells.Load() }
	// spin polls cq without arming it (waitWC would arm it for any
	// completion).
	spin := func(cq *CQ) ib.WC {
		t.Helper()
		var wcs [1]ib.WC
		for deadline := time.Now().Add(10 * time.Second); cq.Poll(wcs[:]) == 0; runtime.Gosched() {
			if time.Now().After(deadline) {
				t.Fatal("no completion")
			}
		}
		return wcs[0]
	}
	exchange := func(flags ib.SendFlags) {
		t.Helper()
		if _, err := b.qp.PostRecv([]verbs.RecvWR{{ID: 9, SG: []ib.SGE{b.mr.SGE(0, 64)}}}); err != nil {
			t.Fatal(err)
		}
		if _, err := a.qp.PostSend([]verbs.SendWR{{ID: 1, Opcode: ib.Send, Flags: ib.Signaled | flags, SG: []ib.SGE{a.mr.SGE(0, 64)}}}); err != nil {
			t.Fatal(err)
		}
		if wc := spin(a.cq); wc.Status != ib.Success {
			t.Fatalf("SEND: %+v", wc)
		}
		if wc := spin(b.cq); wc.Status != ib.Success || (wc.Flags&ib.WCSolicited != 0) != (flags&ib.Solicited != 0) {
			t.Fatalf("receive of a SEND with flags %v: %+v", flags, wc)
		}
	}
	drain := func() bool {
		t.Helper()
		got, err := b.cq.db.Drain()
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	drain()
	r0 := rang()
	if !b.cq.cons.ArmFor(shmring.WakeSolicited) {
		t.Fatal("armed a CQ ring that holds completions")
	}
	exchange(0)
	if n := rang() - r0; n != 0 || drain() {
		t.Fatalf("an unsolicited receive rang a CQ armed for solicited ones (%d)", n)
	}
	exchange(ib.Solicited)
	if n := rang() - r0; n != 1 || !drain() {
		t.Fatalf("a solicited receive rang the CQ %d times, want 1", n)
	}
	exchange(ib.Solicited)
	if n := rang() - r0; n != 1 || drain() {
		t.Fatalf("a second solicited receive rang the CQ again (%d): arming is for one wake-up", n)
	}
	b.cq.cons.ArmFor(shmring.WakeAny)
	exchange(0)
	if n := rang() - r0; n != 2 || !drain() {
		t.Fatalf("a CQ armed for any completion: %d wake-ups, want 2", n)
	}
	// A completion in error is solicited: b's posted receive flushed.
	if _, err := b.qp.PostRecv([]verbs.RecvWR{{ID: 10, SG: []ib.SGE{b.mr.SGE(0, 64)}}}); err != nil {
		t.Fatal(err)
	}
	b.cq.cons.ArmFor(shmring.WakeSolicited)
	attr := ib.QPAttr{State: ib.Err}
	if err := b.qp.Modify(&attr, ib.AttrState); err != nil {
		t.Fatal(err)
	}
	if ok, err := b.cq.db.Wait(10 * time.Second); !ok || err != nil {
		t.Fatalf("a flushed receive did not ring a CQ armed for solicited completions: %v %v", ok, err)
	}
	if wc := spin(b.cq); wc.ID != 10 || wc.Status != ib.WRFlushErr {
		t.Fatalf("flushed receive: %+v", wc)
	}
}

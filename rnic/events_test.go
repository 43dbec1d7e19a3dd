package rnic

import (
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/ibtest"
	"github.com/softrnic/softrnic/port/memlink"
	"github.com/softrnic/softrnic/verbs"
)

// drainEvents takes what a channel of events holds now.
func drainEvents(ch <-chan verbs.AsyncEvent) []verbs.AsyncEvent {
	var evs []verbs.AsyncEvent
	for {
		select {
		case e := <-ch:
			evs = append(evs, e)
		default:
			return evs
		}
	}
}

func hasEvent(evs []verbs.AsyncEvent, want verbs.AsyncEvent) bool {
	for _, e := range evs {
		if e == want {
			return true
		}
	}
	return false
}

// An SRQ's limit, armed with Modify, fires once when a receive taken
// leaves fewer than the limit, and disarms; QPs attached keep it from
// being destroyed; a QP attached that goes to ERR reports its last WQE.
// Every event reaches Events and each subscriber.
func TestSRQLimitAndLastWQE(t *testing.T) {
	tb := newTestbed(t, memlink.Impairments{}, 21, 1024)
	sub, cancel := tb.b.dev.Subscribe(16)
	defer cancel()
	srq, err := tb.b.pd.newSRQ(8, 1)
	must(t, err)
	if a, err := srq.Query(); err != nil || a != (ib.SRQAttr{MaxWR: 8, MaxSGE: 1}) {
		t.Fatalf("query %+v %v", a, err)
	}
	for _, c := range []struct {
		attr ib.SRQAttr
		mask ib.SRQAttrMask
	}{{ib.SRQAttr{Limit: 9}, ib.SRQLimit}, {ib.SRQAttr{MaxWR: 16}, ib.SRQMaxWR}, {ib.SRQAttr{}, 1 << 5}} {
		if err := srq.Modify(&c.attr, c.mask); !errors.Is(err, syscall.EINVAL) {
			t.Fatalf("modify %+v mask %#x: %v, want EINVAL", c.attr, c.mask, err)
		}
	}
	must(t, srq.Modify(&ib.SRQAttr{Limit: 4}, ib.SRQLimit))
	if a, _ := srq.Query(); a.Limit != 4 {
		t.Fatalf("armed limit %d", a.Limit)
	}
	for i := 0; i < 8; i++ {
		_, err := srq.PostRecv([]verbs.RecvWR{{ID: uint64(i)}})
		must(t, err)
	}
	cqb := tb.b.dev.newCQ(16)
	cqa := tb.a.dev.newCQ(16)
	qa, _ := tb.a.pd.newQP(testQP{Type: ib.RC, SendCQ: cqa, RecvCQ: cqa, MaxInline: 16})
	qb, err := tb.b.pd.newQP(testQP{Type: ib.RC, SendCQ: cqb, RecvCQ: cqb, SRQ: srq})
	must(t, err)
	for _, p := range [][2]*QP{{qa, qb}, {qb, qa}} {
		q, peer := p[0], p[1]
		dst, mac := tb.b.dev.cfg.Addrs[0], macB
		if q == qb {
			dst, mac = tb.a.dev.cfg.Addrs[0], macA
		}
		must(t, ibtest.Modify(q, ib.Init, nil))
		must(t, ibtest.Modify(q, ib.RTR, &ib.QPAttr{PathMTU: 1024, DestQPN: peer.QPN(), AV: ib.AddressVector{DMAC: mac, DGID: ib.GIDFrom(dst)}}))
		must(t, ibtest.Modify(q, ib.RTS, &ib.QPAttr{Timeout: 8, RetryCnt: 7, RNRRetry: 7}))
	}
	drainEvents(tb.b.dev.Events())
	drainEvents(sub)
	send := func(n int) {
		t.Helper()
		for i := 0; i < n; i++ {
			_, err := qa.PostSend([]verbs.SendWR{{Opcode: ib.Send, Flags: ib.Signaled}})
			must(t, err)
		}
		var got int
		tb.run(func() bool { got += len(pollAll(cqb)); return got == n }, time.Second)
	}
	limit := verbs.AsyncEvent{Type: ib.EventSRQLimitReached, SRQ: srq}
	send(4) // 4 receives left: not fewer than the limit
	if evs := drainEvents(tb.b.dev.Events()); hasEvent(evs, limit) {
		t.Fatalf("limit reached with 4 receives left: %v", evs)
	}
	send(1)
	evs, subEvs := drainEvents(tb.b.dev.Events()), drainEvents(sub)
	if !hasEvent(evs, limit) || !hasEvent(subEvs, limit) {
		t.Fatalf("no SRQ_LIMIT_REACHED with 3 receives left: events %v, subscriber %v", evs, subEvs)
	}
	if a, _ := srq.Query(); a.Limit != 0 {
		t.Fatalf("limit %d still armed after the event", a.Limit)
	}
	send(1) // disarmed: no second event
	if evs := drainEvents(tb.b.dev.Events()); hasEvent(evs, limit) {
		t.Fatalf("a disarmed limit fired: %v", evs)
	}

	if err := srq.Destroy(); !errors.Is(err, syscall.EBUSY) {
		t.Fatalf("destroy an SRQ in use: %v, want EBUSY", err)
	}
	must(t, ibtest.Modify(qb, ib.Err, nil))
	last := verbs.AsyncEvent{Type: ib.EventQPLastWQEReached, QPN: qb.QPN()}
	if evs := drainEvents(tb.b.dev.Events()); !hasEvent(evs, last) {
		t.Fatalf("no QP_LAST_WQE_REACHED: %v", evs)
	}
	// The SRQ's receives stay for other QPs: none was flushed.
	for _, wc := range pollAll(cqb) {
		if wc.IsRecv {
			t.Fatalf("SRQ receive flushed with its QP: %+v", wc)
		}
	}
	must(t, qb.Destroy())
	must(t, srq.Destroy())
	if _, err := srq.PostRecv([]verbs.RecvWR{{}}); !errors.Is(err, verbs.ErrDestroyed) {
		t.Fatalf("post to a destroyed SRQ: %v", err)
	}
	if _, err := tb.b.pd.newQP(testQP{Type: ib.UD, SendCQ: cqb, RecvCQ: cqb, SRQ: srq}); err == nil {
		t.Fatal("QP on a destroyed SRQ")
	}
}

// A responder's refusals raise their own events (IBA's affiliated
// errors): an access violation QP_ACCESS_ERR, an invalid request (a SEND
// longer than its receive) QP_REQ_ERR; the requester that gets the NAK
// QP_FATAL.
func TestResponderErrorEvents(t *testing.T) {
	for _, c := range []struct {
		name string
		ev   ib.EventType
	}{{"access", ib.EventQPAccessErr}, {"request", ib.EventQPReqErr}} {
		t.Run(c.name, func(t *testing.T) {
			tb := newTestbed(t, memlink.Impairments{}, 22, 1024)
			// The QP serves WRITEs: a bad rkey is an access violation
			// (a QP refusing WRITEs altogether refuses an invalid
			// request).
			qa, qb := tb.connect(ib.RC, 1024, ib.LocalWrite|ib.RemoteWrite, 8)
			drainEvents(tb.a.dev.Events())
			drainEvents(tb.b.dev.Events())
			src, _ := tb.a.pd.RegBytes(make([]byte, 64), 0, ib.LocalWrite)
			w := verbs.SendWR{ID: 1, Flags: ib.Signaled, SG: []ib.SGE{{Addr: src.IOVA(), Length: 64, LKey: src.LKey()}}}
			if c.ev == ib.EventQPAccessErr {
				w.Opcode, w.RemoteAddr, w.RKey = ib.RDMAWrite, 1, 2
			} else {
				w.Opcode = ib.Send
				dst, _ := tb.b.pd.RegBytes(make([]byte, 8), 0, ib.LocalWrite)
				_, err := qb.PostRecv([]verbs.RecvWR{{SG: []ib.SGE{{Addr: dst.IOVA(), Length: 8, LKey: dst.LKey()}}}})
				must(t, err)
			}
			_, err := qa.PostSend([]verbs.SendWR{w})
			must(t, err)
			tb.run(func() bool { return len(pollAll(qa.init.SendCQ)) == 1 }, time.Second)
			if evs := drainEvents(tb.b.dev.Events()); !hasEvent(evs, verbs.AsyncEvent{Type: c.ev, QPN: qb.QPN()}) {
				t.Fatalf("responder events %v, want %v", evs, c.ev)
			}
			if evs := drainEvents(tb.a.dev.Events()); !hasEvent(evs, verbs.AsyncEvent{Type: ib.EventQPFatal, QPN: qa.QPN()}) {
				t.Fatalf("requester events %v, want QP_FATAL", evs)
			}
		})
	}
}

// A receive completes with WCSolicited when its message asked for a
// solicited event (SE), on RC (SEND and WRITE with immediate) and UD.
func TestSolicitedCompletions(t *testing.T) {
	for _, typ := range []ib.QPType{ib.RC, ib.UD} {
		t.Run(typ.String(), func(t *testing.T) {
			tb := newTestbed(t, memlink.Impairments{}, 23, 1024)
			var qa, qb *QP
			var ah *AH
			if typ == ib.RC {
				qa, qb = tb.connect(ib.RC, 1024, ib.LocalWrite|ib.RemoteWrite, 8)
			} else {
				cqa, cqb := tb.a.dev.newCQ(16), tb.b.dev.newCQ(16)
				qa, _ = tb.a.pd.newQP(testQP{Type: ib.UD, SendCQ: cqa, RecvCQ: cqa, MaxInline: 16})
				qb, _ = tb.b.pd.newQP(testQP{Type: ib.UD, SendCQ: cqb, RecvCQ: cqb})
				for _, q := range []*QP{qa, qb} {
					must(t, ibtest.Modify(q, ib.Init, &ib.QPAttr{QKey: 7}))
					must(t, ibtest.Modify(q, ib.RTR, nil))
					must(t, ibtest.Modify(q, ib.RTS, nil))
				}
				ah, _ = tb.a.pd.newAH(ib.AddressVector{DMAC: macB, DGID: ib.GIDFrom(addrB)})
			}
			buf, _ := tb.b.pd.RegBytes(make([]byte, 4*64), 0, ib.LocalWrite)
			for i := 0; i < 4; i++ {
				_, err := qb.PostRecv([]verbs.RecvWR{{ID: uint64(i), SG: []ib.SGE{{Addr: buf.IOVA() + uint64(64*i), Length: 64, LKey: buf.LKey()}}}})
				must(t, err)
			}
			wrs := []verbs.SendWR{
				{Opcode: ib.SendWithImm, Flags: ib.Inline},
				{Opcode: ib.SendWithImm, Flags: ib.Inline | ib.Solicited},
			}
			if typ == ib.RC {
				wrs = append(wrs, verbs.SendWR{Opcode: ib.RDMAWriteWithImm, Flags: ib.Solicited}, verbs.SendWR{Opcode: ib.RDMAWriteWithImm})
			}
			for i := range wrs {
				wrs[i].InlineData = []byte{byte(i)}
				if typ == ib.UD {
					wrs[i].AH, wrs[i].RemoteQPN, wrs[i].RemoteQKey = ah, qb.QPN(), 7
				}
			}
			_, err := qa.PostSend(wrs)
			must(t, err)
			var got []ib.WC
			tb.run(func() bool { got = append(got, pollAll(qb.init.RecvCQ)...); return len(got) == len(wrs) }, time.Second)
			for i, wc := range got {
				want := wrs[i].Flags&ib.Solicited != 0
				if wc.Status != ib.Success || (wc.Flags&ib.WCSolicited != 0) != want {
					t.Fatalf("receive %d: %+v, solicited %v", i, wc, want)
				}
			}
		})
	}
}

// The port's link state: Query follows it, and each change is one event.
func TestPortEvents(t *testing.T) {
	tb := newTestbed(t, memlink.Impairments{}, 24, 1024)
	d := tb.a.dev
	drainEvents(d.Events())
	d.SetPortActive(false)
	d.SetPortActive(false)
	if d.Query().PortActive {
		t.Fatal("port still active")
	}
	d.SetPortActive(true)
	evs := drainEvents(d.Events())
	want := []verbs.AsyncEvent{{Type: ib.EventPortErr}, {Type: ib.EventPortActive}}
	if len(evs) != 2 || evs[0] != want[0] || evs[1] != want[1] || !d.Query().PortActive {
		t.Fatalf("events %v, want %v", evs, want)
	}
}

// Receives that wait outside the SRQ (SetBacklog: the daemon's ring)
// count against its limit.
func TestSRQLimitCountsBacklog(t *testing.T) {
	tb := newTestbed(t, memlink.Impairments{}, 25, 1024)
	srq, err := tb.b.pd.newSRQ(8, 1)
	must(t, err)
	backlog := 2
	srq.SetBacklog(func() int { return backlog })
	for i := 0; i < 4; i++ {
		_, err := srq.PostRecv([]verbs.RecvWR{{ID: uint64(i)}})
		must(t, err)
	}
	must(t, srq.Modify(&ib.SRQAttr{Limit: 3}, ib.SRQLimit))
	var w ib.RecvWQE
	drainEvents(tb.b.dev.Events())
	limit := verbs.AsyncEvent{Type: ib.EventSRQLimitReached, SRQ: srq}
	srq.Take(&w) // 3 held + 2 waiting
	srq.Take(&w) // 2 + 2
	if evs := drainEvents(tb.b.dev.Events()); hasEvent(evs, limit) {
		t.Fatalf("limit reached with 4 receives posted: %v", evs)
	}
	backlog = 0  // the waiting ones were taken elsewhere
	srq.Take(&w) // 1 + 0
	if evs := drainEvents(tb.b.dev.Events()); !hasEvent(evs, limit) {
		t.Fatalf("no SRQ_LIMIT_REACHED with 1 receive left: %v", evs)
	}
}

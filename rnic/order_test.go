package rnic

import (
	"testing"
	"time"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/ibtest"
	"github.com/softrnic/softrnic/port/memlink"
	"github.com/softrnic/softrnic/verbs"
)

// The ACK of a SEND whose completion the application has already polled
// leaves before what the application posts next on another QP, in every
// Transmit call: a DREQ on QP1 that overtook it would make the peer move
// its QP to ERR and flush the SEND the ACK completes (rdma_cm's
// disconnect right after the last message).
func TestTransmitServesQPsInReadyOrder(t *testing.T) {
	tb := newTestbed(t, memlink.Impairments{}, 1, 1024)
	qa1, qb1 := tb.connect(ib.RC, 1024, ib.LocalWrite, 8)
	qa2, qb2 := tb.connect(ib.RC, 1024, ib.LocalWrite, 8)
	buf := make([]byte, 64)
	mrA, err := tb.a.pd.RegBytes(buf, 0, ib.LocalWrite)
	must(t, err)
	mrB, err := tb.b.pd.RegBytes(make([]byte, 64), 0, ib.LocalWrite)
	must(t, err)
	sge := func(m *MR) []ib.SGE { return []ib.SGE{{Addr: m.IOVA(), Length: 16, LKey: m.LKey()}} }
	for round := range 4 { // the old round robin started at each QP in turn
		now := tb.clk.Now()
		_, err = qa2.PostRecv([]verbs.RecvWR{{ID: uint64(round), SG: sge(mrA)}})
		must(t, err)
		_, err = qb1.PostRecv([]verbs.RecvWR{{ID: uint64(round), SG: sge(mrB)}})
		must(t, err)
		_, err = qa1.PostSend([]verbs.SendWR{{ID: uint64(round), Opcode: ib.Send, Flags: ib.Signaled, SG: sge(mrA)}})
		must(t, err)
		if n, _ := tb.a.transmit(t, now); n != 1 {
			t.Fatalf("round %d: A sent %d frames", round, n)
		}
		tb.clk.Advance(10 * time.Microsecond)
		now = tb.clk.Now()
		k, err := tb.b.port.Recv(tb.b.rx, 0)
		if err != nil || k != 1 {
			t.Fatalf("round %d: B received %d (%v)", round, k, err)
		}
		tb.b.dev.Receive(now, tb.b.rx[:k])
		// The application polls the receive, then posts on another QP.
		if wcs := pollAll(qb1.init.RecvCQ); len(wcs) != 1 || wcs[0].Status != ib.Success {
			t.Fatalf("round %d: B's completions %+v", round, wcs)
		}
		_, err = qb2.PostSend([]verbs.SendWR{{ID: uint64(round), Opcode: ib.Send, Flags: ib.Signaled, SG: sge(mrB)}})
		must(t, err)
		k = tb.b.port.Lend(tb.b.out)
		m := tb.b.dev.Transmit(now, tb.b.out[:k])
		var order []uint32
		for _, f := range tb.b.out[:m] {
			h := bth.BTH(f[14+20+8:])
			order = append(order, h.DestQP())
			if h.DestQP() == qa1.QPN() && h.Opcode() != bth.RCAcknowledge {
				t.Fatalf("round %d: QP %d sent %v, want its ACK", round, qb1.QPN(), h.Opcode())
			}
		}
		if len(order) != 2 || order[0] != qa1.QPN() || order[1] != qa2.QPN() {
			t.Fatalf("round %d: B sent to QPs %v, want the ACK to %d first, then %d", round, order, qa1.QPN(), qa2.QPN())
		}
		for i := m; i < k; i++ {
			tb.b.out[i] = tb.b.out[i][:0]
		}
		if _, err := tb.b.port.Submit(tb.b.out[:k]); err != nil {
			t.Fatal(err)
		}
		clear(tb.b.out[:k])
		// Let both SENDs complete at both ends.
		var sent1, sent2, recv2 int
		tb.run(func() bool {
			sent1 += len(pollAll(qa1.init.SendCQ))
			sent2 += len(pollAll(qb2.init.SendCQ))
			recv2 += len(pollAll(qa2.init.RecvCQ))
			return sent1 == 1 && sent2 == 1 && recv2 == 1
		}, time.Second)
	}
}

// owedAck runs an RC SEND from A to B up to B's application polling its
// receive completion, before B's device has sent the ACK it owes (the
// next Transmit would). It returns the testbed, both QPs, B's MR and
// the time.
func owedAck(t *testing.T) (tb *testbed, qa, qb *QP, mrB *MR, now clock.Time) {
	t.Helper()
	tb = newTestbed(t, memlink.Impairments{}, 1, 1024)
	qa, qb = tb.connect(ib.RC, 1024, ib.LocalWrite, 8)
	mrA, err := tb.a.pd.RegBytes(make([]byte, 64), 0, ib.LocalWrite)
	must(t, err)
	mrB, err = tb.b.pd.RegBytes(make([]byte, 64), 0, ib.LocalWrite)
	must(t, err)
	_, err = qb.PostRecv([]verbs.RecvWR{{ID: 1, SG: sge16(mrB)}})
	must(t, err)
	_, err = qa.PostSend([]verbs.SendWR{{ID: 1, Opcode: ib.Send, Flags: ib.Signaled, SG: sge16(mrA)}})
	must(t, err)
	now = tb.clk.Now()
	if n, _ := tb.a.transmit(t, now); n != 1 {
		t.Fatalf("A sent %d frames", n)
	}
	tb.clk.Advance(10 * time.Microsecond)
	now = tb.clk.Now()
	k, err := tb.b.port.Recv(tb.b.rx, 0)
	if err != nil || k != 1 {
		t.Fatalf("B received %d (%v)", k, err)
	}
	tb.b.dev.Receive(now, tb.b.rx[:k])
	if wcs := pollAll(qb.init.RecvCQ); len(wcs) != 1 || wcs[0].Status != ib.Success {
		t.Fatalf("B's completions %+v", wcs)
	}
	return tb, qa, qb, mrB, now
}

// sge16 is the first 16 bytes of m.
func sge16(m *MR) []ib.SGE { return []ib.SGE{{Addr: m.IOVA(), Length: 16, LKey: m.LKey()}} }

// sendsOnlyOwedAck checks B's next Transmit after owedAck and what its
// application did then (named by who): the owed ACK alone, after which
// A's SEND completes with SUCCESS and B sends nothing more.
func sendsOnlyOwedAck(t *testing.T, tb *testbed, qa *QP, now clock.Time, who string) {
	t.Helper()
	k := tb.b.port.Lend(tb.b.out)
	m := tb.b.dev.Transmit(now, tb.b.out[:k])
	if m != 1 || bth.BTH(tb.b.out[0][14+20+8:]).Opcode() != bth.RCAcknowledge {
		t.Fatalf("%s sent %d frames, want its owed ACK alone", who, m)
	}
	for i := m; i < k; i++ {
		tb.b.out[i] = tb.b.out[i][:0]
	}
	if _, err := tb.b.port.Submit(tb.b.out[:k]); err != nil {
		t.Fatal(err)
	}
	clear(tb.b.out[:k])
	var wcs []ib.WC
	tb.run(func() bool {
		wcs = append(wcs, pollAll(qa.init.SendCQ)...)
		return len(wcs) == 1
	}, time.Second)
	if wcs[0].Status != ib.Success {
		t.Fatalf("A's SEND completed %v, want SUCCESS", wcs[0].Status)
	}
	if n, _ := tb.b.transmit(t, tb.clk.Now()); n != 0 {
		t.Fatalf("%s sent %d more frames", who, n)
	}
}

// The ACK of a SEND whose completion the application has already polled
// still leaves when the application moves its QP to ERR before the
// device's next Transmit (rdma_disconnect right after the last message):
// the peer's SEND completes instead of being flushed.
func TestOwedAckSurvivesERR(t *testing.T) {
	tb, qa, qb, _, now := owedAck(t)
	must(t, qb.Modify(&ib.QPAttr{State: ib.Err}, ib.AttrState))
	sendsOnlyOwedAck(t, tb, qa, now, "B in ERR")
}

// A QP destroyed with work queued sends nothing more but the ACK it owes
// (ibv_destroy_qp right after polling the peer's SEND): its own queued
// SEND is dropped without a completion, and the peer's SEND completes.
func TestDestroyedQPSendsOnlyItsOwedAck(t *testing.T) {
	tb, qa, qb, mrB, now := owedAck(t)
	_, err := qb.PostSend([]verbs.SendWR{{ID: 2, Opcode: ib.Send, Flags: ib.Signaled, SG: sge16(mrB)}})
	must(t, err)
	must(t, qb.Destroy())
	sendsOnlyOwedAck(t, tb, qa, now, "destroyed B")
	if wcs := pollAll(qb.init.SendCQ); len(wcs) != 0 {
		t.Fatalf("destroyed B's dropped SEND completed: %+v", wcs)
	}
}

// UC and UD QPs destroyed with a SEND queued send nothing, and the SEND
// completes nothing: they owe no ACK.
func TestDestroyedQPSendsNothing(t *testing.T) {
	for _, typ := range []ib.QPType{ib.UC, ib.UD} {
		t.Run(typ.String(), func(t *testing.T) {
			tb := newTestbed(t, memlink.Impairments{}, 1, 1024)
			var q *QP
			wr := verbs.SendWR{ID: 1, Opcode: ib.Send, Flags: ib.Signaled}
			if typ == ib.UD {
				var err error
				q, err = tb.a.pd.newQP(testQP{Type: ib.UD, SendCQ: tb.a.dev.newCQ(16), RecvCQ: tb.a.dev.newCQ(16), MaxSendWR: 8, MaxRecvWR: 8, MaxSGE: 1})
				must(t, err)
				must(t, ibtest.Modify(q, ib.Init, &ib.QPAttr{QKey: 0x11}))
				must(t, ibtest.Modify(q, ib.RTR, nil))
				must(t, ibtest.Modify(q, ib.RTS, &ib.QPAttr{SQPSN: 1}))
				ah, err := tb.a.pd.newAH(ib.AddressVector{DMAC: macB, DGID: ib.GIDFrom(addrB)})
				must(t, err)
				wr.AH, wr.RemoteQPN, wr.RemoteQKey = ah, 0x99, 0x11
			} else {
				q, _ = tb.connect(typ, 1024, ib.LocalWrite, 8)
			}
			mr, err := tb.a.pd.RegBytes(make([]byte, 64), 0, ib.LocalWrite)
			must(t, err)
			wr.SG = sge16(mr)
			_, err = q.PostSend([]verbs.SendWR{wr})
			must(t, err)
			must(t, q.Destroy())
			if n, _ := tb.a.transmit(t, tb.clk.Now()); n != 0 {
				t.Fatalf("destroyed %v QP sent %d frames", typ, n)
			}
			if wcs := pollAll(q.init.SendCQ); len(wcs) != 0 {
				t.Fatalf("destroyed %v QP's SEND completed: %+v", typ, wcs)
			}
		})
	}
}

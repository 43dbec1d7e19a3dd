package cm

import (
	"net/netip"
	"testing"
	"time"

	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/port"
	"github.com/softrnic/softrnic/port/memlink"
)

// TestManyConnectionsOverLossyLink runs connect/disconnect cycles between
// two Managers over an in-memory link that loses 20 % of the MADs,
// duplicates and reorders 10 % and delays all, in virtual time. Every cycle must end with
// both sides established and then disconnected, by retransmission and
// duplicate handling alone, and all comm IDs must be released.
func TestManyConnectionsOverLossyLink(t *testing.T) {
	vc := &memlink.VirtualClock{}
	la, lb := memlink.NewPair(memlink.Config{
		Impairments: memlink.Impairments{Loss: 0.2, Duplicate: 0.1, Reorder: 0.1, Delay: 50 * time.Microsecond, Jitter: 20 * time.Microsecond},
		Seed:        7, MaxFrame: MADSize, Frames: 64, Clock: vc.Now,
	})
	client := New(Config{CAGUID: 0xA, Seed: 1})
	server := New(Config{CAGUID: 0xB, Seed: 2})
	if err := server.Listen(svc, ListenOptions{RDMACM: true}); err != nil {
		t.Fatal(err)
	}

	type side struct {
		m      *Manager
		l      *memlink.Port
		peer   netip.Addr
		events []Event
	}
	cs := &side{m: client, l: la, peer: addrB}
	ss := &side{m: server, l: lb, peer: addrA}
	out := make([][]byte, 1)
	in := make([][]byte, port.BatchSize)
	step := func(s *side) {
		now := vc.Now()
		evs, sends := s.m.Drain()
		for _, e := range evs {
			s.events = append(s.events, e)
			if e.Kind == EventConnRequest {
				if err := s.m.Accept(now, e.ID, &AcceptParams{QPN: 0x22, StartingPSN: 1}); err != nil {
					t.Fatal(err)
				}
			}
		}
		for i := range sends {
			out[0] = sends[i].MAD[:]
			if n, err := port.Send(s.l, out); n != 1 || err != nil {
				t.Fatalf("link send: %d, %v", n, err)
			}
		}
		k, err := s.l.Recv(in, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range in[:k] {
			if err := s.m.HandleMAD(now, s.peer, f); err != nil {
				t.Fatal(err)
			}
		}
	}
	// run steps both sides until cond holds, advancing virtual time to the
	// next frame delivery or timer; bounded in steps.
	run := func(what string, cond func() bool) {
		for range 100000 {
			step(cs)
			step(ss)
			if cond() {
				return
			}
			next := clock.Min(clock.Min(la.NextDelivery(), lb.NextDelivery()), clock.Min(client.NextDeadline(), server.NextDeadline()))
			if next == clock.Never {
				continue // MADs still to drain
			}
			vc.Set(max(vc.Now(), next))
			client.Tick(vc.Now())
			server.Tick(vc.Now())
		}
		t.Fatalf("%s: never happened (client %v, server %v)", what, kindsOf(cs.events), kindsOf(ss.events))
	}
	has := func(s *side, id ConnID, k EventKind) bool {
		for _, e := range s.events {
			if e.Kind == k && (id == 0 || e.ID == id) {
				return true
			}
		}
		return false
	}
	const cycles = 40
	for i := range cycles {
		p := connectParams()
		p.QPN = uint32(0x100 + i) // a new QP each time, as rping would
		id, err := client.Connect(vc.Now(), p)
		if err != nil {
			t.Fatal(err)
		}
		run("established", func() bool {
			return has(cs, id, EventEstablished) && has(ss, 0, EventEstablished)
		})
		if has(cs, id, EventTimeout) || has(cs, id, EventRejected) {
			t.Fatalf("cycle %d failed: %v", i, kindsOf(cs.events))
		}
		if err := client.Disconnect(vc.Now(), id, nil); err != nil {
			t.Fatal(err)
		}
		run("disconnected", func() bool {
			return has(cs, id, EventDisconnected) && has(ss, 0, EventDisconnectRequest)
		})
		cs.events, ss.events = cs.events[:0], ss.events[:0]
	}
	// Let every time-wait run out.
	run("all released", func() bool { return client.Conns() == 0 && server.Conns() == 0 })
	st := la.Stats()
	cst, sst := client.Stats(), server.Stats()
	t.Logf("link a→b: %+v; client retransmits %d, server retransmits %d, duplicates %d/%d",
		st, cst.Retransmits, sst.Retransmits, cst.Duplicates, sst.Duplicates)
	if st.Lost == 0 || cst.Retransmits+sst.Retransmits == 0 {
		t.Fatal("the link lost nothing or nobody retransmitted: the test tested nothing")
	}
}

func kindsOf(evs []Event) []EventKind {
	var k []EventKind
	for _, e := range evs {
		k = append(k, e.Kind)
	}
	return k
}

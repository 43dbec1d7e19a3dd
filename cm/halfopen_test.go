package cm

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/softrnic/softrnic/clock"
)

// floodREQ is a well-formed rdma_cm REQ for svc from the comm
// ID id of CA guid, with the kernel's timers: what a flooding host sends,
// one distinct comm ID per REQ.
func floodREQ(id uint32, guid uint64) [MADSize]byte { return floodREQFor(svc, id, guid) }

// floodREQFor is floodREQ for service ID service.
func floodREQFor(service uint64, id uint32, guid uint64) [MADSize]byte {
	var b [MADSize]byte
	mad := MAD(b[:])
	mad.InitCM(AttrREQ, uint64(id)<<8)
	req := REQ{LocalCommID: id, ServiceID: service, LocalCAGUID: guid, LocalQPN: id & 0xFFFFFF,
		RemoteCMResponseTimeout: DefaultCMResponseTimeout, LocalCMResponseTimeout: DefaultCMResponseTimeout,
		TransportServiceType: TransportRC, StartingPSN: 1, RetryCount: 7, PKey: defaultPKey, PathMTU: 5,
		RNRRetryCount: 7, MaxCMRetries: DefaultMaxCMRetries,
		Primary: Path{LocalLID: permissiveLID, RemoteLID: permissiveLID, HopLimit: 64, LocalACKTimeout: 19}}
	// The rdma_cm header rping or perftest -R would send, so that the REQ
	// passes an rdma_cm listener's checks too.
	h := CMAHeader{SrcPort: uint16(id), Src: netip.MustParseAddr("10.0.0.66"), Dst: addrB}
	if err := EncodeCMAHeader(req.PrivateData[:], &h); err != nil {
		panic(err)
	}
	req.Encode(mad.Data())
	return b
}

// floodAddr is the i-th address of a flood from many (forged) sources.
func floodAddr(i int) netip.Addr {
	var a [4]byte
	binary.BigEndian.PutUint32(a[:], 0x0A800000+uint32(i)) // 10.128.0.0/9
	return netip.AddrFrom4(a)
}

// checkHalfOpen recounts the half-open entries from the connection table
// and holds the Manager's counters and caps against the recount.
func checkHalfOpen(t testing.TB, m *Manager) {
	t.Helper()
	n, byPeer := 0, map[netip.Addr]int{}
	for _, c := range m.conns {
		if c.halfOpen {
			if c.active || c.state == StateEstablished || c.state == StateDREQSent {
				t.Fatalf("conn %v (%v, active %v) counted half-open", c.id, c.state, c.active)
			}
			n++
			byPeer[c.peer]++
		} else if !c.active {
			switch c.state {
			case StateREQRcvd, StateMRAREQSent, StateREPSent, StateMRAREPRcvd, StateSIDRREQRcvd, StateSIDRREPSent:
				t.Fatalf("passive conn %v in %v not counted half-open", c.id, c.state)
			}
		}
	}
	if n != m.halfOpen || n != m.HalfOpen() || len(byPeer) != len(m.halfOpenByPeer) {
		t.Fatalf("half-open: %d counted, %d recounted; %d peers, %d recounted", m.halfOpen, n, len(m.halfOpenByPeer), len(byPeer))
	}
	for p, k := range byPeer {
		if m.halfOpenByPeer[p] != k {
			t.Fatalf("peer %v: %d counted, %d recounted", p, m.halfOpenByPeer[p], k)
		}
		if k > m.cfg.MaxHalfOpenPerPeer {
			t.Fatalf("peer %v holds %d half-open, cap %d", p, k, m.cfg.MaxHalfOpenPerPeer)
		}
	}
	if n > m.cfg.MaxHalfOpen {
		t.Fatalf("%d half-open, cap %d", n, m.cfg.MaxHalfOpen)
	}
}

// acceptAll plays the worst-case QP owner: it accepts every request (a
// QP per REQ) and loses every MAD to the flooding hosts. It returns the
// events seen.
func acceptAll(t testing.TB, m *Manager, now clock.Time) (accepted, timeouts int) {
	t.Helper()
	evs, _ := m.Drain()
	for _, e := range evs {
		switch e.Kind {
		case EventConnRequest:
			if err := m.Accept(now, e.ID, &AcceptParams{QPN: 0x100 + uint32(e.ID)&0xFFFF, StartingPSN: 9}); err != nil {
				t.Fatal(err)
			}
			accepted++
		case EventTimeout:
			timeouts++
		}
	}
	m.Drain() // the REPs, lost
	return accepted, timeouts
}

// A flood of 10^5 distinct REQs from one host holds at most the per-peer
// cap of entries (and QPs) however the application answers, every other
// REQ is counted as dropped, and a legitimate host still connects during
// the flood.
func TestREQFloodFromOneHostIsCappedPerPeer(t *testing.T) {
	const flood = 100_000
	n := newNet(t, Config{}, Config{})
	n.b.accept = &AcceptParams{QPN: 0x22, StartingPSN: 5}
	if err := n.b.m.Listen(svc, ListenOptions{RDMACM: true}); err != nil {
		t.Fatal(err)
	}
	b := n.b.m
	attacker := netip.MustParseAddr("10.0.0.66")
	qps := 0
	for i := range flood {
		mad := floodREQ(uint32(i+1), 0xBAD)
		if err := b.HandleMAD(n.now, attacker, mad[:]); err != nil {
			t.Fatal(err)
		}
		if i%1000 == 999 {
			k, _ := acceptAll(t, b, n.now)
			qps += k
		}
		if i == flood/2 {
			// Mid-flood, A connects to the same service.
			acceptAll(t, b, n.now)
			if _, err := n.a.m.Connect(n.now, connectParams()); err != nil {
				t.Fatal(err)
			}
			n.settle()
			if n.a.last(EventEstablished) == nil || n.b.last(EventEstablished) == nil {
				t.Fatalf("legitimate connect during the flood: a %v, b %v", n.a.kinds(), n.b.kinds())
			}
		}
	}
	k, _ := acceptAll(t, b, n.now)
	qps += k
	checkHalfOpen(t, b)
	if b.Conns() > DefaultMaxHalfOpenPerPeer+1 || len(b.remote) > DefaultMaxHalfOpenPerPeer+1 {
		t.Fatalf("after %d REQs: %d conns, %d indexed (cap %d per peer, +1 legitimate)", flood, b.Conns(), len(b.remote), DefaultMaxHalfOpenPerPeer)
	}
	if qps != DefaultMaxHalfOpenPerPeer || b.HalfOpen() != DefaultMaxHalfOpenPerPeer {
		t.Fatalf("flood reached the application %d times, %d half-open; want %d", qps, b.HalfOpen(), DefaultMaxHalfOpenPerPeer)
	}
	if got := b.Stats().HalfOpenDropped; got != flood-DefaultMaxHalfOpenPerPeer {
		t.Fatalf("HalfOpenDropped %d, want %d", got, flood-DefaultMaxHalfOpenPerPeer)
	}
	// Dropped, not answered: the flood drew one REP per admitted REQ only.
	if rep := b.Stats().Tx[AttrREP-AttrREQ]; rep != DefaultMaxHalfOpenPerPeer+1 {
		t.Fatalf("%d REPs sent", rep)
	}
}

// A flood from 10^5 forged source addresses is held to the port's cap;
// connections established before it are neither evicted nor counted; once
// the flood's REPs time out past the peers' MaxCMRetries, every entry is
// reclaimed (with EventTimeout for its QP) and new REQs get in again.
func TestREQFloodFromManyHostsIsCappedPerPortAndReclaimed(t *testing.T) {
	const flood, capPort = 100_000, 64
	n := newNet(t, Config{}, Config{MaxHalfOpen: capPort})
	n.b.accept = &AcceptParams{QPN: 0x22, StartingPSN: 5}
	if err := n.b.m.Listen(svc, ListenOptions{RDMACM: true}); err != nil {
		t.Fatal(err)
	}
	b := n.b.m
	// More established connections than the cap: they never count.
	const established = 2 * capPort
	p := connectParams()
	for i := range established {
		p.QPN = 0x1000 + uint32(i)
		if _, err := n.a.m.Connect(n.now, p); err != nil {
			t.Fatal(err)
		}
		n.settle()
	}
	var estIDs []ConnID
	for _, e := range n.b.events {
		if e.Kind == EventEstablished {
			estIDs = append(estIDs, e.ID)
		}
	}
	if len(estIDs) != established || b.HalfOpen() != 0 {
		t.Fatalf("%d established before the flood, %d half-open", len(estIDs), b.HalfOpen())
	}

	qps := 0
	for i := range flood {
		mad := floodREQ(uint32(i+1), uint64(i))
		if err := b.HandleMAD(n.now, floodAddr(i), mad[:]); err != nil {
			t.Fatal(err)
		}
		if i%500 == 499 {
			k, _ := acceptAll(t, b, n.now)
			qps += k
		}
	}
	k, _ := acceptAll(t, b, n.now)
	qps += k
	checkHalfOpen(t, b)
	if b.Conns() > established+capPort || b.HalfOpen() != capPort || qps != capPort {
		t.Fatalf("after the flood: %d conns (%d established + cap %d), %d half-open, %d accepted", b.Conns(), established, capPort, b.HalfOpen(), qps)
	}
	if len(b.remote) > established+capPort || len(b.halfOpenByPeer) > capPort {
		t.Fatalf("indexes grew: %d remote, %d peers", len(b.remote), len(b.halfOpenByPeer))
	}
	if got := b.Stats().HalfOpenDropped; got != flood-capPort {
		t.Fatalf("HalfOpenDropped %d, want %d", got, flood-capPort)
	}
	// A legitimate REQ now finds the port full and is dropped, unanswered
	// (its retries would try again).
	p.QPN = 0x7777
	late, err := n.a.m.Connect(n.now, p)
	if err != nil {
		t.Fatal(err)
	}
	n.settle()
	if n.a.m.State(late) != StateREQSent || b.Stats().HalfOpenDropped != flood-capPort+1 {
		t.Fatalf("late connect: %v, dropped %d", n.a.m.State(late), b.Stats().HalfOpenDropped)
	}
	if err := n.a.m.Abort(n.now, late); err != nil {
		t.Fatal(err)
	}
	n.settle()

	// Time passes; nobody answers the flood's REPs. Run B's timers only
	// (A's REQ retries are delivered by hand below) until the flood's
	// entries are gone.
	timeouts := 0
	for range 10_000 {
		if b.HalfOpen() == 0 {
			break
		}
		d := b.NextDeadline()
		if d == clock.Never {
			t.Fatal("half-open entries with no timer")
		}
		n.now = max(n.now, d)
		b.Tick(n.now)
		_, to := acceptAll(t, b, n.now)
		timeouts += to
		checkHalfOpen(t, b)
	}
	if b.HalfOpen() != 0 || timeouts != capPort {
		t.Fatalf("after the REP retries: %d half-open, %d EventTimeout (want 0, %d)", b.HalfOpen(), timeouts, capPort)
	}
	for _, id := range estIDs {
		if b.State(id) != StateEstablished {
			t.Fatalf("established conn %v is %v after the flood", id, b.State(id))
		}
	}
	// The flood's entries left (REP timed out → time-wait → released);
	// the established ones stayed.
	if b.Conns() != established {
		t.Fatalf("%d conns left, want the %d established", b.Conns(), established)
	}
	// With the flood reclaimed, A connects again.
	p.QPN = 0x7778
	again, err := n.a.m.Connect(n.now, p)
	if err != nil {
		t.Fatal(err)
	}
	n.settle()
	if n.a.m.State(again) != StateEstablished {
		t.Fatalf("connect after the flood: %v, a %v", n.a.m.State(again), n.a.kinds())
	}
	checkHalfOpen(t, b)
}

// Duplicates of an admitted REQ are still answered at the cap (they cost
// no new entry), and rejected REQs keep counting until released, so an
// application that rejects everything cannot be made to hold more.
func TestHalfOpenCapCountsRejectedAndAnswersDuplicates(t *testing.T) {
	m := New(Config{Seed: 7, MaxHalfOpen: 4, MaxHalfOpenPerPeer: 2})
	if err := m.Listen(svc, ListenOptions{}); err != nil {
		t.Fatal(err)
	}
	peers := []netip.Addr{addrA, addrB, netip.MustParseAddr("10.0.0.3")}
	id := uint32(1)
	for _, p := range peers {
		for range 3 {
			mad := floodREQ(id, 1)
			id++
			if err := m.HandleMAD(0, p, mad[:]); err != nil {
				t.Fatal(err)
			}
		}
	}
	evs, _ := m.Drain()
	for _, e := range evs {
		if e.Kind == EventConnRequest {
			if err := m.Reject(0, e.ID, RejConsumerDefined, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	m.Drain()
	checkHalfOpen(t, m)
	// A: 2 of 3, B: 2 of 3, the third peer: none (port full).
	if m.HalfOpen() != 4 || m.halfOpenByPeer[addrA] != 2 || m.halfOpenByPeer[addrB] != 2 || m.Stats().HalfOpenDropped != 5 {
		t.Fatalf("half-open %d, by peer %v, dropped %d", m.HalfOpen(), m.halfOpenByPeer, m.Stats().HalfOpenDropped)
	}
	// A duplicate of A's first REQ gets its REJ again.
	mad := floodREQ(1, 1)
	if err := m.HandleMAD(0, addrA, mad[:]); err != nil {
		t.Fatal(err)
	}
	if _, sends := m.Drain(); count(sends, AttrREJ) != 1 || m.Stats().HalfOpenDropped != 5 {
		t.Fatalf("duplicate at the cap: %d REJ, dropped %d", count(sends, AttrREJ), m.Stats().HalfOpenDropped)
	}
	// A SIDR_REQ is a new entry too: dropped at the cap.
	var b [MADSize]byte
	MAD(b[:]).InitCM(AttrSIDRREQ, 5)
	(&SIDRREQ{RequestID: 77, PKey: defaultPKey, ServiceID: svc}).Encode(MAD(b[:]).Data())
	if err := m.HandleMAD(0, peers[2], b[:]); err != nil {
		t.Fatal(err)
	}
	if evs, sends := m.Drain(); len(evs)+len(sends) != 0 || m.Stats().HalfOpenDropped != 6 {
		t.Fatalf("SIDR_REQ at the cap: %d events, %d sends, dropped %d", len(evs), len(sends), m.Stats().HalfOpenDropped)
	}
	// The rejected entries are released when the REQ retries are over.
	for range 100 {
		d := m.NextDeadline()
		if d == clock.Never {
			break
		}
		m.Tick(d)
		m.Drain()
		checkHalfOpen(t, m)
	}
	if m.HalfOpen() != 0 || m.Conns() != 0 {
		t.Fatalf("after the retries: %d half-open, %d conns", m.HalfOpen(), m.Conns())
	}
	if err := m.HandleMAD(m.NextDeadline(), peers[2], b[:]); err != nil {
		t.Fatal(err)
	}
	if evs, _ := m.Drain(); len(evs) != 1 || evs[0].Kind != EventSIDRRequest {
		t.Fatalf("SIDR_REQ with room: %v", evs)
	}
	checkHalfOpen(t, m)
}

// Admission costs no allocation once the flood has reached the cap.
func TestDroppedREQAllocatesNothing(t *testing.T) {
	m := New(Config{Seed: 8, MaxHalfOpen: 1})
	if err := m.Listen(svc, ListenOptions{}); err != nil {
		t.Fatal(err)
	}
	first := floodREQ(1, 1)
	if err := m.HandleMAD(0, addrA, first[:]); err != nil {
		t.Fatal(err)
	}
	m.Drain()
	next := floodREQ(2, 1)
	allocs := testing.AllocsPerRun(1000, func() {
		if err := m.HandleMAD(0, addrB, next[:]); err != nil {
			t.Fatal(err)
		}
		m.Drain()
	})
	if allocs != 0 || m.Conns() != 1 {
		t.Fatalf("%v allocations per dropped REQ, %d conns", allocs, m.Conns())
	}
}

// FuzzHalfOpen feeds arbitrary MADs from three peers to a Manager with
// tiny caps whose application accepts, rejects, MRAs or ignores requests in
// turn, and holds the half-open accounting against a recount after every
// step and every timer.
func FuzzHalfOpen(f *testing.F) {
	seedCorpus(f)
	// Requests for both listeners: an rdma_cm one and a plain one (which
	// takes the same REQs without looking at their private data).
	plain := ServiceIDTCP(7175)
	for i := range 6 {
		mad := floodREQ(uint32(i+1), 1)
		f.Add(mad[:])
		mad = floodREQFor(plain, uint32(i+1), 2)
		f.Add(mad[:])
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m := New(Config{Seed: 3, MaxCMRetries: 1, MaxHalfOpen: 3, MaxHalfOpenPerPeer: 2})
		if err := m.Listen(svc, ListenOptions{RDMACM: true}); err != nil {
			t.Fatal(err)
		}
		if err := m.Listen(plain, ListenOptions{}); err != nil {
			t.Fatal(err)
		}
		peers := [...]netip.Addr{addrA, addrB, netip.MustParseAddr("10.0.0.3")}
		now, turn := clock.Time(0), 0
		act := func() {
			evs, _ := m.Drain()
			for _, e := range evs {
				switch e.Kind {
				case EventConnRequest:
					switch turn % 4 {
					case 0:
						if err := m.Accept(now, e.ID, &AcceptParams{QPN: 0x99, StartingPSN: 1}); err != nil {
							t.Fatal(err)
						}
					case 1:
						if err := m.Reject(now, e.ID, RejConsumerDefined, nil); err != nil {
							t.Fatal(err)
						}
					case 2:
						if err := m.SendMRA(now, e.ID, 3); err != nil {
							t.Fatal(err)
						}
					}
					turn++
				case EventSIDRRequest:
					if err := m.SIDRReply(now, e.ID, &SIDRReplyParams{QPN: 0x98, QKey: RDMAUDPQKey}); err != nil {
						t.Fatal(err)
					}
				case EventEstablished:
					if turn%2 == 0 {
						if err := m.Disconnect(now, e.ID, nil); err != nil {
							t.Fatal(err)
						}
					}
				}
			}
			checkHalfOpen(t, m)
		}
		for i := 0; i+MADSize <= len(b) || i == 0; i += MADSize {
			_ = m.HandleMAD(now, peers[(i/MADSize)%len(peers)], b[i:]) // refusing malformed input is fine
			act()
			if i%(3*MADSize) == 2*MADSize {
				// Every third MAD, the QP of the newest passive connection
				// sees traffic before the RTU.
				for id, c := range m.conns {
					if !c.active {
						if err := m.NotifyEstablished(now, id); err != nil {
							t.Fatal(err)
						}
						break
					}
				}
				act()
			}
			if i+MADSize > len(b) {
				break
			}
		}
		for range 64 {
			d := m.NextDeadline()
			if d == clock.Never {
				break
			}
			now = max(now, d)
			m.Tick(now)
			act()
		}
	})
}

// A REQ that asks for the longest timers IBA allows (response timeouts and
// local ACK timeout 31: 2.4 h each, 39 h of REP retries) cannot hold a
// half-open slot for longer than MaxPeerTimeout allows, whether the
// application accepts it (and the peer MRAs our REP with service timeout
// 31 after each try) or never answers.
func TestHalfOpenLifetimeBoundedAgainstPeerTimers(t *testing.T) {
	for _, mode := range []string{"accept", "accept+MRA", "unanswered"} {
		m := New(Config{Seed: 11})
		if err := m.Listen(svc, ListenOptions{RDMACM: true}); err != nil {
			t.Fatal(err)
		}
		mad := floodREQ(5, 1)
		var req REQ
		req.Decode(MAD(mad[:]).Data())
		req.LocalCMResponseTimeout, req.RemoteCMResponseTimeout, req.Primary.LocalACKTimeout = 31, 31, 31
		req.Encode(MAD(mad[:]).Data())
		if err := m.HandleMAD(0, addrA, mad[:]); err != nil {
			t.Fatal(err)
		}
		evs, _ := m.Drain()
		if len(evs) != 1 || evs[0].Kind != EventConnRequest || evs[0].QP.Timeout != 31 {
			t.Fatalf("events %v", evs)
		}
		var mra [MADSize]byte
		if mode != "unanswered" {
			if err := m.Accept(0, evs[0].ID, &AcceptParams{QPN: 0x99}); err != nil {
				t.Fatal(err)
			}
			MAD(mra[:]).InitCM(AttrMRA, 1)
			(&MRA{LocalCommID: 5, RemoteCommID: uint32(evs[0].ID), MessageMRAed: MsgREP, ServiceTimeout: 31}).Encode(MAD(mra[:]).Data())
		}
		try := Timeout(MaxPeerTimeout) + 2*Timeout(DefaultPacketLifeTime)
		bound := clock.Time(0).Add(try*(DefaultMaxCMRetries+1) + Timeout(MaxPeerTimeout) + Timeout(DefaultPacketLifeTime))
		now := clock.Time(0)
		for range 100 {
			d := m.NextDeadline()
			if d == clock.Never {
				break
			}
			now = d
			m.Tick(now)
			m.Drain()
			if mode == "accept+MRA" {
				if err := m.HandleMAD(now, addrA, mra[:]); err != nil {
					t.Fatal(err)
				}
				m.Drain()
			}
		}
		if m.HalfOpen() != 0 || m.Conns() != 0 || now > bound || bound > clock.Time(0).Add(30*60e9) {
			t.Fatalf("%s: %d half-open, %d conns, released at %v (bound %v)", mode, m.HalfOpen(), m.Conns(), now, bound)
		}
	}
}

// BenchmarkREQFlood measures what each REQ of a flood costs the engine
// goroutine: with the port at its cap (every REQ dropped after a lookup)
// and with the flooding host at its per-peer cap. Reports entries held.
func BenchmarkREQFlood(b *testing.B) {
	for _, tc := range []struct {
		name  string
		peers int
	}{{"one-host", 1}, {"forged-hosts", 1 << 20}} {
		b.Run(tc.name, func(b *testing.B) {
			m := New(Config{Seed: 12})
			if err := m.Listen(svc, ListenOptions{RDMACM: true}); err != nil {
				b.Fatal(err)
			}
			mads := make([][MADSize]byte, 1024)
			for i := range mads {
				mads[i] = floodREQ(uint32(i+1), 1)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				mad := &mads[i%len(mads)]
				binary.BigEndian.PutUint32(MAD(mad[:]).Data(), uint32(i+1)) // a new comm ID each time
				if err := m.HandleMAD(0, floodAddr(i%tc.peers), mad[:]); err != nil {
					b.Fatal(err)
				}
				if i%256 == 255 {
					acceptAll(b, m, 0)
				}
			}
			b.StopTimer()
			acceptAll(b, m, 0)
			checkHalfOpen(b, m)
			b.ReportMetric(float64(m.Conns()), "entries")
			b.ReportMetric(float64(m.Stats().HalfOpenDropped)/float64(b.N), "dropped/op")
		})
	}
}

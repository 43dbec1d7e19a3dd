package cm

import (
	"bytes"
	"testing"

	"github.com/softrnic/softrnic/clock"
)

// seedCorpus adds every CM MAD of the captures and one of each message
// built here.
func seedCorpus(f *testing.F) {
	for _, c := range captures {
		for _, m := range readCMMADs(f, c.file) {
			f.Add([]byte(m.MAD))
		}
	}
	for _, a := range []AttrID{AttrREJ, AttrMRA, AttrSIDRREQ, AttrSIDRREP, AttrLAP} {
		b := make([]byte, MADSize)
		MAD(b).InitCM(a, 9)
		f.Add(b)
	}
}

// FuzzDecode: any 256 bytes that ParseMAD accepts decode without panic,
// and decoding is a fixed point of encoding (decode∘encode∘decode =
// decode).
func FuzzDecode(f *testing.F) {
	seedCorpus(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseMAD(b)
		if err != nil {
			return
		}
		_ = m.Header()
		if a := m.AttrID(); a < AttrREQ || a > AttrSIDRREP {
			return
		}
		_, _ = DecodeCMAHeader(m.Data()[140:])
		once := reencode(t, m)
		twice := reencode(t, once)
		if !bytes.Equal(once, twice) {
			t.Fatalf("re-encoding is not stable:\n%x\n%x", once, twice)
		}
	})
}

// FuzzManager: hostile MADs from two peers, with timers, never panic and
// never leave the manager unable to time out what it holds; whatever the
// peers send, an accepted connection receives from the Starting PSN of our
// REP and sends from that of the peer's REQ (the Linux rule).
func FuzzManager(f *testing.F) {
	seedCorpus(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		m := New(Config{Seed: 1, MaxCMRetries: 1})
		if err := m.Listen(ServiceIDTCP(7174), ListenOptions{RDMACM: true}); err != nil {
			t.Fatal(err)
		}
		if err := m.Listen(ServiceIDTCP(18523), ListenOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := m.Listen(ServiceIDUDP(4791), ListenOptions{RDMACM: true}); err != nil {
			t.Fatal(err)
		}
		now := clock.Time(0)
		const ourPSN = 0x5A5A5A
		sendPSN := map[ConnID]uint32{} // accepted: the REQ's Starting PSN
		for i := 0; i+MADSize <= len(b) || i == 0; i += MADSize {
			from := addrA
			if i%(2*MADSize) != 0 {
				from = addrB
			}
			_ = m.HandleMAD(now, from, b[i:]) // refusing malformed input is fine; what follows is checked
			evs, sends := m.Drain()
			for _, s := range sends {
				if mad := MAD(s.MAD[:]); mad.AttrID() == AttrREP {
					var rep REP
					rep.Decode(mad.Data())
					if rep.StartingPSN != ourPSN {
						t.Fatalf("REP with Starting PSN %#x, accepted with %#x", rep.StartingPSN, ourPSN)
					}
				}
			}
			for _, e := range evs {
				switch e.Kind {
				case EventConnRequest:
					if e.QP.RQPSN != 0 || e.QP.SQPSN > 0xFFFFFF {
						t.Fatalf("REQ event PSNs: send %#x recv %#x", e.QP.SQPSN, e.QP.RQPSN)
					}
					if m.Accept(now, e.ID, &AcceptParams{QPN: 0x99, StartingPSN: ourPSN}) == nil {
						sendPSN[e.ID] = e.QP.SQPSN
					}
				case EventSIDRRequest:
					if err := m.SIDRReply(now, e.ID, &SIDRReplyParams{QPN: 0x98, QKey: RDMAUDPQKey}); err != nil {
						t.Fatal(err)
					}
				case EventEstablished:
					if want, ok := sendPSN[e.ID]; !ok || e.QP.RQPSN != ourPSN || e.QP.SQPSN != want {
						t.Fatalf("established %v (accepted %v): send %#x recv %#x, want %#x %#x",
							e.ID, ok, e.QP.SQPSN, e.QP.RQPSN, want, ourPSN)
					}
					if err := m.Disconnect(now, e.ID, nil); err != nil {
						t.Fatal(err)
					}
				}
			}
			if i+MADSize > len(b) {
				break
			}
		}
		// Every connection ends within a bounded number of timer runs.
		for range 64 {
			d := m.NextDeadline()
			if d == clock.Never {
				break
			}
			now = max(now, d)
			m.Tick(now)
			m.Drain()
		}
		if m.Conns() != 0 {
			t.Fatalf("%d connections never expire", m.Conns())
		}
	})
}

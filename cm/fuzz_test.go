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
// never leave the manager unable to time out what it holds.
func FuzzManager(f *testing.F) {
	seedCorpus(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		m := New(Config{Seed: 1, MaxCMRetries: 1})
		m.Listen(ServiceIDTCP(7174), ListenOptions{RDMACM: true})
		m.Listen(ServiceIDTCP(18523), ListenOptions{})
		m.Listen(ServiceIDUDP(4791), ListenOptions{RDMACM: true})
		now := clock.Time(0)
		for i := 0; i+MADSize <= len(b) || i == 0; i += MADSize {
			from := addrA
			if i%(2*MADSize) != 0 {
				from = addrB
			}
			m.HandleMAD(now, from, b[i:])
			evs, _ := m.Drain()
			for _, e := range evs {
				switch e.Kind {
				case EventConnRequest:
					m.Accept(now, e.ID, &AcceptParams{QPN: 0x99, StartingPSN: 1})
				case EventSIDRRequest:
					m.SIDRReply(now, e.ID, &SIDRReplyParams{QPN: 0x98, QKey: RDMAUDPQKey})
				case EventEstablished:
					m.Disconnect(now, e.ID, nil)
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

package engine

import (
	"net/netip"
	"testing"
	"time"

	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/rnictest"
	"github.com/softrnic/softrnic/port/memlink"
	"github.com/softrnic/softrnic/rnic"
	"github.com/softrnic/softrnic/verbs"
)

// TestRxAwayReachesCC: the engine tells the device how long it was away
// from its port before each poll that returned frames, and a Swift QP
// takes half of it as the host's share of the RTT. The sender's loop polls
// every 20 µs, so each ACK it reads waited up to 20 µs: the QP's host
// delay is 10 µs; stepping without waiting in the port, the whole gap
// counts.
func TestRxAwayReachesCC(t *testing.T) {
	cong, err := rnic.NewCongestion("swift", "", 0, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	vc := &memlink.VirtualClock{}
	pa, pb := memlink.NewPair(memlink.Config{Clock: vc.Now, Frames: 2048, Impairments: memlink.Impairments{Delay: time.Microsecond}})
	mk := func(mac [6]byte, addr netip.Addr) *host {
		d, err := rnic.NewDevice(rnic.Config{MAC: mac, Addrs: []netip.Addr{addr}, PortMTU: 1024, Congestion: cong})
		if err != nil {
			t.Fatal(err)
		}
		h := &host{dev: d, pd: rnictest.PD(d), cq: rnictest.CQ(d, 4096)}
		if h.mr, err = h.pd.RegBytes(make([]byte, 1<<16), 0, ib.LocalWrite|ib.RemoteWrite); err != nil {
			t.Fatal(err)
		}
		return h
	}
	a, b := mk(macA, addrA), mk(macB, addrB)
	la, _ := NewLoop(a.dev, pa, Options{Now: vc.Now})
	lb, _ := NewLoop(b.dev, pb, Options{Now: vc.Now})
	qa, qb := a.createQP(t, ib.RC), b.createQP(t, ib.RC)
	connect(t, qa, 1024, qb.QPN(), macB, addrB, 77, 55)
	connect(t, qb, 1024, qa.QPN(), macA, addrA, 55, 77)
	wr := verbs.SendWR{Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: []ib.SGE{{Addr: a.mr.IOVA(), Length: 4096, LKey: a.mr.LKey()}},
		RemoteAddr: b.mr.IOVA(), RKey: b.mr.RKey()}
	if _, err := qa.PostSend([]verbs.SendWR{wr}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 200; i++ {
		vc.Advance(time.Microsecond)
		if i%20 == 0 {
			if _, err := la.Step(vc.Now(), 0); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := lb.Step(vc.Now(), 0); err != nil {
			t.Fatal(err)
		}
	}
	cs, ok := qa.CongestionState()
	if !ok || cs.RTTSamples == 0 || cs.HostDelay != 10*time.Microsecond {
		t.Fatalf("sender's state %+v: want RTT samples and a host delay of 10 µs", cs)
	}
}

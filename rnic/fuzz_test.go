package rnic

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/softrnic/softrnic/frame"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/ibtest"
	"github.com/softrnic/softrnic/port/memlink"
	"github.com/softrnic/softrnic/verbs"
)

// FuzzDeviceReceive feeds arbitrary frames to a device with RC and UD QPs
// in service. When the fuzzer's bytes parse as RoCEv2, they are re-stamped
// with a valid ICRC and aimed at a live QP, so that the transports see
// hostile packets rather than the ICRC check eating them. Nothing may
// panic, and a guard MR without remote access must never change.
func FuzzDeviceReceive(f *testing.F) {
	tb := newTestbed(f, memlink.Impairments{}, 1, 1024)
	qa, _ := tb.connect(ib.RC, 1024, ib.LocalWrite|ib.RemoteWrite|ib.RemoteRead|ib.RemoteAtomic, 8)
	src, _ := tb.a.pd.RegBytes(make([]byte, 64), 0, ib.LocalWrite)
	out := [][]byte{make([]byte, 9000)}
	seed := func(s verbs.SendWR) {
		if _, err := qa.PostSend([]verbs.SendWR{s}); err != nil {
			f.Fatal(err)
		}
		for tb.a.dev.Transmit(0, out) == 1 {
			f.Add(append([]byte(nil), out[0]...), uint8(0))
			out[0] = out[0][:cap(out[0])]
		}
	}
	sg := []ib.SGE{{Addr: src.IOVA(), Length: 64, LKey: src.LKey()}}
	seed(verbs.SendWR{Opcode: ib.RDMAWrite, SG: sg, RemoteAddr: 0x1000, RKey: 1})
	seed(verbs.SendWR{Opcode: ib.RDMARead, SG: sg, RemoteAddr: 0x1000, RKey: 1})
	seed(verbs.SendWR{Opcode: ib.AtomicFetchAndAdd, SG: []ib.SGE{{Addr: src.IOVA(), Length: 8, LKey: src.LKey()}}, RemoteAddr: 0x1000, RKey: 1})
	f.Fuzz(func(t *testing.T, b []byte, qpSel uint8) {
		tb := portlessTestbed(t)
		_, qb := tb.connect(ib.RC, 1024, ib.LocalWrite|ib.RemoteWrite|ib.RemoteRead|ib.RemoteAtomic, 8)
		cq := tb.b.dev.newCQ(8)
		ud, _ := tb.b.pd.newQP(testQP{Type: ib.UD, SendCQ: cq, RecvCQ: cq})
		must(t, ibtest.Modify(ud, ib.Init, &ib.QPAttr{QKey: 1}))
		must(t, ibtest.Modify(ud, ib.RTR, nil))
		guard, _ := tb.b.pd.RegBytes(make([]byte, 256), 0, ib.LocalWrite)
		rb, _ := tb.b.pd.RegBytes(make([]byte, 2048), 0, ib.LocalWrite)
		_, _ = qb.PostRecv([]verbs.RecvWR{{SG: []ib.SGE{{Addr: rb.IOVA(), Length: 2048, LKey: rb.LKey()}}}})
		_, _ = ud.PostRecv([]verbs.RecvWR{{SG: []ib.SGE{{Addr: rb.IOVA(), Length: 2048, LKey: rb.LKey()}}}})
		var fr frame.Frame
		if frame.Parse(b, &fr) == nil {
			dst := qb.QPN()
			if qpSel&1 != 0 {
				dst = ud.QPN()
			}
			h := fr.BTH()
			h.SetDestQP(dst)
			h.SetPKey(0xFFFF)
			_ = restamp(b)
		}
		tb.b.dev.Receive(0, [][]byte{b, b})
		o := [][]byte{make([]byte, 9000)}
		for i := 0; i < 64 && tb.b.dev.Transmit(0, o) > 0; i++ {
			o[0] = o[0][:cap(o[0])]
		}
		if !bytes.Equal(guard.Bytes(), make([]byte, 256)) {
			t.Fatal("guard MR changed")
		}
	})
}

// portlessTestbed is two devices without a link, for tests that hand
// frames to Receive themselves: cheap enough to build per fuzz input.
func portlessTestbed(t testing.TB) *testbed {
	tb := &testbed{t: t}
	for i, n := range []**node{&tb.a, &tb.b} {
		mac, addr := macA, addrA
		if i == 1 {
			mac, addr = macB, addrB
		}
		d, err := NewDevice(Config{MAC: mac, Addrs: []netip.Addr{addr}})
		if err != nil {
			t.Fatal(err)
		}
		*n = &node{dev: d, pd: d.allocPD()}
	}
	return tb
}

package rnic

import (
	"bytes"
	"encoding/binary"
	"testing"
	"time"

	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/ibtest"
	"github.com/softrnic/softrnic/port/memlink"
	"github.com/softrnic/softrnic/verbs"
)

// connectLocal connects two QPs of node n to each other (one QP may be
// both: a QP connected to itself), with the device's own GID as the peer
// and no DMAC: the device finds it is itself.
func connectLocal(t *testing.T, qs [2]*QP, access ib.Access, mtu int) {
	t.Helper()
	uniq := qs[:]
	if qs[0] == qs[1] {
		uniq = qs[:1]
	}
	for i, q := range uniq {
		must(t, ibtest.Modify(q, ib.Init, &ib.QPAttr{Access: access}))
		must(t, ibtest.Modify(q, ib.RTR, &ib.QPAttr{PathMTU: uint32(mtu), DestQPN: qs[1-i].QPN(), RQPSN: 100, MaxDestRdAtomic: 4, MinRNRTimer: 1,
			AV: ib.AddressVector{DGID: ib.GIDFrom(q.dev.cfg.Addrs[0])}}))
	}
	for _, q := range uniq {
		must(t, ibtest.Modify(q, ib.RTS, &ib.QPAttr{SQPSN: 100, Timeout: 6, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 4}))
	}
}

// Two QPs of one device exchange every RC operation and UD datagrams
// without a frame on the port, and a QP connected to itself works too.
func TestLoopback(t *testing.T) {
	tb := newTestbed(t, memlink.Impairments{}, 1, 1024)
	n := tb.a
	all := ib.LocalWrite | ib.RemoteWrite | ib.RemoteRead | ib.RemoteAtomic
	cq := n.dev.newCQ(64)
	mk := func(typ ib.QPType) *QP {
		q, err := n.pd.newQP(testQP{Type: typ, SendCQ: cq, RecvCQ: cq, MaxSendWR: 16, MaxRecvWR: 16, MaxSGE: 1})
		must(t, err)
		return q
	}
	buf := make([]byte, 16384)
	mr, err := n.pd.RegBytes(buf, 0, all)
	must(t, err)
	at := func(off, k int) []ib.SGE {
		return []ib.SGE{{Addr: mr.IOVA() + uint64(off), Length: uint32(k), LKey: mr.LKey()}}
	}
	waitN := func(k int) []ib.WC {
		var got []ib.WC
		tb.run(func() bool { got = append(got, pollAll(cq)...); return len(got) >= k }, time.Second)
		for _, w := range got {
			if w.Status != ib.Success {
				t.Fatalf("%+v", w)
			}
		}
		return got
	}
	copy(buf, bytes.Repeat([]byte("loopback"), 512)) // 4 KiB source

	qa, qb := mk(ib.RC), mk(ib.RC)
	connectLocal(t, [2]*QP{qa, qb}, all, 1024)
	_, err = qb.PostRecv([]verbs.RecvWR{{ID: 1, SG: at(8192, 4096)}})
	must(t, err)
	_, err = qa.PostSend([]verbs.SendWR{
		{ID: 2, Opcode: ib.Send, Flags: ib.Signaled, SG: at(0, 3000)},
		{ID: 3, Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: at(0, 4096), RemoteAddr: mr.IOVA() + 4096, RKey: mr.RKey()},
		{ID: 4, Opcode: ib.AtomicFetchAndAdd, Flags: ib.Signaled, SG: at(12288, 8), RemoteAddr: mr.IOVA() + 12296, RKey: mr.RKey(), CompareAdd: 5},
	})
	must(t, err)
	waitN(4)
	if !bytes.Equal(buf[8192:8192+3000], buf[:3000]) || !bytes.Equal(buf[4096:8192], buf[:4096]) || binary.NativeEndian.Uint64(buf[12296:]) != 5 {
		t.Fatal("loopback data")
	}
	_, err = qb.PostSend([]verbs.SendWR{{ID: 5, Opcode: ib.RDMARead, Flags: ib.Signaled, SG: at(14000, 1000), RemoteAddr: mr.IOVA() + 100, RKey: mr.RKey()}})
	must(t, err)
	waitN(1)
	if !bytes.Equal(buf[14000:15000], buf[100:1100]) {
		t.Fatal("loopback READ")
	}

	// A QP connected to itself.
	qs := mk(ib.RC)
	connectLocal(t, [2]*QP{qs, qs}, all, 1024)
	_, err = qs.PostRecv([]verbs.RecvWR{{ID: 6, SG: at(15000, 64)}})
	must(t, err)
	_, err = qs.PostSend([]verbs.SendWR{{ID: 7, Opcode: ib.Send, Flags: ib.Signaled, SG: at(0, 64)}})
	must(t, err)
	waitN(2)

	// UD to itself and to a QP number that does not exist (dropped by
	// the receive checks, as from the wire).
	u := mk(ib.UD)
	must(t, ibtest.Modify(u, ib.Init, &ib.QPAttr{QKey: 7}))
	must(t, ibtest.Modify(u, ib.RTR, nil))
	must(t, ibtest.Modify(u, ib.RTS, &ib.QPAttr{SQPSN: 1}))
	ah, err := n.pd.newAH(ib.AddressVector{DGID: ib.GIDFrom(addrA)})
	must(t, err)
	_, err = u.PostRecv([]verbs.RecvWR{{ID: 8, SG: at(15100, 1064)}})
	must(t, err)
	before := n.dev.Stats.RxNoQP
	_, err = u.PostSend([]verbs.SendWR{
		{ID: 9, Opcode: ib.Send, Flags: ib.Signaled, SG: at(0, 1024), AH: ah, RemoteQPN: 0xABCDE, RemoteQKey: 7},
		{ID: 10, Opcode: ib.Send, Flags: ib.Signaled, SG: at(0, 1024), AH: ah, RemoteQPN: u.QPN(), RemoteQKey: 7},
	})
	must(t, err)
	w := waitN(3)
	if n.dev.Stats.RxNoQP != before+1 {
		t.Fatalf("the datagram to no QP: RxNoQP %d", n.dev.Stats.RxNoQP-before)
	}
	for _, c := range w {
		if c.IsRecv && (c.ByteLen != 1064 || !bytes.Equal(buf[15100+40:15100+1064], buf[:1024])) {
			t.Fatalf("UD loopback %+v", c)
		}
	}
	if n.dev.Stats.TxFrames != 0 || n.dev.Stats.LoopFrames == 0 || tb.b.dev.Stats.RxFrames != 0 {
		t.Fatalf("frames on the wire: %d sent, %d looped", n.dev.Stats.TxFrames, n.dev.Stats.LoopFrames)
	}
}

// A message that finds the RQ empty asks the QP's refill for receives
// queued but not yet posted (the daemon's ring) before it is dropped (UD)
// or answered with an RNR NAK (RC).
func TestRecvRefill(t *testing.T) {
	tb := newTestbed(t, memlink.Impairments{}, 1, 1024)
	n := tb.a
	cq := n.dev.newCQ(64)
	buf := make([]byte, 4096)
	mr, err := n.pd.RegBytes(buf, 0, ib.LocalWrite|ib.RemoteWrite)
	must(t, err)
	queued := []verbs.RecvWR{{ID: 7, SG: []ib.SGE{{Addr: mr.IOVA(), Length: 2048, LKey: mr.LKey()}}}}
	calls := 0
	for _, typ := range []ib.QPType{ib.UD, ib.RC} {
		q, err := n.pd.newQP(testQP{Type: typ, SendCQ: cq, RecvCQ: cq, MaxSendWR: 8, MaxRecvWR: 8, MaxSGE: 1})
		must(t, err)
		q.SetRecvRefill(func(post func(*verbs.RecvWR) bool) {
			calls++
			for len(queued) > 0 && post(&queued[0]) {
				queued = queued[1:]
			}
		})
		dst := q
		if typ == ib.UD {
			must(t, ibtest.Modify(q, ib.Init, &ib.QPAttr{QKey: 7}))
			must(t, ibtest.Modify(q, ib.RTR, nil))
			must(t, ibtest.Modify(q, ib.RTS, &ib.QPAttr{SQPSN: 1}))
			ah, err := n.pd.newAH(ib.AddressVector{DGID: ib.GIDFrom(addrA)})
			must(t, err)
			_, err = q.PostSend([]verbs.SendWR{{ID: 1, Opcode: ib.Send, Flags: ib.Signaled, SG: []ib.SGE{{Addr: mr.IOVA() + 2048, Length: 100, LKey: mr.LKey()}}, AH: ah, RemoteQPN: q.QPN(), RemoteQKey: 7}})
			must(t, err)
		} else {
			connectLocal(t, [2]*QP{q, q}, ib.RemoteWrite, 1024)
			_, err = q.PostSend([]verbs.SendWR{{ID: 1, Opcode: ib.Send, Flags: ib.Signaled, SG: []ib.SGE{{Addr: mr.IOVA() + 2048, Length: 100, LKey: mr.LKey()}}}})
			must(t, err)
		}
		var got []ib.WC
		tb.run(func() bool { got = append(got, pollAll(cq)...); return len(got) >= 2 }, time.Second)
		for _, w := range got {
			if w.Status != ib.Success || (w.IsRecv && w.ID != 7) {
				t.Fatalf("%v: %+v", typ, got)
			}
		}
		if typ == ib.RC && dst.rcQP().TxRNRNAKs != 0 {
			t.Fatalf("RC: %d RNR NAKs", dst.rcQP().TxRNRNAKs)
		}
		queued = []verbs.RecvWR{{ID: 7, SG: []ib.SGE{{Addr: mr.IOVA(), Length: 2048, LKey: mr.LKey()}}}}
	}
	if calls < 2 {
		t.Fatalf("refill called %d times", calls)
	}
}

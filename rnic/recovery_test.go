package rnic

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/port/memlink"
	"github.com/softrnic/softrnic/transport/rc"
	"github.com/softrnic/softrnic/verbs"
)

// connectWith is testbed.connect with a recovery mode per side
// (verbs.QPInitAttr.Recovery).
func (tb *testbed) connectWith(ra, rb ib.Recovery) (qa, qb *QP) {
	tb.t.Helper()
	mk := func(n *node, r ib.Recovery) *QP {
		v, err := n.pd.CreateQP(&verbs.QPInitAttr{Type: ib.RC, SendCQ: n.dev.newCQ(256), RecvCQ: n.dev.newCQ(256), Recovery: r,
			Cap: ib.QPCaps{MaxSendWR: 64, MaxRecvWR: 64, MaxSendSGE: 1, MaxRecvSGE: 1}})
		if err != nil {
			tb.t.Fatal(err)
		}
		return v.(*QP)
	}
	qa, qb = mk(tb.a, ra), mk(tb.b, rb)
	conn := func(q, peer *QP, av ib.AddressVector, psnOut, psnIn uint32) {
		must(tb.t, q.Modify(&ib.QPAttr{State: ib.Init, Access: ib.LocalWrite | ib.RemoteWrite | ib.RemoteRead, Port: 1},
			ib.AttrState|ib.AttrAccessFlags|ib.AttrPort|ib.AttrPKeyIndex))
		must(tb.t, q.Modify(&ib.QPAttr{State: ib.RTR, PathMTU: 1024, DestQPN: peer.QPN(), RQPSN: psnIn, MaxDestRdAtomic: 16, MinRNRTimer: 1, AV: av},
			ib.AttrState|ib.AttrAV|ib.AttrPathMTU|ib.AttrDestQPN|ib.AttrRQPSN|ib.AttrMaxDestRdAtomic|ib.AttrMinRNRTimer))
		must(tb.t, q.Modify(&ib.QPAttr{State: ib.RTS, SQPSN: psnOut, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 16},
			ib.AttrState|ib.AttrSQPSN|ib.AttrTimeout|ib.AttrRetryCnt|ib.AttrRNRRetry|ib.AttrMaxQPRdAtomic))
	}
	conn(qa, qb, ib.AddressVector{DMAC: macB, DGID: ib.GIDFrom(addrB)}, 1000, 2000)
	conn(qb, qa, ib.AddressVector{DMAC: macA, DGID: ib.GIDFrom(addrA)}, 2000, 1000)
	return qa, qb
}

// writeAll WRITEs n messages of size bytes from qa into memory on its
// peer's device, every byte checked.
func (tb *testbed) writeAll(qa *QP, n, size int) {
	tb.t.Helper()
	src := make([]byte, n*size)
	pattern(src, 9)
	dst := make([]byte, n*size)
	smr, err := tb.a.pd.RegBytes(src, 0, ib.LocalWrite)
	must(tb.t, err)
	dmr, err := tb.b.pd.RegBytes(dst, 0, ib.LocalWrite|ib.RemoteWrite)
	must(tb.t, err)
	posted, done := 0, 0
	tb.run(func() bool {
		for posted < n && posted-done < 32 {
			wr := verbs.SendWR{ID: uint64(posted), Opcode: ib.RDMAWrite, Flags: ib.Signaled,
				SG:         []ib.SGE{{Addr: smr.IOVA() + uint64(posted*size), Length: uint32(size), LKey: smr.LKey()}},
				RemoteAddr: dmr.IOVA() + uint64(posted*size), RKey: dmr.RKey()}
			if _, err := qa.PostSend([]verbs.SendWR{wr}); err != nil {
				tb.t.Fatal(err)
			}
			posted++
		}
		for _, c := range pollAll(qa.init.SendCQ) {
			if c.Status != ib.Success {
				tb.t.Fatalf("WRITE %d: %v; requester %+v", c.ID, c.Status, qa.rcQP().Counters)
			}
			done++
		}
		return done == n
	}, time.Hour)
	qa.WithLock(func() {})
	if !bytes.Equal(src, dst) {
		tb.t.Fatal("data differs")
	}
}

// TestDeviceRecoveryKnob: RC QPs are numbered in softrnic's range; two
// QPs that both may use selective repeat agree on it by themselves, one
// that asks for adaptive or timeout recovery (per QP, or from its device)
// keeps both directions on go-back-N; a timeout QP has no adaptive timer;
// the mode shows in the QP's counters.
func TestDeviceRecoveryKnob(t *testing.T) {
	S, A, T, D := ib.RecoverySelective, ib.RecoveryAdaptive, ib.RecoveryTimeout, ib.RecoveryDefault
	for _, k := range []struct {
		devB       ib.Recovery // device B's default
		qa, qb     ib.Recovery // per QP
		wantB      ib.Recovery // what B's QP runs
		sr         bool
		adaptiveOn bool // A's requester retransmits on its own timers
	}{
		{D, D, D, S, true, true},
		{D, S, S, S, true, true},
		{D, D, A, A, false, true},
		{D, A, D, S, false, true},
		{D, T, D, S, false, false},
		{T, D, D, T, false, true},
		{A, D, S, S, true, true},
	} {
		t.Run(fmt.Sprintf("devB=%v/qa=%v/qb=%v", k.devB, k.qa, k.qb), func(t *testing.T) {
			tb := newTestbed(t, memlink.Impairments{Loss: 0.02, Reorder: 0.02, Duplicate: 0.01}, 5, 1024)
			d, err := NewDevice(Config{MAC: macB, Addrs: []netip.Addr{addrB}, PortMTU: 1024, Recovery: k.devB})
			must(t, err)
			tb.b.dev, tb.b.pd = d, d.allocPD()
			qa, qb := tb.connectWith(k.qa, k.qb)
			for _, q := range []*QP{qa, qb} {
				if !rc.SoftQPN(q.QPN()) {
					t.Fatalf("QPN %#x outside softrnic's range", q.QPN())
				}
			}
			if qb.init.Recovery != k.wantB {
				t.Fatalf("B's QP runs %v, want %v", qb.init.Recovery, k.wantB)
			}
			tb.writeAll(qa, 60, 9000)
			reqSR, _ := qa.rcQP().SelectiveRepeat()
			_, respSR := qb.rcQP().SelectiveRepeat()
			if reqSR != k.sr || respSR != k.sr {
				t.Fatalf("selective repeat: requester %v responder %v, want %v", reqSR, respSR, k.sr)
			}
			ca, cb := qa.rcQP().Counters, qb.rcQP().Counters
			if k.sr != (cb.TxSACKs > 0 && ca.RxSACKs > 0) {
				t.Fatalf("SACKs sent %d, read %d with selective repeat %v", cb.TxSACKs, ca.RxSACKs, k.sr)
			}
			if !k.adaptiveOn && ca.AdpRetrans+ca.TLPProbes+ca.AdpRetransTO != 0 {
				t.Fatalf("a timeout-mode requester retransmitted on its own timers: %+v", ca)
			}
			if ca.RetransPkts == 0 {
				t.Fatalf("2 %% loss and no packet sent twice: %+v", ca)
			}
			var seen bool
			tb.b.dev.EachQPCounters(func(c *QPCounters) {
				if c.QPN == qb.QPN() {
					seen = c.Recovery == k.wantB && c.SRResp == k.sr
				}
			})
			if !seen {
				t.Fatal("B's QP counters do not report its recovery")
			}
		})
	}
	// A mode that does not exist is refused, by the device and per QP.
	if _, err := NewDevice(Config{MAC: macA, Addrs: []netip.Addr{addrA}, Recovery: 9}); !errors.Is(err, verbs.ErrInvalid) {
		t.Fatalf("device with recovery 9: %v", err)
	}
	tb := newTestbed(t, memlink.Impairments{}, 1, 1024)
	if _, err := tb.a.pd.CreateQP(&verbs.QPInitAttr{Type: ib.RC, SendCQ: tb.a.dev.newCQ(4), RecvCQ: tb.a.dev.newCQ(4), Recovery: 9}); !errors.Is(err, verbs.ErrInvalid) {
		t.Fatalf("QP with recovery 9: %v", err)
	}
}

// TestDeviceReorderPoolReleased: packets a selective-repeat QP holds out
// of order come from the device's reorder pool and go back to it when the
// QP is destroyed (or reset) with them still held; the QP's counters stay
// in the device's lifetime totals.
func TestDeviceReorderPoolReleased(t *testing.T) {
	for _, reset := range []bool{false, true} {
		tb := newTestbed(t, memlink.Impairments{}, 1, 1024)
		qa, qb := tb.connectWith(ib.RecoveryDefault, ib.RecoveryDefault)
		dst := make([]byte, 8192)
		dmr, err := tb.b.pd.RegBytes(dst, 0, ib.LocalWrite|ib.RemoteWrite)
		must(t, err)
		src := make([]byte, 8192)
		smr, err := tb.a.pd.RegBytes(src, 0, ib.LocalWrite)
		must(t, err)
		if _, err := qa.PostSend([]verbs.SendWR{{Opcode: ib.RDMAWrite, SG: []ib.SGE{{Addr: smr.IOVA(), Length: 8192, LKey: smr.LKey()}},
			RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()}}); err != nil {
			t.Fatal(err)
		}
		out := make([][]byte, 16)
		for i := range out {
			out[i] = make([]byte, 2048)
		}
		n := tb.a.dev.Transmit(tb.clk.Now(), out)
		if n != 8 {
			t.Fatalf("%d frames, want 8", n)
		}
		tb.b.dev.Receive(tb.clk.Now(), out[1:n]) // the first is lost
		if got := tb.b.dev.ReorderInUse(); got != 7 || qb.rcQP().SRHeld != 7 {
			t.Fatalf("%d pool buffers in use, %d held; want 7", got, qb.rcQP().SRHeld)
		}
		if reset {
			must(t, qb.Modify(&ib.QPAttr{State: ib.Reset}, ib.AttrState))
		} else {
			must(t, qb.Destroy())
		}
		if got := tb.b.dev.ReorderInUse(); got != 0 {
			t.Fatalf("reset %v: %d pool buffers still in use", reset, got)
		}
		if c := tb.b.dev.RCCounters(); c.SRHeld != 7 || c.RxOutOfSeq != 7 {
			t.Fatalf("reset %v: lifetime totals %+v", reset, c)
		}
	}
}

package rnic

import (
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/port/memlink"
	"github.com/softrnic/softrnic/verbs"
)

// TestModifyMasks walks RC, UC and UD QPs up to RTS with exactly the
// attributes IBA requires, and checks that each transition refuses a mask
// missing one required attribute or carrying one the transition does not
// take, naming the attribute, with EINVAL, and leaves the QP as it was.
func TestModifyMasks(t *testing.T) {
	tb := newTestbed(t, memlink.Impairments{}, 21, 1024)
	full := ib.QPAttr{Port: 1, Access: ib.RemoteWrite, QKey: 0x11111111, PathMTU: 1024, DestQPN: 0x99, RQPSN: 1,
		SQPSN: 2, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 1, MaxDestRdAtomic: 1, MinRNRTimer: 12,
		AV: ib.AddressVector{DMAC: macB, DGID: ib.GIDFrom(addrB)}}
	for _, typ := range []ib.QPType{ib.RC, ib.UC, ib.UD} {
		cq := tb.a.dev.newCQ(16)
		q, err := tb.a.pd.newQP(testQP{Type: typ, SendCQ: cq, RecvCQ: cq})
		must(t, err)
		for _, to := range []ib.QPState{ib.Init, ib.RTR, ib.RTS} {
			from := q.State()
			req, opt, ok := ib.Transition(typ, from, to)
			if !ok {
				t.Fatalf("%v %v→%v not in the table", typ, from, to)
			}
			a := full
			a.State = to
			for bit := ib.QPAttrMask(1); bit != 0 && bit <= ib.AttrRateLimit; bit <<= 1 {
				var mask ib.QPAttrMask
				switch {
				case req&bit != 0:
					mask = ib.AttrState | req&^bit // one required attribute missing
				case opt&bit == 0 && bit != ib.AttrState:
					mask = ib.AttrState | req | bit // one the transition does not take
				default:
					continue
				}
				err := q.Modify(&a, mask)
				var me *verbs.ModifyError
				if !errors.As(err, &me) || me.Attr&bit == 0 || !errors.Is(err, verbs.ErrInvalid) || !errors.Is(err, syscall.EINVAL) ||
					!strings.Contains(err.Error(), bit.String()) || q.State() != from {
					t.Fatalf("%v %v→%v with mask %v: %v", typ, from, to, mask, err)
				}
			}
			must(t, q.Modify(&a, ib.AttrState|req))
		}
		if q.State() != ib.RTS {
			t.Fatalf("%v: %v", typ, q.State())
		}
		// Out of range values are refused, naming the attribute.
		if err := q.Modify(&ib.QPAttr{State: ib.SQD}, ib.AttrState); err != nil {
			t.Fatal(err)
		}
		if typ == ib.RC {
			err := q.Modify(&ib.QPAttr{RetryCnt: 8}, ib.AttrRetryCnt)
			var me *verbs.ModifyError
			if !errors.As(err, &me) || me.Attr != ib.AttrRetryCnt || me.QPN != q.QPN() || me.From != ib.SQD {
				t.Fatalf("retry count 8: %v", err)
			}
			err = q.Modify(&ib.QPAttr{}, ib.AttrAltPath)
			if !errors.Is(err, verbs.ErrNotSupported) || !errors.Is(err, syscall.EOPNOTSUPP) {
				t.Fatalf("alternate path: %v", err)
			}
		}
	}
}

// TestSendWithInvalidate: SEND_WITH_INV (opcode 9) reaches the peer's
// receive with the invalidated rkey, and the peer's MR stops working.
func TestSendWithInvalidate(t *testing.T) {
	tb := newTestbed(t, memlink.Impairments{}, 22, 1024)
	qa, qb := tb.connect(ib.RC, 1024, ib.LocalWrite, 8)
	target, _ := tb.b.pd.RegBytes(make([]byte, 64), 0, ib.LocalWrite|ib.RemoteWrite)
	rb, _ := tb.b.pd.RegBytes(make([]byte, 64), 0, ib.LocalWrite)
	src, _ := tb.a.pd.RegBytes([]byte("invalidate"), 0, ib.LocalWrite)
	_, err := qb.PostRecv([]verbs.RecvWR{{ID: 5, SG: []ib.SGE{{Addr: rb.IOVA(), Length: 64, LKey: rb.LKey()}}}})
	must(t, err)
	_, err = qa.PostSend([]verbs.SendWR{{ID: 6, Opcode: ib.SendWithInv, Flags: ib.Signaled, InvRKey: target.RKey(),
		SG: []ib.SGE{{Addr: src.IOVA(), Length: 10, LKey: src.LKey()}}}})
	must(t, err)
	var got []ib.WC
	tb.run(func() bool { got = append(got, pollAll(qb.init.RecvCQ)...); return len(got) == 1 }, time.Second)
	w := got[0]
	if w.Status != ib.Success || w.Flags&ib.WCWithInv == 0 || w.InvRKey != target.RKey() || w.ByteLen != 10 || target.Valid() {
		t.Fatalf("%+v valid=%v", w, target.Valid())
	}
}

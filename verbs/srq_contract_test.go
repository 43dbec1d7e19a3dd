package verbs_test

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/rnic"
	"github.com/softrnic/softrnic/verbs"
)

var (
	_ verbs.SRQ          = (*rnic.SRQ)(nil)
	_ verbs.AsyncEventer = (*rnic.Device)(nil)
)

// eventsOf is where a test reads dev's asynchronous events: the client's
// Events, or, in process, a subscription of the device's own (the rdma_cm
// agent of the testbed reads its Events channel).
func eventsOf(t testing.TB, dev verbs.Device) <-chan verbs.AsyncEvent {
	if d, ok := dev.(*rnic.Device); ok {
		ch, cancel := d.Subscribe(64)
		t.Cleanup(cancel)
		return ch
	}
	return dev.(verbs.AsyncEventer).Events()
}

// waitEvent waits (bounded) for an event equal to want, skipping others.
func waitEvent(t testing.TB, ch <-chan verbs.AsyncEvent, want verbs.AsyncEvent) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case e := <-ch:
			if e == want {
				return
			}
		case <-deadline:
			t.Fatalf("no %v event", want.Type)
		}
	}
}

// SRQs work the same on every RNIC, for every QP type: receives posted to
// one SRQ serve two QPs; the limit armed with Modify fires
// SRQ_LIMIT_REACHED once and disarms; an SRQ in use cannot be destroyed;
// a QP on it that goes to ERR reports QP_LAST_WQE_REACHED.
func TestSRQOnEveryRNIC(t *testing.T) {
	tb := newTestbed(t)
	for _, p := range tb.pairs() {
		for _, typ := range []ib.QPType{ib.RC, ib.UC, ib.UD} {
			t.Run(p.name+"/"+typ.String(), func(t *testing.T) {
				evs := eventsOf(t, p.y)
				x1, x2 := newEnd(t, p.x, typ), newEnd(t, p.x, typ)
				y := newEnd(t, p.y, typ) // its PD, MR and CQ; its own QP is unused
				srq, err := y.pd.CreateSRQ(8, 1)
				if err != nil {
					t.Fatal(err)
				}
				defer srq.Destroy()
				if a, err := srq.Query(); err != nil || a.MaxWR < 8 || a.MaxSGE != 1 || a.Limit != 0 {
					t.Fatalf("query %+v %v", a, err)
				}
				if err := srq.Modify(&ib.SRQAttr{MaxWR: 64}, ib.SRQMaxWR); !errors.Is(err, syscall.EINVAL) {
					t.Fatalf("resize: %v", err)
				}
				if err := srq.Modify(&ib.SRQAttr{Limit: 4}, ib.SRQLimit); err != nil {
					t.Fatal(err)
				}
				if a, _ := srq.Query(); a.Limit != 4 {
					t.Fatalf("armed limit %d", a.Limit)
				}
				var ys [2]verbs.QP
				for i := range ys {
					if ys[i], err = y.pd.CreateQP(&verbs.QPInitAttr{Type: typ, SendCQ: y.cq, RecvCQ: y.cq, SRQ: srq,
						Cap: ib.QPCaps{MaxSendWR: 8, MaxSendSGE: 1}}); err != nil {
						t.Fatal(err)
					}
					defer ys[i].Destroy()
				}
				if _, err := ys[0].PostRecv([]verbs.RecvWR{{ID: 1}}); !errors.Is(err, syscall.EINVAL) {
					t.Fatalf("post receive to a QP on an SRQ: %v", err)
				}
				// The QPs on the SRQ take the place of y's own.
				yq := [2]*end{{dev: y.dev, pd: y.pd, mem: y.mem, mr: y.mr, cq: y.cq, qp: ys[0], typ: typ},
					{dev: y.dev, pd: y.pd, mem: y.mem, mr: y.mr, cq: y.cq, qp: ys[1], typ: typ}}
				connect(t, x1, yq[0], &p)
				connect(t, x2, yq[1], &p)
				for i := 0; i < 8; i++ {
					w := []verbs.RecvWR{{ID: uint64(100 + i), SG: []ib.SGE{{Addr: y.mr.IOVA() + uint64(256*i), Length: 256, LKey: y.mr.LKey()}}}}
					if _, err := srq.PostRecv(w); err != nil {
						t.Fatal(err)
					}
				}
				if rs, ok := srq.(verbs.RecvSyncer); ok {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					if err := rs.SyncRecv(ctx); err != nil {
						t.Fatal(err)
					}
				}
				var ahs [2]verbs.AH
				if typ == ib.UD {
					for i, x := range []*end{x1, x2} {
						if ahs[i], err = x.pd.CreateAH(&ib.AddressVector{DGID: p.yGID}); err != nil {
							t.Fatal(err)
						}
						defer ahs[i].Destroy()
					}
				}
				seen := map[uint64]bool{}
				send := func(k int) {
					t.Helper()
					x, i := x1, 0
					if k%2 == 1 {
						x, i = x2, 1
					}
					x.mem.Bytes()[k] = byte(0xa0 + k)
					w := []verbs.SendWR{{ID: uint64(k), Opcode: ib.Send, Flags: ib.Signaled, SG: []ib.SGE{{Addr: x.mr.IOVA() + uint64(k), Length: 1, LKey: x.mr.LKey()}},
						AH: ahs[i], RemoteQPN: ys[i].QPN(), RemoteQKey: 0x11111111}}
					if _, err := x.qp.PostSend(w); err != nil {
						t.Fatal(err)
					}
					x.wait(t)
					wc := y.wait(t)
					off := 0
					if typ == ib.UD {
						off = 40
					}
					got := y.mem.Bytes()[256*(wc.ID-100)+uint64(off)]
					if !wc.IsRecv || wc.QPN != ys[i].QPN() || wc.ID < 100 || wc.ID > 107 || seen[wc.ID] || got != byte(0xa0+k) {
						t.Fatalf("message %d: %+v, byte %#x", k, wc, got)
					}
					seen[wc.ID] = true
				}
				for k := 0; k < 5; k++ { // the fifth leaves 3 of 8: below the limit
					send(k)
				}
				waitEvent(t, evs, verbs.AsyncEvent{Type: ib.EventSRQLimitReached, SRQ: srq})
				if a, _ := srq.Query(); a.Limit != 0 {
					t.Fatalf("limit %d still armed after the event", a.Limit)
				}
				if err := srq.Destroy(); !errors.Is(err, syscall.EBUSY) {
					t.Fatalf("destroy an SRQ in use: %v", err)
				}
				if err := ys[0].Modify(&ib.QPAttr{State: ib.Err}, ib.AttrState); err != nil {
					t.Fatal(err)
				}
				waitEvent(t, evs, verbs.AsyncEvent{Type: ib.EventQPLastWQEReached, QPN: ys[0].QPN()})
				send(5) // the other QP still takes the SRQ's receives
				for _, q := range ys {
					if err := q.Destroy(); err != nil {
						t.Fatal(err)
					}
				}
				if err := srq.Destroy(); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

package rnic

import (
	"errors"
	"testing"
	"time"

	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/port/memlink"
	"github.com/softrnic/softrnic/verbs"
)

// countersOf returns the snapshot of one QP's counters.
func countersOf(t *testing.T, d *Device, qpn uint32) QPCounters {
	t.Helper()
	var got *QPCounters
	d.EachQPCounters(func(c *QPCounters) {
		if c.QPN == qpn {
			cc := *c
			got = &cc
		}
	})
	if got == nil {
		t.Fatalf("no counters for QP %#x", qpn)
	}
	return *got
}

// TestCQECounters: error completions are counted per QP on the side that
// completes them, apart from flushes, over a real exchange of packets:
// a WRITE with a wrong rkey (requester: req_cqe_error and
// req_remote_access_errors; responder: resp_remote_access_errors, no CQE),
// then WRs posted to the errored QP (flushed: req_cqe_flush_error,
// resp_cqe_flush_error), and a SEND longer than the receive buffer
// (responder: resp_cqe_error and resp_local_length_error; requester:
// req_cqe_error and req_remote_invalid_request).
func TestCQECounters(t *testing.T) {
	tb := newTestbed(t, memlink.Impairments{}, 1, 1024)
	qa, qb := tb.connect(ib.RC, 1024, ib.LocalWrite|ib.RemoteWrite, 8)
	mrA, _ := tb.a.pd.RegBytes(make([]byte, 4096), 0, ib.LocalWrite)
	mrB, _ := tb.b.pd.RegBytes(make([]byte, 4096), 0, ib.LocalWrite|ib.RemoteWrite)
	if _, err := qa.PostSend([]verbs.SendWR{{ID: 1, Opcode: ib.RDMAWrite, Flags: ib.Signaled,
		SG: []ib.SGE{{Addr: mrA.IOVA(), Length: 64, LKey: mrA.LKey()}}, RemoteAddr: mrB.IOVA(), RKey: mrB.RKey() ^ 0x5a5a}}); err != nil {
		t.Fatal(err)
	}
	var wcs []ib.WC
	tb.run(func() bool { wcs = append(wcs, pollAll(qa.init.SendCQ)...); return len(wcs) == 1 }, time.Second)
	if wcs[0].Status != ib.RemAccessErr {
		t.Fatalf("WRITE with a wrong rkey: %+v", wcs[0])
	}
	a, b := countersOf(t, tb.a.dev, qa.QPN()), countersOf(t, tb.b.dev, qb.QPN())
	if a.CQE != (CQECounters{ReqErr: 1}) || a.RC.RxNAKRemAccess != 1 || a.RC.RxNAKInvReq != 0 {
		t.Errorf("requester after a remote access error: CQE %+v, RC %+v", a.CQE, a.RC)
	}
	if b.CQE != (CQECounters{}) || b.RC.RemAccessErrs != 1 || b.RC.RxWriteReqs != 1 {
		t.Errorf("responder after a remote access error: CQE %+v, RC %+v", b.CQE, b.RC)
	}
	// The requester's QP is in error: what is posted now is flushed.
	if _, err := qa.PostSend([]verbs.SendWR{{ID: 2, Opcode: ib.Send, Flags: ib.Signaled, SG: []ib.SGE{{Addr: mrA.IOVA(), Length: 8, LKey: mrA.LKey()}}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := qa.PostRecv([]verbs.RecvWR{{ID: 3, SG: []ib.SGE{{Addr: mrA.IOVA(), Length: 8, LKey: mrA.LKey()}}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := qa.PostRecv([]verbs.RecvWR{{ID: 4, SG: []ib.SGE{{Addr: mrA.IOVA(), Length: 8, LKey: mrA.LKey()}}}}); err != nil {
		t.Fatal(err)
	}
	if a := countersOf(t, tb.a.dev, qa.QPN()); a.CQE != (CQECounters{ReqErr: 1, ReqFlushErr: 1, RespFlushErr: 2}) {
		t.Errorf("after posting to the errored QP: %+v", a.CQE)
	}

	// A SEND longer than the receive buffer on a fresh pair.
	qa, qb = tb.connect(ib.RC, 1024, ib.LocalWrite, 8)
	if _, err := qb.PostRecv([]verbs.RecvWR{{ID: 5, SG: []ib.SGE{{Addr: mrB.IOVA(), Length: 16, LKey: mrB.LKey()}}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := qa.PostSend([]verbs.SendWR{{ID: 6, Opcode: ib.Send, Flags: ib.Signaled, SG: []ib.SGE{{Addr: mrA.IOVA(), Length: 17, LKey: mrA.LKey()}}}}); err != nil {
		t.Fatal(err)
	}
	wcs = wcs[:0]
	tb.run(func() bool { wcs = append(wcs, pollAll(qa.init.SendCQ)...); return len(wcs) == 1 }, time.Second)
	if wcs[0].Status != ib.RemInvReqErr {
		t.Fatalf("SEND longer than the receive buffer: %+v", wcs[0])
	}
	if rw := pollAll(qb.init.RecvCQ); len(rw) != 1 || rw[0].Status != ib.LocLenErr {
		t.Fatalf("receive completions %+v", rw)
	}
	a, b = countersOf(t, tb.a.dev, qa.QPN()), countersOf(t, tb.b.dev, qb.QPN())
	if a.CQE != (CQECounters{ReqErr: 1}) || a.RC.RxNAKInvReq != 1 {
		t.Errorf("requester after a length error: CQE %+v, RC %+v", a.CQE, a.RC)
	}
	if b.CQE != (CQECounters{RespErr: 1}) || b.RC.LocalLengthErrs != 1 {
		t.Errorf("responder after a length error: CQE %+v, RC %+v", b.CQE, b.RC)
	}
}

// A destroyed QP's counts stay in the device's totals: QPCounterTotals
// returns them as retired, and the QP no longer among the live ones.
func TestRetiredQPCounters(t *testing.T) {
	tb := newTestbed(t, memlink.Impairments{}, 1, 1024)
	qa, _ := tb.connect(ib.RC, 1024, ib.LocalWrite|ib.RemoteWrite, 8)
	mrA, _ := tb.a.pd.RegBytes(make([]byte, 4096), 0, ib.LocalWrite)
	// Two WRs flushed: the QP in error, then two sends posted.
	ibAttr := ib.QPAttr{State: ib.Err}
	if err := qa.Modify(&ibAttr, ib.AttrState); err != nil {
		t.Fatal(err)
	}
	for i := uint64(1); i <= 2; i++ {
		if _, err := qa.PostSend([]verbs.SendWR{{ID: i, Opcode: ib.Send, Flags: ib.Signaled, SG: []ib.SGE{{Addr: mrA.IOVA(), Length: 8, LKey: mrA.LKey()}}}}); err != nil {
			t.Fatal(err)
		}
	}
	live := countersOf(t, tb.a.dev, qa.QPN())
	if live.CQE.ReqFlushErr != 2 {
		t.Fatalf("flushes counted: %+v", live.CQE)
	}
	before := tb.a.dev.QPCounterTotals(func(*QPCounters) {})
	if err := qa.Destroy(); err != nil {
		t.Fatal(err)
	}
	qa.Destroy() // counted once
	n := 0
	after := tb.a.dev.QPCounterTotals(func(c *QPCounters) {
		n++
		if c.QPN == qa.QPN() {
			t.Errorf("destroyed QP %#x still live", c.QPN)
		}
	})
	if after.QPs != before.QPs+1 || after.CQE.ReqFlushErr != before.CQE.ReqFlushErr+2 || n != 0 {
		t.Fatalf("retired before %+v, after %+v; %d live", before.CQE, after.CQE, n)
	}
}

// A send WR with a flag the device does not implement is refused at post,
// as one with a bad opcode or too many SGEs: nothing is posted.
func TestPostRefusesUnknownSendFlags(t *testing.T) {
	tb := newTestbed(t, memlink.Impairments{}, 1, 1024)
	qa, _ := tb.connect(ib.RC, 1024, ib.LocalWrite, 8)
	mrA, _ := tb.a.pd.RegBytes(make([]byte, 4096), 0, ib.LocalWrite)
	sg := []ib.SGE{{Addr: mrA.IOVA(), Length: 8, LKey: mrA.LKey()}}
	for _, f := range []ib.SendFlags{1 << 4, 1 << 7, ib.Signaled | 1<<5} {
		if n, err := qa.PostSend([]verbs.SendWR{{ID: 1, Opcode: ib.Send, Flags: f, SG: sg}}); n != 0 || !errors.Is(err, verbs.ErrInvalid) {
			t.Errorf("flags %#x: %d posted, %v", f, n, err)
		}
	}
	if n, err := qa.PostSend([]verbs.SendWR{{ID: 2, Opcode: ib.Send, Flags: ib.KnownSendFlags &^ ib.Inline, SG: sg}}); n != 1 || err != nil {
		t.Errorf("known flags: %d posted, %v", n, err)
	}
}

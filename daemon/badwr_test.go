package daemon_test

import (
	"encoding/binary"
	"testing"

	"github.com/softrnic/softrnic/daemon"
	"github.com/softrnic/softrnic/daemon/proto"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/shmring"
	"github.com/softrnic/softrnic/internal/testlink"
)

// A WR that fails a local check, written straight into the SQ ring where
// no library checked it, is a bad WQE as an RNIC meets one: it completes
// in error after the WRs before it, the WRs after it are flushed, and the
// QP stops: SQE for UD (receiving goes on), ERR for RC.
func TestBadWRStopsTheQP(t *testing.T) {
	devA, devB := testlink.Pair(t, 1024)
	srv, path, _ := serveIn(t, t.TempDir(), devA, daemon.Options{})
	le := binary.LittleEndian
	var maxInline uint32 // the QP's, as CREATE_QP gave it
	cases := []struct {
		name string
		typ  ib.QPType
		caps ib.QPCaps
		fill func(s []byte)
	}{
		{"READ on UD", ib.UD, ib.QPCaps{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1}, func(s []byte) { s[8] = byte(ib.RDMARead) }},
		{"SGEs over the QP's max", ib.UD, ib.QPCaps{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInline: 256}, func(s []byte) { s[10] = 4 }},
		{"inline over the QP's max", ib.UD, ib.QPCaps{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 32, MaxRecvSGE: 1}, func(s []byte) {
			s[9] |= byte(ib.Inline)
			le.PutUint32(s[28:], maxInline+1)
		}},
		{"unknown opcode", ib.UD, ib.QPCaps{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1}, func(s []byte) { s[8] = 200 }},
		{"unknown flag bits", ib.UD, ib.QPCaps{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1}, func(s []byte) { s[9] |= 0x80 }},
		{"READ on UC", ib.UC, ib.QPCaps{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1}, func(s []byte) { s[8] = byte(ib.RDMARead) }},
		{"SGEs over the RC QP's max", ib.RC, ib.QPCaps{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInline: 256}, func(s []byte) { s[10] = 4 }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			bad0 := srv.BadWQEs.Load()
			r, db := openRawDoorbell(t, path)
			pd := r.allocPD()
			mfd := memfd(t, 1<<16)
			var mr proto.RegMRResp
			if err := r.call(proto.OpRegMR, &proto.RegMRReq{PD: pd, Access: ib.LocalWrite, Length: 1 << 16, IOVA: 0x100000}, &mr, mfd); err != nil {
				t.Fatal(err)
			}
			var cq proto.CreateCQResp
			cfds, err := r.callFDs(proto.OpCreateCQ, &proto.CreateCQReq{Depth: 16}, &cq)
			if err != nil {
				t.Fatal(err)
			}
			defer proto.CloseFDs(cfds)
			var qp proto.CreateQPResp
			qfds, err := r.callFDs(proto.OpCreateQP, &proto.CreateQPReq{PD: pd, SendCQ: cq.CQ, RecvCQ: cq.CQ, Type: c.typ, Caps: c.caps}, &qp)
			if err != nil {
				t.Fatal(err)
			}
			defer proto.CloseFDs(qfds)
			maxInline = uint32(qp.Caps.MaxInline)
			var ah proto.HandleMsg
			var dest, rkey uint32
			var raddr uint64
			steps := []ib.QPAttr{{Port: 1, QKey: 0x11}, {}, {}}
			if c.typ == ib.UD {
				if err := r.call(proto.OpCreateAH, &proto.CreateAHReq{PD: pd, AV: ib.AddressVector{DGID: gidB}}, &ah); err != nil {
					t.Fatal(err)
				}
				dest = 0x12345 // no such QP: the datagram goes and is dropped
			} else {
				// The peer: a QP on device B that takes the WRITEs.
				b := newApp(t, devB, c.typ, 1<<16, ib.LocalWrite|ib.RemoteWrite, 16, c.caps)
				connectRC(t, b.qp, ib.RemoteWrite, qp.QPN, gidA, 0, 0)
				dest, raddr, rkey = b.qp.QPN(), b.mr.IOVA(), b.mr.RKey()
				steps = []ib.QPAttr{{Port: 1},
					{PathMTU: 1024, DestQPN: dest, MaxDestRdAtomic: 4, MinRNRTimer: 1, AV: ib.AddressVector{DGID: gidB}},
					{Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 4}}
			}
			from := ib.Reset
			for i, to := range []ib.QPState{ib.Init, ib.RTR, ib.RTS} {
				attr := steps[i]
				attr.State = to
				req, _, _ := ib.Transition(c.typ, from, to)
				if err := r.call(proto.OpModifyQP, &proto.ModifyQPReq{QP: qp.QP, Mask: ib.AttrState | req, Attr: attr}, nil); err != nil {
					t.Fatalf("to %v: %v", to, err)
				}
				from = to
			}
			cring, err := shmring.Map(cfds[0], shmring.Geometry{SlotSize: proto.CQESize, Slots: int(cq.Slots)})
			if err != nil {
				t.Fatal(err)
			}
			defer cring.Close()
			sring, err := shmring.Map(qfds[0], shmring.Geometry{SlotSize: proto.SendSlotSize(qp.Caps), Slots: int(qp.SQSlots)})
			if err != nil {
				t.Fatal(err)
			}
			defer sring.Close()
			sq, cons := sring.Producer(db), cring.Consumer()
			// A good WR, the bad one, another good one: an 8-byte SEND
			// (UD) or WRITE (RC, UC) from the MR.
			wr := func(id uint64, bad func([]byte)) {
				s := sq.Reserve()
				if s == nil {
					t.Fatal("SQ ring full")
				}
				clear(s)
				le.PutUint64(s, id)
				s[8], s[9], s[10] = byte(ib.Send), byte(ib.Signaled), 1
				if c.typ != ib.UD {
					s[8] = byte(ib.RDMAWrite)
					le.PutUint64(s[16:], raddr)
					le.PutUint32(s[24:], rkey)
				} else {
					le.PutUint32(s[32:], dest)
					le.PutUint32(s[36:], 0x11)
					le.PutUint32(s[40:], uint32(ah.Handle))
				}
				for i := 0; i < 4 && 64+16*(i+1) <= len(s); i++ {
					le.PutUint64(s[64+16*i:], 0x100000)
					le.PutUint32(s[64+16*i+8:], 8)
					le.PutUint32(s[64+16*i+12:], mr.LKey)
				}
				if bad != nil {
					bad(s)
				}
			}
			wr(1, nil)
			wr(2, c.fill)
			wr(3, nil)
			if _, err := sq.Commit(); err != nil {
				t.Fatal(err)
			}
			var wcs []ib.WC
			eventually(t, "three completions", func() bool {
				for slot := cons.Peek(); slot != nil; slot = cons.Peek() {
					var wc ib.WC
					proto.GetWC(slot, &wc)
					cons.Release()
					wcs = append(wcs, wc)
				}
				return len(wcs) >= 3
			})
			if wcs[0].ID != 1 || wcs[0].Status != ib.Success {
				t.Errorf("the WR before the bad one: %+v", wcs[0])
			}
			if wcs[1].ID != 2 || wcs[1].Status == ib.Success || wcs[1].Status == ib.WRFlushErr {
				t.Errorf("the bad WR: %+v", wcs[1])
			}
			if wcs[2].ID != 3 || wcs[2].Status != ib.WRFlushErr {
				t.Errorf("the WR after it: %+v", wcs[2])
			}
			want := ib.SQE
			if c.typ == ib.RC {
				want = ib.Err
			}
			var got ib.QPAttr
			eventually(t, "QP state", func() bool {
				return r.call(proto.OpQueryQP, &proto.HandleMsg{Handle: qp.QP}, &got) == nil && got.State == want
			})
			if srv.BadWQEs.Load() == bad0 {
				t.Error("bad WQE not counted")
			}
		})
	}
}

// openRawDoorbell is openRaw keeping the doorbell OPEN returns, so that the
// rings written raw wake the daemon's engine.
func openRawDoorbell(t *testing.T, path string) (*rawClient, *shmring.Doorbell) {
	t.Helper()
	r, err := dialRaw(t, path)
	if err != nil {
		t.Fatal(err)
	}
	fds, err := r.callFDs(proto.OpOpen, &proto.OpenReq{Version: proto.Version}, nil)
	if err != nil || len(fds) != 1 {
		t.Fatalf("OPEN: %v, %d fds", err, len(fds))
	}
	db := shmring.DoorbellFD(fds[0])
	t.Cleanup(func() { db.Close() })
	return r, db
}

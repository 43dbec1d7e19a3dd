package cm

import (
	"bytes"
	"testing"

	"github.com/softrnic/softrnic/clock"
)

// The kernel's CM (over rxe) is the reference: our passive side, fed the
// capture's REQ, RTU and DREQ, must answer with the REP and DREP the kernel
// answered, except for what is ours to choose (comm ID, QPN, PSN, CA GUID);
// our active side, given the capture's parameters, must send the capture's
// REQ and RTU.

const (
	ourGUID = 0x0200_00ff_fe00_0001
	ourQPN  = 0x000123
	ourPSN  = 0xABCDEF
)

func one[T any](t *testing.T, what string, s []T) T {
	t.Helper()
	if len(s) != 1 {
		t.Fatalf("%s: got %d, want 1", what, len(s))
	}
	return s[0]
}

// patchComm rewrites the comm ID at offset off of a captured message's
// data to ours.
func patchComm(m MAD, off int, id ConnID) MAD {
	out := append(MAD(nil), m...)
	d := out.Data()
	d[off], d[off+1], d[off+2], d[off+3] = byte(id>>24), byte(id>>16), byte(id>>8), byte(id)
	return out
}

func TestPassiveSideReplaysCaptures(t *testing.T) {
	for _, c := range captures {
		t.Run(c.file, func(t *testing.T) {
			mads := readCMMADs(t, c.file)
			for i, req := range mads {
				if req.MAD.AttrID() != AttrREQ {
					continue
				}
				replayPassive(t, mads, i)
			}
		})
	}
}

func replayPassive(t *testing.T, mads []capturedMAD, reqIdx int) {
	now := clock.Time(0)
	m := New(Config{CAGUID: ourGUID, Seed: 1})
	reqCap := mads[reqIdx]
	var req REQ
	req.Decode(reqCap.MAD.Data())
	if err := m.Listen(req.ServiceID, ListenOptions{RDMACM: true, Addr: reqCap.Dst}); err != nil {
		t.Fatal(err)
	}
	if err := m.HandleMAD(now, reqCap.Src, reqCap.MAD); err != nil {
		t.Fatal(err)
	}
	evs, sends := m.Drain()
	if len(sends) != 0 {
		t.Fatalf("sent %d MADs before the application accepted", len(sends))
	}
	ev := one(t, "events after REQ", evs)
	if ev.Kind != EventConnRequest || !ev.HasCMA || ev.CMA.Src != reqCap.Src || ev.CMA.Dst != reqCap.Dst ||
		ev.Peer != reqCap.Src || ev.ServiceID != req.ServiceID {
		t.Fatalf("REQ event %+v", ev)
	}
	// Attributes straight from the REQ; we send from its Starting PSN and
	// choose the one we receive from in Accept.
	if q := ev.QP; q.RemoteQPN != req.LocalQPN || q.SQPSN != req.StartingPSN || q.RQPSN != 0 || q.PathMTU != 3 ||
		q.Timeout != 19 || q.RetryCount != 7 || q.RNRRetry != 7 || q.PKey != 0xFFFF || q.HopLimit != 64 {
		t.Fatalf("RTR attributes %+v", q)
	}
	id := ev.ID

	// The REP the kernel sent, and ours.
	var repCap capturedMAD
	for _, x := range mads[reqIdx+1:] {
		if x.MAD.AttrID() == AttrREP {
			repCap = x
			break
		}
	}
	var want REP
	want.Decode(repCap.MAD.Data())
	err := m.Accept(now, id, &AcceptParams{QPN: ourQPN, StartingPSN: ourPSN,
		ResponderResources: want.ResponderResources, InitiatorDepth: want.InitiatorDepth, RNRRetry: 7})
	if err != nil {
		t.Fatal(err)
	}
	evs, sends = m.Drain()
	s := one(t, "sends after Accept", sends)
	if len(evs) != 0 || s.To != reqCap.Src {
		t.Fatalf("Accept: %d events, REP to %v", len(evs), s.To)
	}
	got := MAD(s.MAD[:])
	if got.Header() != repCap.MAD.Header() {
		t.Fatalf("REP header %+v, capture %+v", got.Header(), repCap.MAD.Header())
	}
	var rep REP
	rep.Decode(got.Data())
	if rep.LocalCommID != uint32(id) || rep.LocalQPN != ourQPN || rep.StartingPSN != ourPSN || rep.LocalCAGUID != ourGUID {
		t.Fatalf("REP does not carry our IDs: %+v", rep)
	}
	// With ours swapped for the kernel's, the REPs are byte-identical.
	rep.LocalCommID, rep.LocalQPN, rep.StartingPSN, rep.LocalCAGUID = want.LocalCommID, want.LocalQPN, want.StartingPSN, want.LocalCAGUID
	var enc [DataSize]byte
	rep.Encode(enc[:])
	if !bytes.Equal(enc[:], repCap.MAD.Data()) {
		t.Fatalf("REP differs from the kernel's:\n got %x\nwant %x", enc, repCap.MAD.Data())
	}

	// The capture's RTU, addressed to our comm ID.
	var rtuCap capturedMAD
	for _, x := range mads[reqIdx+1:] {
		if x.MAD.AttrID() == AttrRTU {
			rtuCap = x
			break
		}
	}
	now += clock.Time(5_000_000)
	if err := m.HandleMAD(now, rtuCap.Src, patchComm(rtuCap.MAD, 4, id)); err != nil {
		t.Fatal(err)
	}
	evs, sends = m.Drain()
	ev = one(t, "events after RTU", evs)
	if ev.Kind != EventEstablished || len(sends) != 0 || m.State(id) != StateEstablished {
		t.Fatalf("after RTU: %+v, %d sends, state %v", ev, len(sends), m.State(id))
	}
	if q := ev.QP; q.QPN != ourQPN || q.RQPSN != ourPSN || q.RemoteQPN != req.LocalQPN || q.SQPSN != req.StartingPSN ||
		q.MaxDestRdAtomic != want.ResponderResources || q.MaxRdAtomic != want.InitiatorDepth {
		t.Fatalf("RTS attributes %+v", q)
	}

	// Teardown: the DREQ that names this connection.
	for i, x := range mads {
		if x.MAD.AttrID() != AttrDREQ {
			continue
		}
		var dq DREQ
		dq.Decode(x.MAD.Data())
		now += clock.Time(50_000_000)
		switch {
		case dq.RemoteCommID == want.LocalCommID: // from the active side to us
			in := patchComm(x.MAD, 4, id)
			put24(MAD(in).Data(), 8, ourQPN)
			if err := m.HandleMAD(now, x.Src, in); err != nil {
				t.Fatal(err)
			}
			evs, sends = m.Drain()
			ev = one(t, "events after DREQ", evs)
			s = one(t, "sends after DREQ", sends)
			if ev.Kind != EventDisconnectRequest || m.State(id) != StateTimeWait {
				t.Fatalf("after DREQ: %+v, state %v", ev, m.State(id))
			}
			drepCap := mads[i+1]
			got := patchComm(MAD(s.MAD[:]), 0, ConnID(want.LocalCommID))
			if s.To != x.Src || !bytes.Equal(got, drepCap.MAD) {
				t.Fatalf("DREP differs from the kernel's:\n got %x\nwant %x", got, drepCap.MAD)
			}
		case dq.LocalCommID == want.LocalCommID: // the passive side (us) disconnects
			if err := m.Disconnect(now, id, nil); err != nil {
				t.Fatal(err)
			}
			_, sends = m.Drain()
			s = one(t, "sends after Disconnect", sends)
			var ours DREQ
			ours.Decode(MAD(s.MAD[:]).Data())
			if ours.LocalCommID != uint32(id) || ours.RemoteCommID != dq.RemoteCommID || ours.RemoteQPN != dq.RemoteQPN {
				t.Fatalf("our DREQ %+v, kernel's %+v", ours, dq)
			}
			drep := patchComm(mads[i+1].MAD, 4, id)
			copy(MAD(drep)[8:16], MAD(s.MAD[:])[8:16]) // the DREP answers our TID
			if err := m.HandleMAD(now, x.Dst, drep); err != nil {
				t.Fatal(err)
			}
			evs, _ = m.Drain()
			if ev = one(t, "events after DREP", evs); ev.Kind != EventDisconnected || m.State(id) != StateTimeWait {
				t.Fatalf("after DREP: %+v, state %v", ev, m.State(id))
			}
		default:
			continue
		}
		// Time-wait holds the comm ID, then releases it.
		dl := m.NextDeadline()
		m.Tick(dl - 1)
		if m.State(id) != StateTimeWait {
			t.Fatal("time-wait ended early")
		}
		m.Tick(dl)
		evs, _ = m.Drain()
		if ev = one(t, "events at time-wait end", evs); ev.Kind != EventTimeWaitExit || m.State(id) != StateIdle || m.Conns() != 0 {
			t.Fatalf("time-wait exit: %+v, state %v, %d conns", ev, m.State(id), m.Conns())
		}
		return
	}
	t.Fatal("no DREQ for the connection in the capture")
}

func TestActiveSideReplaysCaptures(t *testing.T) {
	for _, c := range captures {
		t.Run(c.file, func(t *testing.T) {
			mads := readCMMADs(t, c.file)
			reqCap, repCap, rtuCap := mads[0], mads[1], mads[2]
			var want REQ
			want.Decode(reqCap.MAD.Data())
			h, _ := DecodeCMAHeader(want.PrivateData[:])
			m := New(Config{CAGUID: want.LocalCAGUID, Seed: 2})
			now := clock.Time(1000)
			id, err := m.Connect(now, &ConnectParams{
				Peer: reqCap.Dst, Local: reqCap.Src, ServiceID: want.ServiceID,
				QPN: want.LocalQPN, StartingPSN: want.StartingPSN, PathMTU: want.PathMTU,
				ResponderResources: want.ResponderResources, InitiatorDepth: want.InitiatorDepth,
				RetryCount: 7, RNRRetry: 7, FlowLabel: want.Primary.FlowLabel,
				RDMACM: true, SrcPort: h.SrcPort,
			})
			if err != nil {
				t.Fatal(err)
			}
			_, sends := m.Drain()
			s := one(t, "sends after Connect", sends)
			got := patchComm(MAD(s.MAD[:]), 0, ConnID(want.LocalCommID))
			copy(got[8:16], reqCap.MAD[8:16]) // TIDs are each side's own
			if s.To != reqCap.Dst || !bytes.Equal(got, reqCap.MAD) {
				t.Fatalf("REQ differs from the kernel's:\n got %x\nwant %x", got, reqCap.MAD)
			}
			tid := MAD(s.MAD[:]).TID()
			rep := patchComm(repCap.MAD, 4, id)
			copy(MAD(rep)[8:16], MAD(s.MAD[:])[8:16])
			if err := m.HandleMAD(now+1e6, repCap.Src, rep); err != nil {
				t.Fatal(err)
			}
			evs, sends := m.Drain()
			ev := one(t, "events after REP", evs)
			var r REP
			r.Decode(repCap.MAD.Data())
			// We send from the REP's Starting PSN, receive from our REQ's.
			if q := ev.QP; ev.Kind != EventEstablished || q.RemoteQPN != r.LocalQPN || q.SQPSN != r.StartingPSN ||
				q.RQPSN != want.StartingPSN || q.QPN != want.LocalQPN || q.PathMTU != 3 || q.RNRRetry != 7 {
				t.Fatalf("after REP: %+v", ev)
			}
			// Kernel rule: ack timeout from the REP's target ACK delay (15)
			// and twice the path's life time (18, so 2^19): the delay is
			// not within a factor two of the round trip, so 19.
			if ev.QP.Timeout != 19 {
				t.Errorf("local ACK timeout %d, want 19", ev.QP.Timeout)
			}
			s = one(t, "sends after REP", sends)
			gotRTU := patchComm(MAD(s.MAD[:]), 0, ConnID(want.LocalCommID))
			copy(gotRTU[8:16], rtuCap.MAD[8:16])
			if MAD(s.MAD[:]).TID() != tid || !bytes.Equal(gotRTU, rtuCap.MAD) {
				t.Fatalf("RTU differs from the kernel's:\n got %x\nwant %x", gotRTU, rtuCap.MAD)
			}
		})
	}
}

package cm

import "testing"

// TestCapturesSendFromPeersStartingPSN pins the Linux rule this package
// follows on the real rxe captures: on every RC connection, each side's
// first request packet carries the Starting PSN of the PEER's CM message
// (the active side sends from the REP's, the passive side from the
// REQ's). A Starting PSN is thus the PSN its sender expects to receive:
// the kernel's CM keeps its own REQ's or REP's as rq_psn and the peer's
// as sq_psn (cm.c: ib_send_cm_req, cm_req_handler, ib_send_cm_rep,
// cm_rep_handler, cm_init_qp_rtr_attr/cm_init_qp_rts_attr).
func TestCapturesSendFromPeersStartingPSN(t *testing.T) {
	for _, c := range captures {
		t.Run(c.file, func(t *testing.T) {
			conns := readConns(t, c.file)
			if len(conns) == 0 {
				t.Fatal("no connection in the capture")
			}
			passive := 0
			for i, k := range conns {
				// The rule only tells the two readings apart when the
				// Starting PSNs differ.
				if k.REQ.StartingPSN == k.REP.StartingPSN {
					t.Fatalf("conn %d: REQ and REP carry the same Starting PSN %#x", i, k.REQ.StartingPSN)
				}
				if !k.ActiveSent {
					t.Fatalf("conn %d: the active side sent no request", i)
				}
				if k.ActiveFirst != k.REP.StartingPSN {
					t.Errorf("conn %d: active side's first PSN %#x, REP's Starting PSN %#x (REQ's %#x)",
						i, k.ActiveFirst, k.REP.StartingPSN, k.REQ.StartingPSN)
				}
				if !k.PassiveSent {
					continue // e.g. ib_write_bw's test QP: the server only ACKs
				}
				passive++
				if k.PassiveFirst != k.REQ.StartingPSN {
					t.Errorf("conn %d: passive side's first PSN %#x, REQ's Starting PSN %#x (REP's %#x)",
						i, k.PassiveFirst, k.REQ.StartingPSN, k.REP.StartingPSN)
				}
			}
			if passive == 0 {
				t.Fatal("no connection on which the passive side sent a request")
			}
		})
	}
}

// TestReplayedQPAttrPSNsMatchCaptures: the Manager, standing in for either
// side of each captured connection, hands the QP owner the PSNs the
// kernel's QP used on the wire: SQPSN is what that side's first request
// carried, RQPSN what the peer's first request carried.
func TestReplayedQPAttrPSNsMatchCaptures(t *testing.T) {
	for _, c := range captures {
		t.Run(c.file, func(t *testing.T) {
			conns := readConns(t, c.file)
			mads := readCMMADs(t, c.file)
			k := conns[0]
			if !k.ActiveSent || !k.PassiveSent {
				t.Fatal("the first connection lacks a request from each side")
			}
			// Passive: fed the capture's REQ, accepting with the REP's
			// Starting PSN.
			m := New(Config{CAGUID: ourGUID, Seed: 3})
			req := mads[0]
			if err := m.Listen(k.REQ.ServiceID, ListenOptions{RDMACM: true}); err != nil {
				t.Fatal(err)
			}
			if err := m.HandleMAD(0, req.Src, req.MAD); err != nil {
				t.Fatal(err)
			}
			evs, _ := m.Drain()
			ev := one(t, "events after REQ", evs)
			if ev.QP.SQPSN != k.PassiveFirst {
				t.Errorf("passive: SQPSN %#x in the REQ event, the kernel sent from %#x", ev.QP.SQPSN, k.PassiveFirst)
			}
			if err := m.Accept(0, ev.ID, &AcceptParams{QPN: k.REP.LocalQPN, StartingPSN: k.REP.StartingPSN}); err != nil {
				t.Fatal(err)
			}
			_, sends := m.Drain()
			sent := one(t, "sends after Accept", sends)
			var rep REP
			rep.Decode(MAD(sent.MAD[:]).Data())
			if rep.StartingPSN != k.REP.StartingPSN {
				t.Errorf("passive: REP Starting PSN %#x, want %#x", rep.StartingPSN, k.REP.StartingPSN)
			}
			rtu := mads[2]
			if rtu.MAD.AttrID() != AttrRTU {
				t.Fatalf("third MAD is %v", rtu.MAD.AttrID())
			}
			if err := m.HandleMAD(1e6, rtu.Src, patchComm(rtu.MAD, 4, ev.ID)); err != nil {
				t.Fatal(err)
			}
			evs, _ = m.Drain()
			if q := one(t, "events after RTU", evs).QP; q.SQPSN != k.PassiveFirst || q.RQPSN != k.ActiveFirst {
				t.Errorf("passive: SQPSN %#x RQPSN %#x, the wire had %#x from us and %#x from the peer",
					q.SQPSN, q.RQPSN, k.PassiveFirst, k.ActiveFirst)
			}

			// Active: connecting with the REQ's Starting PSN, fed the REP.
			h, _ := DecodeCMAHeader(k.REQ.PrivateData[:])
			a := New(Config{CAGUID: k.REQ.LocalCAGUID, Seed: 4})
			id, err := a.Connect(0, &ConnectParams{Peer: req.Dst, Local: req.Src, ServiceID: k.REQ.ServiceID,
				QPN: k.REQ.LocalQPN, StartingPSN: k.REQ.StartingPSN, PathMTU: k.REQ.PathMTU,
				RDMACM: true, SrcPort: h.SrcPort})
			if err != nil {
				t.Fatal(err)
			}
			_, sends = a.Drain()
			s := one(t, "sends after Connect", sends)
			var ours REQ
			ours.Decode(MAD(s.MAD[:]).Data())
			if ours.StartingPSN != k.REQ.StartingPSN {
				t.Errorf("active: REQ Starting PSN %#x, want %#x", ours.StartingPSN, k.REQ.StartingPSN)
			}
			in := patchComm(mads[1].MAD, 4, id)
			copy(MAD(in)[8:16], MAD(s.MAD[:])[8:16])
			if err := a.HandleMAD(1e6, mads[1].Src, in); err != nil {
				t.Fatal(err)
			}
			evs, _ = a.Drain()
			ev = one(t, "events after REP", evs)
			if q := ev.QP; ev.Kind != EventEstablished || q.SQPSN != k.ActiveFirst || q.RQPSN != k.PassiveFirst {
				t.Errorf("active: %v SQPSN %#x RQPSN %#x, the wire had %#x from us and %#x from the peer",
					ev.Kind, q.SQPSN, q.RQPSN, k.ActiveFirst, k.PassiveFirst)
			}
		})
	}
}

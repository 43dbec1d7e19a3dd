package main

import (
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/daemon/proto"
	"github.com/softrnic/softrnic/frame"
	"github.com/softrnic/softrnic/host"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/ibtest"
	"github.com/softrnic/softrnic/internal/netnstest"
	"github.com/softrnic/softrnic/port"
	"github.com/softrnic/softrnic/verbs"
)

// ceMarker stands in for a congested switch next to the peer: it marks CE
// every ECN-capable frame the peer receives (the daemon's data) and sends
// (the peer's own requests).
type ceMarker struct {
	port.Port
	marked atomic.Uint64
}

func (p *ceMarker) Submit(frames [][]byte) (int, error) {
	for _, f := range frames {
		if len(f) > 0 && frame.MarkCE(f) {
			p.marked.Add(1)
		}
	}
	return p.Port.Submit(frames)
}

func (p *ceMarker) Recv(frames [][]byte, timeout time.Duration) (int, error) {
	n, err := p.Port.Recv(frames, timeout)
	for _, f := range frames[:n] {
		if frame.MarkCE(f) {
			p.marked.Add(1)
		}
	}
	return n, err
}

// TestDaemonDCQCNOverVeth: the daemon's dcqcn.profile reaches its device.
// A client of the daemon (AF_XDP on a veth in namespace A) and a peer RNIC
// in namespace B WRITE to each other at once, and every frame between them
// is marked CE next to the peer. The daemon's QP reacts to the CNPs the
// peer's NP sends (rp_cnp_handled counted, its rate cut), and the daemon's
// own NP sends CNPs for the CE-marked requests it receives (np_cnp_sent),
// which the peer acts on in turn.
func TestDaemonDCQCNOverVeth(t *testing.T) {
	netnstest.SkipUnlessRoot(t)
	bin := buildSoftrnic(t)
	pair := netnstest.NewTestPair(t, netnstest.PairOptions{})
	sock, _ := startDaemon(t, bin, pair.A, "--dcqcn.profile", "paper")
	c, err := client.Dial(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	cc, err := host.Congestion(host.CC{Algorithm: "dcqcn", Profile: "paper"})
	if err != nil {
		t.Fatal(err)
	}
	var marker *ceMarker
	var peer *host.Host
	if err := pair.B.NS.Do(func() (err error) {
		peer, err = host.Open(host.Config{Interface: pair.B.Name, GIDs: []netip.Addr{pair.B.Addr}, MTU: 1024,
			Port: host.AFPacket, Congestion: cc, NoCM: true,
			WrapPort: func(p port.Port) port.Port { marker = &ceMarker{Port: p}; return marker }})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { peer.Close() })

	const size, depth = 16 << 10, 8
	caps := ib.QPCaps{MaxSendWR: 2 * depth, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}
	type side struct {
		mem verbs.Mem
		mr  verbs.MR
		cq  verbs.CQ
		qp  verbs.QP
	}
	mk := func(dev verbs.Device) *side {
		s := &side{}
		pd, err := dev.AllocPD()
		if err != nil {
			t.Fatal(err)
		}
		if s.mem, err = dev.AllocMem(2 * size * depth); err != nil {
			t.Fatal(err)
		}
		if s.mr, err = pd.RegMR(s.mem, 0, 2*size*depth, 0, ib.LocalWrite|ib.RemoteWrite); err != nil {
			t.Fatal(err)
		}
		if s.cq, err = dev.CreateCQ(4 * depth); err != nil {
			t.Fatal(err)
		}
		if s.qp, err = pd.CreateQP(&verbs.QPInitAttr{Type: ib.RC, SendCQ: s.cq, RecvCQ: s.cq, Cap: caps}); err != nil {
			t.Fatal(err)
		}
		return s
	}
	a, b := mk(c), mk(peer.Device)
	for _, p := range []struct {
		s, peer *side
		gid     netip.Addr
	}{{a, b, pair.B.Addr}, {b, a, pair.A.Addr}} {
		for _, st := range []struct {
			to ib.QPState
			a  ib.QPAttr
		}{
			{ib.Init, ib.QPAttr{Access: ib.RemoteWrite}},
			{ib.RTR, ib.QPAttr{PathMTU: 1024, DestQPN: p.peer.qp.QPN(), AV: ib.AddressVector{DGID: ib.GIDFrom(p.gid)}}},
			{ib.RTS, ib.QPAttr{Timeout: 14, RetryCnt: 7, RNRRetry: 7}},
		} {
			if err := ibtest.Modify(p.s.qp, st.to, &st.a); err != nil {
				t.Fatalf("QP to %v: %v", st.to, err)
			}
		}
	}

	// Both stream WRITEs into the other's memory, depth outstanding each,
	// until the daemon has counted what the test is about.
	pump := func(s, to *side, inflight *int, wcs []ib.WC) {
		for _, wc := range wcs[:s.cq.Poll(wcs)] {
			if wc.Status != ib.Success {
				t.Fatalf("WRITE completion %+v", wc)
			}
			*inflight--
		}
		for ; *inflight < depth; *inflight++ {
			if _, err := s.qp.PostSend([]verbs.SendWR{{Opcode: ib.RDMAWrite, Flags: ib.Signaled,
				SG:         []ib.SGE{{Addr: s.mr.IOVA(), Length: size, LKey: s.mr.LKey()}},
				RemoteAddr: to.mr.IOVA() + size, RKey: to.mr.RKey()}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	var st *statsReport
	var qps proto.QPStats
	ina, inb := 0, 0
	wcs := make([]ib.WC, 2*depth)
	done := func() bool {
		v := &st.Values
		return v[proto.CtrRpCNPHandled] > 0 && v[proto.CtrNpCNPSent] > 0 && qps.Values[proto.QCtrDCQCNRateCuts] > 0
	}
	for deadline, next := time.Now().Add(30*time.Second), time.Now(); st == nil || !done(); {
		pump(a, b, &ina, wcs)
		pump(b, a, &inb, wcs)
		if time.Now().After(next) {
			if st, err = queryStats(sock, int(a.qp.QPN())); err != nil {
				t.Fatal(err)
			}
			if len(st.QPs) != 1 {
				t.Fatalf("stats list %d QPs for QPN %#x", len(st.QPs), a.qp.QPN())
			}
			qps = st.QPs[0]
			next = time.Now().Add(50 * time.Millisecond)
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 30 s of CE-marked WRITEs both ways: daemon np_ecn_marked %d np_cnp_sent %d rp_cnp_handled %d rp_cnp_ignored %d, QP %v; %d frames marked",
				st.Values[proto.CtrNpECNMarkedRoCEPackets], st.Values[proto.CtrNpCNPSent], st.Values[proto.CtrRpCNPHandled],
				st.Values[proto.CtrRpCNPIgnored], qps.Values, marker.marked.Load())
		}
		time.Sleep(time.Millisecond)
	}
	v, q := &st.Values, &qps.Values
	if qps.Valid&(1<<proto.QCtrDCQCNRateCuts) == 0 || q[proto.QCtrDCQCNCNPHandled] == 0 || q[proto.QCtrDCQCNCNPSent] == 0 ||
		v[proto.CtrNpECNMarkedRoCEPackets] == 0 {
		t.Fatalf("daemon QP's DCQCN counters %v (valid %#x), device np_ecn_marked %d", *q, qps.Valid, v[proto.CtrNpECNMarkedRoCEPackets])
	}
	// The peer acted on the daemon's CNPs, and sent the ones the daemon
	// acted on.
	ps := peer.Loop.DeviceStats()
	if ps.RPCNPHandled == 0 || ps.NPCNPSent == 0 {
		t.Fatalf("peer: np_cnp_sent %d rp_cnp_handled %d", ps.NPCNPSent, ps.RPCNPHandled)
	}
	t.Logf("daemon: np_ecn_marked_roce_packets %d np_cnp_sent %d rp_cnp_handled %d rp_cnp_ignored %d; its QP: cnp_handled %d rate_cuts %d cnp_sent %d; peer: np_cnp_sent %d rp_cnp_handled %d; %d frames marked CE",
		v[proto.CtrNpECNMarkedRoCEPackets], v[proto.CtrNpCNPSent], v[proto.CtrRpCNPHandled], v[proto.CtrRpCNPIgnored],
		q[proto.QCtrDCQCNCNPHandled], q[proto.QCtrDCQCNRateCuts], q[proto.QCtrDCQCNCNPSent], ps.NPCNPSent, ps.RPCNPHandled, marker.marked.Load())
}

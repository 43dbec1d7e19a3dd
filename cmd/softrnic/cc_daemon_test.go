package main

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/congestion/dcqcn"
	"github.com/softrnic/softrnic/daemon"
	"github.com/softrnic/softrnic/daemon/proto"
	"github.com/softrnic/softrnic/host"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/ibtest"
	"github.com/softrnic/softrnic/internal/netnstest"
	"github.com/softrnic/softrnic/verbs"
)

// TestDaemonSwiftOverVeth: the daemon's cc and cc-scale keys reach its
// device. A client of the daemon (AF_XDP on a veth in namespace A) WRITEs
// to a peer RNIC in namespace B; the daemon's QP runs Swift, takes RTT
// samples from the peer's ACKs, and softrnic stats shows the device's
// cc_rtt_samples and the QP's Swift figures (window, cwnd, SRTT, target),
// but no DCQCN counters.
func TestDaemonSwiftOverVeth(t *testing.T) {
	netnstest.SkipUnlessRoot(t)
	bin := buildSoftrnic(t)
	pair := netnstest.NewTestPair(t, netnstest.PairOptions{})
	sock, _ := startDaemon(t, bin, pair.A, "--cc", "swift", "--cc-scale", "400")
	c, err := client.Dial(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cc, err := host.Congestion(host.CC{Algorithm: "swift", Scale: 400})
	if err != nil {
		t.Fatal(err)
	}
	var peer *host.Host
	if err := pair.B.NS.Do(func() (err error) {
		peer, err = host.Open(host.Config{Interface: pair.B.Name, GIDs: []netip.Addr{pair.B.Addr}, MTU: 1024,
			Port: host.AFPacket, Congestion: cc, NoCM: true})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { peer.Close() })

	const size, depth = 16 << 10, 8
	caps := ib.QPCaps{MaxSendWR: 2 * depth, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}
	type side struct {
		mr verbs.MR
		cq verbs.CQ
		qp verbs.QP
	}
	mk := func(dev verbs.Device) *side {
		s := &side{}
		pd, err := dev.AllocPD()
		if err != nil {
			t.Fatal(err)
		}
		mem, err := dev.AllocMem(size)
		if err != nil {
			t.Fatal(err)
		}
		if s.mr, err = pd.RegMR(mem, 0, size, 0, ib.LocalWrite|ib.RemoteWrite); err != nil {
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
			{ib.RTS, ib.QPAttr{Timeout: 18, RetryCnt: 7, RNRRetry: 7}},
		} {
			if err := ibtest.Modify(p.s.qp, st.to, &st.a); err != nil {
				t.Fatalf("QP to %v: %v", st.to, err)
			}
		}
	}
	var st *statsReport
	var q proto.QPStats
	inflight := 0
	wcs := make([]ib.WC, 2*depth)
	for deadline, next := time.Now().Add(30*time.Second), time.Now(); ; time.Sleep(time.Millisecond) {
		for _, wc := range wcs[:a.cq.Poll(wcs)] {
			if wc.Status != ib.Success {
				t.Fatalf("WRITE completion %+v", wc)
			}
			inflight--
		}
		for ; inflight < depth; inflight++ {
			if _, err := a.qp.PostSend([]verbs.SendWR{{Opcode: ib.RDMAWrite, Flags: ib.Signaled,
				SG: []ib.SGE{{Addr: a.mr.IOVA(), Length: size, LKey: a.mr.LKey()}}, RemoteAddr: b.mr.IOVA(), RKey: b.mr.RKey()}}); err != nil {
				t.Fatal(err)
			}
		}
		if time.Now().Before(next) {
			continue
		}
		if st, err = queryStats(sock, int(a.qp.QPN())); err != nil {
			t.Fatal(err)
		}
		if len(st.QPs) != 1 {
			t.Fatalf("stats list %d QPs for QPN %#x", len(st.QPs), a.qp.QPN())
		}
		q = st.QPs[0]
		if st.Values[proto.CtrCCRTTSamples] >= 100 && q.Values[proto.QCtrCCRTTSamples] >= 100 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 30 s of WRITEs: device cc_rtt_samples %d, QP %v", st.Values[proto.CtrCCRTTSamples], q.Values)
		}
		next = time.Now().Add(50 * time.Millisecond)
	}
	v := &q.Values
	valid := func(i int) bool { return q.Valid&(1<<i) != 0 }
	t.Logf("daemon: cc_rtt_samples %d cc_decreases %d cc_window_full %d; QP rate %d kb/s window %d B cwnd %.3f srtt %d ns target %d ns",
		st.Values[proto.CtrCCRTTSamples], st.Values[proto.CtrCCDecreases], st.Values[proto.CtrCCWindowFull],
		v[proto.QCtrCCRateKbps], v[proto.QCtrCCWindowBytes], float64(v[proto.QCtrCCCwndMilli])/1000, v[proto.QCtrCCSRTTNs], v[proto.QCtrCCTargetNs])
	if !valid(proto.QCtrCCCwndMilli) || !valid(proto.QCtrCCWindowBytes) || v[proto.QCtrCCWindowBytes] == 0 || v[proto.QCtrCCSRTTNs] == 0 ||
		v[proto.QCtrCCTargetNs] < uint64(time.Millisecond) || v[proto.QCtrCCRateKbps] == 0 || v[proto.QCtrCCRateKbps] > 100_000 {
		t.Fatalf("the daemon QP's Swift figures %v (valid %#x): want a window, an SRTT, a dilated target of milliseconds, a rate ≤ 100 Mb/s", *v, q.Valid)
	}
	if valid(proto.QCtrDCQCNRateCuts) || st.Values[proto.CtrNpCNPSent] != 0 {
		t.Fatalf("DCQCN counters on a Swift device: QP valid %#x, np_cnp_sent %d", q.Valid, st.Values[proto.CtrNpCNPSent])
	}
}

// daemonCongestion carries dcqcn.host_cc to the device's congestion
// control beside the profile, as the tools' --host-cc does.
func TestDaemonCongestionHostCC(t *testing.T) {
	cfg := daemon.DefaultConfig()
	if err := cfg.ParseFile("x.conf", strings.NewReader("interface = v0\n[dcqcn]\nprofile = paper\nhost_cc = fill=1,hold=1ms\n")); err != nil {
		t.Fatal(err)
	}
	cc, err := daemonCongestion(&cfg)
	want := dcqcn.HostCCConfig{FillLow: 1, Hold: time.Millisecond}
	if err != nil || cc.Algorithm != "dcqcn" || cc.Profile != "paper" || cc.HostCC != want {
		t.Fatalf("%s %s host %+v, %v; want dcqcn paper %+v", cc.Algorithm, cc.Profile, cc.HostCC, err, want)
	}
}

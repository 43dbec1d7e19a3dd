package rnic

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"math"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/congestion"
	"github.com/softrnic/softrnic/frame"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/icrc"
	"github.com/softrnic/softrnic/internal/checker"
	"github.com/softrnic/softrnic/internal/ibtest"
	"github.com/softrnic/softrnic/verbs"
)

// connectXCNP is the ConnectX-4 Lx CNP of ../shared/vectors/README.md.
const connectXCNP = `e4 1d 2d ab 2b c2 7c fe 90 64 3b 32 08 00 45 c2 00 3c 71 8c 40 00 40 11 91 61 0a 00 11 01 0a 00
12 01 00 00 12 b7 00 28 00 00 81 00 ff ff 40 00 01 18 00 00 00 00 00 00 00 00 00 00 00 00 00 00
00 00 00 00 00 00 82 fd 00 2a`

func mustCC(t testing.TB, profile string, line congestion.Rate) Congestion {
	t.Helper()
	c, err := NewCongestion("dcqcn", profile, line, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// ccSolo is one device whose RC QP is connected to a peer that the test
// plays by hand: it builds the peer's frames and reads the device's.
type ccSolo struct {
	t        testing.TB
	dev      *Device
	qp       *QP
	mr       *MR
	peerMAC  [6]byte
	peerAddr netip.Addr
	peerQPN  uint32
	rqpsn    uint32 // next PSN the device expects from the peer
	out      [][]byte
}

func newCCSolo(t testing.TB, cong Congestion, mac [6]byte, addr netip.Addr, peerMAC [6]byte, peerAddr netip.Addr, peerQPN uint32, tclass uint8) *ccSolo {
	t.Helper()
	d, err := NewDevice(Config{MAC: mac, Addrs: []netip.Addr{addr}, PortMTU: 1024, Congestion: cong})
	if err != nil {
		t.Fatal(err)
	}
	pd := d.allocPD()
	q, err := pd.newQP(testQP{Type: ib.RC, SendCQ: d.newCQ(256), RecvCQ: d.newCQ(256), MaxSendWR: 64, MaxRecvWR: 64})
	if err != nil {
		t.Fatal(err)
	}
	mr, err := pd.RegBytes(make([]byte, 1<<16), 0, ib.LocalWrite|ib.RemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	s := &ccSolo{t: t, dev: d, qp: q, mr: mr, peerMAC: peerMAC, peerAddr: peerAddr, peerQPN: peerQPN, rqpsn: 0x100}
	must(t, ibtest.Modify(q, ib.Init, &ib.QPAttr{Access: ib.RemoteWrite}))
	must(t, ibtest.Modify(q, ib.RTR, &ib.QPAttr{PathMTU: 1024, DestQPN: peerQPN, RQPSN: s.rqpsn, MaxDestRdAtomic: 1,
		AV: ib.AddressVector{DMAC: peerMAC, DGID: ib.GIDFrom(peerAddr), TrafficClass: tclass}}))
	// Timeout 0: no ACK timer, so the only deadlines are DCQCN's.
	must(t, ibtest.Modify(q, ib.RTS, &ib.QPAttr{SQPSN: 0x200, RetryCnt: 7, RNRRetry: 7}))
	s.out = make([][]byte, 16)
	for i := range s.out {
		s.out[i] = make([]byte, 2048)
	}
	return s
}

// spec is the peer's frame towards the device.
func (s *ccSolo) spec(tos uint8) frame.Spec {
	return frame.Spec{DstMAC: s.dev.cfg.MAC, SrcMAC: s.peerMAC, Src: s.peerAddr, Dst: s.dev.cfg.Addrs[0], TOS: tos,
		SrcPort: 0xC123, BTH: bth.BTHFields{PKey: 0xFFFF, DestQP: s.qp.QPN()}}
}

// write hands the device the peer's next RDMA WRITE ONLY of 64 bytes with
// the given TOS (ECN bits 3: CE).
func (s *ccSolo) write(now clock.Time, tos uint8) {
	sp := s.spec(tos)
	sp.BTH.Opcode, sp.BTH.PSN, sp.BTH.AckReq = bth.RCRDMAWriteOnly, bth.PSN(s.rqpsn), true
	sp.RETH = frame.RETHFields{VA: s.mr.IOVA(), RKey: s.mr.RKey(), DMALen: 64}
	buf := make([]byte, 256)
	n, err := frame.Build(buf, &sp, make([]byte, 64))
	if err != nil {
		s.t.Fatal(err)
	}
	s.rqpsn = (s.rqpsn + 1) & bth.PSNMask
	s.dev.Receive(now, [][]byte{buf[:n]})
}

// cnp hands the device a CNP from the peer.
func (s *ccSolo) cnp(now clock.Time) {
	sp := s.spec(0xC2)
	buf := make([]byte, 128)
	n, err := frame.BuildCNP(buf, &sp, s.qp.QPN())
	if err != nil {
		s.t.Fatal(err)
	}
	s.dev.Receive(now, [][]byte{buf[:n]})
}

// transmit runs Transmit at now and returns copies of the frames.
func (s *ccSolo) transmit(now clock.Time) [][]byte {
	for i := range s.out {
		s.out[i] = s.out[i][:cap(s.out[i])]
	}
	n := s.dev.Transmit(now, s.out)
	var got [][]byte
	for _, f := range s.out[:n] {
		got = append(got, append([]byte(nil), f...))
	}
	return got
}

// TestCNPMatchesConnectX: a CE-marked WRITE makes the device send one CNP
// (before the ACK) that equals frame.BuildCNP of its own fields, and that,
// built with the ConnectX vector's MACs, addresses, QPN and CNP DSCP, is
// the vector byte for byte once the two per-frame fields the vector does
// not share (the QP's UDP source port, the IPv4 ID) take the vector's
// values.
func TestCNPMatchesConnectX(t *testing.T) {
	vec, err := hex.DecodeString(strings.Join(strings.Fields(connectXCNP), ""))
	if err != nil {
		t.Fatal(err)
	}
	s := newCCSolo(t, mustCC(t, "paper", 0),
		[6]byte{0x7c, 0xfe, 0x90, 0x64, 0x3b, 0x32}, netip.MustParseAddr("10.0.17.1"),
		[6]byte{0xe4, 0x1d, 0x2d, 0xab, 0x2b, 0xc2}, netip.MustParseAddr("10.0.18.1"), 0x118, 0)
	s.write(0, 0x03)
	out := s.transmit(0)
	if len(out) != 2 {
		t.Fatalf("%d frames after one CE-marked WRITE, want CNP and ACK", len(out))
	}
	got := out[0]
	// The QP's UDP source port, the CNP DSCP (48) with ECN not-ECT.
	f := checker.Frame(t, got, checker.TrafficClass(0xC2), checker.UDPSrcPort(udpSport(0, s.qp.QPN(), 0x118)),
		checker.TransportIs(checker.Opcode(bth.CNP), checker.BECN(true), checker.DestQP(0x118), checker.PSN(0),
			checker.AckReq(false)))
	if b := f.BTH(); b.FECN() || b.PKey() != 0xFFFF || !bytes.Equal(f.CNPReserved(), make([]byte, 16)) {
		t.Fatalf("CNP fields wrong: %+v", b.Fields())
	}
	checker.Frame(t, out[1], checker.ECN(frame.ECT0), checker.TransportIs(checker.Opcode(bth.RCAcknowledge)))
	// The same fields through frame.BuildCNP.
	sp := frame.Spec{DstMAC: s.peerMAC, SrcMAC: s.dev.cfg.MAC, Src: s.dev.cfg.Addrs[0], Dst: s.peerAddr, TOS: 0xC2,
		TTL: 64, IPID: f.IPv4().ID(), SrcPort: f.UDP().SrcPort()}
	want := make([]byte, 128)
	n, err := frame.BuildCNP(want, &sp, 0x118)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want[:n]) {
		t.Fatalf("device CNP\n% x\nframe.BuildCNP\n% x", got, want[:n])
	}
	// The vector's source port and IP ID, checksum and ICRC recomputed.
	binary.BigEndian.PutUint16(got[frame.EthernetLen+20:], 0)
	binary.BigEndian.PutUint16(got[frame.EthernetLen+4:], 0x718c)
	ip := got[frame.EthernetLen : frame.EthernetLen+20]
	frame.IPv4(ip).SetChecksum()
	must(t, icrc.Stamp(got[frame.EthernetLen:]))
	if !bytes.Equal(got, vec) {
		t.Fatalf("device CNP\n% x\nConnectX-4 Lx\n% x", got, vec)
	}
	st := s.dev.Stats
	if st.NPECNMarkedRoCEPackets != 1 || st.NPCNPSent != 1 || st.RxCNP != 0 {
		t.Fatalf("counters %+v", st.CongestionStats)
	}
	if c := st.Counters(); c[0].Name != "np_ecn_marked_roce_packets" || c[0].Value != 1 || c[1].Name != "np_cnp_sent" || c[1].Value != 1 {
		t.Fatalf("named counters %+v", c)
	}
}

// TestDataFramesECT: with DCQCN on, every frame of an RC QP leaves ECT(0)
// with the AV's DSCP (or DataDSCP); with it off the TOS is the AV's traffic
// class, untouched; IPv6 carries the same in its traffic class.
func TestDataFramesECT(t *testing.T) {
	override := mustCC(t, "paper", 0)
	override.DataDSCP = 46
	for _, c := range []struct {
		name    string
		cong    Congestion
		v6      bool
		tclass  uint8
		wantTOS uint8
	}{
		{"off", Congestion{}, false, 0x68, 0x68},
		{"off-zero", Congestion{}, false, 0, 0},
		{"paper", mustCC(t, "paper", 0), false, 0x68, 0x6A},
		{"paper-zero", mustCC(t, "paper", 0), false, 0, 0x02},
		{"paper-v6", mustCC(t, "paper", 0), true, 0x68, 0x6A},
		{"connectx-datadscp", override, false, 0x68, 46<<2 | 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			a, b := netip.MustParseAddr("10.9.0.1"), netip.MustParseAddr("10.9.0.2")
			if c.v6 {
				a, b = netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2")
			}
			s := newCCSolo(t, c.cong, macA, a, macB, b, 0x33, c.tclass)
			src, _ := s.qp.pd.RegBytes(make([]byte, 4096), 0, ib.LocalWrite)
			_, err := s.qp.PostSend([]verbs.SendWR{{Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: []ib.SGE{{Addr: src.IOVA(), Length: 3000, LKey: src.LKey()}}, RemoteAddr: 0x1000, RKey: 7}})
			must(t, err)
			var frames [][]byte
			for now := clock.Time(0); len(frames) < 3 && now < clock.Time(time.Millisecond); now += 1000 {
				s.dev.Expire(now)
				frames = append(frames, s.transmit(now)...)
			}
			s.write(clock.Time(time.Millisecond), 0)
			frames = append(frames, s.transmit(clock.Time(time.Millisecond))...) // the ACK
			if len(frames) != 4 {
				t.Fatalf("%d frames, want 3 WRITE packets and an ACK", len(frames))
			}
			for i, fb := range frames {
				f := checker.Frame(t, fb)
				tos := uint8(0)
				if c.v6 {
					tos = f.IPv6().TrafficClass()
				} else {
					tos = f.IPv4().TOS()
				}
				if tos != c.wantTOS {
					t.Errorf("frame %d (%v): TOS %#x, want %#x", i, f.Opcode(), tos, c.wantTOS)
				}
			}
			if _, on := s.qp.CongestionState(); on != c.cong.On() {
				t.Errorf("CongestionState on = %v", on)
			}
		})
	}
}

// cnpTimes feeds the device the peer's WRITEs at the given times (CE-marked
// when ce says so), runs its timers as an engine would, and returns when
// it sent CNPs, up to end.
func cnpTimes(t *testing.T, s *ccSolo, at []time.Duration, ce func(i int) bool, end clock.Time) []time.Duration {
	var sent []time.Duration
	collect := func(now clock.Time) {
		for _, fb := range s.transmit(now) {
			if f := checker.Frame(t, fb); f.Opcode() == bth.CNP {
				sent = append(sent, time.Duration(now))
			}
		}
	}
	for i, d := range at {
		now := clock.Time(d)
		for dl := s.dev.NextDeadline(); dl <= now; dl = s.dev.NextDeadline() {
			s.dev.Expire(dl)
			collect(dl)
		}
		tos := uint8(0x02)
		if ce(i) {
			tos = 0x03
		}
		s.write(now, tos)
		collect(now)
	}
	for dl := s.dev.NextDeadline(); dl <= end; dl = s.dev.NextDeadline() {
		s.dev.Expire(dl)
		collect(dl)
	}
	return sent
}

// TestOneCNPPerInterval: CE marks every 10 µs make one CNP per 50 µs with
// the paper's NP (deferred: the marks inside an interval produce one CNP at
// its end); every 1 µs they make one per 4 µs with ConnectX's
// (min_time_between_cnps 4, dropped not deferred); unmarked packets none.
func TestOneCNPPerInterval(t *testing.T) {
	us := time.Microsecond
	var at []time.Duration
	for i := 0; i < 20; i++ {
		at = append(at, time.Duration(i)*10*us)
	}
	s := newCCSolo(t, mustCC(t, "paper", 0), macA, addrA, macB, addrB, 0x40, 0)
	got := cnpTimes(t, s, at, func(int) bool { return true }, clock.Time(time.Millisecond))
	want := []time.Duration{0, 50 * us, 100 * us, 150 * us, 200 * us}
	if !equalDurations(got, want) {
		t.Fatalf("paper: CNPs at %v, want %v", got, want)
	}
	if st := s.dev.Stats; st.NPECNMarkedRoCEPackets != 20 || st.NPCNPSent != 5 {
		t.Fatalf("paper counters %+v", st.CongestionStats)
	}
	if cs, _ := s.qp.CongestionState(); cs.CNPSent != 5 || cs.ECNMarked != 20 {
		t.Fatalf("per-QP counters %+v", cs)
	}

	at = at[:0]
	for i := 0; i < 20; i++ {
		at = append(at, time.Duration(i)*us)
	}
	s = newCCSolo(t, mustCC(t, "connectx", 0), macA, addrA, macB, addrB, 0x40, 0)
	got = cnpTimes(t, s, at, func(i int) bool { return i != 8 }, clock.Time(time.Millisecond))
	// A CNP at 0, 4 µs; the 8 µs packet is unmarked, so the next mark
	// (9 µs) sends; then 13, 17.
	want = []time.Duration{0, 4 * us, 9 * us, 13 * us, 17 * us}
	if !equalDurations(got, want) {
		t.Fatalf("connectx: CNPs at %v, want %v", got, want)
	}

	s = newCCSolo(t, mustCC(t, "paper", 0), macA, addrA, macB, addrB, 0x40, 0)
	if got = cnpTimes(t, s, at, func(int) bool { return false }, clock.Time(time.Millisecond)); len(got) != 0 {
		t.Fatalf("CNPs without marks at %v", got)
	}
}

func equalDurations(a, b []time.Duration) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestCNPCutsRateAndPaces: one CNP at 40 Gb/s (paper) cuts the QP to
// 20 Gb/s; the device's timer list then runs the RP's increases at the
// golden times (30, 35, 37.5, 38.75, 39.375, 39.6875 Gb/s at 55…330 µs);
// in between, the pacer spaces the QP's frames by their length at the
// rate, parking the QP on the timer list (no output pending) between them.
func TestCNPCutsRateAndPaces(t *testing.T) {
	s := newCCSolo(t, mustCC(t, "paper", 40*congestion.Gbps), macA, addrA, macB, addrB, 0x40, 0)
	if cs, _ := s.qp.CongestionState(); cs.Rate != 40*congestion.Gbps {
		t.Fatalf("start rate %v", cs.Rate)
	}
	s.cnp(0)
	cs, _ := s.qp.CongestionState()
	if cs.Rate != 20*congestion.Gbps || cs.CNPHandled != 1 || s.dev.Stats.RPCNPHandled != 1 || s.dev.Stats.RxCNP != 1 ||
		cs.Decreases != 1 || s.dev.Stats.Decreases != 1 {
		t.Fatalf("after one CNP: rate %v, handled %d/%d, decreases %d/%d", cs.Rate, cs.CNPHandled, s.dev.Stats.RPCNPHandled,
			cs.Decreases, s.dev.Stats.Decreases)
	}
	if n := len(s.transmit(0)); n != 0 {
		t.Fatalf("a CNP was answered with %d frames", n)
	}

	// Pacing at 20 Gb/s: an 8 KiB WRITE is 8 packets of 1024 bytes.
	src, _ := s.qp.pd.RegBytes(make([]byte, 8192), 0, ib.LocalWrite)
	_, err := s.qp.PostSend([]verbs.SendWR{{Opcode: ib.RDMAWrite, SG: []ib.SGE{{Addr: src.IOVA(), Length: 8192, LKey: src.LKey()}}, RemoteAddr: 0x1000, RKey: 7}})
	must(t, err)
	now := clock.Time(1000)
	var departures []clock.Time
	var cost float64 // exact time owed for the frames sent so far, ns
	for len(departures) < 8 {
		out := s.transmit(now)
		if len(out) != 1 {
			t.Fatalf("at %v: %d frames, want exactly one (paced)", now, len(out))
		}
		departures = append(departures, now)
		cost += float64(len(out[0])) * 8e9 / 20e9
		if len(departures) == 8 {
			break
		}
		if s.dev.HasOutput() {
			t.Fatalf("at %v: the paced QP stayed on the ready list", now)
		}
		next := s.dev.NextDeadline()
		want := departures[0] + clock.Time(math.Floor(cost))
		if next != want {
			t.Fatalf("frame %d: next departure %v, want %v (frame %d B at 20 Gb/s)", len(departures), next, want, len(out[0]))
		}
		if k := len(s.transmit(next - 1)); k != 0 {
			t.Fatalf("%d frames 1 ns before the departure time", k)
		}
		s.dev.Expire(next)
		// Back on the ready list straight from the engine's own Expire,
		// not through the handover and its lock.
		if s.dev.handedOver.Load() || len(s.dev.ready) != 1 {
			t.Fatalf("at %v: the QP went through the handover (ready %d)", next, len(s.dev.ready))
		}
		now = next
	}

	// The RP's timers through NextDeadline/Expire: the golden recovery.
	golden := []float64{30, 35, 37.5, 38.75, 39.375, 39.6875}
	for i, g := range golden {
		dl := s.dev.NextDeadline()
		if want := clock.Time(time.Duration(i+1) * 55 * time.Microsecond); dl != want {
			t.Fatalf("step %d: deadline %v, want %v", i, dl, want)
		}
		s.dev.Expire(dl)
		if cs, _ := s.qp.CongestionState(); math.Abs(cs.Rate.Gbps()-g) > 1e-9 {
			t.Fatalf("at %v: rate %v Gb/s, want %v", dl, cs.Rate.Gbps(), g)
		}
	}
}

// TestCNPIgnoredWhenOff: a device without DCQCN counts a CNP as
// rp_cnp_ignored and neither answers it nor hands it to the transport.
func TestCNPIgnoredWhenOff(t *testing.T) {
	s := newCCSolo(t, Congestion{}, macA, addrA, macB, addrB, 0x40, 0)
	s.cnp(0)
	st := s.dev.Stats
	if st.RxCNP != 1 || st.RPCNPIgnored != 1 || st.RPCNPHandled != 0 || st.RxBadType != 0 {
		t.Fatalf("stats %+v", st)
	}
	if n := len(s.transmit(0)); n != 0 {
		t.Fatalf("a CNP was answered with %d frames", n)
	}
	for _, c := range []Congestion{{Algorithm: "bogus"}, {Algorithm: "swift"}, {Algorithm: "dcqcn", Profile: "bogus"}} {
		if _, err := NewDevice(Config{Addrs: []netip.Addr{addrA}, Congestion: c}); err == nil {
			t.Fatalf("%+v accepted", c)
		}
	}
	if _, err := NewCongestion("dcqcn", "paper", 0, 0.5, nil); err == nil {
		t.Fatal("scale below 1 accepted")
	}
	if _, err := NewCongestion("swift", "paper", 0, 1, nil); err == nil {
		t.Fatal("unknown swift profile accepted")
	}
	// Every profile the daemon's dcqcn.profile names is the device's.
	for _, p := range []string{"paper", "connectx", "hpcc-mlx"} {
		if c, err := NewCongestion("dcqcn", p, 0, 1, nil); err != nil || !c.On() {
			t.Errorf("profile %s: %+v %v", p, c, err)
		}
	}
	if c, err := NewCongestion("off", "", 0, 1, nil); err != nil || c.On() {
		t.Errorf("off: %+v %v", c, err)
	}
}

// FuzzDCQCNReceive feeds arbitrary frames (re-aimed at the QP and
// re-stamped when they parse, so that they pass the ICRC check) to a
// device running DCQCN, at arbitrary times, then runs its timers and
// transmit: nothing may panic, and every CNP it sends must be well formed
// and addressed to the peer's QP.
func FuzzDCQCNReceive(f *testing.F) {
	seed := newCCSolo(f, mustCC(f, "paper", 0), macA, addrA, macB, addrB, 0x40, 0)
	sp := seed.spec(0xC3)
	buf := make([]byte, 256)
	n, _ := frame.BuildCNP(buf, &sp, seed.qp.QPN())
	f.Add(append([]byte(nil), buf[:n]...), uint32(0), false)
	sp.BTH.Opcode, sp.BTH.PSN = bth.RCRDMAWriteOnly, 0x100
	sp.RETH = frame.RETHFields{VA: 0, RKey: 1, DMALen: 8}
	n, _ = frame.Build(buf, &sp, make([]byte, 8))
	f.Add(append([]byte(nil), buf[:n]...), uint32(1000), true)
	f.Fuzz(func(t *testing.T, b []byte, at uint32, connectx bool) {
		profile := "paper"
		if connectx {
			profile = "connectx"
		}
		s := newCCSolo(t, mustCC(t, profile, 0), macA, addrA, macB, addrB, 0x40, 0)
		var fr frame.Frame
		if frame.Parse(b, &fr) == nil {
			h := fr.BTH()
			h.SetDestQP(s.qp.QPN())
			h.SetPKey(0xFFFF)
			_ = restamp(b)
		}
		now := clock.Time(at)
		s.dev.Receive(now, [][]byte{b, b})
		for i := 0; i < 8; i++ {
			for _, o := range s.transmit(now) {
				var c frame.Frame
				if err := frame.Parse(o, &c); err != nil || !c.VerifyICRC() {
					t.Fatalf("device sent a bad frame: %v", err)
				}
				if c.Opcode() == bth.CNP && (c.BTH().DestQP() != 0x40 || !c.BTH().BECN()) {
					t.Fatalf("CNP to %#x", c.BTH().DestQP())
				}
			}
			dl := s.dev.NextDeadline()
			if dl == clock.Never {
				break
			}
			now = max(now, dl)
			s.dev.Expire(now)
		}
	})
}

// TestCNPIPv6: over IPv6 the CNP carries the CNP DSCP with ECT(0) in its
// traffic class and the QP's flow label and UDP source port, and equals
// frame.BuildCNP of those fields.
func TestCNPIPv6(t *testing.T) {
	a, b := netip.MustParseAddr("fd00::17:1"), netip.MustParseAddr("fd00::18:1")
	s := newCCSolo(t, mustCC(t, "connectx", 0), macA, a, macB, b, 0x118, 0)
	s.write(0, 0x03)
	out := s.transmit(0)
	if len(out) != 2 {
		t.Fatalf("%d frames, want CNP and ACK", len(out))
	}
	f := checker.Frame(t, out[0], checker.TrafficClass(48<<2|frame.ECT0),
		checker.TransportIs(checker.Opcode(bth.CNP), checker.DestQP(0x118)))
	sp := frame.Spec{DstMAC: macB, SrcMAC: macA, Src: a, Dst: b, TOS: 48<<2 | frame.ECT0, TTL: 64,
		FlowLabel: f.IPv6().FlowLabel(), SrcPort: f.UDP().SrcPort()}
	want := make([]byte, 128)
	n, err := frame.BuildCNP(want, &sp, 0x118)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out[0], want[:n]) {
		t.Fatalf("device CNP\n% x\nframe.BuildCNP\n% x", out[0], want[:n])
	}
}

package frame

import (
	"bytes"
	"encoding/hex"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/frame/frametest"
	"github.com/softrnic/softrnic/icrc"
)

// wantCounts is the number of RoCE frames in each capture, from the table in
// ../shared/vectors/README.md.
var wantCounts = map[string]int{
	"write_bw_rc.pcap": 500, "read_bw_rc.pcap": 500, "send_bw_rc.pcap": 500,
	"send_bw_ud.pcap": 100, "atomic_bw_rc.pcap": 200, "rc_pingpong.pcap": 200,
	"rping.pcap": 125, "write_bw_rdmacm.pcap": 324, "rnr_nak.pcap": 148,
	"v6_write_bw_rc.pcap": 250, "v6_send_bw_ud.pcap": 50, "v6_atomic_bw_rc.pcap": 100,
	"v6_rping.pcap": 125, "mtu4096_write_bw_rc.pcap": 340, "mtu4096_send_bw_rc.pcap": 100,
}

// wantOpcodes spot-checks opcode counts the README states.
var wantOpcodes = map[string]map[bth.Opcode]int{
	"write_bw_rc.pcap": {bth.RCRDMAWriteFirst: 100, bth.RCRDMAWriteMiddle: 200, bth.RCRDMAWriteLast: 100, bth.RCAcknowledge: 100},
	"read_bw_rc.pcap": {bth.RCRDMAReadRequest: 100, bth.RCRDMAReadResponseFirst: 100,
		bth.RCRDMAReadResponseMiddle: 200, bth.RCRDMAReadResponseLast: 100},
	"send_bw_rc.pcap":   {bth.RCSendFirst: 100, bth.RCSendMiddle: 200, bth.RCSendLast: 100, bth.RCAcknowledge: 100},
	"send_bw_ud.pcap":   {bth.UDSendOnly: 100},
	"atomic_bw_rc.pcap": {bth.RCFetchAdd: 100, bth.RCAtomicAcknowledge: 100},
}

// TestCaptures: every RoCE frame of every capture parses, its lengths agree
// and its ICRC verifies; the per-file counts are the README's.
func TestCaptures(t *testing.T) {
	total := 0
	for _, c := range frametest.Captures(t) {
		n := 0
		ops := map[bth.Opcode]int{}
		var sawV6, sawRNR, sawNAK bool
		for i, b := range c.Frames {
			var f Frame
			err := Parse(b, &f)
			if IsNotRoCE(err) {
				continue
			}
			if err != nil {
				t.Errorf("%s frame %d: %v", c.Name, i+1, err)
				continue
			}
			n++
			ops[f.Opcode()]++
			if !f.VerifyICRC() {
				t.Errorf("%s frame %d (%v): bad ICRC", c.Name, i+1, f.Opcode())
			}
			checkLayout(t, &f)
			if f.IsIPv6() {
				sawV6 = true
			}
			if a := f.AETH(); a != nil {
				switch a.Kind() {
				case bth.KindRNRNAK:
					sawRNR = a.Syndrome() == 0x2C && bth.RNRTimeout(a.RNRTimer()).Microseconds() == 640
				case bth.KindNAK:
					sawNAK = a.NAKCode() == bth.NAKPSNSequenceError
				}
			}
		}
		if w, ok := wantCounts[c.Name]; ok && n != w {
			t.Errorf("%s: %d RoCE frames, README says %d", c.Name, n, w)
		}
		for op, w := range wantOpcodes[c.Name] {
			if ops[op] != w {
				t.Errorf("%s: %d × %v, README says %d", c.Name, ops[op], op, w)
			}
		}
		if strings.HasPrefix(c.Name, "v6_") != sawV6 {
			t.Errorf("%s: IPv6 seen = %v", c.Name, sawV6)
		}
		if c.Name == "rnr_nak.pcap" && (!sawRNR || !sawNAK) {
			t.Errorf("rnr_nak.pcap: RNR NAK 0x2c seen %v, PSN sequence NAK seen %v", sawRNR, sawNAK)
		}
		total += n
	}
	t.Logf("parsed and verified %d RoCE frames", total)
}

// checkLayout checks that the views tile the frame exactly.
func checkLayout(t *testing.T, f *Frame) {
	t.Helper()
	op := f.Opcode()
	hdr := len(f.Ethernet()) + len(f.UDP()) + op.HeaderLen()
	if _, ok := f.VLAN(); ok {
		hdr += VLANTagLen
	}
	if f.IsIPv6() {
		hdr += len(f.IPv6())
	} else {
		hdr += len(f.IPv4())
	}
	if got := hdr + f.PayloadLen() + len(f.Pad()) + len(f.ICRC()); got != f.Len() {
		t.Errorf("%v: views cover %d bytes of %d", op, got, f.Len())
	}
	if len(f.Pad()) != f.BTH().PadCount() || len(f.ICRC()) != icrc.Len {
		t.Errorf("%v: pad %d, PadCnt %d", op, len(f.Pad()), f.BTH().PadCount())
	}
	if (f.RETH() != nil) != op.Headers().Has(bth.ExtRETH) || (f.AETH() != nil) != op.Headers().Has(bth.ExtAETH) ||
		(f.DETH() != nil) != op.Headers().Has(bth.ExtDETH) || (f.AtomicETH() != nil) != op.Headers().Has(bth.ExtAtomicETH) {
		t.Errorf("%v: extended header views disagree with the opcode table", op)
	}
	if !op.HasPayload() && f.PayloadLen() != 0 {
		t.Errorf("%v: payload on an opcode without one", op)
	}
}

const cnpHex = `e4 1d 2d ab 2b c2 7c fe 90 64 3b 32 08 00 45 c2 00 3c 71 8c 40 00 40 11 91 61 0a 00 11 01 0a 00
12 01 00 00 12 b7 00 28 00 00 81 00 ff ff 40 00 01 18 00 00 00 00 00 00 00 00 00 00 00 00 00 00
00 00 00 00 00 00 82 fd 00 2a`

func mustHex(s string) []byte {
	b, err := hex.DecodeString(strings.Join(strings.Fields(s), ""))
	if err != nil {
		panic(err)
	}
	return b
}

// TestConnectXCNP rebuilds the ConnectX-4 Lx CNP byte for byte from its
// fields (../shared/vectors/README.md) and parses the original.
func TestConnectXCNP(t *testing.T) {
	want := mustHex(cnpHex)
	s := Spec{
		DstMAC: [6]byte{0xe4, 0x1d, 0x2d, 0xab, 0x2b, 0xc2},
		SrcMAC: [6]byte{0x7c, 0xfe, 0x90, 0x64, 0x3b, 0x32},
		Src:    netip.MustParseAddr("10.0.17.1"),
		Dst:    netip.MustParseAddr("10.0.18.1"),
		TOS:    0xC2, TTL: 64, IPID: 0x718c, SrcPort: 0,
	}
	buf := make([]byte, 128)
	n, err := BuildCNP(buf, &s, 0x000118)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf[:n], want) {
		t.Fatalf("built CNP\n% x\nwant\n% x", buf[:n], want)
	}
	var f Frame
	if err := Parse(want, &f); err != nil {
		t.Fatal(err)
	}
	b := f.BTH()
	if f.Opcode() != bth.CNP || !b.BECN() || b.DestQP() != 0x118 || b.PKey() != 0xFFFF || !f.VerifyICRC() ||
		f.Src() != s.Src || f.Dst() != s.Dst || len(f.CNPReserved()) != 16 || f.PayloadLen() != 0 || f.ECN() != 2 {
		t.Fatalf("parsed CNP wrong: %+v", b.Fields())
	}
}

// specFor fills every field an opcode may carry with distinct values.
func specFor(op bth.Opcode, v6, vlan bool) Spec {
	s := Spec{
		DstMAC: [6]byte{2, 0, 0, 0, 0, 1}, SrcMAC: [6]byte{2, 0, 0, 0, 0, 2},
		VLAN: vlan, VLANTCI: 0x6123,
		Src: netip.MustParseAddr("10.77.0.10"), Dst: netip.MustParseAddr("10.77.0.11"),
		TOS: 0x62, TTL: 17, IPID: 0xBEEF, FlowLabel: 0xABCDE, SrcPort: 0xC0DE,
		BTH:  bth.BTHFields{Opcode: op, SE: true, PKey: 0xFFFF, FECN: true, DestQP: 0x123456, AckReq: true, PSN: 0xFFFFFE},
		RETH: RETHFields{VA: 0x7f0012345678, RKey: 0x1234, DMALen: 4096},
		AETH: AETHFields{Syndrome: bth.RNRNAKSyndrome(12), MSN: 0xABCDEF},
		DETH: DETHFields{QKey: 0x11111111, SrcQP: 0x000011},
		Imm:  0xA5A5A5A5, InvRKey: 0x5A5A0001,
		Atomic:     AtomicFields{VA: 0x1000, RKey: 0x77, SwapAdd: 1, Compare: 2},
		AtomicOrig: 0x0102030405060708, FlushPlace: 1, FlushSelect: 1,
	}
	if v6 {
		s.Src, s.Dst = netip.MustParseAddr("fd77::10"), netip.MustParseAddr("fd77::11")
	}
	return s
}

// TestRoundTripEveryOpcode builds every opcode (IPv4/IPv6, with and without
// a VLAN tag, several payload sizes) and parses it back.
func TestRoundTripEveryOpcode(t *testing.T) {
	buf := make([]byte, 9000)
	for op := 0; op < 256; op++ {
		o := bth.Opcode(op)
		if !o.Valid() {
			s := specFor(o, false, false)
			if _, err := Build(buf, &s, nil); !errors.Is(err, ErrBuildOpcode) {
				t.Errorf("%v: Build error %v", o, err)
			}
			continue
		}
		sizes := []int{0}
		if o.HasPayload() {
			sizes = []int{0, 1, 2, 3, 4, 5, 1024, 4093}
		}
		for _, v6 := range []bool{false, true} {
			for _, vlan := range []bool{false, true} {
				for _, size := range sizes {
					s := specFor(o, v6, vlan)
					pay := make([]byte, size)
					for i := range pay {
						pay[i] = byte(i*7 + op)
					}
					n, err := Build(buf, &s, pay)
					if err != nil {
						t.Fatalf("%v v6=%v vlan=%v size=%d: %v", o, v6, vlan, size, err)
					}
					if n != Size(&s, size) {
						t.Errorf("%v: Size %d, built %d", o, Size(&s, size), n)
					}
					checkRoundTrip(t, buf[:n], &s, pay)
				}
			}
		}
		// Payload on an opcode without one is refused.
		if !o.HasPayload() {
			s := specFor(o, false, false)
			if _, err := Build(buf, &s, []byte{1}); !errors.Is(err, ErrBuildPayload) {
				t.Errorf("%v with payload: %v", o, err)
			}
		}
	}
}

func checkRoundTrip(t *testing.T, b []byte, s *Spec, pay []byte) {
	t.Helper()
	o := s.BTH.Opcode
	var f Frame
	if err := Parse(b, &f); err != nil {
		t.Fatalf("%v: parse of built frame: %v", o, err)
	}
	if !f.VerifyICRC() {
		t.Fatalf("%v: built frame has a bad ICRC", o)
	}
	checkLayout(t, &f)
	e := f.Ethernet()
	if !bytes.Equal(e.Dst(), s.DstMAC[:]) || !bytes.Equal(e.Src(), s.SrcMAC[:]) {
		t.Errorf("%v: MACs", o)
	}
	if tci, ok := f.VLAN(); ok != s.VLAN || (ok && tci != s.VLANTCI) {
		t.Errorf("%v: VLAN %v %#x", o, ok, tci)
	}
	if f.Src() != s.Src || f.Dst() != s.Dst {
		t.Errorf("%v: addresses %v→%v", o, f.Src(), f.Dst())
	}
	if ip := f.IPv4(); ip != nil {
		if ip.TOS() != s.TOS || ip.TTL() != s.TTL || ip.ID() != s.IPID || !ip.DF() || !ip.ChecksumValid() {
			t.Errorf("%v: IPv4 header % x", o, []byte(ip))
		}
	} else if ip := f.IPv6(); ip.TrafficClass() != s.TOS || ip.HopLimit() != s.TTL || ip.FlowLabel() != s.FlowLabel {
		t.Errorf("%v: IPv6 header % x", o, []byte(ip))
	}
	if u := f.UDP(); u.SrcPort() != s.SrcPort || u.DstPort() != RoCEv2Port || u.Checksum() != 0 {
		t.Errorf("%v: UDP % x", o, []byte(u))
	}
	want := s.BTH
	want.PadCount = -len(pay) & 3
	if got := f.BTH().Fields(); got != want {
		t.Errorf("%v: BTH %+v, want %+v", o, got, want)
	}
	if r := f.RETH(); r != nil && (r.VA() != s.RETH.VA || r.RKey() != s.RETH.RKey || r.DMALen() != s.RETH.DMALen) {
		t.Errorf("%v: RETH", o)
	}
	if a := f.AETH(); a != nil && (a.Syndrome() != s.AETH.Syndrome || a.MSN() != s.AETH.MSN) {
		t.Errorf("%v: AETH", o)
	}
	if d := f.DETH(); d != nil && (d.QKey() != s.DETH.QKey || d.SrcQP() != s.DETH.SrcQP) {
		t.Errorf("%v: DETH", o)
	}
	if i := f.ImmDt(); i != nil && i.Imm() != s.Imm {
		t.Errorf("%v: ImmDt", o)
	}
	if i := f.IETH(); i != nil && i.RKey() != s.InvRKey {
		t.Errorf("%v: IETH", o)
	}
	if a := f.AtomicETH(); a != nil && (a.VA() != s.Atomic.VA || a.RKey() != s.Atomic.RKey ||
		a.SwapAdd() != s.Atomic.SwapAdd || a.Compare() != s.Atomic.Compare) {
		t.Errorf("%v: AtomicETH", o)
	}
	if a := f.AtomicAckETH(); a != nil && a.Orig() != s.AtomicOrig {
		t.Errorf("%v: AtomicAckETH", o)
	}
	if fe := f.FETH(); fe != nil && (fe.PlacementType() != s.FlushPlace || fe.Selectivity() != s.FlushSelect) {
		t.Errorf("%v: FETH", o)
	}
	if !bytes.Equal(f.Payload(), pay) {
		t.Errorf("%v: payload differs", o)
	}
	for _, p := range f.Pad() {
		if p != 0 {
			t.Errorf("%v: non-zero pad", o)
		}
	}
}

// TestScatterGatherBuild writes the payload in pieces between Headers and
// Finish, as the engine does from MR memory, and gets the same frame as
// the one-call Build.
func TestScatterGatherBuild(t *testing.T) {
	s := specFor(bth.RCRDMAWriteOnlyImm, false, false)
	pieces := [][]byte{bytes.Repeat([]byte{1}, 100), bytes.Repeat([]byte{2}, 3), bytes.Repeat([]byte{3}, 900)}
	whole := bytes.Join(pieces, nil)
	one := make([]byte, 2048)
	n1, err := Build(one, &s, whole)
	if err != nil {
		t.Fatal(err)
	}
	two := bytes.Repeat([]byte{0xEE}, 2048) // dirty buffer: nothing may leak through
	var b Builder
	hl, err := b.Headers(two, &s)
	if err != nil {
		t.Fatal(err)
	}
	off := hl
	for _, p := range pieces {
		off += copy(two[off:], p)
	}
	n2, err := b.Finish(two, off-hl)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(one[:n1], two[:n2]) {
		t.Fatalf("scatter/gather build differs from Build")
	}
	var fresh Builder
	if _, err := fresh.Finish(two, 0); !errors.Is(err, ErrNoHeaders) {
		t.Errorf("Finish without Headers: %v", err)
	}
	if _, err := b.Headers(make([]byte, 40), &s); !errors.Is(err, ErrBufferTooSmall) {
		t.Errorf("small buffer: %v", err)
	}
	if _, err := Build(make([]byte, 100), &s, whole); !errors.Is(err, ErrBufferTooSmall) {
		t.Errorf("small buffer for payload: %v", err)
	}
	bad := s
	bad.Dst = netip.MustParseAddr("fd77::1")
	if _, err := Build(one, &bad, nil); !errors.Is(err, ErrAddrFamily) {
		t.Errorf("mixed families: %v", err)
	}
	mapped := s
	mapped.Src = netip.MustParseAddr("::ffff:10.77.0.10")
	if n, err := Build(one, &mapped, whole); err != nil || !bytes.Equal(one[:n], two[:n2]) {
		t.Errorf("IPv4-mapped source not treated as IPv4: %v", err)
	}
}

// TestMaskedFieldFlips: at frame level, changing the fields switches and
// routers may rewrite (TTL, TOS/traffic class, flow label, FECN/BECN, UDP
// checksum) keeps the ICRC good; changing any other byte breaks it.
func TestMaskedFieldFlips(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		s := specFor(bth.RCSendOnly, v6, true)
		buf := make([]byte, 256)
		n, err := Build(buf, &s, []byte("hello, rdma"))
		if err != nil {
			t.Fatal(err)
		}
		b := buf[:n]
		var f Frame
		if err := Parse(b, &f); err != nil {
			t.Fatal(err)
		}
		ip := len(b) - len(f.Packet())
		masked := map[int]byte{}
		if v6 {
			for _, i := range []int{1, 2, 3, 7} {
				masked[ip+i] = 0xFF
			}
			masked[ip] = 0x0F
		} else {
			for _, i := range []int{1, 8, 10, 11} {
				masked[ip+i] = 0xFF
			}
		}
		u := len(b) - len(f.Packet()) + len(f.IPv4()) + len(f.IPv6())
		masked[u+6], masked[u+7], masked[u+8+4] = 0xFF, 0xFF, 0xFF
		for off := ip; off < len(b); off++ {
			for bit := 0; bit < 8; bit++ {
				m := byte(1) << bit
				b[off] ^= m
				// The frame may stop parsing (a length byte changed); then the
				// ICRC is moot, but a flip of a masked bit must always parse.
				var g Frame
				perr := Parse(b, &g)
				ok := perr == nil && g.VerifyICRC()
				b[off] ^= m
				if want := masked[off]&m != 0; ok != want {
					t.Fatalf("v6=%v byte %d bit %d: verify %v (parse %v), want %v", v6, off, bit, ok, perr, want)
				}
			}
		}
	}
}

// TestMalformed: each kind of inconsistency gets its own typed error, and
// every truncation of a valid frame fails cleanly.
func TestMalformed(t *testing.T) {
	s := specFor(bth.RCRDMAWriteFirst, false, false)
	good := make([]byte, 2048)
	n, err := Build(good, &s, make([]byte, 1024))
	if err != nil {
		t.Fatal(err)
	}
	good = good[:n]
	const ip, udp, b = 14, 34, 42
	mut := func(f func(p []byte)) []byte {
		p := append([]byte(nil), good...)
		f(p)
		return p
	}
	cases := []struct {
		name string
		p    []byte
		want error
	}{
		{"arp", mut(func(p []byte) { p[12], p[13] = 0x08, 0x06 }), ErrEtherType},
		{"ip version", mut(func(p []byte) { p[ip] = 0x65 }), ErrIPVersion},
		{"ip options", mut(func(p []byte) { p[ip] = 0x46 }), ErrIPOptions},
		{"tcp", mut(func(p []byte) { p[ip+9] = 6 }), ErrNotUDP},
		{"fragment", mut(func(p []byte) { p[ip+6] |= 0x20 }), ErrFragment},
		{"ip length beyond frame", mut(func(p []byte) { p[ip+2] = 0xFF }), ErrIPLength},
		{"ip length too small", mut(func(p []byte) { p[ip+2], p[ip+3] = 0, 20 }), ErrIPLength},
		{"other port", mut(func(p []byte) { p[udp+3] = 0xB8 }), ErrPort},
		{"udp length", mut(func(p []byte) { p[udp+5]-- }), ErrUDPLength},
		{"tver", mut(func(p []byte) { p[b+1] |= 1 }), ErrTVer},
		{"rd opcode", mut(func(p []byte) { p[b] = 0x40 }), ErrOpcode},
		{"linux cnp 0x80", mut(func(p []byte) { p[b] = 0x80 }), ErrOpcode},
		{"payload on ack", mut(func(p []byte) { p[b] = byte(bth.RCAcknowledge) }), ErrPayload},
		// Bytes after an AETH are a SACKETH only with the selective-repeat
		// bit, and only on an ACK (the QP checks the SACKETH itself).
		{"sack on ack", mut(func(p []byte) { p[b] = byte(bth.RCAcknowledge); bth.BTH(p[b:]).SetSR(true) }), nil},
		{"sr bit on an atomic ack", mut(func(p []byte) { p[b] = byte(bth.RCAtomicAcknowledge); bth.BTH(p[b:]).SetSR(true) }), ErrPayload},
		{"atomic too short", mut(func(p []byte) { p[b] = byte(bth.RCCompareSwap) }), ErrPayload},
	}
	for _, c := range cases {
		var f Frame
		if err := Parse(c.p, &f); !errors.Is(err, c.want) || c.want == nil && err != nil {
			t.Errorf("%s: got %v, want %v", c.name, err, c.want)
		}
	}
	// A 0-byte payload with PadCnt 3 claims pad that is not there.
	s0 := specFor(bth.RCSendOnly, false, false)
	p := make([]byte, 128)
	n0, _ := Build(p, &s0, nil)
	p[b+1] |= 0x30
	var f Frame
	if err := Parse(p[:n0], &f); !errors.Is(err, ErrPadCount) || ReasonOf(err) != ReasonPadCount {
		t.Errorf("PadCnt beyond payload: %v", err)
	}
	// An ACK cut before its AETH.
	sa := specFor(bth.RCAcknowledge, false, false)
	na, _ := Build(p, &sa, nil)
	p[ip+3] -= 4
	p[udp+5] -= 4
	if err := Parse(p[:na-4], &f); !errors.Is(err, ErrHeaderLen) {
		t.Errorf("ACK without AETH room: %v", err)
	}
	// Every truncation of a valid frame fails without panicking.
	for i := 0; i < len(good); i++ {
		if err := Parse(good[:i], &f); err == nil {
			t.Fatalf("truncated to %d bytes parses", i)
		}
	}
	// Ethernet padding after the datagram is ignored.
	padded := append(append([]byte(nil), good...), 0, 0, 0, 0, 0, 0)
	if err := Parse(padded, &f); err != nil || f.Len() != len(good) || !f.VerifyICRC() {
		t.Errorf("trailing Ethernet padding: %v", err)
	}
	var pe *ParseError
	if err := Parse(good[:20], &f); !errors.As(err, &pe) || pe.Reason != ReasonTruncated || IsNotRoCE(err) {
		t.Errorf("truncated: %v", err)
	}
	if err := Parse(cases[0].p, &f); !IsNotRoCE(err) {
		t.Error("ARP is not RoCE")
	}
	if !errors.Is(&ParseError{Reason: ReasonTVer}, ErrTVer) || errors.Is(ErrTVer, ErrOpcode) {
		t.Error("ParseError.Is")
	}
	for r := ReasonNone; r < numReasons; r++ {
		if r.String() == "unknown reason" || r.String() == "" {
			t.Errorf("reason %d has no text", r)
		}
	}
}

func TestZeroAllocs(t *testing.T) {
	s := specFor(bth.RCRDMAWriteFirst, false, false)
	buf := make([]byte, 2048)
	pay := make([]byte, 1024)
	n, _ := Build(buf, &s, pay)
	var f Frame
	var sink int
	if a := testing.AllocsPerRun(200, func() {
		if Parse(buf[:n], &f) != nil {
			panic("parse")
		}
		sink += int(f.RETH().DMALen()) + f.PayloadLen() + int(f.BTH().PSN())
		_ = f.Src()
	}); a != 0 {
		t.Errorf("Parse allocates %v times", a)
	}
	if a := testing.AllocsPerRun(200, func() { _ = Parse(buf[:30], &f) }); a != 0 {
		t.Errorf("Parse error path allocates %v times", a)
	}
	if a := testing.AllocsPerRun(200, func() {
		if !f.VerifyICRC() {
			panic("icrc")
		}
	}); a != 0 {
		t.Errorf("VerifyICRC allocates %v times", a)
	}
	out := make([]byte, 2048)
	var b Builder
	if a := testing.AllocsPerRun(200, func() {
		hl, _ := b.Headers(out, &s)
		copy(out[hl:], pay)
		_, _ = b.Finish(out, len(pay))
		_, _ = Build(out, &s, pay)
		_, _ = BuildCNP(out, &s, 0x11)
	}); a != 0 {
		t.Errorf("build allocates %v times", a)
	}
	_ = sink
}

// BenchmarkParseIPv4RETH is the parser's reference figure: Eth/IPv4/UDP/BTH/RETH with a
// 1 KiB payload (ICRC not verified).
func BenchmarkParseIPv4RETH(b *testing.B) {
	s := specFor(bth.RCRDMAWriteFirst, false, false)
	buf := make([]byte, 2048)
	n, _ := Build(buf, &s, make([]byte, 1024))
	frame := buf[:n]
	var f Frame
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if err := Parse(frame, &f); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParseVerifyIPv4RETH adds the ICRC check to the parse.
func BenchmarkParseVerifyIPv4RETH(b *testing.B) {
	s := specFor(bth.RCRDMAWriteFirst, false, false)
	buf := make([]byte, 2048)
	n, _ := Build(buf, &s, make([]byte, 1024))
	frame := buf[:n]
	var f Frame
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if err := Parse(frame, &f); err != nil || !f.VerifyICRC() {
			b.Fatal(err)
		}
	}
}

// BenchmarkBuild1KiB builds a 1 KiB RDMA WRITE FIRST frame with Headers and
// Finish (payload copy included), ICRC and all.
func BenchmarkBuild1KiB(b *testing.B) {
	s := specFor(bth.RCRDMAWriteFirst, false, false)
	buf := make([]byte, 2048)
	pay := make([]byte, 1024)
	var bl Builder
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		s.BTH.PSN = s.BTH.PSN.Next()
		hl, _ := bl.Headers(buf, &s)
		copy(buf[hl:], pay)
		if _, err := bl.Finish(buf, len(pay)); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkBuildACK builds an ACK (no payload), the responder's commonest
// frame.
func BenchmarkBuildACK(b *testing.B) {
	s := specFor(bth.RCAcknowledge, false, false)
	buf := make([]byte, 128)
	var bl Builder
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, err := bl.Headers(buf, &s); err != nil {
			b.Fatal(err)
		}
		if _, err := bl.Finish(buf, 0); err != nil {
			b.Fatal(err)
		}
	}
}

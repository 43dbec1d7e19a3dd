package frame

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/softrnic/softrnic/bth"
)

func TestViewsOnCNPVector(t *testing.T) {
	var f Frame
	b := mustHex(cnpHex)
	if err := Parse(b, &f); err != nil {
		t.Fatal(err)
	}
	if &f.Buf()[0] != &b[0] || f.Len() != 74 {
		t.Fatal("Buf/Len")
	}
	if f.Ethernet().EtherType() != EtherTypeIPv4 {
		t.Error("EtherType")
	}
	ip := f.IPv4()
	if ip.Version() != 4 || ip.IHL() != 5 || ip.TOS() != 0xC2 || ip.ECN() != 2 || ip.TotalLen() != 60 ||
		ip.ID() != 0x718c || !ip.DF() || ip.MF() || ip.FragOffset() != 0 || ip.TTL() != 64 ||
		ip.Protocol() != ProtocolUDP || ip.Checksum() != 0x9161 || !ip.ChecksumValid() {
		t.Errorf("IPv4 view % x", []byte(ip))
	}
	if f.IPv6() != nil || f.IsIPv6() {
		t.Error("IPv6 view on an IPv4 frame")
	}
	u := f.UDP()
	if u.SrcPort() != 0 || u.DstPort() != RoCEv2Port || u.Length() != 40 || u.Checksum() != 0 {
		t.Errorf("UDP view % x", []byte(u))
	}
	ip[8]-- // routers decrement TTL: the checksum breaks, the ICRC does not
	if ip.ChecksumValid() || !f.VerifyICRC() {
		t.Error("TTL change")
	}
}

func TestIPv6Views(t *testing.T) {
	s := specFor(bth.RCSendOnly, true, false)
	s.TOS = 0xA3
	buf := make([]byte, 256)
	n, err := Build(buf, &s, []byte{1, 2, 3})
	if err != nil {
		t.Fatal(err)
	}
	var f Frame
	if err := Parse(buf[:n], &f); err != nil {
		t.Fatal(err)
	}
	ip := f.IPv6()
	if ip.Version() != 6 || ip.TrafficClass() != 0xA3 || ip.ECN() != 3 || f.ECN() != 3 || ip.FlowLabel() != s.FlowLabel ||
		int(ip.PayloadLen()) != n-EthernetLen-IPv6Len || ip.NextHeader() != ProtocolUDP || ip.HopLimit() != s.TTL ||
		ip.Src() != netip.MustParseAddr("fd77::10") || ip.Dst() != netip.MustParseAddr("fd77::11") {
		t.Errorf("IPv6 view % x", []byte(ip))
	}
	if f.IPv4() != nil || f.Ethernet().EtherType() != EtherTypeIPv6 {
		t.Error("IPv4 view on an IPv6 frame")
	}
	// Unknown reasons still describe themselves.
	if Reason(200).String() != "unknown reason" || ReasonOf(nil) != ReasonNone {
		t.Error("reason fallbacks")
	}
}

func TestFinishErrors(t *testing.T) {
	var b Builder
	buf := make([]byte, 70000)
	sa := specFor(bth.RCAcknowledge, false, false)
	if _, err := b.Headers(buf, &sa); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Finish(buf, 1); !errors.Is(err, ErrBuildPayload) {
		t.Errorf("payload on ACK: %v", err)
	}
	sw := specFor(bth.RCSendOnly, false, false)
	hl, _ := b.Headers(buf, &sw)
	if _, err := b.Finish(buf, -1); !errors.Is(err, ErrBuildPayload) {
		t.Errorf("negative payload: %v", err)
	}
	if _, err := b.Finish(buf, 0xFFFF-(hl-EthernetLen)-3); !errors.Is(err, ErrTooLong) { // one byte over with ICRC
		t.Errorf("oversized datagram: %v", err)
	}
	if _, err := b.Finish(buf[:hl+100], 200); !errors.Is(err, ErrBufferTooSmall) {
		t.Errorf("short buffer at Finish: %v", err)
	}
	if Size(&Spec{BTH: bth.BTHFields{Opcode: 0x42}}, 0) != 0 {
		t.Error("Size of an unknown opcode")
	}
	s6 := specFor(bth.RCSendOnly, true, true)
	if got, want := Size(&s6, 5), EthernetLen+VLANTagLen+IPv6Len+UDPLen+bth.BTHLen+8+4; got != want {
		t.Errorf("Size %d, want %d", got, want)
	}
}

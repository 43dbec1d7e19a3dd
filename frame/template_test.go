package frame

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/icrc"
)

// TestTemplateFrameEqualsBuild: a transport packet behind a Template,
// finished by Prepend and the ICRC, is byte for byte the frame Build writes from the
// same Spec, for IPv4, IPv6 and with an 802.1Q tag; SetTOS changes only the
// TOS (and so the checksum and ICRC).
func TestTemplateFrameEqualsBuild(t *testing.T) {
	for _, c := range []struct {
		name     string
		src, dst string
		vlan     bool
	}{{"v4", "10.0.0.1", "10.0.0.2", false}, {"v6", "fd00::1", "fd00::2", false}, {"vlan", "10.0.0.1", "10.0.0.2", true}} {
		s := Spec{DstMAC: [6]byte{2, 0, 0, 0, 0, 2}, SrcMAC: [6]byte{2, 0, 0, 0, 0, 1}, VLAN: c.vlan, VLANTCI: 5,
			Src: netip.MustParseAddr(c.src), Dst: netip.MustParseAddr(c.dst), TOS: 0x22, TTL: 9, FlowLabel: 0x12345, IPID: 8,
			SrcPort: 0xC123, BTH: bth.BTHFields{Opcode: bth.RCSendOnly, PKey: 0xFFFF, DestQP: 0x11, PSN: 7}}
		pay := []byte("payload!!")
		want := make([]byte, 200)
		n, err := Build(want, &s, pay)
		if err != nil {
			t.Fatal(err)
		}
		var tp Template
		if err := tp.Set(&s); err != nil {
			t.Fatal(err)
		}
		// The transport packet, as a transport writes it behind the header.
		pkt := want[len(tp.Bytes()) : n-4]
		got := make([]byte, 200)
		copy(got[len(tp.Bytes()):], pkt)
		id := uint16(7)
		m := finish(got, tp.Bytes(), len(pkt), &id)
		if m != n || !bytes.Equal(got[:m], want[:n]) {
			t.Fatalf("%s:\n got % x\nwant % x", c.name, got[:m], want[:n])
		}
		if tp.TOS() != 0x22 {
			t.Fatalf("%s: TOS %#x", c.name, tp.TOS())
		}
		tp.SetTOS(0xC2)
		var f Frame
		m = finish(got, tp.Bytes(), len(pkt), &id)
		if err := Parse(got[:m], &f); err != nil || !f.VerifyICRC() || f.ECN() != 2 || f.Src() != s.Src.Unmap() {
			t.Fatalf("%s after SetTOS: %v", c.name, err)
		}
	}
}

// TestPrependChecksum: the checksum Prepend completes from the template's
// partial one is the header's, for any template, length and
// identification (and after SetTOS).
func TestPrependChecksum(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	buf := make([]byte, 2048)
	for i := 0; i < 20000; i++ {
		var a, b [4]byte
		binary.LittleEndian.PutUint32(a[:], r.Uint32())
		binary.LittleEndian.PutUint32(b[:], r.Uint32())
		s := Spec{Src: netip.AddrFrom4(a), Dst: netip.AddrFrom4(b), TOS: uint8(r.Uint32()), TTL: uint8(r.Uint32()),
			IPID: uint16(r.Uint32()), NoDF: r.IntN(2) == 0, SrcPort: uint16(r.Uint32())}
		var tp Template
		if err := tp.Set(&s); err != nil {
			t.Fatal(err)
		}
		if r.IntN(4) == 0 {
			tp.SetTOS(uint8(r.Uint32()))
		}
		id := uint16(r.Uint32())
		n := len(tp.Bytes()) + r.IntN(len(buf)-len(tp.Bytes()))
		ip := Prepend(buf, tp.Bytes(), n, &id)
		h := IPv4(buf[ip : ip+IPv4Len])
		if !h.ChecksumValid() || int(h.TotalLen()) != n-ip || h.ID() != id {
			t.Fatalf("template %+v, frame of %d bytes, id %d: header % x", s, n, id, h)
		}
	}
}

// finish is how a sender completes a frame whose transport packet of tlen
// bytes is at buf[len(hdr):]: Prepend, then the ICRC.
func finish(buf, hdr []byte, tlen int, ipID *uint16) int {
	n := len(hdr) + tlen + icrc.Len
	ip := Prepend(buf, hdr, n, ipID)
	crc, err := icrc.Begin(buf[ip : n-icrc.Len])
	if err != nil {
		panic(err)
	}
	icrc.Put(buf[n-icrc.Len:], crc)
	return n
}

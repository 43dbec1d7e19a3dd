package rocelayers

import (
	"bytes"
	"fmt"
	"net/netip"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/frame"
	"github.com/softrnic/softrnic/frame/frametest"
)

// TestCrossCheckCaptures decodes every capture frame both with gopacket
// (its Ethernet/IP/UDP layers plus ours) and with frame.Parse, and requires
// them to agree on which frames are RoCEv2 and on every field.
func TestCrossCheckCaptures(t *testing.T) {
	total := 0
	for _, c := range frametest.Captures(t) {
		for i, data := range c.Frames {
			pkt := gopacket.NewPacket(data, layers.LayerTypeEthernet, gopacket.Default)
			var f frame.Frame
			perr := frame.Parse(data, &f)
			l := pkt.Layer(LayerTypeBTH)
			if l == nil {
				if perr == nil {
					t.Errorf("%s frame %d: frame.Parse accepts what gopacket does not decode as BTH (%v)", c.Name, i+1, pkt.ErrorLayer())
				}
				continue
			}
			if perr != nil {
				t.Errorf("%s frame %d: gopacket decodes BTH, frame.Parse says %v", c.Name, i+1, perr)
				continue
			}
			total++
			g := l.(*BTH)
			where := func() string { return fmt.Sprintf("%s frame %d %v", c.Name, i+1, g.Opcode) }

			// Network and transport layers from gopacket's own decoders.
			var src, dst netip.Addr
			switch ip := pkt.NetworkLayer().(type) {
			case *layers.IPv4:
				src, dst = netip.AddrFrom4([4]byte(ip.SrcIP.To4())), netip.AddrFrom4([4]byte(ip.DstIP.To4()))
				if fi := f.IPv4(); fi == nil || fi.TTL() != ip.TTL || fi.TOS() != ip.TOS || fi.ID() != ip.Id ||
					fi.TotalLen() != ip.Length || fi.DF() != (ip.Flags&layers.IPv4DontFragment != 0) {
					t.Errorf("%s: IPv4 header fields differ", where())
				}
			case *layers.IPv6:
				src, dst = netip.AddrFrom16([16]byte(ip.SrcIP.To16())), netip.AddrFrom16([16]byte(ip.DstIP.To16()))
				if fi := f.IPv6(); fi == nil || fi.HopLimit() != ip.HopLimit || fi.TrafficClass() != ip.TrafficClass ||
					fi.FlowLabel() != ip.FlowLabel || fi.PayloadLen() != ip.Length {
					t.Errorf("%s: IPv6 header fields differ", where())
				}
			default:
				t.Fatalf("%s: no IP layer", where())
			}
			if src != f.Src() || dst != f.Dst() {
				t.Errorf("%s: addresses %v→%v vs %v→%v", where(), src, dst, f.Src(), f.Dst())
			}
			u := pkt.Layer(layers.LayerTypeUDP).(*layers.UDP)
			if uint16(u.SrcPort) != f.UDP().SrcPort() || u.Length != f.UDP().Length() || u.Checksum != f.UDP().Checksum() {
				t.Errorf("%s: UDP differs", where())
			}

			// Transport headers.
			if g.BTHFields != f.BTH().Fields() {
				t.Errorf("%s: BTH %+v vs %+v", where(), g.BTHFields, f.BTH().Fields())
			}
			if r := f.RETH(); (r == nil) != (g.RETH == nil) || r != nil && (*g.RETH != RETH{r.VA(), r.RKey(), r.DMALen()}) {
				t.Errorf("%s: RETH differs", where())
			}
			if a := f.AETH(); (a == nil) != (g.AETH == nil) || a != nil && (*g.AETH != AETH{a.Syndrome(), a.MSN()}) {
				t.Errorf("%s: AETH differs", where())
			}
			if d := f.DETH(); (d == nil) != (g.DETH == nil) || d != nil && (*g.DETH != DETH{d.QKey(), d.SrcQP()}) {
				t.Errorf("%s: DETH differs", where())
			}
			if x := f.ImmDt(); (x == nil) != (g.ImmDt == nil) || x != nil && *g.ImmDt != x.Imm() {
				t.Errorf("%s: ImmDt differs", where())
			}
			if x := f.AtomicETH(); (x == nil) != (g.Atomic == nil) ||
				x != nil && (*g.Atomic != AtomicETH{x.VA(), x.RKey(), x.SwapAdd(), x.Compare()}) {
				t.Errorf("%s: AtomicETH differs", where())
			}
			if x := f.AtomicAckETH(); (x == nil) != (g.AtomicAck == nil) || x != nil && *g.AtomicAck != x.Orig() {
				t.Errorf("%s: AtomicAckETH differs", where())
			}
			if !bytes.Equal(g.Payload, f.Payload()) || !bytes.Equal(g.Pad, f.Pad()) {
				t.Errorf("%s: payload/pad differ (%d/%d vs %d/%d)", where(), len(g.Payload), len(g.Pad), f.PayloadLen(), len(f.Pad()))
			}
			if len(g.Payload) > 0 {
				if pl := pkt.ApplicationLayer(); pl == nil || !bytes.Equal(pl.Payload(), g.Payload) {
					t.Errorf("%s: application layer is not the RoCE payload", where())
				}
			}
			ok, err := VerifyICRC(pkt)
			if err != nil || !ok || !f.VerifyICRC() {
				t.Errorf("%s: ICRC gopacket %v (%v), frame %v", where(), ok, err, f.VerifyICRC())
			}
		}
	}
	if total == 0 {
		t.Fatal("no RoCE frames cross-checked")
	}
	t.Logf("cross-checked %d RoCE frames against gopacket", total)
}

// TestDecodeBuiltFrames runs frames built by package frame, one per opcode,
// through gopacket.
func TestDecodeBuiltFrames(t *testing.T) {
	buf := make([]byte, 256)
	for op := 0; op < 256; op++ {
		o := bth.Opcode(op)
		if !o.Valid() {
			continue
		}
		s := frame.Spec{
			Src: netip.MustParseAddr("fd00::1"), Dst: netip.MustParseAddr("fd00::2"), VLAN: true, VLANTCI: 5,
			BTH:  bth.BTHFields{Opcode: o, PKey: 0xFFFF, DestQP: 0x11, PSN: 5},
			RETH: frame.RETHFields{VA: 1, RKey: 2, DMALen: 3}, AETH: frame.AETHFields{Syndrome: 0x1F, MSN: 4},
			DETH: frame.DETHFields{QKey: 6, SrcQP: 7}, Imm: 8, InvRKey: 9,
			Atomic: frame.AtomicFields{VA: 10, RKey: 11, SwapAdd: 12, Compare: 13}, AtomicOrig: 14,
			FlushPlace: 1, FlushSelect: 1,
		}
		var pay []byte
		if o.HasPayload() {
			pay = []byte{1, 2, 3, 4, 5}
		}
		n, err := frame.Build(buf, &s, pay)
		if err != nil {
			t.Fatal(err)
		}
		pkt := gopacket.NewPacket(buf[:n], layers.LayerTypeEthernet, gopacket.Default)
		l, _ := pkt.Layer(LayerTypeBTH).(*BTH)
		if l == nil {
			t.Fatalf("%v: not decoded: %v", o, pkt.ErrorLayer())
		}
		if l.Opcode != o || !bytes.Equal(l.Payload, pay) || len(l.Pad) != -len(pay)&3 {
			t.Errorf("%v: decoded %+v", o, l.BTHFields)
		}
		if o.Headers().Has(bth.ExtRETH) && (l.RETH == nil || l.RETH.DMALen != 3) ||
			o.Headers().Has(bth.ExtAETH) && (l.AETH == nil || l.AETH.MSN != 4 || l.AETH.Kind() != bth.KindACK || l.AETH.Code() != 31) ||
			o.Headers().Has(bth.ExtDETH) && (l.DETH == nil || l.DETH.SrcQP != 7) ||
			o.Headers().Has(bth.ExtImmDt) && (l.ImmDt == nil || *l.ImmDt != 8) ||
			o.Headers().Has(bth.ExtIETH) && (l.IETH == nil || *l.IETH != 9) ||
			o.Headers().Has(bth.ExtAtomicETH) && (l.Atomic == nil || l.Atomic.Compare != 13) ||
			o.Headers().Has(bth.ExtAtomicAckETH) && (l.AtomicAck == nil || *l.AtomicAck != 14) ||
			o.Headers().Has(bth.ExtFETH) && (l.FETH == nil || l.FETH.Selectivity != 1) {
			t.Errorf("%v: extended headers wrong", o)
		}
		if ok, err := VerifyICRC(pkt); !ok || err != nil {
			t.Errorf("%v: ICRC %v %v", o, ok, err)
		}
		buf[n-1] ^= 1
		if ok, _ := VerifyICRC(gopacket.NewPacket(buf[:n], layers.LayerTypeEthernet, gopacket.Default)); ok {
			t.Errorf("%v: corrupted ICRC verifies", o)
		}
	}
}

func TestDecodeErrors(t *testing.T) {
	var b BTH
	df := gopacket.NilDecodeFeedback
	good := []byte{byte(bth.RCAcknowledge), 0, 0xff, 0xff, 0, 0, 0, 0x11, 0, 0, 0, 1, 0x1f, 0, 0, 1, 0, 0, 0, 0}
	if err := b.DecodeFromBytes(good, df); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		p    []byte
	}{
		{"short", good[:10]},
		{"headers", good[:14]},
		{"opcode", append([]byte{0x40}, good[1:]...)},
		{"tver", append([]byte{0x11, 0x01}, good[2:]...)},
		{"pad", append([]byte{0x11, 0x30}, good[2:]...)},
	} {
		if err := b.DecodeFromBytes(c.p, df); err == nil {
			t.Errorf("%s: decoded", c.name)
		}
	}
}

package proto

import (
	"bytes"
	"errors"
	"net/netip"
	"testing"

	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/verbs"
)

func TestSendWRRoundTrip(t *testing.T) {
	caps := ib.QPCaps{MaxSendSGE: 3, MaxInline: 100}
	slot := make([]byte, SendSlotSize(caps))
	cases := []struct {
		w  verbs.SendWR
		ah Handle
		ud bool
	}{
		{verbs.SendWR{ID: 1, Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: []ib.SGE{{Addr: 1, Length: 2, LKey: 3}, {Addr: 4, Length: 5, LKey: 6}}, RemoteAddr: 0xdead0000, RKey: 77}, 0, false},
		{verbs.SendWR{ID: 2, Opcode: ib.SendWithImm, Flags: ib.Solicited, SG: []ib.SGE{{Addr: 9, Length: 10, LKey: 11}}, Imm: 0x12345678}, 0, false},
		{verbs.SendWR{ID: 3, Opcode: ib.SendWithInv, SG: []ib.SGE{}, InvRKey: 0x99}, 0, false},
		{verbs.SendWR{ID: 4, Opcode: ib.AtomicCmpAndSwp, SG: []ib.SGE{{Addr: 8, Length: 8, LKey: 1}}, RemoteAddr: 64, RKey: 5, CompareAdd: 1, Swap: 2}, 0, false},
		{verbs.SendWR{ID: 5, Opcode: ib.RDMAWrite, Flags: ib.Inline | ib.Signaled, InlineData: []byte("hello inline"), RemoteAddr: 8, RKey: 9}, 0, false},
		{verbs.SendWR{ID: 6, Opcode: ib.Send, SG: []ib.SGE{{Addr: 1, Length: 1, LKey: 1}}, RemoteQPN: 0x11, RemoteQKey: 0x11111111}, 7, true},
	}
	for _, c := range cases {
		if err := PutSendWR(slot, &c.w, c.ah); err != nil {
			t.Fatal(err)
		}
		got := verbs.SendWR{SG: make([]ib.SGE, 0, 3)}
		ah, err := GetSendWR(slot, &got, c.ud)
		if err != nil {
			t.Fatal(err)
		}
		if got.ID != c.w.ID || got.Opcode != c.w.Opcode || got.Flags != c.w.Flags || got.Imm != c.w.Imm ||
			got.InvRKey != c.w.InvRKey || got.RemoteAddr != c.w.RemoteAddr || got.RKey != c.w.RKey ||
			got.CompareAdd != c.w.CompareAdd || got.Swap != c.w.Swap || got.RemoteQPN != c.w.RemoteQPN ||
			got.RemoteQKey != c.w.RemoteQKey || ah != c.ah || !bytes.Equal(got.InlineData, c.w.InlineData) || len(got.SG) != len(c.w.SG) {
			t.Fatalf("round trip:\n got %+v\nwant %+v", got, c.w)
		}
		for i := range got.SG {
			if got.SG[i] != c.w.SG[i] {
				t.Fatalf("SGE %d: %+v", i, got.SG[i])
			}
		}
	}
	if err := PutSendWR(make([]byte, SendSlotSize(ib.QPCaps{MaxSendSGE: 3})), &verbs.SendWR{SG: make([]ib.SGE, 4)}, 0); err == nil {
		t.Fatal("4 SGEs fit a 3-SGE slot")
	}
	if err := PutSendWR(slot, &verbs.SendWR{Flags: ib.Inline, InlineData: make([]byte, 200)}, 0); err == nil {
		t.Fatal("200 inline bytes fit a 100-byte slot")
	}
}

func TestRecvAndWCRoundTrip(t *testing.T) {
	slot := make([]byte, RecvSlotSize(ib.QPCaps{MaxRecvSGE: 2}))
	w := verbs.RecvWR{ID: 42, SG: []ib.SGE{{Addr: 1, Length: 2, LKey: 3}, {Addr: 4, Length: 5, LKey: 6}}}
	if err := PutRecvWR(slot, &w); err != nil {
		t.Fatal(err)
	}
	var got verbs.RecvWR
	if err := GetRecvWR(slot, &got); err != nil || got.ID != 42 || len(got.SG) != 2 || got.SG[1] != w.SG[1] {
		t.Fatalf("%+v %v", got, err)
	}
	cqe := make([]byte, CQESize)
	for _, c := range []ib.WC{
		{ID: 1, Status: ib.RemAccessErr, Opcode: ib.WCRDMAWrite, ByteLen: 64, QPN: 0x11},
		{ID: 2, Opcode: ib.WCRecv, Flags: ib.WCWithImm | ib.WCGRH, Imm: 7, SrcQP: 0x22, IsRecv: true, SrcIP: netip.MustParseAddr("10.77.0.10")},
		{ID: 3, Opcode: ib.WCRecv, IsRecv: true, SrcIP: netip.MustParseAddr("fd77::11"), InvRKey: 9},
	} {
		PutWC(cqe, &c)
		var g ib.WC
		GetWC(cqe, &g)
		if g != c {
			t.Fatalf("WC round trip: %+v, want %+v", g, c)
		}
	}
}

func TestHostileSlots(t *testing.T) {
	slot := make([]byte, SendSlotSize(ib.QPCaps{MaxSendSGE: 1}))
	for i := range slot {
		slot[i] = 0xff
	}
	var w verbs.SendWR
	if _, err := GetSendWR(slot, &w, false); !errors.Is(err, ErrBadMessage) {
		t.Fatalf("opcode 255: %v", err)
	}
	slot[8] = byte(ib.Send)
	if _, err := GetSendWR(slot, &w, false); !errors.Is(err, ErrBadMessage) {
		t.Fatalf("inline length beyond the slot: %v", err)
	}
	slot[9] = 0 // not inline: 255 SGEs in a 1-SGE slot
	if _, err := GetSendWR(slot, &w, false); !errors.Is(err, ErrBadMessage) {
		t.Fatalf("SGE count beyond the slot: %v", err)
	}
	if _, err := GetSendWR(slot[:10], &w, false); err == nil {
		t.Fatal("short slot accepted")
	}
	r := make([]byte, RecvSlotSize(ib.QPCaps{MaxRecvSGE: 1}))
	r[8] = 2
	var rw verbs.RecvWR
	if err := GetRecvWR(r, &rw); err == nil {
		t.Fatal("2 SGEs in a 1-SGE receive slot")
	}
}

func TestMessageCodec(t *testing.T) {
	msg, err := Encode(nil, Header{Op: OpRegMR, Version: Version, Seq: 9}, &RegMRReq{PD: 1, Access: ib.LocalWrite, Length: 4096, IOVA: 0x1000})
	if err != nil {
		t.Fatal(err)
	}
	h, body, err := DecodeHeader(msg)
	if err != nil || h.Op != OpRegMR || h.Seq != 9 || h.Version != Version {
		t.Fatalf("%+v %v", h, err)
	}
	var req RegMRReq
	if err := DecodeBody(body, &req); err != nil || req.Length != 4096 || req.IOVA != 0x1000 {
		t.Fatalf("%+v %v", req, err)
	}
	if err := DecodeBody(body[:len(body)-1], &req); !errors.Is(err, ErrBadMessage) {
		t.Fatal("short body accepted")
	}
	if _, _, err := DecodeHeader(msg[:5]); !errors.Is(err, ErrBadMessage) {
		t.Fatal("short header accepted")
	}
	if _, err := Encode(nil, Header{}, make([]byte, MaxMessage)); err == nil {
		t.Fatal("oversized message encoded")
	}
}

// The daemon decodes slots and messages written by clients it does not
// trust: nothing may panic or read outside the slot.
func FuzzGetSendWR(f *testing.F) {
	slot := make([]byte, SendSlotSize(ib.QPCaps{MaxSendSGE: 2, MaxInline: 32}))
	if err := PutSendWR(slot, &verbs.SendWR{ID: 1, Opcode: ib.RDMAWrite, SG: []ib.SGE{{Addr: 1, Length: 2, LKey: 3}}}, 0); err != nil {
		f.Fatal(err)
	}
	f.Add(slot, false)
	f.Fuzz(func(t *testing.T, s []byte, ud bool) {
		w := verbs.SendWR{SG: make([]ib.SGE, 0, 2)}
		if _, err := GetSendWR(s, &w, ud); err == nil {
			if w.Flags&ib.Inline != 0 && len(w.InlineData) > len(s) {
				t.Fatal("inline beyond the slot")
			}
		}
		// Refusing the bytes is fine; panicking or reading outside them
		// is not.
		var r verbs.RecvWR
		_ = GetRecvWR(s, &r)
		if h, body, err := DecodeHeader(s); err == nil {
			var q CreateQPReq
			_ = DecodeBody(body, &q)
			_ = h
		}
	})
}

package proto

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/verbs"
)

// The slot declarations and the codec agree byte for byte.
func TestSlotDeclarations(t *testing.T) {
	if binary.Size(SendSlot{}) != sendHeader || binary.Size(SendSlotUD{}) != sendHeader ||
		binary.Size(RecvSlot{}) != recvHeader || binary.Size(CQE{}) != CQESize || binary.Size(ib.SGE{}) != sgeSize {
		t.Fatalf("sizes: send %d, UD %d, recv %d, CQE %d, SGE %d", binary.Size(SendSlot{}), binary.Size(SendSlotUD{}),
			binary.Size(RecvSlot{}), binary.Size(CQE{}), binary.Size(ib.SGE{}))
	}
	decode := func(b []byte, v any) {
		t.Helper()
		if err := binary.Read(bytes.NewReader(b), binary.LittleEndian, v); err != nil {
			t.Fatal(err)
		}
	}

	slot := make([]byte, SendSlotSize(ib.QPCaps{MaxSendSGE: 2, MaxInline: 64}))
	w := verbs.SendWR{ID: 7, Opcode: ib.AtomicCmpAndSwp, Flags: ib.Signaled | ib.Fence, SG: []ib.SGE{{Addr: 1, Length: 2, LKey: 3}, {Addr: 4, Length: 5, LKey: 6}},
		RemoteAddr: 0x1122, RKey: 9, CompareAdd: 10, Swap: 11, Imm: 12}
	if err := PutSendWR(slot, &w, 0); err != nil {
		t.Fatal(err)
	}
	var s SendSlot
	decode(slot, &s)
	if s.ID != 7 || s.Opcode != uint8(ib.AtomicCmpAndSwp) || s.Flags != uint8(w.Flags) || s.NumSGE != 2 || s.Imm != 12 ||
		s.RemoteAddr != 0x1122 || s.RKey != 9 || s.InlineLen != 0 || s.CompareAdd != 10 || s.Swap != 11 {
		t.Fatalf("send slot %+v", s)
	}
	var sg [2]ib.SGE
	decode(slot[SendSlotHeader:], &sg)
	if sg[0] != w.SG[0] || sg[1] != w.SG[1] {
		t.Fatalf("SGEs %+v", sg)
	}

	u := verbs.SendWR{ID: 8, Opcode: ib.SendWithImm, Flags: ib.Inline, InlineData: []byte("hello"), Imm: 13, RemoteQPN: 14, RemoteQKey: 15}
	if err := PutSendWR(slot, &u, 16); err != nil {
		t.Fatal(err)
	}
	var d SendSlotUD
	decode(slot, &d)
	if d.ID != 8 || d.Opcode != uint8(ib.SendWithImm) || d.Imm != 13 || d.InlineLen != 5 || d.RemoteQPN != 14 || d.QKey != 15 ||
		d.AH != 16 || string(slot[SendSlotHeader:SendSlotHeader+5]) != "hello" {
		t.Fatalf("UD send slot %+v", d)
	}

	rslot := make([]byte, RecvSlotSize(ib.QPCaps{MaxRecvSGE: 1}))
	if err := PutRecvWR(rslot, &verbs.RecvWR{ID: 16, SG: []ib.SGE{{Addr: 17, Length: 18, LKey: 19}}}); err != nil {
		t.Fatal(err)
	}
	var r RecvSlot
	decode(rslot, &r)
	var rs ib.SGE
	decode(rslot[RecvSlotHeader:], &rs)
	if r.ID != 16 || r.NumSGE != 1 || rs != (ib.SGE{Addr: 17, Length: 18, LKey: 19}) {
		t.Fatalf("recv slot %+v %+v", r, rs)
	}

	cslot := make([]byte, CQESize)
	PutWC(cslot, &ib.WC{ID: 20, Status: ib.RemAccessErr, Opcode: ib.WCRecvRDMAWithImm, Flags: ib.WCWithImm | ib.WCGRH,
		ByteLen: 21, Imm: 22, InvRKey: 23, QPN: 24, SrcQP: 25, IsRecv: true, SrcIP: netip.MustParseAddr("192.0.2.9")})
	var c CQE
	decode(cslot, &c)
	if c.ID != 20 || c.Status != uint8(ib.RemAccessErr) || c.Opcode != uint8(ib.WCRecvRDMAWithImm) ||
		c.Flags != uint8(ib.WCWithImm|ib.WCGRH) || c.IsRecv != 1 || c.ByteLen != 21 || c.Imm != 22 || c.InvRKey != 23 ||
		c.QPN != 24 || c.SrcQP != 25 || c.SrcIP != netip.MustParseAddr("::ffff:192.0.2.9").As16() {
		t.Fatalf("CQE %+v", c)
	}
}

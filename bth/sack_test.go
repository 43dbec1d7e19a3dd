package bth_test

import (
	"testing"

	"github.com/softrnic/softrnic/bth"
)

// TestSRBit: the selective-repeat bit is bit 6 of byte 8, between AckReq
// and the PSN, and setting it changes nothing else.
func TestSRBit(t *testing.T) {
	b := bth.BTH(make([]byte, bth.BTHLen))
	b.Encode(&bth.BTHFields{Opcode: bth.RCSendOnly, PKey: 0xFFFF, DestQP: 0xA00011, AckReq: true, PSN: 0xFFFFFF})
	before := b.Fields()
	b.SetSR(true)
	if !b.SR() || b[8] != 0xC0 || b.Fields() != before {
		t.Fatalf("byte 8 %#x, fields %+v", b[8], b.Fields())
	}
	b.SetSR(false)
	if b.SR() || b[8] != 0x80 {
		t.Fatalf("cleared: byte 8 %#x", b[8])
	}
	// Encode leaves it clear: IBA senders transmit Resv7 as zero.
	b.SetSR(true)
	b.Encode(&before)
	if b.SR() {
		t.Fatal("Encode kept the SR bit")
	}
}

func TestSACKETH(t *testing.T) {
	s := bth.SACKETH(make([]byte, bth.SACKLen(2)))
	base := bth.PSN(bth.PSNMask - 3) // the bitmap crosses the PSN wrap
	s.SetHeader(2, base, 300)
	s.SetWord(0, 0x80000001)
	s.SetWord(1, 0x40000000)
	if !s.Valid() || s.Words() != 2 || s.Base() != base || s.Window() != 300 {
		t.Fatalf("header: valid %v words %d base %d window %d", s.Valid(), s.Words(), s.Base(), s.Window())
	}
	if s[4] != 0x01 || s[5] != 0x2C || s[6] != 0 || s[7] != 0 {
		t.Fatalf("window bytes % x", s[4:8])
	}
	for i, want := range map[uint32]bool{0: true, 1: false, 31: true, 32: false, 33: true, 63: false, 64: false} {
		if s.Has(base.Add(i)) != want {
			t.Errorf("Has(base+%d) = %v", i, !want)
		}
	}
	if s.Has(base.Prev()) {
		t.Error("a PSN before the base is marked")
	}
	if bth.SACKETH(s[:7]).Valid() || bth.SACKETH(append(s, 0, 0, 0, 0)).Valid() {
		t.Error("a SACKETH whose length disagrees with its word count is valid")
	}
	big := bth.SACKETH(make([]byte, bth.SACKLen(bth.MaxSACKWords+1)))
	big.SetHeader(bth.MaxSACKWords+1, 0, 0)
	if big.Valid() {
		t.Error("more than MaxSACKWords words is valid")
	}
	if n := testing.AllocsPerRun(100, func() { _ = s.Has(base.Add(33)) && s.Valid() }); n != 0 {
		t.Fatalf("%v allocations", n)
	}
}

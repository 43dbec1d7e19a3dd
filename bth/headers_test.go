package bth

import (
	"bytes"
	"testing"
	"time"
)

// cnpBTH is the BTH of the ConnectX-4 Lx CNP vector (../shared/vectors/README.md).
var cnpBTH = []byte{0x81, 0x00, 0xff, 0xff, 0x40, 0x00, 0x01, 0x18, 0x00, 0x00, 0x00, 0x00}

func TestBTHDecodeCNP(t *testing.T) {
	b := BTH(cnpBTH)
	if b.Opcode() != CNP || b.SE() || b.MigReq() || b.PadCount() != 0 || b.TVer() != 0 ||
		b.PKey() != 0xFFFF || b.FECN() || !b.BECN() || b.DestQP() != 0x118 || b.AckReq() || b.PSN() != 0 {
		t.Fatalf("CNP BTH decoded as %+v", b.Fields())
	}
	out := make(BTH, BTHLen)
	f := b.Fields()
	out.Encode(&f)
	if !bytes.Equal(out, cnpBTH) {
		t.Fatalf("re-encoded % x, want % x", []byte(out), cnpBTH)
	}
}

func TestBTHFieldsRoundTrip(t *testing.T) {
	f := BTHFields{Opcode: RCRDMAWriteLastImm, SE: true, MigReq: true, PadCount: 3, TVer: 0,
		PKey: 0x8001, FECN: true, BECN: false, DestQP: 0xABCDEF, AckReq: true, PSN: 0xFEDCBA}
	b := make(BTH, BTHLen)
	b.Encode(&f)
	want := []byte{0x09, 0xF0, 0x80, 0x01, 0x80, 0xAB, 0xCD, 0xEF, 0x80, 0xFE, 0xDC, 0xBA}
	if !bytes.Equal(b, want) {
		t.Fatalf("encoded % x, want % x", []byte(b), want)
	}
	if got := b.Fields(); got != f {
		t.Fatalf("decoded %+v, want %+v", got, f)
	}
	// Each setter touches only its own field.
	b.SetSE(false)
	b.SetMigReq(false)
	b.SetPadCount(1)
	b.SetTVer(5)
	b.SetPKey(0xFFFF)
	b.SetFECN(false)
	b.SetBECN(true)
	b.SetDestQP(0x000011)
	b.SetAckReq(false)
	b.SetPSN(0x000001)
	b.SetOpcode(RCAcknowledge)
	want2 := []byte{0x11, 0x15, 0xFF, 0xFF, 0x40, 0x00, 0x00, 0x11, 0x00, 0x00, 0x00, 0x01}
	if !bytes.Equal(b, want2) {
		t.Fatalf("after setters % x, want % x", []byte(b), want2)
	}
	// Oversized inputs are masked to their field, never spill into neighbours.
	b.Encode(&BTHFields{DestQP: 0xFF000001, PSN: 0xFF000002, PadCount: 7, TVer: 0xFF})
	if b[4] != 0 || b[8] != 0 || b.DestQP() != 1 || b.PSN() != 2 || b.PadCount() != 3 || b.TVer() != 15 || b[1]&0xC0 != 0 {
		t.Fatalf("masking failed: % x", []byte(b))
	}
}

func TestExtendedHeaders(t *testing.T) {
	buf := make([]byte, 64)

	r := RETH(buf[:RETHLen])
	r.Encode(0x0102030405060708, 0x11223344, 0x1000)
	if r.VA() != 0x0102030405060708 || r.RKey() != 0x11223344 || r.DMALen() != 0x1000 {
		t.Error("RETH round trip")
	}
	if !bytes.Equal(buf[:16], []byte{1, 2, 3, 4, 5, 6, 7, 8, 0x11, 0x22, 0x33, 0x44, 0, 0, 0x10, 0}) {
		t.Errorf("RETH bytes % x", buf[:16])
	}

	d := DETH(buf[:DETHLen])
	d.Encode(0x11111111, 0xFF000123)
	if d.QKey() != 0x11111111 || d.SrcQP() != 0x123 || buf[4] != 0 {
		t.Errorf("DETH % x", buf[:8])
	}

	ImmDt(buf[:4]).SetImm(0xDEADBEEF)
	if ImmDt(buf[:4]).Imm() != 0xDEADBEEF || buf[0] != 0xDE {
		t.Error("ImmDt")
	}
	IETH(buf[:4]).SetRKey(0xCAFE0001)
	if IETH(buf[:4]).RKey() != 0xCAFE0001 || buf[3] != 1 {
		t.Error("IETH")
	}

	a := AtomicETH(buf[:AtomicETHLen])
	a.Encode(0x1000, 0x42, 7, 9)
	if a.VA() != 0x1000 || a.RKey() != 0x42 || a.SwapAdd() != 7 || a.Compare() != 9 || buf[19] != 7 || buf[27] != 9 {
		t.Errorf("AtomicETH % x", buf[:28])
	}
	AtomicAckETH(buf[:8]).SetOrig(0x8877665544332211)
	if AtomicAckETH(buf[:8]).Orig() != 0x8877665544332211 || buf[0] != 0x88 {
		t.Error("AtomicAckETH")
	}
	f := FETH(buf[:4])
	f.Encode(2, 1)
	if f.PlacementType() != 2 || f.Selectivity() != 1 || !bytes.Equal(buf[:4], []byte{0, 0, 0, 0x12}) {
		t.Errorf("FETH % x", buf[:4])
	}
}

func TestAETH(t *testing.T) {
	a := make(AETH, AETHLen)
	// rxe's ACK: syndrome 0x1F (unlimited credits) and the MSN.
	a.EncodeACK(CreditUnlimited, 0x123456)
	if a.Syndrome() != 0x1F || a.Kind() != KindACK || a.CreditCode() != 31 || a.MSN() != 0x123456 {
		t.Errorf("ACK % x", []byte(a))
	}
	// The rnr_nak.pcap RNR NAK: 0x2c = timer code 12 = 0.64 ms.
	a.EncodeRNRNAK(12, 5)
	if a.Syndrome() != 0x2C || a.Kind() != KindRNRNAK || a.RNRTimer() != 12 || a.Code() != 12 ||
		RNRTimeout(a.RNRTimer()) != 640*time.Microsecond || RNRTimeoutMicros(a.RNRTimer()) != 640 {
		t.Errorf("RNR NAK % x", []byte(a))
	}
	// PSN sequence error NAK: 0x60.
	for code := NAKPSNSequenceError; code <= NAKInvalidRDRequest; code++ {
		a.EncodeNAK(code, 0xFFFFFFFF)
		if a.Syndrome() != 0x60|uint8(code) || a.Kind() != KindNAK || a.NAKCode() != code || a.MSN() != 0xFFFFFF {
			t.Errorf("NAK %v: % x", code, []byte(a))
		}
	}
	if NAKRemoteAccessError.String() != "REMOTE_ACCESS_ERROR" || NAKCode(9).String() != "RESERVED" {
		t.Error("NAK names")
	}
	if KindRNRNAK.String() != "RNR_NAK" || AckKind(2).String() != "RESERVED" {
		t.Error("kind names")
	}
}

func TestRNRTimerTable(t *testing.T) {
	spot := map[uint8]time.Duration{0: 655360 * time.Microsecond, 1: 10 * time.Microsecond,
		12: 640 * time.Microsecond, 25: 61440 * time.Microsecond, 31: 491520 * time.Microsecond}
	for c, d := range spot {
		if RNRTimeout(c) != d {
			t.Errorf("RNRTimeout(%d) = %v, want %v", c, RNRTimeout(c), d)
		}
	}
	for c := uint8(1); c < 31; c++ {
		if RNRTimeout(c) >= RNRTimeout(c+1) {
			t.Errorf("table not increasing at %d", c)
		}
		// Every table entry maps back to its own code, and one ns more to the next.
		if RNRTimerCode(RNRTimeout(c)) != c {
			t.Errorf("RNRTimerCode(%v) = %d, want %d", RNRTimeout(c), RNRTimerCode(RNRTimeout(c)), c)
		}
		if RNRTimerCode(RNRTimeout(c)+1) != c+1 {
			t.Errorf("RNRTimerCode(%v+1ns) = %d", RNRTimeout(c), RNRTimerCode(RNRTimeout(c)+1))
		}
	}
	if RNRTimerCode(0) != 1 || RNRTimerCode(500*time.Millisecond) != 0 || RNRTimerCode(time.Hour) != 0 {
		t.Error("RNRTimerCode extremes")
	}
}

func TestCredits(t *testing.T) {
	if n, u := Credits(31); !u || n != 0 {
		t.Error("code 31 must be unlimited")
	}
	if n, _ := Credits(5); n != 6 {
		t.Errorf("Credits(5) = %d", n)
	}
	if n, _ := Credits(30); n != 32768 {
		t.Errorf("Credits(30) = %d", n)
	}
	for _, c := range []struct{ n, code int }{{0, 0}, {1, 1}, {5, 4}, {6, 5}, {7, 5}, {100, 13}, {1 << 20, 30}} {
		if got := CreditCode(c.n); int(got) != c.code {
			t.Errorf("CreditCode(%d) = %d, want %d", c.n, got, c.code)
		}
	}
}

func TestViewsDoNotAllocate(t *testing.T) {
	buf := make([]byte, 64)
	f := BTHFields{Opcode: RCSendOnly, PKey: DefaultPKey, DestQP: 0x11, PSN: 1}
	var sink uint64
	n := testing.AllocsPerRun(100, func() {
		b := BTH(buf)
		b.Encode(&f)
		sink += uint64(b.PSN()) + uint64(b.DestQP()) + uint64(b.Opcode().HeaderLen())
		AETH(buf[12:]).EncodeACK(31, 7)
		sink += uint64(AETH(buf[12:]).MSN())
		RETH(buf[16:]).Encode(1, 2, 3)
		sink += RETH(buf[16:]).VA()
	})
	if n != 0 {
		t.Fatalf("views allocate %v times per run", n)
	}
	_ = sink
}

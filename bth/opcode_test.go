package bth

import (
	"strings"
	"testing"
)

// wantLayout is the header layout of every opcode, written out by hand from
// IBA Table 38 / rxe_opcode.c so that the generated table is checked against
// an independent statement, not against itself.
var wantLayout = map[Opcode]struct {
	name    string
	hdrLen  int
	payload bool
}{
	RCSendFirst: {"RC_SEND_FIRST", 12, true}, RCSendMiddle: {"RC_SEND_MIDDLE", 12, true},
	RCSendLast: {"RC_SEND_LAST", 12, true}, RCSendLastImm: {"RC_SEND_LAST_WITH_IMMEDIATE", 16, true},
	RCSendOnly: {"RC_SEND_ONLY", 12, true}, RCSendOnlyImm: {"RC_SEND_ONLY_WITH_IMMEDIATE", 16, true},
	RCRDMAWriteFirst: {"RC_RDMA_WRITE_FIRST", 28, true}, RCRDMAWriteMiddle: {"RC_RDMA_WRITE_MIDDLE", 12, true},
	RCRDMAWriteLast: {"RC_RDMA_WRITE_LAST", 12, true}, RCRDMAWriteLastImm: {"RC_RDMA_WRITE_LAST_WITH_IMMEDIATE", 16, true},
	RCRDMAWriteOnly: {"RC_RDMA_WRITE_ONLY", 28, true}, RCRDMAWriteOnlyImm: {"RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", 32, true},
	RCRDMAReadRequest:        {"RC_RDMA_READ_REQUEST", 28, false},
	RCRDMAReadResponseFirst:  {"RC_RDMA_READ_RESPONSE_FIRST", 16, true},
	RCRDMAReadResponseMiddle: {"RC_RDMA_READ_RESPONSE_MIDDLE", 12, true},
	RCRDMAReadResponseLast:   {"RC_RDMA_READ_RESPONSE_LAST", 16, true},
	RCRDMAReadResponseOnly:   {"RC_RDMA_READ_RESPONSE_ONLY", 16, true},
	RCAcknowledge:            {"RC_ACKNOWLEDGE", 16, false},
	RCAtomicAcknowledge:      {"RC_ATOMIC_ACKNOWLEDGE", 24, false},
	RCCompareSwap:            {"RC_COMPARE_SWAP", 40, false},
	RCFetchAdd:               {"RC_FETCH_ADD", 40, false},
	RCSendLastInv:            {"RC_SEND_LAST_WITH_INVALIDATE", 16, true},
	RCSendOnlyInv:            {"RC_SEND_ONLY_WITH_INVALIDATE", 16, true},
	RCFlush:                  {"RC_FLUSH", 32, false},
	RCAtomicWrite:            {"RC_ATOMIC_WRITE", 28, true},
	UCSendFirst:              {"UC_SEND_FIRST", 12, true}, UCSendMiddle: {"UC_SEND_MIDDLE", 12, true},
	UCSendLast: {"UC_SEND_LAST", 12, true}, UCSendLastImm: {"UC_SEND_LAST_WITH_IMMEDIATE", 16, true},
	UCSendOnly: {"UC_SEND_ONLY", 12, true}, UCSendOnlyImm: {"UC_SEND_ONLY_WITH_IMMEDIATE", 16, true},
	UCRDMAWriteFirst: {"UC_RDMA_WRITE_FIRST", 28, true}, UCRDMAWriteMiddle: {"UC_RDMA_WRITE_MIDDLE", 12, true},
	UCRDMAWriteLast: {"UC_RDMA_WRITE_LAST", 12, true}, UCRDMAWriteLastImm: {"UC_RDMA_WRITE_LAST_WITH_IMMEDIATE", 16, true},
	UCRDMAWriteOnly: {"UC_RDMA_WRITE_ONLY", 28, true}, UCRDMAWriteOnlyImm: {"UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", 32, true},
	UDSendOnly: {"UD_SEND_ONLY", 20, true}, UDSendOnlyImm: {"UD_SEND_ONLY_WITH_IMMEDIATE", 24, true},
	CNP: {"CNP", 28, false},
}

func TestOpcodeTable(t *testing.T) {
	for op := 0; op < 256; op++ {
		o := Opcode(op)
		w, known := wantLayout[o]
		if o.Valid() != known {
			t.Errorf("%#02x Valid = %v, want %v", op, o.Valid(), known)
			continue
		}
		if !known {
			if o.HeaderLen() != 0 || o.Headers() != 0 || o.HasPayload() {
				t.Errorf("unknown %#02x has a layout", op)
			}
			if !strings.HasPrefix(o.String(), "OPCODE_0x") {
				t.Errorf("unknown %#02x named %q", op, o.String())
			}
			continue
		}
		if o.String() != w.name {
			t.Errorf("%#02x String = %q, want %q", op, o.String(), w.name)
		}
		if o.HeaderLen() != w.hdrLen {
			t.Errorf("%v HeaderLen = %d, want %d", o, o.HeaderLen(), w.hdrLen)
		}
		if o.HeaderLen() != BTHLen+o.Headers().Len() {
			t.Errorf("%v HeaderLen %d disagrees with Headers %v", o, o.HeaderLen(), o.Headers())
		}
		if o.HasPayload() != w.payload {
			t.Errorf("%v HasPayload = %v", o, o.HasPayload())
		}
		if !strings.HasPrefix(w.name, o.Transport().String()) {
			t.Errorf("%v Transport = %v", o, o.Transport())
		}
		// Exactly one of the position classes for multi-packet opcodes.
		n := 0
		for _, b := range []bool{o.IsFirst(), o.IsMiddle(), o.IsLast(), o.IsOnly()} {
			if b {
				n++
			}
		}
		if (o.IsSend() || o.IsWrite() || o.IsReadResponse()) && n != 1 {
			t.Errorf("%v has %d position classes", o, n)
		}
		if o.HasImm() != strings.Contains(w.name, "IMMEDIATE") {
			t.Errorf("%v HasImm = %v", o, o.HasImm())
		}
		if o.HasImm() != o.Headers().Has(ExtImmDt) || o.HasInv() != o.Headers().Has(ExtIETH) {
			t.Errorf("%v imm/inv flags disagree with headers %v", o, o.Headers())
		}
		if o.IsRequest() == o.IsResponse() && !o.IsCNP() {
			t.Errorf("%v is both or neither request and response", o)
		}
		// Headers are laid out back to back from the end of the BTH.
		end := BTHLen
		for off := BTHLen; off < o.HeaderLen(); {
			found := false
			for i := 0; i < numExt; i++ {
				h := Ext(1 << i)
				if o.Offset(h) == off {
					off += int(extLens[i])
					end = off
					found = true
				}
			}
			if !found {
				t.Fatalf("%v: no header at offset %d", o, off)
			}
		}
		if end != o.HeaderLen() {
			t.Errorf("%v: headers end at %d", o, end)
		}
	}
}

func TestOpcodeSpecifics(t *testing.T) {
	// FLUSH carries FETH before RETH (rxe_opcode.c, IBA 1.5 oA19-2).
	if RCFlush.Offset(ExtFETH) != 12 || RCFlush.Offset(ExtRETH) != 16 {
		t.Errorf("FLUSH offsets FETH %d RETH %d", RCFlush.Offset(ExtFETH), RCFlush.Offset(ExtRETH))
	}
	// UD with immediate: DETH then ImmDt.
	if UDSendOnlyImm.Offset(ExtDETH) != 12 || UDSendOnlyImm.Offset(ExtImmDt) != 20 {
		t.Error("UD_SEND_ONLY_WITH_IMMEDIATE offsets")
	}
	// WRITE_ONLY_IMM: RETH then ImmDt.
	if RCRDMAWriteOnlyImm.Offset(ExtRETH) != 12 || RCRDMAWriteOnlyImm.Offset(ExtImmDt) != 28 {
		t.Error("RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE offsets")
	}
	if RCAtomicAcknowledge.Offset(ExtAETH) != 12 || RCAtomicAcknowledge.Offset(ExtAtomicAckETH) != 16 {
		t.Error("ATOMIC_ACKNOWLEDGE offsets")
	}
	if RCSendOnly.Offset(ExtRETH) != -1 {
		t.Error("SEND_ONLY has a RETH")
	}
	if CNP.Transport() != TransportCNP || UDSendOnly.Transport() != TransportUD || UCSendOnly.Transport() != TransportUC {
		t.Error("transport classes")
	}
	if Opcode(0x80).Valid() {
		t.Error("Linux's IB_OPCODE_CNP 0x80 must not be taken for the RoCEv2 CNP")
	}
	if !RCRDMAReadRequest.StartsMessage() || !RCRDMAReadRequest.EndsMessage() || RCRDMAWriteMiddle.StartsMessage() {
		t.Error("message boundaries")
	}
	if RCSendFirst.EndsMessage() || !RCSendLastInv.EndsMessage() || !RCFetchAdd.EndsMessage() {
		t.Error("message ends")
	}
	if got := (ExtRETH | ExtImmDt).String(); got != "RETH|ImmDt" {
		t.Errorf("Ext.String = %q", got)
	}
	if Opcode(0x42).String() != "OPCODE_0x42" {
		t.Errorf("unknown name %q", Opcode(0x42).String())
	}
}

func BenchmarkOpcodeQueries(b *testing.B) {
	ops := []Opcode{RCRDMAWriteFirst, RCAcknowledge, UDSendOnly, 0x42}
	n := 0
	for i := 0; i < b.N; i++ {
		o := ops[i&3]
		n += o.HeaderLen()
		if o.IsFirst() {
			n++
		}
	}
	_ = n
}

func TestFollows(t *testing.T) {
	ok := []struct{ prev, next Opcode }{
		{RCSendFirst, RCSendMiddle}, {RCSendMiddle, RCSendMiddle}, {RCSendMiddle, RCSendLastImm},
		{RCSendFirst, RCSendLastInv}, {RCRDMAWriteFirst, RCRDMAWriteLast}, {RCRDMAWriteMiddle, RCRDMAWriteLastImm},
		{RCRDMAReadResponseFirst, RCRDMAReadResponseMiddle}, {RCRDMAReadResponseMiddle, RCRDMAReadResponseLast},
		{UCSendFirst, UCSendLast}, {RCSendLast, RCRDMAWriteFirst}, {RCSendOnly, RCRDMAReadRequest},
		{RCRDMAWriteOnly, RCFetchAdd}, {RCFetchAdd, RCSendFirst}, {RCRDMAReadRequest, RCFlush},
		{RCAcknowledge, RCSendOnly}, {UDSendOnly, UDSendOnlyImm},
	}
	bad := []struct{ prev, next Opcode }{
		{RCSendFirst, RCSendFirst}, {RCSendFirst, RCSendOnly}, {RCSendFirst, RCRDMAWriteMiddle},
		{RCRDMAWriteFirst, RCSendLast}, {RCSendMiddle, RCRDMAReadRequest}, {RCSendLast, RCSendMiddle},
		{RCSendOnly, RCSendLast}, {RCRDMAReadResponseFirst, RCRDMAReadResponseOnly},
		{UCSendFirst, RCSendLast}, {RCSendFirst, UCSendMiddle}, {RCSendLast, 0x42}, {RCRDMAWriteOnly, RCRDMAWriteMiddle},
	}
	for _, c := range ok {
		if !c.next.Follows(c.prev) {
			t.Errorf("%v after %v refused", c.next, c.prev)
		}
	}
	for _, c := range bad {
		if c.next.Follows(c.prev) {
			t.Errorf("%v after %v accepted", c.next, c.prev)
		}
	}
}

// TestPredicatesMatchNames derives every predicate from the IBA name, an
// independent statement of the same facts.
func TestPredicatesMatchNames(t *testing.T) {
	for op := 0; op < 256; op++ {
		o := Opcode(op)
		if !o.Valid() {
			continue
		}
		n := o.String()
		has := func(s string) bool { return strings.Contains(n, s) }
		checks := []struct {
			what      string
			got, want bool
		}{
			{"IsFirst", o.IsFirst(), strings.HasSuffix(n, "_FIRST")},
			{"IsMiddle", o.IsMiddle(), strings.HasSuffix(n, "_MIDDLE")},
			{"IsLast", o.IsLast(), has("_LAST")},
			{"IsOnly", o.IsOnly(), has("_ONLY")},
			{"IsSend", o.IsSend(), has("_SEND_")},
			{"IsWrite", o.IsWrite(), has("RDMA_WRITE")},
			{"IsReadRequest", o.IsReadRequest(), has("READ_REQUEST")},
			{"IsReadResponse", o.IsReadResponse(), has("READ_RESPONSE")},
			{"IsAck", o.IsAck(), n == "RC_ACKNOWLEDGE"},
			{"IsAtomic", o.IsAtomic(), has("COMPARE_SWAP") || has("FETCH_ADD")},
			{"IsAtomicAck", o.IsAtomicAck(), n == "RC_ATOMIC_ACKNOWLEDGE"},
			{"IsAtomicWrite", o.IsAtomicWrite(), n == "RC_ATOMIC_WRITE"},
			{"IsFlush", o.IsFlush(), n == "RC_FLUSH"},
			{"IsCNP", o.IsCNP(), n == "CNP"},
			{"HasInv", o.HasInv(), has("INVALIDATE")},
			{"IsResponse", o.IsResponse(), has("RESPONSE") || has("ACKNOWLEDGE")},
			{"InMessage", o.InMessage(), strings.HasSuffix(n, "_FIRST") || strings.HasSuffix(n, "_MIDDLE")},
		}
		for _, c := range checks {
			if c.got != c.want {
				t.Errorf("%v.%s = %v", o, c.what, c.got)
			}
		}
	}
	if RCSendOnly.GoString() != "bth.Opcode(0x4)" {
		t.Errorf("GoString %q", RCSendOnly.GoString())
	}
}

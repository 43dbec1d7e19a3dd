package bth_test

import (
	"bytes"
	"testing"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/frame"
	"github.com/softrnic/softrnic/frame/frametest"
)

// seedHeaders adds to f up to 64 distinct examples of one header (h 0: the
// BTH) cut from the capture frames, plus the all-zero and all-ones headers.
// Without the vectors only those two synthetic seeds are used.
func seedHeaders(f *testing.F, h bth.Ext, size int) {
	f.Add(make([]byte, size))
	f.Add(bytes.Repeat([]byte{0xFF}, size))
	seen := map[string]bool{}
	for _, c := range frametest.Seeds() {
		for _, b := range c.Frames {
			var fr frame.Frame
			if frame.Parse(b, &fr) != nil {
				continue
			}
			var v []byte
			if h == 0 {
				v = fr.BTH()
			} else if off := fr.Opcode().Offset(h); off >= 0 {
				v = fr.BTH()[:cap(fr.BTH())][off : off+size]
			}
			if v == nil || seen[string(v)] || len(seen) >= 64 {
				continue
			}
			seen[string(v)] = true
			f.Add(bytes.Clone(v))
		}
	}
}

// checkReencode decodes a header from data, encodes the decoded fields into
// a fresh buffer and requires the original bytes back, reserved bits aside.
func checkReencode(t *testing.T, data []byte, size int, reserved []byte, encode func(in, out []byte)) {
	if len(data) < size {
		return
	}
	in := data[:size]
	out := make([]byte, size)
	encode(in, out)
	for i := range in {
		m := byte(0xFF)
		if i < len(reserved) {
			m = ^reserved[i]
		}
		if in[i]&m != out[i] {
			t.Fatalf("byte %d: in % x, re-encoded % x", i, in, out)
		}
	}
}

func FuzzParseBTH(f *testing.F) {
	seedHeaders(f, 0, bth.BTHLen)
	// BTH reserved bits: byte 4 bits 5:0, byte 8 bits 6:0.
	res := []byte{0, 0, 0, 0, 0x3F, 0, 0, 0, 0x7F}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkReencode(t, data, bth.BTHLen, res, func(in, out []byte) {
			b := bth.BTH(in)
			fl := b.Fields()
			bth.BTH(out).Encode(&fl)
			// The opcode's description must be self-consistent whatever it is.
			op := b.Opcode()
			if op.Valid() != (op.HeaderLen() != 0) || (op.Valid() && op.HeaderLen() != bth.BTHLen+op.Headers().Len()) {
				t.Fatalf("opcode %v table inconsistent", op)
			}
			if b.PSN() > bth.PSNMask || b.DestQP() > bth.QPNMask || b.PadCount() > 3 {
				t.Fatal("field out of range")
			}
		})
	})
}

func FuzzParseRETH(f *testing.F) {
	seedHeaders(f, bth.ExtRETH, bth.RETHLen)
	f.Fuzz(func(t *testing.T, data []byte) {
		checkReencode(t, data, bth.RETHLen, nil, func(in, out []byte) {
			r := bth.RETH(in)
			bth.RETH(out).Encode(r.VA(), r.RKey(), r.DMALen())
		})
	})
}

func FuzzParseAETH(f *testing.F) {
	seedHeaders(f, bth.ExtAETH, bth.AETHLen)
	f.Fuzz(func(t *testing.T, data []byte) {
		checkReencode(t, data, bth.AETHLen, nil, func(in, out []byte) {
			a := bth.AETH(in)
			o := bth.AETH(out)
			// Re-encode through the kind-specific constructors.
			switch a.Kind() {
			case bth.KindACK:
				o.EncodeACK(a.CreditCode(), a.MSN())
			case bth.KindRNRNAK:
				o.EncodeRNRNAK(a.RNRTimer(), a.MSN())
				if bth.RNRTimeout(a.RNRTimer()) <= 0 {
					t.Fatal("RNR timeout not positive")
				}
			case bth.KindNAK:
				o.EncodeNAK(a.NAKCode(), a.MSN())
			default:
				o.Encode(a.Syndrome(), a.MSN())
			}
		})
	})
}

func FuzzParseDETH(f *testing.F) {
	seedHeaders(f, bth.ExtDETH, bth.DETHLen)
	res := []byte{0, 0, 0, 0, 0xFF}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkReencode(t, data, bth.DETHLen, res, func(in, out []byte) {
			d := bth.DETH(in)
			bth.DETH(out).Encode(d.QKey(), d.SrcQP())
		})
	})
}

func FuzzParseImmDt(f *testing.F) {
	seedHeaders(f, bth.ExtImmDt, bth.ImmDtLen)
	f.Fuzz(func(t *testing.T, data []byte) {
		checkReencode(t, data, bth.ImmDtLen, nil, func(in, out []byte) {
			bth.ImmDt(out).SetImm(bth.ImmDt(in).Imm())
		})
	})
}

func FuzzParseIETH(f *testing.F) {
	seedHeaders(f, bth.ExtIETH, bth.IETHLen)
	f.Fuzz(func(t *testing.T, data []byte) {
		checkReencode(t, data, bth.IETHLen, nil, func(in, out []byte) {
			bth.IETH(out).SetRKey(bth.IETH(in).RKey())
		})
	})
}

func FuzzParseAtomicETH(f *testing.F) {
	seedHeaders(f, bth.ExtAtomicETH, bth.AtomicETHLen)
	f.Fuzz(func(t *testing.T, data []byte) {
		checkReencode(t, data, bth.AtomicETHLen, nil, func(in, out []byte) {
			a := bth.AtomicETH(in)
			bth.AtomicETH(out).Encode(a.VA(), a.RKey(), a.SwapAdd(), a.Compare())
		})
	})
}

func FuzzParseAtomicAckETH(f *testing.F) {
	seedHeaders(f, bth.ExtAtomicAckETH, bth.AtomicAckETHLen)
	f.Fuzz(func(t *testing.T, data []byte) {
		checkReencode(t, data, bth.AtomicAckETHLen, nil, func(in, out []byte) {
			bth.AtomicAckETH(out).SetOrig(bth.AtomicAckETH(in).Orig())
		})
	})
}

func FuzzParseFETH(f *testing.F) {
	seedHeaders(f, bth.ExtFETH, bth.FETHLen)
	res := []byte{0xFF, 0xFF, 0xFF, 0xC0}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkReencode(t, data, bth.FETHLen, res, func(in, out []byte) {
			fe := bth.FETH(in)
			bth.FETH(out).Encode(fe.PlacementType(), fe.Selectivity())
		})
	})
}

// FuzzParseSACK: a SACKETH that Valid accepts re-encodes to the same bytes,
// Has agrees with the words for every PSN it describes and is false
// outside them, and nothing panics whatever the bytes.
func FuzzParseSACK(f *testing.F) {
	f.Add([]byte{0, 0, 0, 7, 0, 0, 0, 0})
	f.Add([]byte{1, 0xFF, 0xFF, 0xF0, 0, 16, 0, 0, 0x80, 0, 0, 1})
	f.Add([]byte{2, 0, 1, 0, 1, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0})
	f.Add([]byte{17, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{0, 0, 0, 7, 0, 8, 0, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		s := bth.SACKETH(data)
		if !s.Valid() {
			if len(data) >= bth.SACKHeaderLen && s.Words() <= bth.MaxSACKWords && len(data) == bth.SACKLen(s.Words()) && data[6]|data[7] == 0 {
				t.Fatal("a well-formed SACKETH was refused")
			}
			return
		}
		out := bth.SACKETH(make([]byte, len(data)))
		out.SetHeader(s.Words(), s.Base(), s.Window())
		for k := 0; k < s.Words(); k++ {
			out.SetWord(k, s.Word(k))
		}
		if !bytes.Equal(out, data) {
			t.Fatalf("re-encoded % x, was % x", out, data)
		}
		for i := -40; i < 32*s.Words()+40; i++ {
			p := s.Base().Add(uint32(i))
			want := i >= 0 && i < 32*s.Words() && s.Word(i/32)&(1<<(31-i%32)) != 0
			if s.Has(p) != want {
				t.Fatalf("Has(base%+d) = %v", i, !want)
			}
		}
	})
}

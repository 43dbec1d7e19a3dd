package frame

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/frame/frametest"
	"github.com/softrnic/softrnic/icrc"
)

// FuzzParseFrame feeds Parse arbitrary bytes, seeded with one frame of each
// opcode of each capture and with frames built here. Parse must never panic;
// when it accepts a frame, every view must lie inside it and tile it, and
// every accessor must work.
func FuzzParseFrame(f *testing.F) {
	for _, c := range frametest.Seeds() {
		seen := map[bth.Opcode]bool{}
		for _, b := range c.Frames {
			var fr Frame
			if Parse(b, &fr) == nil && !seen[fr.Opcode()] {
				seen[fr.Opcode()] = true
				f.Add(b)
			}
		}
	}
	buf := make([]byte, 512)
	for _, op := range []bth.Opcode{bth.CNP, bth.RCFlush, bth.RCAtomicWrite, bth.RCSendOnlyInv, bth.UDSendOnlyImm, bth.RCRDMAWriteOnlyImm} {
		for _, v6 := range []bool{false, true} {
			s := specFor(op, v6, v6)
			var pay []byte
			if op.HasPayload() {
				pay = []byte{1, 2, 3, 4, 5, 6, 7, 8}
			}
			n, err := Build(buf, &s, pay)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(bytes.Clone(buf[:n]))
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var fr Frame
		if err := Parse(data, &fr); err != nil {
			if ReasonOf(err) == ReasonNone {
				t.Fatalf("error without a reason: %v", err)
			}
			return
		}
		if fr.Len() > len(data) {
			t.Fatalf("frame length %d beyond %d bytes", fr.Len(), len(data))
		}
		op := fr.Opcode()
		if !op.Valid() || fr.BTH().TVer() != 0 || fr.UDP().DstPort() != RoCEv2Port {
			t.Fatal("accepted a frame that is not RoCEv2")
		}
		checkLayout(t, &fr)
		// Every accessor, for the race detector and bounds checks.
		_, _ = fr.VLAN()
		_, _ = fr.Src(), fr.Dst()
		_ = fr.ECN()
		_ = fr.RETH()
		_ = fr.AETH()
		_ = fr.DETH()
		_ = fr.ImmDt()
		_ = fr.IETH()
		_ = fr.AtomicETH()
		_ = fr.AtomicAckETH()
		_ = fr.FETH()
		_ = fr.CNPReserved()
		if ok := fr.VerifyICRC(); ok {
			crc, err := icrc.Compute(fr.Packet())
			if err != nil || crc != icrc.Stored(fr.Packet()) {
				t.Fatal("VerifyICRC and icrc.Compute disagree")
			}
		}
	})
}

// FuzzBuildParse builds frames from fuzzed fields and requires Parse to give
// every field back and the ICRC to verify.
func FuzzBuildParse(f *testing.F) {
	f.Add(uint8(bth.RCRDMAWriteFirst), false, false, uint32(0x11), uint32(0xFFFFFF), uint64(0x1000), uint32(7), []byte("payload"))
	f.Add(uint8(bth.UDSendOnlyImm), true, true, uint32(0xFFFFFF), uint32(0), uint64(0), uint32(0), []byte{})
	f.Add(uint8(bth.RCAtomicAcknowledge), false, true, uint32(1), uint32(5), uint64(1<<63), uint32(0xFFFFFFFF), []byte{})
	f.Fuzz(func(t *testing.T, op uint8, v6, vlan bool, qp, psn uint32, va uint64, key uint32, pay []byte) {
		o := bth.Opcode(op)
		if !o.Valid() {
			return
		}
		if !o.HasPayload() {
			pay = nil
		}
		if len(pay) > 4096 {
			pay = pay[:4096]
		}
		s := specFor(o, v6, vlan)
		s.BTH.DestQP = qp & bth.QPNMask
		s.BTH.PSN = bth.PSN(psn & bth.PSNMask)
		s.RETH.VA, s.RETH.RKey = va, key
		s.Atomic.VA, s.Atomic.Compare = va, uint64(key)
		s.AETH.Syndrome = byte(key)
		s.AETH.MSN = key & 0xFFFFFF
		s.DETH.QKey, s.Imm, s.InvRKey, s.AtomicOrig = key, key, key, va
		if v6 {
			s.Src = netip.AddrFrom16([16]byte{0xfd, 15: byte(qp)})
		}
		buf := make([]byte, Size(&s, len(pay)))
		n, err := Build(buf, &s, pay)
		if err != nil || n != len(buf) {
			t.Fatalf("build: %v (n %d of %d)", err, n, len(buf))
		}
		checkRoundTrip(t, buf, &s, pay)
	})
}

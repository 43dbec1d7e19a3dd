package rc

import (
	"bytes"
	"testing"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/checker"
)

func TestResponderSendMultiPacketAndACK(t *testing.T) {
	c := newCtx(t, defaultCfg())
	rb := make([]byte, 4096)
	c.rq.post(7, rb)
	data := fill(2500, 1)
	c.inject(req{op: bth.RCSendFirst, psn: 500, payload: data[:1024]})
	c.inject(req{op: bth.RCSendMiddle, psn: 501, payload: data[1024:2048]})
	c.expect() // no AckReq yet: nothing
	c.inject(req{op: bth.RCSendLastImm, psn: 502, ackReq: true, imm: 0xdeadbeef, payload: data[2048:]})
	c.expect(ack(502, 1))
	w := c.wcs()
	if len(w) != 1 || w[0].ID != 7 || w[0].Status != ib.Success || w[0].ByteLen != 2500 || !w[0].IsRecv ||
		w[0].Flags&ib.WCWithImm == 0 || w[0].Imm != 0xdeadbeef {
		t.Fatalf("completion %+v", w)
	}
	if !bytes.Equal(rb[:2500], data) {
		t.Fatal("data differs")
	}
}

func TestResponderCoalescesACKs(t *testing.T) {
	c := newCtx(t, defaultCfg())
	for i := 0; i < 3; i++ {
		c.rq.post(uint64(i), make([]byte, 64))
		c.inject(req{op: bth.RCSendOnly, psn: bth.PSN(500 + i), ackReq: true, payload: fill(10, 0)})
	}
	// Three AckReq packets processed before the engine transmits: one ACK
	// covering all three, with the MSN of the last.
	c.expect(ack(502, 3))
}

func TestResponderOneNAKPerGap(t *testing.T) {
	c := newCtx(t, defaultCfg())
	for i := 0; i < 4; i++ {
		c.rq.post(uint64(i), make([]byte, 64))
	}
	c.inject(req{op: bth.RCSendOnly, psn: 501, ackReq: true, payload: fill(8, 0)})
	c.expect(nak(SynNAKPSNSeq, 500, 0))
	c.inject(req{op: bth.RCSendOnly, psn: 502, ackReq: true, payload: fill(8, 0)})
	c.inject(req{op: bth.RCSendOnly, psn: 503, ackReq: true, payload: fill(8, 0)})
	c.expect() // silent until the gap fills
	c.inject(req{op: bth.RCSendOnly, psn: 500, ackReq: true, payload: fill(8, 0)})
	c.inject(req{op: bth.RCSendOnly, psn: 501, ackReq: true, payload: fill(8, 0)})
	c.expect(ack(501, 2))
	// A new gap gets its own NAK.
	c.inject(req{op: bth.RCSendOnly, psn: 505, ackReq: true, payload: fill(8, 0)})
	c.expect(nak(SynNAKPSNSeq, 502, 2))
	if c.qp.RxOutOfSeq != 4 {
		t.Fatalf("RxOutOfSeq = %d", c.qp.RxOutOfSeq)
	}
}

func TestResponderDuplicateSendReACKedNotExecuted(t *testing.T) {
	c := newCtx(t, defaultCfg())
	c.rq.post(1, make([]byte, 64))
	c.rq.post(2, make([]byte, 64))
	c.inject(req{op: bth.RCSendOnly, psn: 500, ackReq: true, payload: fill(8, 0)})
	c.inject(req{op: bth.RCSendOnly, psn: 501, ackReq: true, payload: fill(8, 0)})
	c.expect(ack(501, 2))
	c.wcs()
	c.inject(req{op: bth.RCSendOnly, psn: 500, payload: fill(8, 0)}) // no AckReq: re-ACKed anyway
	c.expect(ack(501, 2))
	if len(c.wcs()) != 0 || len(c.rq.q) != 0 && c.rq.q[0].ID != 3 {
		t.Fatal("duplicate re-executed")
	}
	// Duplicate WRITE likewise.
	c.addMR(9, 0x1000, 64, ib.RemoteWrite)
	c.inject(req{op: bth.RCRDMAWriteOnly, psn: 502, ackReq: true, va: 0x1000, rkey: 9, dmaLen: 4, payload: []byte{1, 2, 3, 4}})
	c.expect(ack(502, 3))
	c.mem.mrs[9].buf[0] = 99
	c.inject(req{op: bth.RCRDMAWriteOnly, psn: 502, ackReq: true, va: 0x1000, rkey: 9, dmaLen: 4, payload: []byte{1, 2, 3, 4}})
	c.expect(ack(502, 3))
	if c.mem.mrs[9].buf[0] != 99 {
		t.Fatal("duplicate WRITE re-executed")
	}
}

func TestResponderRNRNAK(t *testing.T) {
	c := newCtx(t, defaultCfg())
	c.inject(req{op: bth.RCSendFirst, psn: 500, payload: fill(1024, 0)})
	c.expect(nak(SynRNRNAK|12, 500, 0))
	c.inject(req{op: bth.RCSendLast, psn: 501, ackReq: true, payload: fill(4, 0)})
	c.expect(nak(SynNAKPSNSeq, 500, 0)) // as rxe: the rest of the message is out of sequence
	c.rq.post(1, make([]byte, 2048))
	c.inject(req{op: bth.RCSendFirst, psn: 500, payload: fill(1024, 0)})
	c.inject(req{op: bth.RCSendLast, psn: 501, ackReq: true, payload: fill(4, 0)})
	c.expect(ack(501, 1))
}

func TestResponderNAKCodes(t *testing.T) {
	type tc struct {
		name   string
		setup  func(c *tctx)
		r      req
		syn    uint8
		recvSt ib.WCStatus // status of the receive WQE in progress, if any
	}
	cases := []tc{
		{"bad rkey", nil, req{op: bth.RCRDMAWriteOnly, psn: 500, ackReq: true, va: 0x1000, rkey: 77, dmaLen: 4, payload: fill(4, 0)}, SynNAKRemAccess, 0},
		{"out of bounds write", nil, req{op: bth.RCRDMAWriteOnly, psn: 500, ackReq: true, va: 0x1000 + 62, rkey: 9, dmaLen: 4, payload: fill(4, 0)}, SynNAKRemAccess, 0},
		{"MR lacks remote read", nil, req{op: bth.RCRDMAReadRequest, psn: 500, ackReq: true, va: 0x1000, rkey: 9, dmaLen: 8}, SynNAKRemAccess, 0},
		{"va wraps", nil, req{op: bth.RCRDMAReadRequest, psn: 500, ackReq: true, va: ^uint64(0) - 2, rkey: 9, dmaLen: 8}, SynNAKRemAccess, 0},
		{"misaligned atomic", nil, req{op: bth.RCFetchAdd, psn: 500, ackReq: true, va: 0x1004, rkey: 9}, SynNAKInvReq, 0},
		{"MIDDLE without FIRST", nil, req{op: bth.RCSendMiddle, psn: 500, payload: fill(1024, 0)}, SynNAKInvReq, 0},
		{"FIRST shorter than MTU", func(c *tctx) { c.rq.post(1, make([]byte, 4096)) }, req{op: bth.RCSendFirst, psn: 500, payload: fill(1000, 0)}, SynNAKInvReq, 0},
		{"SEND longer than receive buffer", func(c *tctx) { c.rq.post(1, make([]byte, 16)) }, req{op: bth.RCSendOnly, psn: 500, ackReq: true, payload: fill(17, 0)}, SynNAKInvReq, ib.LocLenErr},
		{"WRITE longer than RETH", nil, req{op: bth.RCRDMAWriteOnly, psn: 500, ackReq: true, va: 0x1000, rkey: 9, dmaLen: 3, payload: fill(4, 0)}, SynNAKInvReq, 0},
		{"QP refuses READ", func(c *tctx) { c.qp.cfg.Access &^= ib.RemoteRead }, req{op: bth.RCRDMAReadRequest, psn: 500, ackReq: true, va: 0x1000, rkey: 10, dmaLen: 8}, SynNAKInvReq, 0},
		{"invalidate unknown rkey", func(c *tctx) { c.rq.post(1, make([]byte, 16)) }, req{op: bth.RCSendOnlyInv, psn: 500, ackReq: true, inv: 1234, payload: fill(4, 0)}, SynNAKInvReq, ib.RemInvReqErr},
		{"bad receive WQE", func(c *tctx) { c.rq.q = append(c.rq.q, ib.RecvWQE{ID: 1, Err: ib.LocProtErr}) }, req{op: bth.RCSendOnly, psn: 500, ackReq: true, payload: fill(4, 0)}, SynNAKRemOp, ib.LocProtErr},
		{"ATOMIC_WRITE unsupported", nil, req{op: bth.RCAtomicWrite, psn: 500, ackReq: true, va: 0x1000, rkey: 9, dmaLen: 8, payload: fill(8, 0)}, SynNAKInvReq, 0},
	}
	for _, k := range cases {
		t.Run(k.name, func(t *testing.T) {
			c := newCtx(t, defaultCfg())
			c.addMR(9, 0x1000, 64, ib.RemoteWrite|ib.RemoteAtomic)
			c.addMR(10, 0x1000, 64, ib.RemoteRead)
			if k.setup != nil {
				k.setup(c)
			}
			c.inject(k.r)
			if !c.qp.Failed() {
				t.Fatal("QP did not fail")
			}
			c.qp.Flush() // the device moves it to ERR; the NAK still goes out
			c.expect(nak(k.syn, 500, 0))
			w := c.wcs()
			if k.recvSt != 0 {
				if len(w) != 1 || w[0].Status != k.recvSt || !w[0].IsRecv {
					t.Fatalf("completions %+v", w)
				}
			} else if len(w) != 0 {
				t.Fatalf("unexpected completions %+v", w)
			}
			// A failed QP accepts nothing more.
			c.inject(req{op: bth.RCSendOnly, psn: 501, ackReq: true})
			c.expect()
		})
	}
}

func TestResponderReadResponses(t *testing.T) {
	c := newCtx(t, defaultCfg())
	mr := c.addMR(5, 0x10000, 8192, ib.RemoteRead)
	copy(mr.buf, fill(8192, 3))
	c.inject(req{op: bth.RCRDMAReadRequest, psn: 500, ackReq: true, va: 0x10010, rkey: 5, dmaLen: 2600})
	got := c.expect(
		checker.Is(checker.Opcode(bth.RCRDMAReadResponseFirst), checker.PSN(500), checker.AETH(SynACK, 1)),
		p(bth.RCRDMAReadResponseMiddle, 501),
		checker.Is(checker.Opcode(bth.RCRDMAReadResponseLast), checker.PSN(502), checker.AETH(SynACK, 1)))
	var all []byte
	for _, g := range got {
		all = append(all, g.Payload...)
	}
	if !bytes.Equal(all, mr.buf[0x10:0x10+2600]) {
		t.Fatal("READ data differs")
	}
	// The next request is expected after the READ's three PSNs.
	c.rq.post(1, make([]byte, 8))
	c.inject(req{op: bth.RCSendOnly, psn: 503, ackReq: true, payload: fill(4, 0)})
	c.expect(ack(503, 2))

	// Duplicate READ from its middle PSN (the requester lost packets 501
	// and 502 and asked again for the rest): replayed from that PSN,
	// memory read again, the current MSN.
	mr.buf[0x10+1024] = 0xAA
	c.inject(req{op: bth.RCRDMAReadRequest, psn: 501, ackReq: true, va: 0x10010 + 1024, rkey: 5, dmaLen: 2600 - 1024})
	got = c.expect(
		checker.Is(checker.Opcode(bth.RCRDMAReadResponseFirst), checker.PSN(501), checker.AETH(SynACK, 2)),
		checker.Is(checker.Opcode(bth.RCRDMAReadResponseLast), checker.PSN(502), checker.AETH(SynACK, 2)))
	if got[0].Payload[0] != 0xAA || len(got[1].Payload) != 2600-2048 {
		t.Fatal("replay data")
	}
	// A duplicate that asks for more than the original is dropped.
	c.inject(req{op: bth.RCRDMAReadRequest, psn: 500, ackReq: true, va: 0x10010, rkey: 5, dmaLen: 4000})
	c.expect()
	// Zero-length READ names no memory: answered with an empty ONLY.
	c.inject(req{op: bth.RCRDMAReadRequest, psn: 504, ackReq: true, va: 0xdead, rkey: 0x77, dmaLen: 0})
	g := c.expect(checker.Is(checker.Opcode(bth.RCRDMAReadResponseOnly), checker.PSN(504), checker.AETH(SynACK, 3)))
	if len(g[0].Payload) != 0 {
		t.Fatal("zero READ payload")
	}
}

func TestResponderAtomicsAndReplay(t *testing.T) {
	c := newCtx(t, defaultCfg())
	mr := c.addMR(5, 0x2000, 64, ib.RemoteAtomic)
	le := func(o int) uint64 { return le64(mr.buf[o:]) }
	c.inject(req{op: bth.RCFetchAdd, psn: 500, ackReq: true, va: 0x2008, rkey: 5, swap: 5})
	g := c.expect(checker.Is(checker.Opcode(bth.RCAtomicAcknowledge), checker.PSN(500), checker.AETH(SynACK, 1)))
	if bth.AtomicAckETH(g[0].Raw[16:]).Orig() != 0 || le(8) != 5 {
		t.Fatal("fetch-add")
	}
	c.inject(req{op: bth.RCCompareSwap, psn: 501, ackReq: true, va: 0x2008, rkey: 5, cmp: 5, swap: 42})
	g = c.expect(checker.Is(checker.Opcode(bth.RCAtomicAcknowledge), checker.PSN(501), checker.AETH(SynACK, 2)))
	if bth.AtomicAckETH(g[0].Raw[16:]).Orig() != 5 || le(8) != 42 {
		t.Fatal("cmp-swap")
	}
	// Duplicate of the fetch-add: the stored result, not executed again.
	c.inject(req{op: bth.RCFetchAdd, psn: 500, ackReq: true, va: 0x2008, rkey: 5, swap: 5})
	g = c.expect(checker.Is(checker.Opcode(bth.RCAtomicAcknowledge), checker.PSN(500), checker.AETH(SynACK, 2)))
	if bth.AtomicAckETH(g[0].Raw[16:]).Orig() != 0 || le(8) != 42 {
		t.Fatal("atomic replay re-executed")
	}
}

func TestResponderResourceTableBounded(t *testing.T) {
	cfg := defaultCfg()
	cfg.MaxDestRdAtomic = 2
	c := newCtx(t, cfg)
	c.addMR(5, 0x2000, 64, ib.RemoteAtomic)
	for i := 0; i < 3; i++ {
		c.inject(req{op: bth.RCFetchAdd, psn: bth.PSN(500 + i), ackReq: true, va: 0x2000, rkey: 5, swap: 1})
		c.out()
	}
	// Only the last two atomics are remembered: the oldest is forgotten
	// and its duplicate silently dropped.
	c.inject(req{op: bth.RCFetchAdd, psn: 500, ackReq: true, va: 0x2000, rkey: 5, swap: 1})
	c.expect()
	c.inject(req{op: bth.RCFetchAdd, psn: 502, ackReq: true, va: 0x2000, rkey: 5, swap: 1})
	c.expect(checker.Is(checker.Opcode(bth.RCAtomicAcknowledge), checker.PSN(502), checker.AETH(SynACK, 3)))
}

func TestResponderWriteImmAndInvalidate(t *testing.T) {
	c := newCtx(t, defaultCfg())
	mr := c.addMR(9, 0x1000, 4096, ib.RemoteWrite)
	data := fill(1500, 9)
	// WRITE_WITH_IMM with no receive posted: RNR at the LAST_IMM only.
	c.inject(req{op: bth.RCRDMAWriteFirst, psn: 500, va: 0x1000, rkey: 9, dmaLen: 1500, payload: data[:1024]})
	c.inject(req{op: bth.RCRDMAWriteLastImm, psn: 501, ackReq: true, imm: 5, payload: data[1024:]})
	c.expect(nak(SynRNRNAK|12, 501, 0))
	c.rq.post(3, nil)
	c.inject(req{op: bth.RCRDMAWriteLastImm, psn: 501, ackReq: true, imm: 5, payload: data[1024:]})
	c.expect(ack(501, 1))
	w := c.wcs()
	if len(w) != 1 || w[0].Opcode != ib.WCRecvRDMAWithImm || w[0].ByteLen != 1500 || w[0].Imm != 5 || !bytes.Equal(mr.buf[:1500], data) {
		t.Fatalf("write imm %+v", w)
	}
	c.rq.post(4, make([]byte, 8))
	c.inject(req{op: bth.RCSendOnlyInv, psn: 502, ackReq: true, inv: 9, payload: fill(3, 0)})
	c.expect(ack(502, 2))
	w = c.wcs()
	if len(w) != 1 || w[0].Flags&ib.WCWithInv == 0 || w[0].InvRKey != 9 || mr.valid {
		t.Fatalf("invalidate %+v", w)
	}
	// The invalidated rkey no longer grants access.
	c.inject(req{op: bth.RCRDMAWriteOnly, psn: 503, ackReq: true, va: 0x1000, rkey: 9, dmaLen: 1, payload: []byte{1}})
	c.expect(nak(SynNAKRemAccess, 503, 2))
}

func TestResponderPSNWrap(t *testing.T) {
	cfg := defaultCfg()
	cfg.RQPSN = bth.PSNMask - 1
	c := newCtx(t, cfg)
	mr := c.addMR(9, 0, 4096, ib.RemoteWrite)
	data := fill(4000, 2)
	c.inject(req{op: bth.RCRDMAWriteFirst, psn: bth.PSNMask - 1, va: 0, rkey: 9, dmaLen: 4000, payload: data[:1024]})
	c.inject(req{op: bth.RCRDMAWriteMiddle, psn: bth.PSNMask, payload: data[1024:2048]})
	c.inject(req{op: bth.RCRDMAWriteMiddle, psn: 0, payload: data[2048:3072]})
	c.inject(req{op: bth.RCRDMAWriteLast, psn: 1, ackReq: true, payload: data[3072:]})
	c.expect(ack(1, 1))
	if !bytes.Equal(mr.buf[:4000], data) {
		t.Fatal("data across wrap")
	}
	// A duplicate from before the wrap is a duplicate, not a future PSN.
	c.inject(req{op: bth.RCRDMAWriteMiddle, psn: bth.PSNMask, payload: data[1024:2048]})
	c.expect(ack(1, 1))
}

func TestResponderHostilePacketsNeverPanic(t *testing.T) {
	c := newCtx(t, defaultCfg())
	c.addMR(9, 0x1000, 64, ib.RemoteWrite|ib.RemoteRead|ib.RemoteAtomic)
	c.rq.post(1, make([]byte, 64))
	good := req{op: bth.RCRDMAWriteOnly, psn: 500, ackReq: true, va: 0x1000, rkey: 9, dmaLen: 4, payload: fill(4, 0)}.bytes(0x11)
	for n := 0; n <= len(good); n++ {
		c.qp.Receive(c.now, good[:n], nil)
	}
	for op := 0; op < 256; op++ {
		b := append([]byte(nil), good...)
		b[0] = byte(op)
		c.qp.Receive(c.now, b, nil)
		b[1] = 0x30 // pad 3 on a 4-byte payload
		c.qp.Receive(c.now, b, nil)
		c.out()
	}
}

func TestResponderDuplicateReadReplacesReplyInProgress(t *testing.T) {
	c := newCtx(t, defaultCfg())
	mr := c.addMR(5, 0, 10*1024, ib.RemoteRead)
	copy(mr.buf, fill(len(mr.buf), 1))
	c.inject(req{op: bth.RCRDMAReadRequest, psn: 500, ackReq: true, va: 0, rkey: 5, dmaLen: 10 * 1024})
	for i := 0; i < 3; i++ { // the reply is under way
		if c.qp.Build(c.now, c.buf) == 0 {
			t.Fatal("no reply")
		}
	}
	// The requester lost packet 501 and asks again from there: the old
	// reply stops, the new one starts at 501 with FIRST.
	c.inject(req{op: bth.RCRDMAReadRequest, psn: 501, ackReq: true, va: 1024, rkey: 5, dmaLen: 9 * 1024})
	g := c.out()
	if len(g) != 9 || g[0].Op != bth.RCRDMAReadResponseFirst || g[0].PSN != 501 || g[8].PSN != 509 || g[8].Op != bth.RCRDMAReadResponseLast {
		t.Fatalf("%v", g)
	}
}

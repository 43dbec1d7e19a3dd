package rc

import (
	"testing"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/ib"
)

// FuzzQP feeds arbitrary packets to an RC QP with work in flight in both
// directions: it must never panic, never write outside the MR (guard bytes
// around it stay zero) and keep producing well-formed packets.
func FuzzQP(f *testing.F) {
	seeds := []req{
		{op: bth.RCRDMAWriteOnly, psn: 500, ackReq: true, va: 0x1000, rkey: 9, dmaLen: 4, payload: []byte{1, 2, 3, 4}},
		{op: bth.RCRDMAReadRequest, psn: 500, ackReq: true, va: 0x1000, rkey: 9, dmaLen: 3000},
		{op: bth.RCFetchAdd, psn: 500, ackReq: true, va: 0x1008, rkey: 9, swap: 1},
		{op: bth.RCSendFirst, psn: 500, payload: make([]byte, 1024)},
		{op: bth.RCAcknowledge, psn: 100, syn: SynACK, msn: 1},
		{op: bth.RCAcknowledge, psn: 100, syn: SynRNRNAK | 3},
		{op: bth.RCRDMAReadResponseOnly, psn: 101, syn: SynACK, payload: make([]byte, 16)},
		{op: bth.RCAtomicAcknowledge, psn: 102, syn: SynACK, orig: 5},
	}
	for _, s := range seeds {
		f.Add(s.bytes(0x11), s.bytes(0x11))
	}
	f.Fuzz(func(t *testing.T, p1, p2 []byte) {
		c := newCtx(t, defaultCfg())
		back := guardedMR(c)
		c.rq.post(1, make([]byte, 64))
		c.post(ib.SendWQE{ID: 1, Opcode: ib.Send, Flags: ib.Signaled, SG: segs(make([]byte, 8))})
		c.post(ib.SendWQE{ID: 2, Opcode: ib.RDMARead, Flags: ib.Signaled, SG: segs(make([]byte, 16)), RemoteAddr: 1, RKey: 1})
		c.post(ib.SendWQE{ID: 3, Opcode: ib.AtomicFetchAndAdd, Flags: ib.Signaled, SG: segs(make([]byte, 8)), Length: 8})
		c.out()
		feed(t, c, back, p1, p2)
	})
}

// FuzzQPSelective is FuzzQP with selective repeat agreed in both
// directions: arbitrary packets, with or without the SR bit and a
// SACKETH, must never panic, never write outside the MR, keep producing
// well-formed packets, and leave no reorder buffer behind once the QP is
// flushed.
func FuzzQPSelective(f *testing.F) {
	seeds := []req{
		{op: bth.RCRDMAWriteOnly, psn: 502, ackReq: true, va: 0x1000, rkey: 9, dmaLen: 4, payload: []byte{1, 2, 3, 4}, sr: true},
		{op: bth.RCSendMiddle, psn: 503, payload: make([]byte, 1024), sr: true},
		{op: bth.RCRDMAReadRequest, psn: 505, ackReq: true, va: 0x1000, rkey: 9, dmaLen: 3000, sr: true},
		{op: bth.RCAcknowledge, psn: 100, syn: SynACK, sr: true, payload: sack(101, 102, 103)},
		{op: bth.RCAcknowledge, psn: 101, syn: SynACK, sr: true, payload: []byte{3, 0, 0, 102}},
		{op: bth.RCRDMAReadResponseLast, psn: 103, syn: SynACK, sr: true, payload: make([]byte, 16)},
		{op: bth.RCAtomicAcknowledge, psn: 104, syn: SynACK, orig: 5, sr: true},
		{op: bth.RCAcknowledge, psn: 101, syn: SynRNRNAK | 3, sr: true, payload: sack(102)},
	}
	for _, s := range seeds {
		f.Add(s.bytes(SoftQPNTag|0x11), s.bytes(SoftQPNTag|0x11))
	}
	f.Fuzz(func(t *testing.T, p1, p2 []byte) {
		c := newSRCtx(t, srCfg())
		back := guardedMR(c)
		c.rq.post(1, make([]byte, 64))
		// Agree in both directions: a marked request in, a marked ACK back.
		c.inject(req{op: bth.RCSendOnly, psn: 500, ackReq: true, payload: make([]byte, 8), sr: true})
		c.post(ib.SendWQE{ID: 1, Opcode: ib.Send, Flags: ib.Signaled, SG: segs(make([]byte, 8))})
		c.out()
		c.respond(srAck(100))
		c.post(ib.SendWQE{ID: 2, Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: segs(make([]byte, 2048)), RemoteAddr: 1, RKey: 1})
		c.post(ib.SendWQE{ID: 3, Opcode: ib.RDMARead, Flags: ib.Signaled, SG: segs(make([]byte, 16)), RemoteAddr: 1, RKey: 1})
		c.post(ib.SendWQE{ID: 4, Opcode: ib.AtomicFetchAndAdd, Flags: ib.Signaled, SG: segs(make([]byte, 8)), Length: 8})
		c.out()
		feed(t, c, back, p1, p2)
		c.qp.Flush()
		if n := c.qp.pool.InUse(); n != 0 {
			t.Fatalf("%d reorder buffers left after Flush", n)
		}
	})
}

// guardedMR registers rkey 9 at 0x1000 over the middle page of three and
// returns the three: the others must stay zero.
func guardedMR(c *tctx) []byte {
	back := make([]byte, 3*4096)
	c.mem.mrs[9] = &testMR{va: 0x1000, buf: back[4096 : 2*4096 : 2*4096], access: ib.RemoteWrite | ib.RemoteRead | ib.RemoteAtomic, valid: true}
	return back
}

// feed gives the QP p1, p2 and p1 again, running its timers after each:
// every packet it sends must be well formed, and nothing outside the MR
// may change.
func feed(t *testing.T, c *tctx, back, p1, p2 []byte) {
	for _, p := range [][]byte{p1, p2, p1} {
		c.qp.Receive(c.now, p, nil)
		for _, o := range c.out() {
			if o.Op.HeaderLen() == 0 || len(o.Raw) > c.qp.MaxPacket() {
				t.Fatalf("malformed output %v", o)
			}
		}
		c.now = c.qp.Deadline()
		c.qp.Expire(c.now)
	}
	for i := range back {
		if (i < 4096 || i >= 2*4096) && back[i] != 0 {
			t.Fatalf("wrote outside the MR at %d", i)
		}
	}
}

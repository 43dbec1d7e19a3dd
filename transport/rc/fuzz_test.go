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
		back := make([]byte, 3*4096)
		mr := &testMR{va: 0x1000, buf: back[4096 : 2*4096 : 2*4096], access: ib.RemoteWrite | ib.RemoteRead | ib.RemoteAtomic, valid: true}
		c.mem.mrs[9] = mr
		c.rq.post(1, make([]byte, 64))
		c.post(ib.SendWQE{ID: 1, Opcode: ib.Send, Flags: ib.Signaled, SG: segs(make([]byte, 8))})
		c.post(ib.SendWQE{ID: 2, Opcode: ib.RDMARead, Flags: ib.Signaled, SG: segs(make([]byte, 16)), RemoteAddr: 1, RKey: 1})
		c.post(ib.SendWQE{ID: 3, Opcode: ib.AtomicFetchAndAdd, Flags: ib.Signaled, SG: segs(make([]byte, 8)), Length: 8})
		c.out()
		for _, p := range [][]byte{p1, p2, p1} {
			c.qp.Receive(c.now, p, nil)
			for _, o := range c.out() {
				if o.op.HeaderLen() == 0 || len(o.raw) > c.qp.MaxPacket() {
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
	})
}

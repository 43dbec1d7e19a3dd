package rc

import (
	"bytes"
	"testing"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/ib"
)

func ucCtx(t *testing.T) *tctx {
	cfg := defaultCfg()
	cfg.UC = true
	cfg.Access = ib.LocalWrite | ib.RemoteWrite
	return newCtx(t, cfg)
}

func TestUCRequesterCompletesOnSendWithoutACK(t *testing.T) {
	c := ucCtx(t)
	c.post(ib.SendWQE{ID: 1, Opcode: ib.Send, Flags: ib.Signaled, SG: segs(make([]byte, 1500))})
	c.post(ib.SendWQE{ID: 2, Opcode: ib.RDMAWriteWithImm, Flags: ib.Signaled, SG: segs(make([]byte, 10)), RemoteAddr: 1, RKey: 2})
	g := c.expect(p(bth.UCSendFirst, 100), p(bth.UCSendLast, 101), p(bth.UCRDMAWriteOnlyImm, 102))
	for _, x := range g {
		if x.AckReq {
			t.Fatal("UC packet with AckReq")
		}
	}
	if w := c.wcs(); len(w) != 2 || w[0].Status != ib.Success || c.qp.Deadline() != neverTime() {
		t.Fatalf("%+v", w)
	}
}

func TestUCResponderDropsToNextFirst(t *testing.T) {
	c := ucCtx(t)
	rb := make([]byte, 3000)
	c.rq.post(1, rb)
	a, b := fill(2048, 1), fill(1030, 2)
	c.inject(req{op: bth.UCSendFirst, psn: 500, payload: a[:1024]})
	// 501 lost: the LAST is dropped, and so is everything until a FIRST.
	c.inject(req{op: bth.UCSendLast, psn: 502, payload: a[1024:1030]})
	c.inject(req{op: bth.UCSendMiddle, psn: 503, payload: a[:1024]})
	if len(c.wcs()) != 0 {
		t.Fatal("partial message completed")
	}
	// The next message reuses the receive WQE the lost one had started.
	c.inject(req{op: bth.UCSendFirst, psn: 510, payload: b[:1024]})
	c.inject(req{op: bth.UCSendLastImm, psn: 511, imm: 3, payload: b[1024:]})
	c.expect() // UC never acknowledges
	w := c.wcs()
	if len(w) != 1 || w[0].ID != 1 || w[0].ByteLen != 1030 || w[0].Imm != 3 || !bytes.Equal(rb[:1030], b) {
		t.Fatalf("%+v", w)
	}
	// Errors drop the message silently instead of failing the QP.
	c.inject(req{op: bth.UCRDMAWriteOnly, psn: 512, va: 5, rkey: 99, dmaLen: 4, payload: fill(4, 0)})
	c.inject(req{op: bth.UCSendOnly, psn: 513, payload: fill(4, 0)}) // no receive posted
	c.expect()
	if c.qp.Failed() {
		t.Fatal("UC QP failed on a bad request")
	}
	// RC opcodes are not accepted by a UC QP.
	c.rq.post(2, rb)
	c.inject(req{op: bth.RCSendOnly, psn: 514, payload: fill(4, 0)})
	if len(c.wcs()) != 0 {
		t.Fatal("RC opcode accepted on UC")
	}
}

func TestUCLocalErrorStopsSendQueueOnly(t *testing.T) {
	c := ucCtx(t)
	c.post(ib.SendWQE{ID: 1, Opcode: ib.Send, Flags: ib.Signaled, SG: segs(fill(4, 0))})
	c.post(ib.SendWQE{ID: 2, Opcode: ib.Send, Err: ib.LocProtErr})
	c.post(ib.SendWQE{ID: 3, Opcode: ib.Send, Flags: ib.Signaled, SG: segs(fill(4, 0))})
	c.expect(p(bth.UCSendOnly, 100))
	if !c.qp.SendError() || c.qp.Failed() {
		t.Fatal("UC local error must stop the SQ, not fail the QP")
	}
	c.qp.FlushSend()
	w := c.wcs()
	if len(w) != 3 || w[1].Status != ib.LocProtErr || w[2].Status != ib.WRFlushErr {
		t.Fatalf("%+v", w)
	}
	// The receive side keeps working in SQE.
	c.rq.post(7, make([]byte, 8))
	c.inject(req{op: bth.UCSendOnly, psn: 500, payload: fill(4, 0)})
	if w := c.wcs(); len(w) != 1 || w[0].ID != 7 {
		t.Fatalf("%+v", w)
	}
	c.qp.Resume()
	c.post(ib.SendWQE{ID: 4, Opcode: ib.Send, Flags: ib.Signaled, SG: segs(fill(4, 0))})
	c.expect(p(bth.UCSendOnly, 101))
}

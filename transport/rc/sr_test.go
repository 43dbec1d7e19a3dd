package rc

import (
	"bytes"
	"fmt"
	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/transport"
	"testing"
	"time"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/checker"
)

// srAck is the selective-repeat ACK of psn whose SACKETH from psn+1 marks
// have.
func srAck(psn bth.PSN, have ...bth.PSN) req {
	return req{op: bth.RCAcknowledge, psn: psn, syn: SynACK, sr: true, payload: sack(psn.Next(), have...)}
}

// sackOf decodes the PSNs an ACK's SACKETH marks.
func sackOf(t *testing.T, g checker.Packet) []bth.PSN {
	t.Helper()
	if !g.SR || g.Op != bth.RCAcknowledge {
		t.Fatalf("%v is not a selective-repeat ACK", g)
	}
	s := bth.SACKETH(g.Payload)
	if !s.Valid() || s.Base() != g.PSN.Next() {
		t.Fatalf("SACKETH % x after ACK %d", g.Payload, g.PSN)
	}
	var have []bth.PSN
	for i := 0; i < 32*s.Words(); i++ {
		if p := s.Base().Add(uint32(i)); s.Has(p) {
			have = append(have, p)
		}
	}
	return have
}

// outEach builds the packets one at a time, a microsecond apart, and drops
// them.
func (c *tctx) outEach() {
	for n := c.qp.Build(c.now, c.buf); n > 0; n = c.qp.Build(c.now, c.buf) {
		c.now = c.now.Add(time.Microsecond)
	}
}

// TestSRAgreement: a responder holds out-of-order requests only when the
// request carries the bit, its own mode asks for selective repeat, it has
// a reorder pool and the requester's QP number is softrnic's; otherwise it
// is the go-back-N responder rxe is (a sequence NAK, unmarked).
func TestSRAgreement(t *testing.T) {
	for _, k := range []struct {
		marked, pool, tagged bool
		mode                 ib.Recovery
		want                 bool
	}{
		{true, true, true, ib.RecoverySelective, true},
		{false, true, true, ib.RecoverySelective, false},
		{true, false, true, ib.RecoverySelective, false},
		{true, true, false, ib.RecoverySelective, false},
		{true, true, true, ib.RecoveryAdaptive, false},
		{true, true, true, ib.RecoveryTimeout, false},
	} {
		t.Run(fmt.Sprintf("%+v", k), func(t *testing.T) {
			cfg := defaultCfg()
			if k.tagged {
				cfg = srCfg()
			}
			cfg.Recovery = k.mode
			c := newCtx(t, cfg)
			if k.pool {
				c = newSRCtx(t, cfg)
			}
			c.addMR(9, 0x1000, 4096, ib.RemoteWrite)
			c.inject(req{op: bth.RCRDMAWriteOnly, psn: 501, ackReq: true, va: 0x1000, rkey: 9, dmaLen: 4, payload: fill(4, 1), sr: k.marked})
			g := c.out()
			if _, on := c.qp.SelectiveRepeat(); on != k.want || len(g) != 1 {
				t.Fatalf("selective repeat %v, want %v; sent %v", on, k.want, g)
			}
			if k.want {
				if have := sackOf(t, g[0]); g[0].PSN != 499 || len(have) != 1 || have[0] != 501 || c.qp.SRHeld != 1 {
					t.Fatalf("%v SACK %v", g[0], have)
				}
				return
			}
			if g[0].SR || g[0].Syn != SynNAKPSNSeq || g[0].PSN != 500 || len(g[0].Raw) != bth.BTHLen+bth.AETHLen {
				t.Fatalf("go-back-N responder sent %v sr=%v", g[0], g[0].SR)
			}
		})
	}
}

// TestSRResponderPlacesInOrder: a WRITE whose packets come in any order is
// placed only once the packets before each have come (an application
// polling its last byte sees the rest too); the ACKs say what is held.
func TestSRResponderPlacesInOrder(t *testing.T) {
	data := fill(3000, 7)
	pkts := []req{
		{op: bth.RCRDMAWriteFirst, psn: 500, va: 0x1000, rkey: 9, dmaLen: 3000, payload: data[:1024], sr: true},
		{op: bth.RCRDMAWriteMiddle, psn: 501, payload: data[1024:2048], sr: true},
		{op: bth.RCRDMAWriteLast, psn: 502, ackReq: true, payload: data[2048:], sr: true},
		{op: bth.RCRDMAWriteOnly, psn: 503, ackReq: true, va: 0x2000, rkey: 9, dmaLen: 4, payload: fill(4, 9), sr: true},
	}
	for _, order := range [][]int{{1, 2, 3, 0}, {0, 2, 3, 1}, {0, 1, 3, 2}, {3, 2, 1, 0}} {
		t.Run(fmt.Sprint(order), func(t *testing.T) {
			c := newSRCtx(t, srCfg())
			mr := c.addMR(9, 0x1000, 8192, ib.RemoteWrite)
			for i, k := range order {
				c.inject(pkts[k])
				ePSN := c.qp.resp.ePSN
				// Nothing beyond the expected PSN is placed.
				placed := 0
				for j := 0; j < 3; j++ {
					if bytes.Equal(mr.buf[j*1024:min((j+1)*1024, 3000)], data[j*1024:min((j+1)*1024, 3000)]) {
						placed++
					}
				}
				if want := min(int(ePSN-500), 3); placed != want {
					t.Fatalf("after %d packets (expected PSN %d): %d WRITE packets placed", i+1, ePSN, placed)
				}
				g := c.out()
				held := pkts[k].psn != ePSN.Prev() || c.qp.resp.held.n > 0
				if (held || pkts[k].ackReq) != (len(g) == 1) || len(g) > 1 {
					t.Fatalf("after packet %d: %v", pkts[k].psn, g)
				}
				if len(g) == 1 {
					if g[0].PSN != ePSN.Prev() {
						t.Fatalf("ACK %v with expected PSN %d", g[0], ePSN)
					}
					for _, h := range sackOf(t, g[0]) {
						found := h.Less(ePSN)
						for _, k2 := range order[:i+1] {
							found = found || pkts[k2].psn == h
						}
						if !found {
							t.Fatalf("SACK marks %d, never received", h)
						}
					}
				}
			}
			if !bytes.Equal(mr.buf[:3000], data) || !bytes.Equal(mr.buf[0x1000:0x1004], fill(4, 9)) || c.qp.resp.ePSN != 504 || c.qp.resp.held.n != 0 {
				t.Fatalf("final: expected PSN %d held %d", c.qp.resp.ePSN, c.qp.resp.held.n)
			}
			if c.qp.pool.InUse() != 0 {
				t.Fatalf("%d pool buffers still in use", c.qp.pool.InUse())
			}
		})
	}
}

// TestSRResponderSendAcrossReceives: SEND messages that span receive WQEs
// arrive shuffled; each lands in its own receive at its offset and the
// receive completions come in message order, when the last packet before
// them has come.
func TestSRResponderSendAcrossReceives(t *testing.T) {
	c := newSRCtx(t, srCfg())
	m1, m2, m3 := fill(2000, 1), fill(1024, 2), fill(2100, 3)
	b1, b2, b3 := make([]byte, 2048), make([]byte, 1024), make([]byte, 3000)
	c.rq.post(1, b1)
	c.rq.post(2, b2)
	c.rq.post(3, b3)
	pk := map[bth.PSN]req{
		500: {op: bth.RCSendFirst, psn: 500, payload: m1[:1024], sr: true},
		501: {op: bth.RCSendLast, psn: 501, ackReq: true, payload: m1[1024:], sr: true},
		502: {op: bth.RCSendOnly, psn: 502, ackReq: true, payload: m2, sr: true},
		503: {op: bth.RCSendFirst, psn: 503, payload: m3[:1024], sr: true},
		504: {op: bth.RCSendMiddle, psn: 504, payload: m3[1024:2048], sr: true},
		505: {op: bth.RCSendLastImm, psn: 505, ackReq: true, imm: 77, payload: m3[2048:], sr: true},
	}
	for _, p := range []bth.PSN{505, 502, 504, 500, 503} {
		c.inject(pk[p])
		if w := c.wcs(); len(w) != 0 {
			t.Fatalf("completion %+v before PSN 501 came", w)
		}
	}
	c.out()
	c.inject(pk[501])
	w := c.wcs()
	if len(w) != 3 || w[0].ID != 1 || w[1].ID != 2 || w[2].ID != 3 || w[0].ByteLen != 2000 || w[2].ByteLen != 2100 || w[2].Imm != 77 {
		t.Fatalf("completions %+v", w)
	}
	if !bytes.Equal(b1[:2000], m1) || !bytes.Equal(b2, m2) || !bytes.Equal(b3[:2100], m3) {
		t.Fatal("receive data")
	}
	g := c.out()
	if len(g) != 1 || g[0].PSN != 505 || len(sackOf(t, g[0])) != 0 {
		t.Fatalf("final ACK %v", g)
	}
}

// TestSRResponderBounds: duplicates of held packets, the edge of the
// window and an exhausted reorder pool.
func TestSRResponderBounds(t *testing.T) {
	cfg := srCfg()
	c := &tctx{t: t, mem: &testMem{mrs: map[uint32]*testMR{}}, rq: &testRQ{}}
	c.qp = New(cfg.QPN, 64, 4, c.mem, c.rq)
	pool := NewReorderPool(PacketLen(cfg.MTU), 2)
	c.qp.SetReorderPool(pool)
	c.qp.Receiver(cfg)
	c.qp.Sender(cfg)
	c.buf = make([]byte, c.qp.MaxPacket())
	mr := c.addMR(9, 0x1000, 4096, ib.RemoteWrite)
	w := func(psn bth.PSN) req {
		return req{op: bth.RCRDMAWriteOnly, psn: psn, ackReq: true, va: 0x1000 + uint64(psn-500)*4, rkey: 9, dmaLen: 4, payload: fill(4, byte(psn)), sr: true}
	}
	c.inject(w(502))
	c.inject(w(502))
	if c.qp.SRHeld != 1 || c.qp.RxDuplicate != 1 {
		t.Fatalf("duplicate of a held packet: %+v", c.qp.Counters)
	}
	c.inject(w(500 + SRWindow))
	if c.qp.RxDropped != 1 || c.qp.SRHeld != 1 {
		t.Fatalf("beyond the window: %+v", c.qp.Counters)
	}
	c.inject(w(500 + SRWindow - 1))
	c.inject(w(503))
	if c.qp.SRHeld != 2 || c.qp.SRDropped != 1 || pool.InUse() != 2 {
		t.Fatalf("pool of 2: %+v, in use %d", c.qp.Counters, pool.InUse())
	}
	g := c.out()
	if have := sackOf(t, g[len(g)-1]); len(have) != 2 || have[0] != 502 || have[1] != 500+SRWindow-1 {
		t.Fatalf("SACK %v", have)
	}
	c.inject(w(500))
	c.inject(w(501))
	c.inject(w(503)) // resent: now in order
	if c.qp.resp.ePSN != 504 || pool.InUse() != 1 {
		t.Fatalf("expected PSN %d, %d buffers in use", c.qp.resp.ePSN, pool.InUse())
	}
	for i := 0; i < 4; i++ {
		if !bytes.Equal(mr.buf[4*i:4*i+4], fill(4, byte(500+i))) {
			t.Fatalf("WRITE %d", 500+i)
		}
	}
	// The QP going to ERR hands its held buffers back.
	c.qp.Flush()
	if pool.InUse() != 0 {
		t.Fatalf("%d buffers in use after Flush", pool.InUse())
	}
}

// TestSRHeldBuffersOutliveTheVisit: the pool buffers of held packets that
// the hole's arrival executes stay out of the pool until the device ends
// its visit to the QP (TakeCompletions), since the memory copies the
// visit made may read from them until then; a packet held later in the
// same visit cannot take one of them.
func TestSRHeldBuffersOutliveTheVisit(t *testing.T) {
	cfg := srCfg()
	c := &tctx{t: t, mem: &testMem{mrs: map[uint32]*testMR{}}, rq: &testRQ{}}
	c.qp = New(cfg.QPN, 64, 4, c.mem, c.rq)
	pool := NewReorderPool(PacketLen(cfg.MTU), 3)
	c.qp.SetReorderPool(pool)
	c.qp.Receiver(cfg)
	c.qp.Sender(cfg)
	c.buf = make([]byte, c.qp.MaxPacket())
	mr := c.addMR(9, 0x1000, 8192, ib.RemoteWrite)
	data := fill(4096, 5)
	w := func(psn bth.PSN) req {
		k := int(psn - 500)
		r := req{op: bth.RCRDMAWriteMiddle, psn: psn, payload: data[k*1024 : (k+1)*1024], sr: true}
		switch k {
		case 0:
			r.op, r.va, r.rkey, r.dmaLen = bth.RCRDMAWriteFirst, 0x1000, 9, 4096
		case 3:
			r.op, r.ackReq = bth.RCRDMAWriteLast, true
		}
		return r
	}
	for _, psn := range []bth.PSN{501, 502, 503} {
		c.inject(w(psn))
	}
	if pool.InUse() != 3 || c.qp.SRHeld != 3 {
		t.Fatalf("held %d, pool in use %d", c.qp.SRHeld, pool.InUse())
	}
	// One visit: the hole arrives, the held packets execute, and a packet
	// of the next message comes early.
	c.qp.Receive(c.now, w(500).bytes(cfg.QPN), nil)
	c.qp.Receive(c.now, req{op: bth.RCRDMAWriteOnly, psn: 505, ackReq: true, va: 0x1800, rkey: 9, dmaLen: 4, payload: fill(4, 1), sr: true}.bytes(cfg.QPN), nil)
	if !bytes.Equal(mr.buf[:4096], data) || c.qp.resp.ePSN != 504 {
		t.Fatalf("expected PSN %d, data placed %v", c.qp.resp.ePSN, bytes.Equal(mr.buf[:4096], data))
	}
	if pool.InUse() != 3 || c.qp.SRDropped != 1 {
		t.Fatalf("within the visit: pool in use %d (want the 3 executed), dropped %d", pool.InUse(), c.qp.SRDropped)
	}
	c.qp.TakeCompletions()
	if pool.InUse() != 0 {
		t.Fatalf("after the visit: %d buffers in use", pool.InUse())
	}
}

// TestSRResponderPSNWrap: a hole just before the PSN wraps.
func TestSRResponderPSNWrap(t *testing.T) {
	cfg := srCfg()
	cfg.RQPSN = bth.PSNMask - 1
	c := newSRCtx(t, cfg)
	mr := c.addMR(9, 0x1000, 4096, ib.RemoteWrite)
	data := fill(4096, 3)
	pk := []req{
		{op: bth.RCRDMAWriteFirst, psn: bth.PSNMask - 1, va: 0x1000, rkey: 9, dmaLen: 4096, payload: data[:1024], sr: true},
		{op: bth.RCRDMAWriteMiddle, psn: bth.PSNMask, payload: data[1024:2048], sr: true},
		{op: bth.RCRDMAWriteMiddle, psn: 0, payload: data[2048:3072], sr: true},
		{op: bth.RCRDMAWriteLast, psn: 1, ackReq: true, payload: data[3072:], sr: true},
	}
	c.inject(pk[2])
	c.inject(pk[3])
	c.inject(pk[1])
	g := c.out()
	if have := sackOf(t, g[0]); g[0].PSN != bth.PSNMask-2 || len(have) != 3 || have[0] != bth.PSNMask || have[2] != 1 {
		t.Fatalf("%v SACK %v", g[0], have)
	}
	c.inject(pk[0])
	if g := c.out(); len(g) != 1 || g[0].PSN != 1 || !bytes.Equal(mr.buf, data) {
		t.Fatalf("after the hole filled: %v", g)
	}
}

// TestSRResponderReadRangeFirst: a READ range asked again is answered
// before the rest of a reply in progress, which goes on (a
// selective-repeat requester holds it); only the part the reply has
// already sent is sent again, and a range the reply has still to send is
// not answered twice (the requester's probe or timeout fired while the
// reply was merely slow).
func TestSRResponderReadRangeFirst(t *testing.T) {
	c := newSRCtx(t, srCfg())
	c.addMR(9, 0x1000, 8192, ib.RemoteRead)
	c.inject(req{op: bth.RCRDMAReadRequest, psn: 500, ackReq: true, va: 0x1000, rkey: 9, dmaLen: 8192, sr: true})
	for _, want := range []struct {
		op  bth.Opcode
		psn bth.PSN
	}{{bth.RCRDMAReadResponseFirst, 500}, {bth.RCRDMAReadResponseMiddle, 501}, {bth.RCRDMAReadResponseMiddle, 502}} {
		n := c.qp.Build(c.now, c.buf)
		if g := checker.Decode(c.buf[:n]); g.Op != want.op || g.PSN != want.psn || !g.SR {
			t.Fatalf("%v, want %v", g, want)
		}
	}
	// 501 is missing at the requester, which asks for it and everything
	// after it (up to 504): only 501 and 502 have been sent.
	c.inject(req{op: bth.RCRDMAReadRequest, psn: 501, ackReq: true, va: 0x1000 + 1024, rkey: 9, dmaLen: 3072, sr: true})
	// 505 and after: the reply has not got there, nothing to repeat.
	c.inject(req{op: bth.RCRDMAReadRequest, psn: 505, ackReq: true, va: 0x1000 + 5*1024, rkey: 9, dmaLen: 3072, sr: true})
	g := c.expect(p(bth.RCRDMAReadResponseFirst, 501), p(bth.RCRDMAReadResponseLast, 502),
		p(bth.RCRDMAReadResponseMiddle, 503), p(bth.RCRDMAReadResponseMiddle, 504), p(bth.RCRDMAReadResponseMiddle, 505),
		p(bth.RCRDMAReadResponseMiddle, 506), p(bth.RCRDMAReadResponseLast, 507))
	for _, x := range g {
		if !x.SR {
			t.Fatalf("%v unmarked", x)
		}
	}
	if c.qp.RxDuplicate != 2 {
		t.Fatalf("%d duplicates counted, want 2", c.qp.RxDuplicate)
	}
	// Once the reply is gone, the same request is answered in full.
	c.inject(req{op: bth.RCRDMAReadRequest, psn: 505, ackReq: true, va: 0x1000 + 5*1024, rkey: 9, dmaLen: 3072, sr: true})
	c.expect(p(bth.RCRDMAReadResponseFirst, 505), p(bth.RCRDMAReadResponseMiddle, 506), p(bth.RCRDMAReadResponseLast, 507))
}

// TestSRResponderRNR: an RNR NAK for the expected SEND keeps what is held
// beyond it; once the requester resends, both complete.
func TestSRResponderRNR(t *testing.T) {
	c := newSRCtx(t, srCfg())
	c.inject(req{op: bth.RCSendOnly, psn: 500, ackReq: true, payload: fill(8, 1), sr: true})
	c.inject(req{op: bth.RCSendOnly, psn: 501, ackReq: true, payload: fill(8, 2), sr: true})
	g := c.out()
	if g[0].Syn&0xE0 != SynRNRNAK || g[0].PSN != 500 || !g[0].SR {
		t.Fatalf("%v", g)
	}
	c.rq.post(1, make([]byte, 8))
	c.rq.post(2, make([]byte, 8))
	c.inject(req{op: bth.RCSendOnly, psn: 500, ackReq: true, payload: fill(8, 1), sr: true})
	if w := c.wcs(); len(w) != 2 || w[0].ID != 1 || w[1].ID != 2 {
		t.Fatalf("%+v", w)
	}
}

// srRequester is a requester that has agreed on selective repeat and has
// an RTT sample.
func srRequester(t *testing.T, cfg Config) *tctx {
	c := newSRCtx(t, cfg)
	c.post(ib.SendWQE{ID: 999, Opcode: ib.Send, SG: segs(fill(4, 0))})
	g := c.out()
	if !g[0].SR {
		t.Fatal("request not marked")
	}
	c.now = c.now.Add(50 * time.Microsecond)
	c.respond(srAck(g[0].PSN))
	if r, _ := c.qp.SelectiveRepeat(); !r {
		t.Fatal("no agreement")
	}
	return c
}

func sends(c *tctx, n int, first uint64) {
	for i := 0; i < n; i++ {
		c.post(ib.SendWQE{ID: first + uint64(i), Opcode: ib.Send, Flags: ib.Signaled, SG: segs(fill(8, byte(i)))})
	}
}

// TestSRRequesterRetransmitsHoles: only the holes the SACK shows behind
// packets sent after them are sent again, with AckReq, head, middle and
// tail alike; a hole whose retransmission is lost too is sent again once
// a packet sent after that retransmission is acknowledged.
func TestSRRequesterRetransmitsHoles(t *testing.T) {
	for _, k := range []struct {
		name  string
		ack   bth.PSN
		have  []bth.PSN
		again []bth.PSN
	}{
		{"head", 100, []bth.PSN{102, 103, 104, 105, 106, 107, 108}, []bth.PSN{101}},
		{"middle", 103, []bth.PSN{105, 106, 108}, []bth.PSN{104, 107}},
		{"tail", 106, []bth.PSN{108}, []bth.PSN{107}},
	} {
		t.Run(k.name, func(t *testing.T) {
			c := srRequester(t, srCfg())
			sends(c, 8, 0)
			c.outEach() // 101..108
			c.respond(srAck(k.ack, k.have...))
			g := c.out()
			if len(g) != len(k.again) {
				t.Fatalf("resent %v, want %v", g, k.again)
			}
			for i := range g {
				if g[i].PSN != k.again[i] || !g[i].AckReq || !g[i].SR {
					t.Fatalf("resent %v, want %v", g, k.again)
				}
			}
			if c.qp.SelRetrans != uint64(len(k.again)) || c.qp.Retransmits != 0 {
				t.Fatalf("%+v", c.qp.Counters)
			}
			c.respond(srAck(108))
			if w := c.wcs(); len(w) != 8 || w[7].ID != 7 {
				t.Fatalf("%+v", w)
			}
		})
	}
	// The retransmission of 102 is lost as well: 109, sent after it, is
	// acknowledged selectively, so 102 goes again; a third time it is not
	// sent before a newer packet is known to have arrived.
	c := srRequester(t, srCfg())
	sends(c, 8, 0)
	c.outEach()
	c.respond(srAck(101, 103, 104, 105, 106, 107, 108))
	c.expect(p(bth.RCSendOnly, 102))
	c.now = c.now.Add(time.Microsecond)
	sends(c, 1, 8)
	c.expect(p(bth.RCSendOnly, 109))
	c.respond(srAck(101, 103, 104, 105, 106, 107, 108))
	c.expect()
	c.respond(srAck(101, 103, 104, 105, 106, 107, 108, 109))
	c.expect(p(bth.RCSendOnly, 102))
	c.respond(srAck(109))
	if w := c.wcs(); len(w) != 9 || c.qp.SelRetrans != 2 {
		t.Fatalf("%d completions, %d selective retransmissions", len(w), c.qp.SelRetrans)
	}
}

// TestSRRequesterLostACKs: SACKs lost on the way back cost nothing once a
// later cumulative ACK arrives.
func TestSRRequesterLostACKs(t *testing.T) {
	c := srRequester(t, srCfg())
	sends(c, 8, 0)
	c.outEach()
	c.respond(srAck(108))
	if w := c.wcs(); len(w) != 8 || c.qp.SelRetrans != 0 {
		t.Fatalf("%d completions %+v", len(w), c.qp.Counters)
	}
}

// TestSRRequesterReordering: a packet acknowledged after one sent later,
// without having been sent again, shows the path reorders; from then on
// RACK allows a quarter of the minimum RTT before declaring a hole lost.
func TestSRRequesterReordering(t *testing.T) {
	c := srRequester(t, srCfg())
	sends(c, 4, 0)
	c.outEach() // 101..104
	c.now = c.now.Add(40 * time.Microsecond)
	c.respond(srAck(100, 102, 103, 104))
	if c.qp.req.sr.lost != 1 || c.qp.req.sr.reordering {
		t.Fatalf("lost %d", c.qp.req.sr.lost)
	}
	c.respond(srAck(104)) // 101 was only late
	if !c.qp.req.sr.reordering || c.qp.req.sr.lost != 0 {
		t.Fatalf("reordering %v lost %d", c.qp.req.sr.reordering, c.qp.req.sr.lost)
	}
	c.expect()
	if time.Duration(c.qp.srReoWindow()) != c.qp.req.rtt.minRTT/4 || c.qp.srReoWindow() == 0 {
		t.Fatalf("reordering window %v", c.qp.srReoWindow())
	}
	// Now a hole behind packets sent less than that later is not lost yet.
	sends(c, 4, 10)
	c.outEach() // 105..108
	c.respond(srAck(104, 106, 107, 108))
	c.expect()
	// A packet sent more than that later does it.
	c.now = c.now.Add(time.Duration(c.qp.srReoWindow()))
	sends(c, 1, 20)
	c.expect(p(bth.RCSendOnly, 109))
	c.respond(srAck(104, 106, 107, 108, 109))
	c.expect(p(bth.RCSendOnly, 105))
	c.now = c.now.Add(40 * time.Microsecond)
	c.respond(srAck(109))

	// With nothing sent after it, RACK's reordering timer does: the hole
	// is lost once the delivered packet's RTT and the window have passed
	// since it was sent, well before any RTO (RFC 8985, 6.2 step 5).
	sends(c, 4, 30)
	c.outEach() // 110..113
	c.now = c.now.Add(40 * time.Microsecond)
	c.respond(srAck(109, 111, 112, 113))
	c.expect()
	reo := c.qp.req.sr.reoAt
	if reo == clock.Never || reo >= c.qp.req.rtoAt || c.qp.Deadline() != reo {
		t.Fatalf("reordering timer at %v (RTO %v, deadline %v)", reo, c.qp.req.rtoAt, c.qp.Deadline())
	}
	c.now = reo
	c.qp.Expire(c.now)
	c.expect(p(bth.RCSendOnly, 110))
	if c.qp.AdpRetransTO != 0 {
		t.Fatalf("an RTO fired: %+v", c.qp.Counters)
	}
}

// TestSRRequesterReadHoles: a READ reply with a hole is held and only the
// missing range is asked for again (a READ of one MTU at its offset); the
// reply of that range ends with an ONLY before the READ's last PSN.
func TestSRRequesterReadHoles(t *testing.T) {
	c := srRequester(t, srCfg())
	dst := make([]byte, 4096)
	src := fill(4096, 5)
	c.post(ib.SendWQE{ID: 1, Opcode: ib.RDMARead, Flags: ib.Signaled, SG: segs(dst), RemoteAddr: 0x9000, RKey: 3})
	c.expect(p(bth.RCRDMAReadRequest, 101))
	resp := func(op bth.Opcode, psn bth.PSN) req {
		i := int(psn - 101)
		return req{op: op, psn: psn, syn: SynACK, sr: true, payload: src[i*1024 : (i+1)*1024]}
	}
	c.respond(resp(bth.RCRDMAReadResponseFirst, 101))
	c.respond(resp(bth.RCRDMAReadResponseMiddle, 103))
	c.respond(resp(bth.RCRDMAReadResponseLast, 104))
	g := c.expect(p(bth.RCRDMAReadRequest, 102))
	if r := bth.RETH(g[0].Raw[12:]); r.VA() != 0x9000+1024 || r.DMALen() != 1024 || c.qp.SRHeld != 2 || c.qp.ImpliedNAKs != 1 {
		t.Fatalf("asked again for va %#x len %d; %+v", r.VA(), r.DMALen(), c.qp.Counters)
	}
	c.respond(resp(bth.RCRDMAReadResponseOnly, 102))
	if w := c.wcs(); len(w) != 1 || !bytes.Equal(dst, src) || c.qp.pool.InUse() != 0 {
		t.Fatalf("%+v, pool %d", w, c.qp.pool.InUse())
	}
}

// TestSRRequesterAckBeyondMissingResponse: an ACK of a SEND after a READ
// (or atomic) whose response is missing asks for the missing response
// only; the SEND, which the ACK covers, completes after it without being
// sent again.
func TestSRRequesterAckBeyondMissingResponse(t *testing.T) {
	c := srRequester(t, srCfg())
	dst := make([]byte, 2048)
	src := fill(2048, 6)
	c.post(ib.SendWQE{ID: 1, Opcode: ib.RDMARead, Flags: ib.Signaled, SG: segs(dst), RemoteAddr: 0x9000, RKey: 3})
	c.post(ib.SendWQE{ID: 2, Opcode: ib.AtomicFetchAndAdd, Flags: ib.Signaled, SG: segs(make([]byte, 8)), Length: 8, RemoteAddr: 0x8, RKey: 3})
	sends(c, 1, 3)
	c.expect(p(bth.RCRDMAReadRequest, 101), p(bth.RCFetchAdd, 103), p(bth.RCSendOnly, 104))
	c.respond(req{op: bth.RCRDMAReadResponseFirst, psn: 101, syn: SynACK, sr: true, payload: src[:1024]})
	c.respond(srAck(104)) // READ LAST 102 and the atomic ACK 103 were lost
	g := c.expect(p(bth.RCRDMAReadRequest, 102), p(bth.RCFetchAdd, 103))
	if r := bth.RETH(g[0].Raw[12:]); r.VA() != 0x9000+1024 || r.DMALen() != 1024 {
		t.Fatalf("READ asked again for va %#x len %d", r.VA(), r.DMALen())
	}
	c.respond(req{op: bth.RCRDMAReadResponseOnly, psn: 102, syn: SynACK, sr: true, payload: src[1024:]})
	c.respond(req{op: bth.RCAtomicAcknowledge, psn: 103, syn: SynACK, sr: true, orig: 5})
	w := c.wcs()
	if len(w) != 3 || w[0].ID != 1 || w[1].ID != 2 || w[2].ID != 3 || !bytes.Equal(dst, src) {
		t.Fatalf("%+v", w)
	}
	c.expect()
}

// TestSRRequesterPSNWrap: holes and SACKs across the PSN wrap.
func TestSRRequesterPSNWrap(t *testing.T) {
	cfg := srCfg()
	cfg.SQPSN = bth.PSNMask - 2
	c := srRequester(t, cfg)
	sends(c, 4, 0)
	c.outEach() // 0xFFFFFE, 0xFFFFFF, 0, 1
	c.respond(srAck(bth.PSNMask-1, 0, 1))
	c.expect(p(bth.RCSendOnly, bth.PSNMask))
	c.respond(srAck(1))
	if w := c.wcs(); len(w) != 4 {
		t.Fatalf("%+v", w)
	}
}

// TestSRRequesterRNRGoesBackN: after an RNR wait everything from the RNR
// NAK's PSN is sent again in order, even what a SACK showed held (the
// responder may have let it go).
func TestSRRequesterRNRGoesBackN(t *testing.T) {
	c := srRequester(t, srCfg())
	sends(c, 3, 0)
	c.outEach()
	c.respond(req{op: bth.RCAcknowledge, psn: 101, syn: SynRNRNAK | 1, sr: true, payload: sack(102, 102, 103)})
	c.now = c.qp.Deadline()
	c.qp.Expire(c.now)
	c.expect(p(bth.RCSendOnly, 101), p(bth.RCSendOnly, 102), p(bth.RCSendOnly, 103))
}

// TestSRRequesterRNRWaitOvertaken: ACKs that come during an RNR wait may
// pass the PSN the RNR NAK named (a copy of it sent before the NAK arrived
// found a receive WQE, and the responder then executed what it held). The
// wait then ends at the oldest unacknowledged PSN: a WQE posted meanwhile
// takes the next PSN, never one the responder has already executed, which
// it would acknowledge as a duplicate without delivering the message.
func TestSRRequesterRNRWaitOvertaken(t *testing.T) {
	c := srRequester(t, srCfg())
	sends(c, 3, 0)
	c.outEach()
	c.respond(req{op: bth.RCAcknowledge, psn: 101, syn: SynRNRNAK | 1, sr: true, payload: sack(102, 102, 103)})
	c.respond(srAck(103))
	if w := c.wcs(); len(w) != 3 || w[2].ID != 2 {
		t.Fatalf("%+v", w)
	}
	sends(c, 2, 3)
	c.expect() // still waiting
	c.now = c.qp.Deadline()
	c.qp.Expire(c.now)
	c.expect(p(bth.RCSendOnly, 104), p(bth.RCSendOnly, 105))
	c.respond(srAck(105))
	if w := c.wcs(); len(w) != 2 || w[0].ID != 3 || w[1].ID != 4 {
		t.Fatalf("%+v", w)
	}
}

// TestSRRequesterReadBeyondWindow: a READ reply longer than the
// selective-repeat window loses a packet early; what arrives beyond the
// window cannot be held, and is asked for again as soon as everything
// before it has come, without waiting for a timer.
func TestSRRequesterReadBeyondWindow(t *testing.T) {
	c := srRequester(t, srCfg())
	const n = SRWindow + 100
	dst := make([]byte, n*1024)
	src := fill(n*1024, 8)
	c.post(ib.SendWQE{ID: 1, Opcode: ib.RDMARead, Flags: ib.Signaled, SG: segs(dst), RemoteAddr: 0x10000, RKey: 3})
	c.expect(p(bth.RCRDMAReadRequest, 101))
	resp := func(op bth.Opcode, psn bth.PSN) req {
		i := int(psn - 101)
		return req{op: op, psn: psn, syn: SynACK, sr: true, payload: src[i*1024 : (i+1)*1024]}
	}
	c.respond(resp(bth.RCRDMAReadResponseFirst, 101))
	for psn := bth.PSN(103); psn < 101+n-1; psn++ { // 102 lost
		c.respond(resp(bth.RCRDMAReadResponseMiddle, psn))
	}
	c.respond(resp(bth.RCRDMAReadResponseLast, 101+n-1))
	if c.qp.SRDropped == 0 {
		t.Fatal("nothing beyond the window")
	}
	c.expect(p(bth.RCRDMAReadRequest, 102))
	c.respond(resp(bth.RCRDMAReadResponseOnly, 102))
	// Everything held has drained up to the first packet dropped: the
	// rest of the READ is asked for at once.
	g := c.expect(p(bth.RCRDMAReadRequest, c.qp.req.compPSN))
	from := g[0].PSN
	if r := bth.RETH(g[0].Raw[12:]); r.VA() != 0x10000+uint64(from-101)*1024 || r.DMALen() != uint32(101+n-from)*1024 {
		t.Fatalf("rest asked for at va %#x len %d", r.VA(), r.DMALen())
	}
	for psn := from; psn < 101+n; psn++ {
		op := bth.RCRDMAReadResponseMiddle
		switch psn {
		case from:
			op = bth.RCRDMAReadResponseFirst
		case 101 + n - 1:
			op = bth.RCRDMAReadResponseLast
		}
		c.respond(resp(op, psn))
	}
	if w := c.wcs(); len(w) != 1 || !bytes.Equal(dst, src) || c.qp.pool.InUse() != 0 || c.qp.TLPProbes != 0 {
		t.Fatalf("%+v; pool %d probes %d", w, c.qp.pool.InUse(), c.qp.TLPProbes)
	}
}

// TestSRResponderAcksAQuarterWindow: a selective-repeat responder
// acknowledges every quarter of the receive window its device grants, with
// or without AckReq, and its SACKETH carries that window; a requester whose
// window shrank while packets were in flight is never left waiting for an
// ACK none of them asked for.
func TestSRResponderAcksAQuarterWindow(t *testing.T) {
	c := newSRCtx(t, srCfg())
	c.addMR(9, 0x1000, 1<<16, ib.RemoteWrite)
	m := &transport.Meta{RecvWindow: 16}
	for i := 0; i < 10; i++ {
		r := req{op: bth.RCRDMAWriteMiddle, psn: bth.PSN(500 + i), payload: fill(1024, byte(i)), sr: true}
		if i == 0 {
			r.op, r.va, r.rkey, r.dmaLen = bth.RCRDMAWriteFirst, 0x1000, 9, 1<<16
		}
		c.qp.Receive(c.now, r.bytes(c.qp.cfg.QPN), m)
	}
	g := c.out()
	if len(g) != 1 || g[0].PSN != 507 {
		t.Fatalf("after 10 packets without AckReq: %v, want one ACK of 507 (every 4, coalesced)", g)
	}
	if w := bth.SACKETH(g[0].Raw[bth.BTHLen+bth.AETHLen:]).Window(); w != 16 {
		t.Fatalf("SACKETH window %d, want 16", w)
	}
	c.qp.Receive(c.now, req{op: bth.RCRDMAWriteMiddle, psn: 510, payload: fill(1024, 10), sr: true}.bytes(c.qp.cfg.QPN), m)
	c.qp.Receive(c.now, req{op: bth.RCRDMAWriteMiddle, psn: 511, payload: fill(1024, 11), sr: true}.bytes(c.qp.cfg.QPN), m)
	if g := c.out(); len(g) != 1 || g[0].PSN != 511 {
		t.Fatalf("%v, want an ACK of 511", g)
	}
}

// TestSRResponderAcksWhatIsNew: a held request is acknowledged at once when
// it tells the requester something new (the first after a hole, the first
// after a second hole, one asking for an ACK, a duplicate); requests that
// only extend the run held after a hole are acknowledged every srAckHeld.
// The packet that fills the hole is acknowledged with all it released.
func TestSRResponderAcksWhatIsNew(t *testing.T) {
	c := newSRCtx(t, srCfg())
	mr := c.addMR(9, 0x1000, 1<<16, ib.RemoteWrite)
	pkt := func(p bth.PSN, ackReq bool) req {
		r := req{op: bth.RCRDMAWriteMiddle, psn: p, payload: fill(1024, byte(p)), sr: true, ackReq: ackReq}
		if p == 500 {
			r.op, r.va, r.rkey, r.dmaLen = bth.RCRDMAWriteFirst, 0x1000, 9, 1<<16
		}
		return r
	}
	var acked []bth.PSN // the held packets answered at once
	send := func(p bth.PSN, ackReq bool) []checker.Packet {
		c.inject(pkt(p, ackReq))
		g := c.out()
		if len(g) > 1 {
			t.Fatalf("after %d: %v", p, g)
		}
		if len(g) == 1 {
			acked = append(acked, p)
		}
		return g
	}
	for p := bth.PSN(501); p <= 518; p++ { // 500 lost
		send(p, false)
	}
	send(520, false) // 519 lost too
	send(521, true)
	send(510, false) // a duplicate
	want := []bth.PSN{501, 501 + srAckHeld, 501 + 2*srAckHeld, 520, 521, 510}
	if fmt.Sprint(acked) != fmt.Sprint(want) {
		t.Fatalf("held packets answered at once: %v, want %v", acked, want)
	}
	g := send(500, true) // the retransmission fills the first hole
	if len(g) != 1 {
		t.Fatalf("the hole's fill was not acknowledged: %v", g)
	}
	have := map[bth.PSN]bool{}
	for _, p := range sackOf(t, g[0]) {
		have[p] = true
	}
	for p := bth.PSN(500); p <= 521; p++ {
		if got := !g[0].PSN.Less(p) || have[p]; got != (p != 519) {
			t.Fatalf("ACK %d with SACK %v: PSN %d acknowledged %v", g[0].PSN, sackOf(t, g[0]), p, got)
		}
	}
	if c.qp.resp.ePSN != 519 || !bytes.Equal(mr.buf[18*1024:19*1024], fill(1024, byte(518%256))) {
		t.Fatalf("expected PSN %d after the fill", c.qp.resp.ePSN)
	}
}

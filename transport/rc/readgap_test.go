package rc

import (
	"bytes"
	"testing"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/ib"
)

// TestCompleterReadReplyGapWithReadsOutstanding replays, packet for
// packet, what the interop lab showed with `ib_read_bw -q 4` against rxe:
// several READs outstanding, one frame of the second READ's
// reply lost in the middle (the lab's guest qdisc dropped it after rxe had
// counted it sent), and the rest of that reply and the next READ's reply
// still arriving. The requester must ask again exactly once, from the
// missing PSN (go-back-N for READ, IBA 9.7.5.1: the RETH of the new request
// starts at the first missing byte), re-send the READ behind it unchanged,
// ignore the out-of-sequence frames still in flight, and accept rxe's
// replay of a request that starts mid-message, which begins with a MIDDLE
// rather than a FIRST (rxe_resp.c duplicate_request/read_reply). Every
// byte must land and the WRs complete in order, with no timeout.
func TestCompleterReadReplyGapWithReadsOutstanding(t *testing.T) {
	cfg := defaultCfg()
	cfg.Recovery = ib.RecoveryTimeout // rxe's requester: every READ sent at once
	c := newCtx(t, cfg)
	const n = 4 * 1024 // four response packets per READ at MTU 1024
	src := [3][]byte{fill(n, 1), fill(n, 2), fill(n, 3)}
	var dst [3][]byte
	va := [3]uint64{0x10000, 0x20000, 0x30000}
	for i := range dst {
		dst[i] = make([]byte, n)
		c.post(ib.SendWQE{ID: uint64(i + 1), Opcode: ib.RDMARead, Flags: ib.Signaled, SG: segs(dst[i]), RemoteAddr: va[i], RKey: 9})
	}
	// READs at PSNs 100 (100..103), 104 (104..107) and 108 (108..111).
	c.expect(p(bth.RCRDMAReadRequest, 100), p(bth.RCRDMAReadRequest, 104), p(bth.RCRDMAReadRequest, 108))

	reply := func(i int, first bth.PSN, from int, firstOp bth.Opcode) {
		for k := from; k < 4; k++ {
			op := bth.RCRDMAReadResponseMiddle
			switch k {
			case from:
				op = firstOp
			case 3:
				op = bth.RCRDMAReadResponseLast
			}
			c.respond(req{op: op, psn: first + bth.PSN(k), syn: SynACK, msn: uint32(i + 1), payload: src[i][k*1024 : (k+1)*1024]})
		}
	}
	// READ 1 arrives whole and completes.
	reply(0, 100, 0, bth.RCRDMAReadResponseFirst)
	if w := c.wcs(); len(w) != 1 || w[0].ID != 1 || w[0].Status != ib.Success || !bytes.Equal(dst[0], src[0]) {
		t.Fatalf("READ 1: %+v", w)
	}
	// READ 2: FIRST (104) arrives, MIDDLE 105 is lost, 106 shows the gap.
	c.respond(req{op: bth.RCRDMAReadResponseFirst, psn: 104, syn: SynACK, msn: 2, payload: src[1][:1024]})
	c.respond(req{op: bth.RCRDMAReadResponseMiddle, psn: 106, payload: src[1][2048:3072]})
	g := c.expect(p(bth.RCRDMAReadRequest, 105), p(bth.RCRDMAReadRequest, 108))
	if r := bth.RETH(g[0].Raw[12:]); r.VA() != va[1]+1024 || r.DMALen() != n-1024 || r.RKey() != 9 {
		t.Fatalf("re-request of READ 2: va %#x len %d rkey %d", r.VA(), r.DMALen(), r.RKey())
	}
	if r := bth.RETH(g[1].Raw[12:]); r.VA() != va[2] || r.DMALen() != n {
		t.Fatalf("READ 3 re-sent with va %#x len %d", r.VA(), r.DMALen())
	}
	// The rest of the original replies is still on the wire: LAST of
	// READ 2 and all of READ 3. None of it may trigger another re-request.
	c.respond(req{op: bth.RCRDMAReadResponseLast, psn: 107, syn: SynACK, msn: 2, payload: src[1][3072:]})
	reply(2, 108, 0, bth.RCRDMAReadResponseFirst)
	c.expect()
	if w := c.wcs(); len(w) != 0 {
		t.Fatalf("completed across the gap: %+v", w)
	}
	// rxe replays the re-request from 105 (MIDDLE, MIDDLE, LAST), then
	// answers the repeated READ 3 as a duplicate (FIRST..LAST).
	reply(1, 104, 1, bth.RCRDMAReadResponseMiddle)
	reply(2, 108, 0, bth.RCRDMAReadResponseFirst)
	w := c.wcs()
	if len(w) != 2 || w[0].ID != 2 || w[1].ID != 3 || w[0].Status != ib.Success || w[1].Status != ib.Success {
		t.Fatalf("completions %+v", w)
	}
	for i := range dst {
		if !bytes.Equal(dst[i], src[i]) {
			t.Fatalf("READ %d data differs", i+1)
		}
	}
	c.expect()
	if c.qp.Retransmits != 1 || c.qp.Timeouts != 0 || c.qp.Failed() {
		t.Fatalf("retransmits %d timeouts %d failed %v", c.qp.Retransmits, c.qp.Timeouts, c.qp.Failed())
	}
	// Out of sequence inside the gapped READ: 106 and 107 (READ 3's
	// first-pass frames are beyond the head WQE and only prove the gap
	// again, which a retry in progress ignores).
	if c.qp.RxOutOfSeq != 2 {
		t.Fatalf("RxOutOfSeq %d, want 2", c.qp.RxOutOfSeq)
	}
}

package rc

import (
	"reflect"
	"testing"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/checker"
)

// TestCountersRequesterNAKs: each NAK kind received is counted under its
// own name (packet_seq_err, req_remote_access_errors,
// req_remote_invalid_request), and a READ response gap once per gap
// (implied_nak_seq_err).
func TestCountersRequesterNAKs(t *testing.T) {
	c := newCtx(t, defaultCfg())
	c.post(ib.SendWQE{ID: 1, Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: segs(fill(3000, 1)), RemoteAddr: 0x100, RKey: 1})
	c.out()
	c.respond(req{op: bth.RCAcknowledge, psn: 101, syn: SynNAKPSNSeq})
	c.out()
	c.respond(req{op: bth.RCAcknowledge, psn: 101, syn: SynNAKPSNSeq}) // a repeat while resending: still a NAK received
	if c.qp.RxNAKSeqErr != 2 || c.qp.RxNAKRemAccess != 0 || c.qp.RxNAKInvReq != 0 || c.qp.ImpliedNAKs != 0 {
		t.Fatalf("after two sequence NAKs: %+v", c.qp.Counters)
	}
	c.respond(req{op: bth.RCAcknowledge, psn: 102, syn: SynACK, msn: 1})

	// A READ whose middle response is lost: one implied NAK per gap, not
	// per out-of-order packet.
	dst := make([]byte, 2100)
	c.post(ib.SendWQE{ID: 2, Opcode: ib.RDMARead, Flags: ib.Signaled, SG: segs(dst), RemoteAddr: 0x9000, RKey: 3})
	c.expect(p(bth.RCRDMAReadRequest, 103))
	src := fill(2100, 5)
	c.respond(req{op: bth.RCRDMAReadResponseFirst, psn: 103, syn: SynACK, msn: 2, payload: src[:1024]})
	c.respond(req{op: bth.RCRDMAReadResponseLast, psn: 105, syn: SynACK, msn: 2, payload: src[2048:]})
	c.respond(req{op: bth.RCRDMAReadResponseLast, psn: 105, syn: SynACK, msn: 2, payload: src[2048:]})
	if c.qp.ImpliedNAKs != 1 {
		t.Fatalf("implied NAKs %d after one gap, want 1", c.qp.ImpliedNAKs)
	}

	for _, k := range []struct {
		syn                uint8
		remAccess, invalid uint64
	}{{SynNAKRemAccess, 1, 0}, {SynNAKInvReq, 0, 1}, {SynNAKRemOp, 0, 0}} {
		c := newCtx(t, defaultCfg())
		c.post(ib.SendWQE{ID: 1, Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: segs(fill(8, 0)), RemoteAddr: 0x100, RKey: 1})
		c.out()
		c.respond(req{op: bth.RCAcknowledge, psn: 100, syn: k.syn})
		if c.qp.RxNAKRemAccess != k.remAccess || c.qp.RxNAKInvReq != k.invalid || c.qp.RxNAKSeqErr != 0 {
			t.Errorf("NAK %#x: %+v", k.syn, c.qp.Counters)
		}
		// A second error NAK for the same PSN is stale: not counted again.
		c.respond(req{op: bth.RCAcknowledge, psn: 99, syn: k.syn})
		if c.qp.RxNAKRemAccess != k.remAccess || c.qp.RxNAKInvReq != k.invalid {
			t.Errorf("NAK %#x counted when stale: %+v", k.syn, c.qp.Counters)
		}
	}
}

// TestCountersResponderRequests: request messages are counted by kind at
// their first packet, never for duplicates or SENDs; refused rkeys count
// as remote access errors, a receive WQE too small as a local length error.
func TestCountersResponderRequests(t *testing.T) {
	c := newCtx(t, defaultCfg())
	c.addMR(9, 0x1000, 8192, ib.RemoteWrite|ib.RemoteRead|ib.RemoteAtomic)
	data := fill(2500, 3)
	c.inject(req{op: bth.RCRDMAWriteFirst, psn: 500, va: 0x1000, rkey: 9, dmaLen: 2500, payload: data[:1024]})
	c.inject(req{op: bth.RCRDMAWriteMiddle, psn: 501, payload: data[1024:2048]})
	c.inject(req{op: bth.RCRDMAWriteLast, psn: 502, ackReq: true, payload: data[2048:]})
	c.inject(req{op: bth.RCRDMAWriteOnly, psn: 503, ackReq: true, va: 0x1000, rkey: 9, dmaLen: 8, payload: fill(8, 0)})
	c.inject(req{op: bth.RCRDMAWriteOnly, psn: 503, ackReq: true, va: 0x1000, rkey: 9, dmaLen: 8, payload: fill(8, 0)}) // duplicate
	c.inject(req{op: bth.RCRDMAReadRequest, psn: 504, ackReq: true, va: 0x1000, rkey: 9, dmaLen: 100})
	c.inject(req{op: bth.RCFetchAdd, psn: 505, ackReq: true, va: 0x1000, rkey: 9, swap: 1})
	c.inject(req{op: bth.RCCompareSwap, psn: 506, ackReq: true, va: 0x1008, rkey: 9, swap: 1})
	c.rq.post(1, make([]byte, 64))
	c.inject(req{op: bth.RCSendOnly, psn: 507, ackReq: true, payload: fill(10, 0)})
	c.out()
	q := &c.qp.Counters
	if q.RxWriteReqs != 2 || q.RxReadReqs != 1 || q.RxAtomicReqs != 2 || q.RxDuplicate != 1 {
		t.Fatalf("requests: %+v", *q)
	}
	if q.RemAccessErrs != 0 || q.LocalLengthErrs != 0 || q.TxNAKs != 0 {
		t.Fatalf("errors without a bad request: %+v", *q)
	}

	c = newCtx(t, defaultCfg())
	c.addMR(9, 0x1000, 64, ib.RemoteWrite)
	c.inject(req{op: bth.RCRDMAWriteOnly, psn: 500, ackReq: true, va: 0x1000, rkey: 77, dmaLen: 4, payload: fill(4, 0)})
	c.expect(nak(SynNAKRemAccess, 500, 0))
	if q := &c.qp.Counters; q.RemAccessErrs != 1 || q.RxWriteReqs != 1 || q.LocalLengthErrs != 0 {
		t.Fatalf("bad rkey: %+v", *q)
	}

	c = newCtx(t, defaultCfg())
	c.rq.post(1, make([]byte, 16))
	c.inject(req{op: bth.RCSendOnly, psn: 500, ackReq: true, payload: fill(17, 0)})
	c.expect(nak(SynNAKInvReq, 500, 0))
	if q := &c.qp.Counters; q.LocalLengthErrs != 1 || q.RemAccessErrs != 0 {
		t.Fatalf("SEND longer than the receive buffer: %+v", *q)
	}
}

// TestCountersAddEveryField: Add sums every counter (a field added to
// Counters without a line in Add fails here).
func TestCountersAddEveryField(t *testing.T) {
	var a, b Counters
	va, vb := reflect.ValueOf(&a).Elem(), reflect.ValueOf(&b).Elem()
	for i := 0; i < vb.NumField(); i++ {
		va.Field(i).SetUint(uint64(i + 1))
		vb.Field(i).SetUint(uint64(100 * (i + 1)))
	}
	a.Add(&b)
	for i := 0; i < va.NumField(); i++ {
		if got := va.Field(i).Uint(); got != uint64(101*(i+1)) {
			t.Errorf("%s: %d, want %d", va.Type().Field(i).Name, got, 101*(i+1))
		}
	}
}

// TestCountersRetransPkts: every request packet sent a second time counts
// once, whether a go-back-N, a probe or a timeout sent it; first
// transmissions never do.
func TestCountersRetransPkts(t *testing.T) {
	c := newCtx(t, defaultCfg())
	c.post(ib.SendWQE{ID: 1, Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: segs(fill(3000, 1)), RemoteAddr: 0x100, RKey: 1})
	c.expect(p(bth.RCRDMAWriteFirst, 100), p(bth.RCRDMAWriteMiddle, 101), p(bth.RCRDMAWriteLast, 102))
	if c.qp.RetransPkts != 0 {
		t.Fatalf("first transmission counted: %d", c.qp.RetransPkts)
	}
	c.respond(req{op: bth.RCAcknowledge, psn: 101, syn: SynNAKPSNSeq}) // 100 arrived, 101 lost
	c.expect(p(bth.RCRDMAWriteMiddle, 101), p(bth.RCRDMAWriteLast, 102))
	if c.qp.RetransPkts != 2 {
		t.Fatalf("after a go-back-N of 2 packets: %d", c.qp.RetransPkts)
	}
	c.now = c.qp.Deadline() // the tail-loss probe
	c.qp.Expire(c.now)
	c.expect(p(bth.RCRDMAWriteMiddle, 101))
	if c.qp.RetransPkts != 3 || c.qp.TLPProbes != 1 {
		t.Fatalf("after the probe: %+v", c.qp.Counters)
	}
}

// TestCountersRespQueueFull: replies that find the response queue full are
// dropped (the requester asks again) and counted, never lost silently.
func TestCountersRespQueueFull(t *testing.T) {
	cfg := defaultCfg()
	cfg.MaxDestRdAtomic = 1
	c := newCtx(t, cfg)
	c.addMR(5, 0x2000, 64, ib.RemoteAtomic)
	c.inject(req{op: bth.RCFetchAdd, psn: 500, ackReq: true, va: 0x2000, rkey: 5, swap: 1})
	c.expect(checker.Is(checker.Opcode(bth.RCAtomicAcknowledge), checker.PSN(500), checker.AETH(SynACK, 1)))
	// Duplicates of the atomic, each answered from the resource table,
	// with nothing sent in between.
	const dups = 20
	for range dups {
		c.inject(req{op: bth.RCFetchAdd, psn: 500, ackReq: true, va: 0x2000, rkey: 5, swap: 1})
	}
	sent := len(c.out())
	if sent == 0 || sent == dups {
		t.Fatalf("%d of %d replays sent: the response queue should hold some, not all", sent, dups)
	}
	if got := c.qp.RespQueueFull; got != uint64(dups-sent) {
		t.Fatalf("RespQueueFull %d, want %d (%d replays, %d sent)", got, dups-sent, dups, sent)
	}
}

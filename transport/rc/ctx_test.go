package rc

import (
	"encoding/binary"
	"testing"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/checker"
)

// testMR is a registered region for the fake memory table.
type testMR struct {
	va     uint64
	buf    []byte
	access ib.Access
	valid  bool
}

// testMem is a minimal ib.Memory: rkey → MR, with the checks the device makes.
type testMem struct{ mrs map[uint32]*testMR }

func (m *testMem) Resolve(rkey uint32, va, n uint64, acc ib.Access) (ib.Seg, bool) {
	r := m.mrs[rkey]
	if r == nil || !r.valid || r.access&acc != acc || va < r.va || va+n > r.va+uint64(len(r.buf)) || va+n < va {
		return ib.Seg{}, false
	}
	return ib.LocalSeg(r.buf[va-r.va : va-r.va+n]), true
}

// segs is a scatter/gather list over local buffers.
func segs(bufs ...[]byte) []ib.Seg {
	sg := make([]ib.Seg, len(bufs))
	for i, b := range bufs {
		sg[i] = ib.LocalSeg(b)
	}
	return sg
}

func (m *testMem) Invalidate(rkey uint32) bool {
	r := m.mrs[rkey]
	if r == nil || !r.valid {
		return false
	}
	r.valid = false
	return true
}

// testRQ is a FIFO of receive WQEs.
type testRQ struct{ q []ib.RecvWQE }

func (r *testRQ) Take(dst *ib.RecvWQE) bool {
	if len(r.q) == 0 {
		return false
	}
	w := r.q[0]
	r.q = r.q[1:]
	sg := append(dst.SG[:0], w.SG...)
	*dst = w
	dst.SG = sg
	return true
}

func (r *testRQ) post(id uint64, buf []byte) {
	r.q = append(r.q, ib.RecvWQE{ID: id, SG: segs(buf), Length: uint32(len(buf))})
}

// tctx drives one QP in the style of gVisor's tcp testing/context: inject
// a packet, look at what comes out.
type tctx struct {
	t   *testing.T
	qp  *QP
	mem *testMem
	rq  *testRQ
	now clock.Time
	buf []byte
	// done are the completions inject took from the QP, as a device
	// takes them at the end of each visit.
	done []ib.WC
}

// defaultCfg is a QP whose peer is not softrnic's, retransmitting on its
// own timers (RecoveryAdaptive, which the default mode is toward such a
// peer).
func defaultCfg() Config {
	return Config{QPN: 0x11, DestQPN: 0x22, MTU: 1024, SQPSN: 100, RQPSN: 500, Timeout: 14, RetryCnt: 7, RNRRetry: 7,
		MinRNRTimer: 12, MaxRdAtomic: 16, MaxDestRdAtomic: 16, Recovery: ib.RecoveryAdaptive,
		Access: ib.LocalWrite | ib.RemoteWrite | ib.RemoteRead | ib.RemoteAtomic}
}

func newCtx(t *testing.T, cfg Config) *tctx {
	c := &tctx{t: t, mem: &testMem{mrs: map[uint32]*testMR{}}, rq: &testRQ{}}
	c.qp = New(cfg.QPN, 64, 4, c.mem, c.rq)
	c.qp.Receiver(cfg)
	c.qp.Sender(cfg)
	c.buf = make([]byte, c.qp.MaxPacket())
	return c
}

func (c *tctx) addMR(rkey uint32, va uint64, n int, acc ib.Access) *testMR {
	m := &testMR{va: va, buf: make([]byte, n), access: acc, valid: true}
	c.mem.mrs[rkey] = m
	return m
}

// out drains every packet the QP wants to send now.
func (c *tctx) out() []checker.Packet {
	var ps []checker.Packet
	for i := 0; i < 10000; i++ {
		n := c.qp.Build(c.now, c.buf)
		if n == 0 {
			return ps
		}
		ps = append(ps, checker.Decode(c.buf[:n]))
	}
	c.t.Fatal("Build never stops")
	return nil
}

// req builds a request packet addressed to the QP.
type req struct {
	op      bth.Opcode
	psn     bth.PSN
	ackReq  bool
	va      uint64
	rkey    uint32
	dmaLen  uint32
	imm     uint32
	inv     uint32
	swap    uint64
	cmp     uint64
	syn     uint8
	msn     uint32
	orig    uint64
	payload []byte // for an ACK with sr set: the SACKETH
	sr      bool   // the selective-repeat bit
}

func (r req) bytes(dest uint32) []byte {
	hl := r.op.HeaderLen()
	pad := (-len(r.payload)) & 3
	b := make([]byte, hl+len(r.payload)+pad)
	bth.BTH(b).Encode(&bth.BTHFields{Opcode: r.op, PKey: 0xFFFF, DestQP: dest, AckReq: r.ackReq, PSN: r.psn, PadCount: pad})
	if o := r.op.Offset(bth.ExtRETH); o >= 0 {
		bth.RETH(b[o:]).Encode(r.va, r.rkey, r.dmaLen)
	}
	if o := r.op.Offset(bth.ExtImmDt); o >= 0 {
		bth.ImmDt(b[o:]).SetImm(r.imm)
	}
	if o := r.op.Offset(bth.ExtIETH); o >= 0 {
		bth.IETH(b[o:]).SetRKey(r.inv)
	}
	if o := r.op.Offset(bth.ExtAtomicETH); o >= 0 {
		bth.AtomicETH(b[o:]).Encode(r.va, r.rkey, r.swap, r.cmp)
	}
	if o := r.op.Offset(bth.ExtAETH); o >= 0 {
		bth.AETH(b[o:]).Encode(r.syn, r.msn)
	}
	if o := r.op.Offset(bth.ExtAtomicAckETH); o >= 0 {
		bth.AtomicAckETH(b[o:]).SetOrig(r.orig)
	}
	copy(b[hl:], r.payload)
	bth.BTH(b).SetSR(r.sr)
	return b
}

// sack builds a SACKETH from base marking the given PSNs.
func sack(base bth.PSN, have ...bth.PSN) []byte {
	words := 0
	for _, p := range have {
		words = max(words, int(p.Diff(base))/32+1)
	}
	b := make([]byte, bth.SACKLen(words))
	s := bth.SACKETH(b)
	s.SetHeader(words, base, 0)
	for _, p := range have {
		d := uint32(p.Diff(base))
		s.SetWord(int(d/32), s.Word(int(d/32))|1<<(31-d%32))
	}
	return b
}

// sackWin is an empty SACKETH from base granting a receive window of win.
func sackWin(base bth.PSN, win int) []byte {
	b := make([]byte, bth.SACKLen(0))
	bth.SACKETH(b).SetHeader(0, base, win)
	return b
}

// srCfg is defaultCfg between softrnic QP numbers, so that selective
// repeat may be agreed.
func srCfg() Config {
	c := defaultCfg()
	c.QPN, c.DestQPN = SoftQPNTag|0x11, SoftQPNTag|0x22
	c.Recovery = ib.RecoveryDefault
	return c
}

// newSRCtx is newCtx with a reorder pool.
func newSRCtx(t *testing.T, cfg Config) *tctx {
	c := &tctx{t: t, mem: &testMem{mrs: map[uint32]*testMR{}}, rq: &testRQ{}}
	c.qp = New(cfg.QPN, 64, 4, c.mem, c.rq)
	c.qp.SetReorderPool(NewReorderPool(PacketLen(cfg.MTU), 64))
	c.qp.Receiver(cfg)
	c.qp.Sender(cfg)
	c.buf = make([]byte, c.qp.MaxPacket())
	return c
}

// inject delivers a packet and ends the visit as the device does: it takes
// the completions (which hands back the reorder pool's buffers the visit
// executed), for wcs to return.
func (c *tctx) inject(r req) {
	c.qp.Receive(c.now, r.bytes(c.qp.cfg.QPN), nil)
	c.done = append(c.done, c.qp.TakeCompletions()...)
}

func (c *tctx) wcs() []ib.WC {
	w := append(c.done, c.qp.TakeCompletions()...)
	c.done = nil
	return w
}

// expect asserts the exact sequence of packets that comes out: what each
// must be, as ack, nak and p say (opcode and PSN, and for ACKs syndrome and
// MSN), or any checker.Want.
func (c *tctx) expect(want ...checker.Want) []checker.Packet {
	c.t.Helper()
	got := c.out()
	checker.Packets(c.t, got, want...)
	return got
}

func ack(psn bth.PSN, msn uint32) checker.Want {
	return checker.Is(checker.Opcode(bth.RCAcknowledge), checker.PSN(psn), checker.AETH(SynACK, msn))
}

func nak(syn uint8, psn bth.PSN, msn uint32) checker.Want {
	return checker.Is(checker.Opcode(bth.RCAcknowledge), checker.PSN(psn), checker.AETH(syn, msn))
}

func p(op bth.Opcode, psn bth.PSN) checker.Want {
	return checker.Is(checker.Opcode(op), checker.PSN(psn))
}

func fill(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b
}

func le64(b []byte) uint64 { return binary.NativeEndian.Uint64(b) }

func neverTime() clock.Time { return clock.Never }

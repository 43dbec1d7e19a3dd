package rc

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/checker"
)

// flight is a packet on the simulated wire.
type flight struct {
	at  clock.Time
	seq int
	b   []byte
}

// wire is a seeded lossy, duplicating, reordering one-way link between two
// transport QPs, run in virtual time. With a rate, it is also a
// serialising link: a packet occupies it for its length at that rate.
type wire struct {
	rng              *rand.Rand
	loss, dup, reord float64
	q                []flight
	seq              int
	sent, lost       int
	bytes            int
	delay            time.Duration // one way (1 µs if zero)
	rate             float64       // bytes per ns; 0: no serialisation
	busy             clock.Time    // the link carries a packet until then
	// hold, when set, is when a packet put on the link at a time leaves
	// the sender: a peer that stalls (a guest under emulation) sends late.
	hold func(clock.Time) clock.Time
}

// idle reports whether the link can take a packet at now.
func (w *wire) idle(now clock.Time) bool { return w.rate == 0 || w.busy <= now }

func (w *wire) send(now clock.Time, b []byte) {
	w.sent++
	w.bytes += len(b)
	at := now
	if w.rate > 0 {
		// Ethernet, IP, UDP and ICRC around the transport packet.
		at = max(now, w.busy).Add(time.Duration(float64(len(b)+14+20+8+4) / w.rate))
		w.busy = at
	}
	if w.hold != nil {
		at = w.hold(at)
	}
	if w.rng.Float64() < w.loss {
		w.lost++
		return
	}
	copies := 1
	if w.rng.Float64() < w.dup {
		copies = 2
	}
	for i := 0; i < copies; i++ {
		d := w.delay
		if d == 0 {
			d = time.Microsecond
		}
		if w.rng.Float64() < w.reord {
			d += 20 * time.Microsecond
		}
		w.seq++
		w.q = append(w.q, flight{at: at.Add(d), seq: w.seq, b: append([]byte(nil), b...)})
	}
}

// due removes and returns the packets due at now, in delivery order.
func (w *wire) due(now clock.Time) [][]byte {
	var out [][]byte
	for {
		best := -1
		for i, f := range w.q {
			if f.at <= now && (best < 0 || f.at < w.q[best].at || (f.at == w.q[best].at && f.seq < w.q[best].seq)) {
				best = i
			}
		}
		if best < 0 {
			return out
		}
		out = append(out, w.q[best].b)
		w.q = append(w.q[:best], w.q[best+1:]...)
	}
}

func (w *wire) next() clock.Time {
	t := clock.Never
	for _, f := range w.q {
		t = clock.Min(t, f.at)
	}
	return t
}

// pair is two connected QPs and the wires between them.
type pair struct {
	a, b     *QP
	ab, ba   *wire
	now      clock.Time
	bufA     []byte
	bufB     []byte
	memA     *testMem
	memB     *testMem
	rqA, rqB *testRQ
}

func newPair(mtu int, seed uint64, loss, dup, reord float64) *pair {
	return newPairOpts(pairOpts{mtu: mtu, seed: seed, loss: loss, dup: dup, reord: reord, timeout: 5})
}

// pairOpts describes two connected QPs and the link between them.
type pairOpts struct {
	mtu              int
	seed             uint64
	loss, dup, reord float64
	recovery         ib.Recovery
	sr               bool          // softrnic QP numbers and a reorder pool on each side
	timeout          uint8         // local ACK timeout exponent
	delay            time.Duration // one way
	rate             float64       // bytes per ns, 0: unlimited
	sqDepth          int
	startPSN         bth.PSN // A's SQ PSN (B's RQ PSN)
	peerAdaptive     bool    // B does not agree to selective repeat
	// stallB, when set, holds what B sends (wire.hold).
	stallB func(clock.Time) clock.Time
}

func newPairOpts(o pairOpts) *pair {
	ca, cb := defaultCfg(), defaultCfg()
	ca.MTU, cb.MTU = o.mtu, o.mtu
	ca.QPN, ca.DestQPN, cb.QPN, cb.DestQPN = 0x11, 0x22, 0x22, 0x11
	if o.sr {
		ca.QPN, cb.QPN = SoftQPNTag|0x11, SoftQPNTag|0x22
		ca.DestQPN, cb.DestQPN = cb.QPN, ca.QPN
	}
	ca.SQPSN, cb.RQPSN = bth.PSNMask-40, bth.PSNMask-40 // cross the wrap early
	if o.startPSN != 0 {
		ca.SQPSN, cb.RQPSN = o.startPSN, o.startPSN
	}
	cb.SQPSN, ca.RQPSN = 7, 7
	ca.Timeout, cb.Timeout = o.timeout, o.timeout
	ca.Recovery, cb.Recovery = o.recovery, o.recovery
	if o.peerAdaptive {
		cb.Recovery = ib.RecoveryAdaptive
	}
	if o.sqDepth == 0 {
		o.sqDepth = 256
	}
	p := &pair{memA: &testMem{mrs: map[uint32]*testMR{}}, memB: &testMem{mrs: map[uint32]*testMR{}}, rqA: &testRQ{}, rqB: &testRQ{}}
	p.a = New(ca.QPN, o.sqDepth, 4, p.memA, p.rqA)
	p.b = New(cb.QPN, o.sqDepth, 4, p.memB, p.rqB)
	if o.sr {
		p.a.SetReorderPool(NewReorderPool(PacketLen(o.mtu), 4*SRWindow))
		p.b.SetReorderPool(NewReorderPool(PacketLen(o.mtu), 4*SRWindow))
	}
	p.a.Receiver(ca)
	p.a.Sender(ca)
	p.b.Receiver(cb)
	p.b.Sender(cb)
	p.ab = &wire{rng: rand.New(rand.NewPCG(o.seed, 1)), loss: o.loss, dup: o.dup, reord: o.reord, delay: o.delay, rate: o.rate}
	p.ba = &wire{rng: rand.New(rand.NewPCG(o.seed, 2)), loss: o.loss, dup: o.dup, reord: o.reord, delay: o.delay, rate: o.rate}
	p.ba.hold = o.stallB
	p.bufA = make([]byte, p.a.MaxPacket())
	p.bufB = make([]byte, p.b.MaxPacket())
	return p
}

// step moves time to the next event and runs everything due then. It
// returns false when nothing at all remains to happen.
// debugT, when set, makes step check the requester's PSN invariants after
// every event.
var debugT *testing.T

// tap, when set, sees every packet A and B send ("A>", "B>") and every
// packet A receives ("A<").
var tap func(p *pair, dir string, b []byte)

func (p *pair) step() bool {
	sent := false
	for _, f := range p.ab.due(p.now) {
		p.b.Receive(p.now, f, nil)
		sent = true
	}
	for _, f := range p.ba.due(p.now) {
		if tap != nil {
			tap(p, "A<", f)
		}
		before := checker.Decode(f)
		p.a.Receive(p.now, f, nil)
		if debugT != nil {
			checkInv(debugT, p.a, before.String())
		}
		sent = true
	}
	p.a.Expire(p.now)
	if debugT != nil {
		checkInv(debugT, p.a, "expire")
	}
	p.b.Expire(p.now)
	for i := 0; i < 16; i++ {
		if p.ab.idle(p.now) {
			if n := p.a.Build(p.now, p.bufA); n > 0 {
				if debugT != nil {
					checkInv(debugT, p.a, "build "+checker.Decode(p.bufA[:n]).String())
				}
				if tap != nil {
					tap(p, "A>", p.bufA[:n])
				}
				p.ab.send(p.now, p.bufA[:n])
				sent = true
			}
		}
		if p.ba.idle(p.now) {
			if n := p.b.Build(p.now, p.bufB); n > 0 {
				if tap != nil {
					tap(p, "B>", p.bufB[:n])
				}
				p.ba.send(p.now, p.bufB[:n])
				sent = true
			}
		}
	}
	if sent && p.ab.rate == 0 {
		p.now = p.now.Add(100 * time.Nanosecond) // serialisation time
		return true
	}
	next := clock.Min(clock.Min(p.ab.next(), p.ba.next()), clock.Min(p.a.Deadline(), p.b.Deadline()))
	if p.a.HasOutput() && p.ab.busy > p.now {
		next = clock.Min(next, p.ab.busy)
	}
	if p.b.HasOutput() && p.ba.busy > p.now {
		next = clock.Min(next, p.ba.busy)
	}
	if next == clock.Never {
		return false
	}
	if next > p.now {
		p.now = next
	}
	return true
}

type loopCase struct {
	mtu                int
	loss, dup, reorder float64
	msgs               int
	seed               uint64
	opts               *pairOpts // nil: newPair's
	big                bool      // some messages longer than the selective-repeat window
}

// runLoop posts a random mix of every RC operation from A to B, runs the
// pair to quiescence and checks every byte and every completion.
func runLoop(t *testing.T, k loopCase) (goodput float64, p *pair) {
	if k.opts != nil {
		o := *k.opts
		o.mtu, o.seed, o.loss, o.dup, o.reord = k.mtu, k.seed, k.loss, k.dup, k.reorder
		p = newPairOpts(o)
	} else {
		p = newPair(k.mtu, k.seed, k.loss, k.dup, k.reorder)
	}
	debugT = t
	rng := rand.New(rand.NewPCG(k.seed, 99))
	sizes := []int{0, 1, k.mtu - 1, k.mtu, k.mtu + 1, 3*k.mtu + 5, 20000}
	if k.big {
		sizes = append(sizes, (SRWindow+77)*k.mtu+3) // a reply longer than the window
	}
	const window = 1 << 20
	remote := p.memB
	rmr := &testMR{va: 0x100000, buf: make([]byte, window), access: ib.RemoteWrite | ib.RemoteRead | ib.RemoteAtomic, valid: true}
	copy(rmr.buf, fill(window, 77))
	remote.mrs[0x1234] = rmr
	// READs come from their own MR that nothing writes: a replayed READ
	// re-reads memory, so a WRITE landing in between would change it.
	romr := &testMR{va: 0x900000, buf: fill(window, 5), access: ib.RemoteRead, valid: true}
	remote.mrs[0x5678] = romr
	type expect struct {
		op   ib.WROpcode
		src  []byte // what should arrive
		dst  []byte // where it lands
		recv int    // index of B's receive, or -1
	}
	var exps []expect
	var recvBufs [][]byte
	var recvWant [][]byte
	var recvImm []bool
	nAdd := 0
	origs := map[uint64]bool{}
	var atomicDst [][]byte
	off := 0
	posted := 0
	bytesMoved := 0
	var doneA = map[uint64]int{}
	var doneB = map[uint64]int{}
	for posted < k.msgs || p.a.Outstanding() > 0 {
		for posted < k.msgs && p.a.SendQueueFree() > 0 {
			n := sizes[rng.IntN(len(sizes))]
			op := [...]ib.WROpcode{ib.Send, ib.SendWithImm, ib.SendWithInv, ib.RDMAWrite, ib.RDMAWriteWithImm,
				ib.RDMARead, ib.AtomicCmpAndSwp, ib.AtomicFetchAndAdd}[rng.IntN(8)]
			if op == ib.SendWithInv {
				op = ib.Send
			}
			if op == ib.AtomicCmpAndSwp {
				op = ib.AtomicFetchAndAdd
			}
			if off+n+8 > window {
				off = 0
			}
			src := fill(n, byte(posted))
			w := ib.SendWQE{ID: uint64(posted), Opcode: op, Flags: ib.Signaled, SG: segs(src), Length: uint32(n), Imm: uint32(posted), RemoteAddr: rmr.va + uint64(off), RKey: 0x1234}
			e := expect{op: op, recv: -1}
			switch op {
			case ib.Send, ib.SendWithImm:
				rb := make([]byte, n)
				p.rqB.post(uint64(len(recvBufs)), rb)
				e.recv = len(recvBufs)
				recvBufs = append(recvBufs, rb)
				recvWant = append(recvWant, src)
				recvImm = append(recvImm, op == ib.SendWithImm)
			case ib.RDMAWrite, ib.RDMAWriteWithImm:
				e.src, e.dst = src, rmr.buf[off:off+n]
				if op == ib.RDMAWriteWithImm {
					p.rqB.post(uint64(len(recvBufs)), nil)
					e.recv = len(recvBufs)
					recvBufs = append(recvBufs, nil)
					recvWant = append(recvWant, nil)
					recvImm = append(recvImm, true)
				}
			case ib.RDMARead:
				dst := make([]byte, n)
				w.SG, w.RKey, w.RemoteAddr = segs(dst), 0x5678, romr.va+uint64(off)
				e.src, e.dst = romr.buf[off:off+n], dst
			case ib.AtomicFetchAndAdd:
				d := make([]byte, 8)
				w.SG, w.Length, w.RemoteAddr, w.SwapAdd = segs(d), 8, rmr.va+window-8, 1
				atomicDst = append(atomicDst, d)
				nAdd++
			}
			off += (n + 7) &^ 7
			bytesMoved += n
			exps = append(exps, e)
			if !p.a.Post(&w) {
				t.Fatal("post")
			}
			posted++
		}
		if !p.step() && (posted < k.msgs || p.a.Outstanding() > 0) {
			r := &p.a.req
			e := r.entry(r.head)
			t.Fatalf("stalled with %d outstanding: head %d next %d end %d tail %d psn %d comp %d timer %v rnr %v retrying %v; head op %v state %d first %d last %d sent %d; B ePSN %d qlen %d", p.a.Outstanding(), r.head, r.next, r.end(), r.tail, r.psn, r.compPSN, r.timer, r.rnrWait, r.retrying, e.Opcode, e.state, e.firstPSN, e.lastPSN, e.sent, p.b.resp.ePSN, p.b.resp.qlen)
		}
		for _, c := range p.a.TakeCompletions() {
			if c.Status != ib.Success {
				t.Fatalf("A completion %+v (now %v)", c, p.now)
			}
			doneA[c.ID]++
		}
		for _, c := range p.b.TakeCompletions() {
			if c.Status != ib.Success {
				t.Fatalf("B completion %+v", c)
			}
			doneB[c.ID]++
			if int(c.ID) < len(recvImm) && recvImm[c.ID] != (c.Flags&ib.WCWithImm != 0) {
				t.Fatalf("imm flag %+v", c)
			}
		}
		if p.now > clock.Time(time.Hour) {
			t.Fatal("virtual time ran away")
		}
	}
	for p.step() {
		p.a.TakeCompletions()
		for _, c := range p.b.TakeCompletions() {
			doneB[c.ID]++
		}
	}
	for i := 0; i < k.msgs; i++ {
		if doneA[uint64(i)] != 1 {
			t.Fatalf("WR %d completed %d times", i, doneA[uint64(i)])
		}
	}
	for i := range recvBufs {
		if doneB[uint64(i)] != 1 {
			t.Fatalf("receive %d completed %d times", i, doneB[uint64(i)])
		}
		if recvWant[i] != nil && !bytes.Equal(recvBufs[i], recvWant[i]) {
			t.Fatalf("receive %d data differs", i)
		}
	}
	// WRITE targets may be overwritten by later WRITEs at a wrapped offset;
	// check READs (private buffers) fully and WRITEs when not overlapped.
	for i, e := range exps {
		if e.op == ib.RDMARead && !bytes.Equal(e.src, e.dst) {
			t.Fatalf("READ %d data differs", i)
		}
	}
	if got := binary.NativeEndian.Uint64(rmr.buf[window-8:]); got != uint64(nAdd)+binary.NativeEndian.Uint64(fill(window, 77)[window-8:]) {
		t.Fatalf("fetch-add total %d after %d adds", got, nAdd)
	}
	for _, d := range atomicDst {
		v := binary.NativeEndian.Uint64(d)
		if origs[v] {
			t.Fatalf("fetch-add returned %d twice: an atomic ran twice", v)
		}
		origs[v] = true
	}
	return float64(bytesMoved) / p.now.Sub(0).Seconds(), p
}

func TestLoopbackAllOperations(t *testing.T) {
	cases := []loopCase{
		{mtu: 1024, msgs: 300, seed: 1},
		{mtu: 256, loss: 0.001, dup: 0.001, reorder: 0.001, msgs: 300, seed: 2},
		{mtu: 1024, loss: 0.01, dup: 0.01, reorder: 0.01, msgs: 300, seed: 3},
		{mtu: 4096, loss: 0.05, dup: 0.05, reorder: 0.05, msgs: 300, seed: 4},
		{mtu: 512, loss: 0.05, dup: 0.05, reorder: 0.05, msgs: 300, seed: 5},
	}
	if os.Getenv("SOFTRNIC_EXHAUSTIVE") != "" || !testing.Short() && os.Getenv("SOFTRNIC_LONG") != "" {
		for _, mtu := range []int{256, 512, 1024, 2048, 4096} {
			for _, l := range []float64{0, 0.001, 0.01, 0.05} {
				for s := uint64(10); s < 15; s++ {
					cases = append(cases, loopCase{mtu: mtu, loss: l, dup: l, reorder: l, msgs: 2000, seed: s})
				}
			}
		}
	}
	modes := []pairOpts{{recovery: ib.RecoveryTimeout, timeout: 5}, {recovery: ib.RecoveryAdaptive, timeout: 5}, {sr: true, timeout: 5}}
	for _, k := range cases {
		for _, m := range modes {
			k.opts = &m
			name := m.recovery.String()
			if m.sr {
				name = "selective"
			}
			t.Run(fmt.Sprintf("%s_mtu%d_loss%g_seed%d", name, k.mtu, k.loss, k.seed), func(t *testing.T) {
				_, p := runLoop(t, k)
				ar, _ := p.a.SelectiveRepeat()
				_, br := p.b.SelectiveRepeat()
				if m.sr && k.loss == 0 && !(ar && br) {
					t.Fatalf("selective repeat not agreed: requester %v responder %v", ar, br)
				}
				t.Logf("virtual time %v, A→B %d sent %d lost, retransmits A %d (selective %d, probes %d, RTOs %d), dup at B %d",
					p.now, p.ab.sent, p.ab.lost, p.a.Retransmits, p.a.SelRetrans, p.a.TLPProbes, p.a.AdpRetransTO, p.b.RxDuplicate)
			})
		}
	}
}

// TestLoopbackSendStreamRNR is perftest's send_bw with 64 B messages: a
// stream of one-packet SENDs into a receive queue of 64 that the
// application refills only once it has seen each completion, sometimes
// late, over a lossy, reordering link, in every recovery mode. RNR NAKs
// cross probes and retransmissions of the PSN they name; every SEND must
// still arrive exactly once and in order, each in a PSN of its own.
func TestLoopbackSendStreamRNR(t *testing.T) {
	modes := []pairOpts{{recovery: ib.RecoveryTimeout}, {recovery: ib.RecoveryAdaptive}, {sr: true}}
	for _, m := range modes {
		for seed := uint64(1); seed <= 4; seed++ {
			name := m.recovery.String()
			if m.sr {
				name = "selective"
			}
			t.Run(fmt.Sprintf("%s_seed%d", name, seed), func(t *testing.T) {
				o := m
				o.mtu, o.seed, o.loss, o.reord, o.timeout, o.sqDepth = 4096, seed, 0.01, 0.01, 10, 128
				sendStreamRNR(t, newPairOpts(o), 10000, 64)
			})
		}
	}
}

// sendStreamRNR posts msgs SENDs of 8 B numbered in order from A, with
// rqDepth receives at B, each posted again after a random delay once its
// completion is seen, and checks what B receives.
func sendStreamRNR(t *testing.T, p *pair, msgs, rqDepth int) {
	debugT = t
	defer func() { debugT = nil }()
	rng := rand.New(rand.NewPCG(p.ab.rng.Uint64(), 3))
	type repost struct {
		at clock.Time
		id uint64
	}
	var later []repost
	bufs := make([][]byte, rqDepth)
	for i := range bufs {
		bufs[i] = make([]byte, 8)
		p.rqB.post(uint64(i), bufs[i])
	}
	srcs := make([][]byte, msgs)
	posted, doneA, got := 0, 0, 0
	for doneA < msgs {
		for posted < msgs && p.a.SendQueueFree() > 0 {
			srcs[posted] = binary.BigEndian.AppendUint64(nil, uint64(posted))
			w := ib.SendWQE{ID: uint64(posted), Opcode: ib.Send, Flags: ib.Signaled, SG: segs(srcs[posted]), Length: 8}
			if !p.a.Post(&w) {
				t.Fatal("post")
			}
			posted++
		}
		more := p.step()
		for _, c := range p.a.TakeCompletions() {
			if c.Status != ib.Success || c.ID != uint64(doneA) {
				t.Fatalf("A completion %+v, want WR %d", c, doneA)
			}
			doneA++
		}
		for _, c := range p.b.TakeCompletions() {
			if c.Status != ib.Success || c.ByteLen != 8 {
				t.Fatalf("B completion %+v", c)
			}
			if n := binary.BigEndian.Uint64(bufs[c.ID]); n != uint64(got) {
				t.Fatalf("receive %d holds message %d", got, n)
			}
			got++
			d := time.Duration(rng.IntN(3000)) * time.Nanosecond
			if rng.IntN(100) == 0 {
				d = time.Duration(rng.IntN(500)) * time.Microsecond // the application descheduled
			}
			later = append(later, repost{p.now.Add(d), c.ID})
		}
		next := clock.Never
		k := 0
		for _, r := range later {
			if r.at <= p.now {
				clear(bufs[r.id])
				p.rqB.post(r.id, bufs[r.id])
				continue
			}
			next = clock.Min(next, r.at)
			later[k] = r
			k++
		}
		later = later[:k]
		if !more {
			if next == clock.Never {
				t.Fatalf("stalled: A completed %d of %d, B received %d", doneA, msgs, got)
			}
			p.now = next
		}
		if p.now > clock.Time(time.Hour) {
			t.Fatal("virtual time ran away")
		}
	}
	for p.step() {
		p.a.TakeCompletions()
		got += len(p.b.TakeCompletions())
	}
	if got != msgs {
		t.Fatalf("A completed %d SENDs, B received %d", msgs, got)
	}
	if n := p.a.req.psn.Diff(p.a.cfg.SQPSN); int(n) != msgs {
		t.Fatalf("%d SENDs of one packet took %d PSNs", msgs, n)
	}
	if p.b.TxRNRNAKs == 0 {
		t.Fatal("no RNR NAK: the test does not test what it is for")
	}
	t.Logf("virtual time %v, RNR NAKs %d, A→B %d sent %d lost, retransmits %d", p.now, p.b.TxRNRNAKs, p.ab.sent, p.ab.lost, p.a.RetransPkts)
}

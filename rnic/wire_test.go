package rnic

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"flag"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/frame"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/icrc"
	"github.com/softrnic/softrnic/internal/ibtest"
	"github.com/softrnic/softrnic/verbs"
)

var recordWire = flag.Bool("wire.record", false, "TestWireBytesUnchanged: print the hashes instead of checking them")

// wireHashes are the SHA-256 prefixes of every frame each scenario of
// TestWireBytesUnchanged puts on the wire, in order, recorded from the
// device as it builds them. A change here is a change of wire bytes: it
// must be one the change means to make, checked against a real peer.
// Recorded again when loss recovery came: QPNs in softrnic's range
// (rc.SoftQPN, so UDP source ports and UD source QPNs too), the
// selective-repeat bit on RC frames between two softrnic QPs, and the
// AckReq, with its ACK, of the packet that fills the initial window.
var wireHashes = map[string]string{
	"rc/v4/1024":     "4b5862ec0e723710",
	"rc/v4/4096":     "89fd8091eacf4f1a",
	"rc/v6/1024":     "bbedf14d2d1e1e67",
	"rc/v6/4096":     "356a1f22065adf01",
	"rc-nak/v4/1024": "b988ee008aea6be0",
	"rc-nak/v4/4096": "5ee57b71250d60f0",
	"rc-nak/v6/1024": "48d1a5918e860f50",
	"rc-nak/v6/4096": "a1dbdd389c1df19c",
	"uc/v4/1024":     "b1f635417b7c3098",
	"uc/v4/4096":     "517f4fa7ddf2382d",
	"uc/v6/1024":     "e72f1b13c1983e0d",
	"uc/v6/4096":     "ff12cad64a9479b3",
	"ud/v4/1024":     "824063f703947526",
	"ud/v4/4096":     "f5496c47986e6962",
	"ud/v6/1024":     "0959beaaa45a8710",
	"ud/v6/4096":     "7b0f9273ceba7ba2",
	"cnp/v4/1024":    "7dc825480e123acf",
	"cnp/v4/4096":    "5f47bb5e310f44e7",
	"cnp/v6/1024":    "9add785c7a4ae55b",
	"cnp/v6/4096":    "60e0c1e202d62c18",
}

// wireRig is two devices whose frames the test moves by hand, in virtual
// time, recording each one as it leaves its device.
type wireRig struct {
	t      *testing.T
	now    clock.Time
	a, b   *Device
	pa, pb *PD
	out    [][]byte
	frames [][]byte // every frame sent, both ways, in order
	// mark, if set, may change a frame from a to b on its way (after it
	// was recorded), as a switch would.
	mark func(f []byte)
}

func newWireRig(t *testing.T, v6 bool, mtu int, cong Congestion) *wireRig {
	t.Helper()
	aa, ab := netip.MustParseAddr("10.66.0.1"), netip.MustParseAddr("10.66.0.2")
	if v6 {
		aa, ab = netip.MustParseAddr("fd66::1"), netip.MustParseAddr("fd66::2")
	}
	mk := func(mac [6]byte, addr netip.Addr) *Device {
		d, err := NewDevice(Config{MAC: mac, Addrs: []netip.Addr{addr}, PortMTU: mtu, Congestion: cong})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	r := &wireRig{t: t, now: clock.Time(1e9), a: mk(macA, aa), b: mk(macB, ab)}
	r.pa, r.pb = r.a.allocPD(), r.b.allocPD()
	r.out = make([][]byte, 64)
	for i := range r.out {
		r.out[i] = make([]byte, mtu+512)
	}
	return r
}

// mr registers n bytes of patterned memory at a fixed IOVA, so that the
// addresses on the wire do not depend on where the heap put it.
func (r *wireRig) mr(pd *PD, n int, iova uint64, seed uint64) *MR {
	r.t.Helper()
	b := make([]byte, n)
	pattern(b, seed)
	m, err := pd.RegBytes(b, iova, ib.LocalWrite|ib.RemoteWrite|ib.RemoteRead|ib.RemoteAtomic)
	if err != nil {
		r.t.Fatal(err)
	}
	return m
}

// move runs one step of each device and reports whether a frame moved.
func (r *wireRig) move() bool {
	moved := false
	for _, d := range []*Device{r.a, r.b} {
		peer := r.b
		if d == r.b {
			peer = r.a
		}
		d.Expire(r.now)
		for i := range r.out {
			r.out[i] = r.out[i][:cap(r.out[i])]
		}
		n := d.Transmit(r.now, r.out)
		for _, f := range r.out[:n] {
			r.frames = append(r.frames, append([]byte(nil), f...))
			if d == r.a && r.mark != nil {
				r.mark(f)
			}
		}
		if n > 0 {
			peer.Receive(r.now, r.out[:n])
			moved = true
		}
	}
	return moved
}

// run steps both devices, 1 µs of virtual time a step or on to the next
// timer when nothing moves, until done.
func (r *wireRig) run(done func() bool) {
	r.t.Helper()
	for i := 0; !done(); i++ {
		if i > 200000 {
			r.t.Fatal("no end in sight")
		}
		if r.move() {
			r.now += clock.Time(time.Microsecond)
			continue
		}
		next := clock.Min(r.a.NextDeadline(), r.b.NextDeadline())
		if next == clock.Never {
			r.t.Fatalf("stalled: nothing moves and no timer is armed; frames: %s", r.opcodes())
		}
		r.now = max(next, r.now+1)
	}
}

// hash is the SHA-256 of every frame sent, each with its rkeys replaced by
// their index in keys (rkeys are random) and its ICRC recomputed after the
// original was checked.
func (r *wireRig) hash(keys ...uint32) string {
	r.t.Helper()
	h := sha256.New()
	var f frame.Frame
	for i, b := range r.frames {
		if err := frame.Parse(b, &f); err != nil {
			r.t.Fatalf("frame %d: %v", i, err)
		}
		if !f.VerifyICRC() {
			r.t.Fatalf("frame %d: bad ICRC", i)
		}
		canon := func(k uint32) uint32 {
			for j, x := range keys {
				if x == k {
					return uint32(j + 1)
				}
			}
			return k
		}
		if x := f.RETH(); x != nil {
			x.Encode(x.VA(), canon(x.RKey()), x.DMALen())
		}
		if x := f.AtomicETH(); x != nil {
			x.Encode(x.VA(), canon(x.RKey()), x.SwapAdd(), x.Compare())
		}
		if x := f.IETH(); x != nil {
			x.SetRKey(canon(x.RKey()))
		}
		if err := icrc.Stamp(f.Packet()); err != nil {
			r.t.Fatal(err)
		}
		var l [4]byte
		binary.BigEndian.PutUint32(l[:], uint32(len(b)))
		h.Write(l[:])
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// opcodes lists the opcodes of the frames sent, for a failure message.
func (r *wireRig) opcodes() string {
	seen := map[bth.Opcode]int{}
	var order []bth.Opcode
	var f frame.Frame
	for _, b := range r.frames {
		if frame.Parse(b, &f) == nil {
			if seen[f.Opcode()] == 0 {
				order = append(order, f.Opcode())
			}
			seen[f.Opcode()]++
		}
	}
	var s []string
	for _, op := range order {
		s = append(s, fmt.Sprintf("%v×%d", op, seen[op]))
	}
	return strings.Join(s, " ")
}

// pair makes a connected QP pair of type typ, a's on r.a.
func (r *wireRig) pair(typ ib.QPType, mtu int, tclass uint8, flow uint32) (qa, qb *QP, ca, cb *CQ) {
	r.t.Helper()
	mk := func(d *Device, pd *PD) (*QP, *CQ) {
		cq := d.newCQ(1024)
		q, err := pd.newQP(testQP{Type: typ, SendCQ: cq, RecvCQ: cq, MaxSendWR: 64, MaxRecvWR: 64, MaxSGE: 4, MaxInline: 128})
		if err != nil {
			r.t.Fatal(err)
		}
		return q, cq
	}
	qa, ca = mk(r.a, r.pa)
	qb, cb = mk(r.b, r.pb)
	conn := func(q, peer *QP, mac [6]byte, dst netip.Addr, out, in uint32) {
		acc := ib.LocalWrite | ib.RemoteWrite | ib.RemoteRead | ib.RemoteAtomic
		if typ == ib.UC {
			acc = ib.LocalWrite | ib.RemoteWrite
		}
		must(r.t, ibtest.Modify(q, ib.Init, &ib.QPAttr{Access: acc}))
		must(r.t, ibtest.Modify(q, ib.RTR, &ib.QPAttr{PathMTU: uint32(mtu), DestQPN: peer.QPN(), RQPSN: in, MaxDestRdAtomic: 16,
			MinRNRTimer: 1, AV: ib.AddressVector{DMAC: mac, DGID: ib.GIDFrom(dst), TrafficClass: tclass, FlowLabel: flow, HopLimit: 17}}))
		must(r.t, ibtest.Modify(q, ib.RTS, &ib.QPAttr{SQPSN: out, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 16}))
	}
	conn(qa, qb, macB, r.b.cfg.Addrs[0], 0xFFFFF0, 0x123)
	conn(qb, qa, macA, r.a.cfg.Addrs[0], 0x123, 0xFFFFF0)
	return qa, qb, ca, cb
}

// waitWCs runs until cq has given want completions, all successful unless
// allowErr.
func (r *wireRig) waitWCs(cq *CQ, want int, allowErr bool) {
	r.t.Helper()
	var got []ib.WC
	defer func() {
		if r.t.Failed() {
			r.t.Logf("completions: %+v", got)
		}
	}()
	r.run(func() bool {
		got = append(got, pollAll(cq)...)
		return len(got) >= want
	})
	for _, w := range got {
		if w.Status != ib.Success && !allowErr {
			r.t.Fatalf("completion %+v", w)
		}
	}
}

// settle runs until nothing moves and no timer is due within a millisecond.
func (r *wireRig) settle() {
	r.t.Helper()
	for i := 0; i < 100000; i++ {
		if r.move() {
			r.now += clock.Time(time.Microsecond)
			continue
		}
		next := clock.Min(r.a.NextDeadline(), r.b.NextDeadline())
		if next == clock.Never || next > r.now+clock.Time(time.Millisecond) {
			return
		}
		r.now = max(next, r.now+1)
	}
	r.t.Fatal("does not settle")
}

// TestWireBytesUnchanged builds every kind of frame the device sends (RC,
// UC and UD; every request opcode, READ responses, atomic ACKs, ACKs,
// RNR and access NAKs, CNPs; IPv4 and IPv6; path MTU 1024 and 4096; inline
// data and SG lists) and compares the hash of the wire bytes with the
// values recorded before the transmit path was rebuilt: how frames are
// built may change, what goes on the wire may not.
func TestWireBytesUnchanged(t *testing.T) {
	got := map[string]string{}
	for _, v6 := range []bool{false, true} {
		for _, mtu := range []int{1024, 4096} {
			fam := "v4"
			if v6 {
				fam = "v6"
			}
			for _, sc := range wireScenarios {
				name := fmt.Sprintf("%s/%s/%d", sc.name, fam, mtu)
				t.Run(name, func(t *testing.T) {
					var cong Congestion
					if sc.cnp {
						cong = mustCC(t, "connectx", 0)
					}
					r := newWireRig(t, v6, mtu, cong)
					keys := sc.run(r, mtu)
					h := r.hash(keys...)
					got[name] = h
					if *recordWire {
						t.Logf("%s: %s", h, r.opcodes())
						return
					}
					want, ok := wireHashes[name]
					if !ok {
						t.Fatalf("no recorded hash (%s); frames: %s", h, r.opcodes())
					}
					if h != want {
						t.Errorf("wire bytes changed: hash %s, recorded %s; frames: %s", h, want, r.opcodes())
					}
				})
			}
		}
	}
	if *recordWire {
		var b strings.Builder
		for _, sc := range wireScenarios {
			for _, fam := range []string{"v4", "v6"} {
				for _, mtu := range []int{1024, 4096} {
					name := fmt.Sprintf("%s/%s/%d", sc.name, fam, mtu)
					fmt.Fprintf(&b, "\t%q: %q,\n", name, got[name])
				}
			}
		}
		t.Logf("recorded:\n%s", b.String())
	}
}

// wireScenarios are TestWireBytesUnchanged's traffic. Each returns the
// rkeys that went on the wire.
var wireScenarios = []struct {
	name string
	cnp  bool
	run  func(r *wireRig, mtu int) []uint32
}{
	{name: "rc", run: func(r *wireRig, mtu int) []uint32 {
		qa, qb, ca, cb := r.pair(ib.RC, mtu, 0, 0)
		src := r.mr(r.pa, 12*mtu, 0x10000000, 1)
		dst := r.mr(r.pb, 8*mtu, 0x20000000, 2)
		inv := r.mr(r.pb, 64, 0x30000000, 3)
		recv := r.mr(r.pb, 16*mtu, 0x40000000, 4)
		for i := 0; i < 5; i++ {
			// The last receive is scattered over two SGEs.
			sg := []ib.SGE{{Addr: recv.IOVA() + uint64(i*3*mtu), Length: uint32(3 * mtu), LKey: recv.LKey()}}
			if i == 4 {
				sg = []ib.SGE{{Addr: sg[0].Addr, Length: 10, LKey: recv.LKey()}, {Addr: sg[0].Addr + 100, Length: 200, LKey: recv.LKey()}}
			}
			_, err := qb.PostRecv([]verbs.RecvWR{{ID: uint64(i), SG: sg}})
			must(r.t, err)
		}
		sgl := []ib.SGE{ // 2·MTU+513 bytes over three SGEs
			{Addr: src.IOVA() + 3, Length: uint32(mtu - 7), LKey: src.LKey()},
			{Addr: src.IOVA() + uint64(2*mtu), Length: 20, LKey: src.LKey()},
			{Addr: src.IOVA() + uint64(5*mtu), Length: uint32(mtu + 500), LKey: src.LKey()},
		}
		one := func(off, n int) []ib.SGE {
			return []ib.SGE{{Addr: src.IOVA() + uint64(off), Length: uint32(n), LKey: src.LKey()}}
		}
		wrs := []verbs.SendWR{
			{ID: 1, Opcode: ib.Send, Flags: ib.Signaled, SG: sgl},
			{ID: 2, Opcode: ib.Send, Flags: ib.Signaled | ib.Inline | ib.Solicited, InlineData: src.Bytes()[7 : 7+61]},
			{ID: 3, Opcode: ib.SendWithImm, Flags: ib.Signaled, Imm: 0xA1B2C3D4},
			{ID: 4, Opcode: ib.SendWithInv, Flags: ib.Signaled, SG: one(9, 100), InvRKey: inv.RKey()},
			{ID: 5, Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: sgl, RemoteAddr: dst.IOVA() + 5, RKey: dst.RKey()},
			{ID: 6, Opcode: ib.RDMAWriteWithImm, Flags: ib.Signaled, SG: one(1, 7), RemoteAddr: dst.IOVA(), RKey: dst.RKey(), Imm: 42},
			{ID: 7, Opcode: ib.RDMAWrite, Flags: ib.Signaled | ib.Inline, InlineData: src.Bytes()[:33], RemoteAddr: dst.IOVA() + 4*uint64(mtu), RKey: dst.RKey()},
			{ID: 8, Opcode: ib.RDMARead, Flags: ib.Signaled, SG: one(6*mtu, 3*mtu-2), RemoteAddr: dst.IOVA() + 2, RKey: dst.RKey()},
			{ID: 9, Opcode: ib.AtomicCmpAndSwp, Flags: ib.Signaled, SG: one(64, 8), RemoteAddr: dst.IOVA() + 8, RKey: dst.RKey(),
				CompareAdd: binaryLE(dst.Bytes()[8:]), Swap: 0x1122334455667788},
			{ID: 10, Opcode: ib.AtomicFetchAndAdd, Flags: ib.Signaled, SG: one(72, 8), RemoteAddr: dst.IOVA() + 16, RKey: dst.RKey(), CompareAdd: 5},
			{ID: 11, Opcode: ib.RDMARead, Flags: ib.Signaled, SG: one(0, 1), RemoteAddr: dst.IOVA() + 5, RKey: dst.RKey()},
		}
		_, err := qa.PostSend(wrs)
		must(r.t, err)
		r.waitWCs(ca, len(wrs), false)
		r.waitWCs(cb, 4, false)
		r.settle()
		return []uint32{src.RKey(), dst.RKey(), inv.RKey(), recv.RKey()}
	}},
	{name: "rc-nak", run: func(r *wireRig, mtu int) []uint32 {
		qa, qb, ca, cb := r.pair(ib.RC, mtu, 0x68, 0x12345)
		src := r.mr(r.pa, 4*mtu, 0x10000000, 5)
		recv := r.mr(r.pb, 4*mtu, 0x20000000, 6)
		// A SEND before any receive is posted: RNR NAKs until one is.
		_, err := qa.PostSend([]verbs.SendWR{{ID: 1, Opcode: ib.Send, Flags: ib.Signaled,
			SG: []ib.SGE{{Addr: src.IOVA(), Length: uint32(mtu + 3), LKey: src.LKey()}}}})
		must(r.t, err)
		r.run(func() bool { return r.count(isRNRNAK) >= 2 })
		_, err = qb.PostRecv([]verbs.RecvWR{{ID: 1, SG: []ib.SGE{{Addr: recv.IOVA(), Length: uint32(2 * mtu), LKey: recv.LKey()}}}})
		must(r.t, err)
		r.waitWCs(ca, 1, false)
		r.waitWCs(cb, 1, false)
		// A WRITE with a bad rkey: a remote access error NAK, then ERR.
		_, err = qa.PostSend([]verbs.SendWR{{ID: 2, Opcode: ib.RDMAWrite, Flags: ib.Signaled,
			SG: []ib.SGE{{Addr: src.IOVA(), Length: 16, LKey: src.LKey()}}, RemoteAddr: recv.IOVA(), RKey: recv.RKey() ^ 0x5A5A}})
		must(r.t, err)
		r.waitWCs(ca, 1, true)
		r.settle()
		return []uint32{src.RKey(), recv.RKey(), recv.RKey() ^ 0x5A5A}
	}},
	{name: "uc", run: func(r *wireRig, mtu int) []uint32 {
		qa, qb, ca, cb := r.pair(ib.UC, mtu, 0x20, 0)
		src := r.mr(r.pa, 8*mtu, 0x10000000, 7)
		dst := r.mr(r.pb, 8*mtu, 0x20000000, 8)
		for i := 0; i < 4; i++ {
			_, err := qb.PostRecv([]verbs.RecvWR{{ID: uint64(i), SG: []ib.SGE{{Addr: dst.IOVA() + uint64(i*3*mtu/2), Length: uint32(3 * mtu), LKey: dst.LKey()}}}})
			must(r.t, err)
		}
		sgl := []ib.SGE{
			{Addr: src.IOVA() + 1, Length: uint32(mtu), LKey: src.LKey()},
			{Addr: src.IOVA() + uint64(3*mtu), Length: uint32(mtu/2 + 1), LKey: src.LKey()},
		}
		wrs := []verbs.SendWR{
			{ID: 1, Opcode: ib.Send, Flags: ib.Signaled, SG: sgl},
			{ID: 2, Opcode: ib.Send, Flags: ib.Signaled | ib.Inline, InlineData: src.Bytes()[100:202]},
			{ID: 3, Opcode: ib.SendWithImm, Flags: ib.Signaled, SG: sgl[:1], Imm: 3},
			{ID: 4, Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: sgl, RemoteAddr: dst.IOVA() + 4*uint64(mtu), RKey: dst.RKey()},
			{ID: 5, Opcode: ib.RDMAWriteWithImm, Flags: ib.Signaled, SG: sgl[1:], RemoteAddr: dst.IOVA() + 7*uint64(mtu), RKey: dst.RKey(), Imm: 99},
		}
		_, err := qa.PostSend(wrs)
		must(r.t, err)
		r.waitWCs(ca, len(wrs), false)
		r.waitWCs(cb, 4, false)
		r.settle()
		return []uint32{src.RKey(), dst.RKey()}
	}},
	{name: "ud", run: func(r *wireRig, mtu int) []uint32 {
		cqa, cqb := r.a.newCQ(64), r.b.newCQ(64)
		qa, _ := r.pa.newQP(testQP{Type: ib.UD, SendCQ: cqa, RecvCQ: cqa, MaxSendWR: 16, MaxRecvWR: 16, MaxSGE: 4, MaxInline: 64})
		qb, _ := r.pb.newQP(testQP{Type: ib.UD, SendCQ: cqb, RecvCQ: cqb, MaxSendWR: 16, MaxRecvWR: 16, MaxSGE: 4, MaxInline: 64})
		for _, q := range []*QP{qa, qb} {
			must(r.t, ibtest.Modify(q, ib.Init, &ib.QPAttr{QKey: 0x11111111}))
			must(r.t, ibtest.Modify(q, ib.RTR, nil))
			must(r.t, ibtest.Modify(q, ib.RTS, &ib.QPAttr{SQPSN: 0xFFFFFE}))
		}
		ah, err := r.pa.newAH(ib.AddressVector{DMAC: macB, DGID: ib.GIDFrom(r.b.cfg.Addrs[0]), HopLimit: 9, TrafficClass: 0x48, FlowLabel: 0xABCDE})
		must(r.t, err)
		ah2, err := r.pa.newAH(ib.AddressVector{DMAC: macB, DGID: ib.GIDFrom(r.b.cfg.Addrs[0]), UDPSrcPort: UDSourcePort(qa.QPN())})
		must(r.t, err)
		src := r.mr(r.pa, 2*mtu, 0x10000000, 9)
		rbuf := r.mr(r.pb, 8*(mtu+64), 0x20000000, 10)
		for i := 0; i < 5; i++ {
			_, err := qb.PostRecv([]verbs.RecvWR{{ID: uint64(i), SG: []ib.SGE{{Addr: rbuf.IOVA() + uint64(i*(mtu+64)), Length: uint32(mtu + 64), LKey: rbuf.LKey()}}}})
			must(r.t, err)
		}
		sg := []ib.SGE{
			{Addr: src.IOVA() + 2, Length: 30, LKey: src.LKey()},
			{Addr: src.IOVA() + 1000, Length: 1, LKey: src.LKey()},
			{Addr: src.IOVA() + uint64(mtu), Length: 200, LKey: src.LKey()},
		}
		wrs := []verbs.SendWR{
			{ID: 1, Opcode: ib.Send, Flags: ib.Signaled, SG: []ib.SGE{{Addr: src.IOVA() + 3, Length: uint32(mtu), LKey: src.LKey()}}, AH: ah, RemoteQPN: qb.QPN(), RemoteQKey: 0x80000000},
			{ID: 2, Opcode: ib.SendWithImm, Flags: ib.Signaled | ib.Solicited, SG: sg[:1], AH: ah, RemoteQPN: qb.QPN(), RemoteQKey: 0x11111111, Imm: 77},
			{ID: 3, Opcode: ib.Send, Flags: ib.Signaled | ib.Inline, InlineData: src.Bytes()[5:38], AH: ah2, RemoteQPN: qb.QPN(), RemoteQKey: 0x11111111},
			{ID: 4, Opcode: ib.Send, Flags: ib.Signaled, SG: sg, AH: ah2, RemoteQPN: qb.QPN(), RemoteQKey: 0x11111111},
			{ID: 5, Opcode: ib.Send, Flags: ib.Signaled, AH: ah, RemoteQPN: qb.QPN(), RemoteQKey: 0x11111111},
		}
		_, err = qa.PostSend(wrs)
		must(r.t, err)
		r.waitWCs(cqa, len(wrs), false)
		r.waitWCs(cqb, len(wrs), false)
		r.settle()
		return []uint32{src.RKey(), rbuf.RKey()}
	}},
	{name: "cnp", cnp: true, run: func(r *wireRig, mtu int) []uint32 {
		qa, qb, ca, _ := r.pair(ib.RC, mtu, 0, 0)
		_ = qb
		src := r.mr(r.pa, 16*mtu, 0x10000000, 11)
		dst := r.mr(r.pb, 16*mtu, 0x20000000, 12)
		r.mark = func(f []byte) {
			if frame.ECNCapable(f) {
				frame.MarkCE(f)
			}
		}
		var wrs []verbs.SendWR
		for i := 0; i < 4; i++ {
			wrs = append(wrs, verbs.SendWR{ID: uint64(i), Opcode: ib.RDMAWrite, Flags: ib.Signaled,
				SG: []ib.SGE{{Addr: src.IOVA() + uint64(i*4*mtu), Length: uint32(4 * mtu), LKey: src.LKey()}}, RemoteAddr: dst.IOVA() + uint64(i*4*mtu), RKey: dst.RKey()})
		}
		_, err := qa.PostSend(wrs)
		must(r.t, err)
		r.waitWCs(ca, len(wrs), false)
		r.settle()
		if r.count(func(f *frame.Frame) bool { return f.Opcode() == bth.CNP }) == 0 {
			r.t.Fatal("no CNP was sent")
		}
		return []uint32{src.RKey(), dst.RKey()}
	}},
}

// count is how many frames sent so far match.
func (r *wireRig) count(match func(f *frame.Frame) bool) int {
	n := 0
	var f frame.Frame
	for _, b := range r.frames {
		if frame.Parse(b, &f) == nil && match(&f) {
			n++
		}
	}
	return n
}

func isRNRNAK(f *frame.Frame) bool {
	return f.Opcode() == bth.RCAcknowledge && f.AETH().Kind() == bth.KindRNRNAK
}

func binaryLE(b []byte) uint64 { return binary.LittleEndian.Uint64(b) }

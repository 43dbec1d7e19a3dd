package rnic

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/frame"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/icrc"
	"github.com/softrnic/softrnic/internal/checker"
	"github.com/softrnic/softrnic/internal/ibtest"
	"github.com/softrnic/softrnic/port/memlink"
	"github.com/softrnic/softrnic/verbs"
)

func TestQPStateMachine(t *testing.T) {
	tb := newTestbed(t, memlink.Impairments{}, 1, 1024)
	cq := tb.a.dev.newCQ(16)
	q, err := tb.a.pd.newQP(testQP{Type: ib.RC, SendCQ: cq, RecvCQ: cq})
	must(t, err)
	if q.State() != ib.Reset {
		t.Fatal("new QP not in RESET")
	}
	illegal := []ib.QPState{ib.RTR, ib.RTS, ib.SQD, ib.SQE}
	for _, s := range illegal {
		if !errors.Is(ibtest.Modify(q, s, &ib.QPAttr{}), verbs.ErrState) {
			t.Fatalf("RESET→%v allowed", s)
		}
	}
	if _, err := q.PostSend([]verbs.SendWR{{Opcode: ib.Send}}); !errors.Is(err, verbs.ErrQPState) {
		t.Fatal("post send in RESET allowed")
	}
	must(t, ibtest.Modify(q, ib.Init, &ib.QPAttr{Access: ib.RemoteWrite}))
	if !errors.Is(ibtest.Modify(q, ib.RTS, &ib.QPAttr{}), verbs.ErrState) {
		t.Fatal("INIT→RTS allowed")
	}
	if !errors.Is(ibtest.Modify(q, ib.RTR, &ib.QPAttr{PathMTU: 1000, AV: ib.AddressVector{DMAC: macB, DGID: ib.GIDFrom(addrB)}}), verbs.ErrInvalid) {
		t.Fatal("MTU 1000 accepted")
	}
	if !errors.Is(ibtest.Modify(q, ib.RTR, &ib.QPAttr{PathMTU: 4096, AV: ib.AddressVector{DMAC: macB, DGID: ib.GIDFrom(addrB)}}), verbs.ErrInvalid) {
		t.Fatal("MTU above the port's accepted")
	}
	if !errors.Is(ibtest.Modify(q, ib.RTR, &ib.QPAttr{PathMTU: 1024, AV: ib.AddressVector{DMAC: macB, DGID: ib.GIDFrom(netip.MustParseAddr("fd00::1"))}}), verbs.ErrInvalid) {
		t.Fatal("IPv6 peer for an IPv4 GID accepted")
	}
	must(t, ibtest.Modify(q, ib.RTR, &ib.QPAttr{PathMTU: 1024, DestQPN: 5, AV: ib.AddressVector{DMAC: macB, DGID: ib.GIDFrom(addrB)}}))
	if !errors.Is(ibtest.Modify(q, ib.RTS, &ib.QPAttr{RetryCnt: 8}), verbs.ErrInvalid) {
		t.Fatal("retry_cnt 8 accepted")
	}
	must(t, ibtest.Modify(q, ib.RTS, &ib.QPAttr{RetryCnt: 7, RNRRetry: 7, Timeout: 14}))
	must(t, ibtest.Modify(q, ib.SQD, nil))
	must(t, ibtest.Modify(q, ib.RTS, nil))
	if !errors.Is(ibtest.Modify(q, ib.Init, nil), verbs.ErrState) {
		t.Fatal("RTS→INIT allowed")
	}
	// Posted work is flushed when the QP goes to ERR.
	mr, _ := tb.a.pd.RegBytes(make([]byte, 64), 0, ib.LocalWrite)
	_, err = q.PostSend([]verbs.SendWR{{ID: 1, Opcode: ib.Send, SG: []ib.SGE{{Addr: mr.IOVA(), Length: 8, LKey: mr.LKey()}}}, {ID: 2, Opcode: ib.RDMAWrite}})
	must(t, err)
	_, err = q.PostRecv([]verbs.RecvWR{{ID: 3}})
	must(t, err)
	must(t, ibtest.Modify(q, ib.Err, nil))
	w := pollAll(cq)
	if len(w) != 3 {
		t.Fatalf("flush: %+v", w)
	}
	for _, c := range w {
		if c.Status != ib.WRFlushErr {
			t.Fatalf("flush status %+v", c)
		}
	}
	// Posting in ERR completes at once with a flush error.
	_, err = q.PostSend([]verbs.SendWR{{ID: 4, Opcode: ib.Send}})
	must(t, err)
	if w := pollAll(cq); len(w) != 1 || w[0].ID != 4 || w[0].Status != ib.WRFlushErr {
		t.Fatalf("%+v", w)
	}
	must(t, ibtest.Modify(q, ib.Reset, nil))
	must(t, ibtest.Modify(q, ib.Init, nil))
	// UC refuses remote read/atomic access; UD refuses RDMA opcodes.
	uq, _ := tb.a.pd.newQP(testQP{Type: ib.UC, SendCQ: cq, RecvCQ: cq})
	if !errors.Is(ibtest.Modify(uq, ib.Init, &ib.QPAttr{Access: ib.RemoteRead}), verbs.ErrAccess) {
		t.Fatal("UC with remote read")
	}
}

func TestMRKeysAndChecks(t *testing.T) {
	d, _ := NewDevice(Config{Addrs: []netip.Addr{addrA}})
	pd, pd2 := d.allocPD(), d.allocPD()
	if _, err := pd.RegBytes(make([]byte, 8), 0, ib.RemoteWrite); !errors.Is(err, verbs.ErrAccess) {
		t.Fatal("remote write without local write accepted")
	}
	seen := map[uint32]bool{}
	var prev uint32
	incr := 0
	for i := 0; i < 200; i++ {
		m, err := pd.RegBytes(make([]byte, 64), 0x1000, ib.LocalWrite|ib.RemoteRead)
		must(t, err)
		for _, k := range []uint32{m.LKey(), m.RKey()} {
			if seen[k] || k == 0 {
				t.Fatal("key reused")
			}
			seen[k] = true
			if k == prev+1 {
				incr++
			}
			prev = k
		}
	}
	if incr > 2 {
		t.Fatalf("keys look like a counter (%d increments)", incr)
	}
	m, _ := pd.RegBytes(make([]byte, 64), 0x1000, ib.LocalWrite|ib.RemoteRead)
	q := &QP{dev: d, pd: pd}
	mem := qpMem{q}
	if _, ok := mem.Resolve(m.RKey(), 0x1000, 64, ib.RemoteRead); !ok {
		t.Fatal("valid access refused")
	}
	for _, c := range []struct {
		key    uint32
		va, n  uint64
		access ib.Access
	}{
		{m.RKey(), 0x1000, 65, ib.RemoteRead}, {m.RKey(), 0xFFF, 2, ib.RemoteRead}, {m.RKey(), ^uint64(0), 2, ib.RemoteRead},
		{m.RKey(), 0x1000, 8, ib.RemoteWrite}, {m.LKey(), 0x1000, 8, ib.RemoteRead}, {m.RKey() ^ 1, 0x1000, 8, ib.RemoteRead},
	} {
		if _, ok := mem.Resolve(c.key, c.va, c.n, c.access); ok {
			t.Fatalf("access %+v allowed", c)
		}
	}
	other := qpMem{&QP{dev: d, pd: pd2}}
	if _, ok := other.Resolve(m.RKey(), 0x1000, 8, ib.RemoteRead); ok {
		t.Fatal("rkey of another PD accepted")
	}
	if other.Invalidate(m.RKey()) {
		t.Fatal("invalidate across PDs")
	}
	m.Dereg()
	if _, ok := mem.Resolve(m.RKey(), 0x1000, 8, ib.RemoteRead); ok {
		t.Fatal("deregistered MR accepted")
	}
}

func TestE2ERemoteAccessErrorFlushes(t *testing.T) {
	tb := newTestbed(t, memlink.Impairments{}, 2, 1024)
	qa, qb := tb.connect(ib.RC, 1024, ib.LocalWrite|ib.RemoteWrite, 16)
	src, _ := tb.a.pd.RegBytes(make([]byte, 4096), 0, ib.LocalWrite)
	tgt, _ := tb.b.pd.RegBytes(make([]byte, 100), 0, ib.LocalWrite|ib.RemoteWrite)
	sg := []ib.SGE{{Addr: src.IOVA(), Length: 200, LKey: src.LKey()}}
	_, err := qa.PostSend([]verbs.SendWR{{ID: 1, Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: sg[:0], RemoteAddr: tgt.IOVA(), RKey: tgt.RKey()}, {ID: 2, Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: sg, RemoteAddr: tgt.IOVA(), RKey: tgt.RKey()}, // 200 > 100
		verbs.SendWR{ID: 3, Opcode: ib.RDMAWrite, SG: sg, RemoteAddr: tgt.IOVA(), RKey: tgt.RKey()}})
	must(t, err)
	var wcs []ib.WC
	tb.run(func() bool { wcs = append(wcs, pollAll(qa.init.SendCQ)...); return len(wcs) == 3 }, time.Second)
	if wcs[0].Status != ib.Success || wcs[1].Status != ib.RemAccessErr || wcs[2].Status != ib.WRFlushErr {
		t.Fatalf("%+v", wcs)
	}
	if qa.State() != ib.Err || qb.State() != ib.Err {
		t.Fatalf("states %v %v", qa.State(), qb.State())
	}
}

func TestE2ERNRThenReceivePosted(t *testing.T) {
	tb := newTestbed(t, memlink.Impairments{}, 3, 1024)
	qa, qb := tb.connect(ib.RC, 1024, ib.LocalWrite, 16)
	src, _ := tb.a.pd.RegBytes(bytes.Repeat([]byte{7}, 3000), 0, ib.LocalWrite)
	dst, _ := tb.b.pd.RegBytes(make([]byte, 3000), 0, ib.LocalWrite)
	_, err := qa.PostSend([]verbs.SendWR{{ID: 1, Opcode: ib.Send, Flags: ib.Signaled, SG: []ib.SGE{{Addr: src.IOVA(), Length: 3000, LKey: src.LKey()}}}})
	must(t, err)
	// Run a while with no receive posted: RNR NAKs, no completion.
	tb.run(func() bool { return tb.clk.Now() > 300_000 }, time.Second)
	if w := pollAll(qa.init.SendCQ); len(w) != 0 {
		t.Fatalf("%+v", w)
	}
	_, err = qb.PostRecv([]verbs.RecvWR{{ID: 9, SG: []ib.SGE{{Addr: dst.IOVA(), Length: 3000, LKey: dst.LKey()}}}})
	must(t, err)
	var s, r []ib.WC
	tb.run(func() bool {
		s = append(s, pollAll(qa.init.SendCQ)...)
		r = append(r, pollAll(qb.init.RecvCQ)...)
		return len(s) == 1 && len(r) == 1
	}, time.Second)
	if s[0].Status != ib.Success || r[0].ByteLen != 3000 || !bytes.Equal(dst.Bytes(), src.Bytes()) {
		t.Fatalf("%+v %+v", s, r)
	}
	if qa.rcQP().RNRWaits == 0 || qb.rcQP().TxRNRNAKs == 0 {
		t.Fatal("no RNR happened")
	}
}

func TestE2EUD(t *testing.T) {
	for _, fam := range []string{"v4", "v6"} {
		t.Run(fam, func(t *testing.T) {
			var tb *testbed
			if fam == "v6" {
				tb = newTestbed(t, memlink.Impairments{}, 4, 1024, netip.MustParseAddr("fd77::10"), netip.MustParseAddr("fd77::11"))
			} else {
				tb = newTestbed(t, memlink.Impairments{}, 4, 1024)
			}
			cqa, cqb := tb.a.dev.newCQ(64), tb.b.dev.newCQ(64)
			qa, _ := tb.a.pd.newQP(testQP{Type: ib.UD, SendCQ: cqa, RecvCQ: cqa})
			qb, _ := tb.b.pd.newQP(testQP{Type: ib.UD, SendCQ: cqb, RecvCQ: cqb})
			for _, q := range []*QP{qa, qb} {
				must(t, ibtest.Modify(q, ib.Init, &ib.QPAttr{QKey: 0x11111111}))
				must(t, ibtest.Modify(q, ib.RTR, nil))
				must(t, ibtest.Modify(q, ib.RTS, &ib.QPAttr{SQPSN: 5}))
			}
			ah, err := tb.a.pd.newAH(ib.AddressVector{DMAC: macB, DGID: ib.GIDFrom(tb.b.dev.cfg.Addrs[0]), HopLimit: 9})
			must(t, err)
			src, _ := tb.a.pd.RegBytes(make([]byte, 2048), 0, ib.LocalWrite)
			pattern(src.Bytes(), 5)
			rbuf, _ := tb.b.pd.RegBytes(make([]byte, 4*1100), 0, ib.LocalWrite)
			for i := 0; i < 4; i++ {
				_, err := qb.PostRecv([]verbs.RecvWR{{ID: uint64(i), SG: []ib.SGE{{Addr: rbuf.IOVA() + uint64(i*1100), Length: 1100, LKey: rbuf.LKey()}}}})
				must(t, err)
			}
			sg := func(n int) []ib.SGE { return []ib.SGE{{Addr: src.IOVA(), Length: uint32(n), LKey: src.LKey()}} }
			_, err = qa.PostSend([]verbs.SendWR{
				{ID: 1, Opcode: ib.Send, Flags: ib.Signaled, SG: sg(1024), AH: ah, RemoteQPN: qb.QPN(), RemoteQKey: 0x80000000}, // use the QP's Q_Key
				{ID: 2, Opcode: ib.SendWithImm, Flags: ib.Signaled, SG: sg(5), AH: ah, RemoteQPN: qb.QPN(), RemoteQKey: 0x11111111, Imm: 77},
				{ID: 3, Opcode: ib.Send, Flags: ib.Signaled, SG: sg(5), AH: ah, RemoteQPN: qb.QPN(), RemoteQKey: 0x22222222},    // wrong Q_Key: dropped
				{ID: 4, Opcode: ib.Send, Flags: ib.Signaled, SG: sg(1025), AH: ah, RemoteQPN: qb.QPN(), RemoteQKey: 0x11111111}, // > MTU
			})
			must(t, err)
			var sa, rb []ib.WC
			tb.run(func() bool {
				sa = append(sa, pollAll(cqa)...)
				rb = append(rb, pollAll(cqb)...)
				return len(sa) == 4 && len(rb) == 2 && tb.a.port.InFlight()+tb.b.port.InFlight() == 0
			}, time.Second)
			if sa[3].Status != ib.LocLenErr || sa[0].Status != ib.Success {
				t.Fatalf("send completions %+v", sa)
			}
			if len(rb) != 2 || qb.udQP().RxBadQKey != 1 {
				t.Fatalf("recv %+v bad qkey %d", rb, qb.udQP().RxBadQKey)
			}
			r0, r1 := rb[0], rb[1]
			if r0.ByteLen != 40+1024 || r0.SrcQP != qa.QPN() || r0.Flags&ib.WCGRH == 0 || r0.SrcIP != tb.a.dev.cfg.Addrs[0] {
				t.Fatalf("%+v", r0)
			}
			if r1.Flags&ib.WCWithImm == 0 || r1.Imm != 77 || r1.ByteLen != 45 {
				t.Fatalf("%+v", r1)
			}
			b := rbuf.Bytes()
			if !bytes.Equal(b[40:40+1024], src.Bytes()[:1024]) {
				t.Fatal("UD payload")
			}
			// The GRH slot: IPv4 is 20 zero bytes then the IPv4 header;
			// IPv6 is the IPv6 header.
			if fam == "v4" {
				if !bytes.Equal(b[:20], make([]byte, 20)) || b[20] != 0x45 || b[20+8] != 9 {
					t.Fatalf("GRH slot % x", b[:40])
				}
			} else if b[0]>>4 != 6 || b[7] != 9 {
				t.Fatalf("GRH slot % x", b[:40])
			}
		})
	}
}

func TestE2EUCDropsToNextFirst(t *testing.T) {
	tb := newTestbed(t, memlink.Impairments{Loss: 0.05}, 6, 256)
	qa, qb := tb.connect(ib.UC, 256, ib.LocalWrite|ib.RemoteWrite, 64)
	const n, size = 200, 700 // three packets each
	src, _ := tb.a.pd.RegBytes(make([]byte, n*size), 0, ib.LocalWrite)
	pattern(src.Bytes(), 9)
	dst, _ := tb.b.pd.RegBytes(make([]byte, n*size), 0, ib.LocalWrite)
	posted, recvd := 0, 0
	var sends, recvs []ib.WC
	tb.run(func() bool {
		for posted < n {
			if _, err := qb.PostRecv([]verbs.RecvWR{{ID: uint64(posted), SG: []ib.SGE{{Addr: dst.IOVA() + uint64(recvd*size), Length: size, LKey: dst.LKey()}}}}); err != nil {
				break
			}
			recvd++
			if _, err := qa.PostSend([]verbs.SendWR{{ID: uint64(posted), Opcode: ib.Send, Flags: ib.Signaled, SG: []ib.SGE{{Addr: src.IOVA() + uint64(posted*size), Length: size, LKey: src.LKey()}}}}); err != nil {
				t.Fatal(err)
			}
			posted++
		}
		sends = append(sends, pollAll(qa.init.SendCQ)...)
		recvs = append(recvs, pollAll(qb.init.RecvCQ)...)
		return len(sends) == n && tb.a.port.InFlight()+tb.b.port.InFlight() == 0
	}, time.Second)
	// Every received message is whole and is one of the sent ones, in
	// order; lost messages are simply missing and their receive WQEs are
	// reused by later messages.
	last := -1
	for i, r := range recvs {
		got := dst.Bytes()[i*size : (i+1)*size]
		found := -1
		for m := last + 1; m < n; m++ {
			if bytes.Equal(got, src.Bytes()[m*size:(m+1)*size]) {
				found = m
				break
			}
		}
		if found < 0 || r.Status != ib.Success || r.ByteLen != size {
			t.Fatalf("receive %d: %+v not a whole later message", i, r)
		}
		last = found
	}
	if len(recvs) == n || len(recvs) < n/2 {
		t.Fatalf("%d of %d messages arrived at 5%% loss", len(recvs), n)
	}
}

func TestE2ESRQ(t *testing.T) {
	tb := newTestbed(t, memlink.Impairments{}, 7, 1024)
	srq, err := tb.b.pd.newSRQ(64, 1)
	must(t, err)
	cqb := tb.b.dev.newCQ(256)
	buf, _ := tb.b.pd.RegBytes(make([]byte, 64*100), 0, ib.LocalWrite)
	for i := 0; i < 64; i++ {
		_, err := srq.PostRecv([]verbs.RecvWR{{ID: uint64(i), SG: []ib.SGE{{Addr: buf.IOVA() + uint64(i*100), Length: 100, LKey: buf.LKey()}}}})
		must(t, err)
	}
	var qas []*QP
	for i := 0; i < 4; i++ {
		cqa := tb.a.dev.newCQ(64)
		qa, _ := tb.a.pd.newQP(testQP{Type: ib.RC, SendCQ: cqa, RecvCQ: cqa, MaxInline: 16})
		qb, _ := tb.b.pd.newQP(testQP{Type: ib.RC, SendCQ: cqb, RecvCQ: cqb, SRQ: srq})
		if _, err := qb.PostRecv([]verbs.RecvWR{{}}); !errors.Is(err, verbs.ErrNoRecvQueue) {
			t.Fatal("post recv on an SRQ QP")
		}
		for _, p := range [][2]*QP{{qa, qb}, {qb, qa}} {
			q, peer := p[0], p[1]
			dst := tb.b.dev.cfg.Addrs[0]
			mac := macB
			if q == qb {
				dst, mac = tb.a.dev.cfg.Addrs[0], macA
			}
			must(t, ibtest.Modify(q, ib.Init, nil))
			must(t, ibtest.Modify(q, ib.RTR, &ib.QPAttr{PathMTU: 1024, DestQPN: peer.QPN(), AV: ib.AddressVector{DMAC: mac, DGID: ib.GIDFrom(dst)}}))
			must(t, ibtest.Modify(q, ib.RTS, &ib.QPAttr{Timeout: 8, RetryCnt: 7, RNRRetry: 7}))
		}
		qas = append(qas, qa)
	}
	for i, qa := range qas {
		for j := 0; j < 10; j++ {
			_, err := qa.PostSend([]verbs.SendWR{{Opcode: ib.SendWithImm, Imm: uint32(i*100 + j), Flags: ib.Inline, InlineData: []byte{byte(i), byte(j)}}})
			must(t, err)
		}
	}
	var r []ib.WC
	tb.run(func() bool { r = append(r, pollAll(cqb)...); return len(r) == 40 }, time.Second)
	seen := map[uint32]bool{}
	for _, c := range r {
		b := buf.Bytes()[c.ID*100:]
		if c.Status != ib.Success || c.ByteLen != 2 || uint32(b[0])*100+uint32(b[1]) != c.Imm || seen[c.Imm] {
			t.Fatalf("%+v", c)
		}
		seen[c.Imm] = true
	}
}

// TestHostileFramesNeverPanic throws truncated, corrupted and forged
// frames at a device with live QPs: nothing may panic and no memory may
// change outside what a valid request is allowed to touch.
func TestHostileFramesNeverPanic(t *testing.T) {
	tb := newTestbed(t, memlink.Impairments{}, 8, 1024)
	qa, qb := tb.connect(ib.RC, 1024, ib.LocalWrite|ib.RemoteWrite|ib.RemoteRead|ib.RemoteAtomic, 16)
	guard, _ := tb.b.pd.RegBytes(make([]byte, 4096), 0, ib.LocalWrite)
	tgt, _ := tb.b.pd.RegBytes(make([]byte, 64), 0, ib.LocalWrite|ib.RemoteWrite)
	src, _ := tb.a.pd.RegBytes(make([]byte, 64), 0, ib.LocalWrite)
	// Capture a valid WRITE frame from A.
	_, err := qa.PostSend([]verbs.SendWR{{Opcode: ib.RDMAWrite, SG: []ib.SGE{{Addr: src.IOVA(), Length: 64, LKey: src.LKey()}}, RemoteAddr: tgt.IOVA(), RKey: tgt.RKey()}})
	must(t, err)
	out := [][]byte{make([]byte, 9000)}
	n := tb.a.dev.Transmit(0, out)
	if n != 1 {
		t.Fatal("no frame")
	}
	good := append([]byte(nil), out[0]...)
	r := rand.New(rand.NewPCG(1, 2))
	var fr [][]byte
	for i := 0; i < 20000; i++ {
		b := append([]byte(nil), good...)
		switch i % 4 {
		case 0:
			b = b[:r.IntN(len(b)+1)]
		case 1:
			b[r.IntN(len(b))] ^= byte(1 + r.IntN(255))
		case 2:
			// Forged but with a valid ICRC: random transport bytes.
			off := 14 + 20 + 8
			for k := off; k < len(b)-4; k++ {
				if r.IntN(8) == 0 {
					b[k] = byte(r.Uint32())
				}
			}
			b[off+1] &^= 0x0F                             // TVer 0
			binary.BigEndian.PutUint16(b[off+2:], 0xFFFF) // P_Key
			bth.BTH(b[off:]).SetDestQP(qb.QPN())          // our QP
			var f frame.Frame
			if frame.Parse(b, &f) == nil {
				_ = restamp(b)
			}
		case 3:
			b = append(b[:14+20+8+12], make([]byte, r.IntN(64))...)
		}
		fr = append(fr, b)
		if len(fr) == 64 {
			tb.b.dev.Receive(0, fr)
			tb.b.dev.Transmit(0, out)
			fr = fr[:0]
		}
	}
	if !bytes.Equal(guard.Bytes(), make([]byte, 4096)) {
		t.Fatal("memory outside any remotely writable MR changed")
	}
}

// restamp fixes the ICRC of a frame after its transport bytes changed.
func restamp(b []byte) error {
	var f frame.Frame
	if err := frame.Parse(b, &f); err != nil {
		return err
	}
	return icrcStamp(f.Packet())
}

func icrcStamp(p []byte) error { return icrc.Stamp(p) }

// TestReceiveChecks sends frames that fail each of the device's checks and
// one that passes them all.
func TestReceiveChecks(t *testing.T) {
	tb := newTestbed(t, memlink.Impairments{}, 9, 1024)
	_, qb := tb.connect(ib.RC, 1024, ib.LocalWrite|ib.RemoteWrite, 8)
	tgt, _ := tb.b.pd.RegBytes(make([]byte, 16), 0, ib.LocalWrite|ib.RemoteWrite)
	spec := func() *frame.Spec {
		return &frame.Spec{SrcMAC: macA, DstMAC: macB, Src: addrA, Dst: addrB, SrcPort: 0xC000,
			BTH:  bth.BTHFields{Opcode: bth.RCRDMAWriteOnly, PKey: 0xFFFF, DestQP: qb.QPN(), AckReq: true, PSN: bth.PSN(qb.attr.RQPSN)},
			RETH: frame.RETHFields{VA: tgt.IOVA(), RKey: tgt.RKey(), DMALen: 4}}
	}
	build := func(s *frame.Spec) []byte {
		b := make([]byte, 256)
		n, err := frame.Build(b, s, []byte{1, 2, 3, 4})
		must(t, err)
		return b[:n]
	}
	s := spec()
	s.Src = netip.MustParseAddr("10.77.0.99")
	badSrc := build(s)
	s = spec()
	s.Dst = netip.MustParseAddr("10.77.0.98")
	notLocal := build(s)
	s = spec()
	s.BTH.PKey = 0x8001
	badPKey := build(s)
	s = spec()
	s.BTH.DestQP = 0x777
	noQP := build(s)
	s = spec()
	s.BTH.Opcode = bth.UCRDMAWriteOnly
	badType := build(s)
	badICRC := build(spec())
	badICRC[len(badICRC)-1] ^= 1
	good := build(spec())
	tb.b.dev.Receive(0, [][]byte{badSrc, notLocal, badPKey, noQP, badType, badICRC, []byte{1, 2, 3}})
	st := tb.b.dev.Stats
	if st.RxBadSrc != 1 || st.RxNotLocal != 1 || st.RxBadHeader != 1 || st.RxNoQP != 1 || st.RxBadType != 1 || st.RxBadICRC != 1 || st.RxParseErr != 1 {
		t.Fatalf("%+v", st)
	}
	if !bytes.Equal(tgt.Bytes()[:4], make([]byte, 4)) {
		t.Fatal("a rejected frame wrote memory")
	}
	tb.b.dev.Receive(0, [][]byte{good})
	if !bytes.Equal(tgt.Bytes()[:4], []byte{1, 2, 3, 4}) {
		t.Fatal("the good frame did not write")
	}
	out := [][]byte{make([]byte, 2048)}
	if tb.b.dev.Transmit(0, out) != 1 {
		t.Fatal("no ACK")
	}
	checker.Frame(t, out[0], checker.Dst(addrA),
		checker.TransportIs(checker.Opcode(bth.RCAcknowledge), checker.DestQP(qb.attr.DestQPN)))
}

func TestInlineSendsAllocateNothing(t *testing.T) {
	p := newPingPair(t, ib.Send, 64, 1024)
	p.send = verbs.SendWR{Opcode: ib.Send, Flags: ib.Signaled | ib.Inline, InlineData: make([]byte, 60)}
	p.qa.init.MaxInline = 64
	p.qa.inline = make([]byte, p.qa.init.MaxSendWR*64)
	p.stream(1000)
	if a := testing.AllocsPerRun(10, func() { p.stream(100) }); a != 0 {
		t.Fatalf("%.1f allocations per 100 inline sends", a)
	}
}

func TestGSIQPAndAsyncEvents(t *testing.T) {
	tb := newTestbed(t, memlink.Impairments{}, 12, 1024)
	var gsi [2]*QP
	var cqs [2]*CQ
	for i, n := range []*node{tb.a, tb.b} {
		cqs[i] = n.dev.newCQ(16)
		q, err := n.pd.newQP(testQP{Type: ib.GSI, SendCQ: cqs[i], RecvCQ: cqs[i]})
		must(t, err)
		if q.QPN() != 1 {
			t.Fatalf("GSI QPN %d", q.QPN())
		}
		if _, err := n.pd.newQP(testQP{Type: ib.GSI, SendCQ: cqs[i], RecvCQ: cqs[i]}); err == nil {
			t.Fatal("second GSI QP")
		}
		must(t, ibtest.Modify(q, ib.Init, nil))
		must(t, ibtest.Modify(q, ib.RTR, nil))
		must(t, ibtest.Modify(q, ib.RTS, nil))
		gsi[i] = q
	}
	mad, _ := tb.a.pd.RegBytes(bytes.Repeat([]byte{0x07}, 256), 0, ib.LocalWrite)
	rb, _ := tb.b.pd.RegBytes(make([]byte, 40+256), 0, ib.LocalWrite)
	_, err := gsi[1].PostRecv([]verbs.RecvWR{{ID: 1, SG: []ib.SGE{{Addr: rb.IOVA(), Length: 296, LKey: rb.LKey()}}}})
	must(t, err)
	ah, _ := tb.a.pd.newAH(ib.AddressVector{DMAC: macB, DGID: ib.GIDFrom(addrB)})
	_, err = gsi[0].PostSend([]verbs.SendWR{{ID: 2, Opcode: ib.Send, Flags: ib.Signaled, SG: []ib.SGE{{Addr: mad.IOVA(), Length: 256, LKey: mad.LKey()}},
		AH: ah, RemoteQPN: 1, RemoteQKey: bth.GSIQKey}})
	must(t, err)
	var got []ib.WC
	tb.run(func() bool { got = append(got, pollAll(cqs[1])...); return len(got) == 1 }, time.Second)
	if got[0].SrcQP != 1 || got[0].ByteLen != 296 || !bytes.Equal(rb.Bytes()[40:], mad.Bytes()) {
		t.Fatalf("%+v", got[0])
	}

	// An RC QP left in RTR raises COMM_EST on its first packet; a remote
	// access error raises QP_FATAL on the requester.
	qa, qb := tb.connect(ib.RC, 1024, ib.LocalWrite, 8)
	must(t, ibtest.Modify(qb, ib.Reset, nil))
	must(t, ibtest.Modify(qb, ib.Init, &ib.QPAttr{Access: ib.LocalWrite}))
	must(t, ibtest.Modify(qb, ib.RTR, &ib.QPAttr{PathMTU: 1024, DestQPN: qa.QPN(), RQPSN: qa.attr.SQPSN, AV: ib.AddressVector{DMAC: macA, DGID: ib.GIDFrom(addrA)}}))
	src, _ := tb.a.pd.RegBytes(make([]byte, 8), 0, ib.LocalWrite)
	_, err = qa.PostSend([]verbs.SendWR{{ID: 3, Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: []ib.SGE{{Addr: src.IOVA(), Length: 8, LKey: src.LKey()}}, RemoteAddr: 1, RKey: 2}})
	must(t, err)
	tb.run(func() bool { return len(pollAll(qa.init.SendCQ)) == 1 }, time.Second)
	want := map[verbs.AsyncEvent]bool{{Type: ib.EventCommEst, QPN: qb.QPN()}: false}
	for len(tb.b.dev.Events()) > 0 {
		e := <-tb.b.dev.Events()
		if _, ok := want[e]; ok {
			want[e] = true
		}
	}
	fatal := false
	for len(tb.a.dev.Events()) > 0 {
		if e := <-tb.a.dev.Events(); e == (verbs.AsyncEvent{Type: ib.EventQPFatal, QPN: qa.QPN()}) {
			fatal = true
		}
	}
	if !want[verbs.AsyncEvent{Type: ib.EventCommEst, QPN: qb.QPN()}] || !fatal {
		t.Fatalf("events: comm est %v, fatal %v", want, fatal)
	}
}

func TestModifyRTSToRTS(t *testing.T) {
	tb := newTestbed(t, memlink.Impairments{}, 13, 1024)
	qa, _ := tb.connect(ib.RC, 1024, ib.LocalWrite, 8)
	// RTS→RTS changes only what IBA lets a sending QP change.
	must(t, qa.Modify(&ib.QPAttr{MinRNRTimer: 3, Access: ib.RemoteWrite}, ib.AttrMinRNRTimer|ib.AttrAccessFlags))
	if c := qa.rcQP().Config(); c.MinRNRTimer != 3 || c.Access != ib.RemoteWrite {
		t.Fatalf("%+v", c)
	}
	err := qa.Modify(&ib.QPAttr{State: ib.RTS, Timeout: 20}, ib.AttrState|ib.AttrTimeout)
	var me *verbs.ModifyError
	if !errors.Is(err, verbs.ErrInvalid) || !errors.As(err, &me) || me.Attr != ib.AttrTimeout || me.From != ib.RTS {
		t.Fatalf("timeout in RTS→RTS: %v", err)
	}
	// The timers and retry counts change in SQD→SQD.
	must(t, qa.Modify(&ib.QPAttr{State: ib.SQD}, ib.AttrState))
	must(t, qa.Modify(&ib.QPAttr{State: ib.SQD, Timeout: 20, RetryCnt: 3}, ib.AttrState|ib.AttrTimeout|ib.AttrRetryCnt))
	if c := qa.rcQP().Config(); c.Timeout != 20 || c.RetryCnt != 3 || c.RNRRetry != 7 {
		t.Fatalf("%+v", c)
	}
	if err := qa.Modify(&ib.QPAttr{RetryCnt: 9}, ib.AttrRetryCnt); !errors.Is(err, verbs.ErrInvalid) {
		t.Fatalf("retry_cnt 9 accepted: %v", err)
	}
	must(t, qa.Modify(&ib.QPAttr{RNRRetry: 2}, ib.AttrRNRRetry))
	must(t, qa.Modify(&ib.QPAttr{State: ib.RTS}, ib.AttrState))
	if c := qa.rcQP().Config(); c.RNRRetry != 2 || c.Timeout != 20 {
		t.Fatalf("%+v", c)
	}
	if a, _ := qa.Query(); a.State != ib.RTS || a.Timeout != 20 || a.RetryCnt != 3 || a.RNRRetry != 2 || a.MinRNRTimer != 3 {
		t.Fatalf("query: %+v", a)
	}
}

// TestIdleQPsCostNothing: the engine's step functions visit only QPs with
// frames to send or a timer armed, so thousands of idle QPs do not slow
// them down.
func TestIdleQPsCostNothing(t *testing.T) {
	tb := newTestbed(t, memlink.Impairments{}, 14, 1024)
	cq := tb.a.dev.newCQ(16)
	var qps []*QP
	for i := 0; i < 2000; i++ {
		q, err := tb.a.pd.newQP(testQP{Type: ib.RC, SendCQ: cq, RecvCQ: cq, MaxSendWR: 4, MaxRecvWR: 4})
		must(t, err)
		must(t, ibtest.Modify(q, ib.Init, nil))
		must(t, ibtest.Modify(q, ib.RTR, &ib.QPAttr{PathMTU: 1024, DestQPN: 5, AV: ib.AddressVector{DMAC: macB, DGID: ib.GIDFrom(addrB)}}))
		must(t, ibtest.Modify(q, ib.RTS, &ib.QPAttr{Timeout: 10, RetryCnt: 7}))
		qps = append(qps, q)
	}
	out := [][]byte{make([]byte, 9000)}
	d := tb.a.dev
	if d.Transmit(0, out) != 0 || d.NextDeadline() != clock.Never || len(d.ready) != 0 || len(d.timed) != 0 {
		t.Fatalf("idle QPs queued: ready %d timed %d", len(d.ready), len(d.timed))
	}
	_, err := qps[1234].PostSend([]verbs.SendWR{{Opcode: ib.Send}})
	must(t, err)
	if d.Transmit(0, out) != 1 || len(d.ready) != 0 || d.NextDeadline() == clock.Never || len(d.timed) != 1 {
		t.Fatalf("ready %d timed %d", len(d.ready), len(d.timed))
	}
	must(t, ibtest.Modify(qps[1234], ib.Err, nil))
	if d.NextDeadline() != clock.Never || len(d.timed) != 0 {
		t.Fatal("timer list keeps a QP in ERR")
	}
}

// TestUDSendErrorSQE: a local send error moves a UD QP to SQE, flushes
// the rest of the SQ and keeps receiving; SQE → RTS resumes sending.
func TestUDSendErrorSQE(t *testing.T) {
	tb := newTestbed(t, memlink.Impairments{}, 15, 1024)
	cq := tb.a.dev.newCQ(64)
	q, _ := tb.a.pd.newQP(testQP{Type: ib.UD, SendCQ: cq, RecvCQ: cq})
	must(t, ibtest.Modify(q, ib.Init, &ib.QPAttr{QKey: 1}))
	must(t, ibtest.Modify(q, ib.RTR, nil))
	must(t, ibtest.Modify(q, ib.RTS, nil))
	ah, _ := tb.a.pd.newAH(ib.AddressVector{DMAC: macB, DGID: ib.GIDFrom(addrB)})
	src, _ := tb.a.pd.RegBytes(make([]byte, 2048), 0, ib.LocalWrite)
	sg := func(n uint32) []ib.SGE { return []ib.SGE{{Addr: src.IOVA(), Length: n, LKey: src.LKey()}} }
	_, err := q.PostSend([]verbs.SendWR{{ID: 1, Opcode: ib.Send, Flags: ib.Signaled, SG: sg(8), AH: ah, RemoteQPN: 9}, {ID: 2, Opcode: ib.Send, Flags: ib.Signaled, SG: sg(2000), AH: ah, RemoteQPN: 9}, // > MTU
		verbs.SendWR{ID: 3, Opcode: ib.Send, Flags: ib.Signaled, SG: sg(8), AH: ah, RemoteQPN: 9}})
	must(t, err)
	out := [][]byte{make([]byte, 9000), make([]byte, 9000), make([]byte, 9000)}
	if n := tb.a.dev.Transmit(0, out); n != 1 {
		t.Fatalf("%d frames", n)
	}
	w := pollAll(cq)
	if len(w) != 3 || w[0].Status != ib.Success || w[1].Status != ib.LocLenErr || w[2].Status != ib.WRFlushErr || q.State() != ib.SQE {
		t.Fatalf("%v %+v", q.State(), w)
	}
	_, err = q.PostSend([]verbs.SendWR{{ID: 4, Opcode: ib.Send, Flags: ib.Signaled, SG: sg(8), AH: ah, RemoteQPN: 9}})
	must(t, err)
	if w := pollAll(cq); len(w) != 1 || w[0].Status != ib.WRFlushErr {
		t.Fatalf("%+v", w)
	}
	must(t, ibtest.Modify(q, ib.RTS, nil))
	_, err = q.PostSend([]verbs.SendWR{{ID: 5, Opcode: ib.Send, Flags: ib.Signaled, SG: sg(8), AH: ah, RemoteQPN: 9}})
	must(t, err)
	if n := tb.a.dev.Transmit(0, out); n != 1 {
		t.Fatal("no send after SQE → RTS")
	}
	if w := pollAll(cq); len(w) != 1 || w[0].Status != ib.Success {
		t.Fatalf("%+v", w)
	}
}

// TestPostInError: a WR posted in error (one its owner found malformed)
// is met as an RNIC meets a bad WQE. A send completes in error after the
// sends before it and stops the send queue (SQE for UD), flushing the
// sends after it; a receive takes the QP to ERR with QP_FATAL, after the
// receives before it were flushed. A QP whose state takes no sends
// completes the send in error at once and stays as it is.
func TestPostInError(t *testing.T) {
	tb := newTestbed(t, memlink.Impairments{}, 16, 1024)
	ud := func() (*QP, *CQ) {
		cq := tb.a.dev.newCQ(64)
		q, _ := tb.a.pd.newQP(testQP{Type: ib.UD, SendCQ: cq, RecvCQ: cq})
		must(t, ibtest.Modify(q, ib.Init, &ib.QPAttr{QKey: 1}))
		return q, cq
	}
	ah, _ := tb.a.pd.newAH(ib.AddressVector{DMAC: macB, DGID: ib.GIDFrom(addrB)})
	mr, _ := tb.a.pd.RegBytes(make([]byte, 2048), 0, ib.LocalWrite)
	send := func(id uint64) []verbs.SendWR {
		return []verbs.SendWR{{ID: id, Opcode: ib.Send, Flags: ib.Signaled, SG: []ib.SGE{{Addr: mr.IOVA(), Length: 8, LKey: mr.LKey()}}, AH: ah, RemoteQPN: 9}}
	}
	recv := func(id uint64) []verbs.RecvWR {
		return []verbs.RecvWR{{ID: id, SG: []ib.SGE{{Addr: mr.IOVA(), Length: 64, LKey: mr.LKey()}}}}
	}
	out := [][]byte{make([]byte, 9000), make([]byte, 9000), make([]byte, 9000)}

	q, cq := ud() // INIT: no sends yet
	must(t, q.PostSendInError(1, ib.Send, ib.LocQPOpErr))
	if w := pollAll(cq); len(w) != 1 || w[0].ID != 1 || w[0].Status != ib.LocQPOpErr || q.State() != ib.Init {
		t.Fatalf("in INIT: %v %+v", q.State(), w)
	}

	must(t, ibtest.Modify(q, ib.RTR, nil))
	must(t, ibtest.Modify(q, ib.RTS, nil))
	_, err := q.PostSend(send(2))
	must(t, err)
	must(t, q.PostSendInError(3, 200, ib.LocQPOpErr))
	_, err = q.PostSend(send(4))
	must(t, err)
	tb.a.dev.Transmit(0, out)
	w := pollAll(cq)
	if len(w) != 3 || w[0].ID != 2 || w[0].Status != ib.Success || w[1].ID != 3 || w[1].Status != ib.LocQPOpErr ||
		w[2].ID != 4 || w[2].Status != ib.WRFlushErr || q.State() != ib.SQE {
		t.Fatalf("sends: %v %+v", q.State(), w)
	}

	q2, cq2 := ud()
	drainEvents(tb.a.dev.Events())
	_, err = q2.PostRecv(append(recv(5), recv(6)...))
	must(t, err)
	must(t, q2.PostRecvInError(7, ib.LocQPOpErr))
	must(t, q2.PostRecvInError(8, ib.LocQPOpErr))
	w = pollAll(cq2)
	if len(w) != 4 || w[0].ID != 5 || w[0].Status != ib.WRFlushErr || w[1].ID != 6 || w[1].Status != ib.WRFlushErr ||
		w[2].ID != 7 || w[2].Status != ib.LocQPOpErr || !w[2].IsRecv || w[3].ID != 8 || w[3].Status != ib.WRFlushErr || q2.State() != ib.Err {
		t.Fatalf("receives: %v %+v", q2.State(), w)
	}
	if evs := drainEvents(tb.a.dev.Events()); !hasEvent(evs, verbs.AsyncEvent{Type: ib.EventQPFatal, QPN: q2.QPN()}) {
		t.Fatalf("events %v, want QP_FATAL", evs)
	}
}

// TestCreateQPNamesTheCap: a QP whose capabilities exceed the device's is
// refused with ErrInvalid, the message naming the ibv_qp_cap field.
func TestCreateQPNamesTheCap(t *testing.T) {
	tb := newTestbed(t, memlink.Impairments{}, 1, 1024)
	cq := tb.a.dev.newCQ(16)
	for _, c := range []struct {
		caps ib.QPCaps
		name string
	}{
		{ib.QPCaps{MaxSendWR: MaxQPWR + 1}, "max_send_wr"},
		{ib.QPCaps{MaxRecvWR: MaxQPWR + 1}, "max_recv_wr"},
		{ib.QPCaps{MaxSendSGE: MaxSGE + 1}, "max_send_sge"},
		{ib.QPCaps{MaxRecvSGE: MaxSGE + 1}, "max_recv_sge"},
		{ib.QPCaps{MaxInline: MaxInline + 1}, "max_inline_data"},
	} {
		_, err := tb.a.pd.CreateQP(&verbs.QPInitAttr{Type: ib.RC, SendCQ: cq, RecvCQ: cq, Cap: c.caps})
		if !errors.Is(err, verbs.ErrInvalid) || !strings.Contains(err.Error(), c.name) {
			t.Errorf("%+v: %v, want ErrInvalid naming %s", c.caps, err, c.name)
		}
	}
}

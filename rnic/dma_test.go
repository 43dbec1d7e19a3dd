package rnic

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/ibtest"
	"github.com/softrnic/softrnic/port/memlink"
	"github.com/softrnic/softrnic/verbs"
)

// selfSpace is this test process's own address space as an AddrSpace:
// the device copies through /proc/self/mem exactly as it does through a
// client's, so the tests need no second process.
func selfSpace(t testing.TB, d *Device) *AddrSpace {
	t.Helper()
	fd, err := unix.Open("/proc/self/mem", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Skipf("/proc/self/mem: %v", err)
	}
	a := d.NewAddrSpace(fd)
	t.Cleanup(func() { a.Close() })
	return a
}

// regExt registers b through a (an external MR at b's own address). b
// must be on the heap (a goroutine's stack moves): the cleanup's
// reference makes it escape there.
func regExt(t testing.TB, pd *PD, a *AddrSpace, b []byte, access ib.Access) *MR {
	t.Helper()
	t.Cleanup(func() { runtime.KeepAlive(b) })
	m, err := pd.RegExternal(a, addrOf(b), uint64(len(b)), addrOf(b), access)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func sge(m *MR, off, n int) ib.SGE {
	return ib.SGE{Addr: m.IOVA() + uint64(off), Length: uint32(n), LKey: m.LKey()}
}

func patterned(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7) + seed
	}
	return b
}

// Every RC operation, and UD, between two devices whose MRs are all
// external memory: the bytes arrive, the atomics compute, and a 64 KiB
// WRITE lands in far fewer system calls than packets.
func TestExternalMemoryRC(t *testing.T) {
	tb := newTestbed(t, memlink.Impairments{}, 1, 4096)
	sa, sb := selfSpace(t, tb.a.dev), selfSpace(t, tb.b.dev)
	qa, qb := tb.connect(ib.RC, 4096, ib.LocalWrite|ib.RemoteWrite|ib.RemoteRead|ib.RemoteAtomic, 64)
	const n = 64 << 10
	src, dst := patterned(n, 3), make([]byte, n)
	all := ib.LocalWrite | ib.RemoteWrite | ib.RemoteRead | ib.RemoteAtomic
	ms, md := regExt(t, tb.a.pd, sa, src, all), regExt(t, tb.b.pd, sb, dst, all)
	wait := func(cq *CQ, k int) []ib.WC {
		var got []ib.WC
		tb.run(func() bool { got = append(got, pollAll(cq)...); return len(got) >= k }, time.Second)
		for _, w := range got {
			if w.Status != ib.Success {
				t.Fatalf("%+v", w)
			}
		}
		return got
	}

	before, beforeA := tb.b.dev.Stats.DMAStats, tb.a.dev.Stats.DMAStats
	_, err := qa.PostSend([]verbs.SendWR{{ID: 1, Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: []ib.SGE{sge(ms, 0, n)}, RemoteAddr: md.IOVA(), RKey: md.RKey()}})
	must(t, err)
	wait(qa.init.SendCQ, 1)
	if !bytes.Equal(src, dst) {
		t.Fatal("WRITE: data differs")
	}
	st := tb.b.dev.Stats.DMAStats
	if w := st.DMAWriteBytes - before.DMAWriteBytes; w != n {
		t.Fatalf("WRITE: %d bytes written, want %d", w, n)
	}
	if calls := st.DMAWriteCalls - before.DMAWriteCalls; calls == 0 || calls > 4 {
		t.Fatalf("WRITE of 16 packets took %d pwritev calls", calls)
	}
	if reads := tb.a.dev.Stats.DMAReadCalls - beforeA.DMAReadCalls; reads == 0 || reads > 4 {
		t.Fatalf("WRITE of 16 packets read its payload in %d preads", reads)
	}

	// READ back into another part of src's MR, then a SEND of two SGEs
	// into two receive SGEs.
	clear(src[:n/2])
	_, err = qa.PostSend([]verbs.SendWR{{ID: 2, Opcode: ib.RDMARead, Flags: ib.Signaled, SG: []ib.SGE{sge(ms, 0, n/2)}, RemoteAddr: md.IOVA() + n/2, RKey: md.RKey()}})
	must(t, err)
	wait(qa.init.SendCQ, 1)
	if !bytes.Equal(src[:n/2], dst[n/2:]) {
		t.Fatal("READ: data differs")
	}
	_, err = qb.PostRecv([]verbs.RecvWR{{ID: 3, SG: []ib.SGE{sge(md, 100, 1000), sge(md, 5000, 9000)}}})
	must(t, err)
	_, err = qa.PostSend([]verbs.SendWR{{ID: 4, Opcode: ib.Send, Flags: ib.Signaled, SG: []ib.SGE{sge(ms, 7, 3000), sge(ms, 20000, 7000)}}})
	must(t, err)
	wait(qa.init.SendCQ, 1)
	r := wait(qb.init.RecvCQ, 1)
	want := append(append([]byte{}, src[7:3007]...), src[20000:27000]...)
	got := append(append([]byte{}, dst[100:1100]...), dst[5000:14000][:9000]...)
	if r[0].ByteLen != 10000 || !bytes.Equal(got[:10000], want) {
		t.Fatalf("SEND: %d bytes, data equal %v", r[0].ByteLen, bytes.Equal(got[:10000], want))
	}

	// Atomics on an 8-byte word of dst; the old values land in src.
	binary.NativeEndian.PutUint64(dst[64:], 40)
	_, err = qa.PostSend([]verbs.SendWR{
		{ID: 5, Opcode: ib.AtomicFetchAndAdd, Flags: ib.Signaled, SG: []ib.SGE{sge(ms, 0, 8)}, RemoteAddr: md.IOVA() + 64, RKey: md.RKey(), CompareAdd: 2},
		{ID: 6, Opcode: ib.AtomicCmpAndSwp, Flags: ib.Signaled, SG: []ib.SGE{sge(ms, 8, 8)}, RemoteAddr: md.IOVA() + 64, RKey: md.RKey(), CompareAdd: 42, Swap: 7},
	})
	must(t, err)
	wait(qa.init.SendCQ, 2)
	if a, b, c := binary.NativeEndian.Uint64(src), binary.NativeEndian.Uint64(src[8:]), binary.NativeEndian.Uint64(dst[64:]); a != 40 || b != 42 || c != 7 {
		t.Fatalf("atomics: fetched %d and %d, word now %d", a, b, c)
	}
	runtime.KeepAlive(src)
	runtime.KeepAlive(dst)
}

// A WRITE stream from external memory at a small MTU reads each byte of
// its source once, in large preads: the read-ahead serves every round of
// a Transmit and reads no more than the frames left in it can carry.
func TestExternalMemoryReadOnce(t *testing.T) {
	tb := newTestbed(t, memlink.Impairments{}, 1, 1024)
	sa, sb := selfSpace(t, tb.a.dev), selfSpace(t, tb.b.dev)
	all := ib.LocalWrite | ib.RemoteWrite
	qa, _ := tb.connect(ib.RC, 1024, all, 64)
	const n, msgs = 64 << 10, 16
	src, dst := patterned(n, 11), make([]byte, n)
	ms, md := regExt(t, tb.a.pd, sa, src, all), regExt(t, tb.b.pd, sb, dst, all)
	before := tb.a.dev.Stats.DMAStats
	var wrs []verbs.SendWR
	for i := range msgs {
		wrs = append(wrs, verbs.SendWR{ID: uint64(i), Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: []ib.SGE{sge(ms, 0, n)}, RemoteAddr: md.IOVA(), RKey: md.RKey()})
	}
	_, err := qa.PostSend(wrs)
	must(t, err)
	var got []ib.WC
	tb.run(func() bool { got = append(got, pollAll(qa.init.SendCQ)...); return len(got) == msgs }, time.Second)
	for _, w := range got {
		if w.Status != ib.Success {
			t.Fatalf("%+v", w)
		}
	}
	if !bytes.Equal(src, dst) {
		t.Fatal("data differs")
	}
	st := tb.a.dev.Stats.DMAStats
	bytesRead, calls := st.DMAReadBytes-before.DMAReadBytes, st.DMAReadCalls-before.DMAReadCalls
	// What the window let through while it opened is all the read-ahead
	// may have read in vain.
	if bytesRead < n*msgs || bytesRead > n*msgs+dmaReadFirst {
		t.Fatalf("%d bytes read for %d bytes sent", bytesRead, n*msgs)
	}
	// Transmits of 64 frames of 1 KiB once the window is open: a pread
	// per message, a few more while the window opened.
	if calls > msgs+8 {
		t.Fatalf("%d KiB sent in %d preads", n*msgs>>10, calls)
	}
	runtime.KeepAlive(src)
	runtime.KeepAlive(dst)
}

// The read-ahead never serves bytes the application may have changed:
// not after a completion was published (which hands memory back), not
// after the MR was deregistered, not after its Transmit ended.
func TestExternalReadAheadDropped(t *testing.T) {
	d, _ := NewDevice(Config{Addrs: []netip.Addr{addrA}})
	a := selfSpace(t, d)
	pd := d.allocPD()
	mem := patterned(8192, 1)
	m := regExt(t, pd, a, mem, ib.LocalWrite)
	s := m.mem.Slice(0, 8192)
	cq := d.newCQ(4)
	view := func(off uint32) byte {
		var b [1]byte
		s.ReadAt(b[:], off)
		return b[0]
	}
	view(0) // reads ahead the whole range
	mem[100] = 0xA1
	if v := view(100); v == 0xA1 {
		t.Fatal("the read-ahead was not used (the test proves nothing)")
	}
	cq.push([]ib.WC{{ID: 1}}, false)
	if v := view(100); v != 0xA1 {
		t.Fatalf("after a completion: %#x, want 0xa1", v)
	}
	mem[200] = 0xB2
	d.dmaEndTransmit()
	if v := view(200); v != 0xB2 {
		t.Fatalf("after Transmit ended: %#x, want 0xb2", v)
	}
	reads := d.Stats.DMAReadCalls
	must(t, m.Dereg())
	view(300)
	if d.Stats.DMAReadCalls != reads || d.Stats.DMAFaults == 0 || !d.dmaSettle() {
		t.Fatal("a deregistered MR was served from the read-ahead")
	}
	runtime.KeepAlive(mem)
}

func TestExternalMemoryUD(t *testing.T) {
	tb := newTestbed(t, memlink.Impairments{}, 1, 1024)
	sa, sb := selfSpace(t, tb.a.dev), selfSpace(t, tb.b.dev)
	mk := func(n *node) *QP {
		q, err := n.pd.newQP(testQP{Type: ib.UD, SendCQ: n.dev.newCQ(16), RecvCQ: n.dev.newCQ(16), MaxSendWR: 8, MaxRecvWR: 8, MaxSGE: 2})
		must(t, err)
		must(t, ibtest.Modify(q, ib.Init, &ib.QPAttr{QKey: 0x11}))
		must(t, ibtest.Modify(q, ib.RTR, nil))
		must(t, ibtest.Modify(q, ib.RTS, &ib.QPAttr{SQPSN: 1}))
		return q
	}
	ua, ub := mk(tb.a), mk(tb.b)
	src, dst := patterned(512, 9), make([]byte, 1024)
	ms, md := regExt(t, tb.a.pd, sa, src, ib.LocalWrite), regExt(t, tb.b.pd, sb, dst, ib.LocalWrite)
	ah, err := tb.a.pd.newAH(ib.AddressVector{DMAC: macB, DGID: ib.GIDFrom(addrB)})
	must(t, err)
	_, err = ub.PostRecv([]verbs.RecvWR{{ID: 1, SG: []ib.SGE{sge(md, 0, 1024)}}})
	must(t, err)
	_, err = ua.PostSend([]verbs.SendWR{{ID: 2, Opcode: ib.Send, Flags: ib.Signaled, SG: []ib.SGE{sge(ms, 0, 512)}, AH: ah, RemoteQPN: ub.QPN(), RemoteQKey: 0x11}})
	must(t, err)
	var got []ib.WC
	tb.run(func() bool { got = append(got, pollAll(ub.init.RecvCQ)...); return len(got) > 0 }, time.Second)
	if got[0].Status != ib.Success || got[0].ByteLen != 40+512 || !bytes.Equal(dst[40:552], src) {
		t.Fatalf("%+v", got[0])
	}
	if dst[20]>>4 != 4 || !bytes.Equal(dst[20+12:20+16], addrA.AsSlice()) {
		t.Fatalf("GRH: % x", dst[:40])
	}
	runtime.KeepAlive(src)
	runtime.KeepAlive(dst)
}

// truncatable is n bytes of a shared memfd mapping, and a function that
// truncates the file to nothing, after which the mapping stays but no
// access reaches a page.
func truncatable(t *testing.T, n int) ([]byte, func()) {
	t.Helper()
	fd, err := unix.MemfdCreate("softrnic-test", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Close(fd) })
	must(t, unix.Ftruncate(fd, int64(n)))
	b, err := unix.Mmap(fd, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Munmap(b) })
	return b, func() { must(t, unix.Ftruncate(fd, 0)) }
}

// Registered memory whose pages are gone makes the copies fail: the QP
// whose copy failed goes to ERR with a LOC_PROT_ERR completion and
// QP_FATAL, as a DMA error would; another QP of the same device keeps
// working. The pages go by truncating the file under a shared mapping
// (a copy through /proc/PID/mem then meets EFAULT, as for an unmapped
// range): a range unmapped outright could be mapped again by anything in
// the process, the Go runtime included, before the device copies, and
// the copies would then succeed.
func TestExternalMemoryUnmapped(t *testing.T) {
	tb := newTestbed(t, memlink.Impairments{}, 1, 1024)
	tb.timeout = 1
	sa, sb := selfSpace(t, tb.a.dev), selfSpace(t, tb.b.dev)
	all := ib.LocalWrite | ib.RemoteWrite | ib.RemoteRead
	qa, qb := tb.connect(ib.RC, 1024, all, 16)
	qa2, qb2 := tb.connect(ib.RC, 1024, all, 16)
	src := patterned(4096, 1)
	ms := regExt(t, tb.a.pd, sa, src, all)
	gone, truncate := truncatable(t, 8192)
	mg := regExt(t, tb.b.pd, sb, gone, all)
	ok := make([]byte, 4096)
	mo := regExt(t, tb.b.pd, sb, ok, all)
	truncate()

	// Receive side: a SEND into the unmapped receive buffer.
	_, err := qb.PostRecv([]verbs.RecvWR{{ID: 10, SG: []ib.SGE{sge(mg, 0, 4096)}}, {ID: 11, SG: []ib.SGE{sge(mg, 0, 4096)}}})
	must(t, err)
	_, err = qa.PostSend([]verbs.SendWR{{ID: 1, Opcode: ib.Send, Flags: ib.Signaled, SG: []ib.SGE{sge(ms, 0, 3000)}}})
	must(t, err)
	var wb []ib.WC
	tb.run(func() bool { wb = append(wb, pollAll(qb.init.RecvCQ)...); return len(wb) == 2 }, time.Second)
	if wb[0].ID != 10 || wb[0].Status != ib.LocProtErr || wb[1].Status != ib.WRFlushErr || qb.State() != ib.Err {
		t.Fatalf("receiver: %+v, state %v", wb, qb.State())
	}
	if ev := nextEvent(t, tb.b.dev); ev.Type != ib.EventQPFatal {
		t.Fatalf("event %+v", ev)
	}
	// The requester is never acknowledged: it retries, then gives up.
	var wa []ib.WC
	tb.run(func() bool { wa = append(wa, pollAll(qa.init.SendCQ)...); return len(wa) == 1 }, 10*time.Second)
	if wa[0].Status != ib.RetryExcErr {
		t.Fatalf("requester: %+v", wa)
	}

	// Send side: a WRITE from the unmapped memory is never sent.
	_, err = qb2.PostSend([]verbs.SendWR{
		{ID: 20, Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: []ib.SGE{sge(mg, 0, 2000)}, RemoteAddr: ms.IOVA(), RKey: ms.RKey()},
		{ID: 21, Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: []ib.SGE{sge(mo, 0, 100)}, RemoteAddr: ms.IOVA(), RKey: ms.RKey()},
	})
	must(t, err)
	wb = nil
	tb.run(func() bool { wb = append(wb, pollAll(qb2.init.SendCQ)...); return len(wb) == 2 }, time.Second)
	if wb[0].ID != 20 || wb[0].Status != ib.LocProtErr || wb[1].Status != ib.WRFlushErr || qb2.State() != ib.Err {
		t.Fatalf("sender: %+v", wb)
	}
	if tb.a.dev.Stats.RxFrames != 0 && bytes.Equal(src[:2000], make([]byte, 2000)) {
		t.Fatal("zeros of the failed read reached the peer")
	}

	// A third QP pair with good memory is unharmed.
	qa3, qb3 := tb.connect(ib.RC, 1024, all, 16)
	_, err = qa3.PostSend([]verbs.SendWR{{ID: 30, Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: []ib.SGE{sge(ms, 0, 4096)}, RemoteAddr: mo.IOVA(), RKey: mo.RKey()}})
	must(t, err)
	wa = nil
	tb.run(func() bool { wa = append(wa, pollAll(qa3.init.SendCQ)...); return len(wa) == 1 }, time.Second)
	if wa[0].Status != ib.Success || !bytes.Equal(ok, src) || qb3.State() != ib.RTS {
		t.Fatalf("%+v", wa)
	}
	if tb.b.dev.Stats.DMAFaults == 0 {
		t.Fatal("no fault counted")
	}
	_ = qa2
	runtime.KeepAlive(src)
	runtime.KeepAlive(ok)
}

// After Dereg, the device copies nothing more of an external MR: work
// that still names it fails as a DMA error, and the memory is untouched.
func TestExternalMemoryDereg(t *testing.T) {
	tb := newTestbed(t, memlink.Impairments{}, 1, 1024)
	sa, sb := selfSpace(t, tb.a.dev), selfSpace(t, tb.b.dev)
	all := ib.LocalWrite | ib.RemoteWrite | ib.RemoteRead
	qa, qb := tb.connect(ib.RC, 1024, all, 16)
	src, dst := patterned(2048, 5), make([]byte, 2048)
	ms, md := regExt(t, tb.a.pd, sa, src, all), regExt(t, tb.b.pd, sb, dst, all)
	_, err := qb.PostRecv([]verbs.RecvWR{{ID: 1, SG: []ib.SGE{sge(md, 0, 2048)}}})
	must(t, err)
	must(t, md.Dereg())
	_, err = qa.PostSend([]verbs.SendWR{{ID: 2, Opcode: ib.Send, Flags: ib.Signaled, SG: []ib.SGE{sge(ms, 0, 2048)}}})
	must(t, err)
	var w []ib.WC
	tb.run(func() bool { w = append(w, pollAll(qb.init.RecvCQ)...); return len(w) == 1 }, time.Second)
	if w[0].Status != ib.LocProtErr || !bytes.Equal(dst, make([]byte, 2048)) {
		t.Fatalf("%+v", w)
	}
	runtime.KeepAlive(src)
	runtime.KeepAlive(dst)
}

// The external path allocates nothing per packet: a stream of WRITEs
// between external MRs, measured on both devices' step functions.
func TestExternalMemoryNoAllocs(t *testing.T) {
	tb := newTestbed(t, memlink.Impairments{}, 1, 1024)
	sa, sb := selfSpace(t, tb.a.dev), selfSpace(t, tb.b.dev)
	all := ib.LocalWrite | ib.RemoteWrite | ib.RemoteRead
	qa, qb := tb.connect(ib.RC, 1024, all, 64)
	src, dst := patterned(8192, 2), make([]byte, 8192)
	ms, md := regExt(t, tb.a.pd, sa, src, all), regExt(t, tb.b.pd, sb, dst, all)
	_ = qb
	wr := []verbs.SendWR{{ID: 1, Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: []ib.SGE{sge(ms, 0, 8192)}, RemoteAddr: md.IOVA(), RKey: md.RKey()}}
	var wcs [4]ib.WC
	round := func() {
		if _, err := qa.PostSend(wr); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 10000; i++ {
			tb.step()
			tb.clk.Advance(time.Microsecond)
			if qa.init.SendCQ.Poll(wcs[:]) > 0 {
				return
			}
		}
		t.Fatal("no completion")
	}
	round() // the batches' buffers, once
	if a := testing.AllocsPerRun(20, round); a > 0 {
		t.Fatalf("%.1f allocations per 8 KiB WRITE", a)
	}
	if !bytes.Equal(src, dst) {
		t.Fatal("data")
	}
	runtime.KeepAlive(src)
	runtime.KeepAlive(dst)
}

func nextEvent(t *testing.T, d *Device) verbs.AsyncEvent {
	t.Helper()
	select {
	case ev := <-d.Events():
		return ev
	default:
		t.Fatal("no async event")
	}
	return verbs.AsyncEvent{}
}

// BenchmarkExternalCopy measures the device's copy paths through
// /proc/self/mem against a plain copy of the same bytes: the payloads of
// consecutive frames read from one range (the read-ahead serves a
// Transmit), and received frames written to consecutive addresses
// (joined in the arena, one pwritev per visit). Bytes per second are the
// payload's; ns/op is per visit.
func BenchmarkExternalCopy(b *testing.B) {
	d, _ := NewDevice(Config{Addrs: []netip.Addr{addrA}})
	a := selfSpace(b, d)
	pd := d.allocPD()
	mem := make([]byte, 4<<20)
	m := regExt(b, pd, a, mem, ib.LocalWrite)
	frames := make([]byte, 4<<20)
	for _, c := range []struct {
		name  string
		frame int // bytes per frame
		batch int // frames per visit
	}{{"read/1x1KiB", 1024, 1}, {"read/16x1KiB", 1024, 16}, {"read/16x4KiB", 4096, 16}, {"read/1x64KiB", 65536, 1},
		{"write/1x1KiB", 1024, 1}, {"write/64x1KiB", 1024, 64}, {"write/16x4KiB", 4096, 16}, {"write/64x4KiB", 4096, 64}} {
		b.Run(c.name, func(b *testing.B) {
			n := c.frame * c.batch
			b.SetBytes(int64(n))
			s := m.mem.Slice(0, uint64(n))
			read := strings.HasPrefix(c.name, "read")
			for i := 0; i < b.N; i++ {
				for k := 0; k < c.batch; k++ {
					if read {
						s.ReadAt(frames[k*c.frame:(k+1)*c.frame], uint32(k*c.frame))
					} else {
						s.WriteAt(uint32(k*c.frame), frames[k*c.frame:(k+1)*c.frame])
					}
				}
				d.dmaSettle()
				d.dmaEndTransmit()
			}
			if d.Stats.DMAFaults != 0 {
				b.Fatal("faults")
			}
		})
		b.Run(c.name+"/memcpy", func(b *testing.B) {
			n := c.frame * c.batch
			b.SetBytes(int64(n))
			for i := 0; i < b.N; i++ {
				for k := 0; k < c.batch; k++ {
					copy(mem[k*c.frame:(k+1)*c.frame], frames[k*c.frame:(k+1)*c.frame])
				}
			}
		})
	}
	runtime.KeepAlive(mem)
}

package engine

import (
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/bpf"
	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/frame"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/ibtest"
	"github.com/softrnic/softrnic/internal/netnstest"
	"github.com/softrnic/softrnic/port"
	"github.com/softrnic/softrnic/port/afxdp"
	"github.com/softrnic/softrnic/verbs"
)

// BenchmarkTransmitAFXDP is what transmitting costs softrnic beside the
// raw AF_XDP port, per 4154-byte frame (a 4096-byte payload at path MTU
// 4096), in CPU time of this process (user and system: the veth and the
// peer's XDP sink run in the sender's system calls). Raw: frames built
// once, copied into the port's UMEM slots and submitted, as bench/io's raw
// sender does. softrnic: a UC QP streaming 64 KiB RDMA WRITEs (UC: no
// ACKs, so an XDP sink that counts the frames is peer enough), through the
// engine: the transport's headers, the payload gathered from the MR with
// the ICRC, built in the UMEM. The two alternate in rounds; it reports
// each one's CPU ns per frame and raw ÷ softrnic (1: softrnic sends for
// the cost of the raw port). Root only.
func BenchmarkTransmitAFXDP(b *testing.B) {
	netnstest.SkipUnlessRoot(b)
	const mtu, frameLen, msg = 4096, 4154, 64 << 10
	pair := netnstest.NewTestPair(b, netnstest.PairOptions{MTU: 4200})
	var sink *bpf.Sink
	if err := pair.B.NS.Do(func() (err error) { sink, err = bpf.AttachSink(pair.B.Index); return err }); err != nil {
		b.Fatal(err)
	}
	defer sink.Close()
	var p *afxdp.Port
	if err := pair.A.NS.Do(func() (err error) { p, err = afxdp.Open(afxdp.Config{IfIndex: pair.A.Index}); return err }); err != nil {
		b.Fatal(err)
	}
	defer p.Close()

	h := newHost(b, [6]byte(pair.A.MAC), pair.A.Addr, mtu, msg)
	q := h.createQP(b, ib.UC)
	for _, s := range []struct {
		st ib.QPState
		a  ib.QPAttr
	}{
		{ib.Init, ib.QPAttr{Access: ib.RemoteWrite}},
		{ib.RTR, ib.QPAttr{PathMTU: mtu, DestQPN: 0x77, AV: ib.AddressVector{DMAC: [6]byte(pair.B.MAC), DGID: ib.GIDFrom(pair.B.Addr)}}},
		{ib.RTS, ib.QPAttr{SQPSN: 1}},
	} {
		if err := ibtest.Modify(q, s.st, &s.a); err != nil {
			b.Fatal(err)
		}
	}
	loop, err := NewLoop(h.dev, p, Options{})
	if err != nil {
		b.Fatal(err)
	}
	wr := []verbs.SendWR{{Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: []ib.SGE{{Addr: h.mr.IOVA(), Length: msg, LKey: h.mr.LKey()}},
		RemoteAddr: 0x10000, RKey: 0x1234}}
	wcs := make([]ib.WC, 64)
	outstanding := 0
	rnicFrames := func(n int) {
		start := h.dev.StatsSnapshot().TxFrames
		for h.dev.StatsSnapshot().TxFrames-start < uint64(n) {
			for outstanding < 32 {
				if _, err := q.PostSend(wr); err != nil {
					b.Fatal(err)
				}
				outstanding++
			}
			if _, err := loop.Step(clock.Now(), 0); err != nil {
				b.Fatal(err)
			}
			k := h.cq.Poll(wcs)
			for _, w := range wcs[:k] {
				if w.Status != ib.Success {
					b.Fatalf("WRITE: %v", w.Status)
				}
			}
			outstanding -= k
		}
	}
	raw := make([][]byte, port.BatchSize)
	for i := range raw {
		raw[i] = netnstest.RoCEFrame(make([]byte, frameLen), &pair.A, &pair.B, uint32(i))
	}
	var c port.Copier
	rawFrames := func(n int) {
		for sent := 0; sent < n; {
			k, err := c.Send(p, raw[:min(len(raw), n-sent)])
			if err != nil {
				b.Fatal(err)
			}
			sent += k
		}
	}

	rnicFrames(1000) // warm up: the MR, the UMEM, the peer's rings
	rawFrames(1000)
	const rounds = 8
	per := max(b.N/rounds, 64)
	var rawCPU, rnicCPU time.Duration
	b.ResetTimer()
	for r := 0; r < rounds; r++ {
		t := cpuTime()
		rawFrames(per)
		rawCPU += cpuTime() - t
		t = cpuTime()
		rnicFrames(per)
		rnicCPU += cpuTime() - t
	}
	b.StopTimer()
	frames := float64(per * rounds)
	rawNs, rnicNs := float64(rawCPU.Nanoseconds())/frames, float64(rnicCPU.Nanoseconds())/frames
	b.ReportMetric(rawNs, "raw-cpu-ns/frame")
	b.ReportMetric(rnicNs, "softrnic-cpu-ns/frame")
	b.ReportMetric(rawNs/rnicNs, "raw/softrnic")
	b.ReportMetric(0, "ns/op")
	if n, err := sink.Count(); err == nil && n == 0 {
		b.Error("the peer's sink counted no frame")
	}
}

// BenchmarkReceiveAFXDP is what receiving costs softrnic beside the raw
// AF_XDP port, per frame of a UC RDMA WRITE ONLY with a 4096-byte payload
// (4170 bytes), in CPU time of the receiving thread alone (the kernel's
// copy into the UMEM runs in the sender's system calls, on another
// thread). Raw: Recv, which puts each two-segment frame together. softrnic:
// the engine's steps, which also parse it, check its ICRC and place its
// payload in the MR. A sender goroutine floods both alike; it reports each
// receiver's CPU ns per frame and raw ÷ softrnic. Root only.
func BenchmarkReceiveAFXDP(b *testing.B) {
	netnstest.SkipUnlessRoot(b)
	const mtu, pay = 4096, 4096
	pair := netnstest.NewTestPair(b, netnstest.PairOptions{MTU: 4200})
	open := func(l *netnstest.Link) *afxdp.Port {
		var p *afxdp.Port
		if err := l.NS.Do(func() (err error) { p, err = afxdp.Open(afxdp.Config{IfIndex: l.Index}); return err }); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { p.Close() })
		return p
	}
	tx, rx := open(&pair.A), open(&pair.B)
	h := newHost(b, [6]byte(pair.B.MAC), pair.B.Addr, mtu, 1<<20)
	q := h.createQP(b, ib.UC)
	for _, s := range []struct {
		st ib.QPState
		a  ib.QPAttr
	}{
		{ib.Init, ib.QPAttr{Access: ib.RemoteWrite}},
		{ib.RTR, ib.QPAttr{PathMTU: mtu, DestQPN: 0x77, AV: ib.AddressVector{DMAC: [6]byte(pair.A.MAC), DGID: ib.GIDFrom(pair.A.Addr)}}},
	} {
		if err := ibtest.Modify(q, s.st, &s.a); err != nil {
			b.Fatal(err)
		}
	}
	loop, err := NewLoop(h.dev, rx, Options{})
	if err != nil {
		b.Fatal(err)
	}

	// The sender: WRITE ONLYs in sequence, to the whole 1 MiB MR in turn.
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		spec := frame.Spec{DstMAC: [6]byte(pair.B.MAC), SrcMAC: [6]byte(pair.A.MAC), Src: pair.A.Addr, Dst: pair.B.Addr, SrcPort: 0xC000,
			BTH: bth.BTHFields{Opcode: bth.UCRDMAWriteOnly, PKey: 0xFFFF, DestQP: q.QPN()}}
		payload := make([]byte, pay)
		out := make([][]byte, 32)
		for i := range out {
			out[i] = make([]byte, 4200)
		}
		var c port.Copier
		psn := uint32(0)
		for {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			for i := range out {
				spec.BTH.PSN = bth.PSN(psn + uint32(i))
				spec.RETH = frame.RETHFields{VA: h.mr.IOVA() + uint64((psn+uint32(i))%256)*pay, RKey: h.mr.RKey(), DMALen: pay}
				n, err := frame.Build(out[i][:cap(out[i])], &spec, payload)
				if err != nil {
					done <- err
					return
				}
				out[i] = out[i][:n]
			}
			k, err := c.Send(tx, out)
			if err != nil {
				done <- err
				return
			}
			psn += uint32(k)
			if k < len(out) {
				time.Sleep(10 * time.Microsecond)
			}
		}
	}()
	frames := make([][]byte, port.BatchSize)
	rawFrames := func(n int) {
		for got := 0; got < n; {
			k, err := rx.Recv(frames, time.Millisecond)
			if err != nil {
				b.Fatal(err)
			}
			got += k
		}
	}
	rnicFrames := func(n int) {
		start := h.dev.StatsSnapshot().RxFrames
		for h.dev.StatsSnapshot().RxFrames-start < uint64(n) {
			if _, err := loop.Step(clock.Now(), time.Millisecond); err != nil {
				b.Fatal(err)
			}
		}
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	rnicFrames(1000)
	rawFrames(1000)
	const rounds = 8
	per := max(b.N/rounds, 64)
	var rawCPU, rnicCPU time.Duration
	b.ResetTimer()
	for r := 0; r < rounds; r++ {
		t := threadCPU()
		rawFrames(per)
		rawCPU += threadCPU() - t
		t = threadCPU()
		rnicFrames(per)
		rnicCPU += threadCPU() - t
	}
	b.StopTimer()
	close(stop)
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	st := h.dev.StatsSnapshot()
	if bad := drops(st); bad != 0 {
		b.Fatalf("the device dropped %d frames: %+v", bad, st)
	}
	frames64 := float64(per * rounds)
	rawNs, rnicNs := float64(rawCPU.Nanoseconds())/frames64, float64(rnicCPU.Nanoseconds())/frames64
	b.ReportMetric(rawNs, "raw-cpu-ns/frame")
	b.ReportMetric(rnicNs, "softrnic-cpu-ns/frame")
	b.ReportMetric(rawNs/rnicNs, "raw/softrnic")
}

// threadCPU is the calling thread's user and system CPU time.
func threadCPU() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// cpuTime is this process's user and system CPU time.
func cpuTime() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

package engine

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/bpf"
	"github.com/softrnic/softrnic/clock"
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

// cpuTime is this process's user and system CPU time.
func cpuTime() time.Duration {
	var ru unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

package client

import (
	"errors"
	"runtime"
	"testing"

	"github.com/softrnic/softrnic/daemon"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/ibtest"
	"github.com/softrnic/softrnic/internal/testlink"
	"github.com/softrnic/softrnic/rnic"
	"github.com/softrnic/softrnic/verbs"
)

// The benchmarks compare a 64-byte signaled RDMA WRITE, post to completion,
// through the daemon (client rings → engine → device → CQ ring) against the
// same operation on the same kind of loopback device called in-process.
// The difference is the daemon's overhead; the device's own cost (and its
// engine's) is the same in both. Client and daemon share this process
// (separate goroutines, real shared-memory rings and socket); shmring's
// benchmarks measure the cross-process hop itself.

func benchEndpoints(b *testing.B) (*endpoint, *endpoint) {
	td := startDaemon(b, daemon.Options{})
	x, y := newEndpoint(b, td.path, allAccess), newEndpoint(b, td.path, allAccess)
	connect(b, x, y, ib.RemoteWrite)
	return x, y
}

func BenchmarkDaemonWrite64Latency(b *testing.B) {
	x, y := benchEndpoints(b)
	w := []verbs.SendWR{{ID: 1, Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: []ib.SGE{x.mr.SGE(0, 64)}, RemoteAddr: y.mr.IOVA(), RKey: y.mr.RKey()}}
	var wcs [1]ib.WC
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := x.qp.PostSend(w); err != nil {
			b.Fatal(err)
		}
		for x.cq.Poll(wcs[:]) == 0 {
			runtime.Gosched()
		}
		if wcs[0].Status != ib.Success {
			b.Fatal(wcs[0].Status)
		}
	}
}

func BenchmarkDaemonWrite64Rate(b *testing.B) {
	x, y := benchEndpoints(b)
	const batch = 32
	ws := make([]verbs.SendWR, batch)
	for i := range ws {
		ws[i] = verbs.SendWR{ID: uint64(i), Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: []ib.SGE{x.mr.SGE(0, 64)}, RemoteAddr: y.mr.IOVA(), RKey: y.mr.RKey()}
	}
	var wcs [batch]ib.WC
	b.ReportAllocs()
	b.ResetTimer()
	inflight, posted, done := 0, 0, 0
	for done < b.N {
		if posted < b.N && inflight <= 128-batch {
			n := min(batch, b.N-posted)
			k, err := x.qp.PostSend(ws[:n])
			if err != nil && !errors.Is(err, verbs.ErrQueueFull) {
				b.Fatal(err)
			}
			posted += k
			inflight += k
		}
		n := x.cq.Poll(wcs[:])
		done += n
		inflight -= n
		if n == 0 {
			runtime.Gosched()
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "WRs/s")
}

// BenchmarkInProcessWrite64Latency is the baseline: a loopback device
// driven by its engine, called directly, no daemon, no rings.
func BenchmarkInProcessWrite64Latency(b *testing.B) {
	dev := testlink.Loopback(b, 1024)
	vpd, _ := dev.AllocPD()
	pd := vpd.(*rnic.PD)
	mem := make([]byte, 1<<16)
	mr, _ := pd.RegBytes(mem, 0x10000, ib.LocalWrite|ib.RemoteWrite)
	cq, _ := dev.CreateCQ(256)
	caps := ib.QPCaps{MaxSendWR: 128, MaxRecvWR: 128, MaxSendSGE: 1, MaxRecvSGE: 1}
	qa, _ := pd.CreateQP(&verbs.QPInitAttr{Type: ib.RC, SendCQ: cq, RecvCQ: cq, Cap: caps})
	qb, _ := pd.CreateQP(&verbs.QPInitAttr{Type: ib.RC, SendCQ: cq, RecvCQ: cq, Cap: caps})
	for _, p := range [][2]verbs.QP{{qa, qb}, {qb, qa}} {
		if err := ibtest.Modify(p[0], ib.Init, &ib.QPAttr{Access: ib.RemoteWrite}); err != nil {
			b.Fatal(err)
		}
		if err := ibtest.Modify(p[0], ib.RTR, &ib.QPAttr{DestQPN: p[1].QPN(), PathMTU: 1024, AV: ib.AddressVector{DGID: gid}}); err != nil {
			b.Fatal(err)
		}
		if err := ibtest.Modify(p[0], ib.RTS, &ib.QPAttr{Timeout: 14, RetryCnt: 7, RNRRetry: 7}); err != nil {
			b.Fatal(err)
		}
	}
	w := []verbs.SendWR{{ID: 1, Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: []ib.SGE{{Addr: 0x10000, Length: 64, LKey: mr.LKey()}}, RemoteAddr: 0x10000 + 4096, RKey: mr.RKey()}}
	var wcs [1]ib.WC
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := qa.PostSend(w); err != nil {
			b.Fatal(err)
		}
		for cq.Poll(wcs[:]) == 0 {
			dev.Poll()
		}
		if wcs[0].Status != ib.Success {
			b.Fatal(wcs[0].Status)
		}
	}
}

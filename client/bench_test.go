package client

import (
	"runtime"
	"testing"

	"github.com/softrnic/softrnic/daemon"
	"github.com/softrnic/softrnic/daemon/loopdev"
	"github.com/softrnic/softrnic/daemon/proto"
	"github.com/softrnic/softrnic/ib"
)

// The benchmarks compare a 64-byte signaled RDMA WRITE, post to completion,
// through the daemon (client rings → pump → device → CQ ring) against the
// same operation on the same loopback device called in-process. The
// difference is the daemon's overhead; the device's own cost is the same in
// both. Client and daemon share this process (separate goroutines, real
// shared-memory rings and socket); shmring's benchmarks measure the
// cross-process hop itself.

func benchEndpoints(b *testing.B) (*endpoint, *endpoint) {
	td := startDaemon(b, daemon.Options{})
	x, y := newEndpoint(b, td.path, allAccess), newEndpoint(b, td.path, allAccess)
	connect(b, x, y, ib.RemoteWrite)
	return x, y
}

func BenchmarkDaemonWrite64Latency(b *testing.B) {
	x, y := benchEndpoints(b)
	w := &proto.SendWR{ID: 1, Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: []proto.SGE{x.mr.SGE(0, 64)}, RemoteAddr: y.mr.Addr, RKey: y.mr.RKey}
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
	ws := make([]*proto.SendWR, batch)
	for i := range ws {
		ws[i] = &proto.SendWR{ID: uint64(i), Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: []proto.SGE{x.mr.SGE(0, 64)}, RemoteAddr: y.mr.Addr, RKey: y.mr.RKey}
	}
	var wcs [batch]ib.WC
	b.ReportAllocs()
	b.ResetTimer()
	inflight, posted, done := 0, 0, 0
	for done < b.N {
		if posted < b.N && inflight <= 128-batch {
			n := min(batch, b.N-posted)
			k, err := x.qp.PostSend(ws[:n]...)
			if err != nil && err != ErrQueueFull {
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

// BenchmarkInProcessWrite64Latency is the baseline: the loopback device
// driven directly, no daemon, no rings.
func BenchmarkInProcessWrite64Latency(b *testing.B) {
	dev := loopdev.New("loop0")
	pd, _ := dev.AllocPD()
	mem := make([]byte, 1<<16)
	mr, _ := pd.RegMR(mem, 0x10000, ib.LocalWrite|ib.RemoteWrite)
	cq, _ := dev.CreateCQ(256, func() {})
	caps := proto.QPCaps{MaxSendWR: 128, MaxRecvWR: 128, MaxSendSGE: 1, MaxRecvSGE: 1}
	qa, _ := pd.CreateQP(proto.RC, caps, cq, cq, false)
	qb, _ := pd.CreateQP(proto.RC, caps, cq, cq, false)
	for _, p := range [][2]interface {
		Modify(*proto.QPAttr, proto.QPAttrMask) error
		QPN() uint32
	}{{qa, qb}, {qb, qa}} {
		p[0].Modify(&proto.QPAttr{State: proto.Init, Access: ib.RemoteWrite}, proto.AttrState|proto.AttrPKeyIndex|proto.AttrPort|proto.AttrAccessFlags)
		p[0].Modify(&proto.QPAttr{State: proto.RTR, DestQPN: p[1].QPN()}, proto.AttrState|proto.AttrDestQPN)
		p[0].Modify(&proto.QPAttr{State: proto.RTS}, proto.AttrState)
	}
	w := &proto.SendWR{ID: 1, Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: []proto.SGE{{Addr: 0x10000, Length: 64, LKey: mr.LKey()}}, RemoteAddr: 0x10000 + 4096, RKey: mr.RKey()}
	var wcs [1]ib.WC
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := qa.PostSend(w); err != nil {
			b.Fatal(err)
		}
		if cq.Poll(wcs[:]) != 1 || wcs[0].Status != ib.Success {
			b.Fatal("no completion")
		}
	}
}

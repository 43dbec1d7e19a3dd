package daemon_test

import (
	"context"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/daemon/proto"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/ibtest"
	"github.com/softrnic/softrnic/rnic"
)

// The figure: post-to-completion of a 64-byte SEND, and the SEND
// message rate, through the daemon (client process rings → pump → verbs)
// against the same verbs device used in-process. Both run over the same
// two verbs devices and the same frame shuttle (no port, no kernel), so the
// difference is the daemon's overhead. Client and daemon share this
// process here; the rings and socket are the real ones.

// peer is device B's side: an RC QP that keeps receives posted.
type peer struct {
	qp *rnic.QP
	mr *rnic.MR
	cq *rnic.CQ
}

func newPeer(b testing.TB, devB *rnic.Device) *peer {
	pd := devB.AllocPD()
	buf := make([]byte, 1<<16)
	mr, _ := pd.RegMR(buf, ib.LocalWrite)
	cq := devB.CreateCQ(1 << 16) // never overrun: a lost completion would lose a repost
	qp, err := pd.CreateQP(rnic.QPInitAttr{Type: ib.RC, SendCQ: cq, RecvCQ: cq, MaxSendWR: 256, MaxRecvWR: 4096})
	if err != nil {
		b.Fatal(err)
	}
	p := &peer{qp: qp, mr: mr, cq: cq}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { // repost a receive for every one consumed
		defer close(done)
		wcs := make([]ib.WC, 1024)
		for {
			n, err := cq.Wait(ctx, wcs)
			if err != nil {
				return
			}
			for range n {
				p.repost()
			}
		}
	}()
	b.Cleanup(func() { cancel(); <-done })
	return p
}

func (p *peer) repost() {
	p.qp.PostRecv(rnic.RecvWR{SG: []ib.SGE{{Addr: p.mr.IOVA(), Length: 64, LKey: p.mr.LKey()}}})
}

func (p *peer) connect(b testing.TB, qpn uint32) {
	if err := ibtest.Modify(p.qp, ib.Init, &ib.QPAttr{}); err != nil {
		b.Fatal(err)
	}
	if err := ibtest.Modify(p.qp, ib.RTR, &ib.QPAttr{PathMTU: 1024, DestQPN: qpn, AV: ib.AddressVector{DMAC: macA, DGID: ib.GIDFrom(addrA)}}); err != nil {
		b.Fatal(err)
	}
	if err := ibtest.Modify(p.qp, ib.RTS, &ib.QPAttr{Timeout: 14, RetryCnt: 7, RNRRetry: 7}); err != nil {
		b.Fatal(err)
	}
	for i := 0; i < 4096; i++ {
		p.repost()
	}
}

func BenchmarkSend64(b *testing.B) {
	for _, mode := range []string{"inprocess", "daemon"} {
		for _, window := range []int{1, 32} {
			name := mode + "/latency"
			if window > 1 {
				name = mode + "/rate"
			}
			b.Run(name, func(b *testing.B) { benchSend(b, mode != "inprocess", window, 0) })
		}
	}
}

func benchSend(b *testing.B, viaDaemon bool, window int, spin time.Duration) {
	devA, devB, path := twoDevicesSpin(b, spin)
	p := newPeer(b, devB)
	var post func(n int) int
	var poll func(wcs []ib.WC) int
	var qpn uint32
	if viaDaemon {
		c, err := client.Dial(path)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close() })
		pd, _ := c.AllocPD()
		mem, _ := client.AllocMem(4096)
		b.Cleanup(func() { mem.Free() })
		mr, _ := pd.RegMR(mem, 0, 4096, ib.LocalWrite)
		cq, _ := c.CreateCQ(256)
		qp, err := pd.CreateQP(client.QPInitAttr{Type: proto.RC, SendCQ: cq, RecvCQ: cq, Caps: proto.QPCaps{MaxSendWR: 64, MaxRecvWR: 1, MaxSendSGE: 1}})
		if err != nil {
			b.Fatal(err)
		}
		gid := addrB.As16()
		for _, s := range []struct {
			a proto.QPAttr
			m proto.QPAttrMask
		}{
			{proto.QPAttr{State: proto.Init}, proto.AttrState | proto.AttrPKeyIndex | proto.AttrPort | proto.AttrAccessFlags},
			{proto.QPAttr{State: proto.RTR, PathMTU: 1024, DestQPN: p.qp.QPN(), DGID: [16]byte(gid[:])}, proto.AttrState | proto.AttrAV | proto.AttrPathMTU | proto.AttrDestQPN | proto.AttrRQPSN | proto.AttrMaxDestRdAtomc | proto.AttrMinRNRTimer},
			{proto.QPAttr{State: proto.RTS, Timeout: 14, RetryCnt: 7, RNRRetry: 7}, proto.AttrState | proto.AttrTimeout | proto.AttrRetryCnt | proto.AttrRNRRetry | proto.AttrSQPSN | proto.AttrMaxQPRdAtomic},
		} {
			if err := qp.Modify(&s.a, s.m); err != nil {
				b.Fatal(err)
			}
		}
		ws := make([]*proto.SendWR, window)
		for i := range ws {
			ws[i] = &proto.SendWR{Opcode: ib.Send, Flags: ib.Signaled, SG: []proto.SGE{mr.SGE(0, 64)}}
		}
		post = func(n int) int { k, _ := qp.PostSend(ws[:n]...); return k }
		poll = cq.Poll
		qpn = qp.QPN
	} else {
		pd := devA.AllocPD()
		buf := make([]byte, 4096)
		mr, _ := pd.RegMR(buf, ib.LocalWrite)
		cq := devA.CreateCQ(256)
		qp, err := pd.CreateQP(rnic.QPInitAttr{Type: ib.RC, SendCQ: cq, RecvCQ: cq, MaxSendWR: 64, MaxRecvWR: 1})
		if err != nil {
			b.Fatal(err)
		}
		ibtest.Modify(qp, ib.Init, &ib.QPAttr{})
		if err := ibtest.Modify(qp, ib.RTR, &ib.QPAttr{PathMTU: 1024, DestQPN: p.qp.QPN(), AV: ib.AddressVector{DMAC: macB, DGID: ib.GIDFrom(addrB)}}); err != nil {
			b.Fatal(err)
		}
		ibtest.Modify(qp, ib.RTS, &ib.QPAttr{Timeout: 14, RetryCnt: 7, RNRRetry: 7})
		ws := make([]rnic.SendWR, window)
		for i := range ws {
			ws[i] = rnic.SendWR{Opcode: ib.Send, Flags: ib.Signaled, SG: []ib.SGE{{Addr: mr.IOVA(), Length: 64, LKey: mr.LKey()}}}
		}
		post = func(n int) int { k, _ := qp.PostSend(ws[:n]...); return k }
		poll = cq.Poll
		qpn = qp.QPN()
	}
	p.connect(b, qpn)
	wcs := make([]ib.WC, 64)
	run := func(total int) {
		inflight, posted, done := 0, 0, 0
		deadline := time.Now().Add(20 * time.Second)
		for done < total {
			if posted < total && inflight < window {
				k := post(min(window-inflight, total-posted))
				posted += k
				inflight += k
			}
			n := poll(wcs)
			if n == 0 && p.cq.Overflows() != 0 {
				b.Fatal("the peer's CQ overflowed: harness too slow")
			}
			for i := 0; i < n; i++ {
				if wcs[i].Status != ib.Success {
					b.Fatalf("completion %v", wcs[i].Status)
				}
			}
			done += n
			inflight -= n
			if n == 0 {
				runtime.Gosched()
				if time.Now().After(deadline) {
					b.Fatalf("stuck at %d/%d", done, total)
				}
			}
		}
	}
	run(200) // warm up
	b.ResetTimer()
	run(b.N)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}

var _ = netip.Addr{}

package daemon_test

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/rnic"
	"github.com/softrnic/softrnic/verbs"
)

// Post-to-completion of a 64-byte SEND, and the SEND message rate, through
// the daemon (client rings → engine → device) against the same device used
// in-process: the same code on two verbs.Devices. Both run over the same
// two devices and in-memory link (no kernel), so the difference is the
// daemon's overhead. Client and daemon share this process here; the rings
// and socket are the real ones.

// newPeer is device B's side: an RC QP that keeps receives posted.
func newPeer(b testing.TB, devB *rnic.Device) *app {
	// The CQ is never overrun: a lost completion would lose a repost.
	p := newApp(b, devB, ib.RC, 1<<16, ib.LocalWrite, 1<<16, ib.QPCaps{MaxSendWR: 256, MaxRecvWR: 4096, MaxSendSGE: 1, MaxRecvSGE: 1})
	cq := p.cq.(*rnic.CQ)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { // repost a receive for every one consumed
		defer close(done)
		wcs := make([]ib.WC, 1024)
		for {
			n, err := cq.PollWait(ctx, wcs)
			if err != nil {
				return
			}
			for range n {
				if _, err := p.qp.PostRecv([]verbs.RecvWR{{SG: []ib.SGE{p.sge(0, 64)}}}); err != nil {
					b.Fatal(err)
				}
			}
		}
	}()
	b.Cleanup(func() { cancel(); <-done })
	return p
}

func BenchmarkSend64(b *testing.B) {
	for _, mode := range []string{"inprocess", "daemon"} {
		for _, window := range []int{1, 32} {
			name := mode + "/latency"
			if window > 1 {
				name = mode + "/rate"
			}
			b.Run(name, func(b *testing.B) { benchSend(b, mode != "inprocess", window) })
		}
	}
}

func benchSend(b *testing.B, viaDaemon bool, window int) {
	devA, devB, path := twoDevices(b)
	p := newPeer(b, devB)
	var dev verbs.Device = devA
	if viaDaemon {
		c, err := client.Dial(path)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close() })
		dev = c
	}
	a := newApp(b, dev, ib.RC, 4096, ib.LocalWrite, 256, ib.QPCaps{MaxSendWR: 64, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1})
	connectRC(b, a.qp, 0, p.qp.QPN(), gidB, 0, 0)
	connectRC(b, p.qp, 0, a.qp.QPN(), gidA, 0, 0)
	for range 4096 {
		if _, err := p.qp.PostRecv([]verbs.RecvWR{{SG: []ib.SGE{p.sge(0, 64)}}}); err != nil {
			b.Fatal(err)
		}
	}
	ws := make([]verbs.SendWR, window)
	for i := range ws {
		ws[i] = verbs.SendWR{Opcode: ib.Send, Flags: ib.Signaled, SG: []ib.SGE{a.sge(0, 64)}}
	}
	peerCQ := p.cq.(*rnic.CQ)
	wcs := make([]ib.WC, 64)
	run := func(total int) {
		inflight, posted, done := 0, 0, 0
		deadline := time.Now().Add(20 * time.Second)
		for done < total {
			if posted < total && inflight < window {
				k, _ := a.qp.PostSend(ws[:min(window-inflight, total-posted)])
				posted += k
				inflight += k
			}
			n := a.cq.Poll(wcs)
			if n == 0 && peerCQ.Overflows() != 0 {
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

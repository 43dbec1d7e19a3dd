package daemon_test

import (
	"context"
	"testing"
	"time"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/daemon"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/testlink"
	"github.com/softrnic/softrnic/rdmacm"
	"github.com/softrnic/softrnic/verbs"
)

// BenchmarkRCConnect times one rdma_cm connection set-up (REQ, REP, RTU:
// Connect returns once established) and its teardown, through the daemon
// (a client driving its own QP from the daemon's events) beside an
// in-process agent, in interleaved rounds over two pairs of devices on
// in-memory links (no kernel, no process start). The passive side is an
// in-process agent accepting in a loop in both pairs.
func BenchmarkRCConnect(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	caps := ib.QPCaps{MaxSendWR: 2, MaxRecvWR: 2, MaxSendSGE: 1, MaxRecvSGE: 1}
	type side struct {
		cm    rdmacm.CM
		dev   verbs.Device
		pd    verbs.PD
		cq    verbs.CQ
		total time.Duration
	}
	listener := func(devB verbs.Device, peer *rdmacm.Agent) {
		l, err := peer.Listen(7500, 64)
		if err != nil {
			b.Fatal(err)
		}
		pd, _ := devB.AllocPD()
		cq, _ := devB.CreateCQ(256)
		go func() {
			for {
				r, err := l.GetRequest(ctx)
				if err != nil {
					return
				}
				qp, err := pd.CreateQP(&verbs.QPInitAttr{Type: ib.RC, SendCQ: cq, RecvCQ: cq, Cap: caps})
				if err != nil {
					_ = r.Reject(nil)
					continue
				}
				go func() {
					if c, err := r.Accept(ctx, qp, &rdmacm.ConnParam{}); err == nil {
						<-c.Done()
					}
					qp.Destroy()
				}()
			}
		}()
	}
	mk := func(viaDaemon bool) *side {
		devA, devB := testlink.Pair(b, 1024)
		listener(devB, peerCM(b, devB))
		s := &side{}
		if viaDaemon {
			_, path := serve(b, devA, daemon.Options{})
			c, err := client.Dial(path)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { c.Close() })
			s.cm, s.dev = c, c
		} else {
			s.cm, s.dev = peerCM(b, devA), devA
		}
		s.pd, _ = s.dev.AllocPD()
		s.cq, _ = s.dev.CreateCQ(256)
		return s
	}
	sides := []*side{mk(true), mk(false)}
	round := func(s *side) {
		qp, err := s.pd.CreateQP(&verbs.QPInitAttr{Type: ib.RC, SendCQ: s.cq, RecvCQ: s.cq, Cap: caps})
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		c, err := s.cm.Connect(ctx, qp, addrB, 7500, &rdmacm.ConnParam{})
		if err != nil {
			b.Fatal(err)
		}
		s.total += time.Since(start)
		if err := c.Disconnect(ctx); err != nil {
			b.Fatal(err)
		}
		c.Close()
		qp.Destroy()
	}
	for _, s := range sides {
		round(s) // warm: the peers' MACs resolved, the event channel made
		s.total = 0
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		round(sides[i%2])
		round(sides[(i+1)%2])
	}
	b.StopTimer()
	d, p := sides[0].total.Seconds()*1e6/float64(b.N), sides[1].total.Seconds()*1e6/float64(b.N)
	b.ReportMetric(d, "daemon-µs/conn")
	b.ReportMetric(p, "inprocess-µs/conn")
	b.ReportMetric(d/p, "daemon/inprocess")
}

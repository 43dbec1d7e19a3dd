package engine

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/ibtest"
	"github.com/softrnic/softrnic/internal/netnstest"
	"github.com/softrnic/softrnic/port"
	"github.com/softrnic/softrnic/port/afxdp"
	"github.com/softrnic/softrnic/rnic"
	"github.com/softrnic/softrnic/verbs"
)

// mqSide is one end of an mqRig: a device with one MR, on a port over its
// veth end, driven by its own engine goroutine.
type mqSide struct {
	l    *netnstest.Link
	p    port.Port
	h    *host
	loop *Loop
}

// mqRig is two devices on a multi-queue veth pair with qps connected RC
// QP pairs (qa on side A, qb on side B).
type mqRig struct {
	a, b   *mqSide
	qa, qb []*rnic.QP
	stop   func() // ends both engines; the ports and MRs are the test's again
}

// newMQRig makes the rig: a veth pair with nq queues each way, ports over
// queues of them (afxdp.OpenMulti; 0: all), MRs of mem bytes, which init
// may fill before the engines start (so that the race detector sees the
// order the completions give the application).
func newMQRig(tb testing.TB, nq, mtu, pathMTU, queues, qps, mem int, init func(a, b []byte)) *mqRig {
	tb.Helper()
	pair := netnstest.NewTestPair(tb, netnstest.PairOptions{Queues: nq, MTU: mtu})
	r := &mqRig{a: &mqSide{l: &pair.A}, b: &mqSide{l: &pair.B}}
	ctx, cancel := context.WithCancel(context.Background())
	errs := make(chan error, 2)
	running, stopped := 0, false
	r.stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		for i := 0; i < running; i++ {
			if err := <-errs; err != nil {
				tb.Errorf("Run: %v", err)
			}
		}
	}
	sides := []*mqSide{r.a, r.b}
	tb.Cleanup(func() {
		r.stop()
		for _, s := range sides {
			if s.p != nil {
				s.p.Close()
			}
		}
	})
	for _, s := range sides {
		if err := s.l.NS.Do(func() error {
			ifi, err := net.InterfaceByName(s.l.Name)
			if err != nil {
				return err
			}
			m, err := afxdp.OpenMulti(afxdp.MultiConfig{Config: afxdp.Config{IfIndex: ifi.Index}, Queues: queues, SpreadTx: true})
			if err != nil {
				return err
			}
			s.p = m
			return nil
		}); err != nil {
			tb.Fatal(err)
		}
		s.h = newHost(tb, [6]byte(s.l.MAC), s.l.Addr, pathMTU, mem)
		var err error
		if s.loop, err = NewLoop(s.h.dev, s.p, Options{}); err != nil {
			tb.Fatal(err)
		}
	}
	if init != nil {
		init(r.a.h.mr.Bytes(), r.b.h.mr.Bytes())
	}
	for _, s := range sides {
		go func() { errs <- s.loop.Run(ctx) }()
		running++
	}
	conn := func(q *rnic.QP, peer *mqSide, peerQPN uint32) {
		tb.Helper()
		for _, st := range []struct {
			s ib.QPState
			a ib.QPAttr
		}{
			{ib.Init, ib.QPAttr{Access: ib.RemoteWrite | ib.RemoteRead}},
			{ib.RTR, ib.QPAttr{PathMTU: uint32(pathMTU), DestQPN: peerQPN, MaxDestRdAtomic: 16, MinRNRTimer: 12,
				AV: ib.AddressVector{DMAC: [6]byte(peer.l.MAC), DGID: ib.GIDFrom(peer.l.Addr)}}},
			{ib.RTS, ib.QPAttr{Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 16}},
		} {
			if err := ibtest.Modify(q, st.s, &st.a); err != nil {
				tb.Fatalf("QP %#x to %v: %v", q.QPN(), st.s, err)
			}
		}
	}
	for i := 0; i < qps; i++ {
		x, y := r.a.h.createQP(tb, ib.RC), r.b.h.createQP(tb, ib.RC)
		conn(x, r.b, y.QPN())
		conn(y, r.a, x.QPN())
		r.qa, r.qb = append(r.qa, x), append(r.qb, y)
	}
	return r
}

// waitA waits for n successful completions on side A's CQ.
func (r *mqRig) waitA(tb testing.TB, n int) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	wcs := make([]ib.WC, 64)
	for got := 0; got < n; {
		k, err := r.a.h.cq.PollWait(ctx, wcs[:min(len(wcs), n-got)])
		if err != nil {
			tb.Fatalf("%d of %d completions: %v", got, n, err)
		}
		for _, w := range wcs[:k] {
			if w.Status != ib.Success {
				tb.Fatalf("completion %+v", w)
			}
		}
		got += k
	}
}

// TestMultiQueueRDMA: two devices, each on an AF_XDP port over all four
// queues of its veth end (afxdp.OpenMulti with 0), one engine goroutine
// each. Eight RC QPs WRITE and READ 16 KiB each; every byte is checked.
// The QPs' UDP source ports spread their frames over the transmit queues,
// and so over the peer's receive queues: traffic must have arrived on more
// than one queue of each side, and all of it was served.
//
// At MTU 4200 (path MTU 4096) every full frame is an AF_XDP multi-buffer
// frame on every queue.
func TestMultiQueueRDMA(t *testing.T) {
	for _, c := range []struct{ mtu, pathMTU int }{{1500, 1024}, {4200, 4096}} {
		t.Run(fmt.Sprintf("mtu%d", c.mtu), func(t *testing.T) { multiQueueRDMA(t, c.mtu, c.pathMTU) })
	}
}

func multiQueueRDMA(t *testing.T, mtu, pathMTU int) {
	const nq, qps, size = 4, 8, 16 << 10
	var src, dst []byte
	r := newMQRig(t, nq, mtu, pathMTU, 0, qps, 2*qps*size, func(a, b []byte) {
		src, dst = a, b
		for i := range src[:qps*size] {
			src[i] = byte(i*7 + i>>9)
		}
		for i := range dst[qps*size:] {
			dst[qps*size+i] = byte(i*11 + 3)
		}
	})
	for _, s := range []*mqSide{r.a, r.b} {
		if m, ok := s.p.(*afxdp.Multi); !ok || m.NumQueues() != nq {
			t.Fatalf("%s: port %T, want an afxdp.Multi over all %d queues", s.l.Name, s.p, nq)
		}
	}
	// QP i writes A[i*size:] to B[i*size:] and reads B[(qps+i)*size:] into
	// A[(qps+i)*size:].
	ma, mb := r.a.h.mr, r.b.h.mr
	for i, q := range r.qa {
		off := uint64(i * size)
		if _, err := q.PostSend([]verbs.SendWR{{ID: uint64(i), Opcode: ib.RDMAWrite, Flags: ib.Signaled,
			SG:         []ib.SGE{{Addr: ma.IOVA() + off, Length: size, LKey: ma.LKey()}},
			RemoteAddr: mb.IOVA() + off, RKey: mb.RKey()}}); err != nil {
			t.Fatal(err)
		}
		roff := uint64((qps + i) * size)
		if _, err := q.PostSend([]verbs.SendWR{{ID: uint64(100 + i), Opcode: ib.RDMARead, Flags: ib.Signaled,
			SG:         []ib.SGE{{Addr: ma.IOVA() + roff, Length: size, LKey: ma.LKey()}},
			RemoteAddr: mb.IOVA() + roff, RKey: mb.RKey()}}); err != nil {
			t.Fatal(err)
		}
	}
	r.waitA(t, 2*qps)
	r.stop() // the ports and the memory belong to the loops until they stop
	if !bytes.Equal(dst[:qps*size], src[:qps*size]) {
		t.Error("RDMA WRITE: the bytes at B differ from A's")
	}
	if !bytes.Equal(src[qps*size:2*qps*size], dst[qps*size:2*qps*size]) {
		t.Error("RDMA READ: the bytes read into A differ from B's")
	}
	for _, s := range []*mqSide{r.a, r.b} {
		m := s.p.(*afxdp.Multi)
		qs, err := m.QueueStats()
		if err != nil {
			t.Fatal(err)
		}
		used := 0
		for _, q := range qs {
			t.Logf("%s queue %d: received %d frames", s.l.Name, q.Queue, q.Received)
			if q.Received > 0 {
				used++
			}
		}
		if used < 2 {
			t.Errorf("%s: traffic arrived on %d queue(s); %d QPs should spread over several", s.l.Name, used, qps)
		}
		if st := s.loop.DeviceStats(); drops(st) != 0 {
			t.Errorf("%s: drops %+v", s.l.Name, st)
		}
		st, _ := m.Stats()
		if st.Program.Unbound != 0 || st.Oversize != 0 {
			t.Errorf("%s: %d RoCEv2 frames on a queue without socket, %d oversize", s.l.Name, st.Program.Unbound, st.Oversize)
		}
		if st.Multi != (mtu > 3800) {
			t.Errorf("%s: multi-buffer %v at MTU %d", s.l.Name, st.Multi, mtu)
		}
	}
}

// BenchmarkMultiQueueWrite: 64 KiB RDMA WRITEs on 4 QPs (8 outstanding
// each) between two engines over a four-queue veth pair, the port serving
// queue 0 only (every QP's frames on one queue, as before afxdp.Multi)
// against all four queues (the QPs spread by source port). Reports Gbit/s
// of payload; on a loaded 2-core host the figures are floors, to be
// compared run against run.
func BenchmarkMultiQueueWrite(b *testing.B) {
	for _, queues := range []int{1, 0} {
		name := "queue0"
		if queues == 0 {
			name = "allqueues"
		}
		b.Run(name, func(b *testing.B) {
			const qps, depth, size = 4, 8, 64 << 10
			r := newMQRig(b, 4, 1500, 1024, queues, qps, qps*size, nil)
			ma, mb := r.a.h.mr, r.b.h.mr
			post := func(q *rnic.QP, i int) {
				off := uint64(i * size)
				if _, err := q.PostSend([]verbs.SendWR{{ID: uint64(i), Opcode: ib.RDMAWrite, Flags: ib.Signaled,
					SG:         []ib.SGE{{Addr: ma.IOVA() + off, Length: size, LKey: ma.LKey()}},
					RemoteAddr: mb.IOVA() + off, RKey: mb.RKey()}}); err != nil {
					b.Fatal(err)
				}
			}
			b.SetBytes(size)
			b.ResetTimer()
			start := time.Now()
			posted, done := 0, 0
			for ; posted < min(b.N, qps*depth); posted++ {
				post(r.qa[posted%qps], posted%qps)
			}
			wcs := make([]ib.WC, 64)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			for done < b.N {
				k, err := r.a.h.cq.PollWait(ctx, wcs)
				if err != nil {
					b.Fatalf("%d of %d WRITEs: %v", done, b.N, err)
				}
				for _, w := range wcs[:k] {
					if w.Status != ib.Success {
						b.Fatalf("completion %+v", w)
					}
					done++
					if posted < b.N {
						post(r.qa[w.ID], int(w.ID))
						posted++
					}
				}
			}
			el := time.Since(start)
			b.ReportMetric(float64(b.N)*size*8/el.Seconds()/1e9, "Gbit/s")
		})
	}
}

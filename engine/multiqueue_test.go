package engine

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/netnstest"
	"github.com/softrnic/softrnic/port/afxdp"
	"github.com/softrnic/softrnic/verbs"
)

// TestMultiQueueRDMA: two devices, each on an AF_XDP port over all four
// queues of its veth end (OpenPortQueues with 0), one engine goroutine
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
	pair := netnstest.NewTestPair(t, netnstest.PairOptions{Queues: nq, MTU: mtu})
	type side struct {
		l    *netnstest.Link
		in   Interface
		m    *afxdp.Multi
		h    *host
		loop *Loop
	}
	sides := []*side{{l: &pair.A}, {l: &pair.B}}
	ctx, cancel := context.WithCancel(context.Background())
	errs := make(chan error, 2)
	running := 0
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		for i := 0; i < running; i++ {
			if err := <-errs; err != nil {
				t.Errorf("Run: %v", err)
			}
		}
	}
	t.Cleanup(func() {
		stop()
		for _, s := range sides {
			if s.m != nil {
				s.m.Close()
			}
		}
	})
	for _, s := range sides {
		if err := s.l.NS.Do(func() error {
			var err error
			if s.in, err = LookupInterface(s.l.Name); err != nil {
				return err
			}
			p, err := OpenPortQueues(s.in, AFXDP, 0)
			if err != nil {
				return err
			}
			s.m = p.(*afxdp.Multi)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if s.m.NumQueues() != nq {
			t.Fatalf("%s: %d queues served, want all %d", s.l.Name, s.m.NumQueues(), nq)
		}
		s.h = newHost(t, [6]byte(s.l.MAC), s.l.Addr, pathMTU, qps*2*size)
		var err error
		if s.loop, err = NewLoop(s.h.dev, s.m, Options{}); err != nil {
			t.Fatal(err)
		}
	}
	a, b := sides[0], sides[1]
	// The memory is written before the engines start and read after they
	// stop: the completions order it for RDMA, not for the race detector
	// (B's engine writes B's memory, A's completions come from A's).
	src, dst := a.h.mr.Bytes(), b.h.mr.Bytes()
	for i := range src[:qps*size] {
		src[i] = byte(i*7 + i>>9)
	}
	for i := range dst[qps*size:] {
		dst[qps*size+i] = byte(i*11 + 3)
	}
	for _, s := range sides {
		go func() { errs <- s.loop.Run(ctx) }()
		running++
	}
	conn := func(q *verbs.QP, peer *side, peerQPN uint32) {
		t.Helper()
		for _, st := range []struct {
			s verbs.State
			a verbs.Attr
		}{
			{verbs.Init, verbs.Attr{Access: verbs.RemoteWrite | verbs.RemoteRead}},
			{verbs.RTR, verbs.Attr{PathMTU: pathMTU, DestQPN: peerQPN, MaxDestRdAtomic: 16, MinRNRTimer: 12,
				AV: verbs.AddressVector{DestMAC: [6]byte(peer.l.MAC), DestIP: peer.l.Addr}}},
			{verbs.RTS, verbs.Attr{Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 16}},
		} {
			if err := q.Modify(st.s, &st.a); err != nil {
				t.Fatalf("QP %#x to %v: %v", q.QPN(), st.s, err)
			}
		}
	}
	var qa []*verbs.QP
	for i := 0; i < qps; i++ {
		x, y := a.h.createQP(t, verbs.RC), b.h.createQP(t, verbs.RC)
		conn(x, b, y.QPN())
		conn(y, a, x.QPN())
		qa = append(qa, x)
	}
	// QP i writes A[i*size:] to B[i*size:] and reads B[(qps+i)*size:] into
	// A[(qps+i)*size:].
	for i, q := range qa {
		off := uint64(i * size)
		if _, err := q.PostSend(verbs.SendWR{ID: uint64(i), Opcode: verbs.RDMAWrite, Flags: verbs.Signaled,
			SG:         []verbs.SGE{{Addr: a.h.mr.IOVA() + off, Length: size, LKey: a.h.mr.LKey()}},
			RemoteAddr: b.h.mr.IOVA() + off, RKey: b.h.mr.RKey()}); err != nil {
			t.Fatal(err)
		}
		roff := uint64((qps + i) * size)
		if _, err := q.PostSend(verbs.SendWR{ID: uint64(100 + i), Opcode: verbs.RDMARead, Flags: verbs.Signaled,
			SG:         []verbs.SGE{{Addr: a.h.mr.IOVA() + roff, Length: size, LKey: a.h.mr.LKey()}},
			RemoteAddr: b.h.mr.IOVA() + roff, RKey: b.h.mr.RKey()}); err != nil {
			t.Fatal(err)
		}
	}
	wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer wcancel()
	var wcs [2 * qps]verbs.WC
	for got := 0; got < 2*qps; {
		k, err := a.h.cq.Wait(wctx, wcs[got:])
		if err != nil {
			t.Fatalf("%d of %d completions: %v", got, 2*qps, err)
		}
		for _, w := range wcs[got : got+k] {
			if w.Status != verbs.Success {
				t.Fatalf("completion %+v", w)
			}
		}
		got += k
	}
	stop() // the ports and the memory belong to the loops until they stop
	if !bytes.Equal(dst[:qps*size], src[:qps*size]) {
		t.Error("RDMA WRITE: the bytes at B differ from A's")
	}
	if !bytes.Equal(src[qps*size:2*qps*size], dst[qps*size:2*qps*size]) {
		t.Error("RDMA READ: the bytes read into A differ from B's")
	}
	for _, s := range sides {
		qs, err := s.m.QueueStats()
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
		st, _ := s.m.Stats()
		if st.Program.Unbound != 0 || st.Oversize != 0 {
			t.Errorf("%s: %d RoCEv2 frames on a queue without socket, %d oversize", s.l.Name, st.Program.Unbound, st.Oversize)
		}
		if st.Multi != (mtu > 3800) {
			t.Errorf("%s: multi-buffer %v at MTU %d", s.l.Name, st.Multi, mtu)
		}
	}
}

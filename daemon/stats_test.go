package daemon_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/daemon"
	"github.com/softrnic/softrnic/daemon/proto"
	"github.com/softrnic/softrnic/engine"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/testlink"
	"github.com/softrnic/softrnic/port"
	"github.com/softrnic/softrnic/port/memlink"
	"github.com/softrnic/softrnic/verbs"
)

// OpStats end to end, unprivileged: device A's engine runs on a
// CountingPort over memlink and is served by a daemon; a peer on device B
// SENDs to a client QP that has posted no receive (RNR NAK: out_of_buffer)
// and then WRITEs into the client's memory. The STATS reply must agree with
// the device's own counters, count every byte on the link, and show the
// QP's RNR NAK under out_of_buffer.
func TestStatsThroughDaemon(t *testing.T) {
	devA, devB, pa, pb := testlink.Devices(t, 1024)
	cp := daemon.NewCountingPort(pa)
	loopA, err := engine.NewLoop(devA, cp, engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	doneA := make(chan error, 1)
	go func() { doneA <- loopA.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-doneA; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("device A's loop: %v", err)
		}
	})
	testlink.Run(t, devB, pb, engine.Options{})
	src := &daemon.CounterSource{Name: "memA", Loop: loopA, Port: cp}
	srv, path, _ := serveIn(t, t.TempDir(), devA, daemon.Options{Counters: src.Snapshot})
	src.Server = srv

	c, err := client.Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	caps := ib.QPCaps{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}
	a := newApp(t, c, ib.RC, 1<<16, ib.LocalWrite|ib.RemoteWrite, 64, caps)
	b := newApp(t, devB, ib.RC, 1<<16, ib.LocalWrite, 64, caps)
	qp := a.qp
	connectRC(t, a.qp, ib.RemoteWrite, b.qp.QPN(), gidB, 0, 0)
	connectRC(t, b.qp, 0, a.qp.QPN(), gidA, 0, 0)
	waitB := func(what string) {
		t.Helper()
		if wc := waitWC(t, b.cq); wc.Status != ib.Success {
			t.Fatalf("%s: %v", what, wc.Status)
		}
	}

	// A SEND before any receive is posted: RNR NAK (or more than one)
	// until the receive below arrives.
	b.send(t, verbs.SendWR{ID: 1, Opcode: ib.Send, Flags: ib.Signaled, SG: []ib.SGE{b.sge(0, 64)}})
	rnrSeen := false
	// Queries filter on the client QP: the daemon's rdma_cm agent has a
	// GSI QP on the device too (started with the daemon), listed for root.
	for deadline := time.Now().Add(10 * time.Second); !rnrSeen; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no RNR NAK counted on the client QP")
		}
		st := queryStats(t, path, qp.QPN())
		rnrSeen = st.Listed == 1 && st.QPs[0].Values[proto.QCtrOutOfBuffer] > 0
	}
	a.recv(t, 9, 0, 64)
	waitB("SEND after RNR")
	b.send(t, verbs.SendWR{ID: 2, Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: []ib.SGE{b.sge(0, 4096)}, RemoteAddr: a.mr.IOVA() + 4096, RKey: a.mr.RKey()})
	waitB("WRITE")

	// Quiet link: compare with the device's own counters and the link's.
	var st *proto.StatsResp
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		st = queryStats(t, path, qp.QPN())
		ds := loopA.DeviceStats()
		if st.Device[proto.CtrRxPackets] == ds.RxFrames && st.Device[proto.CtrTxPackets] == ds.TxFrames && ds.TxFrames == pa.Stats().Sent {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stats rx %d tx %d, device rx %d tx %d, link sent %d", st.Device[proto.CtrRxPackets], st.Device[proto.CtrTxPackets], ds.RxFrames, ds.TxFrames, pa.Stats().Sent)
		}
	}
	if got := st.Device[proto.CtrRxPackets]; got < 1+4+1 { // SEND (and its retries) and 4 WRITE packets
		t.Errorf("rx_packets %d", got)
	}
	if st.Device[proto.CtrOutOfBuffer] == 0 || st.Device[proto.CtrOutOfBuffer] != st.QPs[0].Values[proto.QCtrOutOfBuffer] {
		t.Errorf("device out_of_buffer %d, QP's %d", st.Device[proto.CtrOutOfBuffer], st.QPs[0].Values[proto.QCtrOutOfBuffer])
	}
	rx, tx := cp.Bytes()
	if st.Device[proto.CtrRxBytes] != rx || st.Device[proto.CtrTxBytes] != tx || rx < 4096+64 {
		t.Errorf("bytes: stats rx %d tx %d, port rx %d tx %d", st.Device[proto.CtrRxBytes], st.Device[proto.CtrTxBytes], rx, tx)
	}
	if st.Valid&proto.ValidXDP != 0 {
		t.Errorf("XDP counters marked valid on a memlink port: %#x", st.Valid)
	}
	if n := string(st.Name[:4]); n != "memA" || st.QPs[0].QPN != qp.QPN() || st.QPs[0].Type != ib.RC || st.QPs[0].State != ib.RTS {
		t.Errorf("name %q, QP %+v", st.Name, st.QPs[0])
	}
	// Filter by a QPN that does not exist: no QP, device counters still.
	if st := queryStats(t, path, qp.QPN()+1000); st.Listed != 0 || st.Device[proto.CtrRxPackets] == 0 {
		t.Errorf("filtered by a missing QPN: %d QPs", st.Listed)
	}
	if st.QPs[0].Values[proto.QCtrRxWriteRequests] != 1 || st.Device[proto.CtrRxWriteRequests] != 1 {
		t.Errorf("rx_write_requests: QP %d, device %d; want 1", st.QPs[0].Values[proto.QCtrRxWriteRequests], st.Device[proto.CtrRxWriteRequests])
	}

	// Errors under mlx5's names: a WRITE with a wrong rkey is refused by
	// the client's QP (resp_remote_access_errors), which goes to error; a
	// receive the client posts then is flushed (resp_cqe_flush_error).
	b.send(t, verbs.SendWR{ID: 3, Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: []ib.SGE{b.sge(0, 64)}, RemoteAddr: a.mr.IOVA(), RKey: a.mr.RKey() ^ 0x5a5a5a})
	if wc := waitWC(t, b.cq); wc.Status != ib.RemAccessErr {
		t.Fatalf("WRITE with a wrong rkey: %v", wc.Status)
	}
	a.recv(t, 10, 0, 64)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		st = queryStats(t, path, qp.QPN())
		q := &st.QPs[0].Values
		if q[proto.QCtrRespRemoteAccessErrors] == 1 && q[proto.QCtrRespCQEFlushError] == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("QP counters after a bad rkey and a flushed receive: %v", *q)
		}
	}
	d := &st.Device
	if d[proto.CtrRespRemoteAccessErrors] != 1 || d[proto.CtrRespCQEFlushError] != 1 || d[proto.CtrRxWriteRequests] != 2 ||
		d[proto.CtrReqCQEError] != 0 || d[proto.CtrRespCQEError] != 0 || st.QPs[0].State != ib.Err {
		t.Errorf("device after the errors: resp_remote_access_errors %d, resp_cqe_flush_error %d, rx_write_requests %d, req_cqe_error %d, resp_cqe_error %d; QP %v",
			d[proto.CtrRespRemoteAccessErrors], d[proto.CtrRespCQEFlushError], d[proto.CtrRxWriteRequests], d[proto.CtrReqCQEError], d[proto.CtrRespCQEError], st.QPs[0].State)
	}

	// The QP destroyed, its counts stay in the device's totals.
	if err := qp.Destroy(); err != nil {
		t.Fatal(err)
	}
	after := queryStats(t, path, qp.QPN())
	if after.Listed != 0 || after.Device[proto.CtrRespRemoteAccessErrors] != 1 || after.Device[proto.CtrRespCQEFlushError] != 1 ||
		after.Device[proto.CtrRxWriteRequests] != 2 || after.Device[proto.CtrOutOfBuffer] < st.Device[proto.CtrOutOfBuffer] {
		t.Errorf("device after the QP went: %d QPs listed, resp_remote_access_errors %d, resp_cqe_flush_error %d, rx_write_requests %d",
			after.Listed, after.Device[proto.CtrRespRemoteAccessErrors], after.Device[proto.CtrRespCQEFlushError], after.Device[proto.CtrRxWriteRequests])
	}
	// The daemon's own counters: in the reply, and in the snapshot
	// /metrics serves.
	srv.BadWQEs.Add(3) // as the data path counts them
	if st := queryStats(t, path, 0); st.Daemon[proto.DCtrBadWQEs] != 3 {
		t.Errorf("bad_wqes in STATS: %d", st.Daemon[proto.DCtrBadWQEs])
	}
	if snap := src.Snapshot(); !snap.HaveDaemon || snap.Daemon[proto.DCtrBadWQEs] != 3 || snap.Usage.Host[daemon.Connections] < 1 {
		t.Errorf("snapshot: daemon %v %v, usage %v", snap.HaveDaemon, snap.Daemon, snap.Usage.Host)
	}
}

// queryStats sends one STATS on a fresh control connection.
func queryStats(t *testing.T, path string, qpn uint32) *proto.StatsResp {
	t.Helper()
	uc, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	conn := proto.NewConn(uc)
	defer conn.Close()
	call := func(op proto.Op, req any) []byte {
		if err := conn.Send(proto.Header{Op: op, Seq: 1}, req); err != nil {
			t.Fatal(err)
		}
		h, body, fds, err := conn.Recv()
		proto.CloseFDs(fds)
		if err != nil || h.Errno != 0 || h.Op != op {
			t.Fatalf("%v: %v errno %d %s", op, err, h.Errno, body)
		}
		return body
	}
	call(proto.OpOpen, &proto.OpenReq{Version: proto.Version})
	req := proto.StatsReq{QPN: qpn, FilterQP: 1}
	var r proto.StatsResp
	if err := proto.DecodeBody(call(proto.OpStats, &req), &r); err != nil {
		t.Fatal(err)
	}
	return &r
}

// The counting wrapper allocates nothing per batch and counts every byte
// each way.
func TestCountingPortAllocs(t *testing.T) {
	pa, pb := memlink.NewPair(memlink.Config{})
	defer pa.Close()
	defer pb.Close()
	a, b := daemon.NewCountingPort(pa), daemon.NewCountingPort(pb)
	out := make([][]byte, 8)
	for i := range out {
		out[i] = make([]byte, 100+i)
	}
	in := make([][]byte, 8)
	var sent, got int
	var c port.Copier
	allocs := testing.AllocsPerRun(100, func() {
		n, err := c.Send(a, out)
		if err != nil {
			t.Fatal(err)
		}
		sent += n
		for r := 0; r < n; {
			m, err := b.Recv(in, time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			r += m
			got += m
		}
	})
	if allocs != 0 {
		t.Errorf("%.1f allocations per batch", allocs)
	}
	const batchBytes = 8*100 + 28
	_, tx := a.Bytes()
	rx, _ := b.Bytes()
	if sent != 101*8 || got != sent || tx != 101*batchBytes || rx != tx {
		t.Errorf("sent %d frames, got %d; bytes tx %d rx %d, want %d", sent, got, tx, rx, 101*batchBytes)
	}
	if _, ok := a.XDPStats(); ok {
		t.Error("a memlink port has AF_XDP statistics")
	}
}

// BenchmarkCountingPort is a 64-frame batch sent and received over memlink,
// bare and through CountingPort on both ends: the byte counting's cost.
func BenchmarkCountingPort(b *testing.B) {
	for _, wrap := range []bool{false, true} {
		name := "bare"
		if wrap {
			name = "counting"
		}
		b.Run(name, func(b *testing.B) {
			pa, pb := memlink.NewPair(memlink.Config{})
			defer pa.Close()
			defer pb.Close()
			var a, r port.Port = pa, pb
			if wrap {
				a, r = daemon.NewCountingPort(pa), daemon.NewCountingPort(pb)
			}
			out := make([][]byte, port.BatchSize)
			for i := range out {
				out[i] = make([]byte, 1082)
			}
			in := make([][]byte, port.BatchSize)
			b.SetBytes(int64(len(out) * 1082))
			b.ReportAllocs()
			var c port.Copier
			for b.Loop() {
				n, err := c.Send(a, out)
				if err != nil {
					b.Fatal(err)
				}
				for got := 0; got < n; {
					m, err := r.Recv(in, time.Millisecond)
					if err != nil {
						b.Fatal(err)
					}
					got += m
				}
			}
		})
	}
}

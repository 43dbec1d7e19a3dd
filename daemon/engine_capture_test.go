package daemon_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gopacket/gopacket/pcapgo"
	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/capture"
	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/daemon"
	"github.com/softrnic/softrnic/daemon/proto"
	"github.com/softrnic/softrnic/engine"
	"github.com/softrnic/softrnic/frame"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/ibtest"
	"github.com/softrnic/softrnic/port/memlink"
	"github.com/softrnic/softrnic/rnic"
)

// The daemon's engine loop (engine.Run) on a real-time in-memory link: a peer RNIC
// writes into a client's memory and the client SENDs back, while a capture
// on the daemon's tap records both directions; the capture, read back with
// gopacket, holds RoCEv2 frames with valid ICRCs.
func TestEngineRunWithCapture(t *testing.T) {
	devA, _ := rnic.NewDevice(rnic.Config{MAC: macA, Addrs: []netip.Addr{addrA}, PortMTU: 1024})
	devB, _ := rnic.NewDevice(rnic.Config{MAC: macB, Addrs: []netip.Addr{addrB}, PortMTU: 1024})
	pa, pb := memlink.NewPair(memlink.Config{})
	var tap capture.Tap
	ctx, cancel := context.WithCancel(context.Background())
	errs := make(chan error, 2)
	go func() { errs <- engine.Run(ctx, devA, pa, engine.Options{Tap: &tap}) }()
	go func() { errs <- engine.Run(ctx, devB, pb, engine.Options{}) }()
	t.Cleanup(func() {
		cancel()
		for i := 0; i < 2; i++ {
			if err := <-errs; err != nil {
				t.Errorf("engine.Run: %v", err)
			}
		}
	})
	resolve := func(a netip.Addr) ([6]byte, error) { return macB, nil }
	srv, err := daemon.NewServer(daemon.NewVerbsDevice(devA, "mem0", resolve), daemon.Options{Group: -1, Tap: &tap, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "ctl.sock")
	if err := srv.Listen(path); err != nil {
		t.Fatal(err)
	}
	go srv.Serve()
	t.Cleanup(func() { srv.Close(time.Second) })

	c, err := client.Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pd, _ := c.AllocPD()
	mem, _ := client.AllocMem(1 << 16)
	defer mem.Free()
	mr, _ := pd.RegMR(mem, 0, 1<<16, ib.LocalWrite|ib.RemoteWrite)
	cq, _ := c.CreateCQ(64)
	qp, err := pd.CreateQP(client.QPInitAttr{Type: proto.RC, SendCQ: cq, RecvCQ: cq, Caps: proto.QPCaps{MaxSendWR: 16, MaxRecvWR: 16}})
	if err != nil {
		t.Fatal(err)
	}
	pdB := devB.AllocPD()
	bufB := make([]byte, 1<<16)
	mrB, _ := pdB.RegMR(bufB, ib.LocalWrite)
	cqB := devB.CreateCQ(64)
	qpB, _ := pdB.CreateQP(rnic.QPInitAttr{Type: ib.RC, SendCQ: cqB, RecvCQ: cqB})
	gidB := addrB.As16()
	for _, s := range []struct {
		a proto.QPAttr
		m proto.QPAttrMask
	}{
		{proto.QPAttr{State: proto.Init, Access: ib.RemoteWrite}, proto.AttrState | proto.AttrPKeyIndex | proto.AttrPort | proto.AttrAccessFlags},
		{proto.QPAttr{State: proto.RTR, PathMTU: 1024, DestQPN: qpB.QPN(), DGID: [16]byte(gidB[:])}, proto.AttrState | proto.AttrAV | proto.AttrPathMTU | proto.AttrDestQPN | proto.AttrRQPSN | proto.AttrMaxDestRdAtomc | proto.AttrMinRNRTimer},
		{proto.QPAttr{State: proto.RTS, Timeout: 14, RetryCnt: 7, RNRRetry: 7}, proto.AttrState | proto.AttrTimeout | proto.AttrRetryCnt | proto.AttrRNRRetry | proto.AttrSQPSN | proto.AttrMaxQPRdAtomic},
	} {
		if err := qp.Modify(&s.a, s.m); err != nil {
			t.Fatal(err)
		}
	}
	ibtest.Modify(qpB, ib.Init, &ib.QPAttr{})
	ibtest.Modify(qpB, ib.RTR, &ib.QPAttr{PathMTU: 1024, DestQPN: qp.QPN, AV: ib.AddressVector{DMAC: macA, DGID: ib.GIDFrom(addrA)}})
	ibtest.Modify(qpB, ib.RTS, &ib.QPAttr{Timeout: 14, RetryCnt: 7, RNRRetry: 7})
	qpB.PostRecv(rnic.RecvWR{ID: 1, SG: []ib.SGE{{Addr: mrB.IOVA() + 40000, Length: 64, LKey: mrB.LKey()}}})

	var file bytes.Buffer
	sess, err := tap.Start(&file, capture.Options{Format: capture.PCAPNG})
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	var wcs [1]ib.WC

	for i := range bufB[:3000] {
		bufB[i] = byte(i * 7)
	}
	qpB.PostSend(rnic.SendWR{ID: 2, Opcode: ib.RDMAWrite, Flags: ib.Signaled,
		SG: []ib.SGE{{Addr: mrB.IOVA(), Length: 3000, LKey: mrB.LKey()}}, RemoteAddr: mr.Addr + 1000, RKey: mr.RKey})
	if _, err := cqB.Wait(wctx, wcs[:]); err != nil || wcs[0].Status != ib.Success {
		t.Fatalf("peer WRITE: %v %v", wcs[0].Status, err)
	}
	if !bytes.Equal(mem.Bytes()[1000:4000], bufB[:3000]) {
		t.Fatal("client memory does not hold the written data")
	}
	copy(mem.Bytes()[8000:], "reply from the client")
	qp.PostSend(&proto.SendWR{ID: 3, Opcode: ib.Send, Flags: ib.Signaled, SG: []proto.SGE{mr.SGE(8000, 21)}})
	if _, err := cqB.Wait(wctx, wcs[:]); err != nil || wcs[0].ID != 1 || string(bufB[40000:40021]) != "reply from the client" {
		t.Fatalf("peer RECV: %+v %v", wcs[0], err)
	}
	var cwc [1]ib.WC
	for cq.Poll(cwc[:]) == 0 {
		if wctx.Err() != nil {
			t.Fatal("client: no completion")
		}
		cq.Wait(10 * time.Millisecond)
	}
	st, err := sess.Stop()
	if err != nil {
		t.Fatal(err)
	}

	r, err := pcapgo.NewNgReader(bytes.NewReader(file.Bytes()), pcapgo.DefaultNgReaderOptions)
	if err != nil {
		t.Fatal(err)
	}
	dirs := map[pcapgo.NgEpbFlag]int{}
	frames := 0
	for {
		data, _, opts, err := r.ReadPacketDataWithOptions()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		var f frame.Frame
		if err := frame.Parse(data, &f); err != nil || !f.VerifyICRC() {
			t.Fatalf("captured frame %d: %v, ICRC valid %v", frames, err, err == nil && f.VerifyICRC())
		}
		dirs[opts.Flags.Direction]++
		frames++
	}
	// WRITE: 3 packets in, 1 ACK out; SEND: 1 packet out, 1 ACK in.
	if frames < 6 || uint64(frames) != st.Written || dirs[pcapgo.NgEpbFlagDirectionInbound] < 4 || dirs[pcapgo.NgEpbFlagDirectionOutbound] < 2 {
		t.Fatalf("captured %d frames (%+v), directions %v", frames, st, dirs)
	}

	// The same through the control socket, as softrnic capture -w FILE -c 3
	// does: a dedicated client, the file opened by the client.
	capc, err := client.Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	defer capc.Close()
	fname := filepath.Join(t.TempDir(), "cap.pcap")
	fh, err := os.Create(fname)
	if err != nil {
		t.Fatal(err)
	}
	run, err := capc.Capture(fh, client.CaptureOptions{Count: 3})
	fh.Close() // the daemon holds its own descriptor
	if err != nil {
		t.Fatal(err)
	}
	other, _ := client.Dial(path)
	defer other.Close()
	if _, err := other.Capture(os.Stdout, client.CaptureOptions{}); !errors.Is(err, unix.EBUSY) {
		t.Fatalf("second capture: %v", err)
	}
	qpB.PostSend(rnic.SendWR{ID: 4, Opcode: ib.RDMAWrite, Flags: ib.Signaled,
		SG: []ib.SGE{{Addr: mrB.IOVA(), Length: 3000, LKey: mrB.LKey()}}, RemoteAddr: mr.Addr + 1000, RKey: mr.RKey})
	if _, err := cqB.Wait(wctx, wcs[:]); err != nil || wcs[0].Status != ib.Success {
		t.Fatalf("peer WRITE: %v %v", wcs[0].Status, err)
	}
	cst, err := run.Wait()
	if err != nil || cst.Written != 3 {
		t.Fatalf("capture through the daemon: %+v %v", cst, err)
	}
	data, err := os.ReadFile(fname)
	if err != nil {
		t.Fatal(err)
	}
	pr, err := pcapgo.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for {
		d, _, err := pr.ReadPacketData()
		if err == io.EOF {
			break
		}
		var f frame.Frame
		if err != nil || frame.Parse(d, &f) != nil || !f.VerifyICRC() {
			t.Fatalf("file frame %d: %v", n, err)
		}
		n++
	}
	if n != 3 {
		t.Fatalf("file holds %d frames, want 3", n)
	}
}

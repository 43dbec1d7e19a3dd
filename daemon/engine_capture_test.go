package daemon_test

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/gopacket/gopacket/pcapgo"
	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/daemon"
	"github.com/softrnic/softrnic/engine"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/capture"
	"github.com/softrnic/softrnic/internal/checker"
	"github.com/softrnic/softrnic/internal/testlink"
	"github.com/softrnic/softrnic/verbs"
)

// The daemon's engine loop (engine.Run) on a real-time in-memory link: a peer RNIC
// writes into a client's memory and the client SENDs back, while a capture
// on the daemon's tap records both directions; the capture, read back with
// gopacket, holds RoCEv2 frames with valid ICRCs.
func TestEngineRunWithCapture(t *testing.T) {
	devA, devB, pa, pb := testlink.Devices(t, 1024)
	var tap capture.Tap
	testlink.Run(t, devA, pa, engine.Options{Tap: &tap})
	testlink.Run(t, devB, pb, engine.Options{})
	_, path := serve(t, devA, daemon.Options{Tap: &tap})

	c, err := client.Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	caps := ib.QPCaps{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}
	a := newApp(t, c, ib.RC, 1<<16, ib.LocalWrite|ib.RemoteWrite, 64, caps)
	b := newApp(t, devB, ib.RC, 1<<16, ib.LocalWrite, 64, caps)
	connectRC(t, a.qp, ib.RemoteWrite, b.qp.QPN(), gidB, 0, 0)
	connectRC(t, b.qp, 0, a.qp.QPN(), gidA, 0, 0)
	b.recv(t, 1, 40000, 64)
	bufB, mem := b.buf(), a.buf()

	var file bytes.Buffer
	sess, err := tap.Start(&file, capture.Options{Format: capture.PCAPNG})
	if err != nil {
		t.Fatal(err)
	}
	for i := range bufB[:3000] {
		bufB[i] = byte(i * 7)
	}
	b.send(t, verbs.SendWR{ID: 2, Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: []ib.SGE{b.sge(0, 3000)}, RemoteAddr: a.mr.IOVA() + 1000, RKey: a.mr.RKey()})
	if wc := waitWC(t, b.cq); wc.Status != ib.Success {
		t.Fatalf("peer WRITE: %v", wc.Status)
	}
	if !bytes.Equal(mem[1000:4000], bufB[:3000]) {
		t.Fatal("client memory does not hold the written data")
	}
	copy(mem[8000:], "reply from the client")
	a.send(t, verbs.SendWR{ID: 3, Opcode: ib.Send, Flags: ib.Signaled, SG: []ib.SGE{a.sge(8000, 21)}})
	if wc := waitWC(t, b.cq); wc.ID != 1 || string(bufB[40000:40021]) != "reply from the client" {
		t.Fatalf("peer RECV: %+v", wc)
	}
	waitWC(t, a.cq)
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
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		checker.Frame(t, data) // RoCEv2, ICRC valid
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
	b.send(t, verbs.SendWR{ID: 4, Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: []ib.SGE{b.sge(0, 3000)}, RemoteAddr: a.mr.IOVA() + 1000, RKey: a.mr.RKey()})
	if wc := waitWC(t, b.cq); wc.Status != ib.Success {
		t.Fatalf("peer WRITE: %v", wc.Status)
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
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("file frame %d: %v", n, err)
		}
		checker.Frame(t, d)
		n++
	}
	if n != 3 {
		t.Fatalf("file holds %d frames, want 3", n)
	}
}

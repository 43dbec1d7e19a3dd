package bpf_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/softrnic/softrnic/bpf"
	"github.com/softrnic/softrnic/internal/netnstest"
	"github.com/softrnic/softrnic/port"
	"github.com/softrnic/softrnic/port/afxdp"
)

// TestGeneratorDeliversToAFXDP sends frames with the kernel-side generator out
// of one veth end and receives them through the AF_XDP port on the other:
// every frame must arrive, byte for byte, and the steering program must
// count each one as steered.
func TestGeneratorDeliversToAFXDP(t *testing.T) {
	pair := netnstest.NewTestPair(t, netnstest.PairOptions{})
	// A takes XDP redirects only with an XDP program attached (veth).
	var progA *bpf.Program
	var gen *bpf.Generator
	if err := pair.A.NS.Do(func() (err error) {
		if progA, err = bpf.Load(bpf.Options{Queues: 1}); err != nil {
			return err
		}
		if _, err = progA.Attach(pair.A.Index); err != nil {
			return err
		}
		gen, err = bpf.NewGenerator(pair.A.Index)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gen.Close(); progA.Close() })
	var rx *afxdp.Port
	if err := pair.B.NS.Do(func() (err error) {
		rx, err = afxdp.Open(afxdp.Config{IfIndex: pair.B.Index})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rx.Close() })

	if err := gen.Send(make([]byte, bpf.MaxGeneratorFrame+1), 1); err == nil || !strings.Contains(err.Error(), "must be") {
		t.Errorf("Send of an oversized frame: %v, want a size error", err)
	}

	// veth queues redirected frames in a ring of 256 (VETH_RING_SIZE) until
	// the peer's NAPI poll takes them, and drops what does not fit; on a
	// busy host that poll can wait for ksoftirqd while the whole test run
	// is produced. So the frames go in chunks that fit the ring, each read
	// before the next is sent: then none may be lost.
	const n, chunk = 1000, 128
	frames := make([][]byte, port.BatchSize)
	for _, size := range []int{64, 1024, 1514} {
		frame := netnstest.RoCEFrame(make([]byte, size), &pair.A, &pair.B, uint32(size))
		got := 0
		for sent := 0; sent < n; {
			k := min(chunk, n-sent)
			if err := pair.A.NS.Do(func() error { return gen.Send(frame, uint32(k)) }); errors.Is(err, bpf.ErrLiveFramesRefused) {
				t.Skipf("%d B: %v", size, err)
			} else if err != nil {
				t.Fatalf("%d B: %v", size, err)
			}
			sent += k
			deadline := time.Now().Add(5 * time.Second)
			for got < sent && time.Now().Before(deadline) {
				r, err := rx.Recv(frames, 10*time.Millisecond)
				if err != nil {
					t.Fatal(err)
				}
				for _, f := range frames[:r] {
					if !bytes.Equal(f, frame) {
						t.Fatalf("%d B: frame %d differs from what was sent", size, got)
					}
					got++
				}
			}
			if got != sent {
				st, _ := rx.Stats()
				t.Fatalf("%d B: received %d of the first %d frames (port: %+v)", size, got, sent, st)
			}
		}
	}
	st, err := rx.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.Program.Steered != 3*n {
		t.Errorf("steering program counted %d steered, want %d", st.Program.Steered, 3*n)
	}
}

// TestSinkCountsAndDrops attaches the sink to one veth end and sends frames
// into it from an AF_XDP port on the other: the sink must count exactly the
// frames sent and pass none of them to the stack.
func TestSinkCountsAndDrops(t *testing.T) {
	pair := netnstest.NewTestPair(t, netnstest.PairOptions{})
	var sink *bpf.Sink
	if err := pair.B.NS.Do(func() (err error) {
		sink, err = bpf.AttachSink(pair.B.Index)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sink.Close() })
	var tx *afxdp.Port
	if err := pair.A.NS.Do(func() (err error) {
		tx, err = afxdp.Open(afxdp.Config{IfIndex: pair.A.Index})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Close() })
	out := make([][]byte, port.BatchSize)
	for i := range out {
		out[i] = netnstest.RoCEFrame(make([]byte, 64), &pair.A, &pair.B, uint32(i))
	}
	const n = 100 * port.BatchSize
	sent := 0
	for try := 0; sent < n && try < 100*n; try++ {
		k, err := port.Send(tx, out[:min(len(out), n-sent)])
		if err != nil {
			t.Fatal(err)
		}
		sent += k
	}
	// The frames are counted in the sender's sendto (veth runs the peer's
	// NAPI there), but the last batch may still sit in the peer's ring.
	var got uint64
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		var err error
		if got, err = sink.Count(); err != nil {
			t.Fatal(err)
		}
		if got >= n {
			break
		}
	}
	if sent != n || got != n {
		t.Fatalf("sent %d, sink counted %d, want %d", sent, got, n)
	}
}

package capture

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"

	"github.com/softrnic/softrnic/frame"
	"github.com/softrnic/softrnic/frame/frametest"
)

// vectorFrames reads the RoCE frames of a shared test vector (real rxe
// traffic, every ICRC valid).
func vectorFrames(t testing.TB, name string) [][]byte {
	t.Helper()
	f, err := os.Open(filepath.Join(frametest.VectorsDir(t), name))
	if err != nil {
		t.Skip("test vectors not available:", err)
	}
	defer f.Close()
	r, err := pcapgo.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for {
		data, _, err := r.ReadPacketData()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		var fr frame.Frame
		if frame.Parse(data, &fr) == nil {
			out = append(out, append([]byte(nil), data...))
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s: no RoCE frames", name)
	}
	return out
}

// readBack decodes a capture file with gopacket and returns the frames.
func readBack(t *testing.T, b []byte, format Format) ([][]byte, []pcapgo.NgEpbFlag) {
	t.Helper()
	var frames [][]byte
	var dirs []pcapgo.NgEpbFlag
	if format == PCAPNG {
		r, err := pcapgo.NewNgReader(bytes.NewReader(b), pcapgo.DefaultNgReaderOptions)
		if err != nil {
			t.Fatal(err)
		}
		if r.LinkType() != layers.LinkTypeEthernet {
			t.Fatalf("link type %v", r.LinkType())
		}
		for {
			data, ci, opts, err := r.ReadPacketDataWithOptions()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if ci.CaptureLength != len(data) || ci.Timestamp.IsZero() {
				t.Fatalf("capture info %+v", ci)
			}
			frames = append(frames, data)
			if opts.Flags == nil {
				t.Fatal("pcapng packet without flags")
			}
			dirs = append(dirs, opts.Flags.Direction)
		}
		return frames, dirs
	}
	r, err := pcapgo.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if r.LinkType() != layers.LinkTypeEthernet || r.Resolution() != gopacket.TimestampResolutionNanosecond {
		t.Fatalf("link type %v resolution %v", r.LinkType(), r.Resolution())
	}
	for {
		data, _, err := r.ReadPacketData()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		frames = append(frames, data)
	}
	return frames, nil
}

func TestCaptureRoundTrip(t *testing.T) {
	in := vectorFrames(t, "write_bw_rc.pcap")
	for _, format := range []Format{PCAP, PCAPNG} {
		var tap Tap
		var buf bytes.Buffer
		s, err := tap.Start(&buf, Options{Format: format})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tap.Start(io.Discard, Options{}); !errors.Is(err, ErrBusy) {
			t.Fatalf("second capture: %v", err)
		}
		// Alternate directions in batches, as two engine paths would.
		for i := 0; i < len(in); i += 8 {
			dir := In
			if (i/8)%2 == 1 {
				dir = Out
			}
			if sess := tap.Session(); sess != nil {
				sess.Frames(dir, in[i:min(i+8, len(in))])
			}
		}
		st, err := s.Stop()
		if err != nil {
			t.Fatal(err)
		}
		if tap.Session() != nil {
			t.Fatal("tap still active after Stop")
		}
		if st.Written != uint64(len(in)) || st.Dropped != 0 {
			t.Fatalf("format %d: stats %+v for %d frames", format, st, len(in))
		}
		got, dirs := readBack(t, buf.Bytes(), format)
		if len(got) != len(in) {
			t.Fatalf("read back %d frames, want %d", len(got), len(in))
		}
		for i := range got {
			if !bytes.Equal(got[i], in[i]) {
				t.Fatalf("frame %d differs", i)
			}
			var fr frame.Frame
			if err := frame.Parse(got[i], &fr); err != nil || !fr.VerifyICRC() {
				t.Fatalf("frame %d: parse %v, ICRC valid %v", i, err, err == nil && fr.VerifyICRC())
			}
			// gopacket decodes it as Ethernet/IP/UDP too (what Wireshark shows).
			p := gopacket.NewPacket(got[i], layers.LayerTypeEthernet, gopacket.Default)
			if udp, _ := p.Layer(layers.LayerTypeUDP).(*layers.UDP); udp == nil || udp.DstPort != 4791 {
				t.Fatalf("frame %d is not UDP/4791 to gopacket", i)
			}
			if format == PCAPNG {
				want := pcapgo.NgEpbFlagDirectionInbound
				if (i/8)%2 == 1 {
					want = pcapgo.NgEpbFlagDirectionOutbound
				}
				if dirs[i] != want {
					t.Fatalf("frame %d direction %v, want %v", i, dirs[i], want)
				}
			}
		}
	}
}

func TestCountAndQPFilter(t *testing.T) {
	in := vectorFrames(t, "rping.pcap")
	qpCount := map[uint32]int{}
	for _, f := range in {
		var fr frame.Frame
		if err := frame.Parse(f, &fr); err != nil {
			t.Fatal(err)
		}
		qpCount[fr.BTH().DestQP()]++
	}
	var qpn uint32
	for q, n := range qpCount {
		if q != 1 && n > qpCount[qpn] {
			qpn = q
		}
	}
	if len(qpCount) < 2 {
		t.Fatal("vector has one QP only")
	}
	var tap Tap
	var buf bytes.Buffer
	s, err := tap.Start(&buf, Options{FilterQP: true, QPN: qpn})
	if err != nil {
		t.Fatal(err)
	}
	tap.Session().Frames(In, in)
	st, _ := s.Stop()
	got, _ := readBack(t, buf.Bytes(), PCAP)
	if int(st.Written) != qpCount[qpn] || len(got) != qpCount[qpn] {
		t.Fatalf("QP %#x: wrote %d, read %d, want %d", qpn, st.Written, len(got), qpCount[qpn])
	}
	for _, f := range got {
		var fr frame.Frame
		if frame.Parse(f, &fr) != nil || fr.BTH().DestQP() != qpn {
			t.Fatal("frame of another QP captured")
		}
	}
	// A frame the engine attributes to the QP passes even if its BTH names
	// the peer's QP (an outgoing request).
	buf.Reset()
	s, _ = tap.Start(&buf, Options{FilterQP: true, QPN: 0xabcdef})
	s.Frame(Out, 0xabcdef, in[0])
	s.Frame(Out, 0x123, in[0])
	if st, _ := s.Stop(); st.Written != 1 {
		t.Fatalf("attributed frames: wrote %d, want 1", st.Written)
	}

	// -c: the capture ends by itself after Count frames and the tap idles.
	buf.Reset()
	s, _ = tap.Start(&buf, Options{Count: 5})
	for i := 0; i < 3 && tap.Session() != nil; i++ {
		if sess := tap.Session(); sess != nil {
			sess.Frames(Out, in[:4])
		}
	}
	select {
	case <-s.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("capture did not end at its count")
	}
	if tap.Session() != nil {
		t.Fatal("tap still active")
	}
	if got, _ := readBack(t, buf.Bytes(), PCAP); len(got) != 5 {
		t.Fatalf("count 5: file holds %d frames", len(got))
	}
}

// Several engine loops offer frames at once; every frame is either written
// or counted as dropped, never lost silently or torn.
func TestConcurrentProducers(t *testing.T) {
	in := vectorFrames(t, "send_bw_rc.pcap")
	var tap Tap
	var buf bytes.Buffer
	s, err := tap.Start(&buf, Options{QueueFrames: 64})
	if err != nil {
		t.Fatal(err)
	}
	const loops, rounds = 4, 20
	var wg sync.WaitGroup
	for g := 0; g < loops; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := 0; r < rounds; r++ {
				if sess := tap.Session(); sess != nil {
					sess.Frames(In, in[:50])
				}
			}
		}()
	}
	wg.Wait()
	st, err := s.Stop()
	if err != nil {
		t.Fatal(err)
	}
	if st.Written+st.Dropped != loops*rounds*50 {
		t.Fatalf("%+v does not add up to %d", st, loops*rounds*50)
	}
	got, _ := readBack(t, buf.Bytes(), PCAP)
	if uint64(len(got)) != st.Written {
		t.Fatalf("file holds %d, stats say %d", len(got), st.Written)
	}
	for i, f := range got {
		var fr frame.Frame
		if frame.Parse(f, &fr) != nil || !fr.VerifyICRC() {
			t.Fatalf("frame %d torn", i)
		}
	}
}

// The idle tap costs one atomic load and no allocation; a running capture
// allocates nothing per frame either.
func TestZeroAllocs(t *testing.T) {
	in := vectorFrames(t, "write_bw_rc.pcap")
	var tap Tap
	batch := in[:32]
	idle := testing.AllocsPerRun(1000, func() {
		if s := tap.Session(); s != nil {
			s.Frames(Out, batch)
		}
	})
	if idle != 0 {
		t.Fatalf("idle tap: %v allocs per batch", idle)
	}
	s, err := tap.Start(io.Discard, Options{QueueFrames: 1 << 14})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	sess := tap.Session()
	active := testing.AllocsPerRun(100, func() { sess.Frames(Out, batch) })
	if active != 0 {
		t.Fatalf("active tap: %v allocs per batch", active)
	}
}

func BenchmarkIdleTap(b *testing.B) {
	var tap Tap
	batch := make([][]byte, 64)
	for i := 0; i < b.N; i++ {
		if s := tap.Session(); s != nil {
			s.Frames(Out, batch)
		}
	}
}

func BenchmarkActiveTap64(b *testing.B) {
	in := vectorFrames(b, "write_bw_rc.pcap")
	var tap Tap
	s, _ := tap.Start(io.Discard, Options{})
	defer s.Stop()
	batch := in[:64]
	b.SetBytes(int64(64 * len(in[0])))
	for i := 0; i < b.N; i++ {
		tap.Session().Frames(Out, batch)
	}
	b.StopTimer()
	st := s.Stats()
	b.ReportMetric(float64(st.Dropped)/float64(st.Dropped+st.Written+1), "drop-ratio")
}

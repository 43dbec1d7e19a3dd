package frametest

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"testing"

	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
)

// VectorsEnv overrides where the vectors are looked for.
const VectorsEnv = "SOFTRNIC_VECTORS"

// Dir returns the vectors folder: $SOFTRNIC_VECTORS, or ../shared/vectors
// next to the module root found by walking up from the working directory (a
// test's package folder). It fails when the folder is absent, since the
// captures are not part of the repository.
func Dir() (string, error) {
	if d := os.Getenv(VectorsEnv); d != "" {
		return d, nil
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := wd; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			v := filepath.Join(d, "..", "shared", "vectors")
			if st, err := os.Stat(v); err == nil && st.IsDir() {
				return v, nil
			}
			return "", fmt.Errorf("test vectors not found at %s (set %s to their folder)", v, VectorsEnv)
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no go.mod above %s; cannot locate ../shared/vectors", wd)
		}
	}
}

// VectorsDir is Dir for a test: it skips the test when the folder is absent.
func VectorsDir(tb testing.TB) string {
	tb.Helper()
	d, err := Dir()
	if err != nil {
		tb.Skip(err)
	}
	return d
}

// Capture is one capture file's frames.
type Capture struct {
	Name   string   // file name, e.g. write_bw_rc.pcap
	Frames [][]byte // every frame in file order (frame numbers start at 1)
}

// Captures loads every .pcap and .pcapng file of the vectors folder, sorted
// by name. It skips the test when there are none and fails it when a file
// cannot be read.
func Captures(tb testing.TB) []Capture {
	tb.Helper()
	caps, err := Load(VectorsDir(tb))
	if err != nil {
		tb.Fatal(err)
	}
	if len(caps) == 0 {
		tb.Skip("no captures in the vectors folder")
	}
	return caps
}

// Load reads every .pcap and .pcapng file of dir, sorted by name.
func Load(dir string) ([]Capture, error) {
	var names []string
	for _, pat := range []string{"*.pcap", "*.pcapng"} {
		m, _ := filepath.Glob(filepath.Join(dir, pat))
		names = append(names, m...)
	}
	sort.Strings(names)
	caps := make([]Capture, 0, len(names))
	for _, n := range names {
		frames, err := ReadFile(n)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", n, err)
		}
		caps = append(caps, Capture{Name: filepath.Base(n), Frames: frames})
	}
	return caps, nil
}

// Seeds returns the vectors' frames for seeding fuzz targets, or nil when
// the vectors are absent (the targets then run on their synthetic seeds).
// They are read once per test binary.
func Seeds() []Capture {
	seedsOnce.Do(func() {
		if d, err := Dir(); err == nil {
			seeds, _ = Load(d)
		}
	})
	return seeds
}

var (
	seedsOnce sync.Once
	seeds     []Capture
)

// ReadFile returns every Ethernet frame in a pcap or pcapng file.
func ReadFile(name string) ([][]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }() // read only
	return Read(f)
}

// pcapng section header block type; pcap files start with one of four
// magic numbers instead.
const ngMagic = 0x0A0D0D0A

// Read returns every Ethernet frame of a pcap or pcapng stream.
func Read(r io.Reader) ([][]byte, error) {
	br := bufio.NewReader(r)
	head, err := br.Peek(4)
	if err != nil {
		return nil, fmt.Errorf("not a capture file: %w", err)
	}
	var next func() ([]byte, error)
	var link layers.LinkType
	if binary.LittleEndian.Uint32(head) == ngMagic {
		ng, err := pcapgo.NewNgReader(br, pcapgo.DefaultNgReaderOptions)
		if err != nil {
			return nil, err
		}
		link = ng.LinkType()
		next = func() ([]byte, error) { d, _, err := ng.ReadPacketData(); return d, err }
	} else {
		pr, err := pcapgo.NewReader(br)
		if err != nil {
			return nil, err
		}
		link = pr.LinkType()
		next = func() ([]byte, error) { d, _, err := pr.ReadPacketData(); return d, err }
	}
	if link != layers.LinkTypeEthernet {
		return nil, fmt.Errorf("link type %v, want Ethernet", link)
	}
	var frames [][]byte
	for {
		d, err := next()
		if errors.Is(err, io.EOF) {
			return frames, nil
		}
		if err != nil {
			return frames, err
		}
		frames = append(frames, bytes.Clone(d))
	}
}

// WritePcap writes frames as a pcap file (Ethernet link type), for tests
// that need a capture of their own making.
func WritePcap(w io.Writer, frames [][]byte) error {
	pw := pcapgo.NewWriter(w)
	if err := pw.WriteFileHeader(65535, layers.LinkTypeEthernet); err != nil {
		return err
	}
	for _, f := range frames {
		if err := pw.WritePacket(captureInfo(len(f)), f); err != nil {
			return err
		}
	}
	return nil
}

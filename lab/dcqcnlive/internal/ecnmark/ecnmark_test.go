package ecnmark

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/frame"
	"github.com/softrnic/softrnic/icrc"
)

// ECN codepoints.
const (
	notECT = 0
	ect1   = 1
	ect0   = 2
	ce     = 3
)

// load loads the marker for BPF_PROG_TEST_RUN. A verifier rejection fails
// the test; only a missing privilege skips it.
func load(t *testing.T, cfg Config) *Marker {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("loading a tc BPF program needs CAP_BPF and CAP_NET_ADMIN: run as root")
	}
	m, err := Load(cfg)
	if err != nil {
		var ve *ebpf.VerifierError
		if !errors.As(err, &ve) && (errors.Is(err, unix.EPERM) || errors.Is(err, unix.ENOTSUP)) {
			t.Skipf("no privilege to load tc programs: %v", err)
		}
		t.Fatalf("load: %+v", err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

var (
	v4A = netip.MustParseAddr("10.12.0.1")
	v4B = netip.MustParseAddr("10.12.0.2")
	v6A = netip.MustParseAddr("fd00:12::1")
	v6B = netip.MustParseAddr("fd00:12::2")
)

// roce builds an RC SEND_ONLY RoCEv2 frame of exactly size bytes (size ≥ 90,
// a multiple of 4 away from the minimum) with the given ECN codepoint and
// DSCP 26, with a valid ICRC.
func roce(t testing.TB, v6 bool, ecn uint8, size int, psn uint32) []byte {
	t.Helper()
	s := frame.Spec{
		DstMAC: [6]byte{2, 0, 0, 0, 0, 2}, SrcMAC: [6]byte{2, 0, 0, 0, 0, 1},
		Src: v4A, Dst: v4B, TOS: 26<<2 | ecn, SrcPort: 0xC000, IPID: uint16(psn),
		BTH: bth.BTHFields{Opcode: bth.RCSendOnly, PKey: bth.DefaultPKey, DestQP: 0x11, PSN: bth.PSN(psn)},
	}
	if v6 {
		s.Src, s.Dst = v6A, v6B
	}
	pay := size - frame.Size(&s, 0)
	if pay < 0 || pay%4 != 0 {
		t.Fatalf("frame size %d not reachable (headers %d)", size, frame.Size(&s, 0))
	}
	buf := make([]byte, size)
	n, err := frame.Build(buf, &s, bytes.Repeat([]byte{0xA5}, pay))
	if err != nil || n != size {
		t.Fatalf("frame.Build: %d, %v", n, err)
	}
	return buf
}

// arp is a minimal ARP request frame (not IP).
func arp() []byte {
	b := make([]byte, 60)
	copy(b, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 2, 0, 0, 0, 0, 1, 0x08, 0x06})
	return b
}

func ecnOf(b []byte) uint8 {
	switch binary.BigEndian.Uint16(b[12:]) {
	case 0x0800:
		return b[15] & 3
	case 0x86DD:
		return (b[15] >> 4) & 3
	}
	return 0xff
}

// ipv4HeaderOK reports whether the IPv4 header checksum of frame b is right.
func ipv4HeaderOK(b []byte) bool {
	h := b[14 : 14+20]
	var sum uint32
	for i := 0; i < len(h); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return sum == 0xffff
}

// run passes one frame through the program and returns what left it.
func run(t *testing.T, m *Marker, in []byte) []byte {
	t.Helper()
	opts := ebpf.RunOptions{Data: in, DataOut: make([]byte, len(in)+256)}
	ret, err := m.Program().Run(&opts)
	if err != nil {
		t.Fatalf("prog.Run(%d bytes): %v", len(in), err)
	}
	if ret != 0 {
		t.Fatalf("verdict %d, want TC_ACT_OK (0)", ret)
	}
	return opts.DataOut
}

// 1 Gb/s = 125 bytes per µs.
var rampCfg = Config{RateBitsPerSec: 1e9, LimitBytes: 1 << 20, KminBytes: 20000, KmaxBytes: 40000, Pmax: 1}

const t0 = 1_000_000_000 // test clock origin, ns

// TestRamp fills the virtual queue at a frozen clock: while the backlog a
// packet finds is at or below Kmin nothing is marked, above Kmax every
// ECT(0)/ECT(1) packet becomes CE with its IPv4 checksum and ICRC intact,
// and not-ECT packets are never changed. IPv4 and IPv6.
func TestRamp(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		name := "IPv4"
		if v6 {
			name = "IPv6"
		}
		t.Run(name, func(t *testing.T) {
			m := load(t, rampCfg)
			if err := m.setNow(t0); err != nil {
				t.Fatal(err)
			}
			const size = 1002
			var q uint64
			var belowSeen, aboveSeen int
			for i := 0; q <= 60000; i++ {
				ecn := []uint8{ect0, ect1, notECT}[i%3]
				in := roce(t, v6, ecn, size, uint32(i))
				out := run(t, m, in)
				found := q
				q += size
				got := ecnOf(out)
				switch {
				case found <= rampCfg.KminBytes:
					belowSeen++
					if !bytes.Equal(out, in) {
						t.Fatalf("packet %d found %d ≤ Kmin bytes and was changed (ECN %d → %d)", i, found, ecn, got)
					}
				case found > rampCfg.KmaxBytes:
					aboveSeen++
					if ecn == notECT {
						if !bytes.Equal(out, in) {
							t.Fatalf("not-ECT packet %d above Kmax was changed", i)
						}
						continue
					}
					if got != ce {
						t.Fatalf("packet %d found %d > Kmax bytes: ECN %d → %d, want CE", i, found, ecn, got)
					}
					if !v6 && !ipv4HeaderOK(out) {
						t.Fatalf("packet %d: IPv4 header checksum wrong after marking", i)
					}
					if !icrc.Verify(out[14:]) {
						t.Fatalf("packet %d: ICRC no longer valid after marking", i)
					}
					// Only the ECN bits (and the IPv4 checksum) may differ.
					diff := 0
					for k := range in {
						if in[k] != out[k] {
							diff++
							if k != 15 && (v6 || (k != 24 && k != 25)) {
								t.Fatalf("packet %d: byte %d changed by marking", i, k)
							}
						}
					}
					if diff == 0 {
						t.Fatalf("packet %d: nothing changed", i)
					}
				}
			}
			if belowSeen < 10 || aboveSeen < 10 {
				t.Fatalf("walk too short: %d below Kmin, %d above Kmax", belowSeen, aboveSeen)
			}
			c, err := m.Counters()
			if err != nil {
				t.Fatal(err)
			}
			if c.MarkFailed != 0 || c.Marked == 0 || c.NotECTHit == 0 || c.ECT+c.NotECT != c.Packets {
				t.Fatalf("counters %+v", c)
			}
			back, _, err := m.Queue()
			if err != nil || back != q {
				t.Fatalf("virtual queue %d (%v), want %d", back, err, q)
			}
		})
	}
}

// TestDrain checks the virtual queue drains at the configured rate, using
// the test-only clock override: 1 Gb/s is 125 bytes per µs.
func TestDrain(t *testing.T) {
	m := load(t, rampCfg)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(m.setNow(t0))
	for i := range 10 {
		run(t, m, roce(t, false, ect0, 1002, uint32(i)))
	}
	q, last, err := m.Queue()
	must(err)
	if q != 10020 || last != t0 {
		t.Fatalf("queue %d at %d, want 10020 at %d", q, last, t0)
	}
	// 40 µs drain 5000 bytes; the next packet adds 1002.
	must(m.setNow(t0 + 40_000))
	run(t, m, roce(t, false, ect0, 1002, 10))
	q, _, _ = m.Queue()
	if q != 10020-5000+1002 {
		t.Fatalf("after 40 µs: queue %d, want %d", q, 10020-5000+1002)
	}
	// Sub-byte drains accumulate: 1000 steps of 4 ns (0.5 byte each) drain
	// 500 bytes, not 0.
	now := uint64(t0 + 40_000)
	for range 1000 {
		now += 4
		must(m.setNow(now))
		run(t, m, arp())
	}
	q, _, _ = m.Queue()
	if want := uint64(6022 - 500 + 1000*60); q != want {
		t.Fatalf("after 1000 sub-byte steps: queue %d, want %d", q, want)
	}
	// A clock step backwards drains nothing (and does not wedge the queue).
	must(m.setNow(now - 1000))
	run(t, m, arp())
	q2, _, _ := m.Queue()
	if q2 != q+60 {
		t.Fatalf("after a backwards step: queue %d, want %d", q2, q+60)
	}
	// Longer than it takes to empty: empty, and no credit is banked.
	must(m.setNow(now + 10_000_000))
	run(t, m, arp())
	q, _, _ = m.Queue()
	if q != 60 {
		t.Fatalf("after 10 ms idle: queue %d, want 60", q)
	}
	if got, err := m.BacklogAt(now + 10_000_000 + 240); err != nil || got != 30 {
		t.Fatalf("BacklogAt +240 ns: %d (%v), want 30", got, err)
	}
	c, _ := m.Counters()
	if c.NonIP != 1002 || c.Marked != 0 {
		t.Fatalf("counters %+v", c)
	}
}

// TestMatchesModel replays a seeded random packet sequence (lengths, ECN
// codepoints, gaps around the drain rate, some non-IP) through the program
// and the Go model and requires the same verdict, backlog and counters for
// every packet, the RED ramp's random draws included.
func TestMatchesModel(t *testing.T) {
	cfg := Config{RateBitsPerSec: 200e6, LimitBytes: 60000, BurstBytes: 3000, KminBytes: 5000, KmaxBytes: 40000, Pmax: 0.3, Seed: 42}
	m := load(t, cfg)
	mod, err := NewModel(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(7, 9))
	now := uint64(t0)
	sizes := []int{90, 98, 510, 1002, 1090, 2090} // test runs take at most a page
	var ramp, marks, drops int
	for i := range 4000 {
		size := sizes[rng.IntN(len(sizes))]
		// 200 Mb/s = 25 bytes/µs, 40 ns per byte. Phases of 400 packets
		// alternate an offered load of 1.25 (mean gap 32 ns per byte) and
		// 0.8 (50 ns per byte), so the queue crosses the whole ramp many
		// times and reaches the limit.
		perByte := 64
		if (i/400)%2 == 1 {
			perByte = 100
		}
		now += uint64(rng.IntN(size * perByte))
		if err := m.setNow(now); err != nil {
			t.Fatal(err)
		}
		var in []byte
		var ecn uint8
		switch r := rng.IntN(20); r {
		case 0:
			in, ecn = arp(), 0xff
		default:
			ecn = uint8(r % 4)
			in = roce(t, rng.IntN(2) == 0, ecn, size, uint32(i))
		}
		out := run(t, m, in)
		verdict, found := mod.Packet(now, uint32(len(in)), ecn)
		marked := ecnOf(out) == ce && ecn != ce
		if marked != (verdict&VerdictMarked != 0) {
			t.Fatalf("packet %d (ECN %d, found %d): program marked=%v, model verdict %b", i, ecn, found, marked, verdict)
		}
		if !marked && !bytes.Equal(in, out) {
			t.Fatalf("packet %d changed without a mark", i)
		}
		q, _, _ := m.Queue()
		if q != mod.Backlog() {
			t.Fatalf("packet %d: program backlog %d, model %d", i, q, mod.Backlog())
		}
		if found > cfg.KminBytes && found <= cfg.KmaxBytes {
			ramp++
		}
		if marked {
			marks++
		}
		if verdict&VerdictVQDrop != 0 {
			drops++
		}
	}
	c, err := m.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if c != mod.Counters {
		t.Fatalf("counters differ:\nprogram %+v\nmodel   %+v", c, mod.Counters)
	}
	if ramp < 200 || marks < 50 || drops == 0 {
		t.Fatalf("sequence did not exercise the ramp: %d in ramp, %d marks, %d virtual drops", ramp, marks, drops)
	}
	t.Logf("4000 packets: %d in the ramp, %d marked, %d virtual drops", ramp, marks, drops)
}

// TestSeedReproducible: the same seed marks the same packets in the ramp, a
// different seed different ones.
func TestSeedReproducible(t *testing.T) {
	pattern := func(seed uint64) []bool {
		cfg := rampCfg
		cfg.Pmax, cfg.Seed = 0.5, seed
		m := load(t, cfg)
		if err := m.setNow(t0); err != nil {
			t.Fatal(err)
		}
		var marks []bool
		for i := range 40 { // 40 × 1002 bytes: the whole ramp 20000..40000
			out := run(t, m, roce(t, false, ect0, 1002, uint32(i)))
			marks = append(marks, ecnOf(out) == ce)
		}
		return marks
	}
	a, b, c := pattern(1), pattern(1), pattern(2)
	if !equalBools(a, b) {
		t.Fatalf("same seed, different marks:\n%v\n%v", a, b)
	}
	if equalBools(a, c) {
		t.Fatalf("seeds 1 and 2 marked the same packets: %v", a)
	}
}

func equalBools(a, b []bool) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestTrace reads the per-packet samples back from the ring buffer.
func TestTrace(t *testing.T) {
	cfg := rampCfg
	cfg.Trace, cfg.WakeEvery = true, 8
	m := load(t, cfg)
	rd, err := m.TraceReader()
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	if err := m.setNow(t0); err != nil {
		t.Fatal(err)
	}
	const n = 50
	for i := range n {
		run(t, m, roce(t, false, ect0, 1002, uint32(i)))
	}
	s, err := rd.Read(nil, time.Now().Add(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if len(s) != n {
		t.Fatalf("%d samples, want %d", len(s), n)
	}
	mod, _ := NewModel(cfg)
	for i, x := range s {
		v, _ := mod.Packet(t0, 1002, ect0)
		if x.NowNs != t0 || x.QBytes != uint32(i*1002) || x.Len != 1002 || x.ECN != ect0 || x.Verdict != v {
			t.Fatalf("sample %d: %+v", i, x)
		}
	}
}

// TestUnconfigured: a zero configuration (rate 0) passes everything.
func TestUnconfigured(t *testing.T) {
	m := load(t, rampCfg)
	if err := m.objs.Cfg.Put(uint32(0), &config{}); err != nil {
		t.Fatal(err)
	}
	in := roce(t, false, ect0, 1002, 0)
	if out := run(t, m, in); !bytes.Equal(in, out) {
		t.Fatal("unconfigured marker changed a packet")
	}
	c, _ := m.Counters()
	if c.Unconfigured != 1 || c.Packets != 1 {
		t.Fatalf("counters %+v", c)
	}
}

func TestConfigValidate(t *testing.T) {
	bad := []Config{
		{},
		{RateBitsPerSec: 1e9, KminBytes: 10, KmaxBytes: 5},
		{RateBitsPerSec: 1e9, KmaxBytes: 3 << 30},
		{RateBitsPerSec: 1e9, Pmax: 1.5},
		{RateBitsPerSec: 1e6, LimitBytes: 1 << 20},
		{RateBitsPerSec: 1 << 40},
	}
	for _, c := range bad {
		if c.validate() == nil {
			t.Errorf("%+v accepted", c)
		}
	}
	if err := rampCfg.validate(); err != nil {
		t.Fatal(err)
	}
}

// TestBurst: the first burst bytes of a queue are tbf's bucket, not backlog;
// with Kmin = Kmax = 0 (step marking) the first packet marked is the one
// that finds more than the burst in the virtual queue.
func TestBurst(t *testing.T) {
	cfg := Config{RateBitsPerSec: 1e9, BurstBytes: 3000, LimitBytes: 4000}
	m := load(t, cfg)
	if err := m.setNow(t0); err != nil {
		t.Fatal(err)
	}
	var got []uint8
	for i := range 6 {
		got = append(got, ecnOf(run(t, m, roce(t, false, ect0, 1002, uint32(i)))))
	}
	// Virtual queue before each: 0, 1002, 2004, 3006 (6 over the burst:
	// marked), 4008 (1008), 5010 (2010); the 6th finds 2010 and 2010+1002
	// fits the limit; with limit 4000 nothing is dropped yet.
	want := []uint8{ect0, ect0, ect0, ce, ce, ce}
	if !bytes.Equal(got, want) {
		t.Fatalf("ECN out %v, want %v", got, want)
	}
	if b, err := m.BacklogAt(t0); err != nil || b != 6*1002-3000 {
		t.Fatalf("BacklogAt = %d (%v), want %d", b, err, 6*1002-3000)
	}
	// 3012 + 1002 > 4000: a virtual drop, the queue does not grow.
	run(t, m, roce(t, false, ect0, 1002, 7))
	c, _ := m.Counters()
	if q, _, _ := m.Queue(); c.VQDrops != 1 || q != 6*1002 {
		t.Fatalf("after overflow: queue %d, counters %+v", q, c)
	}
}

// TestResync: a measured backlog replaces the model's queue (plus the
// burst), keeps the generator, and the next packet drains from the resync
// time.
func TestResync(t *testing.T) {
	cfg := rampCfg
	cfg.BurstBytes = 3000
	m := load(t, cfg)
	if err := m.setNow(t0); err != nil {
		t.Fatal(err)
	}
	run(t, m, roce(t, false, ect0, 1002, 0))
	if err := m.Resync(0, t0+5); err != nil {
		t.Fatal(err)
	}
	if q, last, _ := m.Queue(); q != 1002 || last != t0 {
		t.Fatalf("a zero backlog changed the queue: %d at %d", q, last)
	}
	if err := m.Resync(50_000, t0+8_000); err != nil {
		t.Fatal(err)
	}
	if q, last, _ := m.Queue(); q != 53_000 || last != t0+8_000 {
		t.Fatalf("after resync: %d at %d, want 53000 at %d", q, last, t0+8_000)
	}
	// 8 µs after the resync 1000 bytes have drained: the packet finds
	// 53000 − 1000 − 3000 (burst) = 49000 > Kmax and is marked.
	if err := m.setNow(t0 + 16_000); err != nil {
		t.Fatal(err)
	}
	if out := run(t, m, roce(t, false, ect0, 1002, 1)); ecnOf(out) != ce {
		t.Fatal("packet after resync above Kmax not marked")
	}
	if q, _, _ := m.Queue(); q != 53_002 {
		t.Fatalf("queue %d, want 53002", q)
	}
}

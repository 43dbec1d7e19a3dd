package ecnmark

import (
	"errors"
	"fmt"
	"math"
	"os"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/vishvananda/netlink"
)

// Config is the marker's configuration: the bottleneck it mirrors and the
// RED ramp.
type Config struct {
	// RateBitsPerSec is the tbf rate the virtual queue drains at.
	RateBitsPerSec uint64
	// LimitBytes is the tbf limit: a packet that would take the virtual
	// queue past it is counted as a virtual drop (tbf drops it) and not
	// queued. 0: no limit.
	LimitBytes uint64
	// BurstBytes is the tbf burst: tbf sends that much of a burst without
	// queueing, so the marker takes max(0, q − burst) of its virtual queue q
	// as the backlog (for marking, the limit and the trace).
	BurstBytes uint64
	// KminBytes, KmaxBytes, Pmax: no mark at or below Kmin, probability
	// rising linearly to Pmax at Kmax, always above Kmax (the backlog is the
	// one a packet finds on arrival, its own length excluded).
	KminBytes, KmaxBytes uint64
	Pmax                 float64
	// Seed seeds the marker's xorshift64 generator (0 picks a fixed seed),
	// so a run with the same seed and packet sequence marks the same packets.
	Seed uint64
	// Trace turns on one (time, backlog, verdict) sample per packet in the
	// ring buffer read by TraceReader. WakeEvery wakes the reader every N
	// samples (0 or 1: each), trading latency for CPU.
	Trace     bool
	WakeEvery uint32
}

// DefaultSeed is used when Config.Seed is 0 (xorshift must not start at 0).
const DefaultSeed = 0x9E3779B97F4A7C15

// Limits the program's 64-bit arithmetic needs (see ecn_vq.c).
const (
	maxRateBytes = 16 << 30 // bytes/s, keeps dt(≤1 s in ns)·rate < 2^64
	maxKmax      = 1 << 31  // keeps pmax_q32·(q−Kmin) < 2^64
)

func (c Config) validate() error {
	rate := c.RateBitsPerSec / 8
	switch {
	case rate == 0:
		return errors.New("ecnmark: rate must be at least 8 bit/s")
	case rate > maxRateBytes:
		return fmt.Errorf("ecnmark: rate %d bit/s too high", c.RateBitsPerSec)
	case c.KmaxBytes < c.KminBytes:
		return errors.New("ecnmark: Kmax below Kmin")
	case c.KmaxBytes > maxKmax:
		return errors.New("ecnmark: Kmax above 2 GiB")
	case !(c.Pmax >= 0 && c.Pmax <= 1):
		return fmt.Errorf("ecnmark: Pmax %v outside [0, 1]", c.Pmax)
	case c.BurstBytes > rate:
		return errors.New("ecnmark: burst above one second of the rate")
	case c.LimitBytes > rate:
		// A gap of a second empties the queue in the program.
		return errors.New("ecnmark: limit above one second of the rate")
	}
	return nil
}

// pmaxQ32 is Pmax in units of 2^-32.
func (c Config) pmaxQ32() uint64 { return uint64(math.Round(c.Pmax * (1 << 32))) }

func (c Config) seed() uint64 {
	if c.Seed == 0 {
		return DefaultSeed
	}
	return c.Seed
}

// config mirrors struct config in ecn_vq.c.
type config struct {
	RateBps, LimitBytes, BurstBytes, KminBytes, KmaxBytes, PmaxQ32, NowNs uint64
	Flags, WakeEvery                                                      uint32
}

// vqState mirrors struct vq in ecn_vq.c.
type vqState struct {
	Lock, _                       uint32
	LastNs, QBytes, Rem, Rng, Seq uint64
}

// Counters are the program's counters summed over all CPUs.
type Counters struct {
	Packets      uint64 `json:"packets"`
	Bytes        uint64 `json:"bytes"`
	ECT          uint64 `json:"ect"`          // ECT(0) or ECT(1) on arrival
	CE           uint64 `json:"ce"`           // already CE on arrival
	NotECT       uint64 `json:"not_ect"`      // IP but not ECN-capable
	NonIP        uint64 `json:"non_ip"`       // not IPv4/IPv6 (ARP, ...): queued, never marked
	Marked       uint64 `json:"marked"`       // set to CE by the marker
	MarkFailed   uint64 `json:"mark_failed"`  // chosen for marking but the kernel helper refused
	NotECTHit    uint64 `json:"not_ect_hit"`  // not-ECT packets RED chose (a RED switch drops them)
	CEHit        uint64 `json:"ce_hit"`       // already-CE packets RED chose
	VQDrops      uint64 `json:"vq_drops"`     // would overflow LimitBytes (tbf drops them)
	Unconfigured uint64 `json:"unconfigured"` // seen before a configuration was written
	TraceLost    uint64 `json:"trace_lost"`   // samples lost to a full ring buffer
}

// Marker is a loaded marker program with its maps.
type Marker struct {
	objs    ecnvqObjects
	cfg     Config
	ifindex int // attached interface, 0 when not attached
}

// Load loads the program and writes cfg; it does not attach it.
func Load(cfg Config) (*Marker, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	m := &Marker{cfg: cfg}
	if err := loadEcnvqObjects(&m.objs, nil); err != nil {
		return nil, fmt.Errorf("ecnmark: load: %w", err)
	}
	if err := m.Reset(); err != nil {
		return nil, errors.Join(err, m.objs.Close())
	}
	if err := m.writeConfig(0); err != nil {
		return nil, errors.Join(err, m.objs.Close())
	}
	return m, nil
}

func (m *Marker) writeConfig(nowNs uint64) error {
	c := config{
		RateBps:    m.cfg.RateBitsPerSec / 8,
		LimitBytes: m.cfg.LimitBytes,
		BurstBytes: m.cfg.BurstBytes,
		KminBytes:  m.cfg.KminBytes,
		KmaxBytes:  m.cfg.KmaxBytes,
		PmaxQ32:    m.cfg.pmaxQ32(),
		NowNs:      nowNs,
		WakeEvery:  m.cfg.WakeEvery,
	}
	if m.cfg.Trace {
		c.Flags |= 1
	}
	if err := m.objs.Cfg.Put(uint32(0), &c); err != nil {
		return fmt.Errorf("ecnmark: write config: %w", err)
	}
	return nil
}

// setNow makes the program use nowNs as its clock instead of
// bpf_ktime_get_ns (0 returns to the real clock). Tests use it to drive the
// virtual queue's drain through BPF_PROG_TEST_RUN.
func (m *Marker) setNow(nowNs uint64) error { return m.writeConfig(nowNs) }

// Reset empties the virtual queue and reseeds the generator.
func (m *Marker) Reset() error {
	st := vqState{Rng: m.cfg.seed()}
	if err := m.objs.Vqs.Update(uint32(0), &st, ebpf.UpdateLock); err != nil {
		return fmt.Errorf("ecnmark: reset queue: %w", err)
	}
	return nil
}

// Resync sets the virtual queue to a measured tbf backlog (bytes, as
// `tc -s qdisc` reports it) taken at nowNs (CLOCK_MONOTONIC). The model
// drifts when the kernel serves tbf late (softirq starved on a loaded
// host: the real queue grows while the model drains on time), and a
// persistently backlogged queue never empties to reset it; a user-space
// poller can correct it this way. A backlog of 0 says nothing about tbf's
// bucket and is ignored. Packets that arrive between the poll and this
// update are lost from the model (about one packet per resync).
func (m *Marker) Resync(backlog, nowNs uint64) error {
	if backlog == 0 {
		return nil
	}
	var st vqState
	if err := m.objs.Vqs.LookupWithFlags(uint32(0), &st, ebpf.LookupLock); err != nil {
		return fmt.Errorf("ecnmark: read queue: %w", err)
	}
	// A backlogged tbf has an empty bucket: the model's q is backlog+burst.
	st.QBytes, st.LastNs, st.Rem = backlog+m.cfg.BurstBytes, nowNs, 0
	if err := m.objs.Vqs.Update(uint32(0), &st, ebpf.UpdateLock); err != nil {
		return fmt.Errorf("ecnmark: resync queue: %w", err)
	}
	return nil
}

// Program is the loaded program (for tests and for attaching elsewhere).
func (m *Marker) Program() *ebpf.Program { return m.objs.EcnVq }

// Queue returns the virtual queue in bytes (burst included) as of its last
// update (it drains only when a packet passes) and the time of that update
// on the program's clock (CLOCK_MONOTONIC ns).
func (m *Marker) Queue() (backlog, lastNs uint64, err error) {
	var st vqState
	if err := m.objs.Vqs.LookupWithFlags(uint32(0), &st, ebpf.LookupLock); err != nil {
		return 0, 0, fmt.Errorf("ecnmark: read queue: %w", err)
	}
	return st.QBytes, st.LastNs, nil
}

// BacklogAt returns the tbf backlog the marker estimates at nowNs
// (CLOCK_MONOTONIC): the virtual queue drained up to then, minus the burst,
// i.e. what the next packet would find.
func (m *Marker) BacklogAt(nowNs uint64) (uint64, error) {
	q, last, err := m.Queue()
	if err != nil {
		return 0, err
	}
	if nowNs > last {
		d := drain(nowNs-last, m.cfg.RateBitsPerSec/8)
		if d >= q {
			return 0, nil
		}
		q -= d
	}
	if q <= m.cfg.BurstBytes {
		return 0, nil
	}
	return q - m.cfg.BurstBytes, nil
}

// drain returns the bytes a server of rate bytes/s sends in dt ns (no
// remainder carried: an estimate between packets).
func drain(dt, rate uint64) uint64 {
	if dt >= 1e9 {
		return math.MaxUint64
	}
	return dt * rate / 1e9
}

// Counters sums the per-CPU counters.
func (m *Marker) Counters() (Counters, error) {
	var per []Counters
	if err := m.objs.Stats.Lookup(uint32(0), &per); err != nil {
		return Counters{}, fmt.Errorf("ecnmark: read counters: %w", err)
	}
	var c Counters
	for _, p := range per {
		c.Packets += p.Packets
		c.Bytes += p.Bytes
		c.ECT += p.ECT
		c.CE += p.CE
		c.NotECT += p.NotECT
		c.NonIP += p.NonIP
		c.Marked += p.Marked
		c.MarkFailed += p.MarkFailed
		c.NotECTHit += p.NotECTHit
		c.CEHit += p.CEHit
		c.VQDrops += p.VQDrops
		c.Unconfigured += p.Unconfigured
		c.TraceLost += p.TraceLost
	}
	return c, nil
}

// Attach adds a clsact qdisc to the interface ifindex (in the calling
// thread's network namespace) and the program as its egress filter in
// direct-action mode, as `tc filter add dev X egress bpf da` would.
func (m *Marker) Attach(ifindex int) error {
	if m.ifindex != 0 {
		return errors.New("ecnmark: already attached")
	}
	q := &netlink.GenericQdisc{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: ifindex, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT},
		QdiscType:  "clsact",
	}
	if err := netlink.QdiscReplace(q); err != nil {
		return fmt.Errorf("ecnmark: add clsact on ifindex %d: %w", ifindex, err)
	}
	f := &netlink.BpfFilter{
		FilterAttrs: netlink.FilterAttrs{
			LinkIndex: ifindex,
			Parent:    netlink.HANDLE_MIN_EGRESS,
			Handle:    1,
			Protocol:  syscall.ETH_P_ALL,
			Priority:  1,
		},
		Fd:           m.objs.EcnVq.FD(),
		Name:         "ecn_vq",
		DirectAction: true,
	}
	if err := netlink.FilterAdd(f); err != nil {
		return errors.Join(fmt.Errorf("ecnmark: add egress filter on ifindex %d: %w", ifindex, err), netlink.QdiscDel(q))
	}
	m.ifindex = ifindex
	return nil
}

// Detach removes the clsact qdisc Attach added (with the filter). It must
// run in the same network namespace as Attach; removing the namespace or
// the interface detaches too.
func (m *Marker) Detach() error {
	if m.ifindex == 0 {
		return nil
	}
	q := &netlink.GenericQdisc{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: m.ifindex, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT},
		QdiscType:  "clsact",
	}
	m.ifindex = 0
	if err := netlink.QdiscDel(q); err != nil && !errors.Is(err, syscall.ENODEV) && !errors.Is(err, syscall.EINVAL) {
		return fmt.Errorf("ecnmark: remove clsact: %w", err)
	}
	return nil
}

// Close releases the program and maps (a filter still attached keeps the
// program alive until its interface or qdisc goes).
func (m *Marker) Close() error { return m.objs.Close() }

// Sample is one queue-trace record: the backlog a packet found on arrival.
type Sample struct {
	NowNs   uint64 // CLOCK_MONOTONIC (or the test override)
	QBytes  uint32 // backlog estimate (virtual queue − burst) before this packet
	Len     uint16 // packet length (skb->len)
	ECN     uint8  // ECN field on arrival, 0xff when not IP
	Verdict uint8  // VerdictMarked | VerdictRED | VerdictVQDrop
}

// Sample verdict bits (V_* in ecn_vq.c).
const (
	VerdictMarked = 1 // set to CE
	VerdictRED    = 2 // chosen by RED (marked only if ECN-capable)
	VerdictVQDrop = 4 // over the limit: tbf drops it
)

// SampleLen is the size of a ring-buffer record.
const SampleLen = 16

// DecodeSample parses one record.
func DecodeSample(b []byte) (Sample, bool) {
	if len(b) < SampleLen {
		return Sample{}, false
	}
	le := func(i, n int) uint64 {
		var v uint64
		for k := n - 1; k >= 0; k-- {
			v = v<<8 | uint64(b[i+k])
		}
		return v
	}
	return Sample{NowNs: le(0, 8), QBytes: uint32(le(8, 4)), Len: uint16(le(12, 2)), ECN: b[14], Verdict: b[15]}, true
}

// TraceReader reads queue samples from the ring buffer (Config.Trace).
type TraceReader struct {
	rd  *ringbuf.Reader
	rec ringbuf.Record
}

// TraceReader opens a reader on the trace ring buffer.
func (m *Marker) TraceReader() (*TraceReader, error) {
	rd, err := ringbuf.NewReader(m.objs.Trace)
	if err != nil {
		return nil, fmt.Errorf("ecnmark: trace reader: %w", err)
	}
	return &TraceReader{rd: rd}, nil
}

// Read appends to dst every sample that arrives before deadline (all the
// pending ones at least) and returns it.
func (t *TraceReader) Read(dst []Sample, deadline time.Time) ([]Sample, error) {
	t.rd.SetDeadline(deadline)
	for {
		err := t.rd.ReadInto(&t.rec)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return dst, nil
		}
		if err != nil {
			return dst, err
		}
		if s, ok := DecodeSample(t.rec.RawSample); ok {
			dst = append(dst, s)
		}
	}
}

// Close closes the reader (interrupting a Read).
func (t *TraceReader) Close() error { return t.rd.Close() }

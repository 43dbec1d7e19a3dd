package sim

import (
	"bufio"
	"bytes"
	"cmp"
	"embed"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/softrnic/softrnic/clock"
)

// The flow-size distributions of the HPCC paper's evaluation, in HPCC's
// traffic_gen format: one "size_bytes cumulative_percent" pair per line,
// from "0 0" to "max 100", sizes drawn by linear interpolation.
//
//go:embed cdf/*.txt
var cdfFiles embed.FS

// CDFNames are the built-in distributions.
var CDFNames = []string{"websearch", "fbhadoop"}

// CDF is a flow-size distribution.
type CDF struct {
	Name string
	X, Y []float64 // sizes (bytes) and cumulative percentages
}

// LoadCDF returns a built-in distribution by name or reads a file.
func LoadCDF(name string) (*CDF, error) {
	var b []byte
	var err error
	if slices.Contains(CDFNames, name) {
		b, err = cdfFiles.ReadFile("cdf/" + name + ".txt")
	} else {
		b, err = os.ReadFile(name)
	}
	if err != nil {
		return nil, fmt.Errorf("sim: CDF %q: %w (built in: %s)", name, err, strings.Join(CDFNames, ", "))
	}
	c, err := ParseCDF(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("sim: CDF %q: %w", name, err)
	}
	c.Name = name
	return c, nil
}

// ParseCDF reads the traffic_gen format and checks what custom_rand.py's
// testCdf checks: it starts at 0 %, ends at 100 %, and both columns
// strictly increase.
func ParseCDF(r io.Reader) (*CDF, error) {
	c := &CDF{}
	sc := bufio.NewScanner(r)
	for line := 1; sc.Scan(); line++ {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		if len(f) != 2 {
			return nil, fmt.Errorf("line %d: want \"size percent\"", line)
		}
		x, err1 := strconv.ParseFloat(f[0], 64)
		y, err2 := strconv.ParseFloat(f[1], 64)
		if err1 != nil || err2 != nil || math.IsNaN(x) || math.IsInf(x, 0) || math.IsNaN(y) {
			return nil, fmt.Errorf("line %d: bad numbers", line)
		}
		if k := len(c.X); k > 0 && (x <= c.X[k-1] || y <= c.Y[k-1]) {
			return nil, fmt.Errorf("line %d: sizes and percentages must increase", line)
		}
		c.X, c.Y = append(c.X, x), append(c.Y, y)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(c.X) < 2 || c.Y[0] != 0 || c.Y[len(c.Y)-1] != 100 || c.X[0] < 0 {
		return nil, fmt.Errorf("want at least two points from a size ≥ 0 at 0 %% to 100 %%")
	}
	return c, nil
}

// Mean is the distribution's mean size (custom_rand.py's getAvg: the
// trapezoid rule over the interpolated CDF).
func (c *CDF) Mean() float64 {
	var s float64
	for i := 1; i < len(c.X); i++ {
		s += (c.X[i] + c.X[i-1]) / 2 * (c.Y[i] - c.Y[i-1])
	}
	return s / 100
}

// At is the size at percentile p in [0, 100] by linear interpolation
// (getValueFromPercentile).
func (c *CDF) At(p float64) float64 {
	for i := 1; i < len(c.X); i++ {
		if p <= c.Y[i] {
			return c.X[i-1] + (c.X[i]-c.X[i-1])/(c.Y[i]-c.Y[i-1])*(p-c.Y[i-1])
		}
	}
	return c.X[len(c.X)-1]
}

// Draw is one flow size: int(At(100·U)), at least 1 byte.
func (c *CDF) Draw(r *rand.Rand) int64 {
	return max(int64(c.At(r.Float64()*100)), 1)
}

// Ports of fct.txt: background flows go to 100, incast flows to 200 (as
// HPCC's traffic_gen and fct_analysis.py use them); source ports count from
// 10000 per host pair.
const (
	dportBackground = 100
	dportIncast     = 200
	firstSport      = 10000
)

// workload is the workload scenario's state.
type workload struct {
	cdf     *CDF
	meanIA  float64 // mean inter-arrival per host, ns
	hosts   []int32
	fct     []byte // fct.txt, in completion order
	done    []flowDone
	offered int64 // payload bytes of the flows that arrived in Duration
	incasts int   // incast bursts
	err     error
}

// flowDone is a finished flow as fct.txt has it.
type flowDone struct {
	size              int64
	start, fct, alone clock.Time
	incast            bool
}

// Slowdown is FCT over the standalone FCT, floored at 1.
func (d flowDone) Slowdown() float64 { return max(float64(d.fct)/float64(d.alone), 1) }

// workload draws the flows: at every host a Poisson process of mean gap
// mean_size·8/(LinkRate·Load) (traffic_gen.py), each flow to a uniformly
// random other host with a size from the CDF; plus the incast bursts. Each
// host draws from its own PCG stream, so the flows of one host do not
// depend on the others'.
func (b *builder) workload() error {
	o, n := b.o, b.n
	cdf, err := LoadCDF(o.CDF)
	if err != nil {
		return err
	}
	nh := len(b.hosts)
	if o.IncastFanIn >= nh {
		return fmt.Errorf("sim: incast fan-in %d needs more than %d hosts", o.IncastFanIn, nh)
	}
	w := &workload{cdf: cdf, hosts: b.hosts}
	w.meanIA = cdf.Mean() * 8 / (float64(o.LinkRate) * o.Load) * 1e9
	n.work = w
	type arrival struct {
		at       clock.Time
		src, dst int32
		size     int64
		incast   bool
	}
	var arr []arrival
	horizon := clock.Time(o.Duration)
	for s := 0; s < nh; s++ {
		r := rand.New(rand.NewPCG(o.Seed, 0x3f10_0000+uint64(s)))
		t := clock.Time(0)
		for {
			t += clock.Time(-math.Log(1-r.Float64()) * w.meanIA)
			if t >= horizon {
				break
			}
			d := r.IntN(nh - 1)
			if d >= s {
				d++
			}
			arr = append(arr, arrival{at: t, src: int32(s), dst: int32(d), size: cdf.Draw(r)})
		}
	}
	if o.IncastFanIn > 0 {
		r := rand.New(rand.NewPCG(o.Seed, 0x1ca5_7000))
		perm := make([]int32, nh)
		for t := clock.Time(o.IncastEvery); t < horizon; t += clock.Time(o.IncastEvery) {
			dst := int32(r.IntN(nh))
			for i := range perm {
				perm[i] = int32(i)
			}
			perm[dst], perm[nh-1] = perm[nh-1], perm[dst]
			for i := 0; i < o.IncastFanIn; i++ { // a partial shuffle of the others
				j := i + r.IntN(nh-1-i)
				perm[i], perm[j] = perm[j], perm[i]
				arr = append(arr, arrival{at: t, src: perm[i], dst: dst, size: o.IncastSize, incast: true})
			}
			w.incasts++
		}
	}
	slices.SortStableFunc(arr, func(a, b arrival) int { return cmp.Compare(a.at, b.at) })
	sport := make(map[[2]int32]uint16)
	for _, a := range arr {
		src, dst := b.hosts[a.src], b.hosts[a.dst]
		f := b.flow(src, dst, time.Duration(a.at), a.size)
		k := [2]int32{a.src, a.dst}
		p, ok := sport[k]
		if !ok {
			p = firstSport
		}
		sport[k] = p + 1
		f.sport, f.incast = p, a.incast
		w.offered += a.size
	}
	return nil
}

// attach gives a starting flow its controller.
func (w *workload) attach(n *net, f *flow) {
	if err := n.alg.attach(f); err != nil && w.err == nil {
		w.err = err
	}
}

// finished records a flow whose last byte has been acknowledged: its
// fct.txt line (HPCC ns-3's qp_finish: standalone FCT = base RTT + the
// flow's bytes with headers but no INT at the path's slowest rate) and
// frees its controller.
func (w *workload) finished(n *net, f *flow) {
	p := n.path(f.src, f.dst, n.payload)
	pkts := (f.size-1)/int64(n.payload) + 1
	total := f.size + pkts*int64(n.hdr)
	alone := p.baseRTT() + clock.Time(total*8_000_000_000/int64(p.bw))
	d := flowDone{size: f.size, start: f.start, fct: f.done - f.start, alone: alone, incast: f.incast}
	w.done = append(w.done, d)
	dport := dportBackground
	if f.incast {
		dport = dportIncast
	}
	b := w.fct
	b = appendHex8(b, hostIP(n.nodes[f.src].host))
	b = append(b, ' ')
	b = appendHex8(b, hostIP(n.nodes[f.dst].host))
	b = append(b, ' ')
	b = strconv.AppendUint(b, uint64(f.sport), 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, int64(dport), 10)
	for _, v := range []int64{f.size, int64(f.start), int64(d.fct), int64(alone)} {
		b = append(b, ' ')
		b = strconv.AppendInt(b, v, 10)
	}
	w.fct = append(b, '\n')
	n.alg.detach(f)
}

// hostIP is HPCC ns-3's node_id_to_ip: 11.0.x.1 style addresses.
func hostIP(id int32) uint32 {
	return 0x0b000001 + uint32(id/256)*0x00010000 + uint32(id%256)*0x00000100
}

func appendHex8(b []byte, v uint32) []byte {
	const digits = "0123456789abcdef"
	for s := 28; s >= 0; s -= 4 {
		b = append(b, digits[v>>uint(s)&0xf])
	}
	return b
}

// SlowdownBucket is one row of fct_analysis.py's table: the flows sorted by
// size are cut into buckets of Step % of the flows; each bucket reports its
// largest size and the median, 95th and 99th percentile FCT slowdown.
type SlowdownBucket struct {
	Pct      float64 `json:"pct"` // the bucket's lower edge, in % of flows
	MaxBytes int64   `json:"max_size_bytes"`
	Count    int     `json:"count"`
	P50      float64 `json:"p50"`
	P95      float64 `json:"p95"`
	P99      float64 `json:"p99"`
}

// SlowdownStats are the slowdown percentiles of a set of flows.
type SlowdownStats struct {
	Count int     `json:"count"`
	P50   float64 `json:"p50"`
	P95   float64 `json:"p95"`
	P99   float64 `json:"p99"`
	Mean  float64 `json:"mean"`
}

// pctl is fct_analysis.py's get_pctl: a[int(len·p)] of sorted a.
func pctl(a []float64, p float64) float64 { return a[min(int(float64(len(a))*p), len(a)-1)] }

// SlowdownTable buckets flows as fct_analysis.py does (type 0: the
// background flows, those with dport 100; incast flows are left out):
// sorted by size (ties by slowdown, as its sort falls back to the whole
// line), bucket i holds flows [i·step·n/100, (i+1)·step·n/100).
func SlowdownTable(done []flowDone, step int) []SlowdownBucket {
	type fs struct {
		size int64
		s    float64
	}
	var a []fs
	for _, d := range done {
		if !d.incast {
			a = append(a, fs{d.size, d.Slowdown()})
		}
	}
	slices.SortFunc(a, func(x, y fs) int { return cmp.Or(cmp.Compare(x.size, y.size), cmp.Compare(x.s, y.s)) })
	var out []SlowdownBucket
	n := len(a)
	for i := 0; i < 100; i += step {
		l, r := i*n/100, (i+step)*n/100
		if r <= l {
			continue
		}
		s := make([]float64, 0, r-l)
		for _, x := range a[l:r] {
			s = append(s, x.s)
		}
		slices.Sort(s)
		out = append(out, SlowdownBucket{Pct: float64(i), MaxBytes: a[r-1].size, Count: r - l,
			P50: pctl(s, 0.5), P95: pctl(s, 0.95), P99: pctl(s, 0.99)})
	}
	return out
}

// SlowdownOf is the slowdown percentiles of the background flows with
// lo < size ≤ hi.
func SlowdownOf(done []flowDone, lo, hi int64) *SlowdownStats {
	var s []float64
	var sum float64
	for _, d := range done {
		if !d.incast && d.size > lo && d.size <= hi {
			s = append(s, d.Slowdown())
			sum += d.Slowdown()
		}
	}
	if len(s) == 0 {
		return nil
	}
	slices.Sort(s)
	return &SlowdownStats{Count: len(s), P50: pctl(s, 0.5), P95: pctl(s, 0.95), P99: pctl(s, 0.99), Mean: sum / float64(len(s))}
}

// IncastSlowdown is the slowdown percentiles of the incast flows.
func IncastSlowdown(done []flowDone) *SlowdownStats {
	var inc []flowDone
	for _, d := range done {
		if d.incast {
			d.incast = false
			inc = append(inc, d)
		}
	}
	return SlowdownOf(inc, 0, math.MaxInt64)
}

// ParseFCT reads fct.txt lines back (for merging runs): size, start, fct,
// standalone and whether the flow was an incast flow.
func ParseFCT(r io.Reader) ([]flowDone, error) {
	var out []flowDone
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for line := 1; sc.Scan(); line++ {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		if len(f) != 8 {
			return nil, fmt.Errorf("fct.txt line %d: want 8 fields", line)
		}
		var v [5]int64
		for i, k := range []int{3, 4, 5, 6, 7} {
			x, err := strconv.ParseInt(f[k], 10, 64)
			if err != nil || x < 0 {
				return nil, fmt.Errorf("fct.txt line %d: field %d: %q", line, k+1, f[k])
			}
			v[i] = x
		}
		if v[4] <= 0 {
			return nil, fmt.Errorf("fct.txt line %d: standalone FCT must be > 0", line)
		}
		out = append(out, flowDone{size: v[1], start: clock.Time(v[2]), fct: clock.Time(v[3]), alone: clock.Time(v[4]), incast: v[0] == dportIncast})
	}
	return out, sc.Err()
}

// WorkloadSummary is summary.json's account of a workload run.
type WorkloadSummary struct {
	Topology    string  `json:"topology"`
	Hosts       int     `json:"hosts"`
	Switches    int     `json:"switches"`
	HostGbps    float64 `json:"host_gbps"`
	UplinkGbps  float64 `json:"uplink_gbps"`
	Oversub     float64 `json:"oversubscription"`
	BaseRTTUs   float64 `json:"max_base_rtt_us"`
	CDF         string  `json:"cdf"`
	MeanBytes   float64 `json:"mean_flow_bytes"`
	Load        float64 `json:"load"`
	IncastFanIn int     `json:"incast_fan_in,omitempty"`
	IncastBytes int64   `json:"incast_bytes,omitempty"`
	Incasts     int     `json:"incast_bursts,omitempty"`

	FlowsArrived  int `json:"flows_arrived"`
	FlowsFinished int `json:"flows_finished"`
	// OfferedLoad is the payload of the flows that arrived, over the hosts'
	// capacity for Duration; DeliveredLoad the payload received over it for
	// the whole run (Duration plus drain).
	OfferedLoad   float64 `json:"offered_load"`
	DeliveredLoad float64 `json:"delivered_load"`
	// Queue figures are over every switch port, sampled every 10 µs.
	QueueMeanKB float64 `json:"queue_mean_kb"`
	QueueP99KB  float64 `json:"queue_p99_kb"`
	QueueMaxKB  float64 `json:"queue_max_kb"`

	// Slowdown is fct_analysis.py's table over the background flows.
	Slowdown []SlowdownBucket `json:"slowdown"`
	// Small, Medium and Large summarise the background flows of ≤ 100 KB,
	// 100 KB–1 MB and > 1 MB.
	Small  *SlowdownStats `json:"small_le_100kb,omitempty"`
	Medium *SlowdownStats `json:"medium_100kb_1mb,omitempty"`
	Large  *SlowdownStats `json:"large_gt_1mb,omitempty"`
	// Incast summarises the incast flows.
	Incast *SlowdownStats `json:"incast,omitempty"`
}

// SlowdownStep is fct_analysis.py's default bucket step, % of the flows.
const SlowdownStep = 5

func (n *net) summarizeWorkload(o *Options, s *Summary) {
	w := n.work
	ws := &WorkloadSummary{Topology: o.Topology, HostGbps: o.LinkRate.Gbps(), UplinkGbps: o.UplinkRate.Gbps(),
		Oversub: o.Oversub, BaseRTTUs: n.cfg.BaseRTTUs, CDF: w.cdf.Name, MeanBytes: w.cdf.Mean(), Load: o.Load,
		Incasts: w.incasts, FlowsArrived: len(n.flows), FlowsFinished: len(w.done)}
	if o.IncastFanIn > 0 {
		ws.IncastFanIn, ws.IncastBytes = o.IncastFanIn, o.IncastSize
	}
	for i := range n.nodes {
		if n.nodes[i].kind == hostNode {
			ws.Hosts++
		} else {
			ws.Switches++
		}
	}
	var rcvd int64
	for i := range n.flows {
		rcvd += n.flows[i].rcvd
	}
	capBits := float64(ws.Hosts) * float64(o.LinkRate)
	ws.OfferedLoad = float64(w.offered) * 8 / (capBits * o.Duration.Seconds())
	ws.DeliveredLoad = float64(rcvd) * 8 / (capBits * float64(n.end) / 1e9)
	sm := &n.sampler
	if sm.qSamples > 0 {
		var tot float64
		for b, k := range sm.qHist {
			tot += (float64(b) + 0.5) * float64(k)
		}
		ws.QueueMeanKB = tot / float64(sm.qSamples)
		ws.QueueP99KB = histPctl(sm.qHist, sm.qSamples, 0.99)
	}
	for _, pi := range sm.traced {
		ws.QueueMaxKB = max(ws.QueueMaxKB, float64(n.ports[pi].maxQ)/1e3)
	}
	ws.Slowdown = SlowdownTable(w.done, SlowdownStep)
	ws.Small = SlowdownOf(w.done, 0, 100_000)
	ws.Medium = SlowdownOf(w.done, 100_000, 1_000_000)
	ws.Large = SlowdownOf(w.done, 1_000_000, math.MaxInt64)
	ws.Incast = IncastSlowdown(w.done)
	s.Workload = ws
	s.Utilization = ws.DeliveredLoad
	s.QueueMeanKB, s.QueueMaxKB = ws.QueueMeanKB, ws.QueueMaxKB
}

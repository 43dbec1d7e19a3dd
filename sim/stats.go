package sim

import (
	"math"
	"slices"
	"syscall"
	"time"

	"github.com/softrnic/softrnic/clock"
)

// statEvery is the bottleneck queue sampling period for the statistics.
const statEvery = clock.Time(time.Microsecond)

// sampler records the bottleneck queue every µs inside the measurement
// window (for mean and percentiles) and, every trace interval, one row of
// rates, α and queues for the traces.
type sampler struct {
	traceEvery clock.Time
	qWindow    []int32 // bottleneck queue bytes, one per µs in the window
	trace      Trace
	traced     []int32 // ports with a queue trace
}

func (n *net) startSampler(traceEvery clock.Time) {
	s := &n.sampler
	s.traceEvery = traceEvery
	for i := range n.ports {
		if n.nodes[n.ports[i].node].kind == switchNode {
			s.traced = append(s.traced, int32(i))
			s.trace.Ports = append(s.trace.Ports, PortTrace{Name: n.ports[i].name})
		}
	}
	for i := range n.flows {
		f := &n.flows[i]
		s.trace.Flows = append(s.trace.Flows, FlowTrace{ID: i,
			Name: n.nodes[f.src].name + "->" + n.nodes[f.dst].name})
	}
	n.schedule(0, evSample, -1, -1, 0)
}

func (n *net) sample() {
	s := &n.sampler
	now := n.now
	if now >= n.window[0] && now < n.window[1] {
		s.qWindow = append(s.qWindow, int32(min(n.ports[n.bottleneck].qBytes, math.MaxInt32)))
	}
	if now%s.traceEvery == 0 {
		t := &s.trace
		t.TimesUs = append(t.TimesUs, float64(now)/1e3)
		for i := range n.flows {
			f := &n.flows[i]
			ft := &t.Flows[i]
			rc, rt := 0.0, 0.0
			if f.started && (f.size == 0 || f.sent < f.size) {
				rc, rt = f.rp.Rate().Gbps(), f.rp.Target().Gbps()
			}
			ft.RateGbps = append(ft.RateGbps, float32(rc))
			ft.TargetGbps = append(ft.TargetGbps, float32(rt))
			ft.Alpha = append(ft.Alpha, float32(f.rp.AlphaAt(now)))
		}
		for k, pi := range s.traced {
			t.Ports[k].QueueKB = append(t.Ports[k].QueueKB, float32(float64(n.ports[pi].qBytes)/1e3))
		}
	}
	if next := now + statEvery; next <= n.end {
		n.schedule(next, evSample, -1, -1, 0)
	}
}

// Trace is a run's time series, for CSV files and plots.
type Trace struct {
	TimesUs []float64   // sample times of the rows below, µs
	Flows   []FlowTrace // per flow: R_C, R_T, α
	Ports   []PortTrace // per switch port: queue
	// Throughput is each flow's received rate per BinMs bin, Gb/s.
	BinMs      float64
	Throughput [][]float64
}

// FlowTrace is one flow's reaction-point state over time.
type FlowTrace struct {
	ID                   int
	Name                 string
	RateGbps, TargetGbps []float32
	Alpha                []float32
}

// PortTrace is one switch port's data queue over time.
type PortTrace struct {
	Name    string
	QueueKB []float32
}

// FlowSummary is one flow's line in summary.json.
type FlowSummary struct {
	ID          int      `json:"id"`
	Path        string   `json:"path"`
	StartMs     float64  `json:"start_ms"`
	MeanGbps    float64  `json:"mean_gbps"`
	Bytes       int64    `json:"bytes_received"`
	FCTUs       *float64 `json:"fct_us,omitempty"`
	CNPSent     uint64   `json:"np_cnp_sent"`
	CNPReceived uint64   `json:"cnp_received"`
	CNPHandled  uint64   `json:"rp_cnp_handled"`
	CNPIgnored  uint64   `json:"rp_cnp_ignored"`
	Cuts        uint64   `json:"rate_cuts"`
	FinalGbps   float64  `json:"final_rate_gbps"`
	FinalAlpha  float64  `json:"final_alpha"`
}

// Summary is summary.json: the run's figures over the measurement window.
type Summary struct {
	Scenario   string  `json:"scenario"`
	Profile    string  `json:"profile"`
	Seed       uint64  `json:"seed"`
	DurationMs float64 `json:"duration_ms"`
	Bottleneck string  `json:"bottleneck"`
	LinkGbps   float64 `json:"link_gbps"`
	// Config is what the run ran with: profile, knobs, RP/NP, marking.
	Config RunConfig `json:"config"`

	Flows    []FlowSummary `json:"flows"`
	WindowMs [2]float64    `json:"window_ms"`
	// Jain is Jain's index over the flows' window means (for incast, over
	// the incast senders only).
	Jain float64 `json:"jain"`
	// Utilization is bytes the bottleneck sent in the window over its
	// capacity.
	Utilization float64 `json:"utilization"`
	QueueMeanKB float64 `json:"queue_mean_kb"`
	QueueP5KB   float64 `json:"queue_p5_kb"`
	QueueP95KB  float64 `json:"queue_p95_kb"`
	QueueMaxKB  float64 `json:"queue_max_kb"`
	// ConvergenceMs is the time from the last flow's start until every
	// flow's 1 ms rate stays within ±10 % of the fair share for 5 ms; null
	// if that never happens (or for incast, where it is not defined).
	ConvergenceMs *float64 `json:"convergence_ms"`

	CNPCount  uint64 `json:"cnp_count"`
	ECNMarked uint64 `json:"np_ecn_marked_roce_packets"`
	Marks     uint64 `json:"switch_ce_marks"`
	Drops     uint64 `json:"drops"`
	Pauses    uint64 `json:"pfc_pauses"`
	PFC       bool   `json:"pfc"`

	Events       uint64  `json:"events"`
	EventsPerSec float64 `json:"events_per_sec"`
	WallSeconds  float64 `json:"wall_seconds"`
	// CPUSeconds is the process's CPU time during the run, and
	// EventsPerCPUSec the speed on it: on a shared machine the wall-clock
	// figure understates the simulator.
	CPUSeconds      float64 `json:"cpu_seconds"`
	EventsPerCPUSec float64 `json:"events_per_cpu_sec"`

	// Fluid is the fluid model's prediction for the same flow count, where
	// the scenario has one (two-flow, n-flow with the paper profile).
	Fluid *FluidRef `json:"fluid,omitempty"`
	// VictimGbps is the incast victim's mean rate in the window.
	VictimGbps *float64 `json:"victim_gbps,omitempty"`
}

// FluidRef is the fluid model's steady state quoted beside a DES run.
type FluidRef struct {
	QueueMeanKB float64 `json:"queue_mean_kb"`
	QueueMinKB  float64 `json:"queue_min_kb"`
	QueueMaxKB  float64 `json:"queue_max_kb"`
	RateGbps    float64 `json:"rate_gbps"`
	TauStarUs   float64 `json:"tau_star_us"`
}

// setWindow picks the measurement window, on whole milliseconds: the last
// 20 ms of runs of 40 ms or more (two-flow: 90–110 ms), the second half of
// shorter ones, and for incast the incast itself (its start plus the
// time its bytes need at line rate, rounded up, plus 1 ms).
func (n *net) setWindow(o *Options) {
	ms := clock.Time(time.Millisecond)
	end := n.end / ms * ms
	start := end / 2 / ms * ms
	if end >= 40*ms {
		start = end - 20*ms
	}
	if o.WindowStart > 0 {
		start = clock.Time(o.WindowStart)
	}
	if o.Scenario == Incast {
		need := float64(o.Flows) * float64(o.IncastSize) * 8 / float64(o.LinkRate) // s
		start = clock.Time(o.IncastStart) / ms * ms
		end = min(end, start+clock.Time(math.Ceil(need*1e3)+1)*ms)
		if end <= start {
			end = start + ms
		}
	}
	n.window = [2]clock.Time{start, end}
}

func (n *net) summarize(o *Options) Summary {
	ms := clock.Time(time.Millisecond)
	s := Summary{
		Scenario: o.Scenario, Profile: o.Profile, Seed: o.Seed,
		DurationMs: float64(n.end) / 1e6, Bottleneck: n.ports[n.bottleneck].name,
		LinkGbps: o.LinkRate.Gbps(), Config: n.cfg, PFC: o.PFC, Events: n.events,
		WindowMs: [2]float64{float64(n.window[0]) / 1e6, float64(n.window[1]) / 1e6},
	}
	b0, b1 := int(n.window[0]/ms), int(n.window[1]/ms)
	winSec := float64(n.window[1]-n.window[0]) / 1e9
	var sum, sumSq float64
	jn := 0
	for i := range n.flows {
		f := &n.flows[i]
		var bytes int64
		for b := b0; b < b1 && b < len(f.bins); b++ {
			bytes += f.bins[b]
		}
		mean := float64(bytes) * 8 / winSec / 1e9
		fs := FlowSummary{ID: i, Path: n.nodes[f.src].name + "->" + n.nodes[f.dst].name,
			StartMs: float64(f.start) / 1e6, MeanGbps: mean, Bytes: f.rcvd,
			CNPSent: f.np.NPCNPSent, CNPReceived: f.cnpRcvd, CNPHandled: f.rp.RPCNPHandled,
			CNPIgnored: f.rp.RPCNPIgnored, Cuts: f.rp.Cuts, FinalGbps: f.rp.Rate().Gbps(),
			FinalAlpha: f.rp.AlphaAt(n.end)}
		if f.finish >= 0 {
			fct := float64(f.finish-f.start) / 1e3
			fs.FCTUs = &fct
		}
		s.Flows = append(s.Flows, fs)
		s.CNPCount += f.np.NPCNPSent
		s.ECNMarked += f.np.NPECNMarkedRoCEPackets
		if o.Scenario == Incast && i == 0 {
			continue // Jain is over the incast senders, not the victim
		}
		sum += mean
		sumSq += mean * mean
		jn++
	}
	if sumSq > 0 {
		s.Jain = sum * sum / (float64(jn) * sumSq)
	}
	bp := &n.ports[n.bottleneck]
	s.Utilization = float64(bp.txBytesWindow) * 8 / (float64(bp.rate) * winSec)
	for i := range n.ports {
		s.Marks += n.ports[i].marks
		s.Drops += n.ports[i].drops
		s.Pauses += n.ports[i].pauses
	}
	if q := n.sampler.qWindow; len(q) > 0 {
		var tot float64
		sorted := slices.Clone(q)
		slices.Sort(sorted)
		for _, v := range q {
			tot += float64(v)
		}
		s.QueueMeanKB = tot / float64(len(q)) / 1e3
		s.QueueP5KB = float64(sorted[len(sorted)*5/100]) / 1e3
		s.QueueP95KB = float64(sorted[min(len(sorted)*95/100, len(sorted)-1)]) / 1e3
		s.QueueMaxKB = float64(sorted[len(sorted)-1]) / 1e3
	}
	if o.Scenario == Incast {
		v := s.Flows[0].MeanGbps
		s.VictimGbps = &v
	} else {
		s.ConvergenceMs = n.convergence(o)
	}
	return s
}

// convergence finds the first 1 ms bin after the last flow's start from
// which every flow's rate stays within ±10 % of C/N for 5 bins.
func (n *net) convergence(o *Options) *float64 {
	ms := clock.Time(time.Millisecond)
	var last clock.Time
	for i := range n.flows {
		last = max(last, n.flows[i].start)
	}
	fair := o.LinkRate.Gbps() / float64(len(n.flows))
	nb := int(n.end / ms)
	ok := func(b int) bool {
		for i := range n.flows {
			var v int64
			if b < len(n.flows[i].bins) {
				v = n.flows[i].bins[b]
			}
			g := float64(v) * 8 / 1e6 // bytes per ms → Gb/s
			if math.Abs(g-fair) > 0.1*fair {
				return false
			}
		}
		return true
	}
	run := 0
	for b := int((last + ms - 1) / ms); b < nb; b++ {
		if ok(b) {
			run++
			if run == 5 {
				c := float64(clock.Time(b-4)*ms-last) / 1e6
				return &c
			}
		} else {
			run = 0
		}
	}
	return nil
}

func (n *net) throughput() (binMs float64, tp [][]float64) {
	w := n.traceWidth
	nb := int(n.end / w)
	for i := range n.flows {
		bins := n.flows[i].bins
		if w != n.binWidth {
			bins = n.flows[i].tbins
		}
		row := make([]float64, nb)
		for b := 0; b < nb && b < len(bins); b++ {
			row[b] = float64(bins[b]) * 8 / float64(w)
		}
		tp = append(tp, row)
	}
	return float64(w) / 1e6, tp
}

// Result is a finished run.
type Result struct {
	Options Options
	Summary Summary
	Trace   Trace
}

// Run simulates one scenario. It reads the wall clock only to report
// events_per_sec; everything else is a function of the Options.
func Run(o Options) (*Result, error) {
	if err := o.Defaults(); err != nil {
		return nil, err
	}
	n, err := build(&o)
	if err != nil {
		return nil, err
	}
	n.setWindow(&o)
	n.startSampler(clock.Time(o.TraceInterval))
	t0, c0 := time.Now(), cpuTime()
	n.run()
	wall, cpu := time.Since(t0).Seconds(), cpuTime()-c0
	s := n.summarize(&o)
	s.Fluid = fluidRef(&o)
	s.WallSeconds = wall
	if wall > 0 {
		s.EventsPerSec = float64(n.events) / wall
	}
	if cpu > 0 {
		s.CPUSeconds = cpu
		s.EventsPerCPUSec = float64(n.events) / cpu
	}
	res := &Result{Options: o, Summary: s, Trace: n.sampler.trace}
	res.Trace.BinMs, res.Trace.Throughput = n.throughput()
	return res, nil
}

// cpuTime is the process's user+system CPU time in seconds, 0 if unknown.
func cpuTime() float64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

package sim

import (
	"math"
	"slices"
	"syscall"
	"time"

	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/congestion"
)

// statEvery is the bottleneck queue sampling period for the statistics.
const statEvery = clock.Time(time.Microsecond)

// sampler records the bottleneck queue every µs inside the measurement
// window (for mean and percentiles) and, every trace interval, one row of
// rates, the algorithm's columns and queues for the traces. In the
// workload it samples every switch port's queue into qHist instead.
type sampler struct {
	traceEvery clock.Time
	qWindow    []int32 // bottleneck queue bytes, one per µs in the window
	trace      Trace
	traced     []int32  // ports with a queue trace (workload: every switch port)
	qHist      []uint64 // workload: queue samples per 1 KB bin
	qSamples   uint64
}

// queueEvery is the workload's queue sampling period.
const queueEvery = clock.Time(10 * time.Microsecond)

func (n *net) sampleQueues() {
	s := &n.sampler
	for _, pi := range s.traced {
		b := int(n.ports[pi].qBytes / 1000)
		for len(s.qHist) <= b {
			s.qHist = append(s.qHist, 0)
		}
		s.qHist[b]++
	}
	s.qSamples += uint64(len(s.traced))
}

// histPctl is the p-quantile of the histogram, in KB (the bin's upper edge).
func histPctl(h []uint64, total uint64, p float64) float64 {
	if total == 0 {
		return 0
	}
	want := uint64(math.Ceil(p * float64(total)))
	var c uint64
	for b, k := range h {
		c += k
		if c >= max(want, 1) {
			return float64(b + 1)
		}
	}
	return float64(len(h))
}

func (n *net) startSampler(traceEvery clock.Time) {
	s := &n.sampler
	s.traceEvery = traceEvery
	if n.work != nil {
		// No per-flow traces: every switch port's queue every 10 µs,
		// into a histogram of 1 KB bins.
		s.traceEvery = queueEvery
		for i := range n.ports {
			if n.nodes[n.ports[i].node].kind == switchNode {
				s.traced = append(s.traced, int32(i))
			}
		}
		n.schedule(0, evSample, -1, -1, 0)
		return
	}
	s.trace.Cols = [2]string{n.alg.cols[0].name, n.alg.cols[1].name}
	s.trace.Labels = [2]string{n.alg.cols[0].label, n.alg.cols[1].label}
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
	if n.work != nil {
		n.sampleQueues()
		if next := now + s.traceEvery; next <= n.end {
			n.schedule(next, evSample, -1, -1, 0)
		}
		return
	}
	if now >= n.window[0] && now < n.window[1] {
		s.qWindow = append(s.qWindow, int32(min(n.ports[n.bottleneck].qBytes, math.MaxInt32)))
	}
	if now%s.traceEvery == 0 {
		t := &s.trace
		t.TimesUs = append(t.TimesUs, float64(now)/1e3)
		for i := range n.flows {
			f := &n.flows[i]
			ft := &t.Flows[i]
			var r, a, b float64
			if f.cc != nil {
				r, a, b = n.alg.sample(f, now)
			}
			if !f.started || (f.size > 0 && f.sent >= f.size) {
				// Not sending: no rate (DCQCN's α still decays).
				r, a = 0, 0
			}
			ft.RateGbps = append(ft.RateGbps, float32(r))
			ft.A = append(ft.A, float32(a))
			ft.B = append(ft.B, float32(b))
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
	Flows   []FlowTrace // per flow: rate and two columns
	// Cols name the flows' two columns (flows.csv header) and Labels
	// their axes.
	Cols, Labels [2]string
	Ports        []PortTrace // per switch port: queue
	// Throughput is each flow's received rate per BinMs bin, Gb/s.
	BinMs      float64
	Throughput [][]float64
}

// FlowTrace is one flow's controller state over time: its rate and the
// algorithm's two trace columns (Trace.Cols; DCQCN: R_T and α).
type FlowTrace struct {
	ID       int
	Name     string
	RateGbps []float32
	A, B     []float32
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
	// FinalWindowKB is a window algorithm's window at the end.
	FinalWindowKB float64 `json:"final_window_kb,omitempty"`
	// FinalAlpha is DCQCN's α at the end.
	FinalAlpha float64 `json:"final_alpha,omitempty"`
}

// Summary is summary.json: the run's figures over the measurement window.
type Summary struct {
	Scenario   string  `json:"scenario"`
	Algorithm  string  `json:"algorithm"`
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
	// QueuePeakKB is the bottleneck queue's largest value over the whole
	// run (exact, not sampled).
	QueuePeakKB float64 `json:"queue_peak_kb"`
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
	// Workload is the workload scenario's figures.
	Workload *WorkloadSummary `json:"workload,omitempty"`
	// Seeds and Runs are set on a merge of several seeds' workload runs
	// (MergeWorkload): Workload's tables are then over all their flows.
	Seeds []uint64  `json:"seeds,omitempty"`
	Runs  []SeedRun `json:"runs,omitempty"`
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
	if o.Scenario == Workload {
		start, end = 0, n.end
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
		Scenario: o.Scenario, Algorithm: o.Algorithm, Profile: o.Profile, Seed: o.Seed,
		DurationMs: float64(n.end) / 1e6,
		LinkGbps:   o.LinkRate.Gbps(), Config: n.cfg, PFC: o.PFC, Events: n.events,
		WindowMs: [2]float64{float64(n.window[0]) / 1e6, float64(n.window[1]) / 1e6},
	}
	for i := range n.ports {
		s.Marks += n.ports[i].marks
		s.Drops += n.ports[i].drops
		s.Pauses += n.ports[i].pauses
	}
	if n.work != nil {
		n.summarizeWorkload(o, &s)
		return s
	}
	s.Bottleneck = n.ports[n.bottleneck].name
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
			CNPSent: f.np.NPCNPSent, CNPReceived: f.cnpRcvd}
		if f.cc != nil {
			fs.FinalGbps = f.cc.Rate().Gbps()
			if w := f.cc.Window(); w != congestion.NoWindow {
				fs.FinalWindowKB = float64(w) / 1e3
			}
		}
		if f.rp != nil {
			fs.CNPHandled, fs.CNPIgnored, fs.Cuts = f.rp.RPCNPHandled, f.rp.RPCNPIgnored, f.rp.Cuts
			fs.FinalAlpha = f.rp.AlphaAt(n.end)
		}
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
	s.QueuePeakKB = float64(bp.maxQ) / 1e3
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
	// FCT is the workload's fct.txt (HPCC ns-3's format), nil otherwise.
	FCT []byte

	alg  *algorithm
	done []flowDone
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
	if n.work != nil && n.work.err != nil {
		return nil, n.work.err
	}
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
	res := &Result{Options: o, Summary: s, Trace: n.sampler.trace, alg: n.alg}
	if n.work != nil {
		res.FCT, res.done = n.work.fct, n.work.done
		return res, nil
	}
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

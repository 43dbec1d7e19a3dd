package testbed

import (
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/softrnic/softrnic/lab/dcqcnlive/internal/ecnmark"
)

// Experiment is the two-flow live experiment: flow 1 h1→r from the start,
// flow 2 h2→r joining later, through the tbf bottleneck and the marker.
type Experiment struct {
	Plan      Plan
	Endpoints Endpoints
	// Duration is the wall time from flow 1's start to the end; Join is
	// when flow 2 starts.
	Duration, Join time.Duration
	// PayloadBytes is the RDMA payload per packet (1024: 1 KB packets, as
	// in the paper's fluid model).
	PayloadBytes int
	DSCP         uint8 // data packets carry DSCP<<2 | ECT(0) under DCQCN, Not-ECT otherwise
	// Bin is the width of the rate bins (default S × 1 ms); QueuePoll the
	// period of the tbf backlog polls (default 5 ms).
	Bin, QueuePoll time.Duration
	// RawLoad is, for endpoints that are not congestion-controlled, each
	// sender's fixed rate as a fraction of the bottleneck (default 0.75).
	RawLoad float64
	// Trace keeps the marker's per-packet samples (trace.csv).
	Trace bool
	// Resync sets the marker's virtual queue to tbf's backlog at every
	// queue poll (see ecnmark.Marker.Resync): on a loaded host the kernel
	// serves tbf late and the pure model drifts below the real queue.
	Resync bool
	// Out, when set, receives summary.json, rates.csv, queue.csv (and
	// trace.csv).
	Out string
	// Log, when set, gets progress lines.
	Log func(format string, args ...any)
	// Stop, when it delivers, ends the run early (still cleaning up).
	Stop <-chan os.Signal
	// Sim, if set, is the simulator's prediction for the same scaled
	// scenario (Predict), copied into the summary.
	Sim *Prediction
}

// sleepUntil waits until t or until Stop delivers; false means stopped.
func (e *Experiment) sleepUntil(t time.Time) bool {
	tm := time.NewTimer(time.Until(t))
	defer tm.Stop()
	select {
	case <-tm.C:
		return true
	case <-e.Stop:
		return false
	}
}

// FlowSummary is one flow's result.
type FlowSummary struct {
	ID         int              `json:"id"`
	Src        string           `json:"src"`
	MeanMbps   float64          `json:"mean_mbps"`  // over the window, at the bottleneck's output
	Normalised float64          `json:"normalised"` // MeanMbps / bottleneck rate
	Frames     uint64           `json:"frames"`     // through the bottleneck, whole run
	CEMarked   uint64           `json:"ce_marked"`  // of those, CE-marked
	CNPsSeen   uint64           `json:"cnps_seen"`  // CNPs from r to this flow's sender, seen at sw
	Endpoint   EndpointCounters `json:"endpoint"`
}

// QueueStats summarises the tbf backlog polls in the window.
type QueueStats struct {
	MeanKB float64 `json:"mean_kb"`
	P5KB   float64 `json:"p5_kb"`
	P95KB  float64 `json:"p95_kb"`
	// TrackMAEBytes is the mean absolute difference between the marker's
	// backlog estimate and tbf's backlog at the polls of the whole run
	// (with resync: the drift over one poll period).
	TrackMAEBytes float64 `json:"track_mae_bytes"`
	Polls         int     `json:"polls"` // polls in the window
}

// Summary is the experiment's result (summary.json).
type Summary struct {
	Endpoints            string           `json:"endpoints"`
	CongestionControlled bool             `json:"congestion_controlled"`
	Note                 string           `json:"note"`
	Algorithm            string           `json:"algorithm"`
	Profile              string           `json:"profile"`
	Scale                float64          `json:"scale"`
	BottleneckMbps       float64          `json:"bottleneck_mbps"`
	TbfBurstBytes        uint64           `json:"tbf_burst_bytes"`
	TbfLimitBytes        uint64           `json:"tbf_limit_bytes"`
	KminBytes            uint64           `json:"kmin_bytes"`
	KmaxBytes            uint64           `json:"kmax_bytes"`
	Pmax                 float64          `json:"pmax"`
	MarkerResync         bool             `json:"marker_resync"` // virtual queue reset to tbf\'s backlog at every poll
	DurationS            float64          `json:"duration_s"`
	JoinS                float64          `json:"join_s"`
	WindowS              [2]float64       `json:"window_s"` // [start, end] of the measurement window (last 20 %)
	Flows                []FlowSummary    `json:"flows"`
	Jain                 float64          `json:"jain"`
	Utilization          float64          `json:"utilization"`
	Queue                QueueStats       `json:"queue"`
	TbfDrops             uint32           `json:"tbf_drops"`
	Marker               ecnmark.Counters `json:"marker"`
	MonitorOther         uint64           `json:"monitor_other_frames"` // non-RoCEv2 frames at sw→r (ARP, TCP side channels, ICMP)
	Error                string           `json:"error,omitempty"`      // the run failed; figures are what was measured anyway
	// HostLoad is the host's 1-minute load average when the run started
	// and when it ended (/proc/loadavg): the run shares two cores with
	// whatever else runs, and a busy host sends less than DCQCN allows.
	HostLoad [2]float64 `json:"host_load1"`
	// RPSumMbps is the sum of what the senders' congestion control allowed
	// at the end (EndpointCounters.RPRateMbps; 0 if the endpoints do not
	// report it). SenderLimited is set when that allowed at least 95 % of
	// the bottleneck but the flows used less than 95 % of it: the hosts,
	// not the algorithm, held the flows back.
	RPSumMbps     float64 `json:"rp_sum_mbps"`
	SenderLimited bool    `json:"sender_limited"`
	// Sim is the simulator's prediction for the same scaled scenario.
	Sim *Prediction `json:"sim,omitempty"`
}

// QueuePoint is one poll of the bottleneck.
type QueuePoint struct {
	Ns         uint64 // CLOCK_MONOTONIC
	TbfBacklog uint32 // bytes
	VQBacklog  uint64 // the marker's estimate, bytes
}

// PollQueue reads tbf's backlog and the marker's estimate every period
// until stop is closed, appending to dst. With resync it then sets the
// marker's virtual queue to tbf's backlog (ecnmark.Marker.Resync), so the
// points record the drift over one period.
func (t *Topology) PollQueue(dst []QueuePoint, period time.Duration, resync bool, stop <-chan struct{}) ([]QueuePoint, error) {
	tk := time.NewTicker(period)
	defer tk.Stop()
	for {
		select {
		case <-stop:
			return dst, nil
		case <-tk.C:
		}
		st, err := t.BottleneckStats()
		now := monoNow()
		if err != nil {
			return dst, err
		}
		vq, err := t.Marker.BacklogAt(now)
		if err != nil {
			return dst, err
		}
		dst = append(dst, QueuePoint{Ns: now, TbfBacklog: st.BacklogBytes, VQBacklog: vq})
		if resync {
			if err := t.Marker.Resync(uint64(st.BacklogBytes), now); err != nil {
				return dst, err
			}
		}
	}
}

// TrackError is the mean absolute difference in bytes between the marker's
// estimate and tbf's backlog over pts (0 without points: JSON has no NaN).
func TrackError(pts []QueuePoint) float64 {
	if len(pts) == 0 {
		return 0
	}
	var s float64
	for _, p := range pts {
		s += math.Abs(float64(p.VQBacklog) - float64(p.TbfBacklog))
	}
	return s / float64(len(pts))
}

// Jain is Jain's fairness index of xs: (Σx)² / (n·Σx²), 1 when all are
// equal. It is undefined when every x is 0; it returns 0 then (nothing was
// shared, and JSON has no NaN).
func Jain(xs []float64) float64 {
	var s, s2 float64
	for _, x := range xs {
		s += x
		s2 += x * x
	}
	if s2 == 0 {
		return 0
	}
	return s * s / (float64(len(xs)) * s2)
}

// Run builds the topology, runs the experiment and removes everything
// again, even on failure.
func (e Experiment) Run() (sum Summary, err error) {
	logf := e.Log
	if logf == nil {
		logf = func(string, ...any) {}
	}
	if e.Duration <= 0 || e.Join < 0 || e.Join >= e.Duration {
		return sum, errors.New("testbed: need 0 ≤ join < duration")
	}
	if e.PayloadBytes == 0 {
		e.PayloadBytes = 1024
	}
	if e.Bin == 0 {
		e.Bin = time.Duration(e.Plan.Scale * float64(time.Millisecond))
	}
	if e.QueuePoll == 0 {
		e.QueuePoll = 5 * time.Millisecond
	}
	if e.RawLoad == 0 {
		e.RawLoad = 0.75
	}
	b := e.Plan.Bottleneck
	b.Marker.Trace = e.Trace
	b.Marker.WakeEvery = 64
	load0 := hostLoad1()
	topo, err := Build(b, 0)
	if err != nil {
		return sum, err
	}
	defer func() { err = errors.Join(err, topo.Close()) }()
	defer func() { err = errors.Join(err, e.Endpoints.Close()) }()
	logf("testbed: %s, %s at S=%g: bottleneck %.1f Mb/s, tbf burst %d B, limit %d B, RED %d/%d B Pmax %g",
		e.Endpoints.Name(), e.Plan.CC(), e.Plan.Scale, float64(b.RateBitsPerSec)/1e6, b.BurstBytes, b.LimitBytes,
		b.Marker.KminBytes, b.Marker.KmaxBytes, b.Marker.Pmax)

	var trace *ecnmark.TraceReader
	var samples []ecnmark.Sample
	traceDone := make(chan error, 1)
	stopTrace := make(chan struct{})
	if e.Trace {
		if trace, err = topo.Marker.TraceReader(); err != nil {
			return sum, err
		}
		go func() {
			var terr error
			for {
				select {
				case <-stopTrace:
					samples, terr = trace.Read(samples, time.Now())
					traceDone <- terr
					return
				default:
				}
				if samples, terr = trace.Read(samples, time.Now().Add(100*time.Millisecond)); terr != nil {
					traceDone <- terr
					return
				}
			}
		}()
		defer func() { err = errors.Join(err, trace.Close()) }()
	}

	nbins := int(e.Duration/e.Bin) + 2
	mon, err := topo.StartMonitor(uint64(e.Bin), nbins)
	if err != nil {
		return sum, err
	}
	defer func() { err = errors.Join(err, mon.Stop()) }()
	stopPoll := make(chan struct{})
	pollDone := make(chan error, 1)
	var pts []QueuePoint
	go func() {
		var perr error
		pts, perr = topo.PollQueue(nil, e.QueuePoll, e.Resync, stopPoll)
		pollDone <- perr
	}()

	rate := uint64(e.Plan.LineRate) / uint64(e.Plan.Scale)
	if !e.Endpoints.CongestionControlled() {
		rate = uint64(float64(b.RateBitsPerSec) * e.RawLoad)
	}
	specs := []FlowSpec{
		{ID: 1, Src: &topo.H1, Dst: &topo.R, DestQP: 0x101},
		{ID: 2, Src: &topo.H2, Dst: &topo.R, DestQP: 0x102},
	}
	var flows []Flow
	start := time.Now()
	for i := range specs {
		s := &specs[i]
		s.RateBitsPerSec, s.PayloadBytes, s.TClass = rate, e.PayloadBytes, e.DSCP<<2|2
		if e.Plan.Algorithm != "dcqcn" && e.Endpoints.CongestionControlled() {
			s.TClass = e.DSCP << 2 // delay-based: not ECN capable
		}
		s.CC, s.Profile, s.Scale = e.Plan.CC(), e.Plan.Profile, e.Plan.Scale
		s.Duration = e.Duration
		if i == 1 && !e.sleepUntil(start.Add(e.Join)) {
			err = errors.New("testbed: interrupted")
			break
		}
		s.Duration -= time.Since(start)
		f, ferr := e.Endpoints.StartFlow(topo, *s)
		if ferr != nil {
			err = ferr
			break
		}
		flows = append(flows, f)
		logf("testbed: flow %d %s→%s started at %.2f s, %.2f Mb/s", s.ID, s.Src.Name, s.Dst.Name, time.Since(start).Seconds(), float64(rate)/1e6)
	}
	if err == nil && !e.sleepUntil(start.Add(e.Duration)) {
		err = errors.New("testbed: interrupted")
	}
	for _, f := range flows {
		err = errors.Join(err, f.Stop())
	}
	close(stopPoll)
	err = errors.Join(err, <-pollDone)
	// Let the bottleneck drain (bounded) so that the receivers count
	// everything that was sent.
	for i := 0; i < 100; i++ {
		st, serr := topo.BottleneckStats()
		if serr != nil || st.BacklogBytes == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	err = errors.Join(err, mon.Stop())
	if trace != nil {
		close(stopTrace)
		err = errors.Join(err, <-traceDone)
	}
	// A failed flow still leaves what the monitor and the marker saw,
	// which is what tells a path problem from an endpoint one: the
	// summary is written with the error in it, and the error returned.
	runErr := err
	err = nil
	defer func() { err = errors.Join(runErr, err) }()

	// Results.
	traces, cnps, other := mon.Snapshot()
	st, err := topo.BottleneckStats()
	if err != nil {
		return sum, err
	}
	mc, err := topo.Marker.Counters()
	if err != nil {
		return sum, err
	}
	dur := e.Duration.Seconds()
	w0 := int(math.Ceil(0.8 * float64(e.Duration) / float64(e.Bin)))
	w1 := int(e.Duration / e.Bin) // whole bins only
	if w1 <= w0 {
		w0 = max(w1-1, 0)
	}
	sum = Summary{
		Endpoints: e.Endpoints.Name(), CongestionControlled: e.Endpoints.CongestionControlled(),
		Algorithm: e.Plan.Algorithm, Profile: e.Plan.Profile, Scale: e.Plan.Scale, BottleneckMbps: float64(b.RateBitsPerSec) / 1e6,
		TbfBurstBytes: b.BurstBytes, TbfLimitBytes: b.LimitBytes,
		KminBytes: b.Marker.KminBytes, KmaxBytes: b.Marker.KmaxBytes, Pmax: b.Marker.Pmax, MarkerResync: e.Resync,
		DurationS: dur, JoinS: e.Join.Seconds(),
		WindowS:  [2]float64{float64(w0) * e.Bin.Seconds(), float64(w1) * e.Bin.Seconds()},
		TbfDrops: st.Drops, Marker: mc, MonitorOther: other, Sim: e.Sim,
	}
	if runErr != nil {
		sum.Error = runErr.Error()
	}
	if !sum.CongestionControlled {
		sum.Note = "endpoints are raw ECT(0) senders at a fixed rate that ignore CNPs: NOT congestion-controlled; this run checks the bottleneck and the marker, not DCQCN"
	} else if e.Plan.Algorithm != "dcqcn" {
		sum.Note = e.Plan.Algorithm + " is delay-based: its frames are not ECN capable and the marker leaves them alone"
	}
	var means []float64
	for i, s := range specs {
		fs := FlowSummary{ID: s.ID, Src: s.Src.Link.Addr.String(), CNPsSeen: cnps[s.Src.Link.Addr]}
		if i < len(flows) {
			fs.Endpoint = flows[i].Counters()
		}
		// Each sender host carries one flow; its QPNs are the endpoints'
		// business (a softrnic responder picks its own), so the flow is
		// everything the monitor saw from the host.
		var bytes uint64
		for _, tr := range traces {
			if tr.Src == s.Src.Link.Addr {
				fs.Frames += tr.Frames
				fs.CEMarked += tr.CE
				for k := w0; k < w1 && k < len(tr.Bins); k++ {
					bytes += tr.Bins[k]
				}
			}
		}
		fs.MeanMbps = float64(bytes) * 8 / (float64(w1-w0) * e.Bin.Seconds()) / 1e6
		fs.Normalised = fs.MeanMbps / sum.BottleneckMbps
		means = append(means, fs.MeanMbps)
		sum.Flows = append(sum.Flows, fs)
	}
	sum.Jain = Jain(means)
	var tot float64
	for _, m := range means {
		tot += m
	}
	sum.Utilization = tot / sum.BottleneckMbps
	sum.HostLoad = [2]float64{load0, hostLoad1()}
	reported := len(sum.Flows) > 0
	for _, f := range sum.Flows {
		sum.RPSumMbps += f.Endpoint.RPRateMbps
		reported = reported && f.Endpoint.RPRateMbps > 0
	}
	sum.SenderLimited = reported && sum.RPSumMbps >= 0.95*sum.BottleneckMbps && sum.Utilization < 0.95
	sum.Queue = queueStats(pts, mon.StartNs()+uint64(sum.WindowS[0]*1e9), mon.StartNs()+uint64(sum.WindowS[1]*1e9))
	if e.Out != "" {
		if err := writeOut(e.Out, sum, traces, mon, pts, samples); err != nil {
			return sum, err
		}
	}
	return sum, nil
}

func queueStats(pts []QueuePoint, from, to uint64) QueueStats {
	qs := QueueStats{TrackMAEBytes: TrackError(pts)}
	var in []float64
	for _, p := range pts {
		if p.Ns >= from && p.Ns < to {
			in = append(in, float64(p.TbfBacklog))
		}
	}
	qs.Polls = len(in)
	if len(in) == 0 {
		return qs
	}
	slices.Sort(in)
	var s float64
	for _, x := range in {
		s += x
	}
	qs.MeanKB = s / float64(len(in)) / 1000
	qs.P5KB = in[len(in)*5/100] / 1000
	qs.P95KB = in[min(len(in)*95/100, len(in)-1)] / 1000
	return qs
}

func writeOut(dir string, sum Summary, traces []FlowTrace, mon *Monitor, pts []QueuePoint, samples []ecnmark.Sample) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	j, err := json.MarshalIndent(sum, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "summary.json"), append(j, '\n'), 0o644); err != nil {
		return err
	}
	f := func(x float64) string { return strconv.FormatFloat(x, 'f', -1, 64) }
	// rates.csv: one row per bin, one column per flow (Mb/s).
	rows := [][]string{{"t_s"}}
	nb := 0
	for _, tr := range traces {
		rows[0] = append(rows[0], fmt.Sprintf("%s/qp%#x_mbps", tr.Src, tr.DestQP))
		nb = max(nb, len(tr.Bins))
	}
	bin := float64(mon.BinNs()) / 1e9
	for k := 0; k < nb; k++ {
		r := []string{f(float64(k) * bin)}
		for _, tr := range traces {
			var v uint64
			if k < len(tr.Bins) {
				v = tr.Bins[k]
			}
			r = append(r, f(float64(v)*8/bin/1e6))
		}
		rows = append(rows, r)
	}
	if err := writeCSV(filepath.Join(dir, "rates.csv"), rows); err != nil {
		return err
	}
	rows = [][]string{{"t_s", "tbf_backlog_bytes", "marker_backlog_bytes"}}
	for _, p := range pts {
		rows = append(rows, []string{f(float64(int64(p.Ns-mon.StartNs())) / 1e9), strconv.FormatUint(uint64(p.TbfBacklog), 10), strconv.FormatUint(p.VQBacklog, 10)})
	}
	if err := writeCSV(filepath.Join(dir, "queue.csv"), rows); err != nil {
		return err
	}
	if samples == nil {
		return nil
	}
	rows = [][]string{{"t_s", "backlog_bytes", "len", "ecn", "verdict"}}
	for _, s := range samples {
		rows = append(rows, []string{f(float64(int64(s.NowNs-mon.StartNs())) / 1e9), strconv.FormatUint(uint64(s.QBytes), 10),
			strconv.Itoa(int(s.Len)), strconv.Itoa(int(s.ECN)), strconv.Itoa(int(s.Verdict))})
	}
	return writeCSV(filepath.Join(dir, "trace.csv"), rows)
}

func writeCSV(path string, rows [][]string) error {
	fh, err := os.Create(path)
	if err != nil {
		return err
	}
	w := csv.NewWriter(fh)
	if err := w.WriteAll(rows); err != nil {
		return errors.Join(err, fh.Close())
	}
	return fh.Close()
}

// hostLoad1 is the 1-minute load average, 0 if unknown.
func hostLoad1() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

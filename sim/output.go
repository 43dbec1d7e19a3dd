package sim

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/softrnic/softrnic/sim/fluid"
	"github.com/softrnic/softrnic/sim/plot"
)

// Output files WriteDir creates.
const (
	SummaryFile    = "summary.json"
	FlowsFile      = "flows.csv"      // t_us,flow,rate_gbps,<algorithm's two columns>
	QueuesFile     = "queues.csv"     // t_us,port,queue_kb
	ThroughputFile = "throughput.csv" // t_ms,flow,gbps (received, Options.ThroughputBin bins)
	FigureFile     = "dcqcn.svg"      // throughput, rate, queue and α panels (other algorithms: <name>.svg)
	RatesPlot      = "rates.svg"
	QueuePlot      = "queue.svg"
	AlphaPlot      = "alpha.svg" // DCQCN's α; the other algorithms' last panel is state.svg
	StatePlot      = "state.svg"

	// The workload writes summary.json, fct.txt and slowdown.svg.
	FCTFile      = "fct.txt"      // HPCC ns-3's format: sip dip sport dport size start_ns fct_ns standalone_fct_ns
	SlowdownPlot = "slowdown.svg" // FCT slowdown by flow size: median, 95th, 99th percentile
)

// TraceFiles are the files of a DCQCN run whose bytes depend only on the
// Options (not on wall time): what the determinism test hashes.
var TraceFiles = []string{FlowsFile, QueuesFile, ThroughputFile, FigureFile, RatesPlot, QueuePlot, AlphaPlot}

// WriteDir writes the run's files into dir, creating it if needed: for the
// workload summary.json, fct.txt and slowdown.svg; otherwise summary.json,
// the CSV traces and the SVG plots.
func (r *Result) WriteDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	type file struct {
		name  string
		write func(io.Writer) error
	}
	if r.Options.Scenario == Workload {
		return WriteWorkloadDir(dir, &r.Summary, r.FCT)
	}
	var files []file
	{
		fig, last := FigureFile, AlphaPlot
		if a := r.Summary.Algorithm; a != DCQCN && a != "" {
			fig, last = a+".svg", StatePlot
		}
		files = []file{
			{SummaryFile, r.writeSummary},
			{FlowsFile, r.writeFlows},
			{QueuesFile, r.writeQueues},
			{ThroughputFile, r.writeThroughput},
			{fig, func(w io.Writer) error { f := r.Figure(); return f.WriteSVG(w) }},
			{RatesPlot, func(w io.Writer) error { return r.single(0).WriteSVG(w) }},
			{QueuePlot, func(w io.Writer) error { return r.single(2).WriteSVG(w) }},
			{last, func(w io.Writer) error { return r.single(3).WriteSVG(w) }},
		}
	}
	for _, f := range files {
		if err := writeFile(filepath.Join(dir, f.name), f.write); err != nil {
			return err
		}
	}
	return nil
}

// WriteWorkloadDir writes a workload run's (or a merge's) summary.json,
// fct.txt and slowdown.svg into dir.
func WriteWorkloadDir(dir string, s *Summary, fct []byte) error {
	if s.Workload == nil {
		return errors.New("sim: not a workload summary")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := writeFile(filepath.Join(dir, SummaryFile), func(w io.Writer) error { return writeJSON(w, s) }); err != nil {
		return err
	}
	if err := writeFile(filepath.Join(dir, FCTFile), func(w io.Writer) error { _, err := w.Write(fct); return err }); err != nil {
		return err
	}
	return writeFile(filepath.Join(dir, SlowdownPlot), func(w io.Writer) error {
		f := SlowdownFigure(SlowdownTitle(s), []SlowdownRun{{Name: algoTitle(s.Algorithm) + " " + s.Profile, Table: s.Workload.Slowdown}})
		return f.WriteSVG(w)
	})
}

// SlowdownTitle describes a workload run for a figure's title.
func SlowdownTitle(s *Summary) string {
	w := s.Workload
	seeds := fmt.Sprintf("seed %d", s.Seed)
	if len(s.Seeds) > 1 {
		seeds = fmt.Sprintf("%d seeds", len(s.Seeds))
	}
	return fmt.Sprintf("FCT slowdown, %s %d%% load, %s (%d hosts, %g/%g Gb/s), %g ms, %s",
		w.CDF, int(w.Load*100+0.5), w.Topology, w.Hosts, w.HostGbps, w.UplinkGbps, s.DurationMs, seeds)
}

// SlowdownRun is one algorithm's slowdown table in a comparison figure.
type SlowdownRun struct {
	Name  string
	Table []SlowdownBucket
}

// SlowdownFigure draws FCT slowdown against flow size as the HPCC paper's
// Figure 11 does: one panel each for the median, the 95th and the 99th
// percentile, flows bucketed by size (5 % of the flows per bucket), the
// x axis labelled with each bucket's largest flow, the slowdown in log
// scale; one line per run.
func SlowdownFigure(title string, runs []SlowdownRun) plot.Figure {
	var ticks []plot.Tick
	if len(runs) > 0 {
		t := runs[0].Table
		every := max(len(t)/10, 1)
		for i, b := range t {
			if i%every == every-1 || i == len(t)-1 {
				ticks = append(ticks, plot.Tick{V: float64(i + 1), Label: sizeLabel(b.MaxBytes)})
			}
		}
	}
	panels := []plot.Panel{
		{Title: "(a) median FCT slowdown"}, {Title: "(b) 95th percentile"}, {Title: "(c) 99th percentile"},
	}
	for k := range panels {
		p := &panels[k]
		p.XLabel, p.YLabel, p.XTicks, p.YLog = "flow size (bucket's largest, 5 % of flows per bucket)", "FCT slowdown", ticks, true
		p.XFixed, p.XMin = true, 0
		for _, r := range runs {
			p.XMax = max(p.XMax, float64(len(r.Table)))
			var x, y []float64
			for i, b := range r.Table {
				x = append(x, float64(i)+0.5)
				y = append(y, [3]float64{b.P50, b.P95, b.P99}[k])
			}
			p.Series = append(p.Series, plot.Series{Name: r.Name, X: x, Y: y})
		}
		p.XMax = max(p.XMax, 1)
	}
	return plot.Figure{Title: title, Width: 760, Panels: panels}
}

// sizeLabel is a flow size as the HPCC figure labels it: 5K, 80K, 2M.
func sizeLabel(b int64) string {
	switch {
	case b >= 1_000_000:
		return strconv.FormatFloat(float64(b)/1e6, 'g', 3, 64) + "M"
	case b >= 1000:
		return strconv.FormatFloat(float64(b)/1e3, 'g', 3, 64) + "K"
	}
	return strconv.FormatInt(b, 10)
}

func writeFile(path string, write func(io.Writer) error) error {
	fh, err := os.Create(path)
	if err != nil {
		return err
	}
	bw := bufio.NewWriterSize(fh, 1<<16)
	if err := write(bw); err != nil {
		return errors.Join(fmt.Errorf("%s: %w", path, err), fh.Close())
	}
	if err := bw.Flush(); err != nil {
		return errors.Join(err, fh.Close())
	}
	return fh.Close()
}

func (r *Result) writeSummary(w io.Writer) error { return writeJSON(w, &r.Summary) }

func writeJSON(w io.Writer, v any) error {
	e := json.NewEncoder(w)
	e.SetIndent("", "  ")
	e.SetEscapeHTML(false) // port names contain "->"
	return e.Encode(v)
}

// Numbers are formatted with a fixed precision so the files are
// byte-identical across runs and platforms.
func ff(b []byte, v float64, prec int) []byte { return strconv.AppendFloat(b, v, 'f', prec, 64) }

func (r *Result) writeFlows(w io.Writer) error {
	t := &r.Trace
	b := []byte("t_us,flow,rate_gbps," + t.Cols[0] + "," + t.Cols[1] + "\n")
	prec := [2]int{4, 6}
	if r.alg != nil {
		prec = [2]int{r.alg.cols[0].prec, r.alg.cols[1].prec}
	}
	for i, ts := range t.TimesUs {
		for _, f := range t.Flows {
			b = ff(b, ts, 0)
			b = append(b, ',')
			b = strconv.AppendInt(b, int64(f.ID), 10)
			b = append(b, ',')
			b = ff(b, float64(f.RateGbps[i]), 4)
			b = append(b, ',')
			b = ff(b, float64(f.A[i]), prec[0])
			b = append(b, ',')
			b = ff(b, float64(f.B[i]), prec[1])
			b = append(b, '\n')
		}
		if len(b) > 1<<15 {
			if _, err := w.Write(b); err != nil {
				return err
			}
			b = b[:0]
		}
	}
	_, err := w.Write(b)
	return err
}

func (r *Result) writeQueues(w io.Writer) error {
	t := &r.Trace
	b := []byte("t_us,port,queue_kb\n")
	for i, ts := range t.TimesUs {
		for _, p := range t.Ports {
			b = ff(b, ts, 0)
			b = append(b, ',')
			b = append(b, p.Name...)
			b = append(b, ',')
			b = ff(b, float64(p.QueueKB[i]), 3)
			b = append(b, '\n')
		}
		if len(b) > 1<<15 {
			if _, err := w.Write(b); err != nil {
				return err
			}
			b = b[:0]
		}
	}
	_, err := w.Write(b)
	return err
}

func (r *Result) writeThroughput(w io.Writer) error {
	t := &r.Trace
	b := []byte("t_ms,flow,gbps\n")
	for i, row := range t.Throughput {
		for k, v := range row {
			b = ff(b, float64(k)*t.BinMs, 3)
			b = append(b, ',')
			b = strconv.AppendInt(b, int64(i), 10)
			b = append(b, ',')
			b = ff(b, v, 4)
			b = append(b, '\n')
		}
	}
	_, err := w.Write(b)
	return err
}

// Figure is the run's paper figure: (a) received throughput per flow in 1
// ms bins with the fair share, (b) each controller's rate (DCQCN: R_C),
// (c) the bottleneck queue with the fluid model's mean, (d) the
// algorithm's own variable (DCQCN α, HPCC U, TIMELY RTT, Swift cwnd).
func (r *Result) Figure() plot.Figure {
	t := &r.Trace
	s := &r.Summary
	fair := s.LinkGbps / float64(len(s.Flows))
	win := []float64{s.WindowMs[0], s.WindowMs[1]}

	var tp, rc, al []plot.Series
	xs := make([]float64, len(t.TimesUs))
	for i, v := range t.TimesUs {
		xs[i] = v / 1e3
	}
	for i, row := range t.Throughput {
		x := make([]float64, len(row))
		y := slices.Clone(row)
		for k := range row {
			x[k] = (float64(k) + 0.5) * t.BinMs
			if i < len(s.Flows) && float64(k+1)*t.BinMs <= s.Flows[i].StartMs {
				y[k] = math.NaN() // before the flow started
			}
		}
		name := fmt.Sprintf("flow %d", i)
		if i < len(t.Flows) {
			name = fmt.Sprintf("flow %d (%s)", i, t.Flows[i].Name)
		}
		tp = append(tp, plot.Series{Name: name, X: x, Y: y})
	}
	for _, f := range t.Flows {
		// A flow not sending (not started, or finished) has no rate: leave
		// a gap rather than draw a line at zero.
		r, a := f32(f.RateGbps), f32(f.B)
		for i := range r {
			if f.RateGbps[i] == 0 {
				r[i], a[i] = math.NaN(), math.NaN()
			}
		}
		rc = append(rc, plot.Series{Name: fmt.Sprintf("flow %d", f.ID), X: xs, Y: r})
		al = append(al, plot.Series{Name: fmt.Sprintf("flow %d", f.ID), X: xs, Y: a})
	}
	var qs []plot.Series
	for _, p := range t.Ports {
		if p.Name == s.Bottleneck {
			qs = append(qs, plot.Series{Name: p.Name, X: xs, Y: f32(p.QueueKB)})
		}
	}
	if s.Fluid != nil {
		qs = append(qs, plot.Series{Name: "fluid model", X: []float64{0, s.DurationMs}, Y: []float64{s.Fluid.QueueMeanKB, s.Fluid.QueueMeanKB}, Dashed: true, Color: "#555555"})
	}
	switch {
	case s.Scenario == Incast && len(tp) > 2:
		// The victim (flow 0) on its own, the incast senders as a spread.
		victim := func(ss []plot.Series) []plot.Series {
			v := ss[0]
			v.Name, v.Color = "victim "+t.Flows[0].Name, "#009E73"
			return append([]plot.Series{v}, spread(ss[1:], "incast")...)
		}
		tp, rc, al = victim(tp), victim(rc), victim(al)
	case len(tp) > manySeries:
		tp, rc, al = spread(tp, "all"), spread(rc, "all"), spread(al, "all")
	}
	title := fmt.Sprintf("%s %s, profile %s, %d flows, %g Gb/s, seed %d", algoTitle(s.Algorithm), s.Scenario, s.Profile, len(s.Flows), s.LinkGbps, s.Seed)
	rateTitle, rateLabel := "(b) sending rate", "rate (Gb/s)"
	last := plot.Panel{Title: "(d) " + t.Labels[1], XLabel: "time (ms)", YLabel: t.Labels[1], Series: al, Height: 160, VLines: win}
	if s.Algorithm == DCQCN || s.Algorithm == "" {
		rateTitle, rateLabel = "(b) reaction-point rate R_C", "R_C (Gb/s)"
		last = plot.Panel{Title: "(d) α", XLabel: "time (ms)", YLabel: "α", Series: al, YFixed: true, YMin: 0, YMax: 1, Height: 160}
	}
	band := []plot.Band{{Lo: fair * 0.95, Hi: fair * 1.05, Label: "fair share ± 5 %"}}
	if s.Scenario == Incast {
		band = nil
	}
	fig := plot.Figure{Title: title, Width: 760, Panels: []plot.Panel{
		{Title: fmt.Sprintf("(a) received throughput, %g ms bins", t.BinMs), XLabel: "time (ms)", YLabel: "throughput (Gb/s)", Series: tp, HBands: band, VLines: win},
		{Title: rateTitle, XLabel: "time (ms)", YLabel: rateLabel, Series: rc, VLines: win},
		{Title: "(c) bottleneck queue " + s.Bottleneck, XLabel: "time (ms)", YLabel: "queue (KB)", Series: qs, VLines: win},
		last,
	}}
	for i := range fig.Panels {
		fig.Panels[i].XFixed, fig.Panels[i].XMin, fig.Panels[i].XMax = true, 0, s.DurationMs
	}
	return fig
}

func algoTitle(a string) string {
	switch a {
	case HPCC, TIMELY:
		return strings.ToUpper(a)
	case Swift:
		return "Swift"
	}
	return "DCQCN"
}

// single is one panel of Figure as its own SVG.
func (r *Result) single(i int) *plot.Figure {
	f := r.Figure()
	return &plot.Figure{Title: f.Title, Width: f.Width, Panels: f.Panels[i : i+1]}
}

func f32(v []float32) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

// fluidRef runs the fluid model for the scenario's flow count with the
// run's link and marking parameters, when the profile is the paper's (the
// model has no ConnectX variant).
func fluidRef(o *Options) *FluidRef {
	if o.Scenario == Incast || o.Scenario == Workload || (o.Algorithm != DCQCN && o.Algorithm != "") || o.Profile != "paper" || o.RP != nil || o.NP != nil {
		return nil
	}
	p := fluid.Paper(o.Flows)
	p.LinkBps = float64(o.LinkRate)
	p.PacketBits = float64(o.PacketSize) * 8
	p.Kmin, p.Kmax, p.Pmax = float64(o.RED.Kmin), float64(o.RED.Kmax), o.RED.Pmax
	res, err := fluid.Run(p)
	if err != nil {
		return nil
	}
	return &FluidRef{QueueMeanKB: res.QueueMeanKB, QueueMinKB: res.QueueMinKB, QueueMaxKB: res.QueueMaxKB,
		RateGbps: res.RateGbps, TauStarUs: p.TauStar * 1e6}
}

// manySeries is where one line per flow stops being readable; beyond it the
// figure shows the spread across flows instead.
const manySeries = 12

// spread summarises many series sharing X (same length) as min, median and
// max across series at each point; NaNs (flows not running) are skipped.
func spread(ss []plot.Series, label string) []plot.Series {
	if len(ss) == 0 {
		return ss
	}
	n := len(ss[0].X)
	lo, med, hi := make([]float64, n), make([]float64, n), make([]float64, n)
	col := make([]float64, 0, len(ss))
	for i := 0; i < n; i++ {
		col = col[:0]
		for _, s := range ss {
			if i < len(s.Y) && !math.IsNaN(s.Y[i]) {
				col = append(col, s.Y[i])
			}
		}
		if len(col) == 0 {
			lo[i], med[i], hi[i] = math.NaN(), math.NaN(), math.NaN()
			continue
		}
		slices.Sort(col)
		lo[i], med[i], hi[i] = col[0], col[len(col)/2], col[len(col)-1]
	}
	x := ss[0].X
	return []plot.Series{
		{Name: fmt.Sprintf("%s %d: max", label, len(ss)), X: x, Y: hi, Color: "#D55E00"},
		{Name: fmt.Sprintf("%s %d: median", label, len(ss)), X: x, Y: med, Color: "#000000"},
		{Name: fmt.Sprintf("%s %d: min", label, len(ss)), X: x, Y: lo, Color: "#0072B2"},
	}
}

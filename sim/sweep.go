package sim

import (
	"errors"
	"fmt"
	"math"

	"github.com/softrnic/softrnic/sim/plot"
)

// Spread is how one figure varies across the seeds of a sweep.
type Spread struct {
	Mean  float64 `json:"mean"`
	Min   float64 `json:"min"`
	Max   float64 `json:"max"`
	Stdev float64 `json:"stdev"` // sample standard deviation (n−1)
}

func spreadOf(v []float64) Spread {
	if len(v) == 0 {
		return Spread{}
	}
	s := Spread{Min: math.Inf(1), Max: math.Inf(-1)}
	for _, x := range v {
		s.Mean += x
		s.Min = min(s.Min, x)
		s.Max = max(s.Max, x)
	}
	s.Mean /= float64(len(v))
	if len(v) > 1 {
		var ss float64
		for _, x := range v {
			ss += (x - s.Mean) * (x - s.Mean)
		}
		s.Stdev = math.Sqrt(ss / float64(len(v)-1))
	}
	return s
}

// FlowSpread is one flow's window mean rate across the seeds of a sweep.
type FlowSpread struct {
	ID   int    `json:"id"`
	Gbps Spread `json:"gbps"`
	// Outside counts the seeds whose window mean is outside FairGbps ± Tol.
	Outside int `json:"outside"`
}

// SweepResult is the per-seed spread of a scenario's window figures.
type SweepResult struct {
	Scenario  string     `json:"scenario"`
	Algorithm string     `json:"algorithm"`
	Profile   string     `json:"profile"`
	Seeds     []uint64   `json:"seeds"`
	WindowMs  [2]float64 `json:"window_ms"`
	Config    RunConfig  `json:"config"`
	// FairGbps is the fair share C/N; TolGbps the band Outside counts against.
	FairGbps float64      `json:"fair_gbps"`
	TolGbps  float64      `json:"tol_gbps"`
	Flows    []FlowSpread `json:"flows"`
	// AllRates holds every (seed, flow) window mean, seed-major, for a
	// histogram.
	AllRates    []float64 `json:"all_gbps"`
	Jain        Spread    `json:"jain"`
	Utilization Spread    `json:"utilization"`
	QueueMeanKB Spread    `json:"queue_mean_kb"`
	CNPCount    Spread    `json:"cnp_count"`
	Drops       uint64    `json:"drops"`
}

// Sweep runs o once per seed first, first+1, …, first+count−1 and reports how
// the window figures vary. A DCQCN run is a random process (RED marks are
// drawn per packet), so one seed's window mean is one sample; the sweep
// says how wide the distribution of that sample is. tol is the band around
// the fair share that Outside counts against (the target's ±1 Gb/s).
func Sweep(o Options, first uint64, count int, tol float64) (*SweepResult, error) {
	if count < 1 {
		return nil, errors.New("sim: sweep needs at least one seed")
	}
	o.Progress = nil
	var sums []Summary
	for k := 0; k < count; k++ {
		oo := o
		oo.Seed = first + uint64(k)
		r, err := Run(oo)
		if err != nil {
			return nil, err
		}
		sums = append(sums, r.Summary)
	}
	return SweepOf(sums, tol)
}

// SweepOf is Sweep over runs already made (by worker processes, say): the
// summaries of one scenario under several seeds, in seed order.
func SweepOf(sums []Summary, tol float64) (*SweepResult, error) {
	if len(sums) < 1 {
		return nil, errors.New("sim: sweep needs at least one seed")
	}
	var (
		res                     SweepResult
		per                     [][]float64
		jain, util, queue, cnps []float64
	)
	for k := range sums {
		s := &sums[k]
		if k == 0 {
			res.Scenario, res.Algorithm, res.Profile, res.WindowMs, res.Config = s.Scenario, s.Algorithm, s.Profile, s.WindowMs, s.Config
			n := len(s.Flows)
			if s.Scenario == Incast {
				n-- // the victim is not part of the share
			}
			res.FairGbps = s.LinkGbps / float64(max(n, 1))
			res.TolGbps = tol
			per = make([][]float64, len(s.Flows))
		} else if len(s.Flows) != len(per) || s.Scenario != res.Scenario {
			return nil, errors.New("sim: sweep over runs of different scenarios")
		}
		res.Seeds = append(res.Seeds, s.Seed)
		for i, f := range s.Flows {
			per[i] = append(per[i], f.MeanGbps)
			res.AllRates = append(res.AllRates, f.MeanGbps)
		}
		jain = append(jain, s.Jain)
		util = append(util, s.Utilization)
		queue = append(queue, s.QueueMeanKB)
		cnps = append(cnps, float64(s.CNPCount))
		res.Drops += s.Drops
	}
	for i, v := range per {
		fs := FlowSpread{ID: i, Gbps: spreadOf(v)}
		for _, x := range v {
			if math.Abs(x-res.FairGbps) > tol {
				fs.Outside++
			}
		}
		res.Flows = append(res.Flows, fs)
	}
	res.Jain, res.Utilization, res.QueueMeanKB, res.CNPCount = spreadOf(jain), spreadOf(util), spreadOf(queue), spreadOf(cnps)
	return &res, nil
}

// Histogram counts the values of v in bins of width w starting at lo; the
// last bin also holds everything above, the first everything below.
func Histogram(v []float64, lo, w float64, bins int) []int {
	h := make([]int, bins)
	for _, x := range v {
		b := int(math.Floor((x - lo) / w))
		h[min(max(b, 0), bins-1)]++
	}
	return h
}

// Figure draws the sweep: a histogram of each flow's window mean over the
// seeds (as steps), with the fair share ± Tol shaded, and each flow's
// window mean per seed.
func (r *SweepResult) Figure() plot.Figure {
	const bins = 24
	nf := len(r.Flows)
	lo, hi := r.FairGbps-3*r.TolGbps, r.FairGbps+3*r.TolGbps
	for _, x := range r.AllRates {
		lo, hi = math.Min(lo, x), math.Max(hi, x)
	}
	w := (hi - lo) / bins
	if !(w > 0) {
		w = 1
	}
	band := []plot.Band{{Lo: r.FairGbps - r.TolGbps, Hi: r.FairGbps + r.TolGbps, Label: "fair ± tol"}}
	hist := plot.Panel{Title: "window mean over seeds", XLabel: "Gb/s", YLabel: "seeds", XFixed: true, XMin: lo, XMax: lo + bins*w}
	perSeed := plot.Panel{Title: "window mean per seed", XLabel: "seed", YLabel: "Gb/s", HBands: band,
		YFixed: true, YMin: lo, YMax: lo + bins*w}
	for i := 0; i < nf && i < 16; i++ {
		v := make([]float64, 0, len(r.Seeds))
		seeds := make([]float64, 0, len(r.Seeds))
		for k := range r.Seeds {
			v = append(v, r.AllRates[k*nf+i])
			seeds = append(seeds, float64(r.Seeds[k]))
		}
		h := Histogram(v, lo, w, bins)
		var xs, ys []float64
		for b, c := range h { // steps: each bin's count across its width
			xs = append(xs, lo+float64(b)*w, lo+float64(b+1)*w)
			ys = append(ys, float64(c), float64(c))
		}
		name := fmt.Sprintf("flow %d", i)
		hist.Series = append(hist.Series, plot.Series{Name: name, X: xs, Y: ys})
		perSeed.Series = append(perSeed.Series, plot.Series{Name: name, X: seeds, Y: v})
	}
	hist.VLines = []float64{r.FairGbps - r.TolGbps, r.FairGbps + r.TolGbps}
	return plot.Figure{
		Title:  fmt.Sprintf("%s %s, %s: %d seeds, window %g–%g ms", algoTitle(r.Algorithm), r.Scenario, r.Profile, len(r.Seeds), r.WindowMs[0], r.WindowMs[1]),
		Panels: []plot.Panel{hist, perSeed},
	}
}

package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/congestion"
	"github.com/softrnic/softrnic/congestion/dcqcn"
	"github.com/softrnic/softrnic/sim"
)

func init() {
	register("sim", "deterministic congestion-control simulator (sim dcqcn --scenario ... --out DIR)", runSim)
}

// knobList collects repeated --set name=value flags.
type knobList []string

func (k *knobList) String() string     { return strings.Join(*k, ",") }
func (k *knobList) Set(v string) error { *k = append(*k, v); return nil }

func runSim(args []string) int {
	if len(args) < 1 || args[0] != "dcqcn" {
		fmt.Fprintln(os.Stderr, "usage: softrnic sim dcqcn --scenario two-flow|n-flow|incast [--flows N] [--profile paper|connectx|hpcc-mlx] [--seed S] [--seeds N] [--duration D] [--window-start W] [--np immediate|drop|grid] [--order cut-then-alpha|alpha-then-cut] [--retime] --out DIR")
		fmt.Fprintln(os.Stderr, "(dcqcn is the only algorithm so far)")
		return 2
	}
	if err := simDCQCN(args[1:], os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(os.Stderr, "softrnic sim:", err)
		return 1
	}
	return 0
}

func simDCQCN(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("sim dcqcn", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		o        sim.Options
		out      = fs.String("out", "", "output directory (required): summary.json, CSV traces, SVG plots")
		seed     = fs.Uint64("seed", 1, "random seed; the same seed gives byte-identical traces")
		linkGbps = fs.Float64("link-gbps", 40, "rate of every link, Gb/s")
		marking  = fs.String("marking", "dequeue", "where switches ECN-mark: dequeue, enqueue or off")
		kmin     = fs.Int64("kmin", 5000, "RED Kmin, bytes")
		kmax     = fs.Int64("kmax", 200000, "RED Kmax, bytes")
		pmax     = fs.Float64("pmax", 0.01, "RED Pmax")
		pfc      = fs.Bool("pfc", false, "enable PFC (incast enables it unless --no-pfc)")
		noPFC    = fs.Bool("no-pfc", false, "disable PFC, also for incast")
		quiet    = fs.Bool("quiet", false, "no progress bar and no summary on stdout")
		seeds    = fs.Int("seeds", 1, "run seeds seed…seed+N−1 and report the per-seed spread (sweep.json) instead of one run's traces")
		tol      = fs.Float64("tol", 1, "--seeds: band around the fair share, Gb/s, that the 'outside' count uses")
		npMode   = fs.String("np", "", "paper NP fork: immediate (the paper: first CNP at once, then at most one per N, deferred), drop (marks inside N dropped) or grid (ns3-rdma: CNPs only on a per-QP N clock)")
		order    = fs.String("order", "", "paper RP fork: cut-then-alpha (the paper) or alpha-then-cut (ns3-rdma)")
		knobs    knobList
	)
	fs.StringVar(&o.Scenario, "scenario", "two-flow", "two-flow, n-flow or incast")
	fs.IntVar(&o.Flows, "flows", 0, "n-flow: number of flows (4); incast: number of senders (16)")
	fs.StringVar(&o.Profile, "profile", "paper", "paper, connectx or hpcc-mlx")
	fs.DurationVar(&o.Duration, "duration", 0, "simulated time (two-flow 110ms, n-flow 100ms+N ms, incast 20ms)")
	fs.DurationVar(&o.LinkDelay, "link-delay", time.Microsecond, "propagation delay of every link")
	fs.IntVar(&o.PacketSize, "mtu", 1000, "data packet size on the wire, bytes")
	fs.DurationVar(&o.TraceInterval, "trace-interval", 0, "period of trace rows (10µs; 100µs above 16 flows)")
	fs.BoolVar(&o.Retime, "retime", false, "an RP rate change re-times the pacer's pending gap (HPCC ns-3 ChangeRate); default: it applies from the next packet (ns3-rdma)")
	fs.DurationVar(&o.WindowStart, "window-start", 0, "start of the measurement window (default: 20 ms before the end)")
	fs.DurationVar(&o.ThroughputBin, "throughput-bin", 0, "bin of the received-throughput trace (1ms; incast 100µs)")
	fs.Var(&knobs, "set", "ConnectX knob name=value (mlx5 names, e.g. rpg_ai_rate=10); repeatable; implies --profile connectx")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *out == "" {
		return errors.New("--out DIR is required")
	}
	o.Seed = *seed
	o.LinkRate = congestion.Rate(*linkGbps) * congestion.Gbps
	o.RED = sim.RED{Kmin: *kmin, Kmax: *kmax, Pmax: *pmax}
	o.PFC, o.NoPFC = *pfc, *noPFC
	switch *marking {
	case "dequeue":
		o.Marking = sim.MarkDequeue
	case "enqueue":
		o.Marking = sim.MarkEnqueue
	case "off":
		o.Marking = sim.MarkOff
	default:
		return fmt.Errorf("--marking %q: want dequeue, enqueue or off", *marking)
	}
	if len(knobs) > 0 {
		if o.Profile != "paper" && o.Profile != "connectx" {
			return errors.New("--set applies to the connectx profile")
		}
		o.Profile = "connectx"
		cx := dcqcn.DefaultConnectX()
		for _, kv := range knobs {
			name, val, ok := strings.Cut(kv, "=")
			v, err := strconv.ParseUint(val, 10, 32)
			if !ok || err != nil {
				return fmt.Errorf("--set %q: want name=unsigned integer (knobs: %s)", kv, strings.Join(dcqcn.KnobNames(), ", "))
			}
			if err := cx.Set(name, uint32(v)); err != nil {
				return err
			}
		}
		o.ConnectX = &cx
	}
	if *npMode != "" || *order != "" {
		if o.Profile != "paper" {
			return errors.New("--np and --order apply to the paper profile")
		}
		rp, np, err := sim.Profiles("paper", o.LinkRate)
		if err != nil {
			return err
		}
		switch *npMode {
		case "", "immediate":
		case "drop":
			np.Defer = false
		case "grid":
			np.Grid = true
		default:
			return fmt.Errorf("--np %q: want immediate, drop or grid", *npMode)
		}
		switch *order {
		case "", "cut-then-alpha":
		case "alpha-then-cut":
			rp.Order = dcqcn.AlphaThenCut
		default:
			return fmt.Errorf("--order %q: want cut-then-alpha or alpha-then-cut", *order)
		}
		o.RP, o.NP = &rp, &np
	}
	if *seeds > 1 {
		return simSweep(o, *seed, *seeds, *tol, *out, *quiet, stdout)
	}
	var bar *progressBar
	if !*quiet && isTerminal(os.Stderr) {
		bar = &progressBar{w: stderr}
		o.Progress = bar.update
	}
	res, err := sim.Run(o)
	if bar != nil {
		bar.done() // clear the line before anything else is printed
	}
	if err != nil {
		return err
	}
	if err := res.WriteDir(*out); err != nil {
		return err
	}
	if !*quiet {
		printSummary(stdout, &res.Summary, *out)
	}
	return nil
}

func printSummary(w io.Writer, s *sim.Summary, dir string) {
	fmt.Fprintf(w, "%s, profile %s, seed %d: %g ms simulated, window %g–%g ms\n",
		s.Scenario, s.Profile, s.Seed, s.DurationMs, s.WindowMs[0], s.WindowMs[1])
	fmt.Fprintf(w, "  %s\n", s.Config.String())
	for i, f := range s.Flows {
		if i == 8 && len(s.Flows) > 10 {
			fmt.Fprintf(w, "  … %d more flows in summary.json\n", len(s.Flows)-8)
			break
		}
		fct := ""
		if f.FCTUs != nil {
			fct = fmt.Sprintf("  FCT %.0f µs", *f.FCTUs)
		}
		fmt.Fprintf(w, "  flow %d %-8s %7.3f Gb/s  CNPs %d%s\n", f.ID, f.Path, f.MeanGbps, f.CNPReceived, fct)
	}
	conv := "not converged"
	if s.Scenario == sim.Incast {
		conv = "n/a"
	} else if s.ConvergenceMs != nil {
		conv = fmt.Sprintf("%g ms", *s.ConvergenceMs)
	}
	fmt.Fprintf(w, "  Jain %.4f  utilisation %.4f  queue mean %.1f KB (p5 %.1f, p95 %.1f)  convergence %s\n",
		s.Jain, s.Utilization, s.QueueMeanKB, s.QueueP5KB, s.QueueP95KB, conv)
	if s.Fluid != nil {
		fmt.Fprintf(w, "  fluid model: queue %.1f KB, %.3f Gb/s per flow\n", s.Fluid.QueueMeanKB, s.Fluid.RateGbps)
	}
	if s.VictimGbps != nil {
		fmt.Fprintf(w, "  victim %.3f Gb/s  PFC pauses %d  drops %d\n", *s.VictimGbps, s.Pauses, s.Drops)
	}
	fmt.Fprintf(w, "  CNPs %d  drops %d  events %d (%.2f M/s)\n  written to %s\n",
		s.CNPCount, s.Drops, s.Events, s.EventsPerSec/1e6, dir)
}

func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// progressBar redraws one stderr line at most ten times a second.
type progressBar struct {
	w    io.Writer
	last time.Time
	used bool
}

func (b *progressBar) update(now, end clock.Time) {
	if t := time.Now(); t.Sub(b.last) >= 100*time.Millisecond {
		b.last = t
		b.used = true
		frac := float64(now) / float64(end)
		n := int(frac * 40)
		fmt.Fprintf(b.w, "\r[%s%s] %3.0f%%  %.1f / %.1f ms simulated", strings.Repeat("#", n), strings.Repeat(" ", 40-n),
			frac*100, float64(now)/1e6, float64(end)/1e6)
	}
}

func (b *progressBar) done() {
	if b.used {
		fmt.Fprint(b.w, "\r\033[K")
	}
}

// simSweep runs count seeds and reports how each flow's window mean varies
// from seed to seed (sweep.json in dir, a table and a histogram on stdout).
func simSweep(o sim.Options, first uint64, count int, tol float64, dir string, quiet bool, stdout io.Writer) error {
	res, err := sim.Sweep(o, first, count, tol)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "sweep.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	// sweep.csv: one row per seed and flow, for a histogram or a box plot.
	var csv strings.Builder
	csv.WriteString("seed,flow,mean_gbps\n")
	nf := len(res.Flows)
	for k, seed := range res.Seeds {
		for i := 0; i < nf; i++ {
			fmt.Fprintf(&csv, "%d,%d,%.6f\n", seed, i, res.AllRates[k*nf+i])
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "sweep.csv"), []byte(csv.String()), 0o644); err != nil {
		return err
	}
	var svg bytes.Buffer
	fig := res.Figure()
	if err := fig.WriteSVG(&svg); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "sweep.svg"), svg.Bytes(), 0o644); err != nil {
		return err
	}
	if quiet {
		return nil
	}
	fmt.Fprintf(stdout, "%s, profile %s, seeds %d–%d, window %g–%g ms, fair share %.3f Gb/s\n",
		res.Scenario, res.Profile, first, first+uint64(count)-1, res.WindowMs[0], res.WindowMs[1], res.FairGbps)
	fmt.Fprintf(stdout, "  %s\n", res.Config.String())
	for i, f := range res.Flows {
		if i == 8 && len(res.Flows) > 10 {
			fmt.Fprintf(stdout, "  … %d more flows in sweep.json\n", len(res.Flows)-8)
			break
		}
		fmt.Fprintf(stdout, "  flow %d  mean %7.3f  min %7.3f  max %7.3f  stdev %.3f Gb/s  outside ±%g: %d/%d\n",
			f.ID, f.Gbps.Mean, f.Gbps.Min, f.Gbps.Max, f.Gbps.Stdev, tol, f.Outside, count)
	}
	pr := func(name string, s sim.Spread, prec int) {
		fmt.Fprintf(stdout, "  %-12s mean %.*f  min %.*f  max %.*f  stdev %.*f\n", name, prec, s.Mean, prec, s.Min, prec, s.Max, prec, s.Stdev)
	}
	pr("Jain", res.Jain, 4)
	pr("utilisation", res.Utilization, 4)
	pr("queue KB", res.QueueMeanKB, 1)
	pr("CNPs", res.CNPCount, 0)
	fmt.Fprintf(stdout, "  drops %d\n", res.Drops)
	// Histogram of every flow's window mean, in tenths of the fair share
	// either side of it.
	w := res.FairGbps / 40
	lo := res.FairGbps - 10*w
	for k, c := range sim.Histogram(res.AllRates, lo, w, 20) {
		if c > 0 {
			fmt.Fprintf(stdout, "  %7.3f–%7.3f Gb/s %3d %s\n", lo+float64(k)*w, lo+float64(k+1)*w, c, strings.Repeat("#", c))
		}
	}
	return nil
}

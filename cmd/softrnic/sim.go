package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/congestion"
	"github.com/softrnic/softrnic/congestion/dcqcn"
	"github.com/softrnic/softrnic/sim"
)

func init() {
	register("sim", "deterministic congestion-control simulator (sim dcqcn|hpcc|timely|swift --scenario ... --out DIR; sim compare)", runSim)
}

const simUsage = `usage: softrnic sim dcqcn|hpcc|timely|swift [--scenario two-flow|n-flow|incast|workload] [flags] --out DIR
       softrnic sim compare --out DIR RUN_DIR...    (overlay workload runs' FCT slowdown)
Run 'softrnic sim ALGORITHM -h' for the flags.`

// simWorkerEnv marks a worker process of --seeds N --parallel P; its value
// is the seed it runs.
const simWorkerEnv = "SOFTRNIC_SIM_WORKER"

// knobList collects repeated --set name=value flags.
type knobList []string

func (k *knobList) String() string     { return strings.Join(*k, ",") }
func (k *knobList) Set(v string) error { *k = append(*k, v); return nil }

func runSim(args []string) int {
	if len(args) < 1 {
		fmt.Fprintln(os.Stderr, simUsage)
		return 2
	}
	var err error
	switch {
	case args[0] == "compare":
		err = simCompare(args[1:], os.Stdout, os.Stderr)
	case slices.Contains(sim.Algorithms, args[0]):
		err = simRun(args[0], args[1:], os.Stdout, os.Stderr)
	default:
		fmt.Fprintln(os.Stderr, simUsage)
		return 2
	}
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(os.Stderr, "softrnic sim:", err)
		return 1
	}
	return 0
}

// simDCQCN is softrnic sim dcqcn.
func simDCQCN(args []string, stdout, stderr io.Writer) error {
	return simRun(sim.DCQCN, args, stdout, stderr)
}

// simFlags are the command's flags beyond those that go straight into
// sim.Options.
type simFlags struct {
	out              string
	seed             uint64
	seeds, parallel  int
	quiet            bool
	tol              float64
	linkGbps, upGbps float64
	marking          string
	kmin, kmax       int64
	pmax             float64
	pfc, noPFC       bool
	npMode, order    string
	preset           string
	bufferMB         float64
	hpEta, hpAIMbps  float64
	hpMaxStage       int
	knobs            knobList
	set              map[string]bool
}

func simRun(alg string, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("sim "+alg, flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := sim.Options{Algorithm: alg}
	var f simFlags
	fs.StringVar(&f.out, "out", "", "output directory (required): summary.json and traces/plots, or for the workload fct.txt and slowdown.svg")
	fs.Uint64Var(&f.seed, "seed", 1, "random seed; the same seed gives byte-identical traces and fct.txt")
	fs.IntVar(&f.seeds, "seeds", 1, "run seeds seed…seed+N−1: a sweep of the per-seed spread (sweep.json), or for the workload one merged fct.txt and slowdown table, with each seed's run in DIR/seed-S")
	fs.IntVar(&f.parallel, "parallel", 1, "with --seeds: run the seeds in this many worker processes at once")
	fs.Float64Var(&f.tol, "tol", 1, "--seeds: band around the fair share, Gb/s, that the 'outside' count uses")
	fs.BoolVar(&f.quiet, "quiet", false, "no progress bar and no summary on stdout")
	fs.Float64Var(&f.linkGbps, "link-gbps", 0, "rate of every host link, Gb/s (default 40; workload 100)")
	fs.StringVar(&f.marking, "marking", "dequeue", "where switches ECN-mark: dequeue, enqueue or off")
	fs.Int64Var(&f.kmin, "kmin", 0, "RED Kmin, bytes (default 5000; workload 100 KB per 25 Gb/s)")
	fs.Int64Var(&f.kmax, "kmax", 0, "RED Kmax, bytes (default 200000; workload 400 KB per 25 Gb/s)")
	fs.Float64Var(&f.pmax, "pmax", 0, "RED Pmax (default 0.01; workload 0.2)")
	fs.BoolVar(&f.pfc, "pfc", false, "enable PFC (incast and workload enable it unless --no-pfc)")
	fs.BoolVar(&f.noPFC, "no-pfc", false, "disable PFC, also for incast and the workload")
	fs.StringVar(&f.npMode, "np", "", "dcqcn paper NP fork: immediate (the paper: first CNP at once, then at most one per N, deferred), drop (marks inside N dropped) or grid (ns3-rdma: CNPs only on a per-QP N clock)")
	fs.StringVar(&f.order, "order", "", "dcqcn paper RP fork: cut-then-alpha (the paper) or alpha-then-cut (ns3-rdma)")
	fs.Var(&f.knobs, "set", "dcqcn ConnectX knob name=value (mlx5 names, e.g. rpg_ai_rate=10); repeatable; implies --profile connectx")
	fs.StringVar(&f.preset, "preset", "", "hpcc: the HPCC paper's 320-server fat-tree (100 Gb/s hosts, 400 Gb/s fabric); implies --scenario workload")
	fs.Float64Var(&f.upGbps, "uplink-gbps", 0, "workload: rate of switch-to-switch links, Gb/s (default: what --oversub gives; hpcc 400)")
	fs.Float64Var(&f.bufferMB, "switch-buffer-mb", 0, "workload: shared buffer per switch, MB (default 32 per 100 Gb/s of host rate)")
	fs.Float64Var(&f.hpEta, "hpcc-eta", 0, "hpcc: target utilisation η (default 0.95)")
	fs.IntVar(&f.hpMaxStage, "hpcc-max-stage", -1, "hpcc: maxStage (default: the profile's, artifact 0, paper 5)")
	fs.Float64Var(&f.hpAIMbps, "hpcc-ai-mbps", 0, "hpcc: W_AI/T, Mb/s (default 10 per 25 Gb/s of host rate)")

	fs.StringVar(&o.Scenario, "scenario", "two-flow", "two-flow, n-flow, incast or workload")
	fs.IntVar(&o.Flows, "flows", 0, "n-flow: number of flows (4); incast: number of senders (16)")
	fs.StringVar(&o.Profile, "profile", "", "dcqcn: paper (default), connectx or hpcc-mlx (the workload's default); hpcc, timely: artifact (default) or paper; swift: default")
	fs.DurationVar(&o.Duration, "duration", 0, "simulated time (two-flow 110ms, n-flow 100ms+N ms, incast 20ms, workload 10ms)")
	fs.DurationVar(&o.Drain, "drain", 0, "workload: run on this long after the last arrival, so that more flows finish")
	fs.DurationVar(&o.LinkDelay, "link-delay", time.Microsecond, "propagation delay of every link")
	fs.IntVar(&o.PacketSize, "mtu", 0, "data packet payload, bytes (1000; two-flow, n-flow and incast count it as the wire size)")
	fs.IntVar(&o.HeaderBytes, "headers", 0, "header bytes per data packet on top of --mtu (0; workload 48)")
	fs.IntVar(&o.AckInterval, "ack-interval", 0, "data packets per ACK (1)")
	fs.DurationVar(&o.TraceInterval, "trace-interval", 0, "period of trace rows (10µs; 100µs above 16 flows)")
	fs.BoolVar(&o.Retime, "retime", false, "a rate change re-times the pacer's pending gap (HPCC ns-3 ChangeRate); default: it applies from the next packet (ns3-rdma)")
	fs.DurationVar(&o.WindowStart, "window-start", 0, "start of the measurement window (default: 20 ms before the end)")
	fs.DurationVar(&o.ThroughputBin, "throughput-bin", 0, "bin of the received-throughput trace (1ms; incast 100µs)")
	fs.StringVar(&o.Topology, "topology", "", "workload: leaf-spine (default), fat-tree or hpcc")
	fs.IntVar(&o.K, "k", 0, "workload fat-tree: k (4): k pods of k/2 ToRs and k/2 aggregation switches, (k/2)² cores")
	fs.IntVar(&o.HostsPerToR, "hosts-per-tor", 0, "workload fat-tree: hosts per ToR (k/2 · oversub)")
	fs.IntVar(&o.Leaves, "leaves", 0, "workload leaf-spine: leaves (4)")
	fs.IntVar(&o.Spines, "spines", 0, "workload leaf-spine: spines (4)")
	fs.IntVar(&o.HostsPerLeaf, "hosts-per-leaf", 0, "workload leaf-spine: hosts per leaf (8)")
	fs.Float64Var(&o.Oversub, "oversub", 0, "workload: a ToR's host bandwidth over its uplink bandwidth (1)")
	fs.StringVar(&o.CDF, "cdf", "", "workload: flow sizes, websearch (default), fbhadoop or a CDF file in HPCC's traffic_gen format")
	fs.Float64Var(&o.Load, "load", 0, "workload: offered load per host, fraction of its link (0.3)")
	fs.IntVar(&o.IncastFanIn, "incast", 0, "workload: add an incast burst of this many senders every --incast-every")
	fs.Int64Var(&o.IncastSize, "incast-size", 0, "bytes per incast sender (incast scenario 1 MB; workload 500 KB)")
	fs.DurationVar(&o.IncastEvery, "incast-every", 0, "workload: period of the incast bursts (1ms)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if f.out == "" {
		return errors.New("--out DIR is required")
	}
	f.set = map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { f.set[fl.Name] = true })
	if err := f.apply(&o); err != nil {
		return err
	}
	switch {
	case f.seeds > 1 && (o.Scenario == sim.Workload || f.parallel > 1):
		return simSeeds(alg, args, o, &f, stdout, stderr)
	case f.seeds > 1:
		res, err := sim.Sweep(o, f.seed, f.seeds, f.tol)
		if err != nil {
			return err
		}
		return writeSweep(res, f.seed, f.seeds, f.tol, f.out, f.quiet, stdout)
	case f.seeds < 1 || f.parallel < 1:
		return errors.New("--seeds and --parallel must be ≥ 1")
	}
	var bar *progressBar
	if !f.quiet && os.Getenv(simWorkerEnv) == "" && isTerminal(os.Stderr) {
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
	if err := res.WriteDir(f.out); err != nil {
		return err
	}
	if !f.quiet {
		printSummary(stdout, &res.Summary, f.out)
	}
	return nil
}

// apply turns the flags into Options: a flag left unset leaves the
// scenario's default.
func (f *simFlags) apply(o *sim.Options) error {
	o.Seed = f.seed
	switch f.preset {
	case "":
	case "hpcc":
		if f.set["scenario"] && o.Scenario != sim.Workload {
			return errors.New("--preset hpcc is a workload")
		}
		if f.set["topology"] && o.Topology != sim.HPCCTopo {
			return errors.New("--preset hpcc sets --topology hpcc")
		}
		o.Scenario, o.Topology = sim.Workload, sim.HPCCTopo
	default:
		return fmt.Errorf("--preset %q: want hpcc", f.preset)
	}
	if f.set["link-gbps"] {
		o.LinkRate = congestion.Rate(f.linkGbps) * congestion.Gbps
	}
	if f.set["uplink-gbps"] {
		o.UplinkRate = congestion.Rate(f.upGbps) * congestion.Gbps
	}
	if f.set["switch-buffer-mb"] {
		o.SwitchBuffer = int64(f.bufferMB * 1e6)
	}
	o.PFC, o.NoPFC = f.pfc, f.noPFC
	switch f.marking {
	case "dequeue":
		o.Marking = sim.MarkDequeue
	case "enqueue":
		o.Marking = sim.MarkEnqueue
	case "off":
		o.Marking = sim.MarkOff
	default:
		return fmt.Errorf("--marking %q: want dequeue, enqueue or off", f.marking)
	}
	if f.set["kmin"] || f.set["kmax"] || f.set["pmax"] {
		// Unset ends of the ramp keep the scenario's defaults.
		d := *o
		_ = d.Defaults()
		red := d.RED
		if f.set["kmin"] {
			red.Kmin = f.kmin
		}
		if f.set["kmax"] {
			red.Kmax = f.kmax
		}
		if f.set["pmax"] {
			red.Pmax = f.pmax
		}
		o.RED, o.ScaleRED = red, d.ScaleRED
	}
	if len(f.knobs) > 0 {
		if o.Algorithm != sim.DCQCN || (o.Profile != "" && o.Profile != "paper" && o.Profile != "connectx") {
			return errors.New("--set applies to dcqcn's connectx profile")
		}
		o.Profile = "connectx"
		cx := dcqcn.DefaultConnectX()
		for _, kv := range f.knobs {
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
	if f.npMode != "" || f.order != "" {
		if o.Algorithm != sim.DCQCN || (o.Profile != "" && o.Profile != "paper") {
			return errors.New("--np and --order apply to dcqcn's paper profile")
		}
		o.Profile = "paper"
		rate := o.LinkRate
		if rate == 0 {
			rate = 40 * congestion.Gbps
		}
		rp, np, err := sim.Profiles("paper", rate)
		if err != nil {
			return err
		}
		switch f.npMode {
		case "", "immediate":
		case "drop":
			np.Defer = false
		case "grid":
			np.Grid = true
		default:
			return fmt.Errorf("--np %q: want immediate, drop or grid", f.npMode)
		}
		switch f.order {
		case "", "cut-then-alpha":
		case "alpha-then-cut":
			rp.Order = dcqcn.AlphaThenCut
		default:
			return fmt.Errorf("--order %q: want cut-then-alpha or alpha-then-cut", f.order)
		}
		o.RP, o.NP = &rp, &np
	}
	if f.set["hpcc-eta"] || f.set["hpcc-max-stage"] || f.set["hpcc-ai-mbps"] {
		if o.Algorithm != sim.HPCC {
			return errors.New("--hpcc-* flags apply to hpcc")
		}
		// The profile's configuration with the flags' changes; T and the
		// line rate are the topology's, which only the run knows: take
		// them from a dry build.
		d := *o
		r, err := sim.Configure(d)
		if err != nil {
			return err
		}
		c := r.HPCC
		if f.set["hpcc-eta"] {
			c.Eta = f.hpEta
		}
		if f.set["hpcc-max-stage"] {
			c.MaxStage = f.hpMaxStage
		}
		if f.set["hpcc-ai-mbps"] {
			c.AIRate = congestion.Rate(f.hpAIMbps) * congestion.Mbps
		}
		o.HPCC = &c
	}
	return nil
}

func printSummary(w io.Writer, s *sim.Summary, dir string) {
	fmt.Fprintf(w, "%s %s, profile %s, seed %d: %g ms simulated, window %g–%g ms\n",
		s.Algorithm, s.Scenario, s.Profile, s.Seed, s.DurationMs, s.WindowMs[0], s.WindowMs[1])
	fmt.Fprintf(w, "  %s\n", s.Config.String())
	if s.Workload != nil {
		printWorkload(w, s)
		fmt.Fprintf(w, "  written to %s\n", dir)
		return
	}
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
	fmt.Fprintf(w, "  Jain %.4f  utilisation %.4f  queue mean %.1f KB (p5 %.1f, p95 %.1f, peak %.1f)  convergence %s\n",
		s.Jain, s.Utilization, s.QueueMeanKB, s.QueueP5KB, s.QueueP95KB, s.QueuePeakKB, conv)
	if s.Fluid != nil {
		fmt.Fprintf(w, "  fluid model: queue %.1f KB, %.3f Gb/s per flow\n", s.Fluid.QueueMeanKB, s.Fluid.RateGbps)
	}
	if s.VictimGbps != nil {
		fmt.Fprintf(w, "  victim %.3f Gb/s  PFC pauses %d  drops %d\n", *s.VictimGbps, s.Pauses, s.Drops)
	}
	fmt.Fprintf(w, "  CNPs %d  drops %d  events %d (%.2f M/s, %.2f M per CPU-s)\n  written to %s\n",
		s.CNPCount, s.Drops, s.Events, s.EventsPerSec/1e6, s.EventsPerCPUSec/1e6, dir)
}

func printWorkload(w io.Writer, s *sim.Summary) {
	ws := s.Workload
	fmt.Fprintf(w, "  %s: %d hosts at %g Gb/s, %d switches, uplinks %g Gb/s; %s flows (mean %.0f B) at load %g",
		ws.Topology, ws.Hosts, ws.HostGbps, ws.Switches, ws.UplinkGbps, ws.CDF, ws.MeanBytes, ws.Load)
	if ws.IncastFanIn > 0 {
		fmt.Fprintf(w, " + %d incasts of %d×%d B", ws.Incasts, ws.IncastFanIn, ws.IncastBytes)
	}
	fmt.Fprintf(w, "\n  flows finished %d of %d; offered load %.3f, delivered %.3f; queue mean %.1f KB, p99 %.0f KB, max %.0f KB; drops %d, PFC pauses %d\n",
		ws.FlowsFinished, ws.FlowsArrived, ws.OfferedLoad, ws.DeliveredLoad, ws.QueueMeanKB, ws.QueueP99KB, ws.QueueMaxKB, s.Drops, s.Pauses)
	fmt.Fprintf(w, "  FCT slowdown (fct_analysis.py buckets, background flows):\n    %6s %10s %6s %8s %8s %8s\n", "pct", "max size", "flows", "p50", "p95", "p99")
	for _, b := range ws.Slowdown {
		fmt.Fprintf(w, "    %5.0f%% %10d %6d %8.2f %8.2f %8.2f\n", b.Pct, b.MaxBytes, b.Count, b.P50, b.P95, b.P99)
	}
	for _, x := range []struct {
		name string
		st   *sim.SlowdownStats
	}{{"≤ 100 KB", ws.Small}, {"100 KB–1 MB", ws.Medium}, {"> 1 MB", ws.Large}, {"incast", ws.Incast}} {
		if x.st != nil {
			fmt.Fprintf(w, "    %-12s %6d flows: p50 %.2f  p95 %.2f  p99 %.2f\n", x.name, x.st.Count, x.st.P50, x.st.P95, x.st.P99)
		}
	}
	fmt.Fprintf(w, "  events %d (%.2f M per CPU-s), %.1f s wall\n", s.Events, s.EventsPerCPUSec/1e6, s.WallSeconds)
}

func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// progressBar redraws one stderr line at most ten times a second.
type progressBar struct {
	w     io.Writer
	last  time.Time
	used  bool
	label string
}

func (b *progressBar) update(now, end clock.Time) {
	b.draw(float64(now)/float64(end), fmt.Sprintf("%.1f / %.1f ms simulated", float64(now)/1e6, float64(end)/1e6))
}

func (b *progressBar) draw(frac float64, what string) {
	if t := time.Now(); t.Sub(b.last) >= 100*time.Millisecond {
		b.last = t
		b.used = true
		n := min(max(int(frac*40), 0), 40)
		fmt.Fprintf(b.w, "\r[%s%s] %3.0f%%  %s%s", strings.Repeat("#", n), strings.Repeat(" ", 40-n), frac*100, b.label, what)
	}
}

func (b *progressBar) done() {
	if b.used {
		fmt.Fprint(b.w, "\r\033[K")
	}
}

// writeSweep writes a sweep (sweep.json, sweep.csv, sweep.svg in dir) and
// prints its table and histogram.
func writeSweep(res *sim.SweepResult, first uint64, count int, tol float64, dir string, quiet bool, stdout io.Writer) error {
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
	fmt.Fprintf(stdout, "%s %s, profile %s, seeds %d–%d, window %g–%g ms, fair share %.3f Gb/s\n",
		res.Algorithm, res.Scenario, res.Profile, first, first+uint64(count)-1, res.WindowMs[0], res.WindowMs[1], res.FairGbps)
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

// simSeeds runs seeds seed…seed+N−1 in worker processes, at most
// f.parallel at once, each into DIR/seed-S, and merges them: a sweep for
// the small scenarios, one fct.txt and slowdown table for the workload.
func simSeeds(alg string, args []string, o sim.Options, f *simFlags, stdout, stderr io.Writer) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(f.out, 0o755); err != nil {
		return err
	}
	base := workerArgs(args)
	seeds := make([]uint64, f.seeds)
	for i := range seeds {
		seeds[i] = f.seed + uint64(i)
	}
	var bar *progressBar
	if !f.quiet && isTerminal(os.Stderr) {
		bar = &progressBar{w: stderr}
	}
	errs := make([]error, len(seeds))
	var (
		mu   sync.Mutex
		done int
		wg   sync.WaitGroup
	)
	sem := make(chan struct{}, f.parallel)
	for i, s := range seeds {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			dir := filepath.Join(f.out, fmt.Sprintf("seed-%d", s))
			a := append([]string{"sim", alg}, base...)
			a = append(a, "--seed", strconv.FormatUint(s, 10), "--out", dir, "--quiet")
			cmd := exec.Command(exe, a...)
			cmd.Env = append(os.Environ(), simWorkerEnv+"="+strconv.FormatUint(s, 10))
			var eb bytes.Buffer
			cmd.Stderr = &eb
			if err := cmd.Run(); err != nil {
				errs[i] = fmt.Errorf("seed %d: %w: %s", s, err, strings.TrimSpace(eb.String()))
			}
			mu.Lock()
			done++
			if bar != nil {
				bar.draw(float64(done)/float64(len(seeds)), fmt.Sprintf("%d of %d seeds", done, len(seeds)))
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	if bar != nil {
		bar.done()
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	var sums []sim.Summary
	var fcts [][]byte
	for _, s := range seeds {
		dir := filepath.Join(f.out, fmt.Sprintf("seed-%d", s))
		sm, err := readSummary(dir)
		if err != nil {
			return err
		}
		sums = append(sums, *sm)
		if o.Scenario == sim.Workload {
			b, err := os.ReadFile(filepath.Join(dir, sim.FCTFile))
			if err != nil {
				return err
			}
			fcts = append(fcts, b)
		}
	}
	if o.Scenario != sim.Workload {
		res, err := sim.SweepOf(sums, f.tol)
		if err != nil {
			return err
		}
		return writeSweep(res, f.seed, f.seeds, f.tol, f.out, f.quiet, stdout)
	}
	m, fct, err := sim.MergeWorkload(sums, fcts)
	if err != nil {
		return err
	}
	if err := sim.WriteWorkloadDir(f.out, &m, fct); err != nil {
		return err
	}
	if !f.quiet {
		fmt.Fprintf(stdout, "%s workload, profile %s, seeds %d–%d merged (%d worker processes, %d at once)\n",
			m.Algorithm, m.Profile, seeds[0], seeds[len(seeds)-1], len(seeds), f.parallel)
		fmt.Fprintf(stdout, "  %s\n", m.Config.String())
		printWorkload(stdout, &m)
		fmt.Fprintf(stdout, "  written to %s (each seed in %s/seed-S)\n", f.out, f.out)
	}
	return nil
}

// workerArgs is the command line without the flags the parent sets for
// each worker (--seed, --seeds, --parallel, --out, --quiet).
func workerArgs(args []string) []string {
	drop := map[string]bool{"seed": true, "seeds": true, "parallel": true, "out": true, "quiet": false}
	var out []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		name, _, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		valued, ok := drop[name]
		if !strings.HasPrefix(a, "-") || !ok {
			out = append(out, a)
			continue
		}
		if valued && !hasVal {
			i++ // its value is the next argument
		}
	}
	return out
}

func readSummary(dir string) (*sim.Summary, error) {
	b, err := os.ReadFile(filepath.Join(dir, sim.SummaryFile))
	if err != nil {
		return nil, err
	}
	var s sim.Summary
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	return &s, nil
}

// simCompare overlays the FCT slowdown of workload runs (each a directory
// a run or a merge of seeds wrote) in one figure and one table.
func simCompare(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("sim compare", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("out", "", "output directory (required): compare.svg and compare.json")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" || fs.NArg() < 1 {
		return errors.New("usage: softrnic sim compare --out DIR RUN_DIR [RUN_DIR ...]")
	}
	type entry struct {
		Dir       string               `json:"dir"`
		Algorithm string               `json:"algorithm"`
		Profile   string               `json:"profile"`
		Seeds     int                  `json:"seeds"`
		Flows     int                  `json:"flows_finished"`
		Small     *sim.SlowdownStats   `json:"small_le_100kb,omitempty"`
		Medium    *sim.SlowdownStats   `json:"medium_100kb_1mb,omitempty"`
		Large     *sim.SlowdownStats   `json:"large_gt_1mb,omitempty"`
		Slowdown  []sim.SlowdownBucket `json:"slowdown"`
		Drops     uint64               `json:"drops"`
		Pauses    uint64               `json:"pfc_pauses"`
		Delivered float64              `json:"delivered_load"`
	}
	var es []entry
	var runs []sim.SlowdownRun
	var title string
	for _, dir := range fs.Args() {
		s, err := readSummary(dir)
		if err != nil {
			return err
		}
		if s.Workload == nil {
			return fmt.Errorf("%s: not a workload run", dir)
		}
		w := s.Workload
		e := entry{Dir: dir, Algorithm: s.Algorithm, Profile: s.Profile, Seeds: max(len(s.Seeds), 1), Flows: w.FlowsFinished,
			Small: w.Small, Medium: w.Medium, Large: w.Large, Slowdown: w.Slowdown, Drops: s.Drops, Pauses: s.Pauses, Delivered: w.DeliveredLoad}
		es = append(es, e)
		name := s.Algorithm + " " + s.Profile
		runs = append(runs, sim.SlowdownRun{Name: name, Table: w.Slowdown})
		if title == "" {
			title = sim.SlowdownTitle(s)
		}
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(es, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(*out, "compare.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	var svg bytes.Buffer
	fig := sim.SlowdownFigure(title, runs)
	if err := fig.WriteSVG(&svg); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(*out, "compare.svg"), svg.Bytes(), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s\n  %-22s %6s %7s   %-23s %-23s %-23s %6s %7s\n", title, "run", "seeds", "flows",
		"≤100KB p50/p95/p99", "100KB–1MB p50/p95/p99", ">1MB p50/p95/p99", "drops", "pauses")
	cell := func(s *sim.SlowdownStats) string {
		if s == nil {
			return "-"
		}
		return fmt.Sprintf("%.2f/%.2f/%.2f", s.P50, s.P95, s.P99)
	}
	for i, e := range es {
		fmt.Fprintf(stdout, "  %-22s %6d %7d   %-23s %-23s %-23s %6d %7d\n", runs[i].Name, e.Seeds, e.Flows, cell(e.Small), cell(e.Medium), cell(e.Large), e.Drops, e.Pauses)
	}
	fmt.Fprintf(stdout, "  written to %s\n", *out)
	return nil
}

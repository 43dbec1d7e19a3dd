package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/softrnic/softrnic/lab/dcqcnlive/internal/testbed"
)

func main() { os.Exit(run()) }

// buildSoftrnic builds ./cmd/softrnic (run from the module's root, as make
// does) into a temporary directory, so that `make dcqcn-live` runs the
// softrnic flows of the tree it is in without a separate build step.
func buildSoftrnic() (bin string, cleanup func(), err error) {
	dir, err := os.MkdirTemp("", "dcqcnlive-bin-")
	if err != nil {
		return "", nil, err
	}
	cleanup = func() {
		if err := os.RemoveAll(dir); err != nil {
			fmt.Fprintln(os.Stderr, "dcqcnlive:", err)
		}
	}
	bin = filepath.Join(dir, "softrnic")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/softrnic")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		cleanup()
		return "", nil, fmt.Errorf("go build ./cmd/softrnic (run from the module root, or give -softrnic): %w", err)
	}
	return bin, cleanup, nil
}

func run() int {
	cc := flag.String("cc", "dcqcn", "congestion control of the softrnic endpoints, ALGORITHM[:PROFILE]: dcqcn (paper, connectx), swift (default) or timely (artifact, paper)")
	profile := flag.String("profile", "", "DCQCN profile: paper (40 Gb/s, the default) or connectx (100 Gb/s); the same as -cc dcqcn:PROFILE")
	noSim := flag.Bool("no-sim", false, "do not run the simulator's prediction for the same scaled scenario")
	scale := flag.Float64("scale", testbed.DefaultScale, "time dilation S: rates ÷ S, timers × S, bytes unchanged")
	duration := flag.Duration("duration", 30*time.Second, "run length (wall time)")
	join := flag.Duration("join", 0, "when flow 2 starts (wall time; default S × 10 ms, the paper's 10 ms)")
	endpoints := flag.String("endpoints", "softrnic", "flow endpoints: softrnic (perf write_bw with DCQCN, see -softrnic) or raw (ECT(0) UDP/4791 at a fixed rate, not congestion-controlled)")
	softrnicBin := flag.String("softrnic", "", "softrnic binary for -endpoints softrnic (default: go build ./cmd/softrnic into a temporary directory)")
	serverCmd := flag.String("server-cmd", "", "server command template for -endpoints softrnic (space-separated; default: "+strings.Join(testbed.SoftrnicServer, " ")+")")
	clientCmd := flag.String("client-cmd", "", "client command template (default: the server's plus {server})")
	shared := flag.Bool("shared-server", true, "-endpoints softrnic: one server in r for both flows (--clients 2 in its command line); false: one server per flow on ports 18516, 18517")
	rawLoad := flag.Float64("raw-load", 0.75, "raw endpoints: each sender's rate as a fraction of the bottleneck")
	dscp := flag.Uint("dscp", 26, "DSCP of data packets (they are sent ECT(0))")
	seed := flag.Uint64("seed", 1, "marker's random seed")
	out := flag.String("out", "out/dcqcn-live", "output directory (summary.json, rates.csv, queue.csv, trace.csv)")
	trace := flag.Bool("trace", false, "keep the marker's per-packet queue samples (trace.csv)")
	resync := flag.Bool("resync", true, "reset the marker's virtual queue to tbf's backlog at every 5 ms poll (corrects drift when the kernel serves tbf late)")
	flag.Parse()

	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "dcqcnlive: needs root (network namespaces, veth, tc, BPF)")
		return 2
	}
	algo, prof, _ := strings.Cut(*cc, ":")
	if *profile != "" {
		if algo != "dcqcn" || prof != "" && prof != *profile {
			fmt.Fprintf(os.Stderr, "dcqcnlive: -profile %s is DCQCN's and conflicts with -cc %s\n", *profile, *cc)
			return 2
		}
		prof = *profile
	}
	plan, err := testbed.PlanForCC(algo, prof, *scale, *seed)
	if err != nil {
		fmt.Fprintln(os.Stderr, "dcqcnlive:", err)
		return 2
	}
	var ep testbed.Endpoints
	switch *endpoints {
	case "raw":
		ep = &testbed.RawECT{}
	case "softrnic":
		if *softrnicBin == "" {
			bin, cleanup, err := buildSoftrnic()
			if err != nil {
				fmt.Fprintln(os.Stderr, "dcqcnlive:", err)
				return 1
			}
			defer cleanup()
			*softrnicBin = bin
		}
		// One server in r serves both flows (one process owns r's AF_XDP
		// queue); -shared-server=false runs one per flow, for other tools.
		c := &testbed.CommandEndpoints{Label: "softrnic", CC: true, Bin: *softrnicBin,
			Server: testbed.SoftrnicServer, Client: testbed.SoftrnicClient, SharedServer: *shared, Clients: 2, LogDir: *out}
		if *serverCmd != "" {
			c.Server = strings.Fields(*serverCmd)
		}
		if *clientCmd != "" {
			c.Client = strings.Fields(*clientCmd)
		}
		ep = c
	default:
		fmt.Fprintf(os.Stderr, "dcqcnlive: unknown endpoints %q (raw, softrnic)\n", *endpoints)
		return 2
	}
	if *join == 0 {
		*join = time.Duration(*scale * float64(10*time.Millisecond))
	}
	if *dscp > 63 {
		fmt.Fprintln(os.Stderr, "dcqcnlive: DSCP above 63")
		return 2
	}
	if plan.Algorithm == "dcqcn" {
		fmt.Printf("dcqcnlive: %s profile at S=%g: dilated DCQCN T=%v K=%v N=%v R_AI=%.3g Mb/s R_HAI=%.3g Mb/s line %.4g Mb/s\n",
			plan.Profile, plan.Scale, plan.RP.TimerPeriod, plan.RP.AlphaPeriod, plan.NP.MinInterval,
			float64(plan.RP.AIRate)/1e6, float64(plan.RP.HAIRate)/1e6, float64(plan.RP.LineRate)/1e6)
	} else {
		fmt.Printf("dcqcnlive: %s at S=%g (softrnic --cc %s --cc-scale %g): line %.4g Mb/s\n",
			plan.Algorithm, plan.Scale, plan.CC(), plan.Scale, float64(plan.LineRate)/plan.Scale/1e6)
	}
	var pred *testbed.Prediction
	if !*noSim && *endpoints == "softrnic" {
		if pred, err = testbed.Predict(plan, *duration, *join); err != nil {
			fmt.Fprintln(os.Stderr, "dcqcnlive: simulator:", err)
			return 2
		}
	}

	// Interrupts end the run early through the normal path, so the
	// namespaces are always removed.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	e := testbed.Experiment{
		Plan: plan, Endpoints: ep, Duration: *duration, Join: *join,
		PayloadBytes: 1024, DSCP: uint8(*dscp), RawLoad: *rawLoad, Trace: *trace, Resync: *resync, Out: *out,
		Log:  func(f string, a ...any) { fmt.Printf(f+"\n", a...) },
		Stop: sig, Sim: pred,
	}
	sum, err := e.Run()
	if err != nil {
		fmt.Fprintln(os.Stderr, "dcqcnlive:", err)
		return 1
	}
	j, _ := json.MarshalIndent(sum, "", "  ")
	fmt.Println(string(j))
	printBeside(os.Stdout, &sum)
	fmt.Printf("dcqcnlive: wrote %s/{summary.json,rates.csv,queue.csv", *out)
	if *trace {
		fmt.Print(",trace.csv")
	}
	fmt.Println("}")
	return 0
}

// printBeside prints the live two-flow figures beside the simulator's for
// the same scaled scenario.
func printBeside(w io.Writer, s *testbed.Summary) {
	fmt.Fprintf(w, "\ndcqcnlive: %s (%s) at S=%g, %.0f Mb/s bottleneck, window %.1f–%.1f s, host load %.1f→%.1f\n",
		s.Algorithm, s.Profile, s.Scale, s.BottleneckMbps, s.WindowS[0], s.WindowS[1], s.HostLoad[0], s.HostLoad[1])
	fmt.Fprintf(w, "  %-10s %-22s %-8s %-11s %s\n", "", "flows (× C)", "Jain", "utilisation", "queue mean / p5 / p95 KB")
	var fl []string
	for _, f := range s.Flows {
		fl = append(fl, fmt.Sprintf("%.3f", f.Normalised))
	}
	fmt.Fprintf(w, "  %-10s %-22s %-8.4f %-11.3f %.1f / %.1f / %.1f\n", "live", strings.Join(fl, " / "), s.Jain, s.Utilization,
		s.Queue.MeanKB, s.Queue.P5KB, s.Queue.P95KB)
	if p := s.Sim; p != nil {
		fl = fl[:0]
		for _, n := range p.Normalised {
			fl = append(fl, fmt.Sprintf("%.3f", n))
		}
		fmt.Fprintf(w, "  %-10s %-22s %-8.4f %-11.3f %.1f / %.1f / %.1f\n", "simulator", strings.Join(fl, " / "), p.Jain, p.Utilization,
			p.QueueMeanKB, p.QueueP5KB, p.QueueP95KB)
		fmt.Fprintf(w, "  (simulator: %s undilated at %.0f Gb/s for %.0f ms, window %.0f–%.0f ms; %s)\n", p.Algorithm, p.LineGbps,
			p.DurationMs, p.WindowMs[0], p.WindowMs[1], p.Note)
	}
	if s.SenderLimited {
		fmt.Fprintf(w, "  sender-limited: congestion control allowed %.1f Mb/s together, the flows used %.1f\n", s.RPSumMbps, s.Utilization*s.BottleneckMbps)
	}
}

package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/softrnic/softrnic/lab/dcqcnlive/testbed"
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
	profile := flag.String("profile", "paper", "DCQCN profile: paper (40 Gb/s) or connectx (100 Gb/s)")
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
	plan, err := testbed.PlanFor(*profile, *scale, *seed)
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
	fmt.Printf("dcqcnlive: %s profile at S=%g: dilated DCQCN T=%v K=%v N=%v R_AI=%.3g Mb/s R_HAI=%.3g Mb/s line %.4g Mb/s\n",
		plan.Profile, plan.Scale, plan.RP.TimerPeriod, plan.RP.AlphaPeriod, plan.NP.MinInterval,
		float64(plan.RP.AIRate)/1e6, float64(plan.RP.HAIRate)/1e6, float64(plan.RP.LineRate)/1e6)

	// Interrupts end the run early through the normal path, so the
	// namespaces are always removed.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	e := testbed.Experiment{
		Plan: plan, Endpoints: ep, Duration: *duration, Join: *join,
		PayloadBytes: 1024, DSCP: uint8(*dscp), RawLoad: *rawLoad, Trace: *trace, Resync: *resync, Out: *out,
		Log:  func(f string, a ...any) { fmt.Printf(f+"\n", a...) },
		Stop: sig,
	}
	sum, err := e.Run()
	if err != nil {
		fmt.Fprintln(os.Stderr, "dcqcnlive:", err)
		return 1
	}
	j, _ := json.MarshalIndent(sum, "", "  ")
	fmt.Println(string(j))
	fmt.Printf("dcqcnlive: wrote %s/{summary.json,rates.csv,queue.csv", *out)
	if *trace {
		fmt.Print(",trace.csv")
	}
	fmt.Println("}")
	return 0
}

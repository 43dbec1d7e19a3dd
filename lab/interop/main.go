// Command interop is the lab's runner: it boots the kernel's Soft-RoCE
// (rdma_rxe) in qemu guests built by lab/build, with their NICs on taps in
// a network namespace of its own, and runs a case file of stock rdma-core /
// perftest commands against a peer.
//
// Two modes:
//
//   - interop (default, `make interop`): one guest on tap lt0; the host side
//     of every case is a softrnic command run in the namespace, attached to
//     that tap. Cases whose softrnic subcommand is not built yet are skipped.
//   - -selfcheck (`make lab-selfcheck`): two guests on one bridge, rxe
//     against rxe, which proves the lab itself (images, boot, job loop,
//     counters, netem loss, captures) independently of softrnic, and leaves
//     fresh real captures of every case.
//
// The guests boot once per run and take the cases one after the other
// through their 9p shares. Per case the runner prints one line, and at the
// end "N passed, N failed"; it exits 1 when any case failed.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"
)

type options struct {
	selfcheck  bool
	cases      string
	only       string
	list       bool
	cache      string
	out        string
	softrnic   string
	capture    bool
	pcapCheck  string
	keepPcaps  bool
	bootLimit  time.Duration
	keepShares bool
}

func main() {
	var o options
	flag.BoolVar(&o.selfcheck, "selfcheck", false, "run the lab self-check: two rxe guests against each other")
	flag.StringVar(&o.cases, "cases", "", "case file (default lab/interop/cases.txt, or lab/interop/selfcheck.txt with -selfcheck)")
	flag.StringVar(&o.only, "only", "", "run only the cases whose name matches this regular expression")
	flag.BoolVar(&o.list, "list", false, "list the cases (after -only) and exit")
	flag.StringVar(&o.cache, "cache", "lab/cache", "where lab/build left vmlinuz and initrd.img")
	flag.StringVar(&o.out, "out", "", "results directory (default out/lab/MODE-TIME)")
	flag.StringVar(&o.softrnic, "softrnic", "bin/softrnic", "the softrnic binary host sides run")
	flag.BoolVar(&o.capture, "capture", true, "capture each case's RoCEv2 frames to OUT/pcap/CASE.pcap (whole frames, for the ICRC check)")
	flag.BoolVar(&o.keepPcaps, "keep-pcaps", false, "keep the captures of passing cases too (always with -selfcheck: they are the fresh reference captures)")
	flag.StringVar(&o.pcapCheck, "pcapcheck", "", "command run on each capture, {} replaced by its path; non-zero exit fails the case (default with captures: SOFTRNIC pcap {} when that subcommand exists; \"none\" disables)")
	flag.DurationVar(&o.bootLimit, "boot-timeout", 120*time.Second, "how long a guest may take to boot")
	flag.Parse()
	if flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "interop: unexpected arguments:", flag.Args())
		os.Exit(2)
	}
	os.Exit(run(o))
}

func run(o options) int {
	mode := "interop"
	if o.selfcheck {
		mode = "selfcheck"
		o.keepPcaps = true
	}
	if o.cases == "" {
		o.cases = filepath.Join("lab", "interop", mode+".txt")
		if !o.selfcheck {
			o.cases = filepath.Join("lab", "interop", "cases.txt")
		}
	}
	f, err := os.Open(o.cases)
	if err != nil {
		fmt.Fprintln(os.Stderr, "interop:", err)
		return 2
	}
	all, err := ParseCases(f)
	f.Close()
	if err != nil {
		fmt.Fprintf(os.Stderr, "interop: %s: %v\n", o.cases, err)
		return 2
	}
	cases, err := Filter(all, o.only)
	if err != nil {
		fmt.Fprintln(os.Stderr, "interop:", err)
		return 2
	}
	peers := map[string]bool{"host": true, "guest": true}
	if o.selfcheck {
		peers = map[string]bool{"a": true, "b": true}
	}
	for _, c := range cases {
		if !peers[c.Server.Peer] || !peers[c.Client.Peer] {
			fmt.Fprintf(os.Stderr, "interop: %s:%d: case %s uses a peer this mode does not have\n", o.cases, c.Line, c.Name)
			return 2
		}
	}

	// Which cases can run: those whose host side's softrnic subcommand exists.
	skip := map[string]string{}
	var have map[string]bool
	if !o.selfcheck {
		have, err = softrnicCommands(o.softrnic)
		for _, c := range cases {
			sub := c.HostSubcommand()
			switch {
			case sub == "":
			case err != nil:
				skip[c.Name] = fmt.Sprintf("%s not built (make build)", o.softrnic)
			case !have[sub]:
				skip[c.Name] = fmt.Sprintf("softrnic %s not available yet", sub)
			}
		}
	}
	if o.list {
		for _, c := range cases {
			s := ""
			if why, ok := skip[c.Name]; ok {
				s = "  [skip: " + why + "]"
			}
			fmt.Printf("%-60s mtu=%d ip=%d %s-server %s-client%s\n", c.Name, c.MTU, c.IP, c.Server.Peer, c.Client.Peer, s)
		}
		fmt.Printf("%d cases\n", len(cases))
		return 0
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "interop: needs root (network namespace, taps, qemu)")
		return 2
	}
	for _, p := range []string{"vmlinuz", "initrd.img"} {
		if _, err := os.Stat(filepath.Join(o.cache, p)); err != nil {
			fmt.Fprintf(os.Stderr, "interop: %v (run make lab first)\n", err)
			return 2
		}
	}
	if o.out == "" {
		o.out = filepath.Join("out", "lab", mode+"-"+time.Now().UTC().Format("20060102-150405"))
	}
	if o.out, err = filepath.Abs(o.out); err != nil {
		fmt.Fprintln(os.Stderr, "interop:", err)
		return 2
	}
	if o.pcapCheck == "" && o.capture {
		// softrnic pcap checks every frame's ICRC (Wireshark does not).
		if cmds, err := softrnicCommands(o.softrnic); err == nil && cmds["pcap"] {
			bin, _ := filepath.Abs(o.softrnic)
			// Keep the summary and the bad frames; pipefail keeps pcap's status.
			o.pcapCheck = "set -o pipefail; " + bin + " pcap {} | grep -v icrc=ok"
		}
	}
	if o.pcapCheck == "none" {
		o.pcapCheck = ""
	}
	var runnable []Case
	for _, c := range cases {
		if _, s := skip[c.Name]; !s {
			runnable = append(runnable, c)
		}
	}

	start := time.Now()
	passed, failed := 0, 0
	results, err := os.Create(filepath.Join(mustMkdir(o.out), "results.txt"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "interop:", err)
		return 2
	}
	defer results.Close()
	report := func(format string, a ...any) {
		fmt.Printf(format, a...)
		fmt.Fprintf(results, format, a...)
	}

	if len(runnable) > 0 {
		lab, err := newLab(o, mode)
		if err != nil {
			fmt.Fprintln(os.Stderr, "interop:", err)
			return 1
		}
		// Tear down on ^C or a CI timeout's SIGTERM too.
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
		go func() {
			s := <-sig
			fmt.Fprintf(os.Stderr, "interop: %v: tearing down\n", s)
			lab.Close()
			os.Exit(130)
		}()
		bootStart := time.Now()
		err = lab.Boot()
		if err != nil {
			fmt.Fprintln(os.Stderr, "interop:", err)
			lab.Close()
			report("FAIL  lab boot: %v\n", err)
			report("0 passed, %d failed\n", len(runnable))
			return 1
		}
		report("lab: %s, booted %d guest(s) (%s) in %.1f s, results in %s\n", mode, len(lab.guests), lab.guests[0].Kernel,
			time.Since(bootStart).Seconds(), o.out)
		for i := range runnable {
			c := &runnable[i]
			r := lab.Run(c)
			if r.ok {
				passed++
				report("PASS  %-58s %5.1f s%s\n", c.Name, r.took.Seconds(), r.note)
			} else {
				failed++
				report("FAIL  %-58s %5.1f s  %s\n", c.Name, r.took.Seconds(), strings.Join(r.why, "; "))
				for _, d := range r.detail {
					report("      %s\n", d)
				}
			}
			if r.fatal {
				report("lab: %s; remaining cases not run\n", strings.Join(r.why, "; "))
				failed += len(runnable) - i - 1
				break
			}
		}
		lab.Close()
	}
	skipped := len(cases) - len(runnable)
	if skipped > 0 {
		why := map[string]int{}
		for _, w := range skip {
			why[w]++
		}
		for w, n := range why {
			report("SKIP  %d case(s): %s\n", n, w)
		}
	}
	report("wall time %.1f s\n", time.Since(start).Seconds())
	report("%d passed, %d failed\n", passed, failed)
	if failed > 0 {
		return 1
	}
	return 0
}

func mustMkdir(d string) string {
	if err := os.MkdirAll(d, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "interop:", err)
		os.Exit(2)
	}
	return d
}

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// fileName turns a case name into one file name.
func fileName(name string) string {
	return unsafeName.ReplaceAllString(strings.ReplaceAll(name, "/", "_"), "-")
}

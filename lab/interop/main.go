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
	selfcheck bool
	cases     string
	only      string
	list      bool
	cache     string
	out       string
	softrnic  string
	clib      string
	capture   bool
	pcapCheck string
	keepPcaps bool
	bootLimit time.Duration
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
	flag.StringVar(&o.clib, "clib", "c/build/lib", "the drop-in libibverbs.so.1 and librdmacm.so.1 (make clib) that softrnic-stock runs stock programs with")
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

func run(o options) (code int) {
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
	_ = f.Close() // read only
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
	helps := map[string]string{}
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
			default:
				if flag := missingFlag(o.softrnic, c, helps); flag != "" {
					skip[c.Name] = fmt.Sprintf("softrnic %s has no %s yet", sub, flag)
				}
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
	passed, failed, xfailed, xpassed, passedOnRetry := 0, 0, 0, 0, 0
	results, err := os.Create(filepath.Join(mustMkdir(o.out), "results.txt"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "interop:", err)
		return 2
	}
	defer func() {
		if err := results.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "interop: results.txt:", err)
			code = max(code, 2)
		}
	}()
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
			report("0 passed, %d failed, %d skipped\n", len(runnable), len(cases)-len(runnable))
			return 1
		}
		report("lab: %s, booted %d guest(s) (%s) in %.1f s, results in %s\n", mode, len(lab.guests), lab.guests[0].Kernel,
			time.Since(bootStart).Seconds(), o.out)
		for i := range runnable {
			c := &runnable[i]
			r := lab.Run(c)
			// A retry only for a failure the lab's own loss explains, or a
			// stock perftest's own race (at most twice).
			attempts := 0
			for attempt := 1; !r.ok && !r.fatal; attempt++ {
				var because string
				switch {
				case attempt <= c.Retries && labLoss(r):
					because = fmt.Sprintf("the lab's tap/veth dropped %d frames", r.tapDrops)
				case attempt <= 2 && r.perftestRace:
					because = "the stock perftest client lost perftest's own second-connect race"
				}
				if because == "" {
					break
				}
				report("RETRY %-58s %5.1f s  attempt %d: %s (%s)\n",
					c.Name, r.took.Seconds(), attempt, strings.Join(r.why, "; "), because)
				r = lab.Run(c)
				attempts = attempt
			}
			if r.ok && attempts > 0 {
				// Never silent: a pass that needed the lab's retry says so,
				// and the summary counts it.
				passedOnRetry++
				r.note += fmt.Sprintf("  (passed only on retry %d)", attempts)
			}
			drops := ""
			if r.tapDrops > 0 {
				drops += fmt.Sprintf("  [the lab's tap/veth dropped %d frames]", r.tapDrops)
			}
			if r.hostDrops > 0 {
				drops += fmt.Sprintf("  [lv0 dropped %d frames towards softrnic: its XDP program dropped them or its AF_XDP ring was full]", r.hostDrops)
			}
			switch {
			case r.ok && c.XFail != "":
				xpassed++
				report("XPASS %-58s %5.1f s%s%s  (marked xfail: %s)\n", c.Name, r.took.Seconds(), r.note, drops, c.XFail)
			case r.ok:
				passed++
				report("PASS  %-58s %5.1f s%s%s\n", c.Name, r.took.Seconds(), r.note, drops)
			default:
				tag := "FAIL "
				if c.XFail != "" && !r.fatal {
					xfailed++
					tag = "XFAIL"
					report("XFAIL %s: %s\n", c.Name, c.XFail)
				} else {
					failed++
				}
				report("%s %-58s %5.1f s  %s%s\n", tag, c.Name, r.took.Seconds(), strings.Join(r.why, "; "), drops)
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
	report("%d xfail, %d xpass\n", xfailed, xpassed)
	if passedOnRetry > 0 {
		report("%d passed only on retry (the lab's own loss or stock perftest's own race, see the RETRY lines)\n", passedOnRetry)
	}
	report("%d passed, %d failed, %d skipped\n", passed, failed, skipped)
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

// labLoss says whether a failed attempt is explained by the lab dropping
// frames: the guest's tap dropped some during the case and every complaint
// is one of rxe's recovery counters (a gap, a retry, a duplicate), which is
// what such loss produces. An exit status, a fatal counter, a kernel drop
// message or a bad ICRC is never the lab's loss.
func labLoss(r result) bool {
	if r.tapDrops == 0 || len(r.why) == 0 {
		return false
	}
	for _, w := range r.why {
		if !recoveryComplaint.MatchString(w) {
			return false
		}
	}
	return true
}

var recoveryComplaint = regexp.MustCompile(`^guest \S+: (` + strings.Join(recoveryCounters, "|") + `)\+\d+$`)

// missingFlag returns the first option of a case's host command that the
// softrnic subcommand's help does not list ("-R" while perf -R is being
// written), or "" when all are there or the help cannot be read (then the
// case runs and says for itself what is wrong: a help without an option
// list proves nothing). helps caches the help texts.
func missingFlag(bin string, c Case, helps map[string]string) string {
	for _, s := range []Side{c.Server, c.Client} {
		f := strings.Fields(s.Cmd)
		if s.Peer != "host" || len(f) < 2 || f[0] != "softrnic" {
			continue
		}
		help, ok := helps[f[1]]
		if !ok {
			help = softrnicHelp(bin, f[1])
			helps[f[1]] = help
		}
		if !helpListsOptions.MatchString(help) {
			continue // no option list to judge by ("flag: help requested")
		}
		for _, a := range f[2:] {
			if flag := flagName(a); flag != "" && !helpHasFlag(help, flag) {
				return flag
			}
		}
	}
	return ""
}

// helpListsOptions matches a help text with an indented option list.
var helpListsOptions = regexp.MustCompile(`(?m)^\s+--?[A-Za-z]`)

// flagName is the option an argument names ("-R", "--rdma_cm" from
// "--rdma_cm=1"), or "" for operands and negative numbers.
func flagName(a string) string {
	if len(a) < 2 || a[0] != '-' || !(a[1] == '-' || a[1] >= 'A' && a[1] <= 'Z' || a[1] >= 'a' && a[1] <= 'z') {
		return ""
	}
	if a == "--" {
		return ""
	}
	name, _, _ := strings.Cut(a, "=")
	return name
}

// helpHasFlag looks for flag as a word of the help text: "-R," "  -R  x",
// "[-R]", "--rdma_cm=N".
func helpHasFlag(help, flag string) bool {
	re := regexp.MustCompile(`(^|[\s,\[|])` + regexp.QuoteMeta(flag) + `($|[\s,=\]|])`)
	return re.MatchString(help)
}

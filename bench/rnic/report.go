package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"regexp"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/softrnic/softrnic/bench/internal/iobench"
)

// The goals the table is judged against.
const (
	// GoalWriteOverRaw: RC WRITE goodput at least this fraction of the raw
	// AF_XDP receive rate in bytes per second.
	GoalWriteOverRaw = 0.8
	// GoalLatOverSockperf: softrnic's 64 B half round trip (p50) at most
	// this multiple of the kernel UDP ping-pong's.
	GoalLatOverSockperf = 1.0
	// The daemon's goals, each row through the daemon held against the
	// same row with one process per end: WRITE goodput and SEND message
	// rate at least these fractions, the SEND half round trip's p50 and
	// p99 at most these multiples.
	GoalDaemonWrite  = 0.9
	GoalDaemonRate   = 0.7
	GoalDaemonLatP50 = 1.5
	GoalDaemonLatP99 = 3.0
)

// Names of the softrnic measurements, as rows of the table and keys for the
// ratios.
const (
	Write1QP = "write_bw 64 KiB, 1 QP"
	Write4QP = "write_bw 64 KiB, 4 QPs"
	SendBW64 = "send_bw 64 B"
	SendLat  = "send_lat 64 B"
)

// RawSize is the raw AF_XDP frame size the WRITE goodput is held against:
// the frames a 64 KiB WRITE travels in at RoCE path MTU 4096 are about
// this big.
const RawSize = 4096

// WriteFrame is the frame an RC WRITE MIDDLE packet travels in at RoCE path
// MTU 4096 over IPv4: Ethernet 14, IPv4 20, UDP 8, BTH 12, 4096 bytes of
// payload, ICRC 4. It does not fit one 4096-byte UMEM chunk, so each such
// frame is two AF_XDP descriptors (multi-buffer), where a RawSize frame is
// one: the raw rx-only rate at this size is the like-for-like ceiling,
// shown beside the goal's ratio (Report.SameFrame).
const WriteFrame = 14 + 20 + 8 + 12 + 4096 + 4

// How a softrnic measurement's two ends ran (Perf.Ends).
const (
	// EndsInProcess: both ends in the bench process, each perftest loop on
	// the OS thread that entered its namespace (runner's BenchmarkPerfVeth
	// does the same); the raw AF_XDP rates are measured that way too.
	EndsInProcess = "in-process"
	// EndsProcs: one child process per end, as on two hosts, and as
	// sockperf's client and server run.
	EndsProcs = "processes"
	// ProcsSuffix marks the name of a row measured with EndsProcs.
	ProcsSuffix = " (2 procs)"
	// EndsDaemon: the server in a child process, the client's QPs in a
	// daemon (a third child process serving its interface), the client in
	// a child process of its own: an application through the daemon.
	EndsDaemon = "daemon"
	// DaemonSuffix marks the name of a row measured with EndsDaemon.
	DaemonSuffix = " (daemon)"
)

// Perf is one `softrnic perf` run between the two namespaces.
type Perf struct {
	Name string   `json:"name"` // Test, plus ProcsSuffix for EndsProcs
	Test string   `json:"test"` // Write1QP, Write4QP, SendBW64 or SendLat
	Ends string   `json:"ends"` // EndsInProcess or EndsProcs
	Args []string `json:"args"` // perftest flags, as `softrnic perf` takes them
	Size uint64   `json:"size"`
	QPs  int      `json:"qps"`
	// Iters is the messages completed (bandwidth) or the iterations
	// (latency).
	Iters uint64 `json:"iters"`
	// GoodputGbps is payload bits per second over the whole run (perftest's
	// BW average with --report_gbits); PeakGbps its best window.
	GoodputGbps float64 `json:"goodput_gbps,omitempty"`
	PeakGbps    float64 `json:"peak_gbps,omitempty"`
	MsgRateMpps float64 `json:"msg_rate_mpps,omitempty"`
	// Half round trip in µs, as perftest's send_lat reports it: typical
	// (the median), average, 99th percentile.
	LatP50Us float64 `json:"lat_p50_us,omitempty"`
	LatAvgUs float64 `json:"lat_avg_us,omitempty"`
	LatP99Us float64 `json:"lat_p99_us,omitempty"`
	Seconds  float64 `json:"seconds"` // wall time of the run, side channel included
	// CPUSeconds is the user+system CPU time both ends used over the run
	// (this process's for EndsInProcess, the two children's for
	// EndsProcs), kernel work in their system calls included — AF_XDP's
	// copy-mode sendto delivers the frame to the peer inside the call.
	// GbitPerCPUSec = payload bits / CPUSeconds (bandwidth rows): unlike
	// GoodputGbps it hardly moves with other load on the machine.
	CPUSeconds    float64 `json:"cpu_seconds,omitempty"`
	GbitPerCPUSec float64 `json:"gbit_per_cpu_sec,omitempty"`
	// RoundsGbps (WRITE rows) is the goodput of every round, in order; the
	// row is the median round (-1: a round that failed).
	RoundsGbps []float64 `json:"rounds_gbps,omitempty"`
	Error      string    `json:"error,omitempty"`
}

// Sockperf is the kernel UDP ping-pong (`sockperf ping-pong`). Its
// latencies are half round trips, as sockperf reports them without
// --full-rtt.
type Sockperf struct {
	Args         []string `json:"args"`
	Observations uint64   `json:"observations"`
	AvgUs        float64  `json:"avg_us"`
	P50Us        float64  `json:"p50_us"`
	P99Us        float64  `json:"p99_us"`
	MaxUs        float64  `json:"max_us"`
	Error        string   `json:"error,omitempty"`
}

// Ratio is one goal, computed from the run.
type Ratio struct {
	Name  string  `json:"name"`
	Value float64 `json:"value"` // NaN is written as null: a figure was missing
	Goal  string  `json:"goal"`
	Met   bool    `json:"met"`
}

// Report is the whole run, the JSON document.
type Report struct {
	When      time.Time        `json:"when"`
	Kernel    string           `json:"kernel"`
	CPUs      int              `json:"cpus"`
	Go        string           `json:"go"`
	MTU       int              `json:"mtu"`
	XDPMode   string           `json:"xdp_mode"` // as the raw AF_XDP port obtained it
	LoadStart [3]float64       `json:"loadavg_start"`
	LoadEnd   [3]float64       `json:"loadavg_end"`
	Raw       []iobench.Result `json:"raw_afxdp"`
	// RawRounds is every round of the raw rx-only rate at RawSize, and
	// RawFrameRounds at WriteFrame; Raw holds the median ones.
	RawRounds      []iobench.Result `json:"raw_afxdp_rx_rounds,omitempty"`
	RawFrameRounds []iobench.Result `json:"raw_afxdp_rx_write_frame_rounds,omitempty"`
	RNIC           []Perf           `json:"softrnic"`
	Sockperf       Sockperf         `json:"sockperf"`
	Ratios         []Ratio          `json:"ratios"`
	// PerCPU holds the WRITE ratios again per CPU-second (goodput per CPU
	// second ÷ raw AF_XDP rx bytes per CPU second): on a loaded machine,
	// where both rates depend on what CPU the run got, the comparison of
	// cost that A/B runs can trust. Informational: the goal is Ratios'.
	PerCPU []Ratio `json:"per_cpu_ratios,omitempty"`
	// SameFrame holds the WRITE ratios again against the raw rx-only rate
	// of WriteFrame frames, the frames the WRITE itself travels in (bytes
	// of frames per second): the engine's own overhead. Informational.
	SameFrame []Ratio `json:"same_frame_ratios,omitempty"`
	Note      string  `json:"note"`
}

// raw finds the raw AF_XDP result of a test at a size.
func (r *Report) raw(test string, size int) *iobench.Result {
	for i := range r.Raw {
		x := &r.Raw[i]
		if x.Port == "afxdp" && x.Test == test && x.Size == size && x.Error == "" {
			return x
		}
	}
	return nil
}

// ComputeRatios fills Ratios from the figures: the goodput of each WRITE
// row, with both ends in this process and with one process per end, over
// the raw AF_XDP rx-only rate at RawSize, in bytes per second; then the
// half-RTT p50 of each send_lat row over sockperf's. A ratio whose figures
// are missing is NaN and not met.
func (r *Report) ComputeRatios() {
	r.Ratios = r.Ratios[:0]
	rawBps := math.NaN()
	if x := r.raw("rx-only", RawSize); x != nil && x.FramesPerSec > 0 {
		rawBps = x.FramesPerSec * RawSize
	}
	r.PerCPU = r.PerCPU[:0]
	rawPerCPU := math.NaN()
	if x := r.raw("rx-only", RawSize); x != nil && x.FramesPerCPUSec > 0 {
		rawPerCPU = x.FramesPerCPUSec * RawSize
	}
	r.SameFrame = r.SameFrame[:0]
	frameBps := math.NaN()
	if x := r.raw("rx-only", WriteFrame); x != nil && x.FramesPerSec > 0 {
		frameBps = x.FramesPerSec * WriteFrame
	}
	sock := math.NaN()
	if r.Sockperf.Error == "" && r.Sockperf.P50Us > 0 {
		sock = r.Sockperf.P50Us
	}
	for _, p := range r.RNIC {
		if p.Test != Write1QP && p.Test != Write4QP {
			continue
		}
		ok := p.Error == ""
		v := math.NaN()
		if ok {
			v = p.GoodputGbps * 1e9 / 8 / rawBps
		}
		r.Ratios = append(r.Ratios, Ratio{Name: p.Name + " goodput ÷ raw AF_XDP rx 4 KiB B/s", Value: v,
			Goal: fmt.Sprintf("≥ %.1f", GoalWriteOverRaw), Met: v >= GoalWriteOverRaw})
		c := math.NaN()
		if ok && p.GbitPerCPUSec > 0 {
			c = p.GbitPerCPUSec * 1e9 / 8 / rawPerCPU
		}
		r.PerCPU = append(r.PerCPU, Ratio{Name: p.Name + " B per CPU-s ÷ raw AF_XDP rx 4 KiB B per CPU-s", Value: c,
			Goal: fmt.Sprintf("≥ %.1f", GoalWriteOverRaw), Met: c >= GoalWriteOverRaw})
		sf := math.NaN()
		if ok {
			sf = p.GoodputGbps * 1e9 / 8 / frameBps
		}
		r.SameFrame = append(r.SameFrame, Ratio{Name: fmt.Sprintf("%s goodput ÷ raw AF_XDP rx %d B B/s", p.Name, WriteFrame), Value: sf,
			Goal: fmt.Sprintf("≥ %.1f", GoalWriteOverRaw), Met: sf >= GoalWriteOverRaw})
	}
	for _, p := range r.RNIC {
		if p.Test != SendLat {
			continue
		}
		v := math.NaN()
		if p.Error == "" {
			v = p.LatP50Us / sock
		}
		r.Ratios = append(r.Ratios, Ratio{Name: p.Name + " p50 ÷ sockperf 64 B p50", Value: v,
			Goal: fmt.Sprintf("≤ %.1f", GoalLatOverSockperf), Met: v <= GoalLatOverSockperf})
	}
	r.daemonRatios()
}

// daemonRatios appends the daemon's goals: each row through the daemon
// against the same row with one process per end (Goal* above), for every
// row that was run through the daemon (a failed one gives an unmet NaN).
func (r *Report) daemonRatios() {
	find := func(test, ends string, failed bool) *Perf {
		for i := range r.RNIC {
			if p := &r.RNIC[i]; p.Test == test && p.Ends == ends && (failed || p.Error == "") {
				return p
			}
		}
		return nil
	}
	add := func(test, what string, v func(p *Perf) float64, goal float64, atLeast bool) {
		if find(test, EndsDaemon, true) == nil {
			return
		}
		d, ip := find(test, EndsDaemon, false), find(test, EndsProcs, false)
		x := math.NaN()
		if d != nil && ip != nil && v(ip) > 0 {
			x = v(d) / v(ip)
		}
		q := Ratio{Name: fmt.Sprintf("%s%s %s ÷ %s", test, DaemonSuffix, what, ProcsSuffix[1:]), Value: x}
		if atLeast {
			q.Goal, q.Met = fmt.Sprintf("≥ %.1f", goal), x >= goal
		} else {
			q.Goal, q.Met = fmt.Sprintf("≤ %.1f", goal), x <= goal
		}
		r.Ratios = append(r.Ratios, q)
	}
	goodput := func(p *Perf) float64 { return p.GoodputGbps }
	add(Write1QP, "goodput", goodput, GoalDaemonWrite, true)
	add(Write4QP, "goodput", goodput, GoalDaemonWrite, true)
	add(SendBW64, "message rate", func(p *Perf) float64 { return p.MsgRateMpps }, GoalDaemonRate, true)
	add(SendLat, "p50", func(p *Perf) float64 { return p.LatP50Us }, GoalDaemonLatP50, false)
	add(SendLat, "p99", func(p *Perf) float64 { return p.LatP99Us }, GoalDaemonLatP99, false)
}

var _ json.Marshaler = Ratio{}

// MarshalJSON writes a NaN ratio as null (encoding/json refuses NaN).
func (q Ratio) MarshalJSON() ([]byte, error) {
	v := "null"
	if !math.IsNaN(q.Value) && !math.IsInf(q.Value, 0) {
		v = strconv.FormatFloat(q.Value, 'f', 4, 64)
	}
	return fmt.Appendf(nil, `{"name":%q,"value":%s,"goal":%q,"met":%t}`, q.Name, v, q.Goal, q.Met), nil
}

// PrintTable writes the one table of the run: raw AF_XDP, softrnic, sockperf
// and the ratios.
func PrintTable(out io.Writer, r *Report) {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "what\tsize B\tMpps\tGbit/s\tp50 µs\tp99 µs\tnote\t\n")
	f := func(v float64, format string) string {
		if v == 0 || math.IsNaN(v) {
			return ""
		}
		return fmt.Sprintf(format, v)
	}
	for _, x := range r.Raw {
		name := "raw AF_XDP " + x.Test
		if x.Error != "" {
			fmt.Fprintf(w, "%s\t%d\t\t\t\t\terror: %s\t\n", name, x.Size, short(x.Error))
			continue
		}
		note := "frames"
		rounds := r.RawRounds
		if x.Size == WriteFrame {
			rounds = r.RawFrameRounds
		}
		if x.Test == "rx-only" && (x.Size == RawSize || x.Size == WriteFrame) && len(rounds) > 1 {
			var gb []float64
			for _, k := range rounds {
				gb = append(gb, rawRate(k)*float64(k.Size)*8/1e9)
			}
			note += roundsNote(gb)
		}
		fmt.Fprintf(w, "%s\t%d\t%s\t%s\t\t\t%s\t\n", name, x.Size, f(x.FramesPerSec/1e6, "%.3f"), f(x.Gbps, "%.2f"), note)
	}
	for _, p := range r.RNIC {
		name := "softrnic " + p.Name
		if p.Error != "" {
			fmt.Fprintf(w, "%s\t%d\t\t\t\t\terror: %s\t\n", name, p.Size, short(p.Error))
			continue
		}
		note := "goodput"
		if p.LatP50Us > 0 {
			note = "half RTT"
		}
		if len(p.RoundsGbps) > 1 {
			note += roundsNote(p.RoundsGbps)
		}
		fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t\n", name, p.Size, f(p.MsgRateMpps, "%.3f"), f(p.GoodputGbps, "%.2f"),
			f(p.LatP50Us, "%.2f"), f(p.LatP99Us, "%.2f"), note)
	}
	if s := r.Sockperf; s.Error != "" {
		fmt.Fprintf(w, "sockperf UDP ping-pong\t64\t\t\t\t\terror: %s\t\n", short(s.Error))
	} else {
		fmt.Fprintf(w, "sockperf UDP ping-pong\t64\t\t\t%.2f\t%.2f\thalf RTT, kernel\t\n", s.P50Us, s.P99Us)
	}
	w.Flush()
	w = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "ratio\tvalue\tgoal\t\t\n")
	for _, q := range r.Ratios {
		printRatio(w, q)
	}
	for _, q := range r.PerCPU {
		if !math.IsNaN(q.Value) {
			fmt.Fprintf(w, "%s\t%.3f\t%s\t%s\t\n", q.Name, q.Value, q.Goal, "(cost view)")
		}
	}
	for _, q := range r.SameFrame {
		if !math.IsNaN(q.Value) {
			fmt.Fprintf(w, "%s\t%.3f\t%s\t%s\t\n", q.Name, q.Value, q.Goal, "(same frames)")
		}
	}
	w.Flush()
	fmt.Fprintf(out, "(%s, %d CPUs, %s, MTU %d, AF_XDP %s; load average %.2f at start, %.2f at end)\n",
		r.Kernel, r.CPUs, r.Go, r.MTU, r.XDPMode, r.LoadStart[0], r.LoadEnd[0])
	if r.Note != "" {
		fmt.Fprintf(out, "(%s)\n", r.Note)
	}
}

// printRatio writes one row of the ratio table.
func printRatio(w io.Writer, q Ratio) {
	met := "met"
	if !q.Met {
		met = "MISSED"
	}
	v := "n/a"
	if !math.IsNaN(q.Value) {
		v = fmt.Sprintf("%.3f", q.Value)
	}
	fmt.Fprintf(w, "%s\t%s\t%s\t%s\t\n", q.Name, v, q.Goal, met)
}

// short cuts an error to what fits a table cell; the JSON has it whole.
func short(s string) string {
	const max = 72
	if r := []rune(s); len(r) > max {
		return string(r[:max-1]) + "…"
	}
	return s
}

// ansi matches the colour escapes sockperf puts around some lines.
var ansi = regexp.MustCompile("\x1b\\[[0-9;]*m")

// ParseSockperf reads the client's report of `sockperf ping-pong`: the
// percentile lines ("---> percentile 50.000 =    6.514"), the maximum,
// "avg-latency=6.814" and "Total N observations". Latencies are in µs.
// It fails when the median or the 99th percentile is missing, so that a
// run that measured nothing is never reported as fast.
func ParseSockperf(out string) (Sockperf, error) {
	var s Sockperf
	var have50, have99 bool
	sc := bufio.NewScanner(strings.NewReader(ansi.ReplaceAllString(out, "")))
	for sc.Scan() {
		line := sc.Text()
		if _, rest, ok := strings.Cut(line, "---> percentile "); ok {
			p, v, ok := strings.Cut(rest, "=")
			if !ok {
				continue
			}
			pf, err1 := strconv.ParseFloat(strings.TrimSpace(p), 64)
			vf, err2 := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err1 != nil || err2 != nil {
				continue
			}
			switch pf {
			case 50:
				s.P50Us, have50 = vf, true
			case 99:
				s.P99Us, have99 = vf, true
			}
			continue
		}
		if _, rest, ok := strings.Cut(line, "---> <MAX> observation ="); ok {
			s.MaxUs, _ = strconv.ParseFloat(strings.TrimSpace(rest), 64)
			continue
		}
		if _, rest, ok := strings.Cut(line, "avg-latency="); ok {
			v, _, _ := strings.Cut(rest, " ")
			s.AvgUs, _ = strconv.ParseFloat(v, 64)
			continue
		}
		if _, rest, ok := strings.Cut(line, "Total "); ok && strings.Contains(rest, "observations") {
			v, _, _ := strings.Cut(rest, " ")
			s.Observations, _ = strconv.ParseUint(v, 10, 64)
		}
	}
	if !have50 || !have99 {
		return s, errors.New("sockperf: no 50th/99th percentile in its output")
	}
	if s.Observations == 0 {
		return s, errors.New("sockperf: no observations")
	}
	return s, nil
}

// ParseLoadavg reads the first three fields of /proc/loadavg.
func ParseLoadavg(s string) ([3]float64, error) {
	var l [3]float64
	f := strings.Fields(s)
	if len(f) < 3 {
		return l, fmt.Errorf("loadavg: %q", s)
	}
	for i := range l {
		v, err := strconv.ParseFloat(f[i], 64)
		if err != nil {
			return l, fmt.Errorf("loadavg: %q: %w", s, err)
		}
		l[i] = v
	}
	return l, nil
}

// roundsNote lists a row's rounds in Gbit/s after its median ("-": failed).
func roundsNote(gbps []float64) string {
	var b strings.Builder
	fmt.Fprintf(&b, ", median of %d:", len(gbps))
	for _, v := range gbps {
		if v < 0 {
			b.WriteString(" -")
		} else {
			fmt.Fprintf(&b, " %.2f", v)
		}
	}
	return b.String()
}

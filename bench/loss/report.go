package main

import (
	"cmp"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Mode is a retransmission configuration of both ends: the perf flags that
// select it. A mode whose flags the binary does not know is reported as
// n/a, not run.
type Mode struct {
	Name        string   `json:"name"`
	Args        []string `json:"args,omitempty"`
	Unsupported string   `json:"unsupported,omitempty"` // why it was not run
}

// DefaultMode is the binary's own behaviour, no extra flags.
const DefaultMode = "default"

// GoBackNMode is adaptive retransmission alone, as against a peer that
// does not agree on selective repeat (rxe, ConnectX).
const GoBackNMode = "go-back-N peer"

// TimerMode is recovery by the local ACK timer alone, rxe's behaviour and
// softrnic's before adaptive retransmission: the before row, measured in
// the same run as the others.
const TimerMode = "ACK timer only"

// DefaultModes are the rows of the loss table: the binary's defaults,
// adaptive go-back-N, and the local ACK timer alone. The flag is the
// name transport/rc gives the choice (rc.Config.Recovery: selective,
// adaptive, timeout), as `softrnic perf` is expected to expose it; until
// it does, those rows print n/a. -modes names other flags.
const DefaultModes = DefaultMode + "=;" + GoBackNMode + "=--recovery=adaptive;" + TimerMode + "=--recovery=timeout"

// ParseModes reads "NAME=ARGS;NAME=ARGS" (ARGS separated by spaces, may be
// empty).
func ParseModes(s string) ([]Mode, error) {
	var ms []Mode
	for _, part := range strings.Split(s, ";") {
		if strings.TrimSpace(part) == "" {
			continue
		}
		name, args, ok := strings.Cut(part, "=")
		name = strings.TrimSpace(name)
		if !ok || name == "" {
			return nil, fmt.Errorf("mode %q: want NAME=ARGS", part)
		}
		ms = append(ms, Mode{Name: name, Args: strings.Fields(args)})
	}
	if len(ms) == 0 {
		return nil, fmt.Errorf("no modes in %q", s)
	}
	return ms, nil
}

// checkSupport marks the modes whose flags do not appear in help (the
// binary's `perf --help`).
func checkSupport(ms []Mode, help string) {
	for i, m := range ms {
		for _, a := range m.Args {
			if !strings.HasPrefix(a, "-") {
				continue
			}
			name, _, _ := strings.Cut(a, "=")
			if !flagInHelp(help, name) {
				ms[i].Unsupported = "the binary has no " + name
				break
			}
		}
	}
}

// flagInHelp says whether help lists the flag name as a whole word.
func flagInHelp(help, name string) bool {
	for i := 0; ; {
		j := strings.Index(help[i:], name)
		if j < 0 {
			return false
		}
		end := i + j + len(name)
		before := i+j == 0 || !isFlagChar(help[i+j-1])
		after := end == len(help) || !isFlagChar(help[end])
		if before && after {
			return true
		}
		i = end
	}
}

func isFlagChar(c byte) bool {
	return c == '-' || c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// LossCell is one cell of the loss table: a mode, a loss rate and a local
// ACK timeout, over every round.
type LossCell struct {
	Mode         string  `json:"mode"`
	LossPerMille int     `json:"loss_per_mille"` // each way
	QPTimeout    int     `json:"qp_timeout"`     // perftest -u
	Runs         []Run   `json:"runs,omitempty"`
	MiBps        float64 `json:"goodput_mibps,omitempty"` // median of the rounds that completed
	Failed       int     `json:"failed"`                  // rounds that did not complete
	// Ratio is MiBps ÷ the same mode and timeout without loss (0: a
	// figure is missing).
	Ratio float64 `json:"ratio,omitempty"`
}

// LossTable is the goodput under loss (the first table).
type LossTable struct {
	MTU      int        `json:"mtu"`
	Args     []string   `json:"args"` // besides -u and the mode's
	Duration string     `json:"duration"`
	Rounds   int        `json:"rounds"`
	Modes    []Mode     `json:"modes"`
	Losses   []int      `json:"losses_per_mille"`
	Timeouts []int      `json:"qp_timeouts"`
	Cells    []LossCell `json:"cells"`
	Error    string     `json:"error,omitempty"` // the lossy path could not be made
}

// Cell finds a cell (nil if absent).
func (t *LossTable) Cell(mode string, loss, u int) *LossCell {
	for i := range t.Cells {
		if c := &t.Cells[i]; c.Mode == mode && c.LossPerMille == loss && c.QPTimeout == u {
			return c
		}
	}
	return nil
}

// QPCell is one QP count at one MTU (the second table).
type QPCell struct {
	MTU    int     `json:"mtu"`
	QPs    int     `json:"qps"`
	Runs   []Run   `json:"runs"`
	MiBps  float64 `json:"goodput_mibps,omitempty"` // median of the rounds that completed
	Failed int     `json:"failed"`
	Ratio  float64 `json:"ratio_to_1qp,omitempty"` // MiBps ÷ the 1-QP figure at this MTU
}

// QPTable is aggregate goodput by QP count.
type QPTable struct {
	Args     []string `json:"args"`
	Duration string   `json:"duration"`
	Rounds   int      `json:"rounds"`
	Hogs     int      `json:"hogs,omitempty"` // CPU hogs running throughout (-hogs)
	Cells    []QPCell `json:"cells"`
}

// DaemonRun is the QP-count run with B's side in a daemon.
type DaemonRun struct {
	MTU int `json:"mtu"`
	QPs int `json:"qps"`
	Run Run `json:"run"`
	// XSK is the daemon's AF_XDP sockets over its whole life (it was
	// started for this run alone).
	XSK      *XSKStats `json:"daemon_xsk,omitempty"`
	XSKError string    `json:"daemon_xsk_error,omitempty"`
	Error    string    `json:"error,omitempty"` // the daemon could not be run
}

// Goal is one of the bench's goals, judged on this run.
type Goal struct {
	Name  string `json:"name"`
	Value string `json:"value"`
	Goal  string `json:"goal"`
	Met   bool   `json:"met"`
}

// Report is the whole run, the JSON document.
type Report struct {
	When      time.Time  `json:"when"`
	Kernel    string     `json:"kernel"`
	CPUs      int        `json:"cpus"`
	Go        string     `json:"go"`
	Binary    string     `json:"binary"`
	LoadStart [3]float64 `json:"load_start"`
	LoadEnd   [3]float64 `json:"load_end"`
	Note      string     `json:"note"`
	Loss      *LossTable `json:"loss,omitempty"`
	QPs       *QPTable   `json:"qp_scaling,omitempty"`
	Daemon    *DaemonRun `json:"daemon_receiver,omitempty"`
	Goals     []Goal     `json:"goals"`
	Seconds   float64    `json:"seconds"`
}

// medianOK is the median goodput of the runs that completed (the lower
// middle one of an even count; 0 if none did) and how many did not.
func medianOK(runs []Run) (mibps float64, failed int) {
	var ok []float64
	for _, r := range runs {
		if r.OK() {
			ok = append(ok, r.MiBps)
		} else {
			failed++
		}
	}
	if len(ok) == 0 {
		return 0, failed
	}
	slices.Sort(ok)
	return ok[(len(ok)-1)/2], failed
}

// Summarize fills the medians, failures and ratios from the runs.
func (rep *Report) Summarize() {
	if t := rep.Loss; t != nil {
		for i := range t.Cells {
			c := &t.Cells[i]
			c.MiBps, c.Failed = medianOK(c.Runs)
		}
		for i := range t.Cells {
			c := &t.Cells[i]
			c.Ratio = 0
			if base := t.Cell(c.Mode, 0, c.QPTimeout); base != nil && base.MiBps > 0 && c.MiBps > 0 {
				c.Ratio = c.MiBps / base.MiBps
			}
		}
	}
	if t := rep.QPs; t != nil {
		one := map[int]float64{}
		for i := range t.Cells {
			c := &t.Cells[i]
			c.MiBps, c.Failed = medianOK(c.Runs)
			if c.QPs == 1 {
				one[c.MTU] = c.MiBps
			}
		}
		for i := range t.Cells {
			c := &t.Cells[i]
			c.Ratio = 0
			if b := one[c.MTU]; b > 0 && c.MiBps > 0 {
				c.Ratio = c.MiBps / b
			}
		}
	}
	rep.Goals = rep.judge()
}

// The bench's goals.
const (
	goalLoss1 = 0.9  // default mode, 1 % each way, -u 14
	goalLoss3 = 0.75 // default mode, 3 % each way, -u 14
	goalGBN1  = 0.6  // go-back-N peer, 1 %, -u 14
	goalQPs   = 0.8  // 64 and 128 QPs at MTU 1500 ÷ 1 QP
)

func (rep *Report) judge() []Goal {
	var gs []Goal
	if t := rep.Loss; t != nil {
		for _, g := range []struct {
			mode string
			loss int
			min  float64
		}{{DefaultMode, 10, goalLoss1}, {DefaultMode, 30, goalLoss3}, {GoBackNMode, 10, goalGBN1}} {
			c := t.Cell(g.mode, g.loss, 14)
			if c == nil {
				continue
			}
			v := "n/a"
			if c.Ratio > 0 {
				v = fmt.Sprintf("%.2f", c.Ratio)
			} else if len(c.Runs) > 0 {
				v = "failed"
			}
			gs = append(gs, Goal{Name: fmt.Sprintf("%s, %s loss each way, -u 14: goodput ÷ lossless", g.mode, pct(g.loss)),
				Value: v, Goal: fmt.Sprintf("≥ %.2f", g.min), Met: c.Ratio >= g.min})
		}
	}
	if t := rep.QPs; t != nil {
		for _, c := range t.Cells {
			if c.MTU != 1500 || c.QPs < 64 {
				continue
			}
			drops, seen := uint64(0), false
			for _, r := range c.Runs {
				if r.XSK != nil && r.XSK.Sockets > 0 {
					drops += r.XSK.RxDropped
					seen = true
				}
			}
			v := fmt.Sprintf("%d of %d runs completed", len(c.Runs)-c.Failed, len(c.Runs))
			if c.Ratio > 0 {
				v += fmt.Sprintf(", %.2f × 1 QP", c.Ratio)
			}
			if seen {
				v += fmt.Sprintf(", %d frames dropped at the receiver's socket", drops)
			}
			gs = append(gs, Goal{Name: fmt.Sprintf("write_bw -q %d, MTU 1500", c.QPs), Value: v,
				Goal: fmt.Sprintf("every run completes, ≥ %.1f × 1 QP, no socket drops", goalQPs),
				Met:  c.Failed == 0 && len(c.Runs) > 0 && c.Ratio >= goalQPs && seen && drops == 0})
		}
	}
	return gs
}

func pct(perMille int) string {
	return strconv.FormatFloat(float64(perMille)/10, 'f', -1, 64) + " %"
}

// ackTimeout is the IBA local ACK timeout of perftest's -u.
func ackTimeout(u int) time.Duration {
	return time.Duration(4096 * (int64(1) << u))
}

func fmtDur(d time.Duration) string {
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.2g s", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%.2g ms", float64(d)/1e6)
	}
	return fmt.Sprintf("%.3g µs", float64(d)/1e3)
}

// cellText is a goodput with its ratio and failures: "29.4 MiB/s  0.21",
// "failed (3/3: RETRY_EXC_ERR)".
func cellText(mibps, ratio float64, failed int, runs []Run) string {
	if mibps == 0 {
		if len(runs) == 0 {
			return "—"
		}
		return fmt.Sprintf("failed (%d/%d: %s)", failed, len(runs), failures(runs))
	}
	s := fmt.Sprintf("%.1f MiB/s", mibps)
	if ratio > 0 {
		s += fmt.Sprintf("  %.2f", ratio)
	}
	if failed > 0 {
		s += fmt.Sprintf("  (%d/%d failed: %s)", failed, len(runs), failures(runs))
	}
	return s
}

// failures lists the distinct failure kinds of runs.
func failures(runs []Run) string {
	var ks []string
	for _, r := range runs {
		if !r.OK() && !slices.Contains(ks, r.Failure) {
			ks = append(ks, cmp.Or(r.Failure, "no figure"))
		}
	}
	return strings.Join(ks, ", ")
}

// PrintTable writes the report as tables.
func PrintTable(w io.Writer, rep *Report) {
	fmt.Fprintf(w, "softrnic bench/loss — %s, %d CPUs, %s; load average %.2f %.2f %.2f at start, %.2f %.2f %.2f at end\n",
		rep.Kernel, rep.CPUs, rep.Binary, rep.LoadStart[0], rep.LoadStart[1], rep.LoadStart[2], rep.LoadEnd[0], rep.LoadEnd[1], rep.LoadEnd[2])
	if t := rep.Loss; t != nil && t.Error != "" {
		fmt.Fprintf(w, "\nGoodput under loss: not measured: %s\n", t.Error)
	} else if t != nil {
		fmt.Fprintf(w, "\nGoodput under loss: softrnic perf write_bw %s, A → bridge → B (RoCEv2 frames dropped at random in both directions), MTU %d (path MTU %s), %s runs, %s; ratio to the same row without loss\n",
			strings.Join(t.Args, " "), t.MTU, orUnknown(t.pathMTU()), t.Duration, rounds(t.Rounds))
		tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
		fmt.Fprint(tw, "loss each way\tretransmission")
		for _, u := range t.Timeouts {
			fmt.Fprintf(tw, "\t-u %d (%s)", u, fmtDur(ackTimeout(u)))
		}
		fmt.Fprint(tw, "\tgoal at -u 14\n")
		for _, m := range t.Modes {
			if m.Unsupported != "" {
				fmt.Fprintf(tw, "all\t%s\tn/a: %s\n", m.Name, m.Unsupported)
				continue
			}
			for _, loss := range t.Losses {
				fmt.Fprintf(tw, "%s\t%s", pct(loss), m.Name)
				for _, u := range t.Timeouts {
					if c := t.Cell(m.Name, loss, u); c != nil {
						fmt.Fprintf(tw, "\t%s", cellText(c.MiBps, c.Ratio, c.Failed, c.Runs))
					} else {
						fmt.Fprint(tw, "\t—")
					}
				}
				fmt.Fprintf(tw, "\t%s\n", lossGoal(m.Name, loss))
			}
		}
		tw.Flush()
		// Where the frames went: how many A sent per message delivered, the
		// minimum being the packets of one message.
		fmt.Fprintf(w, "A → B frames per 64 KiB message delivered (minimum %s), median round:\n", packetsPerMessage(t.pathMTU()))
		tw = tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
		fmt.Fprint(tw, "loss each way\tretransmission")
		for _, u := range t.Timeouts {
			fmt.Fprintf(tw, "\t-u %d", u)
		}
		fmt.Fprintln(tw)
		for _, m := range t.Modes {
			if m.Unsupported != "" {
				continue
			}
			for _, loss := range t.Losses {
				fmt.Fprintf(tw, "%s\t%s", pct(loss), m.Name)
				for _, u := range t.Timeouts {
					fmt.Fprintf(tw, "\t%s", framesPerMessage(t.Cell(m.Name, loss, u)))
				}
				fmt.Fprintln(tw)
			}
		}
		tw.Flush()
	}
	if t := rep.QPs; t != nil {
		fmt.Fprintf(w, "\nAggregate goodput by QP count: softrnic perf write_bw %s -q N, A ↔ B over one veth pair (no loss on the link), %s runs, %s\n",
			strings.Join(t.Args, " "), t.Duration, rounds(t.Rounds))
		if t.Hogs > 0 {
			fmt.Fprintf(w, "under %d CPU hogs (busy loops) throughout, a loaded host's share of the CPUs\n", t.Hogs)
		}
		fmt.Fprintln(w, "receiver, summed over the rounds: frames its XDP program steered to its AF_XDP socket, and of those the socket dropped for an empty FILL ring (XDP_STATISTICS of the perf process)")
		tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
		fmt.Fprintln(tw, "MTU (path MTU)\tQPs\tgoodput  ÷ 1 QP\tsteered\tsocket drops\tfill ring empty")
		pmtu := map[int]int{}
		for _, c := range t.Cells {
			if p := pathMTU(c.Runs); p > 0 {
				pmtu[c.MTU] = p
			}
		}
		for _, c := range t.Cells {
			steered, dropped, empty := sumRx(c.Runs)
			fmt.Fprintf(tw, "%d (%s)\t%d\t%s\t%s\t%s\t%s\n", c.MTU, orUnknown(pmtu[c.MTU]), c.QPs,
				cellText(c.MiBps, c.Ratio, c.Failed, c.Runs), steered, dropped, empty)
		}
		tw.Flush()
	}
	if d := rep.Daemon; d != nil {
		fmt.Fprintf(w, "\nDaemon as receiver: softrnic perf write_bw -q %d through `softrnic daemon` on B, client in process on A, MTU %d\n", d.QPs, d.MTU)
		if d.Error != "" {
			fmt.Fprintf(w, "not run: %s\n", d.Error)
		} else {
			r := d.Run
			fmt.Fprintf(w, "goodput %s\n", cellText(r.MiBps, 0, map[bool]int{true: 0, false: 1}[r.OK()], []Run{r}))
			c := r.Daemon
			if c != nil {
				st, empty, dropped := c["xdp_steered"], c["xsk_rx_fill_ring_empty_descs"], c["xsk_rx_dropped"]
				fmt.Fprintf(w, "softrnic stats over the run: xdp_steered %d, xsk_rx_fill_ring_empty_descs %d (%s of steered), xsk_rx_dropped %d, xsk_rx_ring_full %d; as responder: rx_write_requests %d, out_of_sequence %d, duplicate_request %d, nak_sent %d\n",
					st, empty, share(empty, st), dropped, c["xsk_rx_ring_full"], c["rx_write_requests"], c["out_of_sequence"], c["duplicate_request"], c["nak_sent"])
			}
			if x := d.XSK; x != nil && x.Sockets > 0 {
				fmt.Fprintf(w, "the daemon's AF_XDP sockets over its life (XDP_STATISTICS): rx_dropped %d, rx_fill_ring_empty_descs %d, rx_ring_full %d\n",
					x.RxDropped, x.RxFillRingEmpty, x.RxRingFull)
			}
		}
	}
	if len(rep.Goals) > 0 {
		fmt.Fprintln(w, "\nGoals, on this run:")
		tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
		for _, g := range rep.Goals {
			met := "not met"
			if g.Met {
				met = "met"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", g.Name, g.Value, g.Goal, met)
		}
		tw.Flush()
	}
}

func rounds(n int) string {
	if n <= 1 {
		return "one round"
	}
	return fmt.Sprintf("median of %d interleaved rounds", n)
}

func lossGoal(mode string, loss int) string {
	switch {
	case mode == DefaultMode && loss == 10:
		return fmt.Sprintf("≥ %.2f", goalLoss1)
	case mode == DefaultMode && loss == 30:
		return fmt.Sprintf("≥ %.2f", goalLoss3)
	case mode == GoBackNMode && loss == 10:
		return fmt.Sprintf("≥ %.2f", goalGBN1)
	}
	return ""
}

// pathMTU is the RoCE path MTU the runs reported (0: none did).
func pathMTU(runs []Run) int {
	for _, r := range runs {
		if r.PathMTU > 0 {
			return r.PathMTU
		}
	}
	return 0
}

func orUnknown(n int) string {
	if n == 0 {
		return "?"
	}
	return strconv.Itoa(n)
}

// pathMTU is the path MTU of the loss table's runs.
func (t *LossTable) pathMTU() int {
	for _, c := range t.Cells {
		if p := pathMTU(c.Runs); p > 0 {
			return p
		}
	}
	return 0
}

func packetsPerMessage(pmtu int) string {
	if pmtu == 0 {
		return "?"
	}
	return strconv.Itoa((65536 + pmtu - 1) / pmtu)
}

// framesPerMessage is the median round's A → B frames per message.
func framesPerMessage(c *LossCell) string {
	if c == nil {
		return "—"
	}
	var v []float64
	for _, r := range c.Runs {
		if r.OK() && r.Bridge != nil && r.Iters > 0 {
			v = append(v, float64(r.Bridge.AtoB.Frames)/float64(r.Iters))
		}
	}
	if len(v) == 0 {
		return "—"
	}
	slices.Sort(v)
	return fmt.Sprintf("%.1f", v[(len(v)-1)/2])
}

// sumRx totals the receiver's counters over a cell's runs: frames steered
// to its socket (redirected by the veth, plus those the socket refused),
// dropped by the socket, and FILL ring found empty.
func sumRx(runs []Run) (steered, dropped, empty string) {
	var red, drop, emp uint64
	var haveVeth, haveXSK bool
	for _, r := range runs {
		if r.Veth != nil {
			red += r.Veth["rx_xdp_redirect"]
			haveVeth = true
		}
		if r.XSK != nil && r.XSK.Sockets > 0 {
			drop += r.XSK.RxDropped
			emp += r.XSK.RxFillRingEmpty
			haveXSK = true
		}
	}
	steered, dropped, empty = "?", "?", "?"
	if haveVeth && haveXSK {
		steered = strconv.FormatUint(red+drop, 10)
	}
	if haveXSK {
		dropped = fmt.Sprintf("%d (%s)", drop, share(drop, red+drop))
		empty = strconv.FormatUint(emp, 10)
	}
	return
}

func share(part, whole uint64) string {
	if whole == 0 {
		return "—"
	}
	return fmt.Sprintf("%.1f %%", 100*float64(part)/float64(whole))
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
		if err != nil || math.IsNaN(v) {
			return l, fmt.Errorf("loadavg: %q", s)
		}
		l[i] = v
	}
	return l, nil
}

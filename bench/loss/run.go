package main

import (
	"context"
	"fmt"
	"github.com/softrnic/softrnic/bench/internal/iobench"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/softrnic/softrnic/internal/netnstest"
)

// Options size the run.
type Options struct {
	Bin      string        // the softrnic binary under test
	Duration time.Duration // each perf run (-D, whole seconds)
	Grace    time.Duration // a run is killed this long after its client started, beyond Duration

	Loss     bool  // the loss table
	LossMTU  int   // its links' MTU
	Losses   []int // per mille, each way; 0 must be among them (the ratios' base)
	Timeouts []int // perftest -u
	Rounds   int   // interleaved rounds of the loss table
	Modes    []Mode

	QPTable  bool
	QPs      []int
	MTUs     []int
	QPRounds int
	QPFlags  []string // more perf flags of both ends in the QP table (--cc dcqcn); not the daemon run's
	Hogs     int      // CPU hogs (busy shell loops) running throughout the QP table

	DaemonQPs int // the QP count of the daemon run (0: none)
	DaemonMTU int
}

// DefaultOptions are what `make bench-loss` runs: two to three minutes.
func DefaultOptions() Options {
	return Options{Bin: "bin/softrnic", Duration: 4 * time.Second, Grace: 40 * time.Second,
		Loss: true, LossMTU: 1500, Losses: []int{0, 10, 30}, Timeouts: []int{14, 8}, Rounds: 3,
		QPTable: true, QPs: []int{1, 16, 32, 64, 128}, MTUs: []int{1500, 4200}, QPRounds: 1,
		DaemonQPs: 64, DaemonMTU: 1500}
}

// current holds what an interrupted run must remove.
var current atomic.Pointer[func() error]

func setCurrent(close func() error) { current.Store(&close) }

// nextPort gives each run its own side-channel port.
var nextPort atomic.Int32

func init() { nextPort.Store(18600) }

func loadavg() [3]float64 {
	b, _ := os.ReadFile("/proc/loadavg")
	l, _ := ParseLoadavg(string(b))
	return l
}

// perfHelp is what `softrnic perf --help` prints, to learn its flags.
func perfHelp(bin string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "perf", "--help").CombinedOutput()
	if len(out) == 0 {
		return "", fmt.Errorf("%s perf --help: %w", bin, err)
	}
	return string(out), nil
}

// Measure measures every table o asks for and returns the report; a
// measurement that fails is reported in its cell.
func Measure(o Options, log io.Writer) (*Report, error) {
	start := time.Now()
	rep := &Report{When: start.UTC(), Kernel: iobench.Kernel(), CPUs: runtime.NumCPU(),
		Go: runtime.Version(), Binary: o.Bin, LoadStart: loadavg(),
		Note: "every end is a softrnic process on an AF_XDP port (copy mode) in its own namespace on this host; both ends, the bridge and softirq share the CPUs"}
	help, err := perfHelp(o.Bin)
	if err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp("", "bench-loss")
	if err != nil {
		return nil, err
	}
	defer func() {
		if err := os.RemoveAll(tmp); err != nil {
			fmt.Fprintln(log, "bench-loss:", err)
		}
	}()

	if o.Loss {
		modes := append([]Mode(nil), o.Modes...)
		checkSupport(modes, help)
		if err := lossTable(o, modes, rep, log); err != nil {
			return nil, err
		}
	}
	if o.QPTable || o.DaemonQPs > 0 {
		if err := qpTable(o, rep, tmp, log); err != nil {
			return nil, err
		}
	}
	rep.LoadEnd = loadavg()
	rep.Seconds = time.Since(start).Seconds()
	rep.Summarize()
	return rep, nil
}

func lossTable(o Options, modes []Mode, rep *Report, log io.Writer) error {
	base := []string{"-s", "65536", "--verify"}
	t := &LossTable{MTU: o.LossMTU, Args: base, Duration: o.Duration.String(), Rounds: o.Rounds,
		Modes: modes, Losses: o.Losses, Timeouts: o.Timeouts}
	rep.Loss = t
	path, err := netnstest.NewLossyPath(netnstest.LossyOptions{MTU: o.LossMTU})
	if err != nil {
		// No nft(8), say: the other tables can still be measured.
		t.Error = err.Error()
		fmt.Fprintln(log, "loss table not measured:", err)
		return nil
	}
	setCurrent(path.Close)
	defer func() {
		current.Store(nil)
		if err := path.Close(); err != nil {
			fmt.Fprintln(log, "bench-loss: removing the lossy path:", err)
		}
	}()
	a := host{ns: path.A.NS, dev: path.A.Name, addr: path.A.Addr.String()}
	b := host{ns: path.B.NS, dev: path.B.Name, addr: path.B.Addr.String()}
	for _, m := range modes {
		if m.Unsupported != "" {
			continue
		}
		for _, loss := range o.Losses {
			for _, u := range o.Timeouts {
				t.Cells = append(t.Cells, LossCell{Mode: m.Name, LossPerMille: loss, QPTimeout: u})
			}
		}
	}
	// Interleaved rounds: a burst of load from elsewhere on the machine
	// hits one round of every cell, not every round of one.
	for k := 0; k < max(o.Rounds, 1); k++ {
		for _, m := range modes {
			if m.Unsupported != "" {
				continue
			}
			for _, loss := range o.Losses {
				if err := path.Set(netnstest.Impairment{LossPerMille: loss}); err != nil {
					return err
				}
				for _, u := range o.Timeouts {
					args := append(append(append([]string(nil), base...), "-u", strconv.Itoa(u)), m.Args...)
					j := perfJob{bin: o.Bin, test: "write_bw", args: args, server: b, client: a,
						port: int(nextPort.Add(1)), duration: o.Duration, limit: o.Duration + o.Grace}
					// Counters from zero for this run alone.
					if err := path.Set(netnstest.Impairment{LossPerMille: loss}); err != nil {
						return err
					}
					r := j.run()
					if c, err := path.Counters(); err == nil {
						r.Bridge = &c
					}
					c := t.Cell(m.Name, loss, u)
					c.Runs = append(c.Runs, r)
					fmt.Fprintf(log, "round %d/%d  loss %-5s %-16s -u %-2d  %s\n", k+1, o.Rounds, pct(loss), m.Name, u, runLine(r))
				}
			}
		}
	}
	return nil
}

func qpTable(o Options, rep *Report, tmp string, log io.Writer) error {
	base := []string{"-s", "65536"}
	if o.QPTable {
		rep.QPs = &QPTable{Args: append(base[:len(base):len(base)], o.QPFlags...), Duration: o.Duration.String(), Rounds: o.QPRounds, Hogs: o.Hogs}
		stop, err := startHogs(o.Hogs)
		if err != nil {
			return err
		}
		defer stop()
	}
	mtus := o.MTUs
	if !o.QPTable {
		mtus = nil
	}
	if o.DaemonQPs > 0 && !containsInt(mtus, o.DaemonMTU) {
		mtus = append(mtus, o.DaemonMTU)
	}
	for _, mtu := range mtus {
		pair, err := netnstest.NewPair(netnstest.PairOptions{MTU: mtu})
		if err != nil {
			return err
		}
		setCurrent(pair.Close)
		a := host{ns: pair.A.NS, dev: pair.A.Name, addr: pair.A.Addr.String()}
		b := host{ns: pair.B.NS, dev: pair.B.Name, addr: pair.B.Addr.String()}
		// The QP flags go to both perf ends of the table's runs, not to
		// the daemon run: a daemon's congestion control is its own.
		job := func(qps int, flags []string) perfJob {
			args := append(append(append([]string(nil), base...), flags...), "-q", strconv.Itoa(qps))
			// Setting up many QPs over the side channel takes a while
			// on a loaded machine.
			return perfJob{bin: o.Bin, test: "write_bw", args: args, server: b, client: a,
				port: int(nextPort.Add(1)), duration: o.Duration, limit: o.Duration + o.Grace + time.Duration(qps)*100*time.Millisecond}
		}
		if o.QPTable && containsInt(o.MTUs, mtu) {
			first := len(rep.QPs.Cells)
			for _, q := range o.QPs {
				rep.QPs.Cells = append(rep.QPs.Cells, QPCell{MTU: mtu, QPs: q})
			}
			for k := 0; k < max(o.QPRounds, 1); k++ {
				for i, q := range o.QPs {
					j := job(q, o.QPFlags)
					r := j.run()
					c := &rep.QPs.Cells[first+i]
					c.Runs = append(c.Runs, r)
					fmt.Fprintf(log, "round %d/%d  MTU %d  -q %-3d  %s\n", k+1, o.QPRounds, mtu, q, runLine(r))
				}
			}
		}
		if o.DaemonQPs > 0 && mtu == o.DaemonMTU {
			rep.Daemon = daemonRun(o, job(o.DaemonQPs, nil), b, tmp, mtu)
			fmt.Fprintf(log, "daemon receiver  MTU %d  -q %-3d  %s\n", mtu, o.DaemonQPs, runLine(rep.Daemon.Run))
		}
		current.Store(nil)
		if err := pair.Close(); err != nil {
			fmt.Fprintln(log, "bench-loss: removing the namespaces:", err)
		}
	}
	return nil
}

// daemonRun is job with B's side in a `softrnic daemon` started for it.
func daemonRun(o Options, j perfJob, b host, tmp string, mtu int) *DaemonRun {
	d := &DaemonRun{MTU: mtu, QPs: qpsOf(j.args)}
	dm, err := startDaemon(o.Bin, b, tmp)
	if err != nil {
		d.Error = err.Error()
		return d
	}
	j.daemon = dm
	d.Run = j.run()
	x, err := dm.stop()
	d.XSK = x
	if err != nil {
		d.XSKError = err.Error()
	}
	return d
}

// runLine is one run for the progress log.
func runLine(r Run) string {
	var b strings.Builder
	if r.OK() {
		fmt.Fprintf(&b, "%8.1f MiB/s", r.MiBps)
	} else {
		fmt.Fprintf(&b, "FAILED %s", r.Failure)
	}
	fmt.Fprintf(&b, "  %.1f s, %.1f CPU-s, load %.2f", r.Seconds, r.CPUSeconds, r.Load1)
	if r.Bridge != nil {
		fmt.Fprintf(&b, "  bridge A→B %d frames (%d dropped), B→A %d (%d dropped)",
			r.Bridge.AtoB.Frames, r.Bridge.AtoB.Dropped, r.Bridge.BtoA.Frames, r.Bridge.BtoA.Dropped)
	}
	if r.XSK != nil && r.XSK.Sockets > 0 {
		fmt.Fprintf(&b, "  rx socket drops %d (fill ring empty %d)", r.XSK.RxDropped, r.XSK.RxFillRingEmpty)
	} else if r.XSKError != "" {
		fmt.Fprintf(&b, "  rx socket: %s", r.XSKError)
	}
	if r.HostCCMarks != nil && r.CNPSent != nil {
		fmt.Fprintf(&b, "  receiver np_host_cc_marks %d, np_cnp_sent %d", *r.HostCCMarks, *r.CNPSent)
	}
	if r.Daemon != nil {
		fmt.Fprintf(&b, "  daemon xdp_steered %d, xsk_rx_fill_ring_empty_descs %d, duplicate_request %d", r.Daemon["xdp_steered"],
			r.Daemon["xsk_rx_fill_ring_empty_descs"], r.Daemon["duplicate_request"])
		if s := r.SenderRecovery; s != nil {
			fmt.Fprintf(&b, "; sender retrans_packets %d, tlp_probes %d, roce_adp_retrans_to %d, fast_retrans %d, sel_retrans %d",
				s["retrans_packets"], s["tlp_probes"], s["roce_adp_retrans_to"], s["fast_retrans"], s["sel_retrans"])
		}
	}
	if !r.OK() && r.Detail != "" {
		fmt.Fprintf(&b, "\n    %s", r.Detail)
	}
	return b.String()
}

func containsInt(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// startHogs starts n CPU hogs, busy shell loops that load the host as other
// work does; stop ends them.
func startHogs(n int) (stop func(), err error) {
	var hogs []*exec.Cmd
	stop = func() {
		for _, h := range hogs {
			_ = h.Process.Kill()
			_ = h.Wait()
		}
	}
	for range n {
		h := exec.Command("sh", "-c", "while :; do :; done")
		h.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // none outlives the bench
		if err := h.Start(); err != nil {
			stop()
			return nil, fmt.Errorf("starting a CPU hog: %w", err)
		}
		hogs = append(hogs, h)
	}
	return stop, nil
}

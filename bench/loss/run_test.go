package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/softrnic/softrnic/internal/netnstest"
	"golang.org/x/sys/unix"
)

// TestXSKWatch: the watcher finds a process's AF_XDP sockets among its
// other sockets and reads their statistics after the fact (this process
// serves as the watched one: an unbound AF_XDP socket's counts are zero).
func TestXSKWatch(t *testing.T) {
	netnstest.SkipUnlessRoot(t)
	w, err := watchXSK(os.Getpid(), 5*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	var fds []int
	for _, dom := range []int{unix.AF_XDP, unix.AF_INET, unix.AF_XDP} {
		fd, err := unix.Socket(dom, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		if dom == unix.AF_INET {
			fd, err = unix.Socket(dom, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		}
		if err != nil {
			t.Fatal(err)
		}
		fds = append(fds, fd)
	}
	// Long enough for several scans; a slow scan only makes this wait
	// longer, it does not change the outcome.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		w.mu.Lock()
		n := 0
		for _, fd := range w.fds {
			if fd >= 0 {
				n++
			}
		}
		w.mu.Unlock()
		if n == 2 || time.Now().After(deadline) {
			break
		}
	}
	for _, fd := range fds {
		unix.Close(fd)
	}
	s, err := w.Finish()
	if err != nil || s.Sockets != 2 || s.RxDropped != 0 {
		t.Errorf("stats %+v, %v", s, err)
	}
}

// buildSoftrnic builds the binary under test, as `make build` does.
func buildSoftrnic(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "softrnic")
	cmd := exec.Command("go", "build", "-o", bin, "../../cmd/softrnic")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// TestMeasureSmoke runs every table for a second each: a lossy path at 0
// and 5 %, a mode the binary lacks, 1 and 2 QPs, a daemon receiver. It
// checks that every run was made and read (bridge counters, the
// receiver's sockets and veth, the daemon's counters), that the namespaces
// are gone afterwards, and that the report prints; it asserts nothing
// about speed, and a run at 5 % loss may fail (that is a figure too).
// Root only.
func TestMeasureSmoke(t *testing.T) {
	netnstest.SkipUnlessRoot(t)
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("needs nft(8)")
	}
	o := DefaultOptions()
	o.Bin = buildSoftrnic(t)
	o.Duration, o.Rounds, o.Losses, o.Timeouts = time.Second, 1, []int{0, 50}, []int{14}
	o.Modes = []Mode{{Name: DefaultMode}, {Name: "future", Args: []string{"--no-such-flag=1"}}}
	o.QPs, o.MTUs, o.DaemonQPs = []int{1, 2}, []int{1500}, 2
	var log bytes.Buffer
	rep, err := Measure(o, &log)
	if err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	if live, err := netnstest.Live(); err != nil || len(live) != 0 {
		t.Errorf("namespaces left behind: %v %v", live, err)
	}
	l := rep.Loss
	if len(l.Cells) != 2 || l.Modes[1].Unsupported != "the binary has no --no-such-flag" {
		t.Fatalf("loss table %+v", l)
	}
	lossless := l.Cell(DefaultMode, 0, 14)
	if len(lossless.Runs) != 1 || !lossless.Runs[0].OK() || !lossless.Runs[0].Verified || lossless.Ratio != 1 {
		t.Errorf("lossless run %+v\n%s", lossless, log.String())
	}
	for _, c := range l.Cells {
		r := c.Runs[0]
		if r.Bridge == nil || r.Bridge.AtoB.Frames == 0 || r.Bridge.BtoA.Frames == 0 {
			t.Errorf("loss %d: bridge counters %+v", c.LossPerMille, r.Bridge)
		}
		if c.LossPerMille == 0 && r.Bridge != nil && (r.Bridge.AtoB.Dropped != 0 || r.Bridge.BtoA.Dropped != 0) {
			t.Errorf("drops without loss: %+v", r.Bridge)
		}
		if c.LossPerMille > 0 && r.Bridge != nil && r.Bridge.AtoB.Dropped == 0 {
			t.Errorf("no drops at %d per mille: %+v", c.LossPerMille, r.Bridge)
		}
		if r.XSK == nil || r.XSK.Sockets == 0 || r.Veth == nil {
			t.Errorf("loss %d: receiver not read: %+v %q %v", c.LossPerMille, r.XSK, r.XSKError, r.Veth)
		}
	}
	for _, c := range rep.QPs.Cells {
		r := c.Runs[0]
		if !r.OK() || r.QPs != c.QPs || r.XSK == nil || r.XSK.Sockets == 0 || r.Veth["rx_xdp_redirect"] == 0 {
			t.Errorf("%d QPs: %+v\n%s", c.QPs, r, log.String())
		}
	}
	d := rep.Daemon
	if d == nil || d.Error != "" || !d.Run.OK() || d.Run.Daemon["xdp_steered"] == 0 || d.Run.Daemon["rx_write_requests"] == 0 ||
		d.XSK == nil || d.XSK.Sockets == 0 {
		t.Errorf("daemon run %+v\n%s", d, log.String())
	}
	var out bytes.Buffer
	PrintTable(&out, rep)
	if !strings.Contains(strings.Join(strings.Fields(out.String()), " "), "future n/a: the binary has no --no-such-flag") {
		t.Errorf("table:\n%s", out.String())
	}
}

// TestRunTimesOut: a run that outlives its limit is killed and marked
// timeout, and both its processes are gone.
func TestRunTimesOut(t *testing.T) {
	bin := buildSoftrnic(t)
	p := netnstest.NewTestPair(t, netnstest.PairOptions{})
	j := perfJob{bin: bin, test: "write_bw", args: []string{"-s", "65536"}, port: 18590,
		server:   host{ns: p.B.NS, dev: p.B.Name, addr: p.B.Addr.String()},
		client:   host{ns: p.A.NS, dev: p.A.Name, addr: p.A.Addr.String()},
		duration: 30 * time.Second, limit: 2 * time.Second}
	r := j.run()
	if r.Failure != "timeout" {
		t.Errorf("run %+v", r)
	}
	children.Lock()
	left := len(children.m)
	children.Unlock()
	if left != 0 {
		t.Errorf("%d processes still tracked", left)
	}
}

// TestWaitListeningServerExited: a perf server that exits before it
// listens ends the wait with errExited, and its exit status stays for the
// caller, which waits for it too (taking it here left the caller blocked
// for good).
func TestWaitListeningServerExited(t *testing.T) {
	netnstest.SkipUnlessRoot(t)
	ns := netnstest.NewTestNS(t)
	exited := make(chan error, 1)
	status := errors.New("exit status 1")
	exited <- status
	if err := waitListening(context.Background(), ns, 18515, exited); !errors.Is(err, errExited) {
		t.Fatalf("waitListening: %v, want errExited", err)
	}
	select {
	case err := <-exited:
		if !errors.Is(err, status) {
			t.Fatalf("exit status %v, want %v", err, status)
		}
	case <-time.After(time.Second):
		t.Fatal("the server's exit status was taken: its caller would wait forever")
	}
}

// TestFanInHostCongestion: 128 QPs writing into one perf receiver over a
// veth pair complete, with congestion control off (the tools' default)
// without a frame dropped for an empty FILL ring, and under DCQCN with the
// receiver signalling host congestion (np_host_cc_marks), each mark a CNP.
// Whether the default thresholds are crossed depends on how fast the
// receiver's CPU is (a CI machine kept up with the fan-in), so the DCQCN
// run sets --host-cc fill=1: every batch the reader holds is congestion,
// and the test asserts the signal's path, not the machine's speed. Root
// only; it asserts counts, not speed.
func TestFanInHostCongestion(t *testing.T) {
	netnstest.SkipUnlessRoot(t)
	bin := buildSoftrnic(t)
	run := func(cc string, flags ...string) Run {
		o := DefaultOptions()
		o.Bin, o.Loss, o.DaemonQPs = bin, false, 0
		o.Duration, o.QPs, o.MTUs, o.QPFlags = 3*time.Second, []int{128}, []int{1500}, append([]string{"--cc", cc}, flags...)
		var log bytes.Buffer
		rep, err := Measure(o, &log)
		if err != nil {
			t.Fatalf("%v\n%s", err, log.String())
		}
		r := rep.QPs.Cells[0].Runs[0]
		t.Logf("--cc %s: %s", cc, runLine(r))
		if !r.OK() || r.XSK == nil || r.XSK.Sockets == 0 {
			t.Fatalf("--cc %s: run %+v\n%s", cc, r, log.String())
		}
		return r
	}
	if r := run("off"); r.XSK.RxFillRingEmpty != 0 {
		t.Errorf("congestion control off: %d frames dropped for an empty FILL ring", r.XSK.RxFillRingEmpty)
	}
	r := run("dcqcn", "--host-cc", "fill=1")
	if r.HostCCMarks == nil || r.CNPSent == nil {
		t.Fatalf("the receiver reported no host marks or CNPs: %+v", r)
	}
	if *r.HostCCMarks == 0 || *r.CNPSent < *r.HostCCMarks {
		t.Errorf("receiver's host marks %d, CNPs %d: want marks, each a CNP", *r.HostCCMarks, *r.CNPSent)
	}
}

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/softrnic/softrnic/daemon"
	"github.com/softrnic/softrnic/host"
	"github.com/softrnic/softrnic/internal/netnstest"
	"github.com/softrnic/softrnic/internal/perftest"
	"github.com/softrnic/softrnic/internal/perftest/runner"
)

// A softrnic end in a child process is this program started again under
// `ip netns exec`, told what to do in its environment.
const (
	envRole    = "SOFTRNIC_BENCH_RNIC_ROLE" // "server" or "client"
	envTest    = "SOFTRNIC_BENCH_RNIC_TEST" // write_bw, send_bw, send_lat
	envArgs    = "SOFTRNIC_BENCH_RNIC_ARGS" // perftest flags, separated by \x1f
	envProfile = "SOFTRNIC_BENCH_RNIC_PROF" // CPU profile path ('' none)
	envTimeout = "SOFTRNIC_BENCH_RNIC_TIME" // time limit (a time.Duration)
	envDaemon  = "SOFTRNIC_BENCH_RNIC_SOCK" // client: the daemon's control socket; daemon: its own
)

// listeningLine is what a server child prints once its side channel
// listens, and a daemon child once its control socket does.
const listeningLine = "bench/rnic: listening"

var tests = map[string]struct {
	verb perftest.Verb
	m    perftest.Measure
}{
	"write_bw": {perftest.Write, perftest.BW},
	"send_bw":  {perftest.Send, perftest.BW},
	"send_lat": {perftest.Send, perftest.Latency},
}

// childMain runs one end when the environment says this process is a
// child; it returns false otherwise. The child prints runner.Result as JSON
// on stdout, last.
func childMain() bool {
	role := os.Getenv(envRole)
	if role == "" {
		return false
	}
	var err error
	if role == "daemon" {
		err = runDaemon(os.Getenv(envArgs), os.Getenv(envDaemon))
	} else {
		err = runChild(role, os.Getenv(envTest), strings.Split(os.Getenv(envArgs), "\x1f"), os.Getenv(envProfile), os.Getenv(envTimeout))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench/rnic child:", err)
		os.Exit(1)
	}
	os.Exit(0)
	return true
}

func runChild(role, test string, args []string, profile, timeout string) (err error) {
	tc, ok := tests[test]
	if !ok {
		return fmt.Errorf("unknown test %q", test)
	}
	limit, err := time.ParseDuration(timeout)
	if err != nil {
		return err
	}
	p, err := perftest.ParseArgs(tc.verb, tc.m, args)
	if err != nil {
		return err
	}
	if profile != "" {
		f, err := os.Create(profile)
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, f.Close()) }()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	o := runner.CLIOptions{PortKind: host.AFXDP, DialFor: 5 * time.Second, Daemon: os.Getenv(envDaemon)}
	if role == "server" {
		o.Listening = func(net.Addr) { fmt.Println(listeningLine) }
	}
	res, err := runner.RunCLI(ctx, p, o, io.Discard)
	if err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(res)
}

// runDaemon is the daemon child: `softrnic daemon` on iface (AF_XDP, the
// defaults otherwise), serving sock until SIGTERM.
func runDaemon(iface, sock string) (err error) {
	h, err := host.Open(host.Config{Interface: iface, Port: host.AFXDP, Owner: host.Owner{Name: "bench/rnic daemon", Control: sock}})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, h.Close()) }()
	srv, err := daemon.NewServer(h.Device, daemon.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Group: -1, CM: h.CM})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, srv.Close(2*time.Second)) }()
	if err := srv.Listen(sock); err != nil {
		return err
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve() }()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	fmt.Println(listeningLine)
	select {
	case <-sig:
		return nil
	case err := <-served:
		return err
	}
}

// perfRunProcs is perfRun with each end in a child process in its
// namespace; with daemon, the client's QPs are in a daemon, a third child
// serving B's interface. profDir, when set, receives server.prof and
// client.prof (named after the test) from the children.
func perfRunProcs(pair *netnstest.Pair, name, test string, m perftest.Measure, timeout time.Duration, args []string, daemon bool, profDir string) (p Perf) {
	p = Perf{Name: name, Args: args, QPs: 1}
	start := time.Now()
	defer func() { p.Seconds = time.Since(start).Seconds() }()
	if tc, ok := tests[test]; ok {
		if ps, err := perftest.ParseArgs(tc.verb, tc.m, args); err == nil {
			p.Size, p.QPs = ps.Size, ps.QPs
		}
	}
	exe, err := os.Executable()
	if err != nil {
		p.Error = err.Error()
		return p
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout+5*time.Second)
	defer cancel()
	child := func(role string, l *netnstest.Link, extra ...string) *exec.Cmd {
		cmd := exec.CommandContext(ctx, "ip", "netns", "exec", l.NS.Name, exe)
		prof := ""
		if profDir != "" {
			prof = fmt.Sprintf("%s/%s-%s.prof", profDir, strings.ReplaceAll(strings.ReplaceAll(name, " ", "_"), ",", ""), role)
		}
		a := append([]string{"-d", l.Name}, args...)
		cmd.Env = append(os.Environ(), envRole+"="+role, envTest+"="+test, envArgs+"="+strings.Join(append(a, extra...), "\x1f"),
			envProfile+"="+prof, envTimeout+"="+timeout.String())
		cmd.WaitDelay = 2 * time.Second
		return cmd
	}
	var dmn *exec.Cmd
	sock := ""
	if daemon {
		dir, err := os.MkdirTemp("", "bench-rnic-")
		if err != nil {
			p.Error = err.Error()
			return p
		}
		defer func() { _ = os.RemoveAll(dir) }() // a temporary socket directory
		sock = filepath.Join(dir, "ctl.sock")
		dmn = exec.CommandContext(ctx, "ip", "netns", "exec", pair.B.NS.Name, exe)
		dmn.Env = append(os.Environ(), envRole+"=daemon", envArgs+"="+pair.B.Name, envDaemon+"="+sock)
		dmn.Cancel = func() error { return dmn.Process.Signal(syscall.SIGTERM) }
		dmn.WaitDelay = 5 * time.Second
		up := &waitFor{want: listeningLine, done: make(chan struct{})}
		var dout bytes.Buffer
		dmn.Stdout, dmn.Stderr = up, &dout
		if err := dmn.Start(); err != nil {
			p.Error = err.Error()
			return p
		}
		dmnDone := make(chan error, 1)
		go func() { dmnDone <- dmn.Wait() }()
		defer func() {
			// Its exit status says only how the signal ended it; a Wait
			// that found no exit at all is an error of the run.
			_ = dmn.Process.Signal(syscall.SIGTERM)
			if err := <-dmnDone; err != nil && dmn.ProcessState == nil && p.Error == "" {
				p.Error = "daemon: " + err.Error()
			}
			if st := dmn.ProcessState; st != nil && p.Error == "" {
				p.setCPU(p.CPUSeconds + (st.UserTime() + st.SystemTime()).Seconds())
			}
		}()
		select {
		case <-up.done:
		case err := <-dmnDone:
			dmnDone <- err
			p.Error = fmt.Sprintf("daemon: %v: %s", err, lastLines(dout.String(), 2))
			return p
		case <-ctx.Done():
			p.Error = "daemon did not listen in time"
			return p
		}
	}
	srv := child("server", &pair.A)
	ready := &waitFor{want: listeningLine, done: make(chan struct{})}
	srv.Stdout = ready
	var serrOut bytes.Buffer
	srv.Stderr = &serrOut
	if err := srv.Start(); err != nil {
		p.Error = err.Error()
		return p
	}
	srvDone := make(chan error, 1)
	go func() { srvDone <- srv.Wait() }()
	select {
	case <-ready.done:
	case err := <-srvDone:
		p.Error = fmt.Sprintf("server: %v: %s", err, lastLines(serrOut.String(), 2))
		return p
	case <-ctx.Done():
		_ = srv.Process.Kill() // it may have exited just now: srvDone says
		p.Error = fmt.Sprintf("server did not listen in time (%v)", <-srvDone)
		return p
	}
	cli := child("client", &pair.B, pair.A.Addr.String())
	if daemon {
		cli.Env = append(cli.Env, envDaemon+"="+sock)
	}
	var cout, cerrOut bytes.Buffer
	cli.Stdout, cli.Stderr = &cout, &cerrOut
	cerr := cli.Run()
	if cerr != nil {
		_ = srv.Process.Kill() // it may have exited: srvDone says
	}
	if err := <-srvDone; err != nil || cerr != nil {
		p.Error = fmt.Sprintf("server: %v %s; client: %v %s", err, lastLines(serrOut.String(), 2), cerr, lastLines(cerrOut.String(), 2))
		return p
	}
	var res runner.Result
	sc := bufio.NewScanner(&cout)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var last string
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "{") {
			last = sc.Text()
		}
	}
	if err := json.Unmarshal([]byte(last), &res); err != nil {
		p.Error = fmt.Sprintf("client result: %v: %q", err, lastLines(cout.String(), 2))
		return p
	}
	fillPerf(&p, m, res)
	// Both ends' CPU: `ip netns exec` runs each child in its own process.
	var cpu time.Duration
	for _, c := range []*exec.Cmd{srv, cli} {
		if st := c.ProcessState; st != nil {
			cpu += st.UserTime() + st.SystemTime()
		}
	}
	p.setCPU(cpu.Seconds())
	return p
}

// fillPerf copies the client's result into p.
func fillPerf(p *Perf, m perftest.Measure, res runner.Result) {
	switch {
	case m == perftest.BW && len(res.BW) > 0:
		b := res.BW[0]
		p.Iters, p.GoodputGbps, p.PeakGbps, p.MsgRateMpps = b.Iters, b.AvgBW, b.PeakBW, b.MsgRate
	case m == perftest.Latency && len(res.Lat) > 0:
		l := res.Lat[0]
		p.Iters, p.LatP50Us, p.LatAvgUs, p.LatP99Us = l.Iters, l.Typical, l.Avg, l.P99
	default:
		p.Error = "client reported no result"
	}
}

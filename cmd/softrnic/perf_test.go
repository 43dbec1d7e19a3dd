package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/softrnic/softrnic/client"
	"github.com/softrnic/softrnic/internal/netnstest"
	"github.com/softrnic/softrnic/internal/perftest"
)

// startDaemon runs `softrnic daemon` on link a (AF_XDP, and the flags in
// args) and returns its control socket once it answers, and stop, which
// ends it with SIGTERM (as the test's cleanup does at the latest) and
// waits until it is gone.
func startDaemon(t testing.TB, bin string, a netnstest.Link, args ...string) (sock string, stop func()) {
	t.Helper()
	sock = filepath.Join(t.TempDir(), "ctl.sock")
	logs := new(syncBuffer)
	cmd := exec.Command("ip", append([]string{"netns", "exec", a.NS.Name, bin, "daemon", "-d", a.Name, "--control", sock, "--port", "afxdp"}, args...)...)
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cmd.Process.Signal(syscall.SIGTERM)
			select {
			case err := <-exited:
				if err != nil {
					t.Errorf("daemon after SIGTERM: %v", err)
				}
			case <-time.After(15 * time.Second):
				cmd.Process.Kill()
				t.Errorf("daemon still running 15 s after SIGTERM: killed (%v)", <-exited)
			}
		})
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			t.Logf("daemon log:\n%s", logs.String())
		}
	})
	for deadline := time.Now().Add(20 * time.Second); ; {
		c, err := client.Dial(sock)
		if err == nil {
			c.Close()
			return sock, stop
		}
		if time.Now().After(deadline) {
			t.Fatalf("daemon never answered: %v\n%s", err, logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestPerfThroughDaemonOverVeth: `softrnic perf --daemon SOCKET`, whose
// QPs live in a daemon on namespace A's veth end, against an in-process
// `softrnic perf` on its own AF_XDP port in namespace B, the daemon's side
// as server and as client, for several programs and RC, UC and UD QPs,
// every byte checked (--verify) on both sides.
func TestPerfThroughDaemonOverVeth(t *testing.T) {
	netnstest.SkipUnlessRoot(t)
	bin := buildSoftrnic(t)
	pair := netnstest.NewTestPair(t, netnstest.PairOptions{})
	sock, _ := startDaemon(t, bin, pair.A)
	for i, tc := range []struct {
		test          string
		args          []string
		daemonServes  bool
		daemonClients bool
	}{
		{"write_bw", []string{"-s", "65536", "-n", "200", "-q", "2"}, true, true},
		{"read_bw", []string{"-s", "16384", "-n", "200"}, true, false},
		{"send_bw", []string{"-s", "4096", "-n", "500"}, false, true},
		{"atomic_bw", []string{"-n", "200"}, true, false},
		{"send_lat", []string{"-s", "64", "-n", "200"}, true, true},
		{"write_lat", []string{"-s", "64", "-n", "200"}, false, true},
		{"read_lat", []string{"-s", "64", "-n", "100"}, true, false},
		{"write_bw", []string{"-c", "UC", "-s", "4096", "-n", "100"}, false, true},
		{"send_bw", []string{"-c", "UD", "-s", "1024", "-n", "300", "-r", "512"}, true, false},
		{"send_lat", []string{"-c", "UD", "-s", "64", "-n", "100"}, false, true},
	} {
		for _, daemonServer := range []bool{true, false} {
			if (daemonServer && !tc.daemonServes) || (!daemonServer && !tc.daemonClients) {
				continue
			}
			name := tc.test + "/" + strings.Join(tc.args, "")
			if daemonServer {
				name += "/daemon-server"
			} else {
				name += "/daemon-client"
			}
			port := strconv.Itoa(19000 + 2*i)
			if !daemonServer {
				port = strconv.Itoa(19001 + 2*i)
			}
			t.Run(name, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
				defer cancel()
				common := append([]string{"perf", tc.test, "--verify", "--json", "-p", port}, tc.args...)
				viaDaemon := append([]string{"netns", "exec", pair.A.NS.Name, bin}, append(common, "--daemon", sock)...)
				inProcess := append([]string{"netns", "exec", pair.B.NS.Name, bin}, append(common, "-d", pair.B.Name)...)
				srvArgs, cliArgs := viaDaemon, append(inProcess, pair.A.Addr.String())
				if !daemonServer {
					srvArgs, cliArgs = inProcess, append(viaDaemon, pair.B.Addr.String())
				}
				sout, cout := runPerfPair(t, ctx, srvArgs, cliArgs)
				for side, out := range map[string][]byte{"server": sout, "client": cout} {
					var j perftest.JSONResult
					if err := json.Unmarshal(out, &j); err != nil || j.TestInfo.Verified == nil || !*j.TestInfo.Verified {
						t.Fatalf("%s JSON (%v): %s", side, err, out)
					}
				}
				var j perftest.JSONResult
				if err := json.Unmarshal(cout, &j); err != nil {
					t.Fatal(err)
				}
				if strings.HasSuffix(tc.test, "_bw") && (len(j.BW) == 0 || j.BW[0].BWAverage <= 0) {
					t.Fatalf("client results: %s", cout)
				}
			})
		}
	}
}

// runPerfPair runs `ip srvArgs...` (a perf server), then `ip cliArgs...`
// (its client), both on AF_XDP ports, and returns their standard outputs;
// it fails the test if either fails.
func runPerfPair(t testing.TB, ctx context.Context, srvArgs, cliArgs []string) (sout, cout []byte) {
	t.Helper()
	srv := exec.CommandContext(ctx, "ip", srvArgs...)
	var so, se bytes.Buffer
	srv.Stdout, srv.Stderr = &so, &se
	srv.Env = append(srv.Environ(), "SOFTRNIC_PORT=afxdp")
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	cli := exec.CommandContext(ctx, "ip", cliArgs...)
	cli.Env = append(cli.Environ(), "SOFTRNIC_PORT=afxdp")
	var co, ce bytes.Buffer
	cli.Stdout, cli.Stderr = &co, &ce
	cliErr := cli.Run()
	if cliErr != nil {
		srv.Process.Kill()
	}
	srvErr := srv.Wait()
	if cliErr != nil || srvErr != nil {
		t.Fatalf("server %q: %v\n%s%s\nclient %q: %v\n%s%s", srvArgs, srvErr, so.String(), se.String(), cliArgs, cliErr, co.String(), ce.String())
	}
	return so.Bytes(), co.Bytes()
}

// TestPerfRDMACMThroughDaemonOverVeth: `softrnic perf -R --daemon SOCKET`
// (control channel and QPs through the daemon's rdma_cm agent, no TCP)
// against an in-process `softrnic perf -R` on its own AF_XDP port in
// namespace B, the daemon's side as server and as client, every byte
// checked. The client starts as soon as the server's process does: until
// the server listens its REQs are refused with REJ 8 and dialled again,
// which through the daemon needs the reason in CM_CONNECT's reply (daemon
// as client) and the daemon's agent answering before any listener (daemon
// as server). With -c UD the test QPs are found through SIDR in the
// daemon's CM (its client's QPs named in its SIDR_REPs, or the peer's
// learnt by its SIDR_REQs; a lookup before the server listens is refused
// with status 1 and made again).
func TestPerfRDMACMThroughDaemonOverVeth(t *testing.T) {
	netnstest.SkipUnlessRoot(t)
	bin := buildSoftrnic(t)
	pair := netnstest.NewTestPair(t, netnstest.PairOptions{})
	sock, _ := startDaemon(t, bin, pair.A)
	for i, tc := range []struct {
		test string
		args []string
	}{
		{"write_bw", []string{"-s", "65536", "-n", "200", "-q", "2"}},
		{"send_lat", []string{"-s", "64", "-n", "200"}},
		{"read_bw", []string{"-s", "16384", "-n", "100"}},
		// -c UD: the test QPs found through SIDR, answered by the daemon's
		// CM with the QPs of its client, or asked by it for the peer's.
		{"send_bw", []string{"-c", "UD", "-s", "1024", "-n", "500", "-r", "512", "-q", "2"}},
		{"send_lat", []string{"-c", "UD", "-s", "64", "-n", "200"}},
	} {
		for _, daemonServer := range []bool{true, false} {
			name := tc.test + "/" + strings.Join(tc.args, "")
			port := strconv.Itoa(19100 + 2*i)
			if daemonServer {
				name += "/daemon-server"
			} else {
				name += "/daemon-client"
				port = strconv.Itoa(19101 + 2*i)
			}
			t.Run(name, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
				defer cancel()
				common := append([]string{"perf", tc.test, "-R", "--verify", "--json", "-p", port}, tc.args...)
				viaDaemon := append([]string{"netns", "exec", pair.A.NS.Name, bin}, append(common, "--daemon", sock)...)
				inProcess := append([]string{"netns", "exec", pair.B.NS.Name, bin}, append(common, "-d", pair.B.Name)...)
				srvArgs, cliArgs := viaDaemon, append(inProcess, pair.A.Addr.String())
				if !daemonServer {
					srvArgs, cliArgs = inProcess, append(viaDaemon, pair.B.Addr.String())
				}
				sout, cout := runPerfPair(t, ctx, srvArgs, cliArgs)
				for side, out := range map[string][]byte{"server": sout, "client": cout} {
					var j perftest.JSONResult
					if err := json.Unmarshal(out, &j); err != nil || j.TestInfo.Verified == nil || !*j.TestInfo.Verified {
						t.Fatalf("%s JSON (%v): %s", side, err, out)
					}
				}
				var j perftest.JSONResult
				if err := json.Unmarshal(cout, &j); err != nil {
					t.Fatal(err)
				}
				if strings.HasSuffix(tc.test, "_bw") && (len(j.BW) == 0 || j.BW[0].BWAverage <= 0) {
					t.Fatalf("client results: %s", cout)
				}
				if strings.HasSuffix(tc.test, "_lat") && (len(j.Lat) == 0 || j.Lat[0].Typical <= 0) {
					t.Fatalf("client results: %s", cout)
				}
			})
		}
	}
}

package runner

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/softrnic/softrnic/host"
	"github.com/softrnic/softrnic/internal/netnstest"
	"github.com/softrnic/softrnic/internal/perftest"
)

// TestPerfOverVethAFXDP runs `softrnic perf` (RunCLI, what the command
// calls) for every program with --verify, and send_bw/send_lat on UD QPs
// (rx-depth covering every message, since UD does not retransmit), between two network namespaces
// joined by a veth pair, each side on its own AF_XDP port: the server in
// one namespace, the client in the other, the side channel over TCP
// between their addresses.
func TestPerfOverVethAFXDP(t *testing.T) {
	pair := netnstest.NewTestPair(t, netnstest.PairOptions{})
	for _, tc := range []struct {
		name string
		verb perftest.Verb
		m    perftest.Measure
		args []string
	}{
		{"write_bw", perftest.Write, perftest.BW, []string{"-s", "65536", "-n", "200", "-q", "2"}},
		{"read_bw", perftest.Read, perftest.BW, []string{"-s", "16384", "-n", "200"}},
		{"send_bw", perftest.Send, perftest.BW, []string{"-s", "4096", "-n", "500"}},
		{"atomic_bw", perftest.Atomic, perftest.BW, []string{"-n", "200"}},
		{"write_lat", perftest.Write, perftest.Latency, []string{"-s", "64", "-n", "200"}},
		{"read_lat", perftest.Read, perftest.Latency, []string{"-s", "64", "-n", "200"}},
		{"send_lat", perftest.Send, perftest.Latency, []string{"-s", "64", "-n", "200"}},
		{"atomic_lat", perftest.Atomic, perftest.Latency, []string{"-n", "200"}},
		{"send_bw_UD", perftest.Send, perftest.BW, []string{"-c", "UD", "-s", "1024", "-n", "500", "-r", "512"}},
		{"send_lat_UD", perftest.Send, perftest.Latency, []string{"-c", "UD", "-s", "64", "-n", "200"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--verify", "--json", "-F"}, tc.args...)
			ps, err := perftest.ParseArgs(tc.verb, tc.m, append([]string{"-d", pair.A.Name}, args...))
			if err != nil {
				t.Fatal(err)
			}
			pc, err := perftest.ParseArgs(tc.verb, tc.m, append([]string{"-d", pair.B.Name, pair.A.Addr.String()}, args...))
			if err != nil {
				t.Fatal(err)
			}
			cres, sout, cout := runServerClient(t, pair, ps, pc, RunCLI)
			var j perftest.JSONResult
			if err := json.Unmarshal(cout.Bytes(), &j); err != nil || j.TestInfo.Device != pair.B.Name || j.TestInfo.Verified == nil || !*j.TestInfo.Verified {
				t.Fatalf("client JSON %v: %s", err, cout.String())
			}
			if tc.m == perftest.BW {
				r := cres.BW[0]
				if r.Iters == 0 || r.AvgBW <= 0 {
					t.Fatalf("client BW %+v", r)
				}
				t.Logf("%s: %d B × %d: %.1f MiB/s, %.4f Mpps", tc.name, r.Size, r.Iters, r.AvgBW, r.MsgRate)
			} else {
				r := cres.Lat[0]
				if r.Typical <= 0 || r.Iters != 200 {
					t.Fatalf("client latency %+v", r)
				}
				t.Logf("%s: %d B: typical %.1f µs, p99 %.1f µs", tc.name, r.Size, r.Typical, r.P99)
			}
			if strings.Contains(sout.String(), "error") {
				t.Errorf("server output: %s", sout.String())
			}
		})
	}
}

// TestPerfIPv6WithoutLinkLocal runs write_bw over IPv6 GIDs (-x 1) when the
// server's interface has no link-local address, as in the lab: the kernel
// then solicits a neighbour only for a real packet, which RunCLI provides.
func TestPerfIPv6WithoutLinkLocal(t *testing.T) {
	pair := netnstest.NewTestPair(t, netnstest.PairOptions{})
	if _, err := pair.A.NS.IP("-6", "addr", "flush", "dev", pair.A.Name, "scope", "link"); err != nil {
		t.Fatal(err)
	}
	if _, err := pair.A.NS.IP("-6", "neigh", "flush", "dev", pair.A.Name); err != nil {
		t.Fatal(err)
	}
	args := []string{"-x", "1", "-s", "4096", "-n", "50", "--verify", "--json"}
	ps, _ := perftest.ParseArgs(perftest.Write, perftest.BW, append([]string{"-d", pair.A.Name}, args...))
	pc, _ := perftest.ParseArgs(perftest.Write, perftest.BW, append([]string{"-d", pair.B.Name, pair.A.Addr.String()}, args...))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var sout, cout bytes.Buffer
	listening := make(chan struct{})
	serr := make(chan error, 1)
	var sres Result
	go func() {
		serr <- pair.A.NS.Do(func() (err error) {
			sres, err = RunCLI(ctx, ps, CLIOptions{PortKind: host.AFXDP, Listening: func(net.Addr) { close(listening) }}, &sout)
			return err
		})
	}()
	select {
	case <-listening:
	case err := <-serr:
		t.Fatalf("server: %v", err)
	}
	cerr := pair.B.NS.Do(func() error {
		_, err := RunCLI(ctx, pc, CLIOptions{PortKind: host.AFXDP, DialFor: 5 * time.Second}, &cout)
		return err
	})
	if cerr != nil {
		cancel()
	}
	if err := <-serr; err != nil || cerr != nil {
		t.Fatalf("server: %v\nclient: %v", err, cerr)
	}
	var j perftest.JSONResult
	if err := json.Unmarshal(cout.Bytes(), &j); err != nil || !sres.Verify {
		t.Fatalf("client JSON %v %s, server verified %v", err, cout.String(), sres.Verify)
	}
}

// runServerClient runs run (RunCLI or RunCLICM) as the server on ps in
// namespace A and as the client on pc in namespace B, both on AF_XDP
// ports, bounded at 90 s; it fails the test when either side fails or
// does not verify its data, and returns both results and outputs.
func runServerClient(t *testing.T, pair *netnstest.Pair, ps, pc perftest.Params,
	run func(context.Context, perftest.Params, CLIOptions, io.Writer) (Result, error)) (cres Result, sout, cout *bytes.Buffer) {
	t.Helper()
	_, cres, sout, cout = runLinks(t, pair.A, pair.B, ps, pc, run)
	return cres, sout, cout
}

// runLinks is runServerClient between the namespaces of links a (server)
// and b (client).
func runLinks(t *testing.T, a, b netnstest.Link, ps, pc perftest.Params,
	run func(context.Context, perftest.Params, CLIOptions, io.Writer) (Result, error)) (sres, cres Result, sout, cout *bytes.Buffer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	sout, cout = new(bytes.Buffer), new(bytes.Buffer)
	listening := make(chan struct{})
	serr := make(chan error, 1)
	go func() {
		serr <- a.NS.Do(func() (err error) {
			sres, err = run(ctx, ps, CLIOptions{PortKind: host.AFXDP, Listening: func(net.Addr) { close(listening) }}, sout)
			return err
		})
	}()
	select {
	case <-listening:
	case err := <-serr:
		t.Fatalf("server: %v", err)
	}
	cerr := b.NS.Do(func() (err error) {
		cres, err = run(ctx, pc, CLIOptions{PortKind: host.AFXDP, DialFor: 5 * time.Second}, cout)
		return err
	})
	if cerr != nil {
		cancel()
	}
	if err := <-serr; err != nil || cerr != nil {
		t.Fatalf("server: %v\nclient: %v\nserver output: %s\nclient output: %s", err, cerr, sout.String(), cout.String())
	}
	if !sres.Verify || !cres.Verify {
		t.Errorf("not verified: server %v client %v", sres.Verify, cres.Verify)
	}
	return sres, cres, sout, cout
}

package runner

import (
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/softrnic/softrnic/daemon"
	"github.com/softrnic/softrnic/internal/perftest"
	"github.com/softrnic/softrnic/rdmacm"
	"github.com/softrnic/softrnic/rnic"
)

// daemonOn serves host h's device through a daemon control server (the
// one `softrnic daemon` runs, in this process) and returns a Host on it as
// a client reaches it: QPs, CQs and MRs in the daemon, rings and memory
// shared with the test.
func daemonOn(t *testing.T, h Host) Host {
	t.Helper()
	agent, _ := h.CM.(*rdmacm.Agent)
	srv, err := daemon.NewServer(h.Device.(*rnic.Device), daemon.Options{Group: -1, CM: agent, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "ctl.sock")
	if err := srv.Listen(sock); err != nil {
		t.Fatal(err)
	}
	go func() {
		if err := srv.Serve(); err != nil {
			t.Error(err)
		}
	}()
	t.Cleanup(func() { srv.Close(time.Second) })
	dh, c, err := DaemonHost(sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if dh.Iface.Name != h.Iface.Name || len(dh.Iface.GIDs) != 1 || dh.Iface.GIDs[0] != h.Iface.GIDs[0] {
		t.Fatalf("daemon host %+v, want %s with GIDs %v", dh.Iface, h.Iface.Name, h.Iface.GIDs)
	}
	return dh
}

// TestProgramsThroughDaemonOverMemlink runs the programs with --verify
// between a test whose QPs live in a daemon (host a) and one in process
// (host b), with the daemon's side as server and as client, on RC, UC and
// UD QPs and several QPs at once.
func TestProgramsThroughDaemonOverMemlink(t *testing.T) {
	a, b := memlinkHosts(t)
	ad := daemonOn(t, a)
	for _, tc := range []struct {
		verb perftest.Verb
		m    perftest.Measure
		args []string
	}{
		{perftest.Write, perftest.BW, []string{"-s", "65536", "-n", "40", "-q", "2"}},
		{perftest.Read, perftest.BW, []string{"-s", "8192", "-n", "40"}},
		{perftest.Send, perftest.BW, []string{"-s", "4096", "-n", "100", "-r", "64"}},
		{perftest.Atomic, perftest.BW, []string{"-n", "100"}},
		{perftest.Write, perftest.Latency, []string{"-s", "64", "-n", "300"}},
		{perftest.Read, perftest.Latency, []string{"-s", "64", "-n", "50"}},
		{perftest.Send, perftest.Latency, []string{"-s", "64", "-n", "50"}},
		{perftest.Atomic, perftest.Latency, []string{"-n", "50"}},
		{perftest.Write, perftest.BW, []string{"-s", "4096", "-n", "20", "-c", "UC"}},
		{perftest.Send, perftest.BW, []string{"-s", "2000", "-n", "50", "-c", "UC", "-r", "64"}},
		{perftest.Send, perftest.BW, []string{"-s", "1024", "-n", "200", "-c", "UD", "-r", "256"}},
		{perftest.Send, perftest.Latency, []string{"-s", "64", "-n", "50", "-c", "UD"}},
	} {
		test := perftest.Test{Verb: tc.verb, Measure: tc.m}
		for _, daemonServes := range []bool{true, false} {
			name := test.Name() + "/" + strings.Join(tc.args, "")
			s, c := ad, b
			if daemonServes {
				name += "/daemon-server"
			} else {
				name += "/daemon-client"
				s, c = b, ad
			}
			t.Run(name, func(t *testing.T) {
				args := append([]string{"--verify"}, tc.args...)
				sr, cr, _, cout := runPair(t, s, c, tc.verb, tc.m, args...)
				if !sr.Verify || !cr.Verify || sr.MTU != 1024 {
					t.Errorf("verify server %v client %v, MTU %d", sr.Verify, cr.Verify, sr.MTU)
				}
				if tc.m == perftest.BW && (len(cr.BW) == 0 || cr.BW[0].Iters == 0 || cr.BW[0].AvgBW <= 0) {
					t.Fatalf("client BW %+v\n%s", cr.BW, cout)
				}
				if tc.m == perftest.Latency && (len(cr.Lat) != 1 || cr.Lat[0].Typical <= 0) {
					t.Fatalf("client latency %+v\n%s", cr.Lat, cout)
				}
			})
		}
	}
}

// TestCMThroughDaemonOverMemlink runs -R tests (control channel and QPs
// through rdma_cm, no TCP) with --verify between a test whose QPs live in
// a daemon and connect through the daemon's CM agent (host a) and one in
// process with its own agent (host b), the daemon's side as server and as
// client. In the "late" cases the server listens only after the client's
// first REQs: the client must be refused with REJ reason 8 and dial again
// (through the daemon the reason travels in CM_CONNECT's error reply), as
// perftest's client does.
func TestCMThroughDaemonOverMemlink(t *testing.T) {
	a, b := memlinkHosts(t)
	ad := daemonOn(t, a)
	port := uint16(18515)
	for _, tc := range []struct {
		verb perftest.Verb
		m    perftest.Measure
		args []string
		late bool
	}{
		{perftest.Write, perftest.BW, []string{"-s", "65536", "-n", "40", "-q", "2"}, false},
		{perftest.Read, perftest.BW, []string{"-s", "8192", "-n", "40"}, false},
		{perftest.Send, perftest.Latency, []string{"-s", "64", "-n", "100"}, false},
		{perftest.Send, perftest.BW, []string{"-s", "4096", "-n", "50"}, true},
	} {
		test := perftest.Test{Verb: tc.verb, Measure: tc.m}
		for _, daemonServes := range []bool{true, false} {
			name := test.Name() + "/" + strings.Join(tc.args, "")
			s, c := ad, b
			if daemonServes {
				name += "/daemon-server"
			} else {
				name += "/daemon-client"
				s, c = b, ad
			}
			if tc.late {
				name += "/late"
			}
			port++
			t.Run(name, func(t *testing.T) {
				var delay time.Duration
				if tc.late {
					delay = 300 * time.Millisecond
				}
				args := append([]string{"--verify"}, tc.args...)
				sr, cr, cout := runCMThrough(t, s, c, port, delay, tc.verb, tc.m, args...)
				if !sr.Verify || !cr.Verify || sr.MTU != 1024 {
					t.Errorf("verify server %v client %v, MTU %d", sr.Verify, cr.Verify, sr.MTU)
				}
				if tc.m == perftest.BW && (len(cr.BW) == 0 || cr.BW[0].Iters == 0 || cr.BW[0].AvgBW <= 0) {
					t.Fatalf("client BW %+v\n%s", cr.BW, cout)
				}
				if tc.m == perftest.Latency && (len(cr.Lat) != 1 || cr.Lat[0].Typical <= 0) {
					t.Fatalf("client latency %+v\n%s", cr.Lat, cout)
				}
			})
		}
	}
}

package runner

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/softrnic/softrnic/internal/netnstest"
	"github.com/softrnic/softrnic/internal/perftest"
)

// TestPerfRDMACMOverVeth runs `softrnic perf -R` (RunCLICM) server and
// client with --verify between two network namespaces joined by a veth
// pair, each on its own AF_XDP port: no TCP at all, the control channel
// and the test QPs are RC connections made by our CM on QP1. It covers
// write_bw (2 QPs: two data connections on the one port), read_bw (READ
// resources negotiated in the REQ/REP), send_bw, atomic_bw, two latency
// tests, write_bw over IPv6 GIDs (the CM's REQ carries IPv6 addresses)
// and write_bw with --dcqcn (the device -R opens is RunCLI's).
func TestPerfRDMACMOverVeth(t *testing.T) {
	pair := netnstest.NewTestPair(t, netnstest.PairOptions{})
	for _, tc := range []struct {
		name string
		verb perftest.Verb
		m    perftest.Measure
		args []string
		v6   bool // IPv6 GIDs: -x 1 and the server's IPv6 address
	}{
		{"write_bw", perftest.Write, perftest.BW, []string{"-s", "65536", "-n", "200", "-q", "2"}, false},
		{"read_bw", perftest.Read, perftest.BW, []string{"-s", "16384", "-n", "200"}, false},
		{"send_bw", perftest.Send, perftest.BW, []string{"-s", "4096", "-n", "500"}, false},
		{"atomic_bw", perftest.Atomic, perftest.BW, []string{"-n", "200"}, false},
		{"send_lat", perftest.Send, perftest.Latency, []string{"-s", "64", "-n", "200"}, false},
		{"write_lat", perftest.Write, perftest.Latency, []string{"-s", "64", "-n", "200"}, false},
		{"write_bw_IPv6", perftest.Write, perftest.BW, []string{"-x", "1", "-s", "8192", "-n", "200"}, true},
		{"write_bw_DCQCN", perftest.Write, perftest.BW, []string{"--dcqcn=paper", "-s", "8192", "-n", "200"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"-R", "--verify", "--json", "-p", "18600"}, tc.args...)
			ps, err := perftest.ParseArgs(tc.verb, tc.m, append([]string{"-d", pair.A.Name}, args...))
			if err != nil {
				t.Fatal(err)
			}
			server := pair.A.Addr
			if tc.v6 {
				server = pair.A.Addr6
			}
			pc, err := perftest.ParseArgs(tc.verb, tc.m, append([]string{"-d", pair.B.Name, server.String()}, args...))
			if err != nil {
				t.Fatal(err)
			}
			cres, sout, cout := runServerClient(t, pair, ps, pc, RunCLICM)
			var j perftest.JSONResult
			if err := json.Unmarshal(cout.Bytes(), &j); err != nil || j.TestInfo.Verified == nil || !*j.TestInfo.Verified {
				t.Fatalf("client JSON %v: %s", err, cout.String())
			}
			if strings.Contains(strings.Join(tc.args, " "), "--dcqcn=paper") {
				var d struct {
					DCQCN *struct {
						Profile string            `json:"profile"`
						QPs     []json.RawMessage `json:"qps"`
					} `json:"dcqcn"`
				}
				if err := json.Unmarshal(cout.Bytes(), &d); err != nil || d.DCQCN == nil || d.DCQCN.Profile != "paper" || len(d.DCQCN.QPs) != 1 {
					t.Fatalf("client's dcqcn JSON %v: %s", err, cout.String())
				}
			}
			if tc.m == perftest.BW {
				r := cres.BW[0]
				if r.Iters == 0 || r.AvgBW <= 0 {
					t.Fatalf("client BW %+v", r)
				}
				t.Logf("-R %s: %d B × %d: %.1f MiB/s, %.4f Mpps", tc.name, r.Size, r.Iters, r.AvgBW, r.MsgRate)
			} else {
				r := cres.Lat[0]
				if r.Typical <= 0 || r.Iters != 200 {
					t.Fatalf("client latency %+v", r)
				}
				t.Logf("-R %s: %d B: typical %.1f µs", tc.name, r.Size, r.Typical)
			}
			if strings.Contains(sout.String(), "error") {
				t.Errorf("server output: %s", sout.String())
			}
		})
	}
}

package runner

import (
	"encoding/json"
	"testing"

	"github.com/softrnic/softrnic/internal/netnstest"
	"github.com/softrnic/softrnic/internal/perftest"
)

// runCMPairUD runs one `-R -c UD` test between a server on host s and a
// client on host c, as runCMPair does for RC.
func runCMPairUD(t *testing.T, s, c Host, port uint16, m perftest.Measure, args ...string) (sr, cr Result) {
	t.Helper()
	sr, cr, _ = runCMThrough(t, s, c, port, 0, perftest.Send, m, append([]string{"-c", "UD"}, args...)...)
	return sr, cr
}

// TestCMUDOverMemlink runs send_bw and send_lat with -R -c UD over an
// in-memory link: the test QPs are found through SIDR (RDMA_UDP_QKEY), the
// latency server learns the client's QP from its SEND with immediate, and
// every message of the run arrives (the bandwidth server's Run returns only
// once it has received all of them; a UD bandwidth test exchanges no
// reports), every round trip completes, and the control connection ends
// cleanly although the UD client has no test connection to tear down first.
func TestCMUDOverMemlink(t *testing.T) {
	a, b := memlinkHosts(t)
	sr, cr := runCMPairUD(t, a, b, 18731, perftest.BW, "-s", "1000", "-n", "200", "-r", "256", "-q", "2")
	if len(cr.BW) != 1 || cr.BW[0].Iters != 400 || sr.MTU != 1024 {
		t.Errorf("send_bw: server %+v client %+v", sr, cr)
	}
	_, cl := runCMPairUD(t, a, b, 18732, perftest.Latency, "-s", "512", "-n", "50")
	if len(cl.Lat) != 1 || cl.Lat[0].Iters != 50 {
		t.Errorf("send_lat: client %+v", cl)
	}
}

// TestPerfRDMACMUDOverVeth runs `softrnic perf -R -c UD` (RunCLICM) server
// and client with --verify between two network namespaces joined by a veth
// pair, each on its own AF_XDP port: the control connection over our CM,
// the UD test QPs found through SIDR, send_bw with two QPs and send_lat
// (whose server learns the client's QP from its SEND with immediate), over
// IPv4 and IPv6 GIDs.
func TestPerfRDMACMUDOverVeth(t *testing.T) {
	pair := netnstest.NewTestPair(t, netnstest.PairOptions{})
	for _, tc := range []struct {
		name string
		m    perftest.Measure
		args []string
		v6   bool
	}{
		{"send_bw_UD", perftest.BW, []string{"-s", "1024", "-n", "500", "-r", "512", "-q", "2"}, false},
		{"send_lat_UD", perftest.Latency, []string{"-s", "64", "-n", "200"}, false},
		{"send_lat_UD_IPv6", perftest.Latency, []string{"-x", "1", "-s", "512", "-n", "200"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"-R", "-c", "UD", "--verify", "--json", "-p", "18610"}, tc.args...)
			ps, err := perftest.ParseArgs(perftest.Send, tc.m, append([]string{"-d", pair.A.Name}, args...))
			if err != nil {
				t.Fatal(err)
			}
			server := pair.A.Addr
			if tc.v6 {
				server = pair.A.Addr6
			}
			pc, err := perftest.ParseArgs(perftest.Send, tc.m, append([]string{"-d", pair.B.Name, server.String()}, args...))
			if err != nil {
				t.Fatal(err)
			}
			cres, _, cout := runServerClient(t, pair, ps, pc, RunCLICM)
			var j perftest.JSONResult
			if err := json.Unmarshal(cout.Bytes(), &j); err != nil || j.TestInfo.Verified == nil || !*j.TestInfo.Verified {
				t.Fatalf("client JSON %v: %s", err, cout.String())
			}
			if tc.m == perftest.BW {
				if r := cres.BW[0]; r.Iters != 1000 || r.AvgBW <= 0 {
					t.Fatalf("client BW %+v", r)
				}
			} else if r := cres.Lat[0]; r.Typical <= 0 || r.Iters != 200 {
				t.Fatalf("client latency %+v", r)
			}
		})
	}
}

package runner

import (
	"testing"

	"github.com/softrnic/softrnic/internal/perftest"
)

// TestCMUDThroughDaemonOverMemlink runs `-R -c UD` with one side's QPs in
// a daemon (SIDR through the daemon's CM: rnic.UDCM) and the other in
// process (its own agent), the daemon as server and as client: every
// message of send_bw -q 2 arrives and is checked (--verify), and the
// latency server, daemon or not, learns the client's QP from its first
// SEND and completes every round trip.
func TestCMUDThroughDaemonOverMemlink(t *testing.T) {
	a, b := memlinkHosts(t)
	ad := daemonOn(t, a)
	port := uint16(18760)
	for _, tc := range []struct {
		m     perftest.Measure
		args  []string
		check func(sr, cr Result) bool
	}{
		{perftest.BW, []string{"-s", "1000", "-n", "200", "-r", "256", "-q", "2", "--verify"},
			func(sr, cr Result) bool {
				return len(cr.BW) == 1 && cr.BW[0].Iters == 400 && cr.BW[0].AvgBW > 0 && sr.Verify && cr.Verify && sr.MTU == 1024
			}},
		{perftest.Latency, []string{"-s", "512", "-n", "50"},
			func(sr, cr Result) bool { return len(cr.Lat) == 1 && cr.Lat[0].Iters == 50 && cr.Lat[0].Typical > 0 }},
	} {
		for _, daemonServes := range []bool{true, false} {
			port++
			test := perftest.Test{Verb: perftest.Send, Measure: tc.m}
			name := test.Name() + "/daemon-client"
			if daemonServes {
				name = test.Name() + "/daemon-server"
			}
			t.Run(name, func(t *testing.T) {
				s, c := ad, b
				if !daemonServes {
					s, c = b, ad
				}
				sr, cr, cout := runCMThrough(t, s, c, port, 0, perftest.Send, tc.m, append([]string{"-c", "UD"}, tc.args...)...)
				if !tc.check(sr, cr) {
					t.Fatalf("server %+v\nclient %+v\n%s", sr, cr, cout)
				}
			})
		}
	}
}

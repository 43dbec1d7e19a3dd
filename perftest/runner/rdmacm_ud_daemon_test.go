package runner

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/softrnic/softrnic/perftest"
	"github.com/softrnic/softrnic/verbsapi"
)

// TestCMUDThroughDaemonOverMemlink runs `-R -c UD` with one side's QPs in
// a daemon (SIDR through the daemon's CM: rnic.UDCM) and the other in
// process (its own agent), the daemon as server and as client: every
// message of send_bw -q 2 arrives and is checked (--verify), and the
// latency server, daemon or not, learns the client's QP from its first
// SEND and completes every round trip.
func TestCMUDThroughDaemonOverMemlink(t *testing.T) {
	a, b := memlinkHosts(t, 1500)
	ad := daemonOn(t, a)
	dcm, err := verbsapi.DaemonCM(ad.RNIC)
	if err != nil {
		t.Fatal(err)
	}
	agent := cmAgent(t, b)
	lcm := verbsapi.LocalCM(agent)
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
				args := append([]string{"-R", "-c", "UD", "-p", fmt.Sprint(port)}, tc.args...)
				ps, err := perftest.ParseArgs(perftest.Send, tc.m, args)
				if err != nil {
					t.Fatal(err)
				}
				s, c := ad, b
				ss := &cmSession{cm: dcm, port: port}
				cs := &cmSession{cm: lcm, agent: agent, port: port, dialFor: 3 * time.Second}
				if !daemonServes {
					s, c = b, ad
					ss = &cmSession{cm: lcm, agent: agent, port: port}
					cs = &cmSession{cm: dcm, port: port, dialFor: 3 * time.Second}
				}
				pc := ps
				pc.Host = s.Iface.GIDs[0].String()
				cs.peer = s.Iface.GIDs[0]
				if ss.l, err = ss.cm.Listen(port); err != nil {
					t.Fatal(err)
				}
				defer ss.l.Close()
				if daemonServes {
					ss.dudl, err = ss.listenUDDaemon()
				} else {
					ss.udl, err = agent.ListenUD(port, 16)
				}
				if err != nil {
					t.Fatal(err)
				}
				if daemonServes {
					defer ss.dudl.Close()
				} else {
					defer ss.udl.Close()
				}
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				var sout, cout bytes.Buffer
				serr := make(chan error, 1)
				var sr Result
				go func() {
					var err error
					sr, err = New(s, ps, false, &sout).execCM(ctx, ss)
					serr <- err
				}()
				cr, cerr := New(c, pc, true, &cout).execCM(ctx, cs)
				if cerr != nil {
					cancel()
				}
				if err := <-serr; err != nil || cerr != nil {
					t.Fatalf("server: %v\nclient: %v\nserver output: %s\nclient output: %s", err, cerr, sout.String(), cout.String())
				}
				if !tc.check(sr, cr) {
					t.Fatalf("server %+v\nclient %+v\n%s", sr, cr, cout.String())
				}
			})
		}
	}
}

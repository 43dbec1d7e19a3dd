package runner

import (
	"encoding/json"
	"testing"

	"github.com/softrnic/softrnic/internal/netnstest"
	"github.com/softrnic/softrnic/internal/perftest"
)

// TestPerfOverLossyBridge runs `softrnic perf` with --verify between two
// namespaces whose path crosses a bridge that drops 2 % of the RoCEv2
// frames and duplicates 1 % in each direction, on AF_XDP ports, with
// perftest's default local ACK timeout: WRITE, READ and SEND with
// selective repeat (softrnic at both ends), and WRITE with adaptive
// retransmission alone, as toward a go-back-N peer. Every byte is
// checked, every run completes, and the recovery counters say how: SACKs
// exchanged with selective repeat only, packets sent twice in every mode.
func TestPerfOverLossyBridge(t *testing.T) {
	path := netnstest.NewTestLossyPath(t, netnstest.LossyOptions{Impairment: netnstest.Impairment{LossPerMille: 20, DupPerMille: 10}})
	for _, tc := range []struct {
		name     string
		verb     perftest.Verb
		args     []string
		mode     string
		selected bool
	}{
		{"write_bw", perftest.Write, []string{"-s", "65536", "-n", "300"}, "selective", true},
		{"write_bw_adaptive", perftest.Write, []string{"-s", "65536", "-n", "300", "--recovery", "adaptive"}, "adaptive", false},
		{"read_bw", perftest.Read, []string{"-s", "65536", "-n", "200"}, "selective", true},
		{"send_bw", perftest.Send, []string{"-s", "16384", "-n", "500"}, "selective", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--verify", "--json", "-F"}, tc.args...)
			ps, err := perftest.ParseArgs(tc.verb, perftest.BW, append([]string{"-d", path.A.Name}, args...))
			if err != nil {
				t.Fatal(err)
			}
			pc, err := perftest.ParseArgs(tc.verb, perftest.BW, append([]string{"-d", path.B.Name, path.A.Addr.String()}, args...))
			if err != nil {
				t.Fatal(err)
			}
			before, err := path.Counters()
			if err != nil {
				t.Fatal(err)
			}
			sres, cres, sout, cout := runLinks(t, path.A, path.B, ps, pc, RunCLI)
			after, err := path.Counters()
			if err != nil {
				t.Fatal(err)
			}
			dropped := after.AtoB.Dropped + after.BtoA.Dropped - before.AtoB.Dropped - before.BtoA.Dropped
			if len(cres.BW) == 0 || cres.BW[0].Iters == 0 || !sres.Verify || !cres.Verify {
				t.Fatalf("client %+v, verified %v/%v", cres.BW, sres.Verify, cres.Verify)
			}
			var sj, cj struct {
				Recovery *RecoveryJSON `json:"recovery"`
			}
			if json.Unmarshal(sout.Bytes(), &sj) != nil || json.Unmarshal(cout.Bytes(), &cj) != nil || sj.Recovery == nil || cj.Recovery == nil {
				t.Fatalf("no recovery objects:\n%s\n%s", sout.String(), cout.String())
			}
			// The requester of a READ is the client, of a WRITE or SEND
			// too; the server answers.
			c, s := cj.Recovery, sj.Recovery
			t.Logf("%s: %.1f MiB/s, %d frames dropped on the path; client %+v", tc.name, cres.BW[0].AvgBW, dropped, c.RecoveryCounters)
			if dropped == 0 || c.Mode != tc.mode {
				t.Fatalf("%d frames dropped, mode %q", dropped, c.Mode)
			}
			if c.RetransPackets == 0 {
				t.Errorf("frames were dropped and the requester sent nothing twice: %+v", c.RecoveryCounters)
			}
			if sacks := c.RxSACKs > 0 && s.TxSACKs > 0; sacks != tc.selected && tc.verb != perftest.Read {
				t.Errorf("SACKs exchanged %v with selective repeat %v: client %+v server %+v", sacks, tc.selected, c.RecoveryCounters, s.RecoveryCounters)
			}
		})
	}
}

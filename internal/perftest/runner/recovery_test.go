package runner

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/softrnic/softrnic/port/memlink"
	"github.com/softrnic/softrnic/rnic"
)

// jsonRecovery decodes the one JSON object of out and returns its
// "recovery" object.
func jsonRecovery(t *testing.T, out string) RecoveryJSON {
	t.Helper()
	var v struct {
		Recovery *RecoveryJSON `json:"recovery"`
	}
	if err := json.NewDecoder(strings.NewReader(out)).Decode(&v); err != nil || v.Recovery == nil {
		t.Fatalf("no recovery object (%v) in\n%s", err, out)
	}
	return *v.Recovery
}

// TestRecoveryJSON runs write_bw --verify (-u 12: 16 ms, far beyond the
// peers' answer times on a loaded host) over a link that loses 2 % of
// the frames each way in each --recovery mode: every run completes, and
// the --json "recovery" object names the mode and counts what it did
// (selective acknowledgements only with selective repeat, no adaptive
// retransmission in timeout mode, packets sent twice in every mode).
func TestRecoveryJSON(t *testing.T) {
	for _, k := range []struct{ flag, mode string }{{"", "selective"}, {"adaptive", "adaptive"}, {"timeout", "timeout"}} {
		t.Run(k.mode, func(t *testing.T) {
			a, b := linkHosts(t, rnic.Congestion{}, memlink.Impairments{Loss: 0.02})
			args := []string{"-s", "65536", "-n", "60", "--json", "--verify", "-u", "12"}
			if k.flag != "" {
				args = append(args, "--recovery", k.flag)
			}
			sout, cout := runPairJSON(t, a, b, args...)
			s, c := jsonRecovery(t, sout), jsonRecovery(t, cout)
			if s.Mode != k.mode || c.Mode != k.mode {
				t.Fatalf("modes %q and %q, want %q", s.Mode, c.Mode, k.mode)
			}
			if c.RetransPackets == 0 || c.Retransmits+c.SelRetrans+c.TLPProbes == 0 {
				t.Errorf("client (requester) retransmitted nothing at 2 %% loss: %+v", c)
			}
			sr := k.mode == "selective"
			if (c.RxSACKs > 0) != sr || (s.TxSACKs > 0) != sr || (s.SRHeld > 0) != sr {
				t.Errorf("selective repeat %v: client %+v, server %+v", sr, c, s)
			}
			if k.mode == "timeout" && c.AdpRetrans+c.TLPProbes+c.AdpRetransTO != 0 {
				t.Errorf("timeout mode retransmitted on its own timers: %+v", c)
			}
		})
	}
}

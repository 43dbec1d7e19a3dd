package rc

import (
	"fmt"
	"github.com/softrnic/softrnic/ib"
	"os"
	"testing"

	"github.com/softrnic/softrnic/bth"
)

// TestLossSweep drives two QPs against each other through a seeded link
// that loses, duplicates and reorders packets in both directions, at 0.1 to
// 10 %, with every RC operation mixed and every byte and completion
// checked (runLoop), over the rate-limited path of the goodput comparison,
// in each recovery mode; at MTU 1024 some messages are longer than the
// selective-repeat window. SOFTRNIC_LONG widens it to every MTU and more
// seeds and messages.
func TestLossSweep(t *testing.T) {
	losses := []float64{0.001, 0.01, 0.03, 0.1}
	mtus, seeds, msgs := []int{1024}, []uint64{21}, 200
	if os.Getenv("SOFTRNIC_LONG") != "" || os.Getenv("SOFTRNIC_EXHAUSTIVE") != "" {
		mtus, seeds, msgs = []int{256, 1024, 4096}, []uint64{21, 22, 23, 24}, 1000
	}
	modes := []struct {
		name string
		o    pairOpts
	}{
		{"timeout", pairOpts{recovery: ib.RecoveryTimeout, timeout: 8}},
		{"adaptive", pairOpts{recovery: ib.RecoveryAdaptive, timeout: 8}},
		{"selective", pairOpts{sr: true, timeout: 8}},
	}
	for _, m := range modes {
		for _, mtu := range mtus {
			for _, loss := range losses {
				for _, seed := range seeds {
					o := streamLink
					o.recovery, o.sr, o.timeout = m.o.recovery, m.o.sr, m.o.timeout
					o.sqDepth = 64
					k := loopCase{mtu: mtu, loss: loss, dup: loss / 2, reorder: loss, msgs: msgs, seed: seed, opts: &o, big: mtu == 1024}
					t.Run(fmt.Sprintf("%s_mtu%d_loss%g_seed%d", m.name, mtu, loss, seed), func(t *testing.T) {
						g, p := runLoop(t, k)
						if m.o.sr {
							if r, _ := p.a.SelectiveRepeat(); !r {
								t.Fatal("no selective repeat")
							}
						}
						t.Logf("%.0f MB/s virtual; A→B %d sent %d lost; go-back-N %d, selective %d, probes %d, RTOs %d, local ACK timeouts %d",
							g/1e6, p.ab.sent, p.ab.lost, p.a.Retransmits, p.a.SelRetrans, p.a.TLPProbes, p.a.AdpRetransTO, p.a.Timeouts)
					})
				}
			}
		}
	}
}

// TestSelectiveTowardGoBackNPeer: a QP that asks for selective repeat,
// facing a softrnic peer that does not agree, marks its requests and
// nothing else changes: the peer answers with IBA packets only (no bit,
// no SACKETH, sequence NAKs), both stay on go-back-N, and all data and
// completions are right at 3 % loss.
func TestSelectiveTowardGoBackNPeer(t *testing.T) {
	o := streamLink
	o.sr, o.peerAdaptive, o.timeout = true, true, 8
	var marked, sackBytes int
	tap = func(p *pair, dir string, b []byte) {
		if dir != "B>" {
			return
		}
		h := bth.BTH(b)
		if h.SR() {
			marked++
		}
		if h.Opcode() == bth.RCAcknowledge && len(b) != bth.BTHLen+bth.AETHLen {
			sackBytes++
		}
	}
	defer func() { tap = nil }()
	_, p := runLoop(t, loopCase{mtu: 1024, loss: 0.03, dup: 0.01, reorder: 0.03, msgs: 300, seed: 31, opts: &o})
	ar, _ := p.a.SelectiveRepeat()
	_, br := p.b.SelectiveRepeat()
	if ar || br || marked != 0 || sackBytes != 0 {
		t.Fatalf("requester %v responder %v; the peer marked %d packets, %d ACKs longer than BTH+AETH", ar, br, marked, sackBytes)
	}
	if p.b.TxNAKs == 0 || p.a.RxNAKSeqErr == 0 {
		t.Fatal("no sequence NAK at 3 % loss")
	}
}

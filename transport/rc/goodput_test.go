package rc

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/softrnic/softrnic/clock"
	"github.com/softrnic/softrnic/ib"
)

// streamLink is the path the goodput comparisons run over, in virtual time:
// a 10 Gb/s link with 15 µs one way, about what two namespaces on this host
// show (tens of µs of RTT, most of it the software on both ends).
var streamLink = pairOpts{rate: 1.25, delay: 15 * time.Microsecond, sqDepth: 128}

// runStream keeps n RDMA WRITEs of size bytes in flight from A to B (as
// perftest's write_bw with tx_depth sqDepth), runs until all complete and
// checks every completion (once, in order, successful) and every byte. It
// returns the goodput in bytes per second of virtual time.
func runStream(t *testing.T, o pairOpts, size, n int) (float64, *pair) {
	t.Helper()
	p := newPairOpts(o)
	const regions = 16
	mr := &testMR{va: 0x100000, buf: make([]byte, regions*size), access: ib.RemoteWrite, valid: true}
	p.memB.mrs[0x1234] = mr
	last := make([]int, regions)
	srcs := make([][]byte, 0, n)
	posted, done := 0, 0
	for done < n {
		for posted < n && p.a.SendQueueFree() > 0 {
			src := fill(size, byte(posted*13))
			srcs = append(srcs, src)
			r := posted % regions
			last[r] = posted
			w := ib.SendWQE{ID: uint64(posted), Opcode: ib.RDMAWrite, Flags: ib.Signaled, SG: segs(src), Length: uint32(size),
				RemoteAddr: mr.va + uint64(r*size), RKey: 0x1234}
			if !p.a.Post(&w) {
				t.Fatal("post")
			}
			posted++
		}
		progressed := p.step()
		p.b.TakeCompletions() // the end of B's visit: its held buffers go back
		for _, c := range p.a.TakeCompletions() {
			if c.Status != ib.Success || c.ID != uint64(done) {
				t.Fatalf("completion %+v, want WR %d successful (now %v)", c, done, p.now)
			}
			done++
		}
		if !progressed && done < n {
			r := &p.a.req
			t.Fatalf("stalled after %d of %d completions at %v: comp %d psn %d max %d head %d next %d tail %d; B ePSN %d qlen %d; deadlines %v %v; wires %d %d busy %v %v",
				done, n, p.now, r.compPSN, r.psn, r.maxPSN, r.head, r.next, r.tail, p.b.resp.ePSN, p.b.resp.qlen, p.a.Deadline(), p.b.Deadline(), len(p.ab.q), len(p.ba.q), p.ab.busy, p.ba.busy)
		}
		if p.now > clock.Time(time.Hour) {
			t.Fatal("virtual time ran away")
		}
	}
	for r, i := range last {
		if i < len(srcs) && !bytes.Equal(mr.buf[r*size:(r+1)*size], srcs[i]) {
			t.Fatalf("region %d does not hold WRITE %d", r, i)
		}
	}
	return float64(n*size) / p.now.Sub(0).Seconds(), p
}

type streamMode struct {
	name string
	opts pairOpts
}

var streamModes = []streamMode{
	{"local ACK timeout only, -u 14 (67 ms)", pairOpts{recovery: ib.RecoveryTimeout, timeout: 14}},
	{"local ACK timeout only, -u 8 (1 ms)", pairOpts{recovery: ib.RecoveryTimeout, timeout: 8}},
	{"adaptive go-back-N, -u 14", pairOpts{recovery: ib.RecoveryAdaptive, timeout: 14}},
	{"adaptive + selective repeat, -u 14", pairOpts{sr: true, timeout: 14}},
}

// TestGoodputComparison measures, in virtual time, 64 KiB WRITE goodput
// at 1 % and 3 % loss each way relative to the lossless path, for today's
// local-ACK-timeout recovery and for adaptive retransmission with and
// without selective repeat. SOFTRNIC_LONG runs more messages and seeds.
func TestGoodputComparison(t *testing.T) {
	msgs, seeds := 150, []uint64{1}
	if os.Getenv("SOFTRNIC_LONG") != "" || os.Getenv("SOFTRNIC_EXHAUSTIVE") != "" {
		msgs, seeds = 1500, []uint64{1, 2, 3}
	}
	const size = 64 << 10
	var tbl strings.Builder
	fmt.Fprintf(&tbl, "\n%-40s %12s %8s %8s\n", "recovery (64 KiB WRITE, MTU 1024)", "lossless", "1 %", "3 %")
	ratios := map[string][2]float64{}
	for _, m := range streamModes {
		var base float64
		var r [2]float64
		for i, loss := range []float64{0, 0.01, 0.03} {
			sum := 0.0
			for _, seed := range seeds {
				o := streamLink
				o.recovery, o.sr, o.timeout = m.opts.recovery, m.opts.sr, m.opts.timeout
				o.mtu, o.seed, o.loss = 1024, seed, loss
				g, _ := runStream(t, o, size, msgs)
				sum += g
			}
			g := sum / float64(len(seeds))
			if i == 0 {
				base = g
			} else {
				r[i-1] = g / base
			}
		}
		ratios[m.name] = r
		fmt.Fprintf(&tbl, "%-40s %7.0f MB/s %8.2f %8.2f\n", m.name, base/1e6, r[0], r[1])
	}
	t.Log(tbl.String())
	sr, adp, old := ratios[streamModes[3].name], ratios[streamModes[2].name], ratios[streamModes[0].name]
	for i, loss := range []string{"1 %", "3 %"} {
		if !(sr[i] > adp[i] && adp[i] >= old[i]) {
			t.Errorf("%s loss: selective %.2f, adaptive %.2f, timeout %.2f: selective must beat adaptive, adaptive match the timeout at least", loss, sr[i], adp[i], old[i])
		}
	}
}

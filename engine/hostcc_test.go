package engine

import (
	"testing"

	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/verbs"
)

// gauge is a port.RxGauge that reports rings nearly exhausted and counts
// its readings.
type gauge struct{ reads int }

func (g *gauge) RxLevel() (fill, queued, buffers int) { g.reads++; return 1, 9, 10 }

// The loop reads its gauge once for every poll that returned frames and
// hands the level to the device, whose host-congestion detector then
// counts each reading as over a threshold; a loop without a gauge (the
// port is none) reads nothing.
func TestLoopReadsRxGauge(t *testing.T) {
	p := newPair(t, 1024, 1, 1<<16, 0)
	g := &gauge{}
	var err error
	if p.lb, err = NewLoop(p.b.dev, p.pb, Options{Now: p.vc.Now, Gauge: g}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.qpA[0].PostSend([]verbs.SendWR{{ID: 1, Opcode: ib.RDMAWrite, Flags: ib.Signaled,
		SG:         []ib.SGE{{Addr: p.a.mr.IOVA(), Length: 1 << 16, LKey: p.a.mr.LKey()}},
		RemoteAddr: p.b.mr.IOVA(), RKey: p.b.mr.RKey()}}); err != nil {
		t.Fatal(err)
	}
	var wcs [4]ib.WC
	done := false
	for i := 0; i < 100000 && !done; i++ {
		p.step(t)
		for _, w := range wcs[:p.a.cq.Poll(wcs[:])] {
			if w.Status != ib.Success {
				t.Fatalf("WRITE: %v", w.Status)
			}
			done = true
		}
	}
	if !done {
		t.Fatal("the WRITE did not complete")
	}
	b := p.b.dev.HostCCCounters()
	if g.reads == 0 || b.Readings != uint64(g.reads) || b.Episodes == 0 {
		t.Errorf("gauge read %d times, device counted %+v", g.reads, b)
	}
	if a := p.a.dev.HostCCCounters(); a.Readings != 0 {
		t.Errorf("a loop without a gauge counted %+v", a)
	}
}

package rnic

import (
	"testing"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/frame"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/port/memlink"
	"github.com/softrnic/softrnic/verbs"
)

// TestTransmitFillsBatch: one QP with a long WRITE fills a whole transmit
// batch (one sendto(2) per batch on AF_XDP), not one txBudget of it; with
// several QPs ready the batch is shared round-robin, txBudget frames per
// QP per round, and each QP's PSNs stay in order.
func TestTransmitFillsBatch(t *testing.T) {
	for _, qps := range []int{1, 3} {
		tb := newTestbed(t, memlink.Impairments{}, 1, 1024)
		tb.recovery = ib.RecoveryTimeout // no initial window: a whole window at once
		mr, err := tb.a.pd.RegBytes(make([]byte, 1<<20), 0, ib.LocalWrite)
		must(t, err)
		rmr, err := tb.b.pd.RegBytes(make([]byte, 1<<20), 0, ib.LocalWrite|ib.RemoteWrite)
		must(t, err)
		for i := 0; i < qps; i++ {
			qa, _ := tb.connect(ib.RC, 1024, ib.RemoteWrite, 16)
			if _, err := qa.PostSend([]verbs.SendWR{{ID: 1, Opcode: ib.RDMAWrite, SG: []ib.SGE{{Addr: mr.IOVA(), Length: 1 << 20, LKey: mr.LKey()}},
				RemoteAddr: rmr.IOVA(), RKey: rmr.RKey()}}); err != nil {
				t.Fatal(err)
			}
		}
		if k := tb.a.port.Lend(tb.a.out); k != len(tb.a.out) {
			t.Fatalf("the port lent %d buffers", k)
		}
		n := tb.a.dev.Transmit(tb.clk.Now(), tb.a.out)
		if n != len(tb.a.out) {
			t.Fatalf("%d QPs: Transmit built %d frames, want the whole batch of %d", qps, n, len(tb.a.out))
		}
		perQP := map[uint32][]uint32{} // DestQP → PSNs in order of the batch
		var order []uint32
		var f frame.Frame
		for _, b := range tb.a.out[:n] {
			if err := frame.Parse(b, &f); err != nil {
				t.Fatal(err)
			}
			h := f.BTH()
			q := h.DestQP()
			if len(order) == 0 || order[len(order)-1] != q {
				order = append(order, q)
			}
			if l := perQP[q]; len(l) > 0 && bth.PSN(l[len(l)-1]).Next() != h.PSN() {
				t.Fatalf("QP %#x: PSN %#x after %#x", q, h.PSN(), l[len(l)-1])
			}
			perQP[q] = append(perQP[q], uint32(h.PSN()))
		}
		if len(perQP) != qps {
			t.Fatalf("%d QPs: frames of %d QPs in the batch", qps, len(perQP))
		}
		if qps > 1 {
			// Runs of txBudget frames, one QP after the other.
			if want := (n + txBudget - 1) / txBudget; len(order) != want {
				t.Errorf("%d QPs: %d runs of frames, want %d runs of %d", qps, len(order), want, txBudget)
			}
		}
	}
}

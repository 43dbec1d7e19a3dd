package rnic

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/internal/ibtest"
	"github.com/softrnic/softrnic/port/memlink"
	"github.com/softrnic/softrnic/verbs"
)

// TestPeerSlotSpread: peers' addresses spread over the heard slots.
func TestPeerSlotSpread(t *testing.T) {
	used := map[int]bool{}
	for i := 1; i <= 32; i++ {
		used[peerSlot(netip.AddrFrom4([4]byte{10, 0, 0, byte(i)}))] = true
	}
	if len(used) < 16 {
		t.Fatalf("32 peers in %d slots", len(used))
	}
}

// TestHeardPeerOnAnotherQP: the device tells each connected RC QP when its
// peer's device was last heard from, on any QP. A QP whose peer QP fell
// silent (in ERR, it drops what it gets) while another QP to the same peer
// device keeps working spends excused timeouts before it gives up; with
// that other QP idle, none is excused.
func TestHeardPeerOnAnotherQP(t *testing.T) {
	for _, busy := range []bool{false, true} {
		t.Run(fmt.Sprintf("busy%v", busy), func(t *testing.T) {
			tb := newTestbed(t, memlink.Impairments{}, 21, 1024)
			all := ib.LocalWrite | ib.RemoteWrite
			qa, _ := tb.connect(ib.RC, 1024, all, 16)
			ga, gb := tb.connect(ib.RC, 1024, all, 16)
			src, dst := make([]byte, 4096), make([]byte, 4096)
			ms, err := tb.a.pd.RegBytes(src, 0x1000, all)
			must(t, err)
			md, err := tb.b.pd.RegBytes(dst, 0x1000, all)
			must(t, err)
			write := func(q *QP, id uint64) {
				t.Helper()
				_, err := q.PostSend([]verbs.SendWR{{ID: id, Opcode: ib.RDMAWrite, Flags: ib.Signaled,
					SG: []ib.SGE{sge(ms, 0, 4096)}, RemoteAddr: md.IOVA(), RKey: md.RKey()}})
				must(t, err)
			}
			must(t, ibtest.Modify(gb, ib.Err, &ib.QPAttr{}))
			write(ga, 1)
			if busy {
				write(qa, 100)
			}
			var failed []ib.WC
			n := 0
			tb.run(func() bool {
				for _, wc := range pollAll(qa.init.SendCQ) {
					if wc.Status != ib.Success {
						t.Fatalf("the working QP: %+v", wc)
					}
					n++
					write(qa, uint64(100+n))
				}
				failed = append(failed, pollAll(ga.init.SendCQ)...)
				return len(failed) > 0
			}, 10*time.Second)
			if failed[0].Status != ib.RetryExcErr {
				t.Fatalf("silent peer QP: %+v", failed)
			}
			c := tb.a.dev.RecoveryCounters([]uint32{ga.QPN()})
			// retry_cnt 7: 8 timeouts spend the retries; the excuses are
			// rc's, up to 3 for each of them.
			if c.Timeouts-c.Excused != 8 {
				t.Fatalf("%d timeouts, %d excused: want 8 not excused", c.Timeouts, c.Excused)
			}
			if busy && (c.Excused == 0 || c.Excused > 3*8) {
				t.Fatalf("%d excused timeouts (%d WRITEs done meanwhile on the other QP), want 1 to 24", c.Excused, n)
			}
			if !busy && c.Excused != 0 {
				t.Fatalf("%d excused timeouts with the peer's device silent", c.Excused)
			}
		})
	}
}

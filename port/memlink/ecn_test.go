package memlink_test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/frame"
	"github.com/softrnic/softrnic/port"
	"github.com/softrnic/softrnic/port/memlink"
)

// roce builds a RoCEv2 SEND ONLY frame of 1000 bytes with the given TOS,
// over IPv4 or IPv6.
func roce(t testing.TB, tos uint8, v6 bool) []byte {
	t.Helper()
	s := frame.Spec{Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"), TOS: tos,
		SrcPort: 0xC001, BTH: bth.BTHFields{Opcode: bth.RCSendOnly, PKey: 0xFFFF, DestQP: 0x11}}
	if v6 {
		s.Src, s.Dst = netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2")
	}
	pay := make([]byte, 1000-frame.Size(&s, 0))
	buf := make([]byte, 2048)
	n, err := frame.Build(buf, &s, pay)
	if err != nil {
		t.Fatal(err)
	}
	return buf[:n]
}

// sendRecv sends frames from a to b at the clock's time and returns what b
// receives once they are due.
func sendRecv(t testing.TB, vc *memlink.VirtualClock, a, b *memlink.Port, frames ...[]byte) [][]byte {
	t.Helper()
	if n, err := port.Send(a, frames); err != nil || n != len(frames) {
		t.Fatalf("send %d/%d: %v", n, len(frames), err)
	}
	if next := b.NextDelivery(); next > vc.Now() {
		vc.Set(next)
	}
	in := make([][]byte, len(frames)+1)
	n, err := b.Recv(in, 0)
	if err != nil || n != len(frames) {
		t.Fatalf("recv %d/%d: %v", n, len(frames), err)
	}
	return in[:n]
}

func ecnOf(t testing.TB, b []byte) uint8 {
	t.Helper()
	var f frame.Frame
	if err := frame.Parse(b, &f); err != nil {
		t.Fatal(err)
	}
	if !f.VerifyICRC() {
		t.Fatal("ICRC broken by the marker")
	}
	if !f.IsIPv6() {
		if !f.IPv4().ChecksumValid() {
			t.Fatal("IPv4 header checksum broken by the marker")
		}
	}
	return f.ECN()
}

// TestCEMarkProbability: with CEMark 1 every ECN-capable frame, IPv4 and
// IPv6, arrives CE with valid checksums, and non-ECT frames pass untouched;
// with CEMark 0.25 about a quarter is marked, identically for one seed.
func TestCEMarkProbability(t *testing.T) {
	vc := &memlink.VirtualClock{}
	a, b := memlink.NewPair(memlink.Config{Clock: vc.Now, Seed: 1, Impairments: memlink.Impairments{CEMark: 1}})
	for _, v6 := range []bool{false, true} {
		got := sendRecv(t, vc, a, b, roce(t, 0x02, v6), roce(t, 0x01, v6), roce(t, 0x00, v6), roce(t, 0xC0, v6))
		for i, want := range []uint8{3, 3, 0, 0} {
			if e := ecnOf(t, got[i]); e != want {
				t.Errorf("v6=%v frame %d: ECN %d, want %d", v6, i, e, want)
			}
		}
	}
	if m := a.Stats().Marked; m != 4 {
		t.Errorf("Marked = %d, want 4", m)
	}
	count := func(seed uint64) (marked int) {
		vc := &memlink.VirtualClock{}
		a, b := memlink.NewPair(memlink.Config{Clock: vc.Now, Seed: seed, Impairments: memlink.Impairments{CEMark: 0.25}})
		f := roce(t, 0xC2, false)
		for i := 0; i < 400; i++ {
			if ecnOf(t, sendRecv(t, vc, a, b, f)[0]) == 3 {
				marked++
			}
		}
		return marked
	}
	m1, m2 := count(7), count(7)
	if m1 != m2 || m1 < 60 || m1 > 140 {
		t.Fatalf("CEMark 0.25 over 400 frames: %d then %d marked", m1, m2)
	}
}

// TestCEVirtualQueue: a 8 Gb/s (1 byte/ns) virtual queue with a 2500-byte
// threshold marks the frames that find more than 2500 bytes ahead of them,
// and nothing once it has drained.
func TestCEVirtualQueue(t *testing.T) {
	vc := &memlink.VirtualClock{}
	a, b := memlink.NewPair(memlink.Config{Clock: vc.Now, Seed: 1, Impairments: memlink.Impairments{CEQueueRate: 8e9, CEQueueBytes: 2500}})
	burst := make([][]byte, 10)
	for i := range burst {
		burst[i] = roce(t, 0x02, false)
	}
	got := sendRecv(t, vc, a, b, burst...)
	for i, f := range got {
		want := uint8(2)
		if i >= 3 { // 3000 bytes and more ahead of it
			want = 3
		}
		if e := ecnOf(t, f); e != want {
			t.Errorf("burst frame %d: ECN %d, want %d", i, e, want)
		}
	}
	// 10000 bytes drain in 10 µs; a frame every 1.5 µs then never queues.
	vc.Advance(10 * time.Microsecond)
	for i := 0; i < 20; i++ {
		if e := ecnOf(t, sendRecv(t, vc, a, b, roce(t, 0x02, false))[0]); e != 2 {
			t.Fatalf("paced frame %d marked (ECN %d)", i, e)
		}
		vc.Advance(1500 * time.Nanosecond)
	}
	if m := a.Stats().Marked; m != 7 {
		t.Fatalf("Marked = %d, want 7", m)
	}
}

// TestCEMarkAllocatesNothing: the marker keeps Submit and Recv free of
// allocations.
func TestCEMarkAllocatesNothing(t *testing.T) {
	vc := &memlink.VirtualClock{}
	a, b := memlink.NewPair(memlink.Config{Clock: vc.Now, Seed: 1, Impairments: memlink.Impairments{CEMark: 0.5, CEQueueRate: 1e9, CEQueueBytes: 5000}})
	out := [][]byte{roce(t, 0x02, false), roce(t, 0x02, true)}
	in := make([][]byte, 4)
	lent := make([][]byte, 2)
	allocs := testing.AllocsPerRun(200, func() {
		if a.Lend(lent) != 2 {
			t.Fatal("lend")
		}
		for i := range lent {
			lent[i] = lent[i][:copy(lent[i], out[i])]
		}
		if n, _ := a.Submit(lent); n != 2 {
			t.Fatal("send")
		}
		vc.Advance(time.Microsecond)
		if n, _ := b.Recv(in, 0); n != 2 {
			t.Fatal("recv")
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per Submit+Recv with marking", allocs)
	}
}

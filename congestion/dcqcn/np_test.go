package dcqcn

import (
	"testing"
	"time"

	"github.com/softrnic/softrnic/clock"
)

// drive feeds CE-marked packets at 0, 1, …, 199 µs and services the NP's
// timer like the engine, returning the CNP send times.
func drive(n *NP) []clock.Time {
	var cnps []clock.Time
	for i := clock.Time(0); i <= 200; i++ {
		now := i * us
		if d := n.Deadline(); d <= now {
			if n.OnTimer(d) {
				cnps = append(cnps, d)
			}
		}
		if i < 200 && n.OnPacket(now, true) {
			cnps = append(cnps, now)
		}
	}
	return cnps
}

// §5.2: paper NP (immediate, then at most one per N = 50 µs if a mark
// arrived in the window) emits 5 CNPs at 0, 50, 100, 150, 200 µs.
func TestNPPaperDeferred(t *testing.T) {
	n := NewNP(PaperNP())
	got := drive(n)
	want := []clock.Time{0, 50 * us, 100 * us, 150 * us, 200 * us}
	if len(got) != len(want) {
		t.Fatalf("CNPs at %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("CNPs at %v, want %v", got, want)
		}
	}
	if n.NPECNMarkedRoCEPackets != 200 || n.NPCNPSent != 5 {
		t.Fatalf("counters %+v", n.NPCounters)
	}
	if n.Deadline() != clock.Never {
		t.Fatalf("NP still armed at %v", n.Deadline())
	}
}

// A drop-style limiter with 4 µs spacing emits 50 CNPs at 0, 4, …, 196 µs.
func TestNPDropStyle(t *testing.T) {
	n := NewNP(DefaultConnectX().NPConfig())
	got := drive(n)
	if len(got) != 50 {
		t.Fatalf("%d CNPs, want 50: %v", len(got), got)
	}
	for i, at := range got {
		if at != clock.Time(4*i)*us {
			t.Fatalf("CNP %d at %v, want %v", i, at, clock.Time(4*i)*us)
		}
	}
	if n.NPCNPSent != 50 || n.CNPSuppressed != 150 {
		t.Fatalf("counters %+v", n.NPCounters)
	}
}

// Unmarked packets never produce CNPs; a mark after a quiet spell does at
// once; MinInterval 0 gives one CNP per mark.
func TestNPUnmarkedAndPerPacket(t *testing.T) {
	n := NewNP(PaperNP())
	for i := clock.Time(0); i < 100; i++ {
		if n.OnPacket(i*us, false) {
			t.Fatal("CNP for an unmarked packet")
		}
	}
	if !n.OnPacket(1000*us, true) || n.OnPacket(1010*us, true) {
		t.Fatal("first mark must send, second within N must not")
	}
	if !n.OnPacket(1060*us, false) {
		t.Fatal("a deferred CNP due before a packet's arrival must go with it")
	}
	n = NewNP(NPConfig{MinInterval: 0})
	for i := clock.Time(0); i < 10; i++ {
		if !n.OnPacket(i, true) {
			t.Fatal("MinInterval 0 suppressed a CNP")
		}
	}
	n = NewNP(NPConfig{MinInterval: -time.Second})
	for i := range 2 {
		if !n.OnPacket(0, true) {
			t.Fatalf("negative MinInterval must act as 0: packet %d at the same time had no CNP", i)
		}
	}
}

func TestNPAllocFree(t *testing.T) {
	n := NewNP(PaperNP())
	now := clock.Time(0)
	allocs := testing.AllocsPerRun(5000, func() {
		now += 300
		n.OnPacket(now, now%900 == 0)
		if n.Deadline() <= now {
			n.OnTimer(now)
		}
	})
	if allocs != 0 {
		t.Fatalf("NP allocates %.1f per packet", allocs)
	}
}

// Grid (ns3-rdma's CheckandSendQCN): CNPs only at the ticks of a per-QP
// 50 µs clock that starts at the QP's first packet, one per tick whose
// interval saw a mark. Marks at 0…199 µs give CNPs at 50, 100, 150, 200 µs:
// the first waits for its tick instead of leaving at once.
func TestNPGrid(t *testing.T) {
	cfg := PaperNP()
	cfg.Grid = true
	n := NewNP(cfg)
	got := drive(n)
	want := []clock.Time{50 * us, 100 * us, 150 * us, 200 * us}
	if len(got) != len(want) {
		t.Fatalf("CNPs at %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("CNPs at %v, want %v", got, want)
		}
	}
	if n.NPECNMarkedRoCEPackets != 200 || n.NPCNPSent != 4 || n.CNPSuppressed != 196 {
		t.Fatalf("counters %+v", n.NPCounters)
	}

	// The grid's origin is the first packet, marked or not: unmarked
	// packets from 7 µs, one mark at 80 µs (interval 57–107) and one at
	// 107 µs (exactly on a tick: it opens the next interval) give CNPs at
	// 107 and 157 µs, and an unmarked interval gives none.
	n = NewNP(cfg)
	var cnps []clock.Time
	for i := clock.Time(7); i <= 300; i++ {
		now := i * us
		if d := n.Deadline(); d <= now && n.OnTimer(d) {
			cnps = append(cnps, d)
		}
		if n.OnPacket(now, i == 80 || i == 107) {
			cnps = append(cnps, now)
		}
	}
	want = []clock.Time{107 * us, 157 * us}
	if len(cnps) != 2 || cnps[0] != want[0] || cnps[1] != want[1] {
		t.Fatalf("CNPs at %v, want %v", cnps, want)
	}
}

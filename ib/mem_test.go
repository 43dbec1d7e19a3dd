package ib

import (
	"bytes"
	"net/netip"
	"sync"
	"testing"
)

func TestCopyInOutAcrossSegments(t *testing.T) {
	a, b, c := make([]byte, 3), make([]byte, 0), make([]byte, 5)
	sg := []Seg{LocalSeg(a), LocalSeg(b), LocalSeg(c)}
	src := []byte{1, 2, 3, 4, 5, 6, 7, 8}
	if n := CopyOut(sg, 0, src); n != 8 {
		t.Fatal(n)
	}
	dst := make([]byte, 6)
	if n := CopyIn(dst, sg, 2); n != 6 || !bytes.Equal(dst, src[2:]) {
		t.Fatalf("%d % x", n, dst)
	}
	if n := CopyOut(sg, 6, []byte{9, 9, 9}); n != 2 || c[4] != 9 {
		t.Fatal("CopyOut past the end")
	}
	if n := CopyIn(make([]byte, 4), sg, 7); n != 1 {
		t.Fatal("CopyIn past the end")
	}
	s := LocalSeg(c).Slice(1, 3)
	if s.Len() != 3 || s.WriteAt(2, []byte{7, 7}) != 1 || c[3] != 7 || s.ReadAt(make([]byte, 8), 3) != 0 {
		t.Fatalf("Slice/ReadAt/WriteAt bounds: % x", c)
	}
}

// TestGather: Gather visits the same bytes as CopyIn, in order, and hands
// copyFn's state along.
func TestGather(t *testing.T) {
	a, b, c := []byte{1, 2, 3}, []byte{}, []byte{4, 5, 6, 7, 8}
	sg := []Seg{LocalSeg(a), LocalSeg(b), LocalSeg(c)}
	calls := 0
	sum := func(st uint32, dst, src []byte) uint32 {
		calls++
		for i, x := range src {
			dst[i] = x
			st = st*31 + uint32(x)
		}
		return st
	}
	for off := 0; off <= 8; off++ {
		for n := 0; n <= 8; n++ {
			dst, want := make([]byte, n), make([]byte, n)
			st, k := Gather(dst, sg, uint32(off), 7, sum)
			kw := CopyIn(want, sg, uint32(off))
			wst := uint32(7)
			for _, x := range want[:kw] {
				wst = wst*31 + uint32(x)
			}
			if k != kw || !bytes.Equal(dst, want) || st != wst {
				t.Fatalf("off %d n %d: %d bytes % x state %d, want %d % x %d", off, n, k, dst, st, kw, want, wst)
			}
		}
	}
	if calls == 0 {
		t.Fatal("copyFn never called")
	}
}

func TestAtomicsAlignedAndNot(t *testing.T) {
	buf := make([]byte, 24)
	for _, off := range []int{0, 8, 3} { // 3: not 8-aligned in Go memory, takes the lock path
		s := LocalSeg(buf[off : off+8])
		var wg sync.WaitGroup
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 1000; i++ {
					s.FetchAdd(1)
				}
			}()
		}
		wg.Wait()
		if v := s.CmpSwap(4000, 7); v != 4000 {
			t.Fatalf("offset %d: %d", off, v)
		}
		if v := s.CmpSwap(4000, 9); v != 7 {
			t.Fatalf("offset %d: compare must fail, got %d", off, v)
		}
		clear(buf)
	}
}

func TestNumbersAreIBVerbs(t *testing.T) {
	// The values the C library and the daemon's rings share with rdma-core.
	if RDMAWrite != 0 || Send != 2 || RDMARead != 4 || AtomicFetchAndAdd != 6 || SendWithInv != 9 ||
		Signaled != 2 || Inline != 8 || WCRecv != 128 || WCWithImm != 2 || WCWithInv != 8 ||
		RC != 2 || UD != 4 || Err != 6 || AttrDestQPN != 1<<20 || EventCommEst != 4 {
		t.Fatal("a vocabulary value differs from <infiniband/verbs.h>")
	}
	if got := (AttrState | AttrAV | 1<<30).String(); got != "STATE|AV|BIT_30" {
		t.Fatal(got)
	}
}

func TestGID(t *testing.T) {
	for _, s := range []string{"10.0.0.1", "fd00::1"} {
		a := netip.MustParseAddr(s)
		if g := GIDFrom(a); g.Addr() != a {
			t.Fatalf("%v -> %v", a, g.Addr())
		}
	}
	if (GID{}).Addr().IsValid() || GIDFrom(netip.Addr{}) != (GID{}) {
		t.Fatal("zero GID")
	}
}

// fakeExt is external memory backed by a slice, recording what the Seg
// asked of it.
type fakeExt struct {
	mem    []byte
	reads  int
	writes int
}

func (f *fakeExt) ViewExternal(va uint64, n, avail int) []byte {
	if avail < n || va+uint64(avail) > 20 {
		panic("avail beyond the Seg")
	}
	f.reads++
	return f.mem[va : va+uint64(n)]
}
func (f *fakeExt) WriteExternal(va uint64, src []byte) { f.writes++; copy(f.mem[va:], src) }
func (f *fakeExt) CmpSwapExternal(va, cmp, swap uint64) uint64 {
	return LocalSeg(f.mem[va:va+8]).CmpSwap(cmp, swap)
}
func (f *fakeExt) FetchAddExternal(va, add uint64) uint64 {
	return LocalSeg(f.mem[va : va+8]).FetchAdd(add)
}

// An external Seg behaves as the local one over the same bytes, reaching
// them only through its External, within its bounds.
func TestExternalSeg(t *testing.T) {
	f := &fakeExt{mem: make([]byte, 32)}
	x := ExternalSeg(f, 4, 16) // bytes 4..20
	local := make([]byte, 3)
	sg := []Seg{LocalSeg(local), x.Slice(2, 10)} // local, then external bytes 6..16
	src := []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14}
	if n := CopyOut(sg, 0, src); n != 13 || !bytes.Equal(local, src[:3]) || !bytes.Equal(f.mem[6:16], src[3:13]) || f.mem[16] != 0 {
		t.Fatalf("CopyOut %d: % x | % x", n, local, f.mem)
	}
	dst := make([]byte, 20)
	if n := CopyIn(dst, sg, 1); n != 12 || !bytes.Equal(dst[:12], src[1:13]) {
		t.Fatalf("CopyIn %d: % x", n, dst)
	}
	if x.Len() != 16 || x.Slice(2, 10).Len() != 10 || x.WriteAt(15, []byte{9, 9}) != 1 || f.mem[19] != 9 || f.mem[20] != 0 || x.ReadAt(dst, 16) != 0 {
		t.Fatal("bounds")
	}
	// Gather folds external bytes as it does local ones.
	sum := func(st uint32, d, s []byte) uint32 {
		copy(d, s)
		for _, b := range s {
			st += uint32(b)
		}
		return st
	}
	g := make([]byte, 13)
	st, k := Gather(g, sg, 0, 0, sum)
	want := uint32(0)
	for _, b := range append(append([]byte{}, local...), f.mem[6:16]...) {
		want += uint32(b)
	}
	if k != 13 || st != want || !bytes.Equal(g[:3], local) || !bytes.Equal(g[3:], f.mem[6:16]) {
		t.Fatalf("Gather %d %d (want %d): % x", k, st, want, g)
	}
	a := ExternalSeg(f, 24, 8)
	if a.FetchAdd(5) != 0 || a.CmpSwap(5, 9) != 5 || a.CmpSwap(5, 1) != 9 {
		t.Fatal("atomics")
	}
	if f.reads == 0 || f.writes == 0 {
		t.Fatal("the external memory was not used")
	}
}

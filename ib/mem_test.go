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

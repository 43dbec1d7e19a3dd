package wr

import (
	"bytes"
	"sync"
	"testing"
)

func TestCopyInOutAcrossSegments(t *testing.T) {
	a, b, c := make([]byte, 3), make([]byte, 0), make([]byte, 5)
	sg := [][]byte{a, b, c}
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
}

func TestAtomicsAlignedAndNot(t *testing.T) {
	buf := make([]byte, 24)
	for _, off := range []int{0, 8, 3} { // 3: not 8-aligned in Go memory, takes the lock path
		b := buf[off : off+8]
		var wg sync.WaitGroup
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 1000; i++ {
					AtomicFetchAdd(b, 1)
				}
			}()
		}
		wg.Wait()
		if v := AtomicCmpSwap(b, 4000, 7); v != 4000 {
			t.Fatalf("offset %d: %d", off, v)
		}
		if v := AtomicCmpSwap(b, 4000, 9); v != 7 {
			t.Fatalf("offset %d: compare must fail, got %d", off, v)
		}
		clear(buf)
	}
}

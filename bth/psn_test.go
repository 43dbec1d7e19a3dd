package bth

import "testing"

func TestPSNArithmetic(t *testing.T) {
	cases := []struct {
		p, q PSN
		diff int32
	}{
		{5, 3, 2},
		{3, 5, -2},
		{0, PSNMask, 1},          // wrap: 0 is after 0xFFFFFF
		{PSNMask, 0, -1},         //
		{0x000010, 0xFFFFF0, 32}, // across the wrap
		{0, 0, 0},
		{PSNHalf, 0, -PSNHalf}, // exactly half way is "before" (range [-2^23, 2^23))
		{PSNHalf - 1, 0, PSNHalf - 1},
	}
	for _, c := range cases {
		if got := c.p.Diff(c.q); got != c.diff {
			t.Errorf("PSN(%#x).Diff(%#x) = %d, want %d", c.p, c.q, got, c.diff)
		}
		if got := c.p.Less(c.q); got != (c.diff < 0) {
			t.Errorf("PSN(%#x).Less(%#x) = %v", c.p, c.q, got)
		}
		if got := c.p.LessEq(c.q); got != (c.diff <= 0) {
			t.Errorf("PSN(%#x).LessEq(%#x) = %v", c.p, c.q, got)
		}
	}
	if got := PSN(PSNMask).Next(); got != 0 {
		t.Errorf("Next at wrap = %#x", got)
	}
	if got := PSN(0).Prev(); got != PSNMask {
		t.Errorf("Prev at wrap = %#x", got)
	}
	if got := PSN(0xFFFFFE).Add(5); got != 3 {
		t.Errorf("Add across wrap = %#x", got)
	}
	if got := PSN(3).Sub(5); got != 0xFFFFFE {
		t.Errorf("Sub across wrap = %#x", got)
	}
	if got := PSN(7).Add(1 << 24); got != 7 {
		t.Errorf("Add(2^24) = %#x, want identity", got)
	}
}

func TestPSNDiffMatchesAdd(t *testing.T) {
	// For every start and distance d in range, start.Add(d).Diff(start) == d.
	for _, start := range []PSN{0, 1, 0x7FFFFF, 0x800000, 0xFFFF00, PSNMask} {
		for _, d := range []int32{0, 1, 63, 128, 1000, PSNHalf - 1, -1, -128, -PSNHalf} {
			p := start.Add(uint32(d))
			if got := p.Diff(start); got != d {
				t.Errorf("(%#x + %d).Diff = %d", start, d, got)
			}
			if !p.Valid() {
				t.Errorf("%#x not valid", p)
			}
		}
	}
}

func TestPSNInWindow(t *testing.T) {
	start := PSN(0xFFFFFD)
	for i := uint32(0); i < 8; i++ {
		p := start.Add(i)
		if want := i < 5; p.InWindow(start, 5) != want {
			t.Errorf("%#x in [%#x,+5) = %v, want %v", p, start, !want, want)
		}
	}
	if start.Prev().InWindow(start, 5) {
		t.Error("PSN before start is in window")
	}
	if PSN(123).InWindow(start, 0) {
		t.Error("empty window holds a PSN")
	}
	if !PSN(0x123456).InWindow(7, 1<<24) {
		t.Error("full window misses a PSN")
	}
}

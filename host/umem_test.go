package host

import "testing"

// TestUMEMGeometry: 2 KiB frames when an MTU-sized frame fits them, the
// UMEM's size kept, frame counts a power of two; explicit sizes win.
func TestUMEMGeometry(t *testing.T) {
	for _, c := range []struct {
		fs      int
		size    int64
		mtu     int
		wantFS  uint32
		wantNum uint32
	}{
		{0, 0, 1500, 2048, 8192},
		{0, 0, 1774, 2048, 8192},
		{0, 0, 1775, 4096, 4096},
		{0, 0, 4200, 4096, 4096},
		{0, 32 << 20, 1500, 2048, 16384},
		{4096, 0, 1500, 4096, 4096},
		{2048, 24 << 20, 1500, 2048, 8192},
	} {
		fs, n := umemGeometry(c.fs, c.size, c.mtu)
		if fs != c.wantFS || n != c.wantNum {
			t.Errorf("%+v: %d frames of %d, want %d of %d", c, n, fs, c.wantNum, c.wantFS)
		}
	}
}

// TestRxBuffers: RxBuffersPerQP frames for each QP, a buffer per segment
// of a frame, a power of two; nothing beyond the socket's default when
// the UMEM holds them already; bounded by xsk's maximum.
func TestRxBuffers(t *testing.T) {
	for _, c := range []struct {
		qps   int
		fs, n uint32
		mtu   int
		want  uint32
	}{
		{0, 2048, 8192, 1500, 0},      // 64 × 32 = 2048 of the default 4096
		{128, 2048, 8192, 1500, 0},    // 4096: just what the default holds
		{129, 2048, 8192, 1500, 8192}, // one more: the next power of two
		{0, 4096, 4096, 4200, 4096},   // 64 × 32 × 2 segments
		{128, 4096, 4096, 4200, 8192},
		{1 << 20, 4096, 4096, 4200, 1 << 16}, // MaxRxQPs, then xsk's bound
		{32, 4096, 4096, 9000, 4096},         // 3 segments: 3072
	} {
		if got := rxBuffers(c.qps, c.fs, c.n, c.mtu); got != c.want {
			t.Errorf("%+v: %d receive buffers, want %d", c, got, c.want)
		}
	}
}

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

package engine

import (
	"testing"

	"github.com/softrnic/softrnic/internal/netnstest"
)

// TestLookupInterface reads a veth end made in a test namespace: its
// addresses must become the GID table in rxe's order, and an AF_XDP port
// must open on it.
func TestLookupInterface(t *testing.T) {
	p := netnstest.NewTestPair(t, netnstest.PairOptions{MTU: 4200})
	var in Interface
	err := p.A.NS.Do(func() (err error) {
		in, err = LookupInterface(p.A.Name)
		if err != nil {
			return err
		}
		pt, err := OpenPort(in, AFXDP)
		if err != nil {
			return err
		}
		return pt.Close()
	})
	if err != nil {
		t.Fatal(err)
	}
	if in.MTU != 4200 || in.ActiveMTU() != 4096 || in.MAC != [6]byte(p.A.MAC) {
		t.Errorf("interface %+v", in)
	}
	if len(in.GIDs) < 3 || !in.GIDs[0].IsLinkLocalUnicast() || in.GIDs[1] != p.A.Addr {
		t.Fatalf("GIDs %v, want link-local, %v, ...", in.GIDs, p.A.Addr)
	}
	found6 := false
	for _, g := range in.GIDs[2:] {
		found6 = found6 || g == p.A.Addr6
	}
	if !found6 {
		t.Errorf("GIDs %v lack %v", in.GIDs, p.A.Addr6)
	}
	if g, _ := in.GID(-1); g != p.A.Addr {
		t.Errorf("default GID %v", g)
	}
	if _, err := in.GID(len(in.GIDs)); err == nil {
		t.Error("GID index past the table accepted")
	}
	if (Interface{MTU: 1500}).ActiveMTU() != 1024 || (Interface{MTU: 300}).ActiveMTU() != 0 {
		t.Error("ActiveMTU")
	}
}

package host

import (
	"testing"

	"github.com/softrnic/softrnic/internal/netnstest"
)

// TestLookupInterface reads a veth end made in a test namespace: its
// addresses must become the GID table (IPv4, IPv6, link-local), and an
// AF_XDP port must open on it.
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
	// The kernel adds the link-local address asynchronously after link up:
	// it may not be there yet, but when it is, it comes last.
	if len(in.GIDs) < 2 || len(in.GIDs) > 3 || in.GIDs[0] != p.A.Addr || in.GIDs[1] != p.A.Addr6 ||
		(len(in.GIDs) == 3 && !in.GIDs[2].IsLinkLocalUnicast()) {
		t.Fatalf("GIDs %v, want %v, %v, [link-local]", in.GIDs, p.A.Addr, p.A.Addr6)
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

// TestOpenPortErrorIsNil: a port that fails to open comes back as a nil
// interface, not as an interface holding a nil pointer, which a caller's
// "if p != nil { p.Close() }" would call into.
func TestOpenPortErrorIsNil(t *testing.T) {
	for _, kind := range []PortKind{AFXDP, AFPacket, Auto, "bogus"} {
		p, err := OpenPort(Interface{Name: "none", Index: 1 << 30}, kind)
		if err == nil || p != nil {
			t.Errorf("%s: port %#v, error %v; want a nil port and an error", kind, p, err)
		}
	}
}

// An interface that does not exist is named as the user typed it, by
// LookupInterface and by Open.
func TestInterfaceNotFound(t *testing.T) {
	if _, err := LookupInterface("eth9nope"); err == nil || err.Error() != "interface eth9nope not found" {
		t.Errorf("LookupInterface: %v", err)
	}
	if _, err := Open(Config{Interface: "eth9nope"}); err == nil || err.Error() != "interface eth9nope not found" {
		t.Errorf("Open: %v", err)
	}
}

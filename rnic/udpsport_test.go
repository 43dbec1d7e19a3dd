package rnic

import (
	"net/netip"
	"testing"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/frame"
	"github.com/softrnic/softrnic/frame/frametest"
)

// TestUDPSourcePortMatchesRxe checks the UDP source port of connected QPs
// (udpSport with no flow label, as rdma_get_udp_sport) against every RC
// frame of the reference rxe captures whose QP pair is unambiguous, and
// UDSourcePort against every UD frame not from QP1. It
// moved here from the engine, which no longer builds frames.
func TestUDPSourcePortMatchesRxe(t *testing.T) {
	checked, checkedUD := 0, 0
	for _, c := range frametest.Captures(t) {
		// The QPNs each address is sent to, to know both ends of an RC pair.
		dests := map[netip.Addr]map[uint32]bool{}
		var f frame.Frame
		for _, b := range c.Frames {
			if frame.Parse(b, &f) != nil {
				continue
			}
			if dests[f.Src()] == nil {
				dests[f.Src()] = map[uint32]bool{}
			}
			dests[f.Src()][f.BTH().DestQP()] = true
		}
		for _, b := range c.Frames {
			if frame.Parse(b, &f) != nil || f.Opcode() == bth.CNP {
				continue
			}
			if d := f.DETH(); d != nil {
				if f.BTH().DestQP() == 1 { // CM MADs from QP1 use a port of their own
					continue
				}
				if got, want := f.UDP().SrcPort(), UDSourcePort(d.SrcQP()); got != want {
					t.Fatalf("%s: UD QP %#x: capture's source port %d, ours %d", c.Name, d.SrcQP(), got, want)
				}
				checkedUD++
				continue
			}
			back := dests[f.Dst()]
			if len(back) != 1 {
				continue // several QPs between the hosts: pairing is ambiguous
			}
			var local uint32
			for q := range back {
				local = q
			}
			want := udpSport(0, local, f.BTH().DestQP())
			if got := f.UDP().SrcPort(); got != want {
				t.Fatalf("%s: QP %#x: capture's source port %d, ours %d", c.Name, f.BTH().DestQP(), got, want)
			}
			checked++
		}
	}
	if checked < 1000 {
		t.Fatalf("only %d frames checked", checked)
	}
	t.Logf("%d RC and %d UD frames checked", checked, checkedUD)
	if udpSport(0, 0x11, 0x11) != 49441 || UDSourcePort(0x14) != 59626 {
		t.Error("known value")
	}
}

package rnic

import (
	"net/netip"
	"testing"
)

// TestPeerSlotSpread: peers' addresses spread over the heard slots.
func TestPeerSlotSpread(t *testing.T) {
	used := map[int]bool{}
	for i := 1; i <= 32; i++ {
		used[peerSlot(netip.AddrFrom4([4]byte{10, 0, 0, byte(i)}))] = true
	}
	if len(used) < 16 {
		t.Fatalf("32 peers in %d slots", len(used))
	}
}

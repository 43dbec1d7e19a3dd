package rc

import "testing"

// owedAck: the last positive ACK queued before the first reply carrying
// data; NAKs and cancelled replays are passed over, a READ response or an
// atomic acknowledgement ends the search (an ACK after it would
// acknowledge the READ without its data).
func TestOwedAck(t *testing.T) {
	var c Counters
	for _, tc := range []struct {
		name  string
		items []respItem
		psn   uint32
		found bool
	}{
		{"empty", nil, 0, false},
		{"one ACK", []respItem{{kind: itemAck, syn: SynACK, psn: 5}}, 5, true},
		{"ACK, RNR NAK", []respItem{{kind: itemAck, syn: SynACK, psn: 5}, {kind: itemAck, syn: SynRNRNAK, psn: 6}}, 5, true},
		{"cancelled, ACK", []respItem{{kind: itemCancelled}, {kind: itemAck, syn: SynACK, psn: 7}}, 7, true},
		{"ACK, READ, ACK", []respItem{{kind: itemAck, syn: SynACK, psn: 5}, {kind: itemRead, psn: 6}, {kind: itemAck, syn: SynACK, psn: 9}}, 5, true},
		{"atomic, ACK", []respItem{{kind: itemAtomic, psn: 3}, {kind: itemAck, syn: SynACK, psn: 4}}, 0, false},
		{"sequence NAK", []respItem{{kind: itemAck, syn: SynNAKPSNSeq, psn: 2}}, 0, false},
	} {
		s := responder{q: make([]respItem, 8), qhead: 6, ctr: &c} // wraps around the ring
		for _, it := range tc.items {
			s.push(it)
		}
		it, ok := s.owedAck()
		if ok != tc.found || ok && uint32(it.psn) != tc.psn {
			t.Errorf("%s: owedAck = PSN %d, %v; want %d, %v", tc.name, it.psn, ok, tc.psn, tc.found)
		}
	}
}

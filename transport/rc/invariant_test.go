package rc

import "testing"

// checkInv asserts the requester's invariants: nothing it sends next is
// before the oldest unacknowledged PSN, which lies in the head WQE, WQEs on
// the wire have contiguous PSN ranges, and an idle requester has
// acknowledged everything it sent.
func checkInv(t *testing.T, q *QP, what string) {
	r := &q.req
	if q.failed {
		t.Fatalf("%s: QP failed with %v after %d timeouts", what, q.errSt, q.Timeouts)
	}
	if r.psn.Less(r.compPSN) {
		t.Fatalf("%s: next PSN %d before the oldest unacknowledged %d", what, r.psn, r.compPSN)
	}
	if r.head == r.end() {
		if r.compPSN != r.psn {
			t.Fatalf("%s: idle but compPSN %d psn %d", what, r.compPSN, r.psn)
		}
		return
	}
	e := r.entry(r.head)
	if r.compPSN.Less(e.firstPSN) || e.lastPSN.Less(r.compPSN) {
		t.Fatalf("%s: compPSN %d outside head [%d,%d] op %v state %d; next %d head %d psn %d", what, r.compPSN, e.firstPSN, e.lastPSN, e.Opcode, e.state, r.next, r.head, r.psn)
	}
	prev := e.lastPSN
	for i := r.head + 1; i != r.end(); i++ {
		f := r.entry(i)
		if f.firstPSN != prev.Next() && f.state != wqePosted {
			t.Fatalf("%s: gap at %d: prev last %d first %d", what, i, prev, f.firstPSN)
		}
		prev = f.lastPSN
	}
}

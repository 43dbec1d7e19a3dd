package ibtest

import "github.com/softrnic/softrnic/ib"

// QP is what Modify needs of a queue pair.
type QP interface {
	Type() ib.QPType
	State() ib.QPState
	Modify(attr *ib.QPAttr, mask ib.QPAttrMask) error
}

// Modify moves q to state to with the attributes of a (nil: none) that IBA
// requires for the transition from q's current state, and port 1: the
// plain way up through INIT, RTR and RTS, and down to ERR or RESET. A
// transition IBA does not allow is left for q to refuse.
func Modify(q QP, to ib.QPState, a *ib.QPAttr) error {
	var at ib.QPAttr
	if a != nil {
		at = *a
	}
	at.State = to
	if at.Port == 0 {
		at.Port = 1
	}
	req, _, _ := ib.Transition(q.Type(), q.State(), to)
	return q.Modify(&at, ib.AttrState|req)
}

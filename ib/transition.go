package ib

// transition is one edge of the QP state machine (IBA 10.3.1, Figure 130):
// whether it exists, and the attributes a modify along it must and may
// set, per QP type (indexed by QPType).
type transition struct {
	valid    bool
	req, opt [UD + 1]QPAttrMask
}

// perType spells a mask per QP type.
func perType(gsi, rc, uc, ud QPAttrMask) [UD + 1]QPAttrMask {
	var m [UD + 1]QPAttrMask
	m[GSI], m[RC], m[UC], m[UD] = gsi, rc, uc, ud
	return m
}

// transitions is IBA's table of required and optional attributes per
// transition and QP type, the same the kernel checks in
// ib_modify_qp_is_ok, so that a modify rdma-core accepts is accepted here
// and one it refuses is refused.
var transitions = func() (t [Err + 1][Err + 1]transition) {
	const (
		cur     = AttrCurState
		access  = AttrAccessFlags
		pkey    = AttrPKeyIndex
		port    = AttrPort
		qkey    = AttrQKey
		av      = AttrAV
		mtu     = AttrPathMTU
		timeout = AttrTimeout
		retry   = AttrRetryCnt
		rnr     = AttrRNRRetry
		rqpsn   = AttrRQPSN
		rdAtom  = AttrMaxQPRdAtomic
		alt     = AttrAltPath
		minRNR  = AttrMinRNRTimer
		sqpsn   = AttrSQPSN
		destRd  = AttrMaxDestRdAtomic
		mig     = AttrPathMigState
		destQPN = AttrDestQPN
		notify  = AttrEnSQDAsyncNotify
	)
	for from := Reset; from <= Err; from++ {
		t[from][Reset].valid = true
		t[from][Err].valid = true
	}
	t[Reset][Init] = transition{valid: true,
		req: perType(pkey|qkey, pkey|port|access, pkey|port|access, pkey|port|qkey)}
	t[Init][Init] = transition{valid: true,
		opt: perType(pkey|qkey, pkey|port|access, pkey|port|access, pkey|port|qkey)}
	t[Init][RTR] = transition{valid: true,
		req: perType(0, av|mtu|destQPN|rqpsn|destRd|minRNR, av|mtu|destQPN|rqpsn, 0),
		opt: perType(pkey|qkey, alt|access|pkey, alt|access|pkey, pkey|qkey)}
	t[RTR][RTS] = transition{valid: true,
		req: perType(sqpsn, timeout|retry|rnr|sqpsn|rdAtom, sqpsn, sqpsn),
		opt: perType(cur|qkey, cur|alt|access|minRNR|mig, cur|alt|access|mig, cur|qkey)}
	t[RTS][RTS] = transition{valid: true,
		opt: perType(cur|qkey, cur|access|alt|mig|minRNR, cur|access|alt|mig, cur|qkey)}
	t[RTS][SQD] = transition{valid: true, opt: perType(notify, notify, notify, notify)}
	t[SQD][RTS] = transition{valid: true,
		opt: perType(cur|qkey, cur|alt|access|minRNR|mig, cur|alt|access|mig, cur|qkey)}
	t[SQD][SQD] = transition{valid: true,
		opt: perType(pkey|qkey, port|av|timeout|retry|rnr|rdAtom|destRd|alt|access|pkey|minRNR|mig,
			av|alt|access|pkey|mig, pkey|qkey)}
	t[SQE][RTS] = transition{valid: true, opt: perType(cur|qkey, 0, cur|access, cur|qkey)}
	return t
}()

// Transition returns the attributes a modify of a QP of type t from state
// from to state to must set (req) and may set (opt), besides AttrState,
// and whether IBA allows the transition at all (IBA 10.3.1, Figure 130):
// the table the kernel checks in ib_modify_qp_is_ok. A move to RESET or
// ERR is allowed from every state and takes no attribute.
func Transition(t QPType, from, to QPState) (req, opt QPAttrMask, ok bool) {
	if t < GSI || t > UD || from > Err || to > Err {
		return 0, 0, false
	}
	tr := &transitions[from][to]
	return tr.req[t], tr.opt[t], tr.valid
}

package rnic

import (
	"fmt"

	"github.com/softrnic/softrnic/bth"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/transport/rc"
	"github.com/softrnic/softrnic/verbs"
)

// Attribute limits of the device, as ibv_query_device reports them.
const (
	maxTimeout  = 31
	maxRetry    = 7
	maxRNRTimer = 31
)

// Modify changes the QP's attributes and state as ibv_modify_qp does: mask
// says which fields of attr apply (IBV_QP_* bits); with ib.AttrState the
// QP moves to attr.State, without it it stays where it is. Every
// transition takes exactly IBA's required attributes and any of its
// optional ones, each within its range; anything else is
// refused and the QP is left as it was. ib.Transition is IBA's table. A move to RESET or ERR from any
// state takes no other attribute.
func (q *QP) Modify(attr *ib.QPAttr, mask ib.QPAttrMask) error {
	if attr == nil {
		attr = &ib.QPAttr{}
	}
	// A connected QP's peer is resolved before the lock is taken: ARP may
	// take a while, and the engine must not wait for it.
	var mac [6]byte
	if mask&ib.AttrAV != 0 && q.init.Type.Connected() {
		var err error
		if mac, err = q.dev.destMAC(&attr.AV); err != nil {
			return &verbs.ModifyError{QPN: q.qpn, Type: q.init.Type, From: q.State(), To: attr.State, Attr: ib.AttrAV,
				Detail: err.Error(), Err: verbs.ErrInvalid}
		}
	}
	q.mu.Lock()
	defer q.release()
	if q.destroyed.Load() {
		return verbs.ErrDestroyed
	}
	from, to := q.state, q.state
	if mask&ib.AttrState != 0 {
		to = attr.State
	}
	fail := func(bit ib.QPAttrMask, reason error, format string, args ...any) error {
		return &verbs.ModifyError{QPN: q.qpn, Type: q.init.Type, From: from, To: to, Attr: bit,
			Detail: fmt.Sprintf(format, args...), Err: reason}
	}
	if to > ib.Err {
		return fail(ib.AttrState, verbs.ErrInvalid, "no QP state %d", to)
	}
	if mask&ib.AttrCurState != 0 && attr.CurState != from {
		return fail(ib.AttrCurState, verbs.ErrInvalid, "the QP is in %v, not %v", from, attr.CurState)
	}
	t := q.init.Type
	req, opt, ok := ib.Transition(t, from, to)
	if !ok {
		return fail(0, verbs.ErrState, "IBA allows no such transition")
	}
	if missing := req &^ mask; missing != 0 {
		return fail(missing, verbs.ErrInvalid, "required by the transition, missing from the mask")
	}
	if extra := mask &^ (req | opt | ib.AttrState); extra != 0 {
		return fail(extra, verbs.ErrInvalid, "not an attribute of this transition for a %v QP", t)
	}
	if err := q.checkAttr(attr, mask, fail); err != nil {
		return err
	}
	switch to {
	case ib.Reset:
		q.resetLocked()
		return nil
	case ib.Err:
		q.toErrLocked()
		return nil
	default:
		// Checked: apply, below. Nothing there fails.
	}
	q.setAttr(attr, mask)
	if mask&ib.AttrAV != 0 && t.Connected() {
		q.hdr = q.dev.makeHdr(&q.attr.AV, mac, q.qpn, q.attr.DestQPN)
		q.peer = q.attr.AV.DGID.Addr()
		q.slot = peerSlot(q.peer)
		if t, ok := q.tr.(*rc.QP); ok {
			t.HeardFrom(&q.dev.heard[q.slot])
		}
		if q.dev.cc != nil {
			q.ccHeaders()
		}
	}
	q.tr.Modify(from, to, &q.attr)
	q.sqdNotify = to == ib.SQD && mask&ib.AttrEnSQDAsyncNotify != 0 && attr.SQDrainNotify
	q.state = to
	q.txPending.Store(true)
	return nil
}

// checkAttr checks the range of every attribute mask names (q.mu held).
func (q *QP) checkAttr(a *ib.QPAttr, mask ib.QPAttrMask, fail func(ib.QPAttrMask, error, string, ...any) error) error {
	t := q.init.Type
	if mask&ib.AttrAltPath != 0 {
		return fail(ib.AttrAltPath, verbs.ErrNotSupported, "alternate paths (automatic path migration) are not supported")
	}
	if mask&ib.AttrPathMigState != 0 && a.PathMigState != 0 {
		return fail(ib.AttrPathMigState, verbs.ErrInvalid, "path migration state %d: only MIGRATED (0) without alternate paths", a.PathMigState)
	}
	if mask&ib.AttrPort != 0 && a.Port != 1 {
		return fail(ib.AttrPort, verbs.ErrInvalid, "port %d: the device has port 1", a.Port)
	}
	if mask&ib.AttrPKeyIndex != 0 && a.PKeyIndex != 0 {
		return fail(ib.AttrPKeyIndex, verbs.ErrInvalid, "P_Key index %d: the P_Key table has one entry (0xFFFF)", a.PKeyIndex)
	}
	if mask&ib.AttrAccessFlags != 0 {
		if !a.Access.Valid() {
			return fail(ib.AttrAccessFlags, verbs.ErrInvalid, "unknown access flags %#x", uint32(a.Access&^ib.KnownAccess))
		}
		if t == ib.UC && a.Access&(ib.RemoteRead|ib.RemoteAtomic) != 0 {
			return fail(ib.AttrAccessFlags, verbs.ErrAccess, "a UC QP serves no remote READ or atomic")
		}
	}
	if mask&ib.AttrPathMTU != 0 && (!validMTU(int(a.PathMTU)) || int(a.PathMTU) > q.dev.cfg.PortMTU) {
		return fail(ib.AttrPathMTU, verbs.ErrInvalid, "path MTU %d: 256, 512, 1024, 2048 or 4096, at most the port's %d", a.PathMTU, q.dev.cfg.PortMTU)
	}
	if mask&ib.AttrMaxDestRdAtomic != 0 {
		if a.MaxDestRdAtomic > MaxRdAtomic {
			return fail(ib.AttrMaxDestRdAtomic, verbs.ErrInvalid, "%d responder resources, the device has %d", a.MaxDestRdAtomic, MaxRdAtomic)
		}
		if q.state != ib.Init {
			// The responder's resource table is sized at RTR; resizing it
			// under a live connection would drop the READs it remembers.
			return fail(ib.AttrMaxDestRdAtomic, verbs.ErrNotSupported, "responder resources are fixed once the QP is in RTR")
		}
	}
	if mask&ib.AttrMaxQPRdAtomic != 0 && a.MaxRdAtomic > MaxRdAtomic {
		return fail(ib.AttrMaxQPRdAtomic, verbs.ErrInvalid, "%d READ/atomics in flight, the device allows %d", a.MaxRdAtomic, MaxRdAtomic)
	}
	if mask&ib.AttrMinRNRTimer != 0 && a.MinRNRTimer > maxRNRTimer {
		return fail(ib.AttrMinRNRTimer, verbs.ErrInvalid, "RNR timer code %d, at most %d", a.MinRNRTimer, maxRNRTimer)
	}
	if mask&ib.AttrTimeout != 0 && a.Timeout > maxTimeout {
		return fail(ib.AttrTimeout, verbs.ErrInvalid, "timeout %d, at most %d", a.Timeout, maxTimeout)
	}
	if mask&ib.AttrRetryCnt != 0 && a.RetryCnt > maxRetry {
		return fail(ib.AttrRetryCnt, verbs.ErrInvalid, "retry count %d, at most %d", a.RetryCnt, maxRetry)
	}
	if mask&ib.AttrRNRRetry != 0 && a.RNRRetry > maxRetry {
		return fail(ib.AttrRNRRetry, verbs.ErrInvalid, "RNR retry %d, at most %d (infinite)", a.RNRRetry, maxRetry)
	}
	if mask&ib.AttrAV != 0 {
		if err := q.dev.checkAV(&a.AV); err != nil {
			return fail(ib.AttrAV, verbs.ErrInvalid, "%v", err)
		}
	}
	return nil
}

// setAttr records the attributes mask names (q.mu held; checked).
func (q *QP) setAttr(a *ib.QPAttr, mask ib.QPAttrMask) {
	at := &q.attr
	if mask&ib.AttrAccessFlags != 0 {
		at.Access = a.Access
	}
	if mask&ib.AttrPKeyIndex != 0 {
		at.PKeyIndex = a.PKeyIndex
	}
	if mask&ib.AttrPort != 0 {
		at.Port = a.Port
	}
	if mask&ib.AttrQKey != 0 {
		at.QKey = a.QKey
	}
	if q.init.Type == ib.GSI {
		at.QKey = bth.GSIQKey // fixed by IBA for QP1
	}
	if mask&ib.AttrAV != 0 {
		at.AV = a.AV
	}
	if mask&ib.AttrPathMTU != 0 {
		at.PathMTU = a.PathMTU
	}
	if mask&ib.AttrTimeout != 0 {
		at.Timeout = a.Timeout
	}
	if mask&ib.AttrRetryCnt != 0 {
		at.RetryCnt = a.RetryCnt
	}
	if mask&ib.AttrRNRRetry != 0 {
		at.RNRRetry = a.RNRRetry
	}
	if mask&ib.AttrRQPSN != 0 {
		at.RQPSN = a.RQPSN & bth.PSNMask
	}
	if mask&ib.AttrMaxQPRdAtomic != 0 {
		at.MaxRdAtomic = a.MaxRdAtomic
	}
	if mask&ib.AttrMinRNRTimer != 0 {
		at.MinRNRTimer = a.MinRNRTimer
	}
	if mask&ib.AttrSQPSN != 0 {
		at.SQPSN = a.SQPSN & bth.PSNMask
	}
	if mask&ib.AttrMaxDestRdAtomic != 0 {
		at.MaxDestRdAtomic = a.MaxDestRdAtomic
	}
	if mask&ib.AttrDestQPN != 0 {
		at.DestQPN = a.DestQPN & bth.QPNMask
	}
	if q.init.Type.Datagram() {
		at.PathMTU = uint32(q.dev.cfg.PortMTU) // a UD QP's datagrams are at most the port's MTU
	}
}

// Query returns the QP's attributes as last set, with its current state
// (ibv_query_qp): a QP may have moved to SQE or ERR by itself.
func (q *QP) Query() (ib.QPAttr, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	a := q.attr
	a.State = q.state
	a.CurState = q.state
	a.SQDrainNotify = q.sqdNotify
	return a, nil
}

func validMTU(m int) bool {
	return m == 256 || m == 512 || m == 1024 || m == 2048 || m == 4096
}

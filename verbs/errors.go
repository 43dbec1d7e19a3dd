package verbs

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/softrnic/softrnic/ib"
)

// Error is one kind of verbs failure, with the errno rdma-core's
// libibverbs returns for it: the daemon and the C library answer a
// failure with Errno, in one place. Failures with context (which QP, which
// attribute) wrap one of these, so errors.Is finds the kind, and
// errors.Is(err, syscall.EINVAL) the errno. Through a softrnic daemon a
// control failure arrives as the daemon's errno and message: the errno
// checks work there, and the kinds a client detects itself on its data
// path (ErrQueueFull, ErrQPState, ErrTooManySGE) are these.
type Error struct {
	errno syscall.Errno
	msg   string
}

func (e *Error) Error() string { return "verbs: " + e.msg }

// Errno is the errno a verbs call fails with for e.
func (e *Error) Errno() syscall.Errno { return e.errno }

// Is makes errors.Is(err, syscall.EINVAL) true for an error of kind
// EINVAL.
func (e *Error) Is(target error) bool {
	n, ok := target.(syscall.Errno)
	return ok && n == e.errno
}

// ModifyError is a Modify that was refused: which QP, which transition and
// which attribute (the mask bit, 0 when the transition or the mask as a
// whole is wrong). It wraps the kind (ErrState, ErrInvalid, ErrAccess,
// ErrNotSupported, …), which errors.Is finds.
type ModifyError struct {
	QPN      uint32
	Type     ib.QPType
	From, To ib.QPState
	Attr     ib.QPAttrMask
	Detail   string
	Err      error
}

func (e *ModifyError) Error() string {
	s := fmt.Sprintf("verbs: modify %v QP %#x %v→%v", e.Type, e.QPN, e.From, e.To)
	if e.Attr != 0 {
		s += " attribute " + e.Attr.String()
	}
	return s + ": " + e.Detail
}

func (e *ModifyError) Unwrap() error { return e.Err }

// Queue names a work queue.
type Queue uint8

// The work queues a post goes to.
const (
	QueueSQ  Queue = iota // a QP's send queue
	QueueRQ               // a QP's receive queue
	QueueSRQ              // a shared receive queue
)

var queueNames = [...]string{QueueSQ: "SQ", QueueRQ: "RQ", QueueSRQ: "SRQ"}

func (q Queue) String() string {
	if int(q) < len(queueNames) {
		return queueNames[q]
	}
	return fmt.Sprintf("Queue(%d)", uint8(q))
}

// WRError is a work request a post refused: the QP and queue, the WR's
// index in the posted slice and its wr_id, and what was wrong with it,
// naming the limit it exceeded (max_send_sge, max_inline_data, ...) when
// it exceeded one. It wraps the kind (ErrTooManySGE, ErrInlineSize,
// ErrBadOpcode, ErrQPState, ErrInvalid, ErrDestroyed), which errors.Is
// finds, and with it the errno. The post returns Index too, as the count
// of the WRs it took.
//
// A full queue is not a WRError: the bare ErrQueueFull is the data path's
// back-pressure, which a post loop meets often and which allocates
// nothing.
type WRError struct {
	QPN    uint32 // the QP's number; 0 for an SRQ
	Queue  Queue
	Index  int    // in the posted slice
	ID     uint64 // the WR's wr_id
	Detail string // what was wrong, with the limit exceeded
	Err    error  // the kind
}

func (e *WRError) Error() string {
	at := fmt.Sprintf("%v of QP %#x", e.Queue, e.QPN)
	if e.Queue == QueueSRQ {
		at = "SRQ"
	}
	kind := e.Err.Error()
	var k *Error
	if errors.As(e.Err, &k) {
		kind = k.msg
	}
	return fmt.Sprintf("verbs: post to the %s: WR %d (wr_id %#x): %s: %s", at, e.Index, e.ID, e.Detail, kind)
}

func (e *WRError) Unwrap() error { return e.Err }

// The kinds of failure.
var (
	ErrInvalid      = &Error{syscall.EINVAL, "invalid argument"}
	ErrState        = &Error{syscall.EINVAL, "illegal QP state transition"}
	ErrQPState      = &Error{syscall.EINVAL, "QP state does not allow this"}
	ErrQueueFull    = &Error{syscall.ENOMEM, "work queue full"}
	ErrTooManySGE   = &Error{syscall.EINVAL, "too many scatter/gather entries"}
	ErrInlineSize   = &Error{syscall.EINVAL, "inline data larger than max_inline_data"}
	ErrBadOpcode    = &Error{syscall.EINVAL, "opcode not supported by this QP type"}
	ErrAccess       = &Error{syscall.EINVAL, "invalid access flags"}
	ErrDestroyed    = &Error{syscall.EINVAL, "object destroyed"}
	ErrNoRecvQueue  = &Error{syscall.EINVAL, "QP uses an SRQ; post receives there"}
	ErrKeySpace     = &Error{syscall.ENOMEM, "could not draw a fresh key"}
	ErrNotSupported = &Error{syscall.EOPNOTSUPP, "not supported"}
	ErrBusy         = &Error{syscall.EBUSY, "object still in use"}
	ErrCQOverrun    = &Error{syscall.EIO, "CQ overrun: completions were lost; the CQ and its QPs are in error"}
	ErrOtherDevice  = &Error{syscall.EINVAL, "object of another device"}
)

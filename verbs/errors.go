package verbs

import (
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

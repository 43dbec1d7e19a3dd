package daemon

import (
	"errors"

	"github.com/softrnic/softrnic/daemon/proto"
	"github.com/softrnic/softrnic/ib"
)

// Device is the RNIC the daemon serves to its clients: what the control
// server needs from the verbs device model. It is deliberately the verbs
// object model (PD, MR, CQ, QP) with client-supplied work requests, so that
// the verbs device satisfies it through a thin adapter, and a test device
// (package daemon/loopdev) can stand in for it.
//
// The server calls control methods (AllocPD, RegMR, Create*, Modify,
// Destroy*) from client connection goroutines, and data methods (PostSend,
// PostRecv, Poll) from its ring pump, one goroutine; implementations make
// the two safe together.
type Device interface {
	Info() proto.DeviceInfo
	AllocPD() (PD, error)
	// CreateCQ makes a CQ of at least depth entries. The device calls
	// notify (cheap, non-blocking, any goroutine) after adding completions,
	// so that a sleeping pump wakes and moves them to the client's ring;
	// never after the CQ's Destroy has returned.
	CreateCQ(depth int, notify func()) (CQ, error)
}

// PD is a protection domain.
type PD interface {
	// RegMR registers mem (the daemon's mapping of client memory) at
	// virtual address iova. Remote READ/WRITE with the rkey land in mem,
	// which is the client's own buffer.
	RegMR(mem []byte, iova uint64, access ib.Access) (MR, error)
	CreateQP(typ proto.QPType, caps proto.QPCaps, sendCQ, recvCQ CQ, sigAll bool) (QP, error)
	Dealloc() error
}

// MR is a registered memory region.
type MR interface {
	LKey() uint32
	RKey() uint32
	// Deregister invalidates the MR: once it returns, no local or remote
	// access reaches the memory, so the daemon may unmap it.
	Deregister() error
}

// CQ is a completion queue.
type CQ interface {
	// Poll moves up to len(wcs) completions into wcs, oldest first.
	Poll(wcs []ib.WC) int
	Destroy() error
}

// QP is a queue pair.
type QP interface {
	QPN() uint32
	Modify(attr *proto.QPAttr, mask proto.QPAttrMask) error
	Query() (proto.QPAttr, error)
	// PostSend posts one WR decoded from the client's SQ ring; w and its
	// slices are valid only during the call (inline data must be copied).
	// Local errors of the WR (bad lkey, bounds) are reported as error
	// completions, as hardware does. ErrQueueFull means "not now": the WR
	// stays in the client's ring and is offered again on a later pass. Any
	// other error means the WR was refused (QP state); the daemon completes
	// it in error.
	PostSend(w *proto.SendWR) error
	PostRecv(w *proto.RecvWR) error
	// Destroy releases the QP; its outstanding WRs are flushed first.
	Destroy() error
}

// ErrQueueFull is returned by QP.PostSend and PostRecv when the device's
// own queue is full. The client's ring then holds the WR until the device
// has room: back-pressure, not an error completion.
var ErrQueueFull = errors.New("daemon: device work queue full")

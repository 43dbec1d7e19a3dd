// Package rnic is the handful of verbs the built-in tools (softrnic perf,
// softrnic rping) use, as one interface that two RNICs satisfy: a
// rnic.Device in the tool's own process (Local), driven by an engine
// goroutine on the tool's own port, and the device of a running softrnic
// daemon reached through package client (Daemon), whose QPs live in the
// daemon and whose rings and memory are shared with the tool.
//
// It lives in a package of its own, not inside perftest/runner, because
// both tools (and their tests and benchmarks) need it and neither owns the
// other. It is deliberately not a second device model: the vocabulary is
// verbs' own (SGE, RecvWR, WC, Attr, AddressVector, QP states and types);
// only SendWR differs, in that a UD destination is an AH of this package,
// which either RNIC can make. Both adapters are thin: the per-message path
// (PostSend, PostRecv, Poll) converts a work request or completion in
// preallocated per-QP scratch and allocates nothing.
package verbsapi

import (
	"context"
	"errors"
	"net/netip"
	"time"

	"github.com/softrnic/softrnic/congestion/dcqcn"
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/rnic"
)

// RecvWR is a receive work request (ibv_recv_wr).
type RecvWR struct {
	ID uint64
	SG []ib.SGE
}

// ErrQueueFull is PostSend's and PostRecv's "the work queue is full, poll
// and try again", from either RNIC (it is rnic.ErrQueueFull).
var ErrQueueFull = rnic.ErrQueueFull

// ErrNotSupported is returned for what one of the RNICs cannot do.
var ErrNotSupported = errors.New("rnic: not supported by this RNIC")

// Device is an RNIC the tools can use.
type Device interface {
	// Name is the network interface the RNIC runs on.
	Name() string
	// GIDs is the GID table, as addresses (perftest's -x indexes it).
	GIDs() []netip.Addr
	// PortMTU is the active MTU in bytes (256…4096).
	PortMTU() int
	// AllocMem allocates n bytes of memory the RNIC can register: the
	// tool's own heap in process, a memfd the daemon maps through it.
	AllocMem(n int) (Mem, error)
	AllocPD() (PD, error)
	CreateCQ(depth int) (CQ, error)
}

// Mem is memory from Device.AllocMem.
type Mem interface {
	Bytes() []byte
	Free() error
}

// PD is a protection domain.
type PD interface {
	// RegMR registers bytes [off, off+n) of m at virtual address iova (0:
	// the memory's own address), with the given access.
	RegMR(m Mem, off, n int, iova uint64, access ib.Access) (MR, error)
	CreateQP(a QPInitAttr) (QP, error)
	// CreateAH makes a UD destination. DestMAC need not be set: the RNIC
	// resolves DestIP itself.
	CreateAH(av ib.AddressVector) (AH, error)
	Dealloc() error
}

// MR is a registered memory region.
type MR interface {
	LKey() uint32
	RKey() uint32
	IOVA() uint64
	Dereg() error
}

// CQ is a completion queue.
type CQ interface {
	// Poll moves up to len(wcs) completions into wcs, oldest first.
	Poll(wcs []ib.WC) int
	// Wait sleeps until the CQ may hold a new completion or timeout
	// passes: for a tool with nothing to do until the peer answers.
	Wait(timeout time.Duration)
	Destroy() error
}

// AH is an address handle: where a UD send goes.
type AH interface {
	// Dest is the destination address.
	Dest() netip.Addr
}

// QPInitAttr describes a QP at creation (ibv_qp_init_attr).
type QPInitAttr struct {
	Type                 ib.QPType // rnic.RC, UC or UD
	SendCQ, RecvCQ       CQ
	MaxSendWR, MaxRecvWR int
	MaxSGE               int // per WR, send and receive
	MaxInline            int
	SigAll               bool
}

// QP is a queue pair.
type QP interface {
	QPN() uint32
	// Modify changes the QP's attributes and state as ibv_modify_qp
	// (rnic.QP.Modify's rules). attr.AV.DMAC need not be set: the RNIC
	// resolves attr.AV.DGID.
	Modify(attr *ib.QPAttr, mask ib.QPAttrMask) error
	// PostSend posts one send WR; ErrQueueFull when the send queue is full.
	PostSend(w *SendWR) error
	// PostRecv posts one receive WR; ErrQueueFull when the queue is full.
	PostRecv(w *RecvWR) error
	// WithLock runs fn where the RNIC's writes into the QP's memory are
	// whole (rnic.QP.WithLock); through the daemon, where the writer is
	// another process, it just runs fn.
	WithLock(fn func())
	Destroy() error
}

// SendWR is a send work request (ibv_send_wr), as rnic.SendWR but with a
// UD destination that either RNIC can make (PD.CreateAH).
type SendWR struct {
	ID         uint64
	Opcode     ib.WROpcode
	Flags      ib.SendFlags
	SG         []ib.SGE
	InlineData []byte // with ib.Inline: copied at post time instead of SG
	Imm        uint32
	RemoteAddr uint64 // RDMA and atomics
	RKey       uint32
	CompareAdd uint64 // CMP_AND_SWP compare value, FETCH_AND_ADD addend
	Swap       uint64 // CMP_AND_SWP swap value
	// UD
	AH         AH
	RemoteQPN  uint32
	RemoteQKey uint32
}

// Optional abilities: what only one of the RNICs has, found with a type
// assertion.

// Congested is a Device that runs DCQCN (the in-process one, with --dcqcn).
type Congested interface {
	Congestion() rnic.Congestion
}

// CCQP is a QP whose DCQCN state can be read.
type CCQP interface {
	CongestionState() (dcqcn.State, bool)
}

// Notifier is a CQ that can signal new completions on a channel.
type Notifier interface {
	Notify() <-chan struct{}
}

// ProgressCounter is a Device that can report a QP's transport progress
// (rc.Counters.Progress): acknowledged or answered packets, which move
// even when a CQ-moderated run has no completion for a long time.
type ProgressCounter interface {
	// TransportProgress sums the progress of the QPs numbered in qpns.
	TransportProgress(qpns []uint32) uint64
}

// RecvSyncer is a QP whose posted receives reach the device
// asynchronously (through the daemon's rings). SyncRecv returns once every
// receive posted so far is in the device's RQ: a tool about to tell its
// peer "send now" calls it first, since a UC or UD SEND that finds no
// receive is dropped. (A SEND this QP posts itself after a receive is
// always behind it: the daemon hands receives over first.)
type RecvSyncer interface {
	SyncRecv(ctx context.Context) error
}

// Stater is a Device that can snapshot its device counters (rnic.Stats).
type Stater interface {
	Stats() rnic.Stats
}

package verbs

import (
	"net/netip"
	"time"

	"github.com/softrnic/softrnic/ib"
)

// Device is an RNIC port (ibv_context with its one port).
type Device interface {
	// Name is the network interface the RNIC runs on.
	Name() string
	// Query returns the device's and port's attributes
	// (ibv_query_device, ibv_query_port).
	Query() ib.DeviceAttr
	// GIDs is the GID table, as addresses (perftest's -x indexes it).
	GIDs() []netip.Addr
	// AllocMem allocates n bytes of memory the RNIC can register: the
	// application's own heap in process, a sealed memfd that the daemon
	// maps too.
	AllocMem(n int) (Mem, error)
	AllocPD() (PD, error)
	// CreateCQ makes a CQ holding at least depth completions.
	CreateCQ(depth int) (CQ, error)
}

// Mem is memory from Device.AllocMem.
type Mem interface {
	Bytes() []byte
	Free() error
}

// PD is a protection domain: MRs, QPs, SRQs and AHs of different PDs
// cannot reach each other.
type PD interface {
	// RegMR registers bytes [off, off+n) of m at virtual address iova (0:
	// the memory's own address in this process) with the given access.
	RegMR(m Mem, off, n int, iova uint64, access ib.Access) (MR, error)
	CreateQP(a *QPInitAttr) (QP, error)
	// CreateSRQ makes a shared receive queue of maxWR receives of at most
	// maxSGE entries each.
	CreateSRQ(maxWR, maxSGE int) (SRQ, error)
	// CreateAH makes an address handle for UD sends. av.DMAC need not be
	// set: the RNIC resolves av.DGID, as the kernel does for RoCE.
	CreateAH(av *ib.AddressVector) (AH, error)
	Dealloc() error
}

// MR is a registered memory region.
type MR interface {
	LKey() uint32
	RKey() uint32
	IOVA() uint64
	Len() int
	// Dereg deregisters the MR: once it returns, no access reaches the
	// memory.
	Dereg() error
}

// CQ is a completion queue.
type CQ interface {
	// Poll moves up to len(wcs) completions into wcs, oldest first, and
	// returns how many (ibv_poll_cq).
	Poll(wcs []ib.WC) int
	// Wait sleeps until the CQ may hold a completion or timeout passes
	// (negative: no limit): for an application with nothing to do until
	// the peer answers. It returns an error for a CQ in error.
	Wait(timeout time.Duration) error
	Destroy() error
}

// SRQ is a shared receive queue.
type SRQ interface {
	// PostRecv posts receive WRs and returns how many it took.
	PostRecv(wrs []RecvWR) (int, error)
	// Modify arms the SRQ's limit (ib.SRQLimit: attr.Limit, at most
	// MaxWR; 0 disarms), ibv_modify_srq: once fewer receives than the
	// limit remain, the device reports EventSRQLimitReached and disarms
	// it. Resizing (ib.SRQMaxWR) is refused with ErrInvalid, as on
	// devices without IBV_DEVICE_SRQ_RESIZE.
	Modify(attr *ib.SRQAttr, mask ib.SRQAttrMask) error
	// Query returns the SRQ's size and armed limit (ibv_query_srq).
	Query() (ib.SRQAttr, error)
	// Destroy destroys the SRQ; QPs using it must be destroyed first
	// (ErrBusy).
	Destroy() error
}

// AH is an address handle: where a UD send goes.
type AH interface {
	// AV is the address vector the handle was made from (DMAC resolved).
	AV() ib.AddressVector
	Destroy() error
}

// QPInitAttr describes a QP at creation (ibv_qp_init_attr).
type QPInitAttr struct {
	Type           ib.QPType
	SendCQ, RecvCQ CQ
	SRQ            SRQ // receives come from here instead of the QP's RQ
	Cap            ib.QPCaps
	SigAll         bool // every send WR is signaled
	// Recovery is an RC QP's loss recovery (adaptive retransmission,
	// selective repeat); RecoveryDefault takes the device's.
	Recovery ib.Recovery
}

// QP is a queue pair.
type QP interface {
	QPN() uint32
	Type() ib.QPType
	// State is the QP's state as the application last saw it move or
	// queried it.
	State() ib.QPState
	// Modify changes the QP's attributes and state as ibv_modify_qp:
	// mask (IBV_QP_* bits) says which fields of attr apply, IBA's rules
	// say which a transition requires and allows.
	Modify(attr *ib.QPAttr, mask ib.QPAttrMask) error
	// Query returns the QP's attributes (ibv_query_qp).
	Query() (ib.QPAttr, error)
	// PostSend posts send WRs and returns how many it took; on error the
	// rest were not posted (ibv_post_send's bad_wr). ErrQueueFull: the
	// send queue is full, poll and try again.
	PostSend(wrs []SendWR) (int, error)
	// PostRecv posts receive WRs as PostSend does.
	PostRecv(wrs []RecvWR) (int, error)
	Destroy() error
}

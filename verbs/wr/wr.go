// Package wr holds the vocabulary shared by the verbs device and the
// transports it drives: work request and work completion opcodes, completion
// status codes, access flags, the work queue entries the transports consume
// and the memory interfaces through which they reach registered memory.
//
// It sits below both verbs (the device model applications use) and
// transport/rc, transport/ud (the pure state machines), so that neither has
// to import the other. Package verbs re-exports these names as aliases.
package wr

import (
	"encoding/binary"
	"net/netip"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Opcode is a send work request opcode (ibv_wr_opcode).
type Opcode uint8

// Send work request opcodes.
const (
	Send Opcode = iota
	SendWithImm
	SendWithInv
	RDMAWrite
	RDMAWriteWithImm
	RDMARead
	AtomicCmpAndSwp
	AtomicFetchAndAdd
)

var opNames = [...]string{"SEND", "SEND_WITH_IMM", "SEND_WITH_INV", "RDMA_WRITE", "RDMA_WRITE_WITH_IMM", "RDMA_READ", "ATOMIC_CMP_AND_SWP", "ATOMIC_FETCH_AND_ADD"}

func (o Opcode) String() string {
	if int(o) < len(opNames) {
		return opNames[o]
	}
	return "WR_OPCODE_?"
}

// IsReadOrAtomic reports whether the request needs a responder resource and
// is completed only by its response (not by a coalesced ACK).
func (o Opcode) IsReadOrAtomic() bool {
	return o == RDMARead || o == AtomicCmpAndSwp || o == AtomicFetchAndAdd
}

// IsAtomic reports whether o is one of the two 8-byte atomics.
func (o Opcode) IsAtomic() bool { return o == AtomicCmpAndSwp || o == AtomicFetchAndAdd }

// IsSend reports whether o is a SEND variant (consumes a receive WQE).
func (o Opcode) IsSend() bool { return o == Send || o == SendWithImm || o == SendWithInv }

// IsWrite reports whether o is an RDMA WRITE variant.
func (o Opcode) IsWrite() bool { return o == RDMAWrite || o == RDMAWriteWithImm }

// HasImm reports whether o carries immediate data.
func (o Opcode) HasImm() bool { return o == SendWithImm || o == RDMAWriteWithImm }

// Flags are send work request flags (ibv_send_flags).
type Flags uint8

// Send flags.
const (
	Signaled  Flags = 1 << iota // generate a completion even on success
	Fence                       // wait for earlier READ/ATOMICs to complete first
	Solicited                   // set SE on the last packet
	Inline                      // the data was copied at post time
)

// Status is a work completion status (ibv_wc_status); values follow the
// IBA/ibverbs numbering so that they print and compare as users expect.
type Status uint8

// Work completion status codes.
const (
	Success        Status = 0
	LocLenErr      Status = 1
	LocQPOpErr     Status = 2
	LocProtErr     Status = 4
	WRFlushErr     Status = 5
	BadRespErr     Status = 7
	LocAccessErr   Status = 8
	RemInvReqErr   Status = 9
	RemAccessErr   Status = 10
	RemOpErr       Status = 11
	RetryExcErr    Status = 12
	RNRRetryExcErr Status = 13
	GeneralErr     Status = 21
)

func (s Status) String() string {
	switch s {
	case Success:
		return "SUCCESS"
	case LocLenErr:
		return "LOC_LEN_ERR"
	case LocQPOpErr:
		return "LOC_QP_OP_ERR"
	case LocProtErr:
		return "LOC_PROT_ERR"
	case WRFlushErr:
		return "WR_FLUSH_ERR"
	case BadRespErr:
		return "BAD_RESP_ERR"
	case LocAccessErr:
		return "LOC_ACCESS_ERR"
	case RemInvReqErr:
		return "REM_INV_REQ_ERR"
	case RemAccessErr:
		return "REM_ACCESS_ERR"
	case RemOpErr:
		return "REM_OP_ERR"
	case RetryExcErr:
		return "RETRY_EXC_ERR"
	case RNRRetryExcErr:
		return "RNR_RETRY_EXC_ERR"
	case GeneralErr:
		return "GENERAL_ERR"
	}
	return "WC_STATUS_?"
}

// WCOpcode is the opcode reported in a completion (ibv_wc_opcode).
type WCOpcode uint8

// Completion opcodes.
const (
	WCSend WCOpcode = iota
	WCRDMAWrite
	WCRDMARead
	WCCompSwap
	WCFetchAdd
	WCRecv
	WCRecvRDMAWithImm
)

// WCFlags qualify a completion (ibv_wc_flags).
type WCFlags uint8

// Completion flags.
const (
	WCWithImm WCFlags = 1 << iota // Imm is valid
	WCWithInv                     // InvRKey was invalidated
	WCGRH                         // the first 40 bytes of the buffer hold a GRH slot (UD)
)

// Access are memory region and QP access flags (ibv_access_flags).
type Access uint32

// Access flags.
const (
	LocalWrite   Access = 1 << iota
	RemoteWrite         // RDMA WRITE into the MR / accepted by the QP
	RemoteRead          // RDMA READ from the MR / served by the QP
	RemoteAtomic        // atomics on the MR / served by the QP
)

// WC is a work completion.
type WC struct {
	ID      uint64
	Status  Status
	Opcode  WCOpcode
	Flags   WCFlags
	ByteLen uint32
	Imm     uint32 // immediate data as the sender put it on the wire (big-endian value)
	InvRKey uint32 // rkey invalidated by a SEND_WITH_INV
	QPN     uint32 // the local QP
	SrcQP   uint32 // UD: the sender's QPN
	IsRecv  bool   // receive-queue completion (goes to the recv CQ)
	// SrcIP is the sender's address (UD receives), the GID a verbs user
	// would find in the GRH.
	SrcIP netip.Addr
}

// SendWQE is a send work request after the device has resolved its local
// scatter/gather list to bytes (checking lkeys, PD and bounds at post time).
// The transports never see lkeys, only memory they are allowed to touch.
type SendWQE struct {
	ID         uint64
	Opcode     Opcode
	Flags      Flags
	SG         [][]byte // local memory, in order; for READ/atomics the destination
	Length     uint32   // total bytes of SG (atomics: 8)
	Imm        uint32
	InvRKey    uint32
	RemoteAddr uint64
	RKey       uint32
	Compare    uint64 // CMP_AND_SWP compare value
	SwapAdd    uint64 // CMP_AND_SWP swap value / FETCH_AND_ADD addend
	// Err, when not Success, is a local error found at post time (bad lkey,
	// length); the requester completes the WQE with it in order and the QP
	// goes to ERR, as hardware does.
	Err Status

	// UD only: destination.
	RemoteQPN  uint32
	RemoteQKey uint32
	AH         any // device-specific address handle, carried through to framing
}

// RecvWQE is a receive work request with its scatter list resolved.
type RecvWQE struct {
	ID     uint64
	SG     [][]byte
	Length uint32
	Err    Status
}

// Memory resolves the remote accesses of a responder. One Memory is bound
// to one QP, and so to its PD: an rkey of another PD is not found.
type Memory interface {
	// Resolve returns the n bytes at virtual address va of the MR named by
	// rkey, if that MR is in the QP's PD, is valid, grants access and
	// covers [va, va+n). The slice is exactly n bytes long.
	Resolve(rkey uint32, va uint64, n uint64, access Access) ([]byte, bool)
	// Invalidate invalidates the MR named by rkey (SEND_WITH_INV); false if
	// there is no such MR in the QP's PD.
	Invalidate(rkey uint32) bool
}

// RecvQueue is where a responder takes receive WQEs: a QP's RQ or an SRQ.
// Take returns the oldest posted WQE, copied into *dst (dst's SG backing
// array is reused), and removes it; false when none is posted.
type RecvQueue interface {
	Take(dst *RecvWQE) bool
}

// CopyIn gathers bytes from sg starting at byte offset off into dst and
// returns how many were copied (less than len(dst) only if sg ends).
func CopyIn(dst []byte, sg [][]byte, off uint32) int {
	n := 0
	o := int(off)
	for _, s := range sg {
		if o >= len(s) {
			o -= len(s)
			continue
		}
		c := copy(dst[n:], s[o:])
		n += c
		o = 0
		if n == len(dst) {
			break
		}
	}
	return n
}

// CopyOut scatters src into sg starting at byte offset off and returns how
// many bytes were stored (less than len(src) only if sg ends).
func CopyOut(sg [][]byte, off uint32, src []byte) int {
	n := 0
	o := int(off)
	for _, s := range sg {
		if o >= len(s) {
			o -= len(s)
			continue
		}
		c := copy(s[o:], src[n:])
		n += c
		o = 0
		if n == len(src) {
			break
		}
	}
	return n
}

// atomicMu serialises atomics on operands that are not 8-byte aligned in Go
// memory (an MR whose iova and buffer address differ modulo 8); aligned
// operands use the CPU's atomic instructions and take no lock.
var atomicMu sync.Mutex

// AtomicCmpSwap compares the 8 bytes of b (host byte order, as an RNIC's
// atomic operand is) with cmp and stores swap if equal, returning the
// original value. b must be 8 bytes long.
func AtomicCmpSwap(b []byte, cmp, swap uint64) uint64 {
	if uintptr(unsafe.Pointer(&b[0]))%8 == 0 {
		p := (*uint64)(unsafe.Pointer(&b[0]))
		for {
			old := atomic.LoadUint64(p)
			if old != cmp {
				return old
			}
			if atomic.CompareAndSwapUint64(p, old, swap) {
				return old
			}
		}
	}
	atomicMu.Lock()
	old := binary.NativeEndian.Uint64(b)
	if old == cmp {
		binary.NativeEndian.PutUint64(b, swap)
	}
	atomicMu.Unlock()
	return old
}

// AtomicFetchAdd adds add to the 8 bytes of b (host byte order) and returns
// the original value.
func AtomicFetchAdd(b []byte, add uint64) uint64 {
	if uintptr(unsafe.Pointer(&b[0]))%8 == 0 {
		return atomic.AddUint64((*uint64)(unsafe.Pointer(&b[0])), add) - add
	}
	atomicMu.Lock()
	old := binary.NativeEndian.Uint64(b)
	binary.NativeEndian.PutUint64(b, old+add)
	atomicMu.Unlock()
	return old
}

package ib

// WROpcode is a send work request opcode (ibv_wr_opcode).
type WROpcode uint8

// Send work request opcodes, numbered as IBV_WR_*.
const (
	RDMAWrite         WROpcode = 0
	RDMAWriteWithImm  WROpcode = 1
	Send              WROpcode = 2
	SendWithImm       WROpcode = 3
	RDMARead          WROpcode = 4
	AtomicCmpAndSwp   WROpcode = 5
	AtomicFetchAndAdd WROpcode = 6
	SendWithInv       WROpcode = 9
)

func (o WROpcode) String() string {
	switch o {
	case RDMAWrite:
		return "RDMA_WRITE"
	case RDMAWriteWithImm:
		return "RDMA_WRITE_WITH_IMM"
	case Send:
		return "SEND"
	case SendWithImm:
		return "SEND_WITH_IMM"
	case RDMARead:
		return "RDMA_READ"
	case AtomicCmpAndSwp:
		return "ATOMIC_CMP_AND_SWP"
	case AtomicFetchAndAdd:
		return "ATOMIC_FETCH_AND_ADD"
	case SendWithInv:
		return "SEND_WITH_INV"
	}
	return "WR_OPCODE_?"
}

// Valid reports whether o is an opcode softrnic executes.
func (o WROpcode) Valid() bool { return o <= AtomicFetchAndAdd || o == SendWithInv }

// IsReadOrAtomic reports whether the request needs a responder resource and
// is completed only by its response (not by a coalesced ACK).
func (o WROpcode) IsReadOrAtomic() bool {
	return o == RDMARead || o == AtomicCmpAndSwp || o == AtomicFetchAndAdd
}

// IsAtomic reports whether o is one of the two 8-byte atomics.
func (o WROpcode) IsAtomic() bool { return o == AtomicCmpAndSwp || o == AtomicFetchAndAdd }

// IsSend reports whether o is a SEND variant (consumes a receive WQE).
func (o WROpcode) IsSend() bool { return o == Send || o == SendWithImm || o == SendWithInv }

// IsWrite reports whether o is an RDMA WRITE variant.
func (o WROpcode) IsWrite() bool { return o == RDMAWrite || o == RDMAWriteWithImm }

// HasImm reports whether o carries immediate data.
func (o WROpcode) HasImm() bool { return o == SendWithImm || o == RDMAWriteWithImm }

// WCOpcode is the completion opcode of a send work request of opcode o.
func (o WROpcode) WCOpcode() WCOpcode {
	switch o {
	case RDMAWrite, RDMAWriteWithImm:
		return WCRDMAWrite
	case RDMARead:
		return WCRDMARead
	case AtomicCmpAndSwp:
		return WCCompSwap
	case AtomicFetchAndAdd:
		return WCFetchAdd
	default:
		return WCSend
	}
}

// SendFlags are send work request flags (ibv_send_flags).
type SendFlags uint8

// Send flags, valued as IBV_SEND_*.
const (
	Fence     SendFlags = 1 << 0 // wait for earlier READ/ATOMICs to complete first
	Signaled  SendFlags = 1 << 1 // generate a completion even on success
	Solicited SendFlags = 1 << 2 // set SE on the last packet
	Inline    SendFlags = 1 << 3 // the data was copied at post time

	// KnownSendFlags are the flags softrnic understands; a WR with others
	// is refused.
	KnownSendFlags = Fence | Signaled | Solicited | Inline
)

// SGE is a scatter/gather entry (ibv_sge): Length bytes at virtual address
// Addr of the MR whose lkey is LKey.
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   uint32
}

// SendWQE is a send work request as a transport consumes it: the device
// has resolved its scatter/gather list to memory (checking lkeys, PD and
// bounds at post time), so a transport never sees an lkey, only memory it
// may touch.
type SendWQE struct {
	ID         uint64
	Opcode     WROpcode
	Flags      SendFlags
	SG         []Seg  // local memory, in order; for READ/atomics the destination
	Length     uint32 // total bytes of SG (atomics: 8)
	Imm        uint32
	InvRKey    uint32
	RemoteAddr uint64
	RKey       uint32
	Compare    uint64 // CMP_AND_SWP compare value
	SwapAdd    uint64 // CMP_AND_SWP swap value / FETCH_AND_ADD addend
	// Err, when not Success, is a local error found at post time (bad lkey,
	// length); the transport completes the WQE with it in order and the QP
	// goes to ERR, as hardware does.
	Err WCStatus

	// UD only: the destination.
	RemoteQPN  uint32
	RemoteQKey uint32
	AH         *AH
}

// RecvWQE is a receive work request with its scatter list resolved.
type RecvWQE struct {
	ID     uint64
	SG     []Seg
	Length uint32
	Err    WCStatus
}

// RecvQueue is where a responder takes receive WQEs: a QP's RQ or an SRQ.
// Take returns the oldest posted WQE, copied into *dst (dst's SG backing
// array is reused), and removes it; false when none is posted.
type RecvQueue interface {
	Take(dst *RecvWQE) bool
}

package ib

import "net/netip"

// WCStatus is a work completion status (ibv_wc_status), numbered as
// IBV_WC_*.
type WCStatus uint8

// Work completion status codes.
const (
	Success        WCStatus = 0
	LocLenErr      WCStatus = 1
	LocQPOpErr     WCStatus = 2
	LocProtErr     WCStatus = 4
	WRFlushErr     WCStatus = 5
	BadRespErr     WCStatus = 7
	LocAccessErr   WCStatus = 8
	RemInvReqErr   WCStatus = 9
	RemAccessErr   WCStatus = 10
	RemOpErr       WCStatus = 11
	RetryExcErr    WCStatus = 12
	RNRRetryExcErr WCStatus = 13
	GeneralErr     WCStatus = 21
)

func (s WCStatus) String() string {
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

// WCOpcode is the opcode reported in a completion (ibv_wc_opcode),
// numbered as IBV_WC_*: receive completions have the 0x80 bit.
type WCOpcode uint8

// Completion opcodes.
const (
	WCSend            WCOpcode = 0
	WCRDMAWrite       WCOpcode = 1
	WCRDMARead        WCOpcode = 2
	WCCompSwap        WCOpcode = 3
	WCFetchAdd        WCOpcode = 4
	WCRecv            WCOpcode = 128
	WCRecvRDMAWithImm WCOpcode = 129
)

func (o WCOpcode) String() string {
	switch o {
	case WCSend:
		return "SEND"
	case WCRDMAWrite:
		return "RDMA_WRITE"
	case WCRDMARead:
		return "RDMA_READ"
	case WCCompSwap:
		return "COMP_SWAP"
	case WCFetchAdd:
		return "FETCH_ADD"
	case WCRecv:
		return "RECV"
	case WCRecvRDMAWithImm:
		return "RECV_RDMA_WITH_IMM"
	}
	return "WC_OPCODE_?"
}

// WCFlags qualify a completion (ibv_wc_flags), valued as IBV_WC_*.
type WCFlags uint8

// Completion flags.
const (
	WCGRH     WCFlags = 1 << 0 // the first 40 bytes of the buffer hold a GRH slot (UD)
	WCWithImm WCFlags = 1 << 1 // Imm is valid
	WCWithInv WCFlags = 1 << 3 // InvRKey was invalidated
	// WCSolicited marks a receive whose message asked for a solicited
	// event (SE): what a CQ armed for solicited completions only wakes
	// for, with completions in error. ibv_wc has no such bit (1 << 7 is
	// none of IBV_WC_*).
	WCSolicited WCFlags = 1 << 7
)

// WC is a work completion (ibv_wc).
type WC struct {
	ID      uint64
	Status  WCStatus
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

package proto

// The ring slot layouts as declarations, for readers in other languages
// (the C library's header is generated from them). PutSendWR, GetSendWR,
// PutRecvWR, GetRecvWR, PutWC and GetWC are the Go codec of the same bytes;
// slots_test.go keeps the two in agreement.

// SendSlot is the 64-byte header of an SQ slot of an RC or UC QP; SGEs
// (NumSGE of them) or InlineLen bytes of inline data follow it.
type SendSlot struct {
	ID         uint64
	Opcode     uint8 // ib.WROpcode
	Flags      uint8 // ib.SendFlags
	NumSGE     uint8
	_          uint8
	Imm        uint32 // immediate data, or the rkey to invalidate (SEND_WITH_INV)
	RemoteAddr uint64
	RKey       uint32
	InlineLen  uint32 // with ib.Inline in Flags
	CompareAdd uint64 // ATOMIC_CMP_AND_SWP compare value, ATOMIC_FETCH_AND_ADD addend
	Swap       uint64 // ATOMIC_CMP_AND_SWP swap value
	_          [16]byte
}

// SendSlotUD is the header of an SQ slot of a UD QP: SendSlot with the
// destination in place of the atomic operands.
type SendSlotUD struct {
	ID         uint64
	Opcode     uint8
	Flags      uint8
	NumSGE     uint8
	_          uint8
	Imm        uint32
	RemoteAddr uint64
	RKey       uint32
	InlineLen  uint32
	RemoteQPN  uint32
	QKey       uint32 // high bit set: the QP's own Q_Key
	AH         uint32 // the client's handle of the address handle (CREATE_AH)
	_          [20]byte
}

// RecvSlot is the 16-byte header of an RQ slot; NumSGE SGEs follow it.
type RecvSlot struct {
	ID     uint64
	NumSGE uint8
	_      [7]byte
}

// CQE is a completion slot (CQESize bytes).
type CQE struct {
	ID      uint64
	Status  uint8 // ib.WCStatus
	Opcode  uint8 // ib.WCOpcode
	Flags   uint8 // ib.WCFlags
	IsRecv  uint8 // 1: a receive-queue completion
	ByteLen uint32
	Imm     uint32
	InvRKey uint32
	QPN     uint32
	SrcQP   uint32
	SrcIP   [16]byte // UD receives: the sender (IPv4-mapped for IPv4); zero: none
}

// Slot geometry: the sizes SendSlotSize and RecvSlotSize build on.
const (
	SendSlotHeader = sendHeader
	RecvSlotHeader = recvHeader
	SGESize        = sgeSize
)

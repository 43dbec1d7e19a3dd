package verbs

import "github.com/softrnic/softrnic/ib"

// SendWR is a send work request (ibv_send_wr), as an application posts it.
type SendWR struct {
	ID     uint64
	Opcode ib.WROpcode
	Flags  ib.SendFlags
	SG     []ib.SGE
	// InlineData, with ib.Inline, is copied at post time instead of SG (up
	// to the QP's MaxInline bytes); the buffer may be reused at once.
	InlineData []byte
	Imm        uint32 // immediate data (the value the receiver sees)
	InvRKey    uint32 // SEND_WITH_INV
	RemoteAddr uint64 // RDMA and atomics
	RKey       uint32
	CompareAdd uint64 // CMP_AND_SWP compare value, FETCH_AND_ADD addend
	Swap       uint64 // CMP_AND_SWP swap value
	// UD: the destination, a handle of the QP's own RNIC.
	AH         AH
	RemoteQPN  uint32
	RemoteQKey uint32 // high bit set: use the QP's Q_Key
}

// RecvWR is a receive work request (ibv_recv_wr).
type RecvWR struct {
	ID uint64
	SG []ib.SGE
}

package proto

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/softrnic/softrnic/ib"
)

// DefaultControl is the daemon's control socket unless configured otherwise
// (daemon "control" key; --control in every client command).
const DefaultControl = "/run/softrnic/softrnic.sock"

// Version is the protocol version; the daemon refuses an Open of another.
const Version = 3

// MaxMessage is the largest control message, header included.
const MaxMessage = 4096

// MaxFDs is the most file descriptors one message may carry.
const MaxFDs = 4

// Op is a control operation.
type Op uint16

// Operations. Replies carry the request's Op and Seq.
const (
	OpOpen      Op = iota + 1 // first message: version check, device attributes; reply fd: the daemon's doorbell
	OpAllocPD                 // → PD handle
	OpDeallocPD               // PD handle
	OpRegMR                   // fd: memfd holding the memory → MR handle, lkey, rkey
	OpDeregMR                 // MR handle
	OpCreateCQ                // → CQ handle; reply fds: CQ ring memfd, the client's CQ doorbell
	OpDestroyCQ               // CQ handle
	OpCreateQP                // → QP handle, QPN; reply fds: SQ ring memfd, RQ ring memfd
	OpModifyQP                // QP handle, attribute mask, attributes
	OpQueryQP                 // QP handle → attributes
	OpDestroyQP               // QP handle
	OpCapture                 // fd: the file to write; reply when started, then again when the capture ends
	OpStatus                  // → StatusResp
	OpStats                   // StatsReq → StatsResp (stats.go)
	// 15 to 21 and 24 were rdma_cm operations that waited for the peer,
	// retired for the event-based ones (ucm.go): their numbers stay unused.
	_
	_
	_
	_
	_
	_
	_
	OpCreateAH  // CreateAHReq → HandleMsg (the AH UD send slots name)
	OpDestroyAH // HandleMsg (AH)
	_
	// Shared receive queues and asynchronous events (srq.go, async.go).
	OpCreateSRQ   // CreateSRQReq → CreateSRQResp; reply fd: the SRQ ring memfd
	OpModifySRQ   // ModifySRQReq
	OpQuerySRQ    // HandleMsg (SRQ) → ib.SRQAttr
	OpDestroySRQ  // HandleMsg (SRQ)
	OpAsyncEvents // → nothing; reply fd: the client's end of its event socket (once per connection)
	OpQueryDevice // → DeviceInfo as it is now (the port's state follows the link)
	OpAsyncEvent  // never a request: the header of each message on the event socket
	// Memory of the client's own address space (any mapping), which the
	// daemon copies through the client's /proc/self/mem rather than maps.
	OpAttachMem // fds: the client's /proc/self/mem (read-write) and /proc/self/maps → HandleMsg (the address space)
	OpRegMRAddr // RegMRAddrReq → RegMRResp
	opMax
)

var opNames = [...]string{"?", "OPEN", "ALLOC_PD", "DEALLOC_PD", "REG_MR", "DEREG_MR", "CREATE_CQ", "DESTROY_CQ", "CREATE_QP", "MODIFY_QP", "QUERY_QP", "DESTROY_QP", "CAPTURE", "STATUS", "STATS",
	"OP_15", "OP_16", "OP_17", "OP_18", "OP_19", "OP_20", "OP_21", "CREATE_AH", "DESTROY_AH", "OP_24",
	"CREATE_SRQ", "MODIFY_SRQ", "QUERY_SRQ", "DESTROY_SRQ", "ASYNC_EVENTS", "QUERY_DEVICE", "ASYNC_EVENT",
	"ATTACH_MEM", "REG_MR_ADDR"}

func (o Op) String() string {
	if int(o) < len(opNames) {
		return opNames[o]
	}
	return fmt.Sprintf("OP_%d", uint16(o))
}

// Header starts every message.
type Header struct {
	Op      Op
	Version uint16
	Seq     uint32 // chosen by the client, echoed in the reply
	Errno   uint32 // replies: 0 on success, else an errno; the body is then a message
	_       uint32
}

// HeaderSize is the encoded size of Header.
const HeaderSize = 16

// Handle names a PD, MR, CQ, QP, SRQ or AH within one client connection. Handles are
// per connection: the same number on another connection is another object
// (or none), so a client can never name another client's resources.
type Handle uint32

// DeviceInfo is the reply to Open.
type DeviceInfo struct {
	Name [16]byte // interface name, NUL padded
	ib.DeviceAttr
	NumGIDs uint32
	_       uint32
	GIDs    [8][16]byte // IPv4 as IPv4-mapped IPv6, as RoCEv2 GIDs are
}

// OpenReq is the body of OpOpen.
type OpenReq struct {
	Version uint32
	_       uint32
}

// HandleMsg is the body of every operation that names one object
// (DeallocPD, DeregMR, DestroyCQ, DestroyQP, QueryQP) and of AllocPD's reply.
type HandleMsg struct {
	Handle Handle
	_      uint32
}

// RegMRReq is the body of OpRegMR. The memory is [Offset, Offset+Length) of
// the memfd passed with the message, which the client has sealed against
// shrinking; IOVA is the address the client sees it at, used in SGEs and by
// remote peers with the rkey.
type RegMRReq struct {
	PD     Handle
	Access ib.Access
	Offset uint64
	Length uint64
	IOVA   uint64
}

// RegMRResp is the reply to OpRegMR.
type RegMRResp struct {
	MR   Handle
	LKey uint32
	RKey uint32
	_    uint32
}

// RegMRAddrReq is the body of OpRegMRAddr: Length bytes at Addr of the
// address space Space (from OpAttachMem), registered at IOVA. The daemon
// checks against the address space's mappings that the range is mapped
// and readable, and writable if Access writes (EFAULT otherwise, as
// pinning the pages would fail).
type RegMRAddrReq struct {
	PD     Handle
	Access ib.Access
	Space  Handle
	_      uint32
	Addr   uint64
	Length uint64
	IOVA   uint64
}

// CreateCQReq is the body of OpCreateCQ.
type CreateCQReq struct {
	Depth uint32 // completions the CQ must hold; the ring may be larger
	_     uint32
}

// CreateCQResp is the reply to OpCreateCQ; with it come the CQ ring's memfd
// (geometry Slots × CQESize) and the eventfd the daemon rings when the
// client sleeps on the CQ.
type CreateCQResp struct {
	CQ    Handle
	Slots uint32
}

// CreateQPReq is the body of OpCreateQP.
type CreateQPReq struct {
	PD       Handle
	SendCQ   Handle
	RecvCQ   Handle
	Type     ib.QPType
	SigAll   uint8       // every send WR generates a completion
	Recovery ib.Recovery // an RC QP's loss recovery; 0: the daemon's
	_        [1]byte
	Caps     ib.QPCaps
	// SRQ, if not 0, is the SRQ (of the same PD) the QP takes its
	// receives from: Caps' receive fields are then ignored, and the RQ
	// ring the reply brings has one slot, never read.
	SRQ Handle
	_   uint32
}

// CreateQPResp is the reply to OpCreateQP; with it come the SQ and RQ ring
// memfds, whose geometries follow from Caps (SendSlotSize, RecvSlotSize,
// and slot counts SQSlots, RQSlots).
type CreateQPResp struct {
	QP      Handle
	QPN     uint32
	SQSlots uint32
	RQSlots uint32
	Caps    ib.QPCaps // what was granted (at least what was asked)
}

// CreateAHReq is the body of OpCreateAH: an address handle in PD
// (ibv_create_ah). The daemon resolves the next hop's MAC itself, as the
// kernel does for a RoCE AH: DMAC is ignored.
type CreateAHReq struct {
	PD Handle
	_  uint32
	AV ib.AddressVector
}

// ModifyQPReq is the body of OpModifyQP: ibv_modify_qp's attributes and
// mask, as the device takes them.
type ModifyQPReq struct {
	QP   Handle
	Mask ib.QPAttrMask
	Attr ib.QPAttr
}

// CaptureReq is the body of OpCapture: capture the RoCE frames the daemon
// sends and receives into the file passed with the message (opened for
// writing by the client, with its own rights). Root only: a capture sees
// every client's traffic.
type CaptureReq struct {
	Count    uint32 // frames, then stop; 0 = until the connection closes
	QPN      uint32
	FilterQP uint8 // keep only QPN's frames
	PCAPNG   uint8 // pcapng with directions instead of classic pcap
	_        [6]byte
}

// CaptureResult is the body of the second OpCapture reply, sent when the
// capture has ended and the file is flushed.
type CaptureResult struct {
	Written uint64
	Dropped uint64
}

// rdma_cm port spaces (rdma_create_id's): UCMListenReq and UCMConnectReq
// name one.
const (
	PortSpaceTCP uint16 = 0 // RDMA_PS_TCP: RC connections, REQ, REP, RTU
	PortSpaceUDP uint16 = 1 // RDMA_PS_UDP: UD services, SIDR_REQ, SIDR_REP
)

// PortStatus is how the daemon moves frames (softrnic status).
type PortStatus struct {
	Kind     [16]byte // "afxdp" or "afpacket", NUL padded
	Attach   [16]byte // XDP attach mode: "driver" or "generic"; empty without XDP
	ZeroCopy uint8    // AF_XDP zero-copy (else copy mode)
	_        [3]byte
	Queues   uint32 // RX queues served
}

// ClientStatus is one connected client.
type ClientStatus struct {
	ID                 uint64
	PID                int32
	UID, GID           uint32
	QPs, CQs, MRs, PDs uint32
	_                  uint32
}

// MaxStatusClients is how many clients one StatusResp lists.
const MaxStatusClients = 64

// StatusResp is the reply to OpStatus. Root sees every client; others see
// only themselves (NumClients still counts all).
type StatusResp struct {
	Port       PortStatus
	NumClients uint32
	Listed     uint32
	Clients    [MaxStatusClients]ClientStatus
}

// Encode appends h and body (nil, a fixed-size struct, or raw bytes) to
// buf[:0] and returns the message.
func Encode(buf []byte, h Header, body any) ([]byte, error) {
	b := bytes.NewBuffer(buf[:0])
	if err := binary.Write(b, binary.LittleEndian, &h); err != nil {
		return nil, err
	}
	switch v := body.(type) {
	case nil:
	case []byte:
		b.Write(v)
	default:
		if err := binary.Write(b, binary.LittleEndian, v); err != nil {
			return nil, err
		}
	}
	if b.Len() > MaxMessage {
		return nil, fmt.Errorf("proto: %v message of %d bytes exceeds %d", h.Op, b.Len(), MaxMessage)
	}
	return b.Bytes(), nil
}

// ErrBadMessage is wrapped by every decoding error.
var ErrBadMessage = errors.New("proto: malformed message")

// DecodeHeader splits a message into its header and body.
func DecodeHeader(msg []byte) (Header, []byte, error) {
	var h Header
	if len(msg) < HeaderSize {
		return h, nil, fmt.Errorf("%w: %d bytes, shorter than a header", ErrBadMessage, len(msg))
	}
	h.Op = Op(binary.LittleEndian.Uint16(msg[0:]))
	h.Version = binary.LittleEndian.Uint16(msg[2:])
	h.Seq = binary.LittleEndian.Uint32(msg[4:])
	h.Errno = binary.LittleEndian.Uint32(msg[8:])
	return h, msg[HeaderSize:], nil
}

// DecodeBody fills v (a pointer to a fixed-size struct) from body, which
// must be exactly its size.
func DecodeBody(body []byte, v any) error {
	if n := binary.Size(v); n != len(body) {
		return fmt.Errorf("%w: body of %d bytes, want %d", ErrBadMessage, len(body), n)
	}
	return binary.Read(bytes.NewReader(body), binary.LittleEndian, v)
}

// Error is a failed operation as a client sees it: the daemon's errno and
// explanation.
type Error struct {
	Op    Op
	Errno unix.Errno
	Msg   string
}

func (e *Error) Error() string { return fmt.Sprintf("softrnic %v: %s (%v)", e.Op, e.Msg, e.Errno) }

// Unwrap lets errors.Is(err, unix.ENOENT) and friends work.
func (e *Error) Unwrap() error { return e.Errno }

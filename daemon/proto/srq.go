package proto

import "github.com/softrnic/softrnic/ib"

// Shared receive queues. An SRQ is a receive ring like a QP's RQ (the
// client produces RecvSlotSize slots of MaxSGE entries, the daemon's
// engine fetches them into its device's SRQ), made by OpCreateSRQ in a PD and
// named by the QPs that take their receives from it (CreateQPReq.SRQ).
// Its limit (ibv_modify_srq's srq_limit) is armed with OpModifySRQ; when a
// receive taken leaves fewer, the connection's event socket reports
// ib.EventSRQLimitReached with the SRQ's handle (async.go).

// CreateSRQReq is the body of OpCreateSRQ.
type CreateSRQReq struct {
	PD     Handle
	MaxWR  uint32 // receives it must hold (1 … the device's MaxSRQWR)
	MaxSGE uint32 // entries per receive (1 … the device's MaxSGE)
	_      uint32
}

// CreateSRQResp is the reply to OpCreateSRQ; with it comes the SRQ ring's
// memfd, of Slots slots of RecvSlotSize(QPCaps{MaxRecvSGE: MaxSGE}) bytes.
// MaxWR and MaxSGE are what was granted (at least what was asked).
type CreateSRQResp struct {
	SRQ    Handle
	Slots  uint32
	MaxWR  uint32
	MaxSGE uint32
}

// ModifySRQReq is the body of OpModifySRQ: ibv_modify_srq's attributes and
// mask (ib.SRQLimit arms the limit; ib.SRQMaxWR, a resize, is refused with
// EINVAL).
type ModifySRQReq struct {
	SRQ  Handle
	Mask ib.SRQAttrMask
	Attr ib.SRQAttr
	_    uint32
}

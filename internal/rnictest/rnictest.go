package rnictest

import (
	"github.com/softrnic/softrnic/ib"
	"github.com/softrnic/softrnic/rnic"
	"github.com/softrnic/softrnic/verbs"
)

// PD allocates a protection domain.
func PD(d *rnic.Device) *rnic.PD {
	pd, err := d.AllocPD()
	if err != nil {
		panic(err)
	}
	return pd.(*rnic.PD)
}

// CQ creates a completion queue of depth entries.
func CQ(d *rnic.Device, depth int) *rnic.CQ {
	cq, err := d.CreateCQ(depth)
	if err != nil {
		panic(err)
	}
	return cq.(*rnic.CQ)
}

// QPAttr describes a QP to create: verbs.QPInitAttr with the device's own
// objects and one SGE count for both queues.
type QPAttr struct {
	Type                 ib.QPType
	SendCQ, RecvCQ       *rnic.CQ
	SRQ                  *rnic.SRQ
	MaxSendWR, MaxRecvWR int
	MaxSGE, MaxInline    int
	SigAll               bool
}

// QP creates a queue pair in pd.
func QP(pd *rnic.PD, a QPAttr) (*rnic.QP, error) {
	attr := &verbs.QPInitAttr{Type: a.Type, SendCQ: a.SendCQ, RecvCQ: a.RecvCQ, SigAll: a.SigAll,
		Cap: ib.QPCaps{MaxSendWR: uint32(a.MaxSendWR), MaxRecvWR: uint32(a.MaxRecvWR), MaxSendSGE: uint32(a.MaxSGE),
			MaxRecvSGE: uint32(a.MaxSGE), MaxInline: uint32(a.MaxInline)}}
	if a.SRQ != nil {
		attr.SRQ = a.SRQ
	}
	q, err := pd.CreateQP(attr)
	if err != nil {
		return nil, err
	}
	return q.(*rnic.QP), nil
}

// AH creates an address handle in pd.
func AH(pd *rnic.PD, av ib.AddressVector) (*rnic.AH, error) {
	ah, err := pd.CreateAH(&av)
	if err != nil {
		return nil, err
	}
	return ah.(*rnic.AH), nil
}

package ib

// SRQAttr are a shared receive queue's attributes (ibv_srq_attr).
type SRQAttr struct {
	MaxWR  uint32 // receives it holds
	MaxSGE uint32 // scatter/gather entries per receive
	// Limit, when armed (not 0), is the low watermark: once fewer receives
	// than Limit remain, the device reports EventSRQLimitReached and
	// disarms it (Limit reads 0 again).
	Limit uint32
}

// SRQAttrMask says which SRQAttr fields a modify applies
// (ibv_srq_attr_mask), valued as IBV_SRQ_*.
type SRQAttrMask uint32

// SRQ attribute mask bits.
const (
	SRQMaxWR SRQAttrMask = 1 << 0 // resize the SRQ
	SRQLimit SRQAttrMask = 1 << 1 // arm the limit
)

package shmring

// Header is the layout of a ring's first HeaderSize bytes, as a declaration
// for readers in other languages (the C library's header is generated from
// it); the package itself uses the off* constants, and layout_test.go keeps
// the two in agreement. Prod, Cons and Wakeup are accessed atomically
// (sequentially consistent) by both sides.
type Header struct {
	Magic    uint64 // HeaderMagic
	Version  uint32 // HeaderVersion
	SlotSize uint32
	Slots    uint32
	_        [44]byte
	Prod     uint64 // producer index, written by the producer only
	_        [56]byte
	Cons     uint64 // consumer index, written by the consumer only
	_        [56]byte
	Wakeup   uint32 // set by a consumer about to sleep, swapped to 0 by the producer that rings it
	_        [60]byte
}

// The header's identification.
const (
	HeaderMagic   = magic
	HeaderVersion = version
)

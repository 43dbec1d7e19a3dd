// Package pb is a protocol fragment for cgen's tests.
package pb

import "github.com/softrnic/softrnic/internal/cgen/testdata/pa"

// Kind is a typed constant's type.
type Kind uint8

// K names its type in C.
const K Kind = 3

// Big needs a 64-bit C constant.
const Big = 1 << 40

// Outer embeds pa.Inner.
type Outer struct {
	X  uint16
	In pa.Inner
	Y  [2]uint64
	_  [1]byte
	OK bool
}

// Natural is laid out alike by C and encoding/binary.
type Natural struct {
	A uint32
	_ uint32
	B uint64
}

// Skip cannot be encoded by encoding/binary, and is left out.
type Skip struct{ S []byte }

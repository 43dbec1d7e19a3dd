// Command cgen writes the C declarations of Go packages that define a
// binary wire or shared-memory layout: every exported struct type whose
// encoding/binary form has a fixed size becomes a C struct with
// _Static_asserts on its size and the offset of every field, and every
// exported integer or string constant becomes a #define. The C library
// includes the output instead of restating the protocol, and a test fails
// when the checked-in header differs from what cgen makes of the Go
// declarations, so the two cannot drift.
//
// Usage (from go:generate in the protocol package):
//
//	cgen -o FILE PKG[=PREFIX]...
//
// PKG is a package pattern (a directory such as "." or "../../shmring");
// PREFIX is inserted into the C names of that package's declarations
// (shmring=RING: SOFTRNIC_RING_HEADER_MAGIC, struct softrnic_ring_header).
//
// Layouts are those of encoding/binary (little-endian, no implicit
// padding), which the protocol uses on the wire. A struct whose binary
// layout differs from C's natural one is emitted packed; one of fields
// encoding/binary cannot encode (slices, strings, int) is left out.
package main

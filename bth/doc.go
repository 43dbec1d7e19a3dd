// Package bth holds the RoCEv2 transport headers as zero-allocation views
// over []byte: the Base Transport Header (BTH), every extended transport
// header (RETH, AETH, DETH, ImmDt, IETH, AtomicETH, AtomicAckETH, FETH),
// softrnic's selective acknowledgement (SACKETH, sack.go), the opcode table
// that says which of them follow each opcode, and the 24-bit PSN arithmetic
// every transport uses.
//
// The style is that of gVisor's pkg/tcpip/header: a view is a named []byte,
// accessors are small inlinable big-endian loads and stores, and nothing
// allocates. A view does not check its own length: whoever makes one (the
// frame parser, or a builder that sized its buffer from Opcode.HeaderLen)
// has already done so, which keeps every accessor a single bounds-checked
// load. Multi-byte fields are big-endian as on the wire; bit 7 is a byte's
// most significant bit.
package bth

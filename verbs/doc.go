// Package verbs is the one interface through which applications use an
// RNIC, as libibverbs is for C programs: Device, PD, MR, CQ, SRQ, QP and AH,
// the application's form of a work request (SendWR, RecvWR) and the kinds
// of failure with the errno libibverbs gives them.
//
// Two RNICs implement it: the device in the application's own process
// (package rnic, whose types have exactly these methods) and the device of
// a running softrnic daemon (package client, which reaches it over the
// daemon's control socket and shared-memory rings). A tool written against
// this package runs on either. Vocabulary (opcodes, flags, states,
// attributes, completions) is package ib's.
//
// The data path allocates nothing: PostSend and PostRecv take a slice the
// caller owns and reuses (a variadic call through an interface would
// allocate its slice every time), Poll fills the caller's slice.
//
// Failures carry their context and wrap their kind: a refused work
// request is a WRError (QP, queue, the WR's index and wr_id, the limit it
// exceeded), a refused Modify a ModifyError (QP, transition, attribute);
// errors.Is finds the kind (ErrTooManySGE, ErrState, ...) and its errno
// (syscall.EINVAL, ...) through them. A full queue alone is the bare
// ErrQueueFull: it is the data path's back-pressure, and allocates nothing.
//
// What only one of the RNICs can do is a small optional interface, found
// with a type assertion (optional.go).
package verbs

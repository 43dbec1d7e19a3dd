// Package ib is the InfiniBand vocabulary every other layer of softrnic
// speaks: the work request and completion opcodes, flags and status codes,
// access flags, scatter/gather entries, QP types and states, the QP
// attributes of a modify (ibv_qp_attr with the IBV_QP_* mask bits), address
// vectors and GIDs, asynchronous event types, and the work queue entries
// and memory segments the transports consume.
//
// Numbers follow rdma-core's <infiniband/verbs.h> (ibv_wr_opcode,
// ibv_send_flags, ibv_wc_status, ibv_wc_opcode, ibv_wc_flags,
// ibv_access_flags, ibv_qp_type, ibv_qp_state, ibv_qp_attr_mask,
// ibv_event_type), so that a value means the same thing in Go, on the
// daemon's wire and in the C library that speaks for stock applications.
//
// It is a leaf: it imports nothing of softrnic, so that the transports
// (transport/rc, transport/ud), the device (rnic) and the application
// interface (verbs) can all use it without importing each other.
package ib

// Package transport is the contract between the device (package rnic) and
// the InfiniBand transports it drives: RC and UC (package transport/rc) and
// UD (package transport/ud). A transport is a pure state machine of one QP:
// work queue entries, transport packets (BTH to the end of the pad, no
// ICRC) and an explicit now go in; transport packets, completions and the
// next deadline come out. It never sees Ethernet, IP or UDP: the device
// checks and strips them on receive, and prepends them on send.
//
// The device serialises every call on one transport (the QP's lock).
package transport

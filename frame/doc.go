// Package frame parses and builds whole RoCEv2 Ethernet frames:
// Ethernet (with or without one 802.1Q tag) / IPv4 or IPv6 / UDP 4791 / BTH /
// extended headers / payload / pad / ICRC.
//
// Parse fills a Frame with offsets into the caller's buffer and nothing else,
// so it neither copies nor allocates; its accessors hand out views (from this
// package and from bth) over that buffer. It checks that every length agrees
// with every other, but leaves the ICRC to VerifyICRC so that the engine
// decides when to pay for it (after cheaper drops such as an unknown QP).
//
// Builder writes a frame into a caller's buffer in two steps, headers first
// and Finish after the payload is in place, so that the engine can gather a
// payload straight out of memory regions into the frame without an
// intermediate copy. Build is the one-call form for tools and tests.
package frame

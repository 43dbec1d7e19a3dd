// Package port defines how softrnic's engine moves Ethernet frames to and from
// the network: whole frames, in batches, through a small interface with three
// implementations (AF_XDP in port/afxdp, AF_PACKET in port/afpacket, and an
// in-memory link in port/memlink for tests and simulation).
package port

// Package afxdp is the AF_XDP implementation of port.Port: RoCEv2 frames are
// steered to it by the XDP program of package bpf and carried through an
// xsk.Socket, bypassing the kernel's network stack; everything else on the
// interface stays with the kernel.
//
// MTU: frames larger than what one UMEM chunk receives (a 4096-byte chunk
// holds 3840 bytes after the kernel's 256-byte XDP headroom) are carried as
// AF_XDP multi-buffer frames (XDP_USE_SG, with the program loaded as
// xdp.frags). The port turns this on by itself when the interface's MTU
// needs it, so RoCE path MTU 4096 (a 4154-byte IPv4 frame on a ~4200-byte
// netdev MTU, as rxe uses) works; such frames are reassembled into a
// port-owned buffer (one copy), smaller ones are handed out as views into the
// UMEM (no copy).
//
// Transmit: Lend lends transmit slots of the UMEM (as many contiguous
// chunks as the largest frame needs), the engine builds its frames in
// them, and Submit posts them on the TX ring as they are, one descriptor
// per chunk: no copy between the device and the kernel.
package afxdp

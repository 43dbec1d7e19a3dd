// Package afpacket is the AF_PACKET implementation of port.Port, for hosts or
// drivers where XDP is not available: it needs only CAP_NET_RAW.
//
// A plain UDP socket cannot carry RoCEv2: the ICRC covers the IP header
// (with TTL, TOS and checksum masked), so the engine must write whole frames
// itself. A raw packet socket does that; a classic BPF socket filter makes the
// kernel hand it only RoCEv2 (UDP destination port 4791 over IPv4 or IPv6).
// Frames arrive in a TPACKET_V2 receive ring shared with the kernel (a
// frame-per-slot ring: unlike TPACKET_V3 there is no block timeout, so a lone
// frame is seen at once, which matters for latency) and are handed out as
// views into it; frames are built in buffers the port lends and leave in
// batches with sendmmsg, which copies them.
//
// Unlike AF_XDP this does not take RoCEv2 away from the kernel: the kernel
// also sees the frames and, with no UDP socket on 4791, may answer with ICMP
// port unreachable (rate-limited). Drop inbound UDP 4791 with nftables when
// that matters. VLAN: the kernel strips an 802.1Q tag into metadata before
// packet sockets see the frame; the port puts it back in front of the
// ethertype (in headroom reserved in each ring slot), so the engine sees the
// frame as it was on the wire.
package afpacket

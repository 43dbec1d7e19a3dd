// Package route answers, for a RoCEv2 peer's IP address, the question the
// kernel answers for its own packets: which interface to send on, which
// source address to put in the IP header, and which MAC address the Ethernet
// frame goes to (the peer's on its own subnet, the gateway's when the peer is
// behind a router: RoCEv2 is routable). It reads the kernel's routing and
// neighbour tables over netlink, asks the kernel to resolve a missing
// neighbour (ARP or neighbour discovery, as if a packet were waiting), and
// reports when a resolved answer changes.
//
// Asking is not always enough: Linux sends an IPv6 neighbour solicitation
// that no packet waits for only from a link-local source (ndisc_send_ns
// gives up without one), and RoCE links are often configured with
// addrgenmode none (the lab's veth and tap are). Resolve then sends one
// real packet, a UDP datagram to the peer's discard port from the route's
// source address, which the kernel holds while it solicits with that
// source (see probe).
//
// It is a slow-path package: the engine looks up a peer when a QP is
// connected or an address handle created, and keeps the answer until
// Watch reports a change.
package route

// Command vethtrace reports every RoCEv2 frame that a veth in the given
// network namespaces hands to the kernel's stack instead of its native XDP
// path, with whether the veth and its peer had an XDP program attached at
// that instant. It is the probe behind bench/io/veth-stall.sh: a RoCE frame
// that reaches the stack while the receiving veth has a program attached
// would be a kernel bypass of XDP; one that reaches it after the program was
// detached (its process exited) is not.
//
//	vethtrace -for 10m NETNS...   (names under /run/netns, or paths)
//
// One line per frame: UTC time, namespace inode, ifindex, xdp=0|1 (the
// receiving veth), peer_xdp=0|1, the UDP source port (the QP's flow). It
// needs root (CAP_BPF, CAP_PERFMON) and a kernel with BTF; it attaches to
// the netif_rx raw tracepoint, which needs no kprobes.
package main

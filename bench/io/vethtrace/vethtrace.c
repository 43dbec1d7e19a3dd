//go:build ignore

// SPDX-License-Identifier: (MIT OR GPL-2.0)
//
// vethtrace.c: reports every RoCEv2 frame (UDP to 4791 over IPv4) that a
// veth in a watched network namespace hands to the kernel stack
// (the netif_rx tracepoint: veth_xmit's non-NAPI path), with whether that
// veth and its peer had an XDP program attached at that moment. A frame
// steered to AF_XDP never gets there, so each event is a RoCE frame that
// bypassed native XDP or arrived when no program was attached.
//
// Raw tracepoint, because kprobes and fentry are not available on every
// host (they are refused on the development machines); struct layouts are
// resolved against the running kernel's BTF (CO-RE).

typedef unsigned char __u8;
typedef unsigned short __u16;
typedef unsigned int __u32;
typedef unsigned long long __u64;
typedef signed char __s8;
typedef short __s16;
typedef int __s32;
typedef long long __s64;
typedef __u16 __be16;
typedef __u32 __be32;
typedef __u64 __be64;
typedef __u32 __wsum;

#define BPF_MAP_TYPE_HASH 1
#define BPF_MAP_TYPE_RINGBUF 27

#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

struct bpf_prog;
struct ns_common {
	unsigned int inum;
} __attribute__((preserve_access_index));
struct net {
	struct ns_common ns;
} __attribute__((preserve_access_index));
typedef struct {
	struct net *net;
} possible_net_t;
struct net_device {
	possible_net_t nd_net;
	int ifindex;
} __attribute__((preserve_access_index));
struct sk_buff {
	unsigned char *data;
	struct net_device *dev;
} __attribute__((preserve_access_index));
struct veth_priv {
	struct net_device *peer;
	struct bpf_prog *_xdp_prog;
} __attribute__((preserve_access_index));

struct bpf_raw_tracepoint_args {
	__u64 args[0];
};

// netns holds the inode numbers of the namespaces to watch.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, __u8);
	__uint(max_entries, 16);
} netns SEC(".maps");

struct event {
	__u64 ktime;   // CLOCK_MONOTONIC ns
	__u32 netns;   // namespace of the receiving veth
	__u32 ifindex; // receiving veth
	__u32 xdp;     // the receiving veth had an XDP program
	__u32 peer_xdp;
	__u16 sport;   // UDP source port, host order: which QP's flow
	__u16 pad;
	__u32 pad2;
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 18);
} events SEC(".maps");

SEC("raw_tracepoint/netif_rx")
int netif_rx(struct bpf_raw_tracepoint_args *ctx)
{
	struct sk_buff *skb = (void *)ctx->args[0];
	struct net_device *dev = BPF_CORE_READ(skb, dev);
	__u32 ns = BPF_CORE_READ(dev, nd_net.net, ns.inum);
	if (!bpf_map_lookup_elem(&netns, &ns))
		return 0;
	// After eth_type_trans, data points past the Ethernet header.
	__u8 h[24];
	if (bpf_probe_read_kernel(h, sizeof(h), BPF_CORE_READ(skb, data)))
		return 0;
	if (h[0] != 0x45 || h[9] != 17 || h[22] != 0x12 || h[23] != 0xb7)
		return 0;
	struct event e = {};
	e.ktime = bpf_ktime_get_ns();
	e.netns = ns;
	e.ifindex = BPF_CORE_READ(dev, ifindex);
	e.sport = (__u16)h[20] << 8 | h[21];
	// netdev_priv: the private area follows struct net_device, aligned.
	unsigned long off = (bpf_core_type_size(struct net_device) + 31) & ~31UL;
	struct veth_priv *priv = (void *)((char *)dev + off);
	e.xdp = BPF_CORE_READ(priv, _xdp_prog) != 0;
	struct net_device *peer = BPF_CORE_READ(priv, peer);
	if (peer) {
		struct veth_priv *pp = (void *)((char *)peer + off);
		e.peer_xdp = BPF_CORE_READ(pp, _xdp_prog) != 0;
	}
	bpf_ringbuf_output(&events, &e, sizeof(e), 0);
	return 0;
}

char __license[] SEC("license") = "GPL";

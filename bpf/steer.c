//go:build ignore

// SPDX-License-Identifier: (MIT OR GPL-2.0)
//
// steer.c: softrnic's XDP steering program.
//
// Every frame that is Ethernet (optionally one 802.1Q/802.1ad tag) + IPv4 (any
// IHL, not a fragment) or IPv6 (no extension headers) + UDP with destination
// port 4791 (RoCEv2) is redirected to the AF_XDP socket registered for the
// receiving queue in xsks. Everything else (ARP, ICMP, TCP side channels,
// SSH...) goes on to the kernel stack with XDP_PASS, and so does RoCE on a
// queue with no socket bound, so that nothing is lost while softrnic starts
// or stops.
//
// The program is self-contained (no kernel headers) so that `go generate`
// needs only clang and libbpf's bpf_helpers.h.

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

#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

// From include/uapi/linux/bpf.h.
struct xdp_md {
	__u32 data;
	__u32 data_end;
	__u32 data_meta;
	__u32 ingress_ifindex;
	__u32 rx_queue_index;
	__u32 egress_ifindex;
};

enum xdp_action { XDP_ABORTED = 0, XDP_DROP, XDP_PASS, XDP_TX, XDP_REDIRECT };

#define BPF_MAP_TYPE_HASH 1
#define BPF_MAP_TYPE_PERCPU_ARRAY 6
#define BPF_MAP_TYPE_XSKMAP 17

#define ETH_P_IP 0x0800
#define ETH_P_IPV6 0x86DD
#define ETH_P_8021Q 0x8100
#define ETH_P_8021AD 0x88A8
#define IPPROTO_UDP 17
#define ROCE_V2_PORT 4791

#define ETH_HLEN 14
#define VLAN_HLEN 4
#define IPV4_MIN_HLEN 20
#define IPV6_HLEN 40
#define UDP_HLEN 8

// Counter indexes; the Go side (counters.go) mirrors this layout.
struct counters {
	__u64 steered;   // redirected to an AF_XDP socket
	__u64 passed;    // not RoCEv2: left to the kernel
	__u64 malformed; // claims IP but a header is truncated or invalid
	__u64 unbound;   // RoCEv2 but no socket on this queue: passed
	__u64 foreign;   // RoCEv2 to an address that is not ours: passed
};

// xsks maps an rx queue index to the AF_XDP socket bound to that queue.
// max_entries is set by the loader to the number of queues.
struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(__u32));
	__uint(max_entries, 64);
} xsks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct counters);
	__uint(max_entries, 1);
} stats SEC(".maps");

// Local addresses: when filter_local is set, only RoCEv2 sent to one of
// these is steered (the host may route RoCE it is not the endpoint of).
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32); // IPv4 address, network byte order
	__type(value, __u8);
	__uint(max_entries, 64);
} local_v4 SEC(".maps");

struct in6 {
	__u8 b[16];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct in6);
	__type(value, __u8);
	__uint(max_entries, 64);
} local_v6 SEC(".maps");

// Load-time constants, set through the collection spec's variables.
// filter_local turns the destination address filter on. miss_action is the
// verdict when no socket is bound on the queue: XDP_PASS in production; the
// tests set XDP_DROP so that "would steer" is visible in BPF_PROG_TEST_RUN,
// where no socket can exist.
volatile const __u32 filter_local = 0;
volatile const __u32 miss_action = XDP_PASS;

struct ethhdr {
	__u8 dst[6];
	__u8 src[6];
	__be16 proto;
} __attribute__((packed));

struct vlanhdr {
	__be16 tci;
	__be16 proto;
} __attribute__((packed));

struct iphdr {
	__u8 ver_ihl;
	__u8 tos;
	__be16 tot_len;
	__be16 id;
	__be16 frag_off;
	__u8 ttl;
	__u8 protocol;
	__be16 check;
	__be32 saddr;
	__be32 daddr;
} __attribute__((packed));

struct ipv6hdr {
	__be32 ver_tc_flow;
	__be16 payload_len;
	__u8 nexthdr;
	__u8 hop_limit;
	struct in6 saddr;
	struct in6 daddr;
} __attribute__((packed));

struct udphdr {
	__be16 source;
	__be16 dest;
	__be16 len;
	__be16 check;
} __attribute__((packed));

enum verdict { V_PASS, V_ROCE, V_MALFORMED, V_FOREIGN };

static __always_inline enum verdict classify(void *data, void *data_end)
{
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > data_end)
		return V_PASS; // too short to be anything we care about
	__u16 proto = eth->proto;
	void *l3 = eth + 1;
	if (proto == bpf_htons(ETH_P_8021Q) || proto == bpf_htons(ETH_P_8021AD)) {
		struct vlanhdr *vh = l3;
		if ((void *)(vh + 1) > data_end)
			return V_MALFORMED;
		proto = vh->proto;
		l3 = vh + 1;
	}

	struct udphdr *udp;
	if (proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = l3;
		if ((void *)(ip + 1) > data_end)
			return V_MALFORMED;
		__u32 ihl = (ip->ver_ihl & 0x0f) * 4;
		if ((ip->ver_ihl >> 4) != 4 || ihl < IPV4_MIN_HLEN)
			return V_MALFORMED;
		if (ip->protocol != IPPROTO_UDP)
			return V_PASS;
		// A fragment (MF set or non-zero offset) is the kernel's to
		// reassemble; RoCEv2 is sent with DF and never fragments.
		if (ip->frag_off & bpf_htons(0x3fff))
			return V_PASS;
		udp = l3 + ihl;
		if ((void *)(udp + 1) > data_end)
			return V_MALFORMED;
		if (udp->dest != bpf_htons(ROCE_V2_PORT))
			return V_PASS;
		if (filter_local) {
			__u32 daddr = ip->daddr;
			if (!bpf_map_lookup_elem(&local_v4, &daddr))
				return V_FOREIGN;
		}
		return V_ROCE;
	}
	if (proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = l3;
		if ((void *)(ip6 + 1) > data_end)
			return V_MALFORMED;
		if ((bpf_ntohl(ip6->ver_tc_flow) >> 28) != 6)
			return V_MALFORMED;
		// RoCEv2 over IPv6 carries UDP directly after the fixed header.
		if (ip6->nexthdr != IPPROTO_UDP)
			return V_PASS;
		udp = (void *)(ip6 + 1);
		if ((void *)(udp + 1) > data_end)
			return V_MALFORMED;
		if (udp->dest != bpf_htons(ROCE_V2_PORT))
			return V_PASS;
		if (filter_local) {
			struct in6 daddr = ip6->daddr;
			if (!bpf_map_lookup_elem(&local_v6, &daddr))
				return V_FOREIGN;
		}
		return V_ROCE;
	}
	return V_PASS;
}

// Loaded with frags support so that it may be attached to a netdev whose MTU
// exceeds one page (RoCE path MTU 4096 needs ~4200 bytes): the headers it
// reads are always in the first buffer.
SEC("xdp.frags")
int steer(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u32 zero = 0;
	struct counters *c = bpf_map_lookup_elem(&stats, &zero);

	switch (classify(data, data_end)) {
	case V_ROCE:
		break;
	case V_MALFORMED:
		if (c)
			c->malformed++;
		return XDP_PASS;
	case V_FOREIGN:
		if (c)
			c->foreign++;
		return XDP_PASS;
	default:
		if (c)
			c->passed++;
		return XDP_PASS;
	}

	__u32 action = miss_action;
	long rc = bpf_redirect_map(&xsks, ctx->rx_queue_index, action);
	if (rc == XDP_REDIRECT) {
		if (c)
			c->steered++;
	} else if (c) {
		c->unbound++;
	}
	return rc;
}

char __license[] SEC("license") = "Dual MIT/GPL";

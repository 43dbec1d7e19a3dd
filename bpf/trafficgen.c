//go:build ignore

// SPDX-License-Identifier: (MIT OR GPL-2.0)
//
// trafficgen.c: a kernel-side frame generator and a counting sink, for
// benches and tests.
//
// The program is never attached. It is run with BPF_PROG_TEST_RUN in live
// frame mode (BPF_F_TEST_XDP_LIVE_FRAMES, Linux 5.18+): the kernel builds
// `repeat` real frames from the input and acts on the verdict. XDP_TX is
// turned by the test-run code into a redirect out of the ingress interface
// named in the context, so on a veth the frames go through ndo_xdp_xmit to
// the peer's XDP receive path, as xdp_frames, without an skb, a socket or a
// system call per batch. That makes it several times cheaper per frame than
// an AF_XDP copy-mode transmit, so a receive bench fed by it measures the
// receiver rather than the sender.

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

#define BPF_MAP_TYPE_PERCPU_ARRAY 6

SEC("xdp")
int trafficgen(struct xdp_md *ctx)
{
	return XDP_TX;
}

// sunk counts, per CPU, the RoCEv2 frames sink dropped (UDP to 4791 over
// IPv4 without options or IPv6 without extension headers: what benches
// send); other frames (the stack's ARP and neighbour discovery) are dropped
// uncounted.
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 1);
} sunk SEC(".maps");

// sink is attached to the peer of a transmit bench: it counts every frame
// that reached the peer's XDP hook and drops it, the cheapest end a frame
// can meet (passing it up the stack would bill the sender, whose sendto
// runs the peer's receive path on veth, for an skb walk and an ICMP error).
SEC("xdp.frags")
int sink(struct xdp_md *ctx)
{
	__u8 *data = (void *)(long)ctx->data;
	__u8 *data_end = (void *)(long)ctx->data_end;
	int roce = 0;
	if (data + 58 <= data_end) {
		if (data[12] == 0x08 && data[13] == 0x00 && data[14] == 0x45 && data[23] == 17)
			roce = data[36] == 0x12 && data[37] == 0xb7;
		else if (data[12] == 0x86 && data[13] == 0xdd && data[20] == 17)
			roce = data[56] == 0x12 && data[57] == 0xb7;
	} else if (data + 38 <= data_end) {
		if (data[12] == 0x08 && data[13] == 0x00 && data[14] == 0x45 && data[23] == 17)
			roce = data[36] == 0x12 && data[37] == 0xb7;
	}
	if (roce) {
		__u32 zero = 0;
		__u64 *c = bpf_map_lookup_elem(&sunk, &zero);
		if (c)
			(*c)++;
	}
	return XDP_DROP;
}

char __license[] SEC("license") = "Dual MIT/GPL";

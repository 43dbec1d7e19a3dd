//go:build ignore

// SPDX-License-Identifier: (MIT OR GPL-2.0)
//
// trafficgen.c: a kernel-side frame generator for benches and tests.
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

typedef unsigned int __u32;

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

#define SEC(name) __attribute__((section(name), used))

SEC("xdp")
int trafficgen(struct xdp_md *ctx)
{
	return XDP_TX;
}

char __license[] SEC("license") = "Dual MIT/GPL";

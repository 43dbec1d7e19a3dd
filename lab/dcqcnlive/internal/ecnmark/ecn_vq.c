//go:build ignore

// SPDX-License-Identifier: (MIT OR GPL-2.0)
//
// ecn_vq.c: a queue-driven ECN marker for the live DCQCN testbed.
//
// The kernel here has no sch_red and no netem, so the "switch" of the testbed
// is IPv4 forwarding with a tbf bottleneck, and this tc (clsact egress,
// direct-action) program is its congestion point. clsact egress runs before
// the root qdisc enqueues the packet, so the program cannot read tbf's
// backlog; instead it keeps a virtual queue that mirrors it: a constant-rate
// server draining at the tbf rate C,
//
//	q = max(0, q - (now - last) * C) + len,
//
// updated under a bpf_spin_lock (several CPUs forward at once). tbf lets a
// burst of b bytes through before anything queues, so its backlog is about
// max(0, q - b); the program marks on that estimate of the backlog a packet
// finds when it arrives, with the DCQCN/RED ramp:
// p = 0 for q <= Kmin, Pmax * (q - Kmin) / (Kmax - Kmin) up to Kmax, 1 above,
// and counts as a virtual drop a packet that would take it past tbf's limit.
// This is marking at enqueue, whereas the DCQCN simulators mark at dequeue.
//
// Only ECT(0)/ECT(1) packets are set to CE (bpf_skb_ecn_set_ce, which also
// fixes the IPv4 header checksum; the RoCE ICRC masks the ECN bits so it
// stays valid). Not-ECT packets are never touched; a RED switch would drop
// them, so they are only counted. Randomness comes from a xorshift64 state
// kept in the locked map value and seeded by the loader, so a run with the
// same seed and packet sequence marks the same packets.
//
// Self-contained (no kernel headers) so that `go generate` needs only clang
// and libbpf's bpf_helpers.h.

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

// The leading fields of include/uapi/linux/bpf.h's struct __sk_buff (the
// verifier checks context accesses by offset; later fields are unused).
struct __sk_buff {
	__u32 len;
	__u32 pkt_type;
	__u32 mark;
	__u32 queue_mapping;
	__u32 protocol;
	__u32 vlan_present;
	__u32 vlan_tci;
	__u32 vlan_proto;
	__u32 priority;
	__u32 ingress_ifindex;
	__u32 ifindex;
	__u32 tc_index;
	__u32 cb[5];
	__u32 hash;
	__u32 tc_classid;
	__u32 data;
	__u32 data_end;
};

struct bpf_spin_lock {
	__u32 val;
};

#define BPF_MAP_TYPE_ARRAY 2
#define BPF_MAP_TYPE_PERCPU_ARRAY 6
#define BPF_MAP_TYPE_RINGBUF 27
#define BPF_RB_NO_WAKEUP 1
#define BPF_RB_FORCE_WAKEUP 2
#define TC_ACT_OK 0

#define ETH_HLEN 14
#define ETH_P_IP 0x0800
#define ETH_P_IPV6 0x86DD
#define ETH_P_8021Q 0x8100
#define ETH_P_8021AD 0x88A8

#define NSEC_PER_SEC 1000000000ULL
// A gap longer than this empties any queue the loader accepts (it bounds
// limit <= rate * 1 s); clamping keeps dt * rate within 64 bits.
#define MAX_DRAIN_NS NSEC_PER_SEC

// config is written by the loader (ecnmark.go mirrors it). rate_Bps == 0
// means "not configured yet": packets pass untouched and are counted.
struct config {
	__u64 rate_Bps;    // bottleneck (tbf) rate, bytes per second
	__u64 limit_bytes; // tbf limit: a packet that would overflow it is a virtual drop (0: none)
	__u64 burst_bytes; // tbf burst: the part of q that tbf sends without queueing
	__u64 kmin_bytes;  // no marking at or below
	__u64 kmax_bytes;  // marking always above
	__u64 pmax_q32;    // marking probability at Kmax, 1<<32 = 1
	__u64 now_ns;      // test-only clock override; 0: bpf_ktime_get_ns()
	__u32 flags;       // CFG_TRACE
	__u32 wake_every;  // wake the trace reader every N samples (0 or 1: each)
};

#define CFG_TRACE 1

// vq is the virtual queue, one locked value shared by all CPUs.
struct vq {
	struct bpf_spin_lock lock;
	__u32 _pad;
	__u64 last_ns; // time of the last update (0: none yet)
	__u64 q_bytes; // backlog after the last packet
	__u64 rem;     // drain remainder, in byte-nanoseconds / s units (< 1e9)
	__u64 rng;     // xorshift64 state, never 0
	__u64 seq;     // samples emitted, for wake-ups
};

// stats are per-CPU counters (summed by the loader).
struct stats {
	__u64 packets;
	__u64 bytes;
	__u64 ect;         // ECT(0) or ECT(1) on arrival
	__u64 ce;          // already CE on arrival
	__u64 not_ect;     // IP, not ECN-capable
	__u64 non_ip;      // not IPv4/IPv6 (ARP...): queued, never marked
	__u64 marked;      // set to CE by us
	__u64 mark_failed; // chosen for marking but the helper refused
	__u64 not_ect_hit; // not-ECT chosen by RED: a RED switch would drop it
	__u64 ce_hit;      // already CE and chosen by RED
	__u64 vq_drops;    // would overflow limit_bytes: tbf drops it
	__u64 unconfigured;
	__u64 trace_lost;  // ring buffer full
};

// sample is one queue-trace record (ecnmark.go mirrors it).
struct sample {
	__u64 now_ns;
	__u32 q_bytes; // backlog estimate max(0, q - burst) found on arrival
	__u16 len;
	__u8 ecn;      // ECN field on arrival (0xff: not IP)
	__u8 verdict;  // V_* bits
};

#define V_MARKED 1   // set to CE
#define V_RED 2      // RED chose this packet
#define V_VQDROP 4   // virtual drop (over limit)

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct config);
	__uint(max_entries, 1);
} cfg SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct vq);
	__uint(max_entries, 1);
} vqs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct stats);
	__uint(max_entries, 1);
} stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
} trace SEC(".maps");

#define ECN_NOT_IP 0xff

// ecn_of returns the ECN field of the IPv4/IPv6 packet in skb (one 802.1Q
// or 802.1ad tag allowed in the frame), or ECN_NOT_IP. It reads with
// bpf_skb_load_bytes so that a non-linear skb is handled too.
static __always_inline __u8 ecn_of(struct __sk_buff *skb)
{
	__u8 b[4];
	__u32 off = 12;
	if (bpf_skb_load_bytes(skb, off, b, 2) < 0)
		return ECN_NOT_IP;
	__u16 proto = ((__u16)b[0] << 8) | b[1];
	off = ETH_HLEN;
	if (proto == ETH_P_8021Q || proto == ETH_P_8021AD) {
		if (bpf_skb_load_bytes(skb, 16, b, 2) < 0)
			return ECN_NOT_IP;
		proto = ((__u16)b[0] << 8) | b[1];
		off += 4;
	}
	if (bpf_skb_load_bytes(skb, off, b, 2) < 0)
		return ECN_NOT_IP;
	if (proto == ETH_P_IP && (b[0] >> 4) == 4)
		return b[1] & 3;
	if (proto == ETH_P_IPV6 && (b[0] >> 4) == 6)
		return (b[1] >> 4) & 3;
	return ECN_NOT_IP;
}

static __always_inline __u64 xorshift64(__u64 x)
{
	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return x;
}

SEC("tc")
int ecn_vq(struct __sk_buff *skb)
{
	__u32 zero = 0;
	struct config *c = bpf_map_lookup_elem(&cfg, &zero);
	struct vq *v = bpf_map_lookup_elem(&vqs, &zero);
	struct stats *s = bpf_map_lookup_elem(&stats, &zero);
	if (!c || !v || !s)
		return TC_ACT_OK;

	__u32 len = skb->len;
	s->packets++;
	s->bytes += len;
	__u64 rate = c->rate_Bps;
	if (rate == 0) {
		s->unconfigured++;
		return TC_ACT_OK;
	}
	__u8 ecn = ecn_of(skb);
	__u64 now = c->now_ns;
	if (now == 0)
		now = bpf_ktime_get_ns();
	__u64 limit = c->limit_bytes, kmin = c->kmin_bytes, kmax = c->kmax_bytes;
	__u64 burst = c->burst_bytes;
	__u64 pmax = c->pmax_q32;

	__u64 qseen, seq;
	__u8 verdict = 0;
	bpf_spin_lock(&v->lock);
	if (v->last_ns != 0 && now > v->last_ns) {
		__u64 dt = now - v->last_ns;
		if (dt >= MAX_DRAIN_NS) {
			v->q_bytes = 0;
			v->rem = 0;
		} else {
			__u64 num = dt * rate + v->rem;
			__u64 drained = num / NSEC_PER_SEC;
			if (drained >= v->q_bytes) {
				v->q_bytes = 0;
				v->rem = 0; // an idle server banks no credit
			} else {
				v->q_bytes -= drained;
				v->rem = num - drained * NSEC_PER_SEC;
			}
		}
	}
	if (now > v->last_ns)
		v->last_ns = now; // a clock step backwards (tests) drains nothing
	qseen = v->q_bytes > burst ? v->q_bytes - burst : 0;
	if (limit != 0 && qseen + len > limit)
		verdict |= V_VQDROP;
	else
		v->q_bytes += len;
	if (!(verdict & V_VQDROP) && qseen > kmin) {
		if (qseen > kmax) {
			verdict |= V_RED;
		} else {
			// Ramp: one draw per packet in the ramp, ECN-capable or not,
			// so the draw sequence depends only on the packet sequence.
			__u64 x = xorshift64(v->rng);
			v->rng = x;
			__u64 thr = pmax * (qseen - kmin) / (kmax - kmin);
			if ((x >> 32) < thr)
				verdict |= V_RED;
		}
	}
	seq = ++v->seq;
	bpf_spin_unlock(&v->lock);

	if (ecn == ECN_NOT_IP)
		s->non_ip++;
	else if (ecn == 0)
		s->not_ect++;
	else if (ecn == 3)
		s->ce++;
	else
		s->ect++;
	if (verdict & V_RED) {
		if (ecn == 1 || ecn == 2) {
			long ok = bpf_skb_ecn_set_ce(skb);
			if (!ok && bpf_skb_pull_data(skb, ETH_HLEN + 4 + 40) == 0)
				ok = bpf_skb_ecn_set_ce(skb); // was a shared clone
			if (ok) {
				s->marked++;
				verdict |= V_MARKED;
			} else {
				s->mark_failed++;
			}
		} else if (ecn == 3) {
			s->ce_hit++;
		} else if (ecn == 0) {
			s->not_ect_hit++;
		}
	}
	if (verdict & V_VQDROP)
		s->vq_drops++;

	if (c->flags & CFG_TRACE) {
		struct sample smp = {
			.now_ns = now,
			.q_bytes = qseen > 0xffffffffULL ? 0xffffffff : (__u32)qseen,
			.len = len > 0xffff ? 0xffff : (__u16)len,
			.ecn = ecn,
			.verdict = verdict,
		};
		__u32 every = c->wake_every;
		__u64 fl = (every > 1 && seq % every) ? BPF_RB_NO_WAKEUP : BPF_RB_FORCE_WAKEUP;
		if (bpf_ringbuf_output(&trace, &smp, sizeof(smp), fl) < 0)
			s->trace_lost++;
	}
	return TC_ACT_OK;
}

char _license[] SEC("license") = "Dual MIT/GPL";

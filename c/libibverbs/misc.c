/*
 * The helpers of the API that need no device: names of enums, rate
 * conversions, sysfs reads, fork support and the kernel-ABI copies.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <infiniband/sa.h>
#include <rdma/ib_user_sa.h>
#include <rdma/ib_user_verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "srn.h"

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

SRN_EXPORT const char *ibv_wc_status_str(enum ibv_wc_status status)
{
	static const char *const s[] = {
		[IBV_WC_SUCCESS] = "success",
		[IBV_WC_LOC_LEN_ERR] = "local length error",
		[IBV_WC_LOC_QP_OP_ERR] = "local QP operation error",
		[IBV_WC_LOC_EEC_OP_ERR] = "local EE context operation error",
		[IBV_WC_LOC_PROT_ERR] = "local protection error",
		[IBV_WC_WR_FLUSH_ERR] = "Work Request Flushed Error",
		[IBV_WC_MW_BIND_ERR] = "memory management operation error",
		[IBV_WC_BAD_RESP_ERR] = "bad response error",
		[IBV_WC_LOC_ACCESS_ERR] = "local access error",
		[IBV_WC_REM_INV_REQ_ERR] = "remote invalid request error",
		[IBV_WC_REM_ACCESS_ERR] = "remote access error",
		[IBV_WC_REM_OP_ERR] = "remote operation error",
		[IBV_WC_RETRY_EXC_ERR] = "transport retry counter exceeded",
		[IBV_WC_RNR_RETRY_EXC_ERR] = "RNR retry counter exceeded",
		[IBV_WC_LOC_RDD_VIOL_ERR] = "local RDD violation error",
		[IBV_WC_REM_INV_RD_REQ_ERR] = "remote invalid RD request",
		[IBV_WC_REM_ABORT_ERR] = "aborted error",
		[IBV_WC_INV_EECN_ERR] = "invalid EE context number",
		[IBV_WC_INV_EEC_STATE_ERR] = "invalid EE context state",
		[IBV_WC_FATAL_ERR] = "fatal error",
		[IBV_WC_RESP_TIMEOUT_ERR] = "response timeout error",
		[IBV_WC_GENERAL_ERR] = "general error",
		[IBV_WC_TM_ERR] = "TM error",
		[IBV_WC_TM_RNDV_INCOMPLETE] = "TM software rendezvous",
	};
	return (unsigned)status < NELEM(s) && s[status] ? s[status] : "unknown";
}

SRN_EXPORT const char *ibv_node_type_str(enum ibv_node_type t)
{
	static const char *const s[] = {
		[IBV_NODE_CA] = "InfiniBand channel adapter",
		[IBV_NODE_SWITCH] = "InfiniBand switch",
		[IBV_NODE_ROUTER] = "InfiniBand router",
		[IBV_NODE_RNIC] = "iWARP NIC",
		[IBV_NODE_USNIC] = "usNIC",
		[IBV_NODE_USNIC_UDP] = "usNIC UDP",
		[IBV_NODE_UNSPECIFIED] = "unspecified",
	};
	return t >= 0 && (unsigned)t < NELEM(s) && s[t] ? s[t] : "unknown";
}

SRN_EXPORT const char *ibv_port_state_str(enum ibv_port_state st)
{
	static const char *const s[] = {
		[IBV_PORT_NOP] = "no state change (NOP)", [IBV_PORT_DOWN] = "down",
		[IBV_PORT_INIT] = "init",		  [IBV_PORT_ARMED] = "armed",
		[IBV_PORT_ACTIVE] = "active",		  [IBV_PORT_ACTIVE_DEFER] = "active defer",
	};
	return (unsigned)st < NELEM(s) && s[st] ? s[st] : "unknown";
}

SRN_EXPORT const char *ibv_event_type_str(enum ibv_event_type e)
{
	static const char *const s[] = {
		[IBV_EVENT_CQ_ERR] = "CQ error",
		[IBV_EVENT_QP_FATAL] = "local work queue catastrophic error",
		[IBV_EVENT_QP_REQ_ERR] = "invalid request local work queue error",
		[IBV_EVENT_QP_ACCESS_ERR] = "local access violation work queue error",
		[IBV_EVENT_COMM_EST] = "communication established",
		[IBV_EVENT_SQ_DRAINED] = "send queue drained",
		[IBV_EVENT_PATH_MIG] = "path migrated",
		[IBV_EVENT_PATH_MIG_ERR] = "path migration request error",
		[IBV_EVENT_DEVICE_FATAL] = "local catastrophic error",
		[IBV_EVENT_PORT_ACTIVE] = "port active",
		[IBV_EVENT_PORT_ERR] = "port error",
		[IBV_EVENT_LID_CHANGE] = "LID change",
		[IBV_EVENT_PKEY_CHANGE] = "P_Key change",
		[IBV_EVENT_SM_CHANGE] = "SM change",
		[IBV_EVENT_SRQ_ERR] = "SRQ catastrophic error",
		[IBV_EVENT_SRQ_LIMIT_REACHED] = "SRQ limit reached",
		[IBV_EVENT_QP_LAST_WQE_REACHED] = "last WQE reached",
		[IBV_EVENT_CLIENT_REREGISTER] = "client reregistration",
		[IBV_EVENT_GID_CHANGE] = "GID table change",
		[IBV_EVENT_WQ_FATAL] = "WQ fatal",
	};
	return (unsigned)e < NELEM(s) && s[e] ? s[e] : "unknown";
}

/* IBTA rates: the enum, the multiple of 2.5 Gb/s (or -1) and Mb/s. */
static const struct {
	enum ibv_rate rate;
	int mult;
	int mbps;
} rates[] = {
	{IBV_RATE_2_5_GBPS, 1, 2500},	    {IBV_RATE_5_GBPS, 2, 5000},	      {IBV_RATE_10_GBPS, 4, 10000},
	{IBV_RATE_20_GBPS, 8, 20000},	    {IBV_RATE_30_GBPS, 12, 30000},    {IBV_RATE_40_GBPS, 16, 40000},
	{IBV_RATE_60_GBPS, 24, 60000},	    {IBV_RATE_80_GBPS, 32, 80000},    {IBV_RATE_120_GBPS, 48, 120000},
	{IBV_RATE_14_GBPS, -1, 14062},	    {IBV_RATE_56_GBPS, -1, 56250},    {IBV_RATE_112_GBPS, -1, 112500},
	{IBV_RATE_168_GBPS, -1, 168750},    {IBV_RATE_25_GBPS, 10, 25781},    {IBV_RATE_100_GBPS, 40, 103125},
	{IBV_RATE_200_GBPS, 80, 206250},    {IBV_RATE_300_GBPS, 120, 309375}, {IBV_RATE_28_GBPS, 11, 28125},
	{IBV_RATE_50_GBPS, 20, 53125},	    {IBV_RATE_400_GBPS, 160, 425000}, {IBV_RATE_600_GBPS, 240, 637500},
};

SRN_EXPORT int ibv_rate_to_mult(enum ibv_rate rate)
{
	for (size_t i = 0; i < NELEM(rates); i++)
		if (rates[i].rate == rate && rates[i].mult > 0 && rates[i].mult <= 48)
			return rates[i].mult;
	return -1;
}

SRN_EXPORT enum ibv_rate mult_to_ibv_rate(int mult)
{
	for (size_t i = 0; i < NELEM(rates); i++)
		if (rates[i].mult == mult && mult > 0 && mult <= 48)
			return rates[i].rate;
	return IBV_RATE_MAX;
}

SRN_EXPORT int ibv_rate_to_mbps(enum ibv_rate rate)
{
	for (size_t i = 0; i < NELEM(rates); i++)
		if (rates[i].rate == rate)
			return rates[i].mbps;
	return -1;
}

SRN_EXPORT enum ibv_rate mbps_to_ibv_rate(int mbps)
{
	for (size_t i = 0; i < NELEM(rates); i++)
		if (rates[i].mbps == mbps)
			return rates[i].rate;
	return IBV_RATE_MAX;
}

static char sysfs_path[256];

static void sysfs_path_init(void)
{
	const char *e = getenv("SYSFS_PATH");
	snprintf(sysfs_path, sizeof(sysfs_path), "%s", e && *e ? e : "/sys");
	for (size_t n = strlen(sysfs_path); n > 1 && sysfs_path[n - 1] == '/'; n--)
		sysfs_path[n - 1] = 0;
}

SRN_EXPORT const char *ibv_get_sysfs_path(void)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	pthread_once(&once, sysfs_path_init);
	return sysfs_path;
}

SRN_EXPORT int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size)
{
	char path[512];
	if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir, file) >= sizeof(path)) {
		errno = ENAMETOOLONG;
		return -1;
	}
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	ssize_t n = read(fd, buf, size);
	int err = errno;
	close(fd);
	if (n < 0) {
		errno = err;
		return -1;
	}
	if (n > 0 && buf[n - 1] == '\n')
		buf[--n] = 0;
	else if ((size_t)n < size)
		buf[n] = 0;
	return (int)n;
}

/* Registered memory is never pinned here, and the pages the library moves
 * into shared memory are made private again in a fork child (share.c),
 * so a fork needs no preparation and children never share registered
 * pages. */
SRN_EXPORT int ibv_fork_init(void)
{
	return 0;
}

SRN_EXPORT enum ibv_fork_status ibv_is_fork_initialized(void)
{
	return IBV_FORK_UNNEEDED;
}

SRN_EXPORT int ibv_dontfork_range(void *base, size_t size)
{
	(void)base, (void)size;
	return 0;
}

SRN_EXPORT int ibv_dofork_range(void *base, size_t size)
{
	(void)base, (void)size;
	return 0;
}

/* The kernel-ABI conversions of rdma-core's marshall.h. */
SRN_EXPORT void ibv_copy_ah_attr_from_kern(struct ibv_ah_attr *dst, struct ib_uverbs_ah_attr *src)
{
	memcpy(dst->grh.dgid.raw, src->grh.dgid, sizeof(dst->grh.dgid));
	dst->grh.flow_label = src->grh.flow_label;
	dst->grh.sgid_index = src->grh.sgid_index;
	dst->grh.hop_limit = src->grh.hop_limit;
	dst->grh.traffic_class = src->grh.traffic_class;
	dst->dlid = src->dlid;
	dst->sl = src->sl;
	dst->src_path_bits = src->src_path_bits;
	dst->static_rate = src->static_rate;
	dst->is_global = src->is_global;
	dst->port_num = src->port_num;
}

SRN_EXPORT void ibv_copy_qp_attr_from_kern(struct ibv_qp_attr *dst, struct ib_uverbs_qp_attr *src)
{
	dst->cur_qp_state = src->cur_qp_state;
	dst->path_mtu = src->path_mtu;
	dst->path_mig_state = src->path_mig_state;
	dst->qkey = src->qkey;
	dst->rq_psn = src->rq_psn;
	dst->sq_psn = src->sq_psn;
	dst->dest_qp_num = src->dest_qp_num;
	dst->qp_access_flags = src->qp_access_flags;
	dst->cap.max_send_wr = src->max_send_wr;
	dst->cap.max_recv_wr = src->max_recv_wr;
	dst->cap.max_send_sge = src->max_send_sge;
	dst->cap.max_recv_sge = src->max_recv_sge;
	dst->cap.max_inline_data = src->max_inline_data;
	ibv_copy_ah_attr_from_kern(&dst->ah_attr, &src->ah_attr);
	ibv_copy_ah_attr_from_kern(&dst->alt_ah_attr, &src->alt_ah_attr);
	dst->pkey_index = src->pkey_index;
	dst->alt_pkey_index = src->alt_pkey_index;
	dst->en_sqd_async_notify = src->en_sqd_async_notify;
	dst->sq_draining = src->sq_draining;
	dst->max_rd_atomic = src->max_rd_atomic;
	dst->max_dest_rd_atomic = src->max_dest_rd_atomic;
	dst->min_rnr_timer = src->min_rnr_timer;
	dst->port_num = src->port_num;
	dst->timeout = src->timeout;
	dst->retry_cnt = src->retry_cnt;
	dst->rnr_retry = src->rnr_retry;
	dst->alt_port_num = src->alt_port_num;
	dst->alt_timeout = src->alt_timeout;
}

/* The path record fields both forms share, by name. */
#define PATH_REC_FIELDS(X)                                                                                      \
	X(dlid) X(slid) X(raw_traffic) X(flow_label) X(hop_limit) X(traffic_class) X(reversible) X(numb_path) \
	X(pkey) X(sl) X(mtu_selector) X(mtu) X(rate_selector) X(rate) X(packet_life_time) X(preference)      \
	X(packet_life_time_selector)
#define COPY_FIELD(f) dst->f = src->f;

SRN_EXPORT void ibv_copy_path_rec_from_kern(struct ibv_sa_path_rec *dst, struct ib_user_path_rec *src)
{
	memcpy(dst->dgid.raw, src->dgid, sizeof(dst->dgid));
	memcpy(dst->sgid.raw, src->sgid, sizeof(dst->sgid));
	PATH_REC_FIELDS(COPY_FIELD)
}

SRN_EXPORT void ibv_copy_path_rec_to_kern(struct ib_user_path_rec *dst, struct ibv_sa_path_rec *src)
{
	memcpy(dst->dgid, src->dgid.raw, sizeof(dst->dgid));
	memcpy(dst->sgid, src->sgid.raw, sizeof(dst->sgid));
	PATH_REC_FIELDS(COPY_FIELD)
}

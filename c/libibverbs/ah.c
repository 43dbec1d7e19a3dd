/*
 * Address handles are the daemon's PD objects (CREATE_AH), as ibv_create_ah
 * is the kernel's for RoCE: the daemon resolves the next hop's MAC on its
 * control path, and a UD send slot names the handle. ibv_init_ah_from_wc
 * and ibv_create_ah_from_wc build the attributes from the GRH area of a UD
 * receive, as rdma-core does.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <netinet/ip.h>
#include <stdlib.h>
#include <string.h>

#include "srn.h"

SRN_EXPORT struct ibv_ah *ibv_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *attr)
{
	/* RoCE addresses by GID: without a GRH there is no destination. */
	if (!attr->is_global || (attr->port_num != 1 && attr->port_num != 0)) {
		errno = EINVAL;
		return NULL;
	}
	union ibv_gid sgid;
	if (!srn_gid(&to_sctx(pd->context)->info, attr->grh.sgid_index, &sgid)) {
		errno = EINVAL;
		return NULL;
	}
	struct srn_ah *a = calloc(1, sizeof(*a));
	if (!a) {
		errno = ENOMEM;
		return NULL;
	}
	struct softrnic_create_ah_req req;
	memset(&req, 0, sizeof(req));
	req.pd = to_spd(pd)->handle;
	memcpy(req.av.dgid, attr->grh.dgid.raw, sizeof(req.av.dgid));
	req.av.flow_label = attr->grh.flow_label;
	req.av.sgid_index = attr->grh.sgid_index;
	req.av.hop_limit = attr->grh.hop_limit;
	req.av.traffic_class = attr->grh.traffic_class;
	req.av.sl = attr->sl;
	struct softrnic_handle_msg resp;
	int err = srn_call(&to_sctx(pd->context)->conn, SOFTRNIC_OP_CREATE_AH, &req, sizeof(req), NULL, 0, &resp,
			   sizeof(resp), NULL, 0);
	if (err) {
		free(a);
		errno = err;
		return NULL;
	}
	a->ah.context = pd->context;
	a->ah.pd = pd;
	a->ah.handle = resp.handle;
	a->handle = resp.handle;
	memcpy(a->dgid, attr->grh.dgid.raw, sizeof(a->dgid));
	return &a->ah;
}

SRN_EXPORT int ibv_destroy_ah(struct ibv_ah *ah)
{
	struct srn_ah *a = to_sah(ah);
	int err = srn_call_handle(&to_sctx(ah->context)->conn, SOFTRNIC_OP_DESTROY_AH, a->handle);
	if (err)
		return err;
	free(a);
	return 0;
}

/* The index of our GID gid, or -1. */
static int gid_index(const struct softrnic_device_info *info, const uint8_t *gid)
{
	for (uint32_t i = 0; i < info->num_gids && i < sizeof(info->gids) / sizeof(info->gids[0]); i++)
		if (!memcmp(info->gids[i], gid, 16))
			return (int)i;
	return -1;
}

static bool ipv4_header_ok(const struct iphdr *ip)
{
	if (ip->version != 4 || ip->ihl != 5)
		return false;
	const uint16_t *w = (const uint16_t *)ip;
	uint32_t sum = 0;
	for (int i = 0; i < 10; i++)
		sum += w[i];
	while (sum >> 16)
		sum = (sum & 0xffff) + (sum >> 16);
	return sum == 0xffff;
}

SRN_EXPORT int ibv_init_ah_from_wc(struct ibv_context *ctx, uint8_t port, struct ibv_wc *wc, struct ibv_grh *grh,
				   struct ibv_ah_attr *ah)
{
	struct srn_context *s = to_sctx(ctx);
	memset(ah, 0, sizeof(*ah));
	ah->port_num = port;
	ah->dlid = wc->slid;
	ah->sl = wc->sl;
	ah->src_path_bits = wc->dlid_path_bits;
	if (!(wc->wc_flags & IBV_WC_GRH)) {
		errno = EINVAL; /* RoCE: no destination without the GRH */
		return -1;
	}
	uint8_t sgid[16], dgid[16];
	/* RoCEv2 over IPv4: the IPv4 header sits in the last 20 bytes of the
	 * 40-byte GRH area; over IPv6, the area is the IPv6 header. */
	const struct iphdr *ip4 = (const struct iphdr *)((const uint8_t *)grh + 20);
	if (ipv4_header_ok(ip4)) {
		static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
		memcpy(sgid, mapped, 12);
		memcpy(sgid + 12, &ip4->saddr, 4);
		memcpy(dgid, mapped, 12);
		memcpy(dgid + 12, &ip4->daddr, 4);
		ah->grh.traffic_class = ip4->tos;
	} else if ((be32toh(grh->version_tclass_flow) >> 28) == 6) {
		memcpy(sgid, grh->sgid.raw, 16);
		memcpy(dgid, grh->dgid.raw, 16);
		uint32_t v = be32toh(grh->version_tclass_flow);
		ah->grh.traffic_class = (v >> 20) & 0xff;
		ah->grh.flow_label = v & 0xfffff;
	} else {
		errno = EINVAL;
		return -1;
	}
	int idx = gid_index(&s->info, dgid);
	if (idx < 0) {
		errno = ENOENT; /* not addressed to any of our GIDs */
		return -1;
	}
	ah->is_global = 1;
	memcpy(ah->grh.dgid.raw, sgid, 16); /* the reply goes to the sender */
	ah->grh.sgid_index = (uint8_t)idx;
	ah->grh.hop_limit = 0xff;
	return 0;
}

SRN_EXPORT struct ibv_ah *ibv_create_ah_from_wc(struct ibv_pd *pd, struct ibv_wc *wc, struct ibv_grh *grh,
						uint8_t port)
{
	struct ibv_ah_attr attr;
	if (ibv_init_ah_from_wc(pd->context, port, wc, grh, &attr))
		return NULL;
	return ibv_create_ah(pd, &attr);
}

SRN_EXPORT int ibv_resolve_eth_l2_from_gid(struct ibv_context *ctx, struct ibv_ah_attr *attr, uint8_t eth_mac[6],
					   uint16_t *vid)
{
	/* Neighbour resolution is the daemon's, in its own namespace. */
	(void)ctx, (void)attr, (void)eth_mac, (void)vid;
	errno = EOPNOTSUPP;
	return -1;
}

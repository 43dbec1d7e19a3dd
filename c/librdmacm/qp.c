/*
 * QPs, SRQs and endpoints of IDs: made through softrnic's libibverbs in
 * the application's PD (or rdma_cm's, id->pd), with CQs the library
 * creates when the application names none (rdma_create_ep users poll
 * id->send_cq and id->recv_cq), and moved to INIT (RC, UC) or RTS (UD,
 * with rdma_cm's Q_Key) as rdma-core does.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "scm.h"

void scm_destroy_cqs(struct rdma_cm_id *id)
{
	if (id->recv_cq) {
		ibv_destroy_cq(id->recv_cq);
		if (id->send_cq && id->send_cq != id->recv_cq)
			ibv_destroy_cq(id->send_cq);
	} else if (id->send_cq) {
		ibv_destroy_cq(id->send_cq);
	}
	id->recv_cq = id->send_cq = NULL;
	if (id->recv_cq_channel) {
		ibv_destroy_comp_channel(id->recv_cq_channel);
		if (id->send_cq_channel && id->send_cq_channel != id->recv_cq_channel)
			ibv_destroy_comp_channel(id->send_cq_channel);
	} else if (id->send_cq_channel) {
		ibv_destroy_comp_channel(id->send_cq_channel);
	}
	id->recv_cq_channel = id->send_cq_channel = NULL;
}

/* A CQ with its own completion channel, for what the QP lacks. */
static struct ibv_cq *make_cq(struct rdma_cm_id *id, uint32_t size, struct ibv_comp_channel **ch)
{
	*ch = ibv_create_comp_channel(id->verbs);
	if (!*ch)
		return NULL;
	return ibv_create_cq(id->verbs, (int)size, id, *ch, 0);
}

static int create_cqs(struct rdma_cm_id *id, uint32_t send_size, uint32_t recv_size)
{
	if (recv_size && !(id->recv_cq = make_cq(id, recv_size, &id->recv_cq_channel)))
		goto err;
	if (send_size && !(id->send_cq = make_cq(id, send_size, &id->send_cq_channel)))
		goto err;
	return 0;
err:;
	int err = errno;
	scm_destroy_cqs(id);
	return scm_err(err);
}

/* The QP to its first state: INIT (connected QPs; accept and
 * CONNECT_RESPONSE take it on) or RTS (UD). */
static int init_qp(struct rdma_cm_id *id, struct ibv_qp *qp)
{
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT};
	int mask, err;
	if (rdma_init_qp_attr(id, &a, &mask))
		return -1;
	if ((err = ibv_modify_qp(qp, &a, mask)))
		return scm_err(err);
	if (id->qp_type != IBV_QPT_UD)
		return 0;
	a.qp_state = IBV_QPS_RTR;
	if ((err = ibv_modify_qp(qp, &a, IBV_QP_STATE)))
		return scm_err(err);
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 0;
	if ((err = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN)))
		return scm_err(err);
	return 0;
}

SCM_EXPORT int rdma_create_qp_ex(struct rdma_cm_id *id, struct ibv_qp_init_attr_ex *attr)
{
	if (id->qp || !id->verbs)
		return scm_err(EINVAL);
	if (!(attr->comp_mask & IBV_QP_INIT_ATTR_PD) || !attr->pd) {
		attr->comp_mask |= IBV_QP_INIT_ATTR_PD;
		attr->pd = id->pd;
	} else if (attr->pd->context != id->verbs) {
		return scm_err(EINVAL);
	}
	if ((id->recv_cq && attr->recv_cq && id->recv_cq != attr->recv_cq) ||
	    (id->send_cq && attr->send_cq && id->send_cq != attr->send_cq))
		return scm_err(EINVAL);
	if (create_cqs(id, attr->send_cq || id->send_cq ? 0 : attr->cap.max_send_wr,
		       attr->recv_cq || id->recv_cq ? 0 : attr->cap.max_recv_wr))
		return -1;
	if (!attr->send_cq)
		attr->send_cq = id->send_cq;
	if (!attr->recv_cq)
		attr->recv_cq = id->recv_cq;
	if (id->srq && !attr->srq)
		attr->srq = id->srq;
	struct ibv_qp *qp = ibv_create_qp_ex(id->verbs, attr);
	if (!qp || init_qp(id, qp)) {
		int err = errno;
		if (qp)
			ibv_destroy_qp(qp);
		scm_destroy_cqs(id);
		return scm_err(err);
	}
	id->pd = qp->pd;
	id->qp = qp;
	return 0;
}

SCM_EXPORT int rdma_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_qp_init_attr *qp_init_attr)
{
	struct ibv_qp_init_attr_ex x;
	memset(&x, 0, sizeof(x));
	memcpy(&x, qp_init_attr, sizeof(*qp_init_attr));
	x.comp_mask = IBV_QP_INIT_ATTR_PD;
	x.pd = pd ? pd : id->pd;
	int ret = rdma_create_qp_ex(id, &x);
	memcpy(qp_init_attr, &x, sizeof(*qp_init_attr));
	return ret;
}

SCM_EXPORT void rdma_destroy_qp(struct rdma_cm_id *id)
{
	ibv_destroy_qp(id->qp);
	id->qp = NULL;
	scm_destroy_cqs(id);
}

SCM_EXPORT int rdma_create_srq_ex(struct rdma_cm_id *id, struct ibv_srq_init_attr_ex *attr)
{
	if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) || !id->verbs)
		return scm_err(EINVAL);
	if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_PD) || !attr->pd) {
		attr->pd = id->pd;
		attr->comp_mask |= IBV_SRQ_INIT_ATTR_PD;
	}
	if (attr->srq_type == IBV_SRQT_XRC)
		return scm_err(EOPNOTSUPP); /* no XRC domains */
	struct ibv_srq *srq = ibv_create_srq_ex(id->verbs, attr);
	if (!srq)
		return -1;
	if (!id->pd)
		id->pd = attr->pd;
	id->srq = srq;
	return 0;
}

SCM_EXPORT int rdma_create_srq(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_srq_init_attr *attr)
{
	struct ibv_srq_init_attr_ex x;
	memset(&x, 0, sizeof(x));
	memcpy(&x, attr, sizeof(*attr));
	x.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD;
	x.srq_type = id->qp_type == IBV_QPT_XRC_RECV ? IBV_SRQT_XRC : IBV_SRQT_BASIC;
	x.pd = pd;
	int ret = rdma_create_srq_ex(id, &x);
	memcpy(attr, &x, sizeof(*attr));
	return ret;
}

SCM_EXPORT void rdma_destroy_srq(struct rdma_cm_id *id)
{
	ibv_destroy_srq(id->srq);
	id->srq = NULL;
	scm_destroy_cqs(id);
}

/* ---- endpoints: an ID resolved (or bound) synchronously, with its QP ---- */

SCM_EXPORT void rdma_destroy_ep(struct rdma_cm_id *id)
{
	if (id->qp)
		rdma_destroy_qp(id);
	if (id->srq)
		rdma_destroy_srq(id);
	rdma_destroy_id(id);
}

static int passive_ep(struct rdma_cm_id *id, struct rdma_addrinfo *res, struct ibv_pd *pd,
		      struct ibv_qp_init_attr *qp_init_attr)
{
	struct scm_id *s = to_sid(id);
	if (rdma_bind_addr(id, res->ai_src_addr))
		return -1;
	if (pd)
		id->pd = pd;
	if (qp_init_attr) {
		s->qp_init_attr = malloc(sizeof(*qp_init_attr));
		if (!s->qp_init_attr)
			return scm_err(ENOMEM);
		*s->qp_init_attr = *qp_init_attr;
		s->qp_init_attr->qp_type = res->ai_qp_type;
	}
	return 0;
}

SCM_EXPORT int rdma_create_ep(struct rdma_cm_id **id, struct rdma_addrinfo *res, struct ibv_pd *pd,
			      struct ibv_qp_init_attr *qp_init_attr)
{
	if (scm_init())
		return -1;
	struct scm_id *s = scm_id_alloc(NULL, NULL, res->ai_port_space, res->ai_qp_type);
	if (!s)
		return -1;
	struct rdma_cm_id *cm = &s->id;
	int ret;
	if (res->ai_flags & RAI_PASSIVE) {
		ret = passive_ep(cm, res, pd, qp_init_attr);
		if (ret)
			goto err;
		*id = cm;
		return 0;
	}
	ret = rdma_resolve_addr(cm, res->ai_src_addr, res->ai_dst_addr, 2000);
	if (ret)
		goto err;
	if (res->ai_route_len) {
		ret = rdma_set_option(cm, RDMA_OPTION_IB, RDMA_OPTION_IB_PATH, res->ai_route, res->ai_route_len);
		if (!ret)
			ret = scm_complete(s);
	} else {
		ret = rdma_resolve_route(cm, 2000);
	}
	if (ret)
		goto err;
	if (qp_init_attr) {
		qp_init_attr->qp_type = res->ai_qp_type;
		ret = rdma_create_qp(cm, pd, qp_init_attr);
		if (ret)
			goto err;
	}
	if (res->ai_connect_len) {
		s->connect_data = malloc(res->ai_connect_len);
		if (!s->connect_data) {
			ret = scm_err(ENOMEM);
			goto err;
		}
		memcpy(s->connect_data, res->ai_connect, res->ai_connect_len);
		s->connect_len = res->ai_connect_len;
	}
	*id = cm;
	return 0;
err:;
	int err = errno;
	rdma_destroy_ep(cm);
	return scm_err(err);
}

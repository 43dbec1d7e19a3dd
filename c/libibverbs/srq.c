/*
 * Shared receive queues: the daemon's SRQ ring (struct softrnic_recv_slot
 * + SGEs, as a QP's RQ), posted into by ibv_post_srq_recv without a
 * syscall, and the control verbs as messages. Basic SRQs only: XRC and
 * tag-matching SRQs (ibv_create_srq_ex with those types) fail with
 * EOPNOTSUPP, as on a provider without them; resizing (IBV_SRQ_MAX_WR)
 * with EINVAL, as on mlx5, and the device does not report
 * IBV_DEVICE_SRQ_RESIZE.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "srn.h"

static uint32_t srq_slot_size(uint32_t max_sge)
{
	return SOFTRNIC_RECV_SLOT_HEADER + max_sge * SOFTRNIC_SGE_SIZE;
}

static struct ibv_srq *srq_create(struct ibv_pd *pd, void *srq_context, struct ibv_srq_attr *attr)
{
	struct srn_context *s = to_sctx(pd->context);
	const struct softrnic_ib_device_attr *da = &s->info.device_attr;
	/* As rxe: no WRs, or more than the device has, is invalid; no SGE
	 * means one. srq_limit cannot be armed at creation (IBA): it is
	 * ignored, and ibv_modify_srq arms it. */
	if (attr->max_wr == 0 || attr->max_wr > da->max_srqwr || attr->max_sge > da->max_sge) {
		errno = EINVAL;
		return NULL;
	}
	struct srn_srq *x = calloc(1, sizeof(*x));
	if (!x) {
		errno = ENOMEM;
		return NULL;
	}
	struct softrnic_create_srq_req req = {.pd = to_spd(pd)->handle, .max_wr = attr->max_wr,
					      .max_sge = attr->max_sge ? attr->max_sge : 1};
	struct softrnic_create_srq_resp resp;
	int fd;
	int err = srn_call(&s->conn, SOFTRNIC_OP_CREATE_SRQ, &req, sizeof(req), NULL, 0, &resp, sizeof(resp), &fd, 1);
	if (err) {
		free(x);
		errno = err;
		return NULL;
	}
	if (resp.max_wr < req.max_wr || resp.max_sge < req.max_sge || resp.max_sge > 255)
		err = EPROTO;
	if (err)
		close(fd);
	else
		err = srn_ring_map(&x->ring, fd, srq_slot_size(resp.max_sge), resp.slots);
	if (err) {
		srn_call_handle(&s->conn, SOFTRNIC_OP_DESTROY_SRQ, resp.srq);
		free(x);
		errno = err;
		return NULL;
	}
	x->handle = resp.srq;
	x->max_wr = resp.max_wr;
	x->max_sge = resp.max_sge;
	srn_producer_init(&x->prod, &x->ring, s->pump_db);
	pthread_spin_init(&x->lock, PTHREAD_PROCESS_PRIVATE);
	x->srq.context = pd->context;
	x->srq.srq_context = srq_context;
	x->srq.pd = pd;
	x->srq.handle = resp.srq;
	pthread_mutex_init(&x->srq.mutex, NULL);
	pthread_cond_init(&x->srq.cond, NULL);
	srn_obj_add(s, &x->obj, SRN_OBJ_SRQ, resp.srq);
	attr->max_wr = resp.max_wr;
	attr->max_sge = resp.max_sge;
	attr->srq_limit = 0;
	return &x->srq;
}

SRN_EXPORT struct ibv_srq *ibv_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *attr)
{
	return srq_create(pd, attr->srq_context, &attr->attr);
}

/* verbs_context's create_srq_ex, for what the inline ibv_create_srq_ex
 * does not send to ibv_create_srq. */
struct ibv_srq *srn_create_srq_ex(struct ibv_context *ctx, struct ibv_srq_init_attr_ex *a)
{
	if (a->comp_mask & ~(uint32_t)(IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_CQ)) {
		errno = EOPNOTSUPP; /* XRC domains, tag matching */
		return NULL;
	}
	if ((a->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) && a->srq_type != IBV_SRQT_BASIC) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	if (!(a->comp_mask & IBV_SRQ_INIT_ATTR_PD) || !a->pd || a->pd->context != ctx) {
		errno = EINVAL;
		return NULL;
	}
	/* A CQ is an attribute of XRC and tag-matching SRQs only. */
	return srq_create(a->pd, a->srq_context, &a->attr);
}

SRN_EXPORT int ibv_modify_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr, int mask)
{
	struct srn_srq *x = to_ssrq(srq);
	struct softrnic_modify_srq_req req = {.srq = x->handle};
	if (mask & ~(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT))
		return EINVAL;
	if (mask & IBV_SRQ_MAX_WR)
		req.mask |= SOFTRNIC_IB_SRQ_ATTR_MASK_MAX_WR;
	if (mask & IBV_SRQ_LIMIT)
		req.mask |= SOFTRNIC_IB_SRQ_ATTR_MASK_LIMIT;
	req.attr.max_wr = attr->max_wr;
	req.attr.max_sge = attr->max_sge;
	req.attr.limit = attr->srq_limit;
	return srn_call(&to_sctx(srq->context)->conn, SOFTRNIC_OP_MODIFY_SRQ, &req, sizeof(req), NULL, 0, NULL, 0,
			NULL, 0);
}

SRN_EXPORT int ibv_query_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr)
{
	struct srn_srq *x = to_ssrq(srq);
	struct softrnic_handle_msg req = {.handle = x->handle};
	struct softrnic_ib_srq_attr a;
	int err = srn_call(&to_sctx(srq->context)->conn, SOFTRNIC_OP_QUERY_SRQ, &req, sizeof(req), NULL, 0, &a,
			   sizeof(a), NULL, 0);
	if (err)
		return err;
	attr->max_wr = a.max_wr;
	attr->max_sge = a.max_sge;
	attr->srq_limit = a.limit;
	return 0;
}

SRN_EXPORT int ibv_destroy_srq(struct ibv_srq *srq)
{
	struct srn_srq *x = to_ssrq(srq);
	struct srn_context *s = to_sctx(srq->context);
	int err = srn_call_handle(&s->conn, SOFTRNIC_OP_DESTROY_SRQ, x->handle);
	if (err)
		return err; /* EBUSY while QPs use it */
	/* As rdma-core: the events handed out must have been acknowledged. */
	srn_obj_remove(s, &x->obj);
	pthread_mutex_lock(&srq->mutex);
	while (srq->events_completed != x->obj.events_delivered)
		pthread_cond_wait(&srq->cond, &srq->mutex);
	pthread_mutex_unlock(&srq->mutex);
	srn_ring_unmap(&x->ring);
	pthread_spin_destroy(&x->lock);
	pthread_mutex_destroy(&srq->mutex);
	pthread_cond_destroy(&srq->cond);
	free(x);
	return 0;
}

int srn_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	struct srn_srq *x = to_ssrq(srq);
	int err = 0;
	pthread_spin_lock(&x->lock);
	for (; wr; wr = wr->next) {
		if (wr->num_sge < 0 || (uint32_t)wr->num_sge > x->max_sge) {
			err = EINVAL;
			break;
		}
		uint8_t *slot = srn_reserve(&x->prod);
		if (!slot) {
			err = ENOMEM; /* the SRQ is full */
			break;
		}
		srn_put_recv(slot, wr);
	}
	srn_commit(&x->prod);
	pthread_spin_unlock(&x->lock);
	if (err)
		*bad = wr;
	return err;
}

/*
 * Queue pairs: creation with the daemon's SQ and RQ rings, and ibv_qp_attr
 * + mask passed through to the daemon, which checks the IBA transitions and
 * their attributes. The library checks only what the protocol cannot carry.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "srn.h"

static uint32_t send_slot_size(const struct softrnic_ib_qp_caps *c)
{
	uint32_t n = c->max_send_sge * SOFTRNIC_SGE_SIZE;
	if (c->max_inline > n)
		n = c->max_inline;
	return (SOFTRNIC_SEND_SLOT_HEADER + n + 7) & ~7u;
}

static uint32_t recv_slot_size(const struct softrnic_ib_qp_caps *c)
{
	return SOFTRNIC_RECV_SLOT_HEADER + c->max_recv_sge * SOFTRNIC_SGE_SIZE;
}

static bool qp_type(enum ibv_qp_type t, uint8_t *out)
{
	switch (t) {
	case IBV_QPT_RC: *out = SOFTRNIC_IB_QP_TYPE_RC; return true;
	case IBV_QPT_UC: *out = SOFTRNIC_IB_QP_TYPE_UC; return true;
	case IBV_QPT_UD: *out = SOFTRNIC_IB_QP_TYPE_UD; return true;
	default: return false;
	}
}

static struct ibv_qp *qp_create(struct ibv_pd *pd, struct ibv_qp_init_attr *a)
{
	struct srn_context *s = to_sctx(pd->context);
	struct softrnic_create_qp_req req = {0};
	if (!qp_type(a->qp_type, &req.type)) {
		errno = EOPNOTSUPP; /* XRC, raw packet, driver QPs */
		return NULL;
	}
	/* With an SRQ, the receive caps are not looked at. */
	bool srq = a->srq != NULL;
	if (!a->send_cq || !a->recv_cq || a->send_cq->context != pd->context || a->recv_cq->context != pd->context ||
	    (srq && a->srq->context != pd->context) || a->cap.max_send_wr > s->info.device_attr.max_qpwr ||
	    (!srq && a->cap.max_recv_wr > s->info.device_attr.max_qpwr) || a->cap.max_send_sge > s->info.device_attr.max_sge ||
	    (!srq && a->cap.max_recv_sge > s->info.device_attr.max_sge) || a->cap.max_inline_data > s->info.device_attr.max_inline) {
		errno = EINVAL;
		return NULL;
	}
	struct srn_qp *q = calloc(1, sizeof(*q));
	if (!q) {
		errno = ENOMEM;
		return NULL;
	}
	req.pd = to_spd(pd)->handle;
	req.send_cq = to_scq(a->send_cq)->handle;
	req.recv_cq = to_scq(a->recv_cq)->handle;
	req.sig_all = a->sq_sig_all ? 1 : 0;
	req.caps.max_send_wr = a->cap.max_send_wr;
	req.caps.max_recv_wr = a->cap.max_recv_wr;
	req.caps.max_send_sge = a->cap.max_send_sge;
	req.caps.max_recv_sge = a->cap.max_recv_sge;
	req.caps.max_inline = a->cap.max_inline_data;
	if (srq)
		req.srq = to_ssrq(a->srq)->handle;
	struct softrnic_create_qp_resp resp;
	int fds[2];
	int err = srn_call(&s->conn, SOFTRNIC_OP_CREATE_QP, &req, sizeof(req), NULL, 0, &resp, sizeof(resp), fds, 2);
	if (err) {
		free(q);
		errno = err;
		return NULL;
	}
	q->handle = resp.qp;
	q->caps = resp.caps;
	q->sig_all = a->sq_sig_all != 0;
	err = srn_ring_map(&q->sq, fds[0], send_slot_size(&resp.caps), resp.sq_slots);
	if (err)
		close(fds[1]);
	else if ((err = srn_ring_map(&q->rq, fds[1], recv_slot_size(&resp.caps), resp.rq_slots)))
		srn_ring_unmap(&q->sq);
	if (err) {
		srn_call_handle(&s->conn, SOFTRNIC_OP_DESTROY_QP, resp.qp);
		free(q);
		errno = err;
		return NULL;
	}
	srn_producer_init(&q->sqp, &q->sq, s->pump_db);
	srn_producer_init(&q->rqp, &q->rq, s->pump_db);
	pthread_spin_init(&q->slock, PTHREAD_PROCESS_PRIVATE);
	pthread_spin_init(&q->rlock, PTHREAD_PROCESS_PRIVATE);

	struct ibv_qp *qp = &q->qpx.qp_base;
	qp->context = pd->context;
	qp->qp_context = a->qp_context;
	qp->pd = pd;
	qp->send_cq = a->send_cq;
	qp->recv_cq = a->recv_cq;
	qp->srq = a->srq;
	qp->handle = resp.qp;
	qp->qp_num = resp.qpn;
	qp->state = IBV_QPS_RESET;
	qp->qp_type = a->qp_type;
	pthread_mutex_init(&qp->mutex, NULL);
	pthread_cond_init(&qp->cond, NULL);
	srn_qp_ex_init(q);
	srn_obj_add(s, &q->obj, SRN_OBJ_QP, resp.qp);
	/* What was granted, as ibv_create_qp reports it (no receive queue of
	 * its own on an SRQ). */
	a->cap.max_send_wr = resp.caps.max_send_wr;
	a->cap.max_recv_wr = srq ? 0 : resp.caps.max_recv_wr;
	a->cap.max_send_sge = resp.caps.max_send_sge;
	a->cap.max_recv_sge = srq ? 0 : resp.caps.max_recv_sge;
	a->cap.max_inline_data = resp.caps.max_inline;
	return qp;
}

SRN_EXPORT struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
	return qp_create(pd, attr);
}

/* The ibv_wr_* operations the daemon can carry. */
#define SRN_SEND_OPS                                                                                       \
	(IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_SEND |          \
	 IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | \
	 IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_SEND_WITH_INV)

struct ibv_qp *srn_create_qp_ex(struct ibv_context *ctx, struct ibv_qp_init_attr_ex *a)
{
	if (a->comp_mask & ~(uint32_t)(IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS)) {
		errno = EOPNOTSUPP; /* XRC domains, TSO, RSS, create flags */
		return NULL;
	}
	if (!(a->comp_mask & IBV_QP_INIT_ATTR_PD) || !a->pd || a->pd->context != ctx) {
		errno = EINVAL;
		return NULL;
	}
	if ((a->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) && (a->send_ops_flags & ~(uint64_t)SRN_SEND_OPS)) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	struct ibv_qp_init_attr b = {.qp_context = a->qp_context, .send_cq = a->send_cq, .recv_cq = a->recv_cq,
				     .srq = a->srq, .cap = a->cap, .qp_type = a->qp_type, .sq_sig_all = a->sq_sig_all};
	struct ibv_qp *qp = qp_create(a->pd, &b);
	if (qp)
		a->cap = b.cap;
	return qp;
}

SRN_EXPORT struct ibv_qp_ex *ibv_qp_to_qp_ex(struct ibv_qp *qp)
{
	return &to_sqp(qp)->qpx;
}

/* Mask bits with their protocol equivalents. */
static const struct {
	int ibv;
	uint32_t proto;
} mask_map[] = {
	{IBV_QP_STATE, SOFTRNIC_IB_QP_ATTR_MASK_STATE},
	{IBV_QP_ACCESS_FLAGS, SOFTRNIC_IB_QP_ATTR_MASK_ACCESS_FLAGS},
	{IBV_QP_PKEY_INDEX, SOFTRNIC_IB_QP_ATTR_MASK_P_KEY_INDEX},
	{IBV_QP_PORT, SOFTRNIC_IB_QP_ATTR_MASK_PORT},
	{IBV_QP_QKEY, SOFTRNIC_IB_QP_ATTR_MASK_Q_KEY},
	{IBV_QP_AV, SOFTRNIC_IB_QP_ATTR_MASK_AV},
	{IBV_QP_PATH_MTU, SOFTRNIC_IB_QP_ATTR_MASK_PATH_MTU},
	{IBV_QP_TIMEOUT, SOFTRNIC_IB_QP_ATTR_MASK_TIMEOUT},
	{IBV_QP_RETRY_CNT, SOFTRNIC_IB_QP_ATTR_MASK_RETRY_CNT},
	{IBV_QP_RNR_RETRY, SOFTRNIC_IB_QP_ATTR_MASK_RNR_RETRY},
	{IBV_QP_RQ_PSN, SOFTRNIC_IB_QP_ATTR_MASK_RQPSN},
	{IBV_QP_MAX_QP_RD_ATOMIC, SOFTRNIC_IB_QP_ATTR_MASK_MAX_QP_RD_ATOMIC},
	{IBV_QP_MIN_RNR_TIMER, SOFTRNIC_IB_QP_ATTR_MASK_MIN_RNR_TIMER},
	{IBV_QP_SQ_PSN, SOFTRNIC_IB_QP_ATTR_MASK_SQPSN},
	{IBV_QP_MAX_DEST_RD_ATOMIC, SOFTRNIC_IB_QP_ATTR_MASK_MAX_DEST_RD_ATOMIC},
	{IBV_QP_DEST_QPN, SOFTRNIC_IB_QP_ATTR_MASK_DEST_QPN},
	{IBV_QP_EN_SQD_ASYNC_NOTIFY, SOFTRNIC_IB_QP_ATTR_MASK_EN_SQD_ASYNC_NOTIFY},
};

static bool state_to_proto(enum ibv_qp_state s, uint8_t *out)
{
	switch (s) {
	case IBV_QPS_RESET: *out = SOFTRNIC_IB_QP_STATE_RESET; return true;
	case IBV_QPS_INIT: *out = SOFTRNIC_IB_QP_STATE_INIT; return true;
	case IBV_QPS_RTR: *out = SOFTRNIC_IB_QP_STATE_RTR; return true;
	case IBV_QPS_RTS: *out = SOFTRNIC_IB_QP_STATE_RTS; return true;
	case IBV_QPS_SQD: *out = SOFTRNIC_IB_QP_STATE_SQD; return true;
	case IBV_QPS_SQE: *out = SOFTRNIC_IB_QP_STATE_SQE; return true;
	case IBV_QPS_ERR: *out = SOFTRNIC_IB_QP_STATE_ERR; return true;
	default: return false;
	}
}

static enum ibv_qp_state state_from_proto(uint8_t s)
{
	switch (s) {
	case SOFTRNIC_IB_QP_STATE_RESET: return IBV_QPS_RESET;
	case SOFTRNIC_IB_QP_STATE_INIT: return IBV_QPS_INIT;
	case SOFTRNIC_IB_QP_STATE_RTR: return IBV_QPS_RTR;
	case SOFTRNIC_IB_QP_STATE_RTS: return IBV_QPS_RTS;
	case SOFTRNIC_IB_QP_STATE_SQD: return IBV_QPS_SQD;
	case SOFTRNIC_IB_QP_STATE_SQE: return IBV_QPS_SQE;
	default: return IBV_QPS_ERR;
	}
}

static uint32_t access_to_proto(unsigned int a)
{
	uint32_t r = 0;
	if (a & IBV_ACCESS_LOCAL_WRITE)
		r |= SOFTRNIC_IB_ACCESS_LOCAL_WRITE;
	if (a & IBV_ACCESS_REMOTE_WRITE)
		r |= SOFTRNIC_IB_ACCESS_REMOTE_WRITE;
	if (a & IBV_ACCESS_REMOTE_READ)
		r |= SOFTRNIC_IB_ACCESS_REMOTE_READ;
	if (a & IBV_ACCESS_REMOTE_ATOMIC)
		r |= SOFTRNIC_IB_ACCESS_REMOTE_ATOMIC;
	return r;
}

static unsigned int access_from_proto(uint32_t a)
{
	unsigned int r = 0;
	if (a & SOFTRNIC_IB_ACCESS_LOCAL_WRITE)
		r |= IBV_ACCESS_LOCAL_WRITE;
	if (a & SOFTRNIC_IB_ACCESS_REMOTE_WRITE)
		r |= IBV_ACCESS_REMOTE_WRITE;
	if (a & SOFTRNIC_IB_ACCESS_REMOTE_READ)
		r |= IBV_ACCESS_REMOTE_READ;
	if (a & SOFTRNIC_IB_ACCESS_REMOTE_ATOMIC)
		r |= IBV_ACCESS_REMOTE_ATOMIC;
	return r;
}

SRN_EXPORT int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask)
{
	struct srn_qp *q = to_sqp(qp);
	struct softrnic_modify_qp_req req = {.qp = q->handle};
	struct softrnic_ib_qp_attr *p = &req.attr;
	int rest = mask;
	for (size_t i = 0; i < sizeof(mask_map) / sizeof(mask_map[0]); i++) {
		if (mask & mask_map[i].ibv) {
			req.mask |= mask_map[i].proto;
			rest &= ~mask_map[i].ibv;
		}
	}
	/* The current state, if given, must be the one the QP is in. */
	if (rest & IBV_QP_CUR_STATE) {
		if (attr->cur_qp_state != qp->state)
			return EINVAL;
		rest &= ~IBV_QP_CUR_STATE;
	}
	if (rest) /* alternate paths, SQD notification, path migration, rate limits */
		return EOPNOTSUPP;
	if ((mask & IBV_QP_STATE) && !state_to_proto(attr->qp_state, &p->state))
		return EINVAL;
	if ((mask & IBV_QP_PORT) && attr->port_num != 1)
		return EINVAL;
	p->port = attr->port_num;
	if (mask & IBV_QP_PATH_MTU) {
		p->path_mtu = srn_mtu_bytes(attr->path_mtu);
		if (!p->path_mtu)
			return EINVAL;
	}
	if (mask & IBV_QP_AV) {
		const struct ibv_ah_attr *ah = &attr->ah_attr;
		if (!ah->is_global || ah->port_num > 1)
			return EINVAL; /* RoCE addresses by GID: a GRH is required */
		memcpy(p->av.dgid, ah->grh.dgid.raw, sizeof(p->av.dgid));
		p->av.sgid_index = ah->grh.sgid_index;
		p->av.hop_limit = ah->grh.hop_limit;
		p->av.traffic_class = ah->grh.traffic_class;
		p->av.flow_label = ah->grh.flow_label;
		p->av.sl = ah->sl;
	}
	p->timeout = attr->timeout;
	p->retry_cnt = attr->retry_cnt;
	p->rnr_retry = attr->rnr_retry;
	p->min_rnr_timer = attr->min_rnr_timer;
	p->max_rd_atomic = attr->max_rd_atomic;
	p->max_dest_rd_atomic = attr->max_dest_rd_atomic;
	p->q_key = attr->qkey;
	p->rqpsn = attr->rq_psn;
	p->sqpsn = attr->sq_psn;
	p->dest_qpn = attr->dest_qp_num;
	p->access = access_to_proto(attr->qp_access_flags);
	p->p_key_index = attr->pkey_index;
	p->sq_drain_notify = attr->en_sqd_async_notify ? 1 : 0;
	int err = srn_call(&to_sctx(qp->context)->conn, SOFTRNIC_OP_MODIFY_QP, &req, sizeof(req), NULL, 0, NULL, 0,
			   NULL, 0);
	if (err)
		return err;
	if (mask & IBV_QP_STATE)
		__atomic_store_n(&qp->state, attr->qp_state, __ATOMIC_RELEASE);
	return 0;
}

SRN_EXPORT int ibv_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask, struct ibv_qp_init_attr *init)
{
	(void)mask; /* every attribute is returned, as providers do */
	struct srn_qp *q = to_sqp(qp);
	struct softrnic_handle_msg req = {.handle = q->handle};
	struct softrnic_ib_qp_attr p;
	int err = srn_call(&to_sctx(qp->context)->conn, SOFTRNIC_OP_QUERY_QP, &req, sizeof(req), NULL, 0, &p,
			   sizeof(p), NULL, 0);
	if (err)
		return err;
	memset(attr, 0, sizeof(*attr));
	attr->qp_state = state_from_proto(p.state);
	attr->cur_qp_state = attr->qp_state;
	attr->path_mtu = srn_mtu_enum(p.path_mtu);
	attr->path_mig_state = IBV_MIG_MIGRATED;
	attr->qkey = p.q_key;
	attr->rq_psn = p.rqpsn;
	attr->sq_psn = p.sqpsn;
	attr->dest_qp_num = p.dest_qpn;
	attr->qp_access_flags = access_from_proto(p.access);
	attr->cap.max_send_wr = q->caps.max_send_wr;
	attr->cap.max_recv_wr = qp->srq ? 0 : q->caps.max_recv_wr;
	attr->cap.max_send_sge = q->caps.max_send_sge;
	attr->cap.max_recv_sge = qp->srq ? 0 : q->caps.max_recv_sge;
	attr->cap.max_inline_data = q->caps.max_inline;
	static const uint8_t zero[16];
	if (memcmp(p.av.dgid, zero, sizeof(zero))) {
		attr->ah_attr.is_global = 1;
		memcpy(attr->ah_attr.grh.dgid.raw, p.av.dgid, sizeof(p.av.dgid));
		attr->ah_attr.grh.sgid_index = p.av.sgid_index;
		attr->ah_attr.grh.hop_limit = p.av.hop_limit;
		attr->ah_attr.grh.traffic_class = p.av.traffic_class;
		attr->ah_attr.grh.flow_label = p.av.flow_label;
		attr->ah_attr.sl = p.av.sl;
	}
	attr->ah_attr.port_num = 1;
	attr->pkey_index = p.p_key_index;
	attr->timeout = p.timeout;
	attr->retry_cnt = p.retry_cnt;
	attr->rnr_retry = p.rnr_retry;
	attr->min_rnr_timer = p.min_rnr_timer;
	attr->max_rd_atomic = p.max_rd_atomic;
	attr->max_dest_rd_atomic = p.max_dest_rd_atomic;
	attr->port_num = 1;
	__atomic_store_n(&qp->state, attr->qp_state, __ATOMIC_RELEASE);
	if (init) {
		memset(init, 0, sizeof(*init));
		init->qp_context = qp->qp_context;
		init->send_cq = qp->send_cq;
		init->recv_cq = qp->recv_cq;
		init->srq = qp->srq;
		init->cap = attr->cap;
		init->qp_type = qp->qp_type;
		init->sq_sig_all = q->sig_all;
	}
	return 0;
}

SRN_EXPORT int ibv_destroy_qp(struct ibv_qp *qp)
{
	struct srn_qp *q = to_sqp(qp);
	struct srn_context *s = to_sctx(qp->context);
	int err = srn_call_handle(&s->conn, SOFTRNIC_OP_DESTROY_QP, q->handle);
	if (err)
		return err;
	/* As rdma-core: the events handed out must have been acknowledged. */
	srn_obj_remove(s, &q->obj);
	pthread_mutex_lock(&qp->mutex);
	while (qp->events_completed != q->obj.events_delivered)
		pthread_cond_wait(&qp->cond, &qp->mutex);
	pthread_mutex_unlock(&qp->mutex);
	srn_ring_unmap(&q->sq);
	srn_ring_unmap(&q->rq);
	pthread_spin_destroy(&q->slock);
	pthread_spin_destroy(&q->rlock);
	pthread_mutex_destroy(&qp->mutex);
	pthread_cond_destroy(&qp->cond);
	free(q);
	return 0;
}

SRN_EXPORT int ibv_query_qp_data_in_order(struct ibv_qp *qp, enum ibv_wr_opcode op, uint32_t flags)
{
	(void)qp, (void)op, (void)flags;
	return 0; /* no ordering guarantee is promised */
}

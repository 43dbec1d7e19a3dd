/*
 * Posting work requests: ibv_post_send/ibv_post_recv and the ibv_wr_* API
 * of ibv_qp_ex both write straight into the QP's SQ/RQ ring slots (struct
 * softrnic_send_slot, _send_slot_ud, _recv_slot + SGEs or inline data) and
 * publish a batch with one index store; the daemon's doorbell is written
 * only if it sleeps. The daemon checks every slot again (lkeys, lengths,
 * opcodes for the QP type); the library refuses at post time what
 * rdma-core's providers refuse there, with their errno.
 */
#define _GNU_SOURCE
#include <endian.h>
#include <errno.h>
#include <string.h>

#include "srn.h"

static bool send_opcode(enum ibv_wr_opcode op, uint8_t *out)
{
	switch (op) {
	case IBV_WR_SEND: *out = SOFTRNIC_IB_WR_OPCODE_SEND; return true;
	case IBV_WR_SEND_WITH_IMM: *out = SOFTRNIC_IB_WR_OPCODE_SEND_WITH_IMM; return true;
	case IBV_WR_SEND_WITH_INV: *out = SOFTRNIC_IB_WR_OPCODE_SEND_WITH_INV; return true;
	case IBV_WR_RDMA_WRITE: *out = SOFTRNIC_IB_WR_OPCODE_RDMA_WRITE; return true;
	case IBV_WR_RDMA_WRITE_WITH_IMM: *out = SOFTRNIC_IB_WR_OPCODE_RDMA_WRITE_WITH_IMM; return true;
	case IBV_WR_RDMA_READ: *out = SOFTRNIC_IB_WR_OPCODE_RDMA_READ; return true;
	case IBV_WR_ATOMIC_CMP_AND_SWP: *out = SOFTRNIC_IB_WR_OPCODE_ATOMIC_CMP_AND_SWP; return true;
	case IBV_WR_ATOMIC_FETCH_AND_ADD: *out = SOFTRNIC_IB_WR_OPCODE_ATOMIC_FETCH_AND_ADD; return true;
	default: return false; /* memory windows, local invalidate, TSO, flush, atomic write */
	}
}

/* Whether the QP type carries the operation (IBA 10.7.2.x). */
static bool op_allowed(enum ibv_qp_type t, uint8_t op)
{
	bool send = op == SOFTRNIC_IB_WR_OPCODE_SEND || op == SOFTRNIC_IB_WR_OPCODE_SEND_WITH_IMM;
	bool write = op == SOFTRNIC_IB_WR_OPCODE_RDMA_WRITE || op == SOFTRNIC_IB_WR_OPCODE_RDMA_WRITE_WITH_IMM;
	switch (t) {
	case IBV_QPT_UD: return send;
	case IBV_QPT_UC: return send || write;
	default: return true;
	}
}

static bool send_flags(unsigned int f, uint8_t *out)
{
	if (f & ~(unsigned int)(IBV_SEND_FENCE | IBV_SEND_SIGNALED | IBV_SEND_SOLICITED | IBV_SEND_INLINE))
		return false; /* checksum offload is for raw packet QPs */
	uint8_t r = 0;
	if (f & IBV_SEND_FENCE)
		r |= SOFTRNIC_IB_SEND_FLAGS_FENCE;
	if (f & IBV_SEND_SIGNALED)
		r |= SOFTRNIC_IB_SEND_FLAGS_SIGNALED;
	if (f & IBV_SEND_SOLICITED)
		r |= SOFTRNIC_IB_SEND_FLAGS_SOLICITED;
	if (f & IBV_SEND_INLINE)
		r |= SOFTRNIC_IB_SEND_FLAGS_INLINE;
	*out = r;
	return true;
}

static bool can_send(const struct ibv_qp *qp)
{
	enum ibv_qp_state s = __atomic_load_n(&qp->state, __ATOMIC_ACQUIRE);
	/* Before RTS a send queue does not take work; in error it takes it
	 * and the daemon flushes it, as hardware does. */
	return s == IBV_QPS_RTS || s == IBV_QPS_SQD || s == IBV_QPS_SQE || s == IBV_QPS_ERR;
}

/* The header every send slot starts with; the UD form differs only in
 * bytes the caller fills after. */
static struct softrnic_send_slot *slot_hdr(uint8_t *slot)
{
	return (struct softrnic_send_slot *)slot;
}

static uint8_t *slot_data(uint8_t *slot)
{
	return slot + SOFTRNIC_SEND_SLOT_HEADER;
}

static void put_sges(uint8_t *dst, const struct ibv_sge *sg, int n)
{
	for (int i = 0; i < n; i++) {
		struct softrnic_ib_sge e = {.addr = sg[i].addr, .length = sg[i].length, .l_key = sg[i].lkey};
		memcpy(dst + (size_t)i * SOFTRNIC_SGE_SIZE, &e, sizeof(e));
	}
}

static void set_ud(struct srn_qp *q, uint8_t *slot, struct ibv_ah *ah, uint32_t qpn, uint32_t qkey)
{
	(void)q;
	struct softrnic_send_slot_ud *u = (struct softrnic_send_slot_ud *)slot;
	u->remote_qpn = qpn;
	u->q_key = qkey;
	u->ah = to_sah(ah)->handle;
}

/* Fills one slot from a classic ibv_send_wr. */
static int put_send_wr(struct srn_qp *q, uint8_t *slot, const struct ibv_send_wr *wr)
{
	struct ibv_qp *qp = &q->qpx.qp_base;
	struct softrnic_send_slot *h = slot_hdr(slot);
	uint8_t op, fl;
	if (!send_opcode(wr->opcode, &op) || !op_allowed(qp->qp_type, op) || !send_flags(wr->send_flags, &fl) ||
	    wr->num_sge < 0)
		return EINVAL;
	memset(h, 0, sizeof(*h));
	h->id = wr->wr_id;
	h->opcode = op;
	h->flags = fl;
	if (op == SOFTRNIC_IB_WR_OPCODE_SEND_WITH_IMM || op == SOFTRNIC_IB_WR_OPCODE_RDMA_WRITE_WITH_IMM)
		h->imm = be32toh(wr->imm_data); /* the ring carries the wire's value */
	else if (op == SOFTRNIC_IB_WR_OPCODE_SEND_WITH_INV)
		h->imm = wr->invalidate_rkey;
	if (qp->qp_type == IBV_QPT_UD) {
		if (!wr->wr.ud.ah)
			return EINVAL;
		set_ud(q, slot, wr->wr.ud.ah, wr->wr.ud.remote_qpn, wr->wr.ud.remote_qkey);
	} else if (op == SOFTRNIC_IB_WR_OPCODE_ATOMIC_CMP_AND_SWP || op == SOFTRNIC_IB_WR_OPCODE_ATOMIC_FETCH_AND_ADD) {
		h->remote_addr = wr->wr.atomic.remote_addr;
		h->r_key = wr->wr.atomic.rkey;
		h->compare_add = wr->wr.atomic.compare_add;
		if (op == SOFTRNIC_IB_WR_OPCODE_ATOMIC_CMP_AND_SWP)
			h->swap = wr->wr.atomic.swap;
	} else {
		h->remote_addr = wr->wr.rdma.remote_addr;
		h->r_key = wr->wr.rdma.rkey;
	}
	if (fl & SOFTRNIC_IB_SEND_FLAGS_INLINE) {
		/* The data is copied now; the lkeys are not looked at. */
		if (op == SOFTRNIC_IB_WR_OPCODE_RDMA_READ || op == SOFTRNIC_IB_WR_OPCODE_ATOMIC_CMP_AND_SWP ||
		    op == SOFTRNIC_IB_WR_OPCODE_ATOMIC_FETCH_AND_ADD)
			return EINVAL;
		size_t n = 0;
		for (int i = 0; i < wr->num_sge; i++) {
			if (wr->sg_list[i].length > q->caps.max_inline - n)
				return EINVAL;
			memcpy(slot_data(slot) + n, (const void *)(uintptr_t)wr->sg_list[i].addr, wr->sg_list[i].length);
			n += wr->sg_list[i].length;
		}
		h->inline_len = (uint32_t)n;
		return 0;
	}
	if ((uint32_t)wr->num_sge > q->caps.max_send_sge)
		return EINVAL;
	h->num_sge = (uint8_t)wr->num_sge;
	put_sges(slot_data(slot), wr->sg_list, wr->num_sge);
	return 0;
}

int srn_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	struct srn_qp *q = to_sqp(qp);
	if (!can_send(qp)) {
		*bad = wr;
		return EINVAL;
	}
	int err = 0;
	pthread_spin_lock(&q->slock);
	for (; wr; wr = wr->next) {
		uint8_t *slot = srn_reserve(&q->sqp);
		if (!slot) {
			err = ENOMEM; /* the send queue is full */
			break;
		}
		if ((err = put_send_wr(q, slot, wr))) {
			srn_unreserve(&q->sqp);
			break;
		}
	}
	srn_commit(&q->sqp);
	pthread_spin_unlock(&q->slock);
	if (err)
		*bad = wr;
	return err;
}

void srn_put_recv(uint8_t *slot, const struct ibv_recv_wr *wr)
{
	struct softrnic_recv_slot h = {.id = wr->wr_id, .num_sge = (uint8_t)wr->num_sge};
	memcpy(slot, &h, sizeof(h));
	put_sges(slot + SOFTRNIC_RECV_SLOT_HEADER, wr->sg_list, wr->num_sge);
}

int srn_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	struct srn_qp *q = to_sqp(qp);
	/* A QP on an SRQ has no receive queue of its own (rxe refuses so). */
	if (qp->srq || __atomic_load_n(&qp->state, __ATOMIC_ACQUIRE) == IBV_QPS_RESET) {
		*bad = wr;
		return EINVAL;
	}
	int err = 0;
	pthread_spin_lock(&q->rlock);
	for (; wr; wr = wr->next) {
		if (wr->num_sge < 0 || (uint32_t)wr->num_sge > q->caps.max_recv_sge) {
			err = EINVAL;
			break;
		}
		uint8_t *slot = srn_reserve(&q->rqp);
		if (!slot) {
			err = ENOMEM;
			break;
		}
		srn_put_recv(slot, wr);
	}
	srn_commit(&q->rqp);
	pthread_spin_unlock(&q->rlock);
	if (err)
		*bad = wr;
	return err;
}

/* ---- ibv_qp_ex: ibv_wr_start, ibv_wr_<op>, ibv_wr_set_*, ibv_wr_complete ---- */

static struct srn_qp *qx(struct ibv_qp_ex *x)
{
	return (struct srn_qp *)x;
}

static void wr_fail(struct srn_qp *q, int err)
{
	if (!q->wr_err)
		q->wr_err = err;
}

/* Starts the next WR of the batch in a fresh slot. */
static struct softrnic_send_slot *wr_begin(struct ibv_qp_ex *x, enum ibv_wr_opcode opcode)
{
	struct srn_qp *q = qx(x);
	uint8_t op, fl;
	q->wr_slot = NULL;
	if (q->wr_err)
		return NULL;
	if (!send_opcode(opcode, &op) || !op_allowed(x->qp_base.qp_type, op) || !send_flags(x->wr_flags, &fl)) {
		wr_fail(q, EINVAL);
		return NULL;
	}
	uint8_t *slot = srn_reserve(&q->sqp);
	if (!slot) {
		wr_fail(q, ENOMEM);
		return NULL;
	}
	q->wr_slot = slot;
	struct softrnic_send_slot *h = slot_hdr(slot);
	memset(h, 0, sizeof(*h));
	h->id = x->wr_id;
	h->opcode = op;
	/* Inline or not is decided by the data call that follows. */
	h->flags = fl & ~SOFTRNIC_IB_SEND_FLAGS_INLINE;
	return h;
}

static void wr_start(struct ibv_qp_ex *x)
{
	struct srn_qp *q = qx(x);
	pthread_spin_lock(&q->slock);
	q->wr_err = can_send(&x->qp_base) ? 0 : EINVAL;
	q->wr_slot = NULL;
}

static int wr_complete(struct ibv_qp_ex *x)
{
	struct srn_qp *q = qx(x);
	int err = q->wr_err;
	if (err)
		srn_unreserve_all(&q->sqp); /* nothing of a failed batch is posted */
	else
		srn_commit(&q->sqp);
	q->wr_slot = NULL;
	pthread_spin_unlock(&q->slock);
	return err;
}

static void wr_abort(struct ibv_qp_ex *x)
{
	struct srn_qp *q = qx(x);
	srn_unreserve_all(&q->sqp);
	q->wr_slot = NULL;
	pthread_spin_unlock(&q->slock);
}

static void wr_send(struct ibv_qp_ex *x)
{
	wr_begin(x, IBV_WR_SEND);
}

static void wr_send_imm(struct ibv_qp_ex *x, __be32 imm)
{
	struct softrnic_send_slot *h = wr_begin(x, IBV_WR_SEND_WITH_IMM);
	if (h)
		h->imm = be32toh(imm);
}

static void wr_send_inv(struct ibv_qp_ex *x, uint32_t rkey)
{
	struct softrnic_send_slot *h = wr_begin(x, IBV_WR_SEND_WITH_INV);
	if (h)
		h->imm = rkey;
}

static void wr_rdma(struct ibv_qp_ex *x, enum ibv_wr_opcode op, uint32_t rkey, uint64_t addr, uint32_t imm)
{
	struct softrnic_send_slot *h = wr_begin(x, op);
	if (h) {
		h->r_key = rkey;
		h->remote_addr = addr;
		h->imm = imm;
	}
}

static void wr_rdma_write(struct ibv_qp_ex *x, uint32_t rkey, uint64_t addr)
{
	wr_rdma(x, IBV_WR_RDMA_WRITE, rkey, addr, 0);
}

static void wr_rdma_write_imm(struct ibv_qp_ex *x, uint32_t rkey, uint64_t addr, __be32 imm)
{
	wr_rdma(x, IBV_WR_RDMA_WRITE_WITH_IMM, rkey, addr, be32toh(imm));
}

static void wr_rdma_read(struct ibv_qp_ex *x, uint32_t rkey, uint64_t addr)
{
	wr_rdma(x, IBV_WR_RDMA_READ, rkey, addr, 0);
}

static void wr_atomic_cmp_swp(struct ibv_qp_ex *x, uint32_t rkey, uint64_t addr, uint64_t compare, uint64_t swap)
{
	struct softrnic_send_slot *h = wr_begin(x, IBV_WR_ATOMIC_CMP_AND_SWP);
	if (h) {
		h->r_key = rkey;
		h->remote_addr = addr;
		h->compare_add = compare;
		h->swap = swap;
	}
}

static void wr_atomic_fetch_add(struct ibv_qp_ex *x, uint32_t rkey, uint64_t addr, uint64_t add)
{
	struct softrnic_send_slot *h = wr_begin(x, IBV_WR_ATOMIC_FETCH_AND_ADD);
	if (h) {
		h->r_key = rkey;
		h->remote_addr = addr;
		h->compare_add = add;
	}
}

static void wr_set_ud_addr(struct ibv_qp_ex *x, struct ibv_ah *ah, uint32_t qpn, uint32_t qkey)
{
	struct srn_qp *q = qx(x);
	if (!q->wr_slot)
		return;
	if (x->qp_base.qp_type != IBV_QPT_UD || !ah) {
		wr_fail(q, EINVAL);
		return;
	}
	set_ud(q, q->wr_slot, ah, qpn, qkey);
}

static void wr_set_sge_list(struct ibv_qp_ex *x, size_t n, const struct ibv_sge *sg)
{
	struct srn_qp *q = qx(x);
	if (!q->wr_slot)
		return;
	if (n > q->caps.max_send_sge) {
		wr_fail(q, EINVAL);
		return;
	}
	struct softrnic_send_slot *h = slot_hdr(q->wr_slot);
	h->num_sge = (uint8_t)n;
	h->inline_len = 0;
	put_sges(slot_data(q->wr_slot), sg, (int)n);
}

static void wr_set_sge(struct ibv_qp_ex *x, uint32_t lkey, uint64_t addr, uint32_t length)
{
	struct ibv_sge sg = {.addr = addr, .length = length, .lkey = lkey};
	wr_set_sge_list(x, 1, &sg);
}

static void wr_set_inline_data_list(struct ibv_qp_ex *x, size_t n, const struct ibv_data_buf *bufs)
{
	struct srn_qp *q = qx(x);
	if (!q->wr_slot)
		return;
	struct softrnic_send_slot *h = slot_hdr(q->wr_slot);
	if (h->opcode == SOFTRNIC_IB_WR_OPCODE_RDMA_READ || h->opcode == SOFTRNIC_IB_WR_OPCODE_ATOMIC_CMP_AND_SWP ||
	    h->opcode == SOFTRNIC_IB_WR_OPCODE_ATOMIC_FETCH_AND_ADD) {
		wr_fail(q, EINVAL);
		return;
	}
	size_t len = 0;
	for (size_t i = 0; i < n; i++) {
		if (bufs[i].length > q->caps.max_inline - len) {
			wr_fail(q, EINVAL);
			return;
		}
		memcpy(slot_data(q->wr_slot) + len, bufs[i].addr, bufs[i].length);
		len += bufs[i].length;
	}
	h->flags |= SOFTRNIC_IB_SEND_FLAGS_INLINE;
	h->num_sge = 0;
	h->inline_len = (uint32_t)len;
}

static void wr_set_inline_data(struct ibv_qp_ex *x, void *addr, size_t length)
{
	struct ibv_data_buf b = {.addr = addr, .length = length};
	wr_set_inline_data_list(x, 1, &b);
}

/* Operations the daemon has no form for: the batch fails at
 * ibv_wr_complete with EOPNOTSUPP. */
static void wr_bind_mw(struct ibv_qp_ex *x, struct ibv_mw *mw, uint32_t rkey, const struct ibv_mw_bind_info *b)
{
	(void)mw, (void)rkey, (void)b;
	wr_fail(qx(x), EOPNOTSUPP);
}

static void wr_local_inv(struct ibv_qp_ex *x, uint32_t rkey)
{
	(void)rkey;
	wr_fail(qx(x), EOPNOTSUPP);
}

static void wr_send_tso(struct ibv_qp_ex *x, void *hdr, uint16_t hdr_sz, uint16_t mss)
{
	(void)hdr, (void)hdr_sz, (void)mss;
	wr_fail(qx(x), EOPNOTSUPP);
}

static void wr_set_xrc_srqn(struct ibv_qp_ex *x, uint32_t srqn)
{
	(void)srqn;
	wr_fail(qx(x), EOPNOTSUPP);
}

static void wr_atomic_write(struct ibv_qp_ex *x, uint32_t rkey, uint64_t addr, const void *data)
{
	(void)rkey, (void)addr, (void)data;
	wr_fail(qx(x), EOPNOTSUPP);
}

void srn_qp_ex_init(struct srn_qp *q)
{
	struct ibv_qp_ex *x = &q->qpx;
	x->wr_atomic_cmp_swp = wr_atomic_cmp_swp;
	x->wr_atomic_fetch_add = wr_atomic_fetch_add;
	x->wr_bind_mw = wr_bind_mw;
	x->wr_local_inv = wr_local_inv;
	x->wr_rdma_read = wr_rdma_read;
	x->wr_rdma_write = wr_rdma_write;
	x->wr_rdma_write_imm = wr_rdma_write_imm;
	x->wr_send = wr_send;
	x->wr_send_imm = wr_send_imm;
	x->wr_send_inv = wr_send_inv;
	x->wr_send_tso = wr_send_tso;
	x->wr_set_ud_addr = wr_set_ud_addr;
	x->wr_set_xrc_srqn = wr_set_xrc_srqn;
	x->wr_set_inline_data = wr_set_inline_data;
	x->wr_set_inline_data_list = wr_set_inline_data_list;
	x->wr_set_sge = wr_set_sge;
	x->wr_set_sge_list = wr_set_sge_list;
	x->wr_start = wr_start;
	x->wr_complete = wr_complete;
	x->wr_abort = wr_abort;
	x->wr_atomic_write = wr_atomic_write;
}

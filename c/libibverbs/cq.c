/*
 * Completion queues and completion channels.
 *
 * A CQ is the daemon's CQ ring: ibv_poll_cq converts the ring's entries
 * (struct softrnic_cqe) to ibv_wc without a syscall. The daemon rings the
 * CQ's eventfd when it adds an entry while the ring's wakeup flag is set,
 * and clears the flag, which is exactly a one-shot notification of the
 * next completion: ibv_req_notify_cq sets the flag, to
 * SOFTRNIC_RING_WAKE_SOLICITED for a solicited-only request, which the
 * daemon rings only for a receive whose message had SE or a completion in
 * error (IBA's solicited completions; the ring marks the former
 * SOFTRNIC_IB_WC_FLAGS_SOLICITED). A completion
 * channel is an epoll set of its CQs' eventfds, so that its fd is readable
 * when any member CQ has an event, and ibv_get_cq_event says which.
 */
#define _GNU_SOURCE
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "srn.h"

SRN_EXPORT struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *ctx)
{
	struct srn_comp_channel *c = calloc(1, sizeof(*c));
	if (!c) {
		errno = ENOMEM;
		return NULL;
	}
	c->ch.fd = epoll_create1(EPOLL_CLOEXEC);
	if (c->ch.fd < 0) {
		int err = errno;
		free(c);
		errno = err;
		return NULL;
	}
	c->ch.context = ctx;
	return &c->ch;
}

SRN_EXPORT int ibv_destroy_comp_channel(struct ibv_comp_channel *ch)
{
	pthread_mutex_lock(&ch->context->mutex);
	int busy = ch->refcnt;
	pthread_mutex_unlock(&ch->context->mutex);
	if (busy)
		return EBUSY;
	close(ch->fd);
	free(ch);
	return 0;
}

static void cq_ex_init(struct srn_cq *q);

static struct srn_cq *cq_create(struct ibv_context *ctx, int cqe, void *cq_context, struct ibv_comp_channel *channel,
				int comp_vector)
{
	struct srn_context *s = to_sctx(ctx);
	if (cqe < 1 || (uint32_t)cqe > s->info.device_attr.max_cqe || comp_vector < 0 || comp_vector >= ctx->num_comp_vectors) {
		errno = EINVAL;
		return NULL;
	}
	struct srn_cq *q = calloc(1, sizeof(*q));
	if (!q) {
		errno = ENOMEM;
		return NULL;
	}
	struct softrnic_create_cq_req req = {.depth = (uint32_t)cqe};
	struct softrnic_create_cq_resp resp;
	int fds[2];
	int err = srn_call(&s->conn, SOFTRNIC_OP_CREATE_CQ, &req, sizeof(req), NULL, 0, &resp, sizeof(resp), fds, 2);
	if (err) {
		free(q);
		errno = err;
		return NULL;
	}
	q->handle = resp.cq;
	q->db = fds[1];
	/* Two threads may wake for one event; the loser must not block. */
	fcntl(q->db, F_SETFL, fcntl(q->db, F_GETFL) | O_NONBLOCK);
	err = srn_ring_map(&q->ring, fds[0], SOFTRNIC_CQE_SIZE, resp.slots);
	if (!err && channel) {
		struct epoll_event ev = {.events = EPOLLIN, .data.ptr = q};
		if (epoll_ctl(channel->fd, EPOLL_CTL_ADD, q->db, &ev) < 0)
			err = errno;
	}
	if (err) {
		srn_call_handle(&s->conn, SOFTRNIC_OP_DESTROY_CQ, resp.cq);
		srn_ring_unmap(&q->ring);
		close(q->db);
		free(q);
		errno = err;
		return NULL;
	}
	srn_consumer_init(&q->cons, &q->ring);
	pthread_spin_init(&q->lock, PTHREAD_PROCESS_PRIVATE);
	q->cq.context = ctx;
	q->cq.channel = channel;
	q->cq.cq_context = cq_context;
	q->cq.handle = resp.cq;
	q->cq.cqe = (int)resp.slots;
	pthread_mutex_init(&q->cq.mutex, NULL);
	pthread_cond_init(&q->cq.cond, NULL);
	srn_obj_add(s, &q->obj, SRN_OBJ_CQ, resp.cq);
	if (channel) {
		pthread_mutex_lock(&ctx->mutex);
		channel->refcnt++;
		pthread_mutex_unlock(&ctx->mutex);
	}
	cq_ex_init(q);
	return q;
}

SRN_EXPORT struct ibv_cq *ibv_create_cq(struct ibv_context *ctx, int cqe, void *cq_context,
					struct ibv_comp_channel *channel, int comp_vector)
{
	struct srn_cq *q = cq_create(ctx, cqe, cq_context, channel, comp_vector);
	return q ? &q->cq : NULL;
}

struct ibv_cq_ex *srn_create_cq_ex(struct ibv_context *ctx, struct ibv_cq_init_attr_ex *a)
{
	/* Completions carry no timestamps, VLANs, flow tags or tag matching
	 * yet; parent domains and overrun-ignoring CQs do not exist. */
	if ((a->wc_flags & ~(uint64_t)IBV_WC_STANDARD_FLAGS) ||
	    (a->comp_mask & ~(uint32_t)IBV_CQ_INIT_ATTR_MASK_FLAGS) ||
	    ((a->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) && (a->flags & ~(uint32_t)IBV_CREATE_CQ_ATTR_SINGLE_THREADED))) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	if (a->cqe > INT32_MAX) {
		errno = EINVAL;
		return NULL;
	}
	struct srn_cq *q = cq_create(ctx, (int)a->cqe, a->cq_context, a->channel, (int)a->comp_vector);
	return q ? &q->cqx : NULL;
}

SRN_EXPORT int ibv_destroy_cq(struct ibv_cq *cq)
{
	struct srn_cq *q = to_scq(cq);
	struct srn_context *s = to_sctx(cq->context);
	int err = srn_call_handle(&s->conn, SOFTRNIC_OP_DESTROY_CQ, q->handle);
	if (err)
		return err;
	/* As rdma-core: the completion and asynchronous events handed out
	 * must have been acknowledged. */
	srn_obj_remove(s, &q->obj);
	pthread_mutex_lock(&cq->mutex);
	while (cq->comp_events_completed != q->events_delivered || cq->async_events_completed != q->obj.events_delivered)
		pthread_cond_wait(&cq->cond, &cq->mutex);
	pthread_mutex_unlock(&cq->mutex);
	if (cq->channel) {
		epoll_ctl(cq->channel->fd, EPOLL_CTL_DEL, q->db, NULL);
		pthread_mutex_lock(&cq->context->mutex);
		cq->channel->refcnt--;
		pthread_mutex_unlock(&cq->context->mutex);
	}
	srn_ring_unmap(&q->ring);
	close(q->db);
	pthread_spin_destroy(&q->lock);
	pthread_mutex_destroy(&cq->mutex);
	pthread_cond_destroy(&cq->cond);
	free(q);
	return 0;
}

static enum ibv_wc_status wc_status(uint8_t s)
{
	switch (s) {
	case SOFTRNIC_IB_WC_STATUS_SUCCESS: return IBV_WC_SUCCESS;
	case SOFTRNIC_IB_WC_STATUS_LOC_LEN_ERR: return IBV_WC_LOC_LEN_ERR;
	case SOFTRNIC_IB_WC_STATUS_LOC_QP_OP_ERR: return IBV_WC_LOC_QP_OP_ERR;
	case SOFTRNIC_IB_WC_STATUS_LOC_PROT_ERR: return IBV_WC_LOC_PROT_ERR;
	case SOFTRNIC_IB_WC_STATUS_WR_FLUSH_ERR: return IBV_WC_WR_FLUSH_ERR;
	case SOFTRNIC_IB_WC_STATUS_BAD_RESP_ERR: return IBV_WC_BAD_RESP_ERR;
	case SOFTRNIC_IB_WC_STATUS_LOC_ACCESS_ERR: return IBV_WC_LOC_ACCESS_ERR;
	case SOFTRNIC_IB_WC_STATUS_REM_INV_REQ_ERR: return IBV_WC_REM_INV_REQ_ERR;
	case SOFTRNIC_IB_WC_STATUS_REM_ACCESS_ERR: return IBV_WC_REM_ACCESS_ERR;
	case SOFTRNIC_IB_WC_STATUS_REM_OP_ERR: return IBV_WC_REM_OP_ERR;
	case SOFTRNIC_IB_WC_STATUS_RETRY_EXC_ERR: return IBV_WC_RETRY_EXC_ERR;
	case SOFTRNIC_IB_WC_STATUS_RNR_RETRY_EXC_ERR: return IBV_WC_RNR_RETRY_EXC_ERR;
	}
	return IBV_WC_GENERAL_ERR;
}

/* Converts one ring entry; false for an opcode this library does not know
 * (reported as a general error rather than guessed at). */
static bool wc_opcode(uint8_t op, enum ibv_wc_opcode *out)
{
	switch (op) {
	case SOFTRNIC_IB_WC_OPCODE_SEND: *out = IBV_WC_SEND; return true;
	case SOFTRNIC_IB_WC_OPCODE_RDMA_WRITE: *out = IBV_WC_RDMA_WRITE; return true;
	case SOFTRNIC_IB_WC_OPCODE_RDMA_READ: *out = IBV_WC_RDMA_READ; return true;
	case SOFTRNIC_IB_WC_OPCODE_COMP_SWAP: *out = IBV_WC_COMP_SWAP; return true;
	case SOFTRNIC_IB_WC_OPCODE_FETCH_ADD: *out = IBV_WC_FETCH_ADD; return true;
	case SOFTRNIC_IB_WC_OPCODE_RECV: *out = IBV_WC_RECV; return true;
	case SOFTRNIC_IB_WC_OPCODE_RECV_RDMA_WITH_IMM: *out = IBV_WC_RECV_RDMA_WITH_IMM; return true;
	}
	return false;
}

static void to_wc(const struct softrnic_cqe *e, struct ibv_wc *wc)
{
	memset(wc, 0, sizeof(*wc));
	wc->wr_id = e->id;
	wc->status = wc_status(e->status);
	if (!wc_opcode(e->opcode, &wc->opcode)) {
		wc->status = IBV_WC_GENERAL_ERR;
		wc->vendor_err = e->opcode;
	}
	wc->byte_len = e->byte_len;
	wc->qp_num = e->qpn;
	wc->src_qp = e->src_qp;
	if (e->flags & SOFTRNIC_IB_WC_FLAGS_WITH_IMM) {
		wc->wc_flags |= IBV_WC_WITH_IMM;
		wc->imm_data = htobe32(e->imm); /* the ring has the wire's value */
	}
	if (e->flags & SOFTRNIC_IB_WC_FLAGS_WITH_INV) {
		wc->wc_flags |= IBV_WC_WITH_INV;
		wc->invalidated_rkey = e->inv_r_key;
	}
	if (e->flags & SOFTRNIC_IB_WC_FLAGS_GRH)
		wc->wc_flags |= IBV_WC_GRH;
}

/*
 * A program that busy-polls an empty CQ holds a CPU that the daemon's
 * engine, which produces its completions, may need: on a host with fewer
 * CPUs than spinning threads the scheduler's time slices then become the
 * latency. So every SRN_POLLS_PER_YIELD-th poll in a row that finds the
 * ring empty gives the CPU away with sched_yield(2), which returns at once
 * when nothing else is runnable. A poll that finds entries makes no
 * system call. Counted under the CQ's lock; the caller yields after
 * releasing it, when this says so.
 */
#define SRN_POLLS_PER_YIELD 32

static bool srn_idle_poll(struct srn_cq *q, bool empty)
{
	if (!empty) {
		q->empty_polls = 0;
		return false;
	}
	return ++q->empty_polls % SRN_POLLS_PER_YIELD == 0;
}

int srn_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
	struct srn_cq *q = to_scq(cq);
	int i = 0;
	pthread_spin_lock(&q->lock);
	for (; i < n; i++) {
		const uint8_t *s = srn_peek(&q->cons);
		if (!s)
			break;
		struct softrnic_cqe e;
		memcpy(&e, s, sizeof(e));
		to_wc(&e, &wc[i]);
	}
	srn_release(&q->cons);
	bool corrupt = q->cons.corrupt;
	bool yield = n > 0 && srn_idle_poll(q, i == 0);
	pthread_spin_unlock(&q->lock);
	if (yield)
		sched_yield();
	if (i == 0 && corrupt)
		return -EIO;
	return i;
}

int srn_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
	struct srn_cq *q = to_scq(cq);
	/* Only a completion added after the request is notified, as rxe
	 * does (the kernel's uverbs never asks for missed events): entries
	 * already in the ring are the application's to poll, which it does
	 * after arming. The flag and the daemon's index are sequentially
	 * consistent atomics on both sides, so a completion is either
	 * published before the flag is set (the application's poll after
	 * arming finds it) or it rings: none is missed. Notifying entries
	 * already there made perftest's latency tests with -e, which poll once
	 * per event, take that event for the next completion. */
	pthread_spin_lock(&q->lock);
	srn_arm(&q->cons, solicited_only ? SOFTRNIC_RING_WAKE_SOLICITED : SOFTRNIC_RING_WAKE_ANY);
	pthread_spin_unlock(&q->lock);
	return 0;
}

/* ---- the extended poll API: ibv_start_poll, ibv_next_poll, ibv_end_poll ---- */

static struct srn_cq *from_ex(struct ibv_cq_ex *x)
{
	return (struct srn_cq *)x;
}

/* Takes the next entry as the current one; ENOENT when there is none. */
static int cq_ex_take(struct srn_cq *q)
{
	const uint8_t *s = srn_peek(&q->cons);
	if (!s)
		return q->cons.corrupt ? EIO : ENOENT;
	struct softrnic_cqe e;
	memcpy(&e, s, sizeof(e));
	to_wc(&e, &q->cur);
	q->cqx.wr_id = q->cur.wr_id;
	q->cqx.status = q->cur.status;
	return 0;
}

static int cq_start_poll(struct ibv_cq_ex *x, struct ibv_poll_cq_attr *attr)
{
	struct srn_cq *q = from_ex(x);
	if (attr->comp_mask)
		return EINVAL;
	pthread_spin_lock(&q->lock);
	int err = cq_ex_take(q);
	bool yield = srn_idle_poll(q, err == ENOENT);
	if (err) /* no entry: the poll is over, ibv_end_poll is not called */
		pthread_spin_unlock(&q->lock);
	if (yield)
		sched_yield();
	return err;
}

static int cq_next_poll(struct ibv_cq_ex *x)
{
	return cq_ex_take(from_ex(x));
}

static void cq_end_poll(struct ibv_cq_ex *x)
{
	struct srn_cq *q = from_ex(x);
	srn_release(&q->cons);
	pthread_spin_unlock(&q->lock);
}

static enum ibv_wc_opcode cq_read_opcode(struct ibv_cq_ex *x)
{
	return from_ex(x)->cur.opcode;
}

static uint32_t cq_read_vendor_err(struct ibv_cq_ex *x)
{
	return from_ex(x)->cur.vendor_err;
}

static uint32_t cq_read_byte_len(struct ibv_cq_ex *x)
{
	return from_ex(x)->cur.byte_len;
}

static __be32 cq_read_imm_data(struct ibv_cq_ex *x)
{
	return from_ex(x)->cur.imm_data;
}

static uint32_t cq_read_qp_num(struct ibv_cq_ex *x)
{
	return from_ex(x)->cur.qp_num;
}

static uint32_t cq_read_src_qp(struct ibv_cq_ex *x)
{
	return from_ex(x)->cur.src_qp;
}

static unsigned int cq_read_wc_flags(struct ibv_cq_ex *x)
{
	return from_ex(x)->cur.wc_flags;
}

static uint32_t cq_read_slid(struct ibv_cq_ex *x)
{
	return from_ex(x)->cur.slid;
}

static uint8_t cq_read_sl(struct ibv_cq_ex *x)
{
	return from_ex(x)->cur.sl;
}

static uint8_t cq_read_dlid_path_bits(struct ibv_cq_ex *x)
{
	return from_ex(x)->cur.dlid_path_bits;
}

static void cq_ex_init(struct srn_cq *q)
{
	struct ibv_cq_ex *x = &q->cqx;
	x->start_poll = cq_start_poll;
	x->next_poll = cq_next_poll;
	x->end_poll = cq_end_poll;
	x->read_opcode = cq_read_opcode;
	x->read_vendor_err = cq_read_vendor_err;
	x->read_byte_len = cq_read_byte_len;
	x->read_imm_data = cq_read_imm_data;
	x->read_qp_num = cq_read_qp_num;
	x->read_src_qp = cq_read_src_qp;
	x->read_wc_flags = cq_read_wc_flags;
	x->read_slid = cq_read_slid;
	x->read_sl = cq_read_sl;
	x->read_dlid_path_bits = cq_read_dlid_path_bits;
	/* The rest (timestamps, VLAN, flow tag, tag matching) stay NULL: no
	 * CQ is created with the flags that would allow calling them. */
}

SRN_EXPORT int ibv_get_cq_event(struct ibv_comp_channel *ch, struct ibv_cq **cq, void **cq_context)
{
	int fl = fcntl(ch->fd, F_GETFL);
	int timeout = fl >= 0 && (fl & O_NONBLOCK) ? 0 : -1;
	for (;;) {
		struct epoll_event ev;
		int n = epoll_wait(ch->fd, &ev, 1, timeout);
		if (n < 0)
			return -1;
		if (n == 0) {
			errno = EAGAIN;
			return -1;
		}
		struct srn_cq *q = ev.data.ptr;
		uint64_t v;
		if (read(q->db, &v, sizeof(v)) != sizeof(v))
			continue; /* another thread took this event */
		pthread_mutex_lock(&q->cq.mutex);
		q->events_delivered++;
		pthread_mutex_unlock(&q->cq.mutex);
		*cq = &q->cq;
		*cq_context = q->cq.cq_context;
		return 0;
	}
}

SRN_EXPORT void ibv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents)
{
	pthread_mutex_lock(&cq->mutex);
	cq->comp_events_completed += nevents;
	pthread_cond_broadcast(&cq->cond);
	pthread_mutex_unlock(&cq->mutex);
}

SRN_EXPORT int ibv_resize_cq(struct ibv_cq *cq, int cqe)
{
	(void)cq, (void)cqe;
	return EOPNOTSUPP;
}

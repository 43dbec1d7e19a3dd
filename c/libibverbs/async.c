/*
 * Asynchronous events. context->async_fd is the context's event socket
 * (SOFTRNIC_OP_ASYNC_EVENTS): the daemon writes one message per event of
 * the context's QPs, CQs and SRQs and of the port, so the fd is readable
 * exactly while events wait, an application that made it non-blocking gets
 * EAGAIN, and end-of-file, when the daemon is gone, is
 * IBV_EVENT_DEVICE_FATAL (reported once). Each event names its object by
 * the daemon's handle; the library finds the object on its context's list
 * and counts what it hands out, which the object's destroy waits to see
 * acknowledged, as rdma-core's does.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>
#include <sys/socket.h>

#include "srn.h"

void srn_obj_add(struct srn_context *s, struct srn_obj *o, enum srn_obj_kind kind, uint32_t handle)
{
	o->kind = kind;
	o->handle = handle;
	o->events_delivered = 0;
	pthread_mutex_lock(&s->objs_lock);
	o->next = s->objs.next;
	o->prev = &s->objs;
	s->objs.next->prev = o;
	s->objs.next = o;
	pthread_mutex_unlock(&s->objs_lock);
}

void srn_obj_remove(struct srn_context *s, struct srn_obj *o)
{
	pthread_mutex_lock(&s->objs_lock);
	if (o->next) {
		o->next->prev = o->prev;
		o->prev->next = o->next;
		o->next = o->prev = NULL;
	}
	pthread_mutex_unlock(&s->objs_lock);
}

/* The object an event names, or NULL (destroyed since, or never ours).
 * Called with objs_lock held. */
static struct srn_obj *obj_find(struct srn_context *s, enum srn_obj_kind kind, uint32_t handle)
{
	for (struct srn_obj *o = s->objs.next; o != &s->objs; o = o->next)
		if (o->kind == kind && o->handle == handle)
			return o;
	return NULL;
}

#define OBJ_OF(ptr, type) ((type *)((char *)(ptr) - offsetof(type, obj)))

/* The verbs event type of a protocol one, and the kind of object it names
 * (0: the port). False for a type this library does not know. */
static bool event_type(uint8_t t, enum ibv_event_type *out, enum srn_obj_kind *kind)
{
	*kind = SRN_OBJ_QP;
	switch (t) {
	case SOFTRNIC_IB_EVENT_TYPE_QP_FATAL: *out = IBV_EVENT_QP_FATAL; return true;
	case SOFTRNIC_IB_EVENT_TYPE_QP_REQ_ERR: *out = IBV_EVENT_QP_REQ_ERR; return true;
	case SOFTRNIC_IB_EVENT_TYPE_QP_ACCESS_ERR: *out = IBV_EVENT_QP_ACCESS_ERR; return true;
	case SOFTRNIC_IB_EVENT_TYPE_COMM_EST: *out = IBV_EVENT_COMM_EST; return true;
	case SOFTRNIC_IB_EVENT_TYPE_SQ_DRAINED: *out = IBV_EVENT_SQ_DRAINED; return true;
	case SOFTRNIC_IB_EVENT_TYPE_QP_LAST_WQE_REACHED: *out = IBV_EVENT_QP_LAST_WQE_REACHED; return true;
	}
	*kind = SRN_OBJ_CQ;
	if (t == SOFTRNIC_IB_EVENT_TYPE_CQ_ERR) {
		*out = IBV_EVENT_CQ_ERR;
		return true;
	}
	*kind = SRN_OBJ_SRQ;
	switch (t) {
	case SOFTRNIC_IB_EVENT_TYPE_SRQ_ERR: *out = IBV_EVENT_SRQ_ERR; return true;
	case SOFTRNIC_IB_EVENT_TYPE_SRQ_LIMIT_REACHED: *out = IBV_EVENT_SRQ_LIMIT_REACHED; return true;
	}
	*kind = 0;
	switch (t) {
	case SOFTRNIC_IB_EVENT_TYPE_PORT_ACTIVE: *out = IBV_EVENT_PORT_ACTIVE; return true;
	case SOFTRNIC_IB_EVENT_TYPE_PORT_ERR: *out = IBV_EVENT_PORT_ERR; return true;
	}
	return false;
}

/* Fills event from one message; false for one to drop. Called with
 * event_lock held. */
static bool convert(struct srn_context *s, const struct softrnic_async_event_msg *m, struct ibv_async_event *event)
{
	enum srn_obj_kind kind;
	if (!event_type(m->type, &event->event_type, &kind)) {
		srn_debug("async event of unknown type %u dropped", m->type);
		return false;
	}
	if (m->lost != s->events_lost) {
		srn_warn("the daemon dropped %u asynchronous events of this context so far: its queue for them was full",
			 m->lost);
		s->events_lost = m->lost;
	}
	if (!kind) {
		event->element.port_num = 1;
		return true;
	}
	pthread_mutex_lock(&s->objs_lock);
	struct srn_obj *o = obj_find(s, kind, m->handle);
	if (o) {
		/* Counted under the object's mutex, which its acknowledgment
		 * and its destroy take too. */
		pthread_mutex_t *mu;
		switch (kind) {
		case SRN_OBJ_CQ: {
			struct srn_cq *q = OBJ_OF(o, struct srn_cq);
			event->element.cq = &q->cq;
			mu = &q->cq.mutex;
			break;
		}
		case SRN_OBJ_QP: {
			struct srn_qp *q = OBJ_OF(o, struct srn_qp);
			event->element.qp = &q->qpx.qp_base;
			mu = &q->qpx.qp_base.mutex;
			break;
		}
		default: {
			struct srn_srq *x = OBJ_OF(o, struct srn_srq);
			event->element.srq = &x->srq;
			mu = &x->srq.mutex;
			break;
		}
		}
		pthread_mutex_lock(mu);
		o->events_delivered++;
		pthread_mutex_unlock(mu);
	}
	pthread_mutex_unlock(&s->objs_lock);
	return o != NULL;
}

SRN_EXPORT int ibv_get_async_event(struct ibv_context *ctx, struct ibv_async_event *event)
{
	struct srn_context *s = to_sctx(ctx);
	for (;;) {
		uint8_t buf[sizeof(struct softrnic_header) + sizeof(struct softrnic_async_event_msg) + 1];
		/* Blocks, or not, as the application set the fd. */
		ssize_t n = recv(ctx->async_fd, buf, sizeof(buf), 0);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		pthread_mutex_lock(&s->event_lock);
		if (n == 0) {
			/* The daemon is gone: reported once, as the kernel's
			 * async queue is empty after a disassociation. */
			bool first = !s->fatal_reported;
			s->fatal_reported = true;
			pthread_mutex_unlock(&s->event_lock);
			if (!first) {
				errno = EAGAIN;
				return -1;
			}
			memset(&event->element, 0, sizeof(event->element));
			event->event_type = IBV_EVENT_DEVICE_FATAL;
			return 0;
		}
		struct softrnic_header h;
		struct softrnic_async_event_msg m;
		bool ok = (size_t)n == sizeof(h) + sizeof(m);
		if (ok) {
			memcpy(&h, buf, sizeof(h));
			memcpy(&m, buf + sizeof(h), sizeof(m));
			ok = h.op == SOFTRNIC_OP_ASYNC_EVENT && convert(s, &m, event);
		}
		pthread_mutex_unlock(&s->event_lock);
		if (ok)
			return 0;
	}
}

SRN_EXPORT void ibv_ack_async_event(struct ibv_async_event *event)
{
	/* Objects count their acknowledged events, which destroy waits for. */
	switch (event->event_type) {
	case IBV_EVENT_CQ_ERR: {
		struct ibv_cq *cq = event->element.cq;
		pthread_mutex_lock(&cq->mutex);
		cq->async_events_completed++;
		pthread_cond_broadcast(&cq->cond);
		pthread_mutex_unlock(&cq->mutex);
		break;
	}
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_COMM_EST:
	case IBV_EVENT_SQ_DRAINED:
	case IBV_EVENT_PATH_MIG:
	case IBV_EVENT_PATH_MIG_ERR:
	case IBV_EVENT_QP_LAST_WQE_REACHED: {
		struct ibv_qp *qp = event->element.qp;
		pthread_mutex_lock(&qp->mutex);
		qp->events_completed++;
		pthread_cond_broadcast(&qp->cond);
		pthread_mutex_unlock(&qp->mutex);
		break;
	}
	case IBV_EVENT_SRQ_ERR:
	case IBV_EVENT_SRQ_LIMIT_REACHED: {
		struct ibv_srq *srq = event->element.srq;
		pthread_mutex_lock(&srq->mutex);
		srq->events_completed++;
		pthread_cond_broadcast(&srq->cond);
		pthread_mutex_unlock(&srq->mutex);
		break;
	}
	default:
		break;
	}
}

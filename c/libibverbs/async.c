/*
 * Asynchronous events. context->async_fd is an epoll set holding the
 * daemon connection (for hang-up only): when the daemon goes away the fd
 * becomes readable and ibv_get_async_event reports IBV_EVENT_DEVICE_FATAL,
 * once. QP, CQ and port events need a daemon-to-client event message the
 * protocol does not have yet.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sys/epoll.h>

#include "srn.h"

SRN_EXPORT int ibv_get_async_event(struct ibv_context *ctx, struct ibv_async_event *event)
{
	struct srn_context *s = to_sctx(ctx);
	int fl = fcntl(ctx->async_fd, F_GETFL);
	int timeout = fl >= 0 && (fl & O_NONBLOCK) ? 0 : -1;
	struct epoll_event ev;
	int n = epoll_wait(ctx->async_fd, &ev, 1, timeout);
	if (n < 0)
		return -1;
	if (n == 0) {
		errno = EAGAIN;
		return -1;
	}
	pthread_mutex_lock(&ctx->mutex);
	bool first = !s->fatal_reported;
	s->fatal_reported = true;
	/* Reported once: the set is empty afterwards, as the kernel's async
	 * queue is after a disassociation. */
	epoll_ctl(ctx->async_fd, EPOLL_CTL_DEL, s->conn.fd, NULL);
	pthread_mutex_unlock(&ctx->mutex);
	if (!first) {
		errno = EAGAIN;
		return -1;
	}
	event->event_type = IBV_EVENT_DEVICE_FATAL;
	event->element.port_num = 0;
	return 0;
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
	default:
		break;
	}
}

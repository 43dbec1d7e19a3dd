/*
 * Event channels. channel->fd is an epoll set of the channel's event
 * sources, so it is readable exactly while an event waits, and an
 * application may poll it, make it non-blocking (rdma_get_cm_event then
 * fails with EAGAIN) or block in rdma_get_cm_event:
 *
 *   - the library's own queue (resolutions, device removal), counted by
 *     an eventfd in semaphore mode: one count per queued event;
 *   - the daemon's event socket (softrnic_proto.h, OpUCMCreateChannel):
 *     one SEQPACKET message per event, which reads end-of-file when the
 *     daemon is gone;
 *   - the control connection, for its hang-up only, which reports the
 *     daemon's end to a channel without a daemon socket.
 *
 * The library's queue is read first: it holds what was taken out of the
 * daemon socket to keep events in order when an ID migrates.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "scm.h"

enum { SRC_QUEUE, SRC_DAEMON, SRC_CONTROL };

SCM_EXPORT struct rdma_event_channel *rdma_create_event_channel(void)
{
	if (scm_init())
		return NULL;
	if (scm_dev.gone) {
		errno = ENODEV;
		return NULL;
	}
	struct scm_channel *c = calloc(1, sizeof(*c));
	if (!c) {
		errno = ENOMEM;
		return NULL;
	}
	pthread_mutex_init(&c->lock, NULL);
	c->dfd = -1;
	c->ch.fd = epoll_create1(EPOLL_CLOEXEC);
	c->qfd = eventfd(0, EFD_SEMAPHORE | EFD_NONBLOCK | EFD_CLOEXEC);
	int err = c->ch.fd < 0 || c->qfd < 0 ? errno : 0;
	if (!err) {
		struct softrnic_handle_msg h;
		int fd = -1;
		int e = scm_call(SOFTRNIC_OP_UCM_CREATE_CHANNEL, NULL, 0, &h, sizeof(h), &fd, 1);
		if (e == 0) {
			c->handle = h.handle;
			c->dfd = fd;
		} else if (e == ECONNRESET || e == EPIPE) {
			err = ENODEV;
		} else {
			/* A daemon without the UCM operations: the channel
			 * serves what needs no daemon, and connecting fails. */
			scm_debug("no rdma_cm events from the daemon: %s", strerror(e));
		}
	}
	c->cfd = softrnic_control_fd(scm_dev.ctx);
	struct epoll_event q = {.events = EPOLLIN, .data.u32 = SRC_QUEUE};
	struct epoll_event d = {.events = EPOLLIN | EPOLLRDHUP, .data.u32 = SRC_DAEMON};
	struct epoll_event h = {.events = EPOLLRDHUP, .data.u32 = SRC_CONTROL};
	if (!err && (epoll_ctl(c->ch.fd, EPOLL_CTL_ADD, c->qfd, &q) < 0 ||
		     (c->dfd >= 0 && epoll_ctl(c->ch.fd, EPOLL_CTL_ADD, c->dfd, &d) < 0) ||
		     epoll_ctl(c->ch.fd, EPOLL_CTL_ADD, c->cfd, &h) < 0))
		err = errno;
	if (err) {
		if (c->handle) {
			struct softrnic_handle_msg m = {.handle = c->handle};
			scm_call(SOFTRNIC_OP_UCM_DESTROY_CHANNEL, &m, sizeof(m), NULL, 0, NULL, 0);
		}
		if (c->dfd >= 0)
			close(c->dfd);
		if (c->qfd >= 0)
			close(c->qfd);
		if (c->ch.fd >= 0)
			close(c->ch.fd);
		pthread_mutex_destroy(&c->lock);
		free(c);
		errno = err;
		return NULL;
	}
	return &c->ch;
}

SCM_EXPORT void rdma_destroy_event_channel(struct rdma_event_channel *channel)
{
	struct scm_channel *c = to_sch(channel);
	if (c->handle && c->dfd >= 0) {
		struct softrnic_handle_msg m = {.handle = c->handle};
		scm_call(SOFTRNIC_OP_UCM_DESTROY_CHANNEL, &m, sizeof(m), NULL, 0, NULL, 0);
	}
	for (struct scm_event *e = c->head, *n; e; e = n) {
		n = e->next;
		free(e);
	}
	if (c->dfd >= 0)
		close(c->dfd);
	close(c->qfd);
	close(c->ch.fd);
	pthread_mutex_destroy(&c->lock);
	free(c);
}

/* Appends e to c's queue; c's lock held. */
static void push_locked(struct scm_channel *c, struct scm_event *e)
{
	e->next = NULL;
	if (c->tail)
		c->tail->next = e;
	else
		c->head = e;
	c->tail = e;
	uint64_t one = 1;
	while (write(c->qfd, &one, sizeof(one)) < 0 && errno == EINTR)
		;
}

static void push(struct scm_channel *c, struct scm_event *e)
{
	pthread_mutex_lock(&c->lock);
	push_locked(c, e);
	pthread_mutex_unlock(&c->lock);
}

/* Takes the first queued event, counting it as delivered to its owner
 * (a converted one: raw ones count when converted). */
static struct scm_event *pop(struct scm_channel *c)
{
	pthread_mutex_lock(&c->lock);
	struct scm_event *e = c->head;
	uint64_t v;
	if (e && read(c->qfd, &v, sizeof(v)) == sizeof(v)) {
		c->head = e->next;
		if (!c->head)
			c->tail = NULL;
		if (!e->raw) {
			pthread_mutex_lock(&e->owner->mut);
			e->owner->events_delivered++;
			pthread_mutex_unlock(&e->owner->mut);
		}
	} else {
		e = NULL;
	}
	pthread_mutex_unlock(&c->lock);
	return e;
}

int scm_queue_event_locked(struct scm_id *s, enum rdma_cm_event_type type, int status)
{
	struct scm_event *e = calloc(1, sizeof(*e));
	if (!e)
		return scm_err(ENOMEM);
	e->event.id = &s->id;
	e->event.event = type;
	e->event.status = status;
	e->owner = s;
	push(to_sch(s->id.channel), e);
	return 0;
}

int scm_queue_event(struct scm_id *s, enum rdma_cm_event_type type, int status)
{
	/* Under scm_lock: destroy unlinks the ID before it empties the
	 * queue, so a queued event's owner is alive. */
	pthread_mutex_lock(&scm_lock);
	int r = scm_queue_event_locked(s, type, status);
	pthread_mutex_unlock(&scm_lock);
	return r;
}

void scm_unqueue(struct scm_id *s, struct scm_channel *from, struct scm_channel *into)
{
	struct scm_event *taken = NULL, **tail = &taken;
	pthread_mutex_lock(&from->lock);
	struct scm_event **p = &from->head, *last = NULL;
	while (*p) {
		struct scm_event *e = *p;
		bool mine = e->raw ? s->handle && scm_event_target(&e->ucm) == s->handle : e->owner == s;
		uint64_t v;
		if (!mine || read(from->qfd, &v, sizeof(v)) != sizeof(v)) {
			last = e;
			p = &e->next;
			continue;
		}
		*p = e->next;
		e->next = NULL;
		*tail = e;
		tail = &e->next;
	}
	from->tail = last;
	pthread_mutex_unlock(&from->lock);
	for (struct scm_event *e = taken, *n; e; e = n) {
		n = e->next;
		if (into)
			push(into, e);
		else
			free(e);
	}
}

/* Receives one daemon event from c's socket: 1 with *u filled, 0 when
 * there is none now, -1 when the daemon is gone. */
static int recv_daemon(struct scm_channel *c, struct softrnic_ucm_event *u)
{
	for (;;) {
		struct {
			struct softrnic_header h;
			struct softrnic_ucm_event u;
		} __attribute__((packed)) m;
		ssize_t n = recv(c->dfd, &m, sizeof(m), MSG_DONTWAIT | MSG_TRUNC);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return 0;
		if (n <= 0)
			return -1;
		if ((size_t)n != sizeof(m) || m.h.op != SOFTRNIC_OP_UCM_EVENT || m.h.version != SOFTRNIC_VERSION) {
			scm_debug("dropped a malformed daemon event (%zd bytes, op %u)", n, m.h.op);
			continue;
		}
		c->seq = m.h.seq;
		*u = m.u;
		return 1;
	}
}

void scm_drain_daemon(struct scm_channel *from, uint32_t handle, struct scm_channel *to)
{
	if (from->dfd < 0)
		return;
	for (;;) {
		struct scm_event *e = calloc(1, sizeof(*e));
		if (!e)
			return; /* what stays is forwarded when read (rdma_get_cm_event) */
		pthread_mutex_lock(&from->lock);
		int r = recv_daemon(from, &e->ucm);
		if (r == 1) {
			e->raw = true;
			if (scm_event_target(&e->ucm) != handle)
				push_locked(from, e);
		}
		pthread_mutex_unlock(&from->lock);
		if (r != 1) {
			free(e);
			return;
		}
		if (scm_event_target(&e->ucm) == handle)
			push(to, e);
	}
}

/* The daemon is gone: no more events from it on c; every ID of c bound to
 * the device gets DEVICE_REMOVAL, once. */
static void device_gone(struct scm_channel *c)
{
	pthread_mutex_lock(&scm_lock);
	scm_dev.gone = true;
	pthread_mutex_lock(&c->lock);
	if (c->dfd >= 0) {
		epoll_ctl(c->ch.fd, EPOLL_CTL_DEL, c->dfd, NULL);
		close(c->dfd);
		c->dfd = -1;
	}
	if (c->cfd >= 0) {
		epoll_ctl(c->ch.fd, EPOLL_CTL_DEL, c->cfd, NULL);
		c->cfd = -1;
	}
	pthread_mutex_unlock(&c->lock);
	for (struct scm_id *s; (s = scm_take_removal(&c->ch));)
		if (scm_queue_event_locked(s, RDMA_CM_EVENT_DEVICE_REMOVAL, 0))
			break;
	pthread_mutex_unlock(&scm_lock);
}

void scm_complete_event(struct scm_id *owner)
{
	pthread_mutex_lock(&owner->mut);
	owner->events_completed++;
	pthread_cond_broadcast(&owner->cond);
	pthread_mutex_unlock(&owner->mut);
}

/* Turns a raw daemon event into the application's, or forwards it to
 * the channel its ID moved to. True when e is ready to hand out. */
static bool take_raw(struct scm_channel *c, struct scm_event *e)
{
	struct softrnic_ucm_event u = e->ucm;
	pthread_mutex_lock(&scm_lock);
	struct scm_id *t = scm_id_lookup(scm_event_target(&u));
	struct scm_channel *dest = t ? to_sch(t->id.channel) : c;
	if (dest != c)
		push(dest, e);
	pthread_mutex_unlock(&scm_lock);
	if (dest != c)
		return false;
	memset(e, 0, sizeof(*e));
	if (scm_convert(c, &u, e))
		return true;
	free(e);
	return false;
}

SCM_EXPORT int rdma_get_cm_event(struct rdma_event_channel *channel, struct rdma_cm_event **event)
{
	if (scm_init())
		return -1;
	if (!event)
		return scm_err(EINVAL);
	struct scm_channel *c = to_sch(channel);
	for (;;) {
		struct scm_event *e = pop(c);
		if (e && (!e->raw || take_raw(c, e))) {
			*event = &e->event;
			return 0;
		}
		if (e)
			continue;
		if (c->dfd >= 0) {
			e = calloc(1, sizeof(*e));
			if (!e)
				return scm_err(ENOMEM);
			pthread_mutex_lock(&c->lock);
			int r = c->dfd >= 0 ? recv_daemon(c, &e->ucm) : 0;
			pthread_mutex_unlock(&c->lock);
			if (r == 1) {
				e->raw = true;
				if (take_raw(c, e)) {
					*event = &e->event;
					return 0;
				}
				continue;
			}
			free(e);
			if (r < 0) {
				device_gone(c);
				continue;
			}
		}
		int fl = fcntl(channel->fd, F_GETFL);
		struct epoll_event evs[3];
		int n = epoll_wait(channel->fd, evs, 3, fl >= 0 && (fl & O_NONBLOCK) ? 0 : -1);
		if (n < 0)
			return -1;
		if (n == 0)
			return scm_err(EAGAIN);
		for (int i = 0; i < n; i++)
			if (evs[i].data.u32 == SRC_CONTROL)
				device_gone(c);
	}
}

SCM_EXPORT int rdma_ack_cm_event(struct rdma_cm_event *event)
{
	if (!event)
		return scm_err(EINVAL);
	struct scm_event *e = (struct scm_event *)event;
	scm_complete_event(e->owner);
	free(e);
	return 0;
}

SCM_EXPORT const char *rdma_event_str(enum rdma_cm_event_type event)
{
	switch (event) {
	case RDMA_CM_EVENT_ADDR_RESOLVED: return "RDMA_CM_EVENT_ADDR_RESOLVED";
	case RDMA_CM_EVENT_ADDR_ERROR: return "RDMA_CM_EVENT_ADDR_ERROR";
	case RDMA_CM_EVENT_ROUTE_RESOLVED: return "RDMA_CM_EVENT_ROUTE_RESOLVED";
	case RDMA_CM_EVENT_ROUTE_ERROR: return "RDMA_CM_EVENT_ROUTE_ERROR";
	case RDMA_CM_EVENT_CONNECT_REQUEST: return "RDMA_CM_EVENT_CONNECT_REQUEST";
	case RDMA_CM_EVENT_CONNECT_RESPONSE: return "RDMA_CM_EVENT_CONNECT_RESPONSE";
	case RDMA_CM_EVENT_CONNECT_ERROR: return "RDMA_CM_EVENT_CONNECT_ERROR";
	case RDMA_CM_EVENT_UNREACHABLE: return "RDMA_CM_EVENT_UNREACHABLE";
	case RDMA_CM_EVENT_REJECTED: return "RDMA_CM_EVENT_REJECTED";
	case RDMA_CM_EVENT_ESTABLISHED: return "RDMA_CM_EVENT_ESTABLISHED";
	case RDMA_CM_EVENT_DISCONNECTED: return "RDMA_CM_EVENT_DISCONNECTED";
	case RDMA_CM_EVENT_DEVICE_REMOVAL: return "RDMA_CM_EVENT_DEVICE_REMOVAL";
	case RDMA_CM_EVENT_MULTICAST_JOIN: return "RDMA_CM_EVENT_MULTICAST_JOIN";
	case RDMA_CM_EVENT_MULTICAST_ERROR: return "RDMA_CM_EVENT_MULTICAST_ERROR";
	case RDMA_CM_EVENT_ADDR_CHANGE: return "RDMA_CM_EVENT_ADDR_CHANGE";
	case RDMA_CM_EVENT_TIMEWAIT_EXIT: return "RDMA_CM_EVENT_TIMEWAIT_EXIT";
	}
	return "UNKNOWN EVENT";
}

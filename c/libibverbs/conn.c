/*
 * The daemon connection: one SOCK_SEQPACKET record per message, a header
 * and a fixed-size body, fds riding along as SCM_RIGHTS (softrnic_proto.h);
 * and the mapping of the rings the daemon hands out.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "srn.h"

const char *srn_control_path(void)
{
	const char *p = getenv(SRN_CONTROL_ENV);
	return p && *p ? p : SOFTRNIC_DEFAULT_CONTROL;
}

static void vlog(const char *fmt, va_list ap)
{
	fputs("softrnic: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
}

void srn_debug(const char *fmt, ...)
{
	if (!getenv(SRN_DEBUG_ENV))
		return;
	va_list ap;
	va_start(ap, fmt);
	vlog(fmt, ap);
	va_end(ap);
}

void srn_warn(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vlog(fmt, ap);
	va_end(ap);
}

int srn_conn_open(struct srn_conn *c, const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	if (strlen(path) >= sizeof(sa.sun_path))
		return ENAMETOOLONG;
	strcpy(sa.sun_path, path);
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return errno;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int err = errno;
		close(fd);
		return err;
	}
	c->fd = fd;
	c->seq = 0;
	pthread_mutex_init(&c->lock, NULL);
	return 0;
}

void srn_conn_close(struct srn_conn *c)
{
	if (c->fd >= 0)
		close(c->fd);
	c->fd = -1;
	pthread_mutex_destroy(&c->lock);
}

static void close_fds(const int *fds, int n)
{
	for (int i = 0; i < n; i++)
		close(fds[i]);
}

static int send_msg(int fd, const struct softrnic_header *h, const void *body, size_t len, const int *fds, int nfds)
{
	struct iovec iov[2] = {{(void *)h, sizeof(*h)}, {(void *)body, len}};
	union {
		char buf[CMSG_SPACE(sizeof(int) * SOFTRNIC_MAX_FDS)];
		struct cmsghdr align;
	} u;
	struct msghdr m = {.msg_iov = iov, .msg_iovlen = len ? 2 : 1};
	if (nfds > 0) {
		memset(&u, 0, sizeof(u));
		m.msg_control = u.buf;
		m.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
		struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
		memcpy(CMSG_DATA(cm), fds, sizeof(int) * nfds);
	}
	ssize_t n;
	do
		n = sendmsg(fd, &m, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return errno;
	return (size_t)n == sizeof(*h) + len ? 0 : EPROTO;
}

/* Receives one message into buf; returns its length or -errno. */
static ssize_t recv_msg(int fd, void *buf, size_t cap, int *fds, int *nfds)
{
	struct iovec iov = {buf, cap};
	union {
		char buf[CMSG_SPACE(sizeof(int) * SOFTRNIC_MAX_FDS)];
		struct cmsghdr align;
	} u;
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof(u.buf)};
	ssize_t n;
	do
		n = recvmsg(fd, &m, MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	*nfds = 0;
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(&m); cm; cm = CMSG_NXTHDR(&m, cm)) {
		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		int k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (int i = 0; i < k; i++) {
			int f;
			memcpy(&f, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
			if (*nfds < SOFTRNIC_MAX_FDS)
				fds[(*nfds)++] = f;
			else
				close(f);
		}
	}
	if (m.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
		close_fds(fds, *nfds);
		*nfds = 0;
		return -EPROTO;
	}
	if (n == 0) /* SOCK_SEQPACKET: the daemon closed the connection */
		return -ECONNRESET;
	return n;
}

int srn_call(struct srn_conn *c, uint16_t op, const void *req, size_t req_len, const int *fds, int nfds,
	     void *resp, size_t resp_len, int *fds_out, int nfds_out)
{
	uint8_t buf[SOFTRNIC_MAX_MESSAGE + 1];
	int rfds[SOFTRNIC_MAX_FDS], nr = 0, err = 0;

	pthread_mutex_lock(&c->lock);
	struct softrnic_header h = {.op = op, .version = SOFTRNIC_VERSION, .seq = ++c->seq};
	if (c->fd < 0)
		err = ECONNRESET;
	else
		err = send_msg(c->fd, &h, req, req_len, fds, nfds);
	ssize_t n = 0;
	if (!err) {
		n = recv_msg(c->fd, buf, sizeof(buf), rfds, &nr);
		if (n < 0)
			err = (int)-n;
	}
	pthread_mutex_unlock(&c->lock);
	if (err) {
		srn_debug("op %u: daemon connection: %s", op, strerror(err));
		return err;
	}
	struct softrnic_header rh;
	if ((size_t)n < sizeof(rh)) {
		close_fds(rfds, nr);
		return EPROTO;
	}
	memcpy(&rh, buf, sizeof(rh));
	size_t blen = n - sizeof(rh);
	if (rh.op != op || rh.seq != h.seq || rh.version != SOFTRNIC_VERSION) {
		close_fds(rfds, nr);
		srn_debug("op %u: reply for op %u #%u", op, rh.op, rh.seq);
		return EPROTO;
	}
	if (rh.errno_) {
		close_fds(rfds, nr);
		srn_debug("op %u: %.*s (%s)", op, (int)blen, (const char *)buf + sizeof(rh), strerror((int)rh.errno_));
		return (int)rh.errno_;
	}
	if (blen != resp_len || nr != nfds_out) {
		close_fds(rfds, nr);
		srn_debug("op %u: reply of %zu bytes and %d fds, want %zu and %d", op, blen, nr, resp_len, nfds_out);
		return EPROTO;
	}
	if (resp_len)
		memcpy(resp, buf + sizeof(rh), resp_len);
	for (int i = 0; i < nr; i++)
		fds_out[i] = rfds[i];
	return 0;
}

int srn_call_handle(struct srn_conn *c, uint16_t op, uint32_t handle)
{
	struct softrnic_handle_msg req = {.handle = handle};
	return srn_call(c, op, &req, sizeof(req), NULL, 0, NULL, 0, NULL, 0);
}

void srn_doorbell_ring(int fd)
{
	uint64_t one = 1;
	ssize_t n;
	do
		n = write(fd, &one, sizeof(one));
	while (n < 0 && errno == EINTR);
}

int srn_ring_map(struct srn_ring *r, int fd, uint32_t slot_size, uint32_t slots)
{
	memset(r, 0, sizeof(*r));
	if (slots == 0 || slots > SOFTRNIC_RING_MAX_SLOTS || (slots & (slots - 1)) || slot_size == 0 ||
	    slot_size > SOFTRNIC_RING_MAX_SLOT_SIZE || slot_size % 8) {
		close(fd);
		return EPROTO;
	}
	long pg = sysconf(_SC_PAGESIZE);
	size_t len = SOFTRNIC_RING_HEADER_SIZE + (size_t)slot_size * slots;
	len = (len + pg - 1) / pg * pg;
	/* A memfd the daemon could shrink would fault us with SIGBUS. */
	int seals = fcntl(fd, F_GET_SEALS);
	struct stat st;
	if (seals < 0 || !(seals & F_SEAL_SHRINK) || fstat(fd, &st) < 0 || (size_t)st.st_size < len) {
		close(fd);
		return EPROTO;
	}
	void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	int err = errno;
	close(fd);
	if (m == MAP_FAILED)
		return err;
	r->mem = m;
	r->len = len;
	r->hdr = m;
	r->slot_size = slot_size;
	r->slots = slots;
	r->base = r->mem + SOFTRNIC_RING_HEADER_SIZE;
	if (r->hdr->magic != SOFTRNIC_RING_HEADER_MAGIC || r->hdr->version != SOFTRNIC_RING_HEADER_VERSION ||
	    r->hdr->slot_size != slot_size || r->hdr->slots != slots) {
		srn_ring_unmap(r);
		return EPROTO;
	}
	return 0;
}

void srn_ring_unmap(struct srn_ring *r)
{
	if (r->mem)
		munmap(r->mem, r->len);
	r->mem = NULL;
}

void srn_producer_init(struct srn_producer *p, struct srn_ring *r, int db)
{
	uint64_t h = __atomic_load_n(&r->hdr->prod, __ATOMIC_SEQ_CST);
	*p = (struct srn_producer){.r = r, .head = h, .published = h,
				   .cached_cons = __atomic_load_n(&r->hdr->cons, __ATOMIC_SEQ_CST), .db = db};
}

void srn_consumer_init(struct srn_consumer *c, struct srn_ring *r)
{
	uint64_t t = __atomic_load_n(&r->hdr->cons, __ATOMIC_SEQ_CST);
	*c = (struct srn_consumer){.r = r, .tail = t, .released = t, .cached_prod = t};
}

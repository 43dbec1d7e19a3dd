/*
 * cm_test: softrnic's own test of its librdmacm.so.1, built against the
 * stock librdmacm-dev as any application is and run with softrnic's
 * libraries (softrnic run) against a daemon on a veth in a namespace.
 *
 *   cm_test local PEER4 PEER6 OTHER4 UNREACH4
 *       event channels (the fd readable exactly while events wait,
 *       O_NONBLOCK, acks and destroy), IDs, binding, address and route
 *       resolution over IPv4 and IPv6 (PEER4, PEER6: the veth's other
 *       end; our own address; OTHER4: routed through an interface that is
 *       not the daemon's, ADDR_ERROR; UNREACH4: no route), synchronous IDs,
 *       migration, rdma_getaddrinfo, endpoints, QPs on IDs in the
 *       application's PD, rdma_init_qp_attr, options, rsocket calls, and
 *       what a daemon without rdma_cm connections answers
 *   cm_test fatal
 *       prints "ready" and waits for the daemon to go away: the bound ID
 *       gets DEVICE_REMOVAL, the unbound one nothing
 *   cm_test server PORT
 *   cm_test client PEER4 PEER6 PORT
 *       connections between two processes on two daemons: refused (no
 *       listener: REJECTED, reason 8), RC over IPv4 with the QP driven by
 *       the library (private data both ways, SEND_WITH_IMM both ways,
 *       disconnect from the client), rejected with private data, RC over
 *       IPv6 with the application's own QP (rping -q: rdma_init_qp_attr,
 *       CONNECT_RESPONSE, rdma_establish; disconnect from the server), and
 *       the UDP port space (SIDR: the server's UD QP, Q_Key and address)
 *
 * Asserts librdmacm's documented results; prints "N passed, M failed" and
 * exits non-zero on any failure.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <rdma/rdma_cma.h>
#include <rdma/rsocket.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <unistd.h>

#include "check.h"

static struct sockaddr_storage addr_of(const char *ip, uint16_t port)
{
	struct sockaddr_storage ss;
	memset(&ss, 0, sizeof(ss));
	struct sockaddr_in *in = (struct sockaddr_in *)&ss;
	struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
	if (inet_pton(AF_INET, ip, &in->sin_addr) == 1) {
		in->sin_family = AF_INET;
		in->sin_port = htons(port);
	} else if (inet_pton(AF_INET6, ip, &in6->sin6_addr) == 1) {
		in6->sin6_family = AF_INET6;
		in6->sin6_port = htons(port);
	} else {
		fprintf(stderr, "bad address %s\n", ip);
		exit(2);
	}
	return ss;
}

#define SA(ss) ((struct sockaddr *)&(ss))

static void gid_of(const struct sockaddr *sa, union ibv_gid *g)
{
	memset(g, 0, sizeof(*g));
	if (sa->sa_family == AF_INET) {
		g->raw[10] = g->raw[11] = 0xff;
		memcpy(g->raw + 12, &((const struct sockaddr_in *)sa)->sin_addr, 4);
	} else {
		memcpy(g->raw, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
	}
}

static bool same_ip(const struct sockaddr *a, const struct sockaddr *b)
{
	union ibv_gid ga, gb;
	gid_of(a, &ga);
	gid_of(b, &gb);
	return a->sa_family == b->sa_family && !memcmp(&ga, &gb, sizeof(ga));
}

static const char *ntop(const struct sockaddr *sa)
{
	static char buf[4][INET6_ADDRSTRLEN];
	static int i;
	char *b = buf[i++ % 4];
	const void *a = sa->sa_family == AF_INET ? (const void *)&((const struct sockaddr_in *)sa)->sin_addr
						 : (const void *)&((const struct sockaddr_in6 *)sa)->sin6_addr;
	if (!inet_ntop(sa->sa_family, a, b, INET6_ADDRSTRLEN))
		snprintf(b, INET6_ADDRSTRLEN, "family %d", sa->sa_family);
	return b;
}

static int readable(int fd, int ms)
{
	struct pollfd p = {.fd = fd, .events = POLLIN};
	return poll(&p, 1, ms) == 1 && (p.revents & POLLIN);
}

/* How long an expected event may take: the peer process and both daemons
 * may be starved of CPU for seconds on a loaded machine. */
enum { EVENT_WAIT_MS = 30000 };

/* The next event of ch, within EVENT_WAIT_MS; NULL on error. */
static struct rdma_cm_event *next_event(struct rdma_event_channel *ch)
{
	if (!readable(ch->fd, EVENT_WAIT_MS))
		return NULL;
	struct rdma_cm_event *e = NULL;
	return rdma_get_cm_event(ch, &e) ? NULL : e;
}

/* Expects ch's next event to be type for id with status; acks it. */
static void expect(struct rdma_event_channel *ch, struct rdma_cm_id *id, enum rdma_cm_event_type type, int status)
{
	struct rdma_cm_event *e = next_event(ch);
	CHECK(e && e->event == type && e->id == id && e->status == status && !e->listen_id,
	      "want %s status %d for %p, got %s status %d for %p", rdma_event_str(type), status, (void *)id,
	      e ? rdma_event_str(e->event) : strerror(errno), e ? e->status : 0, e ? (void *)e->id : NULL);
	if (e)
		rdma_ack_cm_event(e);
}

/* The device's first GID of family as an address. */
static struct sockaddr_storage our_addr(struct ibv_context *ctx, int family)
{
	struct ibv_port_attr pa;
	struct sockaddr_storage ss;
	memset(&ss, 0, sizeof(ss));
	if (ibv_query_port(ctx, 1, &pa))
		return ss;
	for (int i = 0; i < pa.gid_tbl_len; i++) {
		union ibv_gid g;
		if (ibv_query_gid(ctx, 1, i, &g))
			continue;
		bool v4 = !memcmp(g.raw, "\0\0\0\0\0\0\0\0\0\0\xff\xff", 12);
		if (family == AF_INET && v4) {
			struct sockaddr_in *in = (struct sockaddr_in *)&ss;
			in->sin_family = AF_INET;
			memcpy(&in->sin_addr, g.raw + 12, 4);
			return ss;
		}
		if (family == AF_INET6 && !v4 && g.raw[0] != 0xfe && g.raw[0]) {
			struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
			in6->sin6_family = AF_INET6;
			memcpy(&in6->sin6_addr, g.raw, 16);
			return ss;
		}
	}
	return ss;
}

static struct ibv_context *device(void)
{
	int n = -1;
	struct ibv_context **devs = rdma_get_devices(&n);
	MUST(devs && n == 1 && devs[0] && !devs[1], "rdma_get_devices: %p, %d", (void *)devs, n);
	struct ibv_context *ctx = devs[0];
	CHECK(!strncmp(ibv_get_device_name(ctx->device), "softrnic_", 9), "device %s",
	      ibv_get_device_name(ctx->device));
	rdma_free_devices(devs);
	return ctx;
}

static void test_channel(void)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	MUST(ch && ch->fd >= 0, "create_event_channel: %s", strerror(errno));
	CHECK(!readable(ch->fd, 0), "a new channel is readable");
	struct rdma_cm_event *e;
	errno = 0;
	CHECK(rdma_get_cm_event(ch, NULL) == -1 && errno == EINVAL, "get_cm_event(NULL): %s", strerror(errno));
	errno = 0;
	CHECK(rdma_ack_cm_event(NULL) == -1 && errno == EINVAL, "ack_cm_event(NULL): %s", strerror(errno));
	fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK);
	errno = 0;
	CHECK(rdma_get_cm_event(ch, &e) == -1 && errno == EAGAIN, "non-blocking, no event: %s", strerror(errno));
	rdma_destroy_event_channel(ch);

	CHECK(!strcmp(rdma_event_str(RDMA_CM_EVENT_ADDR_RESOLVED), "RDMA_CM_EVENT_ADDR_RESOLVED") &&
		      !strcmp(rdma_event_str(RDMA_CM_EVENT_TIMEWAIT_EXIT), "RDMA_CM_EVENT_TIMEWAIT_EXIT") &&
		      !strcmp(rdma_event_str((enum rdma_cm_event_type)99), "UNKNOWN EVENT"),
	      "event_str");
}

static void test_bind(struct ibv_context *ctx, struct rdma_event_channel *ch)
{
	struct rdma_cm_id *a, *b, *w;
	errno = 0;
	CHECK(rdma_create_id(ch, &a, NULL, (enum rdma_port_space)0x7777) == -1 && errno == EINVAL,
	      "create_id with a bad port space: %s", strerror(errno));
	MUST(rdma_create_id(ch, &a, &a, RDMA_PS_TCP) == 0, "create_id: %s", strerror(errno));
	CHECK(!a->verbs && a->channel == ch && a->context == &a && a->ps == RDMA_PS_TCP && a->qp_type == IBV_QPT_RC &&
		      !a->qp,
	      "new ID");

	struct sockaddr_storage ss;
	memset(&ss, 0, sizeof(ss));
	ss.ss_family = AF_IB;
	errno = 0;
	CHECK(rdma_bind_addr(a, SA(ss)) == -1 && errno == EINVAL, "bind AF_IB: %s", strerror(errno));
	ss = addr_of("192.0.2.77", 0);
	errno = 0;
	CHECK(rdma_bind_addr(a, SA(ss)) == -1 && errno == EADDRNOTAVAIL, "bind to no one's address: %s",
	      strerror(errno));
	ss = addr_of("127.0.0.1", 0);
	errno = 0;
	CHECK(rdma_bind_addr(a, SA(ss)) == -1 && errno == ENODEV, "bind to loopback (no RDMA device): %s",
	      strerror(errno));

	struct sockaddr_storage me = our_addr(ctx, AF_INET);
	MUST(me.ss_family == AF_INET, "the device has no IPv4 GID");
	CHECK(rdma_bind_addr(a, SA(me)) == 0, "bind %s: %s", ntop(SA(me)), strerror(errno));
	uint16_t port = ntohs(rdma_get_src_port(a));
	CHECK(a->verbs == ctx && a->port_num == 1 && a->pd && same_ip(&a->route.addr.src_addr, SA(me)) &&
		      port >= 32768 && port <= 60999,
	      "bound: verbs %p port_num %d port %u", (void *)a->verbs, a->port_num, port);
	union ibv_gid g;
	gid_of(SA(me), &g);
	CHECK(!memcmp(&a->route.addr.addr.ibaddr.sgid, &g, sizeof(g)) &&
		      a->route.addr.addr.ibaddr.pkey == htobe16(0xffff),
	      "bound ID's GID and P_Key");
	errno = 0;
	CHECK(rdma_bind_addr(a, SA(me)) == -1 && errno == EINVAL, "second bind: %s", strerror(errno));

	MUST(rdma_create_id(ch, &b, NULL, RDMA_PS_TCP) == 0, "create_id: %s", strerror(errno));
	struct sockaddr_storage taken = me;
	((struct sockaddr_in *)&taken)->sin_port = htons(port);
	errno = 0;
	CHECK(rdma_bind_addr(b, SA(taken)) == -1 && errno == EADDRINUSE, "bind a taken port: %s", strerror(errno));
	int one = 1;
	CHECK(rdma_set_option(b, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &one, sizeof(one)) == 0, "REUSEADDR: %s",
	      strerror(errno));
	/* In the UDP port space the TCP port is free. */
	MUST(rdma_create_id(ch, &w, NULL, RDMA_PS_UDP) == 0, "create_id UDP: %s", strerror(errno));
	CHECK(w->qp_type == IBV_QPT_UD, "UDP ID's QP type %d", w->qp_type);
	CHECK(rdma_bind_addr(w, SA(taken)) == 0, "the same port in the UDP space: %s", strerror(errno));
	rdma_destroy_id(w);
	rdma_destroy_id(a);
	CHECK(rdma_bind_addr(b, SA(taken)) == 0, "a port its ID gave back: %s", strerror(errno));
	errno = 0;
	CHECK(rdma_set_option(b, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &one, sizeof(one)) == -1 && errno == EINVAL,
	      "REUSEADDR once bound: %s", strerror(errno));
	rdma_destroy_id(b);

	MUST(rdma_create_id(ch, &w, NULL, RDMA_PS_TCP) == 0, "create_id: %s", strerror(errno));
	struct sockaddr_in any = {.sin_family = AF_INET, .sin_port = htons(7471)};
	CHECK(rdma_bind_addr(w, (struct sockaddr *)&any) == 0 && !w->verbs && ntohs(rdma_get_src_port(w)) == 7471,
	      "wildcard bind: %s, verbs %p", strerror(errno), (void *)w->verbs);
	rdma_destroy_id(w);
	CHECK(!readable(ch->fd, 0), "binding queues no event");
}

static void test_resolve(struct ibv_context *ctx, struct rdma_event_channel *ch, const char *peer4,
			 const char *peer6, const char *other4, const char *unreach4)
{
	struct rdma_cm_id *id;
	struct ibv_port_attr pa;
	MUST(ibv_query_port(ctx, 1, &pa) == 0, "query_port");
	struct sockaddr_storage dst = addr_of(peer4, 7471), me4 = our_addr(ctx, AF_INET), me6 = our_addr(ctx, AF_INET6);
	MUST(me6.ss_family == AF_INET6, "the device has no global IPv6 GID");

	MUST(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0, "create_id: %s", strerror(errno));
	errno = 0;
	CHECK(rdma_resolve_route(id, 1000) == -1 && errno == EINVAL, "route before address: %s", strerror(errno));
	errno = 0;
	CHECK(rdma_resolve_addr(id, NULL, NULL, 1000) == -1 && errno == EINVAL, "no destination: %s", strerror(errno));
	CHECK(rdma_resolve_addr(id, NULL, SA(dst), 1000) == 0, "resolve_addr %s: %s", peer4, strerror(errno));
	CHECK(readable(ch->fd, 1000), "no event after resolve_addr");
	struct rdma_cm_event *e = next_event(ch);
	MUST(e, "no event: %s", strerror(errno));
	CHECK(e->event == RDMA_CM_EVENT_ADDR_RESOLVED && e->status == 0 && e->id == id && !e->listen_id,
	      "event %s status %d", rdma_event_str(e->event), e->status);
	CHECK(!readable(ch->fd, 0), "readable after its only event was taken");
	rdma_ack_cm_event(e);
	CHECK(id->verbs == ctx && id->port_num == 1 && same_ip(&id->route.addr.src_addr, SA(me4)) &&
		      same_ip(&id->route.addr.dst_addr, SA(dst)) && ntohs(rdma_get_dst_port(id)) == 7471 &&
		      ntohs(rdma_get_src_port(id)) >= 32768,
	      "resolved %s -> %s", ntop(&id->route.addr.src_addr), ntop(&id->route.addr.dst_addr));
	union ibv_gid g;
	gid_of(SA(dst), &g);
	CHECK(!memcmp(&id->route.addr.addr.ibaddr.dgid, &g, sizeof(g)), "dgid");
	errno = 0;
	CHECK(rdma_resolve_addr(id, NULL, SA(dst), 1000) == -1 && errno == EINVAL, "resolve twice: %s",
	      strerror(errno));
	CHECK(rdma_resolve_route(id, 1000) == 0, "resolve_route: %s", strerror(errno));
	expect(ch, id, RDMA_CM_EVENT_ROUTE_RESOLVED, 0);
	struct ibv_sa_path_rec *p = id->route.path_rec;
	CHECK(id->route.num_paths == 1 && p && !memcmp(&p->dgid, &g, sizeof(g)) &&
		      !memcmp(&p->sgid, &id->route.addr.addr.ibaddr.sgid, sizeof(g)) && p->pkey == htobe16(0xffff) &&
		      p->mtu == pa.active_mtu && p->hop_limit > 0,
	      "path: %d paths, mtu %d (port %d)", id->route.num_paths, p ? p->mtu : -1, pa.active_mtu);
	rdma_destroy_id(id);

	/* IPv6: the source is our IPv6 GID. */
	MUST(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0, "create_id: %s", strerror(errno));
	struct sockaddr_storage dst6 = addr_of(peer6, 7471);
	CHECK(rdma_resolve_addr(id, NULL, SA(dst6), 1000) == 0, "resolve_addr %s: %s", peer6, strerror(errno));
	expect(ch, id, RDMA_CM_EVENT_ADDR_RESOLVED, 0);
	CHECK(id->route.addr.src_addr.sa_family == AF_INET6 && same_ip(&id->route.addr.src_addr, SA(me6)),
	      "IPv6 source %s, want %s", ntop(&id->route.addr.src_addr), ntop(SA(me6)));
	CHECK(rdma_resolve_route(id, 1000) == 0, "resolve_route IPv6: %s", strerror(errno));
	expect(ch, id, RDMA_CM_EVENT_ROUTE_RESOLVED, 0);
	rdma_destroy_id(id);

	/* Our own address (loopback), and the wildcard, which is this host. */
	MUST(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0, "create_id: %s", strerror(errno));
	CHECK(rdma_resolve_addr(id, NULL, SA(me4), 1000) == 0, "resolve own address: %s", strerror(errno));
	expect(ch, id, RDMA_CM_EVENT_ADDR_RESOLVED, 0);
	CHECK(same_ip(&id->route.addr.src_addr, SA(me4)) && same_ip(&id->route.addr.dst_addr, SA(me4)),
	      "loopback %s -> %s", ntop(&id->route.addr.src_addr), ntop(&id->route.addr.dst_addr));
	rdma_destroy_id(id);
	MUST(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0, "create_id: %s", strerror(errno));
	struct sockaddr_in any = {.sin_family = AF_INET};
	CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&any, 1000) == 0, "resolve the wildcard: %s",
	      strerror(errno));
	expect(ch, id, RDMA_CM_EVENT_ADDR_RESOLVED, 0);
	CHECK(same_ip(&id->route.addr.dst_addr, SA(me4)), "wildcard resolved to %s", ntop(&id->route.addr.dst_addr));
	rdma_destroy_id(id);

	/* A bound source is kept; a source of the other family is refused. */
	MUST(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0, "create_id: %s", strerror(errno));
	errno = 0;
	CHECK(rdma_resolve_addr(id, SA(me6), SA(dst), 1000) == -1 && errno == EINVAL, "IPv6 source to IPv4: %s",
	      strerror(errno));
	rdma_destroy_id(id);
	MUST(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0, "create_id: %s", strerror(errno));
	CHECK(rdma_resolve_addr(id, SA(me4), SA(dst), 1000) == 0, "resolve from %s: %s", ntop(SA(me4)),
	      strerror(errno));
	expect(ch, id, RDMA_CM_EVENT_ADDR_RESOLVED, 0);
	rdma_destroy_id(id);

	/* No route: at once, as the kernel fails. */
	MUST(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0, "create_id: %s", strerror(errno));
	struct sockaddr_storage un = addr_of(unreach4, 1);
	errno = 0;
	CHECK(rdma_resolve_addr(id, NULL, SA(un), 1000) == -1 && errno == ENETUNREACH, "resolve %s: %s", unreach4,
	      strerror(errno));
	CHECK(!readable(ch->fd, 0), "a failed resolve_addr queued an event");
	/* Routed out of another interface: ADDR_ERROR, -ENODEV; the ID may
	 * try again. */
	struct sockaddr_storage oth = addr_of(other4, 1);
	CHECK(rdma_resolve_addr(id, NULL, SA(oth), 1000) == 0, "resolve %s: %s", other4, strerror(errno));
	expect(ch, id, RDMA_CM_EVENT_ADDR_ERROR, -ENODEV);
	CHECK(rdma_resolve_addr(id, NULL, SA(dst), 1000) == 0, "resolve after ADDR_ERROR: %s", strerror(errno));
	expect(ch, id, RDMA_CM_EVENT_ADDR_RESOLVED, 0);
	rdma_destroy_id(id);
}

struct acker {
	struct rdma_cm_event *e;
	volatile int acked;
};

static void *ack_later(void *arg)
{
	struct acker *a = arg;
	usleep(100 * 1000);
	a->acked = 1;
	rdma_ack_cm_event(a->e);
	return NULL;
}

static void test_queue(struct rdma_event_channel *ch, const char *peer4)
{
	struct sockaddr_storage dst = addr_of(peer4, 7471);
	struct rdma_cm_id *ids[3];
	for (int i = 0; i < 3; i++) {
		MUST(rdma_create_id(ch, &ids[i], NULL, RDMA_PS_TCP) == 0, "create_id: %s", strerror(errno));
		CHECK(rdma_resolve_addr(ids[i], NULL, SA(dst), 1000) == 0, "resolve_addr: %s", strerror(errno));
	}
	/* Readable exactly while events wait, in order. */
	fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK);
	struct rdma_cm_event *e[3];
	for (int i = 0; i < 3; i++) {
		CHECK(readable(ch->fd, 0), "not readable with %d events queued", 3 - i);
		CHECK(rdma_get_cm_event(ch, &e[i]) == 0 && e[i]->id == ids[i], "event %d: %s", i, strerror(errno));
	}
	CHECK(!readable(ch->fd, 0), "readable with no event queued");
	struct rdma_cm_event *none;
	errno = 0;
	CHECK(rdma_get_cm_event(ch, &none) == -1 && errno == EAGAIN, "empty non-blocking channel: %s",
	      strerror(errno));
	fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) & ~O_NONBLOCK);
	rdma_ack_cm_event(e[0]);
	rdma_ack_cm_event(e[1]);
	rdma_destroy_id(ids[0]);
	rdma_destroy_id(ids[1]);

	/* Destroy waits for the ack of an event handed out. */
	struct acker a = {.e = e[2]};
	pthread_t t;
	pthread_create(&t, NULL, ack_later, &a);
	rdma_destroy_id(ids[2]);
	CHECK(a.acked, "destroy_id returned before its event was acknowledged");
	pthread_join(t, NULL);

	/* Destroy drops the events not handed out. */
	struct rdma_cm_id *id;
	MUST(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0, "create_id: %s", strerror(errno));
	CHECK(rdma_resolve_addr(id, NULL, SA(dst), 1000) == 0, "resolve_addr: %s", strerror(errno));
	CHECK(readable(ch->fd, 0), "no event queued");
	rdma_destroy_id(id);
	CHECK(!readable(ch->fd, 0), "the destroyed ID's event is still queued");
}

static void test_migrate_sync(struct rdma_event_channel *ch, const char *peer4, const char *other4)
{
	struct sockaddr_storage dst = addr_of(peer4, 7471), oth = addr_of(other4, 1);
	struct rdma_event_channel *ch2 = rdma_create_event_channel();
	MUST(ch2, "create_event_channel: %s", strerror(errno));
	struct rdma_cm_id *id;
	MUST(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0, "create_id: %s", strerror(errno));
	CHECK(rdma_resolve_addr(id, NULL, SA(dst), 1000) == 0, "resolve_addr: %s", strerror(errno));
	CHECK(rdma_migrate_id(id, ch2) == 0 && id->channel == ch2, "migrate_id: %s", strerror(errno));
	CHECK(!readable(ch->fd, 0) && readable(ch2->fd, 0), "the queued event did not move with its ID");
	expect(ch2, id, RDMA_CM_EVENT_ADDR_RESOLVED, 0);
	/* To a channel of its own: synchronous from then on. */
	CHECK(rdma_migrate_id(id, NULL) == 0 && id->channel != ch2, "migrate_id(NULL): %s", strerror(errno));
	CHECK(rdma_resolve_route(id, 1000) == 0 && id->event && id->event->event == RDMA_CM_EVENT_ROUTE_RESOLVED,
	      "synchronous resolve_route: %s", strerror(errno));
	errno = 0;
	CHECK(rdma_migrate_id(id, NULL) == -1 && errno == EINVAL, "migrate a synchronous ID to NULL: %s",
	      strerror(errno));
	rdma_destroy_id(id);
	rdma_destroy_event_channel(ch2);

	/* A synchronous ID: the calls return with the outcome. */
	MUST(rdma_create_id(NULL, &id, NULL, RDMA_PS_TCP) == 0, "create_id(NULL channel): %s", strerror(errno));
	CHECK(id->channel && id->channel->fd >= 0, "a synchronous ID has a channel");
	errno = 0;
	CHECK(rdma_resolve_addr(id, NULL, SA(oth), 1000) == -1 && errno == ENODEV && id->event &&
		      id->event->event == RDMA_CM_EVENT_ADDR_ERROR,
	      "synchronous ADDR_ERROR: %s", strerror(errno));
	CHECK(rdma_resolve_addr(id, NULL, SA(dst), 1000) == 0 && id->event &&
		      id->event->event == RDMA_CM_EVENT_ADDR_RESOLVED,
	      "synchronous resolve_addr: %s", strerror(errno));
	CHECK(rdma_resolve_route(id, 1000) == 0, "synchronous resolve_route: %s", strerror(errno));
	rdma_destroy_id(id); /* acks the event it holds */
}

static void test_getaddrinfo(const char *peer4, const char *peer6)
{
	struct rdma_addrinfo hints = {.ai_port_space = RDMA_PS_TCP}, *res;
	errno = 0;
	CHECK(rdma_getaddrinfo(NULL, NULL, NULL, &res) == -1 && errno == EINVAL, "getaddrinfo of nothing: %s",
	      strerror(errno));
	CHECK(rdma_getaddrinfo(peer4, "7471", &hints, &res) == 0, "getaddrinfo %s", peer4);
	struct sockaddr_storage want = addr_of(peer4, 7471);
	CHECK(res->ai_family == AF_INET && res->ai_port_space == RDMA_PS_TCP && res->ai_qp_type == IBV_QPT_RC &&
		      res->ai_dst_len == sizeof(struct sockaddr_in) && same_ip(res->ai_dst_addr, SA(want)) &&
		      ((struct sockaddr_in *)res->ai_dst_addr)->sin_port == htons(7471) && !res->ai_src_addr &&
		      !(res->ai_flags & RAI_PASSIVE) && !res->ai_next,
	      "getaddrinfo %s: family %d ps %d qp %d", peer4, res->ai_family, res->ai_port_space, res->ai_qp_type);
	rdma_freeaddrinfo(res);
	hints.ai_port_space = RDMA_PS_UDP;
	CHECK(rdma_getaddrinfo(peer6, "7174", &hints, &res) == 0 && res->ai_family == AF_INET6 &&
		      res->ai_port_space == RDMA_PS_UDP && res->ai_qp_type == IBV_QPT_UD,
	      "getaddrinfo %s UDP", peer6);
	rdma_freeaddrinfo(res);
	hints = (struct rdma_addrinfo){.ai_flags = RAI_PASSIVE, .ai_port_space = RDMA_PS_TCP};
	CHECK(rdma_getaddrinfo(NULL, "7471", &hints, &res) == 0 && (res->ai_flags & RAI_PASSIVE) && res->ai_src_addr &&
		      !res->ai_dst_addr && ((struct sockaddr_in *)res->ai_src_addr)->sin_port == htons(7471),
	      "passive getaddrinfo");
	rdma_freeaddrinfo(res);
	hints = (struct rdma_addrinfo){.ai_flags = RAI_NUMERICHOST};
	CHECK(rdma_getaddrinfo("not-an-address", "1", &hints, &res) == EAI_NONAME, "a name with RAI_NUMERICHOST");
	hints = (struct rdma_addrinfo){.ai_family = AF_IB};
	CHECK(rdma_getaddrinfo(peer4, "1", &hints, &res) == EAI_FAMILY, "AF_IB");
}

static void test_qp(struct ibv_context *ctx, struct rdma_event_channel *ch, const char *peer4)
{
	struct sockaddr_storage dst = addr_of(peer4, 7471);
	struct rdma_cm_id *id;
	MUST(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0, "create_id: %s", strerror(errno));
	struct ibv_qp_init_attr qa = {.qp_type = IBV_QPT_RC, .cap = {.max_send_wr = 4, .max_recv_wr = 4,
								       .max_send_sge = 1, .max_recv_sge = 1}};
	errno = 0;
	CHECK(rdma_create_qp(id, NULL, &qa) == -1 && errno == EINVAL, "create_qp on an unbound ID: %s",
	      strerror(errno));
	CHECK(rdma_resolve_addr(id, NULL, SA(dst), 1000) == 0, "resolve_addr: %s", strerror(errno));
	expect(ch, id, RDMA_CM_EVENT_ADDR_RESOLVED, 0);
	CHECK(rdma_resolve_route(id, 1000) == 0, "resolve_route: %s", strerror(errno));
	expect(ch, id, RDMA_CM_EVENT_ROUTE_RESOLVED, 0);

	struct ibv_qp_attr a;
	int mask;
	a.qp_state = IBV_QPS_INIT;
	CHECK(rdma_init_qp_attr(id, &a, &mask) == 0 &&
		      mask == (IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) &&
		      a.port_num == 1 && a.pkey_index == 0 && a.qp_access_flags == 0,
	      "init_qp_attr INIT: mask %#x", mask);
	a.qp_state = IBV_QPS_RTR;
	errno = 0;
	CHECK(rdma_init_qp_attr(id, &a, &mask) == -1 && errno == EINVAL, "init_qp_attr RTR unconnected: %s",
	      strerror(errno));
	a.qp_state = IBV_QPS_SQD;
	errno = 0;
	CHECK(rdma_init_qp_attr(id, &a, &mask) == -1 && errno == EINVAL, "init_qp_attr SQD: %s", strerror(errno));

	/* The QP is the application's, in its PD on our libibverbs. */
	struct ibv_pd *pd = ibv_alloc_pd(id->verbs);
	struct ibv_comp_channel *cc = ibv_create_comp_channel(id->verbs);
	struct ibv_cq *cq = cc ? ibv_create_cq(id->verbs, 8, NULL, cc, 0) : NULL;
	MUST(pd && cq, "PD and CQ on id->verbs: %s", strerror(errno));
	qa.send_cq = qa.recv_cq = cq;
	CHECK(rdma_create_qp(id, pd, &qa) == 0, "create_qp: %s", strerror(errno));
	MUST(id->qp, "no QP");
	CHECK(id->qp->pd == pd && id->pd == pd && id->qp->qp_num > 1 && id->qp->context == ctx && !id->send_cq &&
		      qa.cap.max_send_wr >= 4,
	      "QP %u in PD %p", id->qp->qp_num, (void *)id->qp->pd);
	struct ibv_qp_attr q;
	struct ibv_qp_init_attr qi;
	CHECK(ibv_query_qp(id->qp, &q, IBV_QP_STATE, &qi) == 0 && q.qp_state == IBV_QPS_INIT && q.port_num == 1,
	      "QP state %d", q.qp_state);
	errno = 0;
	CHECK(rdma_create_qp(id, pd, &qa) == -1 && errno == EINVAL, "a second QP: %s", strerror(errno));
	errno = 0;
	CHECK(rdma_disconnect(id) == -1 && errno == EINVAL, "disconnect unconnected: %s", strerror(errno));
	/* The peer runs no CM: the REQ goes unanswered. Disconnecting the
	 * attempt withdraws it (a REJ to the peer) and reports nothing, as
	 * the kernel's rdma_disconnect of a connection not established. */
	struct rdma_conn_param cp = {.responder_resources = 1, .initiator_depth = 1, .retry_count = 7};
	CHECK(rdma_connect(id, &cp) == 0, "connect: %s", strerror(errno));
	errno = 0;
	CHECK(rdma_establish(id) == -1 && errno == EINVAL, "establish with id->qp: %s", strerror(errno));
	CHECK(rdma_disconnect(id) == 0, "disconnect while connecting: %s", strerror(errno));
	ibv_query_qp(id->qp, &q, IBV_QP_STATE, &qi);
	CHECK(q.qp_state == IBV_QPS_ERR, "disconnect leaves the QP in state %d, not ERR", q.qp_state);
	CHECK(!readable(ch->fd, 300), "an event after a withdrawn connect");
	rdma_destroy_qp(id);
	CHECK(!id->qp, "destroy_qp");

	/* A PD of another context is refused. */
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_context *other = list && list[0] ? ibv_open_device(list[0]) : NULL;
	struct ibv_pd *opd = other ? ibv_alloc_pd(other) : NULL;
	MUST(opd, "second context: %s", strerror(errno));
	errno = 0;
	CHECK(rdma_create_qp(id, opd, &qa) == -1 && errno == EINVAL, "a PD of another context: %s", strerror(errno));
	ibv_dealloc_pd(opd);
	ibv_close_device(other);
	ibv_free_device_list(list);

	/* Without CQs the library makes them, on channels of their own. */
	struct ibv_qp_init_attr qb = {.qp_type = IBV_QPT_RC, .cap = {.max_send_wr = 4, .max_recv_wr = 4,
								       .max_send_sge = 1, .max_recv_sge = 1}};
	CHECK(rdma_create_qp(id, NULL, &qb) == 0 && id->qp && id->send_cq && id->recv_cq && id->send_cq_channel &&
		      id->recv_cq_channel && id->qp->send_cq == id->send_cq && id->qp->pd == id->pd,
	      "create_qp with the library's CQs: %s", strerror(errno));
	rdma_destroy_qp(id);
	CHECK(!id->send_cq && !id->recv_cq && !id->send_cq_channel, "destroy_qp destroys the library's CQs");
	rdma_destroy_id(id);
	ibv_destroy_cq(cq);
	ibv_destroy_comp_channel(cc);
	ibv_dealloc_pd(pd);

	/* UDP port space: the QP goes to RTS with rdma_cm's Q_Key. */
	MUST(rdma_create_id(ch, &id, NULL, RDMA_PS_UDP) == 0, "create_id UDP: %s", strerror(errno));
	CHECK(rdma_resolve_addr(id, NULL, SA(dst), 1000) == 0, "resolve_addr: %s", strerror(errno));
	expect(ch, id, RDMA_CM_EVENT_ADDR_RESOLVED, 0);
	a.qp_state = IBV_QPS_INIT;
	CHECK(rdma_init_qp_attr(id, &a, &mask) == 0 && (mask & IBV_QP_QKEY) && a.qkey == RDMA_UDP_QKEY,
	      "UD init_qp_attr: mask %#x qkey %#x", mask, a.qkey);
	struct ibv_qp_init_attr qu = {.qp_type = IBV_QPT_UD, .cap = {.max_send_wr = 4, .max_recv_wr = 4,
								       .max_send_sge = 1, .max_recv_sge = 1}};
	CHECK(rdma_create_qp(id, NULL, &qu) == 0, "UD create_qp: %s", strerror(errno));
	if (id->qp) {
		CHECK(ibv_query_qp(id->qp, &q, IBV_QP_STATE | IBV_QP_QKEY, &qi) == 0 && q.qp_state == IBV_QPS_RTS &&
			      q.qkey == RDMA_UDP_QKEY,
		      "UD QP state %d qkey %#x", q.qp_state, q.qkey);
		rdma_destroy_qp(id);
	}
	rdma_destroy_id(id);
}

static void test_ep(const char *peer4)
{
	struct rdma_addrinfo hints = {.ai_port_space = RDMA_PS_TCP}, *res;
	MUST(rdma_getaddrinfo(peer4, "7471", &hints, &res) == 0, "getaddrinfo");
	struct ibv_qp_init_attr qa = {.cap = {.max_send_wr = 2, .max_recv_wr = 2, .max_send_sge = 1, .max_recv_sge = 1},
				      .sq_sig_all = 1};
	struct rdma_cm_id *id;
	CHECK(rdma_create_ep(&id, res, NULL, &qa) == 0, "create_ep: %s", strerror(errno));
	rdma_freeaddrinfo(res);
	if (!id)
		return;
	struct ibv_qp_attr q;
	struct ibv_qp_init_attr qi;
	CHECK(id->qp && id->send_cq && id->recv_cq && ibv_query_qp(id->qp, &q, IBV_QP_STATE, &qi) == 0 &&
		      q.qp_state == IBV_QPS_INIT && id->event && id->event->event == RDMA_CM_EVENT_ROUTE_RESOLVED,
	      "endpoint: QP %p state %d", (void *)id->qp, q.qp_state);
	/* Nobody answers the REQ: a synchronous connect fails once the CM's
	 * retries are over (UNREACHABLE, -ETIMEDOUT; the test's daemon runs
	 * short CM timers). */
	errno = 0;
	CHECK(rdma_connect(id, NULL) == -1 && errno == ETIMEDOUT, "connect to a silent peer: %s", strerror(errno));
	rdma_destroy_ep(id);

	hints = (struct rdma_addrinfo){.ai_flags = RAI_PASSIVE, .ai_port_space = RDMA_PS_TCP};
	MUST(rdma_getaddrinfo(NULL, "7471", &hints, &res) == 0, "passive getaddrinfo");
	CHECK(rdma_create_ep(&id, res, NULL, &qa) == 0 && !id->qp && ntohs(rdma_get_src_port(id)) == 7471,
	      "passive create_ep: %s", strerror(errno));
	rdma_freeaddrinfo(res);
	CHECK(rdma_listen(id, 4) == 0, "listen: %s", strerror(errno));
	rdma_destroy_ep(id);
}

static void test_options_and_stubs(struct rdma_event_channel *ch)
{
	struct rdma_cm_id *id;
	MUST(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0, "create_id: %s", strerror(errno));
	uint8_t tos = 32, t = 18;
	int v = 1;
	CHECK(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, sizeof(tos)) == 0, "TOS: %s",
	      strerror(errno));
	errno = 0;
	CHECK(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &v, sizeof(v)) == -1 && errno == EINVAL,
	      "TOS of the wrong size: %s", strerror(errno));
	CHECK(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &t, sizeof(t)) == 0, "ACK_TIMEOUT: %s",
	      strerror(errno));
	CHECK(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, &v, sizeof(v)) == 0, "AFONLY: %s",
	      strerror(errno));
	errno = 0;
	CHECK(rdma_set_option(id, RDMA_OPTION_ID, 77, &v, sizeof(v)) == -1 && errno == ENOSYS, "unknown option: %s",
	      strerror(errno));
	errno = 0;
	CHECK(rdma_set_option(id, 9, 0, &v, sizeof(v)) == -1 && errno == ENOSYS, "unknown level: %s",
	      strerror(errno));

	struct ibv_ece ece = {.vendor_id = 0x15b3, .options = 1}, got;
	CHECK(rdma_set_local_ece(id, &ece) == 0, "set_local_ece: %s", strerror(errno));
	CHECK(rdma_get_remote_ece(id, &got) == 0 && got.vendor_id == 0 && got.options == 0,
	      "no remote ECE without a connection");
	ece.vendor_id = 0;
	errno = 0;
	CHECK(rdma_set_local_ece(id, &ece) == -1 && errno == EINVAL, "ECE without a vendor: %s", strerror(errno));

	struct sockaddr_storage mc = addr_of("239.1.1.1", 0);
	errno = 0;
	CHECK(rdma_join_multicast(id, SA(mc), NULL) == -1 && errno == EOPNOTSUPP, "join_multicast: %s",
	      strerror(errno));
	errno = 0;
	CHECK(rdma_leave_multicast(id, SA(mc)) == -1 && errno == EADDRNOTAVAIL, "leave_multicast: %s",
	      strerror(errno));
	/* Unbound: it listens on a free port of any IPv4 address. */
	CHECK(rdma_listen(id, 1) == 0 && ntohs(rdma_get_src_port(id)) != 0, "listen: %s", strerror(errno));
	errno = 0;
	CHECK(rdma_notify(id, IBV_EVENT_COMM_EST) == -1 && errno == EINVAL, "notify on a listener: %s",
	      strerror(errno));
	rdma_destroy_id(id);

	/* rsockets: none can be made; poll and select work on any fd. */
	errno = 0;
	CHECK(rsocket(AF_INET, SOCK_STREAM, 0) == -1 && errno == EOPNOTSUPP, "rsocket: %s", strerror(errno));
	errno = 0;
	CHECK(rclose(1000) == -1 && errno == EBADF, "rclose: %s", strerror(errno));
	errno = 0;
	CHECK(rsend(1000, "x", 1, 0) == -1 && errno == EBADF, "rsend: %s", strerror(errno));
	MUST(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0, "create_id: %s", strerror(errno));
	struct sockaddr_in any = {.sin_family = AF_INET};
	CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&any, 1000) == 0, "resolve: %s", strerror(errno));
	struct pollfd p = {.fd = ch->fd, .events = POLLIN};
	CHECK(rpoll(&p, 1, 1000) == 1 && (p.revents & POLLIN), "rpoll on the channel");
	fd_set rs;
	FD_ZERO(&rs);
	FD_SET(ch->fd, &rs);
	struct timeval tv = {1, 0};
	CHECK(rselect(ch->fd + 1, &rs, NULL, NULL, &tv) == 1 && FD_ISSET(ch->fd, &rs), "rselect on the channel");
	expect(ch, id, RDMA_CM_EVENT_ADDR_RESOLVED, 0);
	p.revents = 0;
	CHECK(rpoll(&p, 1, 0) == 0, "rpoll on an empty channel");
	rdma_destroy_id(id);
}

static void run_local(const char *peer4, const char *peer6, const char *other4, const char *unreach4)
{
	test_channel();
	struct ibv_context *ctx = device();
	struct rdma_event_channel *ch = rdma_create_event_channel();
	MUST(ch, "create_event_channel: %s", strerror(errno));
	test_bind(ctx, ch);
	test_resolve(ctx, ch, peer4, peer6, other4, unreach4);
	test_queue(ch, peer4);
	test_migrate_sync(ch, peer4, other4);
	test_getaddrinfo(peer4, peer6);
	test_qp(ctx, ch, peer4);
	test_ep(peer4);
	test_options_and_stubs(ch);
	CHECK(!readable(ch->fd, 0), "events left on the channel");
	rdma_destroy_event_channel(ch);
}

static void run_fatal(void)
{
	struct ibv_context *ctx = device();
	struct rdma_event_channel *ch = rdma_create_event_channel();
	MUST(ch, "create_event_channel: %s", strerror(errno));
	struct rdma_cm_id *bound, *unbound;
	MUST(rdma_create_id(ch, &bound, NULL, RDMA_PS_TCP) == 0 && rdma_create_id(ch, &unbound, NULL, RDMA_PS_TCP) == 0,
	     "create_id: %s", strerror(errno));
	struct sockaddr_storage me = our_addr(ctx, AF_INET);
	MUST(rdma_bind_addr(bound, SA(me)) == 0, "bind: %s", strerror(errno));
	printf("ready\n");
	fflush(stdout);
	struct rdma_cm_event *e = NULL;
	CHECK(rdma_get_cm_event(ch, &e) == 0 && e->event == RDMA_CM_EVENT_DEVICE_REMOVAL && e->id == bound,
	      "want DEVICE_REMOVAL for the bound ID: %s", e ? rdma_event_str(e->event) : strerror(errno));
	if (e)
		rdma_ack_cm_event(e);
	fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK);
	errno = 0;
	CHECK(rdma_get_cm_event(ch, &e) == -1 && errno == EAGAIN, "a second event after DEVICE_REMOVAL: %s",
	      strerror(errno));
	CHECK(!readable(ch->fd, 0), "the channel stays readable");
	errno = 0;
	CHECK(rdma_bind_addr(unbound, SA(me)) == -1 && errno == ENODEV, "bind after removal: %s", strerror(errno));
	errno = 0;
	CHECK(!rdma_create_event_channel() && errno == ENODEV, "new channel after removal: %s", strerror(errno));
	CHECK(rdma_destroy_id(bound) == 0 && rdma_destroy_id(unbound) == 0, "destroy after removal");
	rdma_destroy_event_channel(ch);
}

/* ---- connections (server and client) ---- */

#define CONN_IMM_CLIENT 0x1234
#define CONN_IMM_SERVER 0x5678

struct conn_objs {
	struct ibv_pd *pd;
	struct ibv_cq *cq;
};

static struct conn_objs conn_objs(struct ibv_context *ctx)
{
	struct conn_objs o = {.pd = ibv_alloc_pd(ctx)};
	o.cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	MUST(o.pd && o.cq, "PD and CQ: %s", strerror(errno));
	return o;
}

static struct ibv_qp_init_attr conn_qp_attr(struct conn_objs *o, enum ibv_qp_type t)
{
	return (struct ibv_qp_init_attr){.send_cq = o->cq, .recv_cq = o->cq, .qp_type = t,
					 .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1}};
}

/* A receive with no buffer: zero-length messages carry their immediate
 * data without registered memory. */
static void post_recv0(struct ibv_qp *qp, uint64_t id)
{
	struct ibv_recv_wr wr = {.wr_id = id}, *bad;
	CHECK(ibv_post_recv(qp, &wr, &bad) == 0, "post_recv: %s", strerror(errno));
}

static void send_imm(struct ibv_qp *qp, uint32_t imm)
{
	struct ibv_send_wr wr = {.wr_id = imm, .opcode = IBV_WR_SEND_WITH_IMM, .send_flags = IBV_SEND_SIGNALED,
				 .imm_data = htobe32(imm)},
			   *bad;
	CHECK(ibv_post_send(qp, &wr, &bad) == 0, "post_send: %s", strerror(errno));
}

/* Polls cq for one completion of the given kind within 10 s. */
static void expect_wc(struct ibv_cq *cq, enum ibv_wc_opcode op, uint32_t imm)
{
	struct ibv_wc wc;
	int n = 0;
	for (int i = 0; i < 100000 && n == 0; i++) {
		n = ibv_poll_cq(cq, 1, &wc);
		if (n == 0)
			usleep(100);
	}
	CHECK(n == 1 && wc.status == IBV_WC_SUCCESS && wc.opcode == op &&
		      (op != IBV_WC_RECV || ((wc.wc_flags & IBV_WC_WITH_IMM) && be32toh(wc.imm_data) == imm)),
	      "completion: n %d status %s opcode %d imm %#x", n, n == 1 ? ibv_wc_status_str(wc.status) : "-",
	      n == 1 ? (int)wc.opcode : -1, n == 1 ? be32toh(wc.imm_data) : 0);
}

/* Waits for an event of type on ch (for id when id is not NULL) and
 * returns it unacknowledged. */
static struct rdma_cm_event *want_event(struct rdma_event_channel *ch, struct rdma_cm_id *id,
					enum rdma_cm_event_type type, int status)
{
	struct rdma_cm_event *e = next_event(ch);
	MUST(e, "no %s: %s", rdma_event_str(type), strerror(errno));
	CHECK(e->event == type && e->status == status && (!id || e->id == id), "want %s status %d, got %s status %d",
	      rdma_event_str(type), status, rdma_event_str(e->event), e->status);
	return e;
}

static bool private_is(const struct rdma_cm_event *e, const char *want)
{
	size_t n = strlen(want);
	return e->param.conn.private_data && e->param.conn.private_data_len >= n &&
	       !memcmp(e->param.conn.private_data, want, n);
}

static enum ibv_qp_state qp_state(struct ibv_qp *qp, uint32_t *dest)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;
	if (ibv_query_qp(qp, &a, IBV_QP_STATE | IBV_QP_DEST_QPN, &ia))
		return (enum ibv_qp_state)-1;
	if (dest)
		*dest = a.dest_qp_num;
	return a.qp_state;
}

/* rping -q: the application moves its QP with rdma_init_qp_attr. */
static void self_modify(struct rdma_cm_id *id, struct ibv_qp *qp)
{
	static const enum ibv_qp_state steps[] = {IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS};
	for (int i = 0; i < 3; i++) {
		struct ibv_qp_attr a = {.qp_state = steps[i]};
		int mask;
		CHECK(rdma_init_qp_attr(id, &a, &mask) == 0 && ibv_modify_qp(qp, &a, mask) == 0,
		      "self-modify to state %d: %s", steps[i], strerror(errno));
	}
}

static struct ibv_qp *own_qp(struct conn_objs *o, struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr qa = conn_qp_attr(o, IBV_QPT_RC);
	struct ibv_qp *qp = ibv_create_qp(o->pd, &qa);
	MUST(qp, "ibv_create_qp: %s", strerror(errno));
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = id->port_num};
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0,
	      "own QP to INIT");
	return qp;
}

static void run_server(uint16_t port)
{
	struct ibv_context *ctx = device();
	struct conn_objs o = conn_objs(ctx);
	struct rdma_event_channel *ch = rdma_create_event_channel();
	MUST(ch, "create_event_channel: %s", strerror(errno));
	struct rdma_cm_id *l, *lu;
	MUST(rdma_create_id(ch, &l, NULL, RDMA_PS_TCP) == 0 && rdma_create_id(ch, &lu, NULL, RDMA_PS_UDP) == 0,
	     "create_id: %s", strerror(errno));
	/* An IPv6 wildcard listener takes IPv4 requests too. */
	struct sockaddr_in6 any6 = {.sin6_family = AF_INET6, .sin6_port = htons(port)};
	struct sockaddr_in any4 = {.sin_family = AF_INET, .sin_port = htons(port)};
	MUST(rdma_bind_addr(l, (struct sockaddr *)&any6) == 0 && rdma_listen(l, 4) == 0, "listen: %s", strerror(errno));
	MUST(rdma_bind_addr(lu, (struct sockaddr *)&any4) == 0 && rdma_listen(lu, 4) == 0, "UDP listen: %s",
	     strerror(errno));
	CHECK(rdma_listen(l, 8) == 0, "listen again (a new backlog): %s", strerror(errno));
	printf("ready\n");

	/* 1: the library's QP. */
	struct rdma_cm_event *e = want_event(ch, NULL, RDMA_CM_EVENT_CONNECT_REQUEST, 0);
	struct rdma_cm_id *c = e->id;
	CHECK(e->listen_id == l && c != l && c->verbs == ctx && c->channel == ch && private_is(e, "hello") &&
		      e->param.conn.qp_num > 1 && e->param.conn.initiator_depth == 1 &&
		      c->route.addr.src_addr.sa_family == AF_INET && ntohs(rdma_get_src_port(c)) == port,
	      "CONNECT_REQUEST: listen_id %p, qp_num %u, family %d", (void *)e->listen_id, e->param.conn.qp_num,
	      c->route.addr.src_addr.sa_family);
	uint32_t client_qpn = e->param.conn.qp_num;
	rdma_ack_cm_event(e);
	struct ibv_qp_init_attr qa = conn_qp_attr(&o, IBV_QPT_RC);
	MUST(rdma_create_qp(c, o.pd, &qa) == 0, "create_qp: %s", strerror(errno));
	post_recv0(c->qp, 1);
	struct rdma_conn_param cp = {.private_data = "welcome", .private_data_len = 8, .responder_resources = 1,
				     .initiator_depth = 1, .rnr_retry_count = 7};
	CHECK(rdma_accept(c, &cp) == 0, "accept: %s", strerror(errno));
	uint32_t dest = 0;
	CHECK(qp_state(c->qp, &dest) == IBV_QPS_RTS && dest == client_qpn, "accepted QP state, dest %u", dest);
	rdma_ack_cm_event(want_event(ch, c, RDMA_CM_EVENT_ESTABLISHED, 0));
	expect_wc(o.cq, IBV_WC_RECV, CONN_IMM_CLIENT);
	send_imm(c->qp, CONN_IMM_SERVER);
	expect_wc(o.cq, IBV_WC_SEND, 0);
	rdma_ack_cm_event(want_event(ch, c, RDMA_CM_EVENT_DISCONNECTED, 0));
	CHECK(rdma_disconnect(c) == 0 && qp_state(c->qp, NULL) == IBV_QPS_ERR, "disconnect after the peer's: %s",
	      strerror(errno));
	rdma_ack_cm_event(want_event(ch, c, RDMA_CM_EVENT_TIMEWAIT_EXIT, 0));
	rdma_destroy_qp(c);
	rdma_destroy_id(c);

	/* 2: refused, with private data. */
	e = want_event(ch, NULL, RDMA_CM_EVENT_CONNECT_REQUEST, 0);
	c = e->id;
	rdma_ack_cm_event(e);
	errno = 0;
	CHECK(rdma_reject(c, "no thanks", 200) == -1 && errno == EINVAL, "reject with too much private data: %s",
	      strerror(errno));
	CHECK(rdma_reject(c, "no", 3) == 0, "reject: %s", strerror(errno));
	rdma_destroy_id(c);

	/* 3: the application's QP (rping -q), over IPv6. */
	e = want_event(ch, NULL, RDMA_CM_EVENT_CONNECT_REQUEST, 0);
	c = e->id;
	CHECK(c->route.addr.src_addr.sa_family == AF_INET6, "IPv6 request, family %d", c->route.addr.src_addr.sa_family);
	rdma_ack_cm_event(e);
	struct ibv_qp *qp = own_qp(&o, c);
	post_recv0(qp, 3);
	self_modify(c, qp);
	cp = (struct rdma_conn_param){.responder_resources = 1, .initiator_depth = 1, .rnr_retry_count = 7,
				      .qp_num = qp->qp_num};
	CHECK(rdma_accept(c, &cp) == 0, "accept (own QP): %s", strerror(errno));
	rdma_ack_cm_event(want_event(ch, c, RDMA_CM_EVENT_ESTABLISHED, 0));
	expect_wc(o.cq, IBV_WC_RECV, CONN_IMM_CLIENT);
	send_imm(qp, CONN_IMM_SERVER);
	expect_wc(o.cq, IBV_WC_SEND, 0);
	struct ibv_qp_attr ea = {.qp_state = IBV_QPS_ERR};
	CHECK(ibv_modify_qp(qp, &ea, IBV_QP_STATE) == 0 && rdma_disconnect(c) == 0, "disconnect: %s", strerror(errno));
	rdma_ack_cm_event(want_event(ch, c, RDMA_CM_EVENT_DISCONNECTED, 0));
	/* Our time-wait timer and the client's next request (step 4) race:
	 * the kernel's rdma_cm does not order them either. */
	struct rdma_cm_event *req = NULL;
	for (bool exited = false; !exited;) {
		e = next_event(ch);
		MUST(e, "no TIMEWAIT_EXIT: %s", strerror(errno));
		if (e->event == RDMA_CM_EVENT_CONNECT_REQUEST && !req) {
			req = e;
			continue;
		}
		CHECK(e->event == RDMA_CM_EVENT_TIMEWAIT_EXIT && e->id == c && e->status == 0,
		      "want TIMEWAIT_EXIT, got %s status %d", rdma_event_str(e->event), e->status);
		rdma_ack_cm_event(e);
		exited = true;
	}
	ibv_destroy_qp(qp);
	rdma_destroy_id(c);

	/* 4: the UDP port space. */
	e = req ? req : want_event(ch, NULL, RDMA_CM_EVENT_CONNECT_REQUEST, 0);
	c = e->id;
	CHECK(e->listen_id == lu && c->qp_type == IBV_QPT_UD && e->param.ud.private_data &&
		      !memcmp(e->param.ud.private_data, "sidr", 4),
	      "UDP CONNECT_REQUEST");
	rdma_ack_cm_event(e);
	qa = conn_qp_attr(&o, IBV_QPT_UD);
	MUST(rdma_create_qp(c, o.pd, &qa) == 0, "UD create_qp: %s", strerror(errno));
	printf("udqpn %u\n", c->qp->qp_num);
	CHECK(rdma_accept(c, NULL) == 0, "UD accept: %s", strerror(errno));
	rdma_destroy_qp(c);
	rdma_destroy_id(c);

	CHECK(!readable(ch->fd, 200), "an event nobody asked for");
	rdma_destroy_id(l);
	rdma_destroy_id(lu);
	rdma_destroy_event_channel(ch);
	ibv_destroy_cq(o.cq);
	ibv_dealloc_pd(o.pd);
}

/* A resolved ID toward ip:port on ch. */
static struct rdma_cm_id *resolved(struct rdma_event_channel *ch, const char *ip, uint16_t port,
				   enum rdma_port_space ps)
{
	struct rdma_cm_id *id;
	MUST(rdma_create_id(ch, &id, NULL, ps) == 0, "create_id: %s", strerror(errno));
	struct sockaddr_storage dst = addr_of(ip, port);
	CHECK(rdma_resolve_addr(id, NULL, SA(dst), 2000) == 0, "resolve_addr %s: %s", ip, strerror(errno));
	rdma_ack_cm_event(want_event(ch, id, RDMA_CM_EVENT_ADDR_RESOLVED, 0));
	CHECK(rdma_resolve_route(id, 2000) == 0, "resolve_route: %s", strerror(errno));
	rdma_ack_cm_event(want_event(ch, id, RDMA_CM_EVENT_ROUTE_RESOLVED, 0));
	return id;
}

static void run_client(const char *peer4, const char *peer6, uint16_t port)
{
	struct ibv_context *ctx = device();
	struct conn_objs o = conn_objs(ctx);
	struct rdma_event_channel *ch = rdma_create_event_channel();
	MUST(ch, "create_event_channel: %s", strerror(errno));

	/* 0: nobody listens: REJ reason 8 (invalid service ID), as rping
	 * reports it. */
	struct rdma_cm_id *id = resolved(ch, peer4, port + 1, RDMA_PS_TCP);
	struct ibv_qp_init_attr qa = conn_qp_attr(&o, IBV_QPT_RC);
	MUST(rdma_create_qp(id, o.pd, &qa) == 0, "create_qp: %s", strerror(errno));
	struct rdma_conn_param cp = {.responder_resources = 1, .initiator_depth = 1, .retry_count = 7,
				     .rnr_retry_count = 7};
	CHECK(rdma_connect(id, &cp) == 0, "connect: %s", strerror(errno));
	rdma_ack_cm_event(want_event(ch, id, RDMA_CM_EVENT_REJECTED, 8));
	CHECK(qp_state(id->qp, NULL) == IBV_QPS_ERR, "a rejected connection's QP is in state %d", qp_state(id->qp, NULL));
	rdma_destroy_qp(id);
	rdma_destroy_id(id);

	/* 1: the library's QP, IPv4. */
	id = resolved(ch, peer4, port, RDMA_PS_TCP);
	qa = conn_qp_attr(&o, IBV_QPT_RC);
	MUST(rdma_create_qp(id, o.pd, &qa) == 0, "create_qp: %s", strerror(errno));
	post_recv0(id->qp, 1);
	cp.private_data = "hello";
	cp.private_data_len = 6;
	errno = 0;
	char big[57] = {0};
	struct rdma_conn_param over = cp;
	over.private_data = big;
	over.private_data_len = sizeof(big);
	CHECK(rdma_connect(id, &over) == -1 && errno == EINVAL, "57 bytes of REQ private data: %s", strerror(errno));
	CHECK(rdma_connect(id, &cp) == 0, "connect: %s", strerror(errno));
	struct rdma_cm_event *e = want_event(ch, id, RDMA_CM_EVENT_ESTABLISHED, 0);
	uint32_t dest = 0;
	CHECK(private_is(e, "welcome") && e->param.conn.qp_num > 1 && qp_state(id->qp, &dest) == IBV_QPS_RTS &&
		      dest == e->param.conn.qp_num,
	      "established: peer QP %u, ours to %u", e->param.conn.qp_num, dest);
	rdma_ack_cm_event(e);
	send_imm(id->qp, CONN_IMM_CLIENT);
	expect_wc(o.cq, IBV_WC_SEND, 0);
	expect_wc(o.cq, IBV_WC_RECV, CONN_IMM_SERVER);
	CHECK(rdma_disconnect(id) == 0 && qp_state(id->qp, NULL) == IBV_QPS_ERR, "disconnect: %s", strerror(errno));
	rdma_ack_cm_event(want_event(ch, id, RDMA_CM_EVENT_DISCONNECTED, 0));
	rdma_ack_cm_event(want_event(ch, id, RDMA_CM_EVENT_TIMEWAIT_EXIT, 0));
	rdma_destroy_qp(id);
	rdma_destroy_id(id);

	/* 2: rejected by the server, with its private data. */
	id = resolved(ch, peer4, port, RDMA_PS_TCP);
	qa = conn_qp_attr(&o, IBV_QPT_RC);
	MUST(rdma_create_qp(id, o.pd, &qa) == 0, "create_qp: %s", strerror(errno));
	CHECK(rdma_connect(id, &cp) == 0, "connect: %s", strerror(errno));
	e = want_event(ch, id, RDMA_CM_EVENT_REJECTED, 28);
	CHECK(private_is(e, "no"), "REJ private data");
	rdma_ack_cm_event(e);
	rdma_destroy_qp(id);
	rdma_destroy_id(id);

	/* 3: our own QP (rping -q), IPv6: CONNECT_RESPONSE, then we move it
	 * and establish. */
	id = resolved(ch, peer6, port, RDMA_PS_TCP);
	struct ibv_qp *qp = own_qp(&o, id);
	post_recv0(qp, 3);
	cp = (struct rdma_conn_param){.responder_resources = 1, .initiator_depth = 1, .retry_count = 7,
				      .rnr_retry_count = 7, .qp_num = qp->qp_num};
	CHECK(rdma_connect(id, &cp) == 0, "connect (own QP): %s", strerror(errno));
	e = want_event(ch, id, RDMA_CM_EVENT_CONNECT_RESPONSE, 0);
	rdma_ack_cm_event(e);
	self_modify(id, qp);
	CHECK(rdma_establish(id) == 0 && qp_state(qp, NULL) == IBV_QPS_RTS, "establish: %s", strerror(errno));
	send_imm(qp, CONN_IMM_CLIENT);
	expect_wc(o.cq, IBV_WC_SEND, 0);
	expect_wc(o.cq, IBV_WC_RECV, CONN_IMM_SERVER);
	rdma_ack_cm_event(want_event(ch, id, RDMA_CM_EVENT_DISCONNECTED, 0));
	struct ibv_qp_attr ea = {.qp_state = IBV_QPS_ERR};
	CHECK(ibv_modify_qp(qp, &ea, IBV_QP_STATE) == 0 && rdma_disconnect(id) == 0, "disconnect: %s", strerror(errno));
	rdma_ack_cm_event(want_event(ch, id, RDMA_CM_EVENT_TIMEWAIT_EXIT, 0));
	ibv_destroy_qp(qp);
	rdma_destroy_id(id);

	/* 4: the UDP port space: the server's UD QP, rdma_cm's Q_Key and an
	 * address to reach it. */
	id = resolved(ch, peer4, port, RDMA_PS_UDP);
	qa = conn_qp_attr(&o, IBV_QPT_UD);
	MUST(rdma_create_qp(id, o.pd, &qa) == 0, "UD create_qp: %s", strerror(errno));
	cp = (struct rdma_conn_param){.private_data = "sidr", .private_data_len = 5};
	CHECK(rdma_connect(id, &cp) == 0, "UD connect: %s", strerror(errno));
	e = want_event(ch, id, RDMA_CM_EVENT_ESTABLISHED, 0);
	union ibv_gid g;
	struct sockaddr_storage p4 = addr_of(peer4, 0);
	gid_of(SA(p4), &g);
	CHECK(e->param.ud.qp_num > 1 && e->param.ud.qkey == RDMA_UDP_QKEY && e->param.ud.ah_attr.is_global &&
		      !memcmp(&e->param.ud.ah_attr.grh.dgid, &g, sizeof(g)),
	      "SIDR answer: QP %u Q_Key %#x", e->param.ud.qp_num, e->param.ud.qkey);
	struct ibv_ah *ah = ibv_create_ah(o.pd, &e->param.ud.ah_attr);
	CHECK(ah, "create_ah from the SIDR answer: %s", strerror(errno));
	printf("udqpn %u\n", e->param.ud.qp_num);
	rdma_ack_cm_event(e);
	if (ah)
		ibv_destroy_ah(ah);
	rdma_destroy_qp(id);
	rdma_destroy_id(id);

	CHECK(!readable(ch->fd, 200), "an event nobody asked for");
	rdma_destroy_event_channel(ch);
	ibv_destroy_cq(o.cq);
	ibv_dealloc_pd(o.pd);
}


int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 6 && !strcmp(argv[1], "local"))
		run_local(argv[2], argv[3], argv[4], argv[5]);
	else if (argc == 2 && !strcmp(argv[1], "fatal"))
		run_fatal();
	else if (argc == 3 && !strcmp(argv[1], "server"))
		run_server((uint16_t)atoi(argv[2]));
	else if (argc == 5 && !strcmp(argv[1], "client"))
		run_client(argv[2], argv[3], (uint16_t)atoi(argv[4]));
	else {
		fprintf(stderr, "usage: cm_test local PEER4 PEER6 OTHER4 UNREACH4 | fatal | server PORT | "
				"client PEER4 PEER6 PORT\n");
		return 2;
	}
	finish();
}

/*
 * srn_test: softrnic's own test of its libibverbs.so.1, built against the
 * stock libibverbs-dev as any application is and run with softrnic's
 * library (LD_LIBRARY_PATH, softrnic run) against a running daemon.
 *
 *   srn_test control            every control verb and its error paths, the
 *                               rings (flushes), completion channels
 *   srn_test server PORT        the passive side of the traffic test
 *   srn_test fatal              waits for the daemon to go away: the
 *                               context's async fd reports
 *                               IBV_EVENT_DEVICE_FATAL, and verbs fail
 *   srn_test client ADDR PORT   the active side: RC and UC QPs exchange
 *                               SEND_WITH_IMM, RDMA_WRITE_WITH_IMM and inline
 *                               SENDs with the server, through ibv_post_send
 *                               and the ibv_wr_* API, and check the errors
 *                               of a SEND the receiver has no room for and
 *                               of a wrong lkey
 *
 * The traffic needs no registered memory (zero-length messages carry
 * their immediate data; inline data is copied at post time), so it runs
 * before application memory can be registered.
 *
 * Asserts rdma-core's documented results; prints "N passed, M failed" and
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
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Polls cq for one completion, for at most secs seconds. */
static int poll_one(struct ibv_cq *cq, struct ibv_wc *wc, double secs)
{
	double end = now() + secs;
	for (;;) {
		int n = ibv_poll_cq(cq, 1, wc);
		if (n != 0)
			return n;
		if (now() > end)
			return 0;
		usleep(50);
	}
}

/* control: an IPv4 address the daemon can resolve (the veth's other end). */
static const char *peer_addr;

static struct ibv_context *open_first(void)
{
	int n = -1;
	struct ibv_device **list = ibv_get_device_list(&n);
	MUST(list && n == 1, "device list %p, %d devices", (void *)list, n);
	CHECK(strncmp(ibv_get_device_name(list[0]), "softrnic_", 9) == 0, "name %s", ibv_get_device_name(list[0]));
	CHECK(list[0]->node_type == IBV_NODE_CA && list[0]->transport_type == IBV_TRANSPORT_IB, "node type %d",
	      list[0]->node_type);
	struct ibv_context *ctx = ibv_open_device(list[0]);
	MUST(ctx, "open: %s", strerror(errno));
	ibv_free_device_list(list); /* the context keeps its device */
	return ctx;
}

static void modify(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask, int want)
{
	int err = ibv_modify_qp(qp, a, mask);
	CHECK(err == want, "modify to state %d: %d (%s), want %d", a->qp_state, err, strerror(err), want);
}

static struct ibv_qp *make_qp(struct ibv_pd *pd, struct ibv_cq *cq, enum ibv_qp_type t, bool ex)
{
	struct ibv_qp_init_attr_ex a = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 2, .max_recv_sge = 2,
			.max_inline_data = 64},
		.qp_type = t,
		.comp_mask = IBV_QP_INIT_ATTR_PD,
		.pd = pd,
	};
	if (ex) {
		a.comp_mask |= IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
		a.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |
				   IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM;
	}
	struct ibv_qp *qp = ibv_create_qp_ex(pd->context, &a);
	MUST(qp, "create QP type %d: %s", t, strerror(errno));
	CHECK(a.cap.max_send_wr >= 16 && a.cap.max_inline_data >= 64, "granted caps %u %u", a.cap.max_send_wr,
	      a.cap.max_inline_data);
	CHECK(qp->state == IBV_QPS_RESET && qp->qp_num > 1, "new QP state %d num %u", qp->state, qp->qp_num);
	return qp;
}

static void to_init(struct ibv_qp *qp, enum ibv_qp_type t)
{
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1, .pkey_index = 0};
	int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
	if (t == IBV_QPT_UD) {
		a.qkey = 0x11111111;
		mask |= IBV_QP_QKEY;
	} else {
		a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
		mask |= IBV_QP_ACCESS_FLAGS;
	}
	modify(qp, &a, mask, 0);
}

static void test_device(struct ibv_context *ctx)
{
	struct ibv_device_attr da;
	CHECK(ibv_query_device(ctx, &da) == 0, "query_device");
	CHECK(da.phys_port_cnt == 1 && da.max_qp > 0 && da.max_cqe > 0 && da.node_guid != 0, "device attrs");
	CHECK(da.node_guid == ibv_get_device_guid(ctx->device), "node GUID %llx vs %llx",
	      (unsigned long long)da.node_guid, (unsigned long long)ibv_get_device_guid(ctx->device));
	struct ibv_device_attr_ex dx;
	CHECK(ibv_query_device_ex(ctx, NULL, &dx) == 0 && dx.orig_attr.max_qp == da.max_qp, "query_device_ex");

	struct ibv_port_attr pa;
	CHECK(ibv_query_port(ctx, 1, &pa) == 0, "query_port");
	CHECK(pa.state == IBV_PORT_ACTIVE && pa.link_layer == IBV_LINK_LAYER_ETHERNET, "port state %d layer %d",
	      pa.state, pa.link_layer);
	CHECK(pa.active_mtu >= IBV_MTU_256 && pa.active_mtu <= IBV_MTU_4096 && pa.gid_tbl_len >= 1, "mtu %d gids %d",
	      pa.active_mtu, pa.gid_tbl_len);
	CHECK(ibv_query_port(ctx, 2, &pa) == EINVAL, "port 2 must not exist");

	union ibv_gid gid;
	CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0, "query_gid 0");
	CHECK(ibv_query_gid(ctx, 1, -1, &gid) == -1 && errno == EINVAL, "query_gid -1");
	CHECK(ibv_query_gid(ctx, 2, 0, &gid) == -1, "query_gid port 2");
	struct ibv_gid_entry ge;
	CHECK(ibv_query_gid_ex(ctx, 1, 0, &ge, 0) == 0 && ge.gid_type == IBV_GID_TYPE_ROCE_V2 &&
		      !memcmp(&ge.gid, &gid, sizeof(gid)),
	      "query_gid_ex type %d", ge.gid_type);
	CHECK(ibv_query_gid_ex(ctx, 1, pa.gid_tbl_len, &ge, 0) != 0, "gid past the table");
	struct ibv_gid_entry table[16];
	ssize_t n = ibv_query_gid_table(ctx, table, 16, 0);
	CHECK(n == pa.gid_tbl_len, "gid table %zd entries, port says %d", n, pa.gid_tbl_len);
	__be16 pkey;
	CHECK(ibv_query_pkey(ctx, 1, 0, &pkey) == 0 && pkey == htobe16(0xffff), "pkey");
	CHECK(ibv_query_pkey(ctx, 1, 1, &pkey) == -1, "pkey 1");
	CHECK(ibv_get_pkey_index(ctx, 1, htobe16(0xffff)) == 0, "pkey index");
}

static void test_unsupported(struct ibv_context *ctx, struct ibv_pd *pd)
{
	static char buf[4096];
	errno = 0;
	CHECK(ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_REMOTE_WRITE) == NULL && errno == EINVAL,
	      "remote write without local write: errno %d", errno);
	struct ibv_srq_init_attr sa = {.attr = {.max_wr = 4, .max_sge = 1}};
	errno = 0;
	CHECK(ibv_create_srq(pd, &sa) == NULL && errno == EOPNOTSUPP, "create_srq: errno %d", errno);
	errno = 0;
	CHECK(ibv_alloc_mw(pd, IBV_MW_TYPE_1) == NULL && errno == EOPNOTSUPP, "alloc_mw: errno %d", errno);
	struct ibv_cq_init_attr_ex cqa = {.cqe = 4, .wc_flags = IBV_WC_EX_WITH_COMPLETION_TIMESTAMP};
	errno = 0;
	CHECK(ibv_create_cq_ex(ctx, &cqa) == NULL && errno == EOPNOTSUPP, "CQ with timestamps: errno %d", errno);
	errno = 0;
	CHECK(ibv_import_device(3) == NULL && errno == EOPNOTSUPP, "import_device: errno %d", errno);
}

/* Flushes: WRs posted to a QP in ERR complete with IBV_WC_WR_FLUSH_ERR,
 * through the rings and the completion channel. */
static void test_flush(struct ibv_context *ctx, struct ibv_pd *pd)
{
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	MUST(ch, "comp channel: %s", strerror(errno));
	struct ibv_cq *cq = ibv_create_cq(ctx, 32, (void *)0x5151, ch, 0);
	MUST(cq, "create_cq: %s", strerror(errno));
	CHECK(cq->cqe >= 32 && cq->channel == ch && cq->cq_context == (void *)0x5151, "cq %d", cq->cqe);
	CHECK(ibv_destroy_comp_channel(ch) == EBUSY, "channel in use must be busy");

	struct ibv_qp *qp = make_qp(pd, cq, IBV_QPT_RC, true);
	struct ibv_recv_wr rwr = {.wr_id = 7}, *bad_r = NULL;
	CHECK(ibv_post_recv(qp, &rwr, &bad_r) == EINVAL && bad_r == &rwr, "post_recv in RESET");
	struct ibv_send_wr swr = {.wr_id = 9, .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED}, *bad_s = NULL;
	CHECK(ibv_post_send(qp, &swr, &bad_s) == EINVAL && bad_s == &swr, "post_send in RESET");
	to_init(qp, IBV_QPT_RC);
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTS};
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE) != 0, "INIT to RTS must be refused");
	a.qp_state = 42;
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE) == EINVAL, "state 42");
	a.qp_state = IBV_QPS_INIT;
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_ALT_PATH) == EOPNOTSUPP, "alternate path");

	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	CHECK(ibv_query_qp(qp, &qa, IBV_QP_STATE, &qi) == 0 && qa.qp_state == IBV_QPS_INIT &&
		      qa.qp_access_flags == IBV_ACCESS_REMOTE_WRITE && qi.qp_type == IBV_QPT_RC,
	      "query_qp state %d access %#x", qa.qp_state, qa.qp_access_flags);

	/* Two receives (one with too many SGEs, refused at post time). */
	struct ibv_sge sg[3] = {0};
	struct ibv_recv_wr r2 = {.wr_id = 2, .sg_list = sg, .num_sge = 3}, r1 = {.wr_id = 1, .next = &r2};
	CHECK(ibv_post_recv(qp, &r1, &bad_r) == EINVAL && bad_r == &r2, "3 SGEs on a 2-SGE RQ");

	CHECK(ibv_req_notify_cq(cq, 0) == 0, "req_notify_cq");
	a.qp_state = IBV_QPS_ERR;
	modify(qp, &a, IBV_QP_STATE, 0);

	/* The flush of receive 1 raises the event. */
	struct pollfd pfd = {.fd = ch->fd, .events = POLLIN};
	CHECK(poll(&pfd, 1, 10000) == 1, "channel fd never became readable");
	struct ibv_cq *ecq = NULL;
	void *ectx = NULL;
	CHECK(ibv_get_cq_event(ch, &ecq, &ectx) == 0 && ecq == cq && ectx == (void *)0x5151, "get_cq_event");
	ibv_ack_cq_events(cq, 1);
	struct ibv_wc wc;
	CHECK(poll_one(cq, &wc, 10) == 1 && wc.wr_id == 1 && wc.status == IBV_WC_WR_FLUSH_ERR && wc.qp_num == qp->qp_num,
	      "flushed receive: id %llu status %s", (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status));

	/* In ERR, sends are taken and flushed: classic and ibv_wr_*. */
	swr.wr_id = 10;
	CHECK(ibv_post_send(qp, &swr, &bad_s) == 0, "post_send in ERR");
	struct ibv_qp_ex *qx = ibv_qp_to_qp_ex(qp);
	MUST(qx, "qp_to_qp_ex");
	ibv_wr_start(qx);
	qx->wr_id = 11;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send_imm(qx, htobe32(0x1234));
	ibv_wr_set_sge(qx, 0, 0, 0);
	qx->wr_id = 12;
	ibv_wr_send(qx);
	ibv_wr_set_inline_data(qx, "inline", 6);
	CHECK(ibv_wr_complete(qx) == 0, "wr_complete");
	uint64_t want = 10;
	for (int i = 0; i < 3; i++, want++) {
		CHECK(poll_one(cq, &wc, 10) == 1 && wc.wr_id == want && wc.status == IBV_WC_WR_FLUSH_ERR,
		      "flushed send %d: id %llu status %s", i, (unsigned long long)wc.wr_id,
		      ibv_wc_status_str(wc.status));
	}
	/* A failed batch posts nothing. */
	char big[512] = {0};
	ibv_wr_start(qx);
	qx->wr_id = 13;
	ibv_wr_send(qx);
	ibv_wr_set_inline_data(qx, big, sizeof(big));
	CHECK(ibv_wr_complete(qx) == EINVAL, "inline data over the cap");
	ibv_wr_start(qx);
	ibv_wr_local_inv(qx, 5);
	CHECK(ibv_wr_complete(qx) == EOPNOTSUPP, "local invalidate");
	ibv_wr_start(qx);
	qx->wr_id = 14;
	ibv_wr_send(qx);
	ibv_wr_abort(qx);
	swr.opcode = IBV_WR_LOCAL_INV;
	CHECK(ibv_post_send(qp, &swr, &bad_s) == EINVAL, "LOCAL_INV opcode");
	usleep(100000);
	CHECK(ibv_poll_cq(cq, 1, &wc) == 0, "a failed or aborted batch completed: id %llu", (unsigned long long)wc.wr_id);

	/* Objects in use cannot go. */
	CHECK(ibv_destroy_cq(cq) == EBUSY, "CQ of a QP");
	CHECK(ibv_dealloc_pd(pd) == EBUSY, "PD of a QP");
	CHECK(ibv_destroy_qp(qp) == 0, "destroy_qp");
	CHECK(ibv_destroy_cq(cq) == 0, "destroy_cq");
	CHECK(ibv_destroy_comp_channel(ch) == 0, "destroy channel");
}

/* The extended CQ: ibv_start_poll/ibv_next_poll/ibv_end_poll over the
 * same ring, here on the flushes of a UD QP's receives. */
static void test_cq_ex(struct ibv_context *ctx, struct ibv_pd *pd)
{
	struct ibv_cq_init_attr_ex ca = {.cqe = 8, .wc_flags = IBV_WC_STANDARD_FLAGS,
					 .comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS,
					 .flags = IBV_CREATE_CQ_ATTR_SINGLE_THREADED};
	struct ibv_cq_ex *cx = ibv_create_cq_ex(ctx, &ca);
	MUST(cx, "create_cq_ex: %s", strerror(errno));
	struct ibv_cq *cq = ibv_cq_ex_to_cq(cx);
	struct ibv_poll_cq_attr pa = {0};
	CHECK(ibv_start_poll(cx, &pa) == ENOENT, "start_poll on an empty CQ");
	struct ibv_qp *qp = make_qp(pd, cq, IBV_QPT_UD, false);
	to_init(qp, IBV_QPT_UD);
	for (uint64_t id = 1; id <= 3; id++) {
		struct ibv_recv_wr r = {.wr_id = id}, *bad;
		CHECK(ibv_post_recv(qp, &r, &bad) == 0, "post_recv %llu", (unsigned long long)id);
	}
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
	modify(qp, &a, IBV_QP_STATE, 0);
	double end = now() + 10;
	int err;
	while ((err = ibv_start_poll(cx, &pa)) == ENOENT && now() < end)
		usleep(100);
	MUST(err == 0, "start_poll: %d", err);
	uint64_t want = 1;
	do {
		CHECK(cx->wr_id == want && cx->status == IBV_WC_WR_FLUSH_ERR && ibv_wc_read_qp_num(cx) == qp->qp_num,
		      "entry %llu: id %llu status %s", (unsigned long long)want, (unsigned long long)cx->wr_id,
		      ibv_wc_status_str(cx->status));
		want++;
		while ((err = ibv_next_poll(cx)) == ENOENT && want <= 3 && now() < end)
			usleep(100);
	} while (err == 0);
	ibv_end_poll(cx);
	CHECK(err == ENOENT && want == 4, "next_poll %d after %llu entries", err, (unsigned long long)want - 1);
	CHECK(ibv_destroy_qp(qp) == 0, "destroy_qp");
	CHECK(ibv_destroy_cq(cq) == 0, "destroy extended CQ");
}

static void test_objects(struct ibv_context *ctx, struct ibv_pd *pd)
{
	errno = 0;
	CHECK(ibv_create_cq(ctx, 0, NULL, NULL, 0) == NULL && errno == EINVAL, "CQ of 0 entries");
	CHECK(ibv_create_cq(ctx, 4, NULL, NULL, 1) == NULL && errno == EINVAL, "comp vector 1");
	struct ibv_cq *cq = ibv_create_cq(ctx, 4, NULL, NULL, 0);
	MUST(cq, "create_cq");
	CHECK(ibv_req_notify_cq(cq, 1) == 0, "notify without a channel");
	CHECK(ibv_resize_cq(cq, 64) == EOPNOTSUPP, "resize_cq");
	struct ibv_qp_init_attr ia = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_XRC_SEND,
				      .cap = {.max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1}};
	errno = 0;
	CHECK(ibv_create_qp(pd, &ia) == NULL && errno == EOPNOTSUPP, "XRC QP: errno %d", errno);
	ia.qp_type = IBV_QPT_RC;
	ia.cap.max_send_sge = 100000;
	errno = 0;
	CHECK(ibv_create_qp(pd, &ia) == NULL && errno == EINVAL, "too many SGEs: errno %d", errno);
	struct ibv_qp_init_attr_ex ix = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC, .pd = pd,
					 .cap = {.max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1},
					 .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
					 .send_ops_flags = IBV_QP_EX_WITH_TSO};
	errno = 0;
	CHECK(ibv_create_qp_ex(ctx, &ix) == NULL && errno == EOPNOTSUPP, "TSO: errno %d", errno);

	/* Every QP type the daemon has, each through INIT. */
	enum ibv_qp_type types[] = {IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD};
	for (size_t i = 0; i < 3; i++) {
		struct ibv_qp *qp = make_qp(pd, cq, types[i], i == 1);
		to_init(qp, types[i]);
		CHECK(ibv_destroy_qp(qp) == 0, "destroy QP type %d", types[i]);
	}

	struct ibv_ah_attr ah = {.port_num = 1};
	errno = 0;
	CHECK(ibv_create_ah(pd, &ah) == NULL && errno == EINVAL, "AH without GRH");
	ah.is_global = 1;
	/* The daemon resolves the destination's MAC: the peer's address
	 * (IPv4-mapped, as the GID table's index 0 is). */
	struct in_addr peer;
	MUST(peer_addr && inet_pton(AF_INET, peer_addr, &peer) == 1, "peer address %s", peer_addr ? peer_addr : "(none)");
	ah.grh.dgid.raw[10] = ah.grh.dgid.raw[11] = 0xff;
	memcpy(&ah.grh.dgid.raw[12], &peer, 4);
	struct ibv_ah *h = ibv_create_ah(pd, &ah);
	CHECK(h != NULL, "create_ah: %s", strerror(errno));
	if (h)
		CHECK(ibv_destroy_ah(h) == 0, "destroy_ah");
	CHECK(ibv_destroy_cq(cq) == 0, "destroy_cq");
}

static int control(void)
{
	struct ibv_context *ctx = open_first();
	test_device(ctx);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	MUST(pd, "alloc_pd: %s", strerror(errno));
	test_unsupported(ctx, pd);
	test_objects(ctx, pd);
	test_flush(ctx, pd);
	test_cq_ex(ctx, pd);
	CHECK(ibv_dealloc_pd(pd) == 0, "dealloc_pd");
	/* The daemon answers no more: nothing is left of the session. */
	CHECK(ibv_close_device(ctx) == 0, "close_device");
	finish();
	return 0;
}

/* Run while the test stops the daemon after "ready". */
static int fatal(void)
{
	struct ibv_context *ctx = open_first();
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	MUST(pd, "alloc_pd");
	int fl = fcntl(ctx->async_fd, F_GETFL);
	MUST(fcntl(ctx->async_fd, F_SETFL, fl | O_NONBLOCK) == 0, "async fd non-blocking");
	struct ibv_async_event ev;
	errno = 0;
	CHECK(ibv_get_async_event(ctx, &ev) == -1 && errno == EAGAIN, "an event before the daemon went: errno %d", errno);
	printf("ready\n");
	struct pollfd pfd = {.fd = ctx->async_fd, .events = POLLIN};
	CHECK(poll(&pfd, 1, 30000) == 1, "the async fd never became readable");
	CHECK(ibv_get_async_event(ctx, &ev) == 0 && ev.event_type == IBV_EVENT_DEVICE_FATAL, "event %s",
	      ibv_event_type_str(ev.event_type));
	ibv_ack_async_event(&ev);
	errno = 0;
	CHECK(ibv_get_async_event(ctx, &ev) == -1 && errno == EAGAIN, "DEVICE_FATAL twice");
	errno = 0;
	CHECK(ibv_alloc_pd(ctx) == NULL && errno != 0, "alloc_pd without a daemon");
	CHECK(ibv_dealloc_pd(pd) != 0, "dealloc_pd without a daemon");
	CHECK(ibv_close_device(ctx) == 0, "close_device");
	finish();
	return 0;
}

/* ---- traffic between two processes ---- */

struct endpoint {
	uint32_t qpn[2]; /* RC, UC */
	uint8_t gid[16];
};

static int tcp_exchange(const char *host, const char *port, struct endpoint *mine, struct endpoint *theirs)
{
	struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = host ? 0 : AI_PASSIVE};
	struct addrinfo *ai;
	if (getaddrinfo(host, port, &hints, &ai))
		return -1;
	int fd = socket(ai->ai_family, SOCK_STREAM, 0), c = -1;
	if (host) {
		for (int i = 0; i < 200 && connect(fd, ai->ai_addr, ai->ai_addrlen); i++) {
			close(fd);
			fd = socket(ai->ai_family, SOCK_STREAM, 0);
			usleep(50000);
		}
		c = fd;
	} else {
		int one = 1;
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (bind(fd, ai->ai_addr, ai->ai_addrlen) || listen(fd, 1))
			return -1;
		printf("listening\n");
		fflush(stdout);
		c = accept(fd, NULL, NULL);
		close(fd);
	}
	freeaddrinfo(ai);
	if (c < 0 || write(c, mine, sizeof(*mine)) != sizeof(*mine) || read(c, theirs, sizeof(*theirs)) != sizeof(*theirs))
		return -1;
	return c;
}

/* Blocks until the peer says it is ready for the next step. */
static void sync_peer(int fd)
{
	char b = 0;
	MUST(write(fd, &b, 1) == 1 && read(fd, &b, 1) == 1, "sync with the peer");
}

static void connect_qp(struct ibv_qp *qp, enum ibv_qp_type t, uint32_t dqpn, const uint8_t *dgid)
{
	to_init(qp, t);
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = dqpn,
				.rq_psn = 0, .max_dest_rd_atomic = 1, .min_rnr_timer = 12,
				.ah_attr = {.is_global = 1, .port_num = 1, .grh = {.hop_limit = 64, .sgid_index = 0}}};
	memcpy(a.ah_attr.grh.dgid.raw, dgid, 16);
	int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
	if (t == IBV_QPT_RC)
		mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
	modify(qp, &a, mask, 0);
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 0;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
	if (t == IBV_QPT_RC)
		mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
	modify(qp, &a, mask, 0);
}

enum { ROUNDS = 50 };

/* The server posts receives and checks what arrives; the client sends. */
static int traffic(const char *host, const char *port)
{
	bool server = host == NULL;
	struct ibv_context *ctx = open_first();
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	MUST(pd, "alloc_pd");
	struct ibv_cq *cq = ibv_create_cq(ctx, 4 * ROUNDS, NULL, NULL, 0);
	MUST(cq, "create_cq");
	enum ibv_qp_type types[2] = {IBV_QPT_RC, IBV_QPT_UC};
	struct ibv_qp *qp[2];
	struct endpoint me = {0}, peer;
	for (int i = 0; i < 2; i++) {
		struct ibv_qp_init_attr a = {.send_cq = cq, .recv_cq = cq, .qp_type = types[i],
					     .cap = {.max_send_wr = 2 * ROUNDS, .max_recv_wr = 2 * ROUNDS,
						     .max_send_sge = 1, .max_recv_sge = 1, .max_inline_data = 64}};
		qp[i] = ibv_create_qp(pd, &a);
		MUST(qp[i], "create_qp: %s", strerror(errno));
		me.qpn[i] = qp[i]->qp_num;
	}
	union ibv_gid g;
	MUST(ibv_query_gid(ctx, 1, 0, &g) == 0, "query_gid");
	memcpy(me.gid, g.raw, 16);
	int fd = tcp_exchange(host, port, &me, &peer);
	MUST(fd >= 0, "out-of-band exchange with the peer");
	for (int i = 0; i < 2; i++) {
		connect_qp(qp[i], types[i], peer.qpn[i], peer.gid);
		if (server) {
			/* Zero-SGE receives: the messages carry no payload. */
			for (int k = 0; k < 2 * ROUNDS; k++) {
				struct ibv_recv_wr r = {.wr_id = (uint64_t)i << 32 | k}, *bad;
				int err = ibv_post_recv(qp[i], &r, &bad);
				MUST(err == 0, "post_recv %d: %s", k, strerror(err));
			}
		}
	}
	sync_peer(fd); /* the receives are posted */
	struct ibv_wc wc;
	for (int i = 0; i < 2; i++) {
		if (!server) {
			/* Half through ibv_post_send, half through ibv_wr_*. */
			for (int k = 0; k < ROUNDS; k++) {
				struct ibv_send_wr w = {.wr_id = k, .send_flags = IBV_SEND_SIGNALED,
							.opcode = k % 2 ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_SEND_WITH_IMM,
							.imm_data = htobe32(0xab000000 | k)},
						   *bad;
				CHECK(ibv_post_send(qp[i], &w, &bad) == 0, "post_send %d", k);
			}
			struct ibv_qp_ex *x = ibv_qp_to_qp_ex(qp[i]);
			ibv_wr_start(x);
			for (int k = ROUNDS; k < 2 * ROUNDS; k++) {
				x->wr_id = k;
				x->wr_flags = IBV_SEND_SIGNALED;
				if (k % 2)
					ibv_wr_rdma_write_imm(x, 0, 0, htobe32(0xab000000 | k));
				else
					ibv_wr_send_imm(x, htobe32(0xab000000 | k));
				ibv_wr_set_sge_list(x, 0, NULL);
			}
			CHECK(ibv_wr_complete(x) == 0, "wr_complete");
			for (int k = 0; k < 2 * ROUNDS; k++) {
				CHECK(poll_one(cq, &wc, 20) == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id == (uint64_t)k &&
					      wc.opcode == (k % 2 ? IBV_WC_RDMA_WRITE : IBV_WC_SEND),
				      "QP type %d send %d: id %llu status %s opcode %d", types[i], k,
				      (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status), wc.opcode);
			}
		} else {
			for (int k = 0; k < 2 * ROUNDS; k++) {
				enum ibv_wc_opcode op = k % 2 ? IBV_WC_RECV_RDMA_WITH_IMM : IBV_WC_RECV;
				CHECK(poll_one(cq, &wc, 20) == 1 && wc.status == IBV_WC_SUCCESS &&
					      wc.wr_id == ((uint64_t)i << 32 | k) && wc.opcode == op &&
					      (wc.wc_flags & IBV_WC_WITH_IMM) && be32toh(wc.imm_data) == (0xab000000u | k) &&
					      wc.byte_len == 0 && wc.qp_num == qp[i]->qp_num,
				      "QP type %d receive %d: id %#llx status %s opcode %d imm %#x", types[i], k,
				      (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status), wc.opcode,
				      be32toh(wc.imm_data));
			}
		}
		sync_peer(fd);
	}
	/* An inline SEND to a receive with no room: the receiver completes
	 * with a length error, the RC sender gets the NAK's error, and both
	 * QPs are in error. */
	if (server) {
		struct ibv_recv_wr r = {.wr_id = 99}, *bad;
		MUST(ibv_post_recv(qp[0], &r, &bad) == 0, "post_recv");
		sync_peer(fd);
		CHECK(poll_one(cq, &wc, 20) == 1 && wc.wr_id == 99 && wc.status == IBV_WC_LOC_LEN_ERR,
		      "receive too small: id %llu status %s", (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status));
	} else {
		sync_peer(fd);
		char msg[32] = "does not fit";
		struct ibv_sge sg = {.addr = (uintptr_t)msg, .length = sizeof(msg)};
		struct ibv_send_wr w = {.wr_id = 77, .sg_list = &sg, .num_sge = 1, .opcode = IBV_WR_SEND,
					.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE},
				   *bad;
		CHECK(ibv_post_send(qp[0], &w, &bad) == 0, "inline post_send");
		CHECK(poll_one(cq, &wc, 30) == 1 && wc.wr_id == 77 && wc.status == IBV_WC_REM_INV_REQ_ERR,
		      "send too large for the receive: id %llu status %s", (unsigned long long)wc.wr_id,
		      ibv_wc_status_str(wc.status));

		/* A wrong lkey: a local protection error, the UC QP in the send
		 * queue error state (IBA: UC and UD send errors go to SQE, not
		 * ERR), and what follows flushed. */
		sg.lkey = 0xdead00;
		w.wr_id = 78;
		w.send_flags = IBV_SEND_SIGNALED;
		struct ibv_send_wr w2 = {.wr_id = 79, .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED};
		w.next = &w2;
		CHECK(ibv_post_send(qp[1], &w, &bad) == 0, "post_send with a wrong lkey");
		CHECK(poll_one(cq, &wc, 30) == 1 && wc.wr_id == 78 && wc.status == IBV_WC_LOC_PROT_ERR,
		      "wrong lkey: id %llu status %s", (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status));
		CHECK(poll_one(cq, &wc, 30) == 1 && wc.wr_id == 79 && wc.status == IBV_WC_WR_FLUSH_ERR,
		      "after the error: id %llu status %s", (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status));
		struct ibv_qp_attr qa;
		struct ibv_qp_init_attr qi;
		CHECK(ibv_query_qp(qp[1], &qa, IBV_QP_STATE, &qi) == 0 && qa.qp_state == IBV_QPS_SQE, "state %d",
		      qa.qp_state);
	}
	sync_peer(fd);
	close(fd);
	for (int i = 0; i < 2; i++)
		CHECK(ibv_destroy_qp(qp[i]) == 0, "destroy_qp");
	CHECK(ibv_destroy_cq(cq) == 0, "destroy_cq");
	CHECK(ibv_dealloc_pd(pd) == 0, "dealloc_pd");
	CHECK(ibv_close_device(ctx) == 0, "close_device");
	finish();
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	signal(SIGPIPE, SIG_IGN); /* a peer gone is reported, not fatal */
	if (argc == 3 && !strcmp(argv[1], "control")) {
		peer_addr = argv[2];
		return control();
	}
	if (argc == 2 && !strcmp(argv[1], "fatal"))
		return fatal();
	if (argc == 3 && !strcmp(argv[1], "server"))
		return traffic(NULL, argv[2]);
	if (argc == 4 && !strcmp(argv[1], "client"))
		return traffic(argv[2], argv[3]);
	fprintf(stderr, "usage: srn_test control | fatal | server PORT | client ADDR PORT\n");
	return 2;
}

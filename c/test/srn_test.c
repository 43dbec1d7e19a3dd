/*
 * srn_test: softrnic's own test of its libibverbs.so.1, built against the
 * stock libibverbs-dev as any application is and run with softrnic's
 * library (LD_LIBRARY_PATH, softrnic run) against a running daemon.
 *
 *   srn_test control            every control verb and its error paths, the
 *                               rings (flushes), completion channels, SRQs,
 *                               CQ_ERR and QP_LAST_WQE_REACHED, the CPU given
 *                               away while polling an empty CQ
 *   srn_test server PORT        the passive side of the traffic test
 *   srn_test fatal              waits for the daemon to go away: the
 *                               context's async fd reports
 *                               IBV_EVENT_DEVICE_FATAL, and verbs fail
 *   srn_test port               prints "ready", expects PORT_ERR (the test
 *                               takes the link down), prints "down",
 *                               expects PORT_ACTIVE
 *   srn_test client ADDR PORT   the active side: RC and UC QPs exchange
 *                               SEND_WITH_IMM, RDMA_WRITE_WITH_IMM and inline
 *                               SENDs with the server, through ibv_post_send
 *                               and the ibv_wr_* API, and check the errors
 *                               (and asynchronous events) of a SEND the
 *                               receiver has no room for, of a wrong lkey
 *                               and of a WRITE with a wrong rkey; then RC
 *                               and UC QPs on the server's SRQ (COMM_EST,
 *                               SRQ_LIMIT_REACHED), a CQ armed for
 *                               solicited completions only, SQ_DRAINED
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
#include <pthread.h>
#include <sys/epoll.h>
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

static bool port_event(enum ibv_event_type t)
{
	return t == IBV_EVENT_PORT_ACTIVE || t == IBV_EVENT_PORT_ERR;
}

/* Waits (bounded) for the next asynchronous event of ctx, which must be of
 * type t about element (a QP, CQ or SRQ; NULL: the port or the device), and
 * acknowledges it. Port events other than t are skipped: the link of a
 * veth that just came up goes active a while after (the kernel's link
 * watch), which a test may see. */
static void expect_async(struct ibv_context *ctx, enum ibv_event_type t, const void *element)
{
	struct pollfd pfd = {.fd = ctx->async_fd, .events = POLLIN};
	struct ibv_async_event ev;
	for (;;) {
		if (!CHECK(poll(&pfd, 1, 10000) == 1, "no asynchronous event (wanted %s)", ibv_event_type_str(t)))
			return;
		if (!CHECK(ibv_get_async_event(ctx, &ev) == 0, "get_async_event: %s", strerror(errno)))
			return;
		if (!port_event(ev.event_type) || ev.event_type == t)
			break;
		ibv_ack_async_event(&ev);
	}
	const void *got = NULL;
	switch (ev.event_type) {
	case IBV_EVENT_CQ_ERR: got = ev.element.cq; break;
	case IBV_EVENT_SRQ_ERR:
	case IBV_EVENT_SRQ_LIMIT_REACHED: got = ev.element.srq; break;
	case IBV_EVENT_PORT_ACTIVE:
	case IBV_EVENT_PORT_ERR:
		CHECK(ev.element.port_num == 1, "port event on port %d", ev.element.port_num);
		break;
	case IBV_EVENT_DEVICE_FATAL: break;
	default: got = ev.element.qp; break;
	}
	CHECK(ev.event_type == t && got == element, "event %s on %p, want %s on %p", ibv_event_type_str(ev.event_type),
	      got, ibv_event_type_str(t), element);
	ibv_ack_async_event(&ev);
}

/* The async fd stays quiet for a while (but for port events, see
 * expect_async). */
static void no_async(struct ibv_context *ctx)
{
	struct pollfd pfd = {.fd = ctx->async_fd, .events = POLLIN};
	while (poll(&pfd, 1, 200) == 1) {
		struct ibv_async_event ev;
		if (!CHECK(ibv_get_async_event(ctx, &ev) == 0, "get_async_event: %s", strerror(errno)))
			return;
		CHECK(port_event(ev.event_type), "unexpected event %s", ibv_event_type_str(ev.event_type));
		ibv_ack_async_event(&ev);
	}
}

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

/* A QP with n receives posted, in INIT on cq, whose move to ERR flushes
 * them (n error completions). */
static struct ibv_qp *qp_with_receives(struct ibv_pd *pd, struct ibv_cq *cq, int n)
{
	struct ibv_qp_init_attr ia = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UD,
				      .cap = {.max_send_wr = 1, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1}};
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	MUST(qp, "create_qp: %s", strerror(errno));
	to_init(qp, IBV_QPT_UD);
	for (int i = 0; i < n; i++) {
		struct ibv_recv_wr r = {.wr_id = (uint64_t)i}, *bad;
		MUST(ibv_post_recv(qp, &r, &bad) == 0, "post_recv");
	}
	return qp;
}

static void to_err(struct ibv_qp *qp)
{
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
	modify(qp, &a, IBV_QP_STATE, 0);
}

static void test_device(struct ibv_context *ctx)
{
	struct ibv_device_attr da;
	CHECK(ibv_query_device(ctx, &da) == 0, "query_device");
	CHECK(da.phys_port_cnt == 1 && da.max_qp > 0 && da.max_cqe > 0 && da.node_guid != 0, "device attrs");
	CHECK(da.max_srq > 0 && da.max_srq_wr >= 1024 && da.max_srq_sge >= 1 &&
		      !(da.device_cap_flags & IBV_DEVICE_SRQ_RESIZE),
	      "SRQ attrs %d %d %d flags %#x", da.max_srq, da.max_srq_wr, da.max_srq_sge, da.device_cap_flags);
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
	struct ibv_srq_init_attr_ex sx = {.attr = {.max_wr = 4, .max_sge = 1}, .pd = pd,
					  .comp_mask = IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_TYPE, .srq_type = IBV_SRQT_XRC};
	errno = 0;
	CHECK(ibv_create_srq_ex(ctx, &sx) == NULL && errno == EOPNOTSUPP, "XRC SRQ: errno %d", errno);
	sx.srq_type = IBV_SRQT_TM;
	sx.comp_mask |= IBV_SRQ_INIT_ATTR_TM;
	errno = 0;
	CHECK(ibv_create_srq_ex(ctx, &sx) == NULL && errno == EOPNOTSUPP, "tag-matching SRQ: errno %d", errno);
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

/* The library gives the CPU away on every 32nd poll in a row that finds a
 * CQ empty (cq.c). This program's sched_yield, exported ahead of libc's
 * (c/Makefile), counts the calls. */
static unsigned yields;

int sched_yield(void)
{
	yields++;
	return 0;
}

static void test_idle_poll(struct ibv_context *ctx, struct ibv_pd *pd)
{
	struct ibv_cq_init_attr_ex ca = {.cqe = 8, .wc_flags = IBV_WC_STANDARD_FLAGS};
	struct ibv_cq_ex *cx = ibv_create_cq_ex(ctx, &ca);
	MUST(cx, "create_cq_ex: %s", strerror(errno));
	struct ibv_cq *cq = ibv_cq_ex_to_cq(cx);
	struct ibv_wc wc;
	unsigned y = yields;
	for (int i = 0; i < 64; i++)
		CHECK(ibv_poll_cq(cq, 1, &wc) == 0, "poll %d of an empty CQ", i);
	CHECK(yields - y == 2, "64 polls of an empty CQ yielded %u times, want 2", yields - y);
	y = yields;
	for (int i = 0; i < 32; i++)
		ibv_poll_cq(cq, 0, &wc);
	CHECK(yields == y, "polls for no entries yielded %u times", yields - y);
	/* A poll that finds an entry starts the count again. */
	struct ibv_qp *qp = qp_with_receives(pd, cq, 2);
	to_err(qp);
	double end = now() + 10;
	int n;
	while ((n = ibv_poll_cq(cq, 1, &wc)) == 0 && now() < end)
		usleep(100);
	MUST(n == 1, "no flush completion: %d", n);
	y = yields;
	struct ibv_poll_cq_attr pa = {0};
	CHECK(ibv_start_poll(cx, &pa) == 0, "start_poll: the second flush completion");
	ibv_end_poll(cx);
	for (int i = 0; i < 31; i++)
		CHECK(ibv_start_poll(cx, &pa) == ENOENT, "start_poll %d of an empty CQ", i);
	CHECK(yields == y, "31 empty polls after an entry yielded %u times", yields - y);
	CHECK(ibv_start_poll(cx, &pa) == ENOENT && yields == y + 1, "the 32nd empty poll yielded %u times", yields - y);
	CHECK(ibv_destroy_qp(qp) == 0, "destroy_qp");
	CHECK(ibv_destroy_cq(cq) == 0, "destroy_cq");
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

/* SRQs: creation and its limits, modify (limit, no resize), query, the
 * verbs_context path, posting (SGE count, a full SRQ), QPs of every type on
 * one, QP_LAST_WQE_REACHED when one goes to ERR, EBUSY while in use. */
static void test_srq(struct ibv_context *ctx, struct ibv_pd *pd)
{
	struct ibv_device_attr da;
	MUST(ibv_query_device(ctx, &da) == 0, "query_device");
	struct ibv_srq_init_attr sa = {.srq_context = (void *)0x5a, .attr = {.max_wr = 0, .max_sge = 1}};
	errno = 0;
	CHECK(ibv_create_srq(pd, &sa) == NULL && errno == EINVAL, "SRQ of 0 WRs: errno %d", errno);
	sa.attr.max_wr = (uint32_t)da.max_srq_wr + 1;
	errno = 0;
	CHECK(ibv_create_srq(pd, &sa) == NULL && errno == EINVAL, "SRQ over max_srq_wr: errno %d", errno);
	sa.attr.max_wr = 10;
	sa.attr.max_sge = (uint32_t)da.max_srq_sge + 1;
	errno = 0;
	CHECK(ibv_create_srq(pd, &sa) == NULL && errno == EINVAL, "SRQ over max_srq_sge: errno %d", errno);
	sa.attr.max_sge = 2;
	sa.attr.srq_limit = 5; /* ignored at creation */
	struct ibv_srq *srq = ibv_create_srq(pd, &sa);
	MUST(srq, "create_srq: %s", strerror(errno));
	CHECK(sa.attr.max_wr >= 10 && sa.attr.max_sge == 2 && srq->context == ctx && srq->pd == pd &&
		      srq->srq_context == (void *)0x5a,
	      "granted %u WRs %u SGEs", sa.attr.max_wr, sa.attr.max_sge);
	struct ibv_srq_attr qa;
	CHECK(ibv_query_srq(srq, &qa) == 0 && qa.max_wr == sa.attr.max_wr && qa.max_sge == 2 && qa.srq_limit == 0,
	      "query_srq %u %u %u", qa.max_wr, qa.max_sge, qa.srq_limit);
	struct ibv_srq_attr ma = {.max_wr = 64, .srq_limit = sa.attr.max_wr + 1};
	CHECK(ibv_modify_srq(srq, &ma, IBV_SRQ_MAX_WR) == EINVAL, "resize");
	CHECK(ibv_modify_srq(srq, &ma, IBV_SRQ_LIMIT) == EINVAL, "limit above max_wr");
	CHECK(ibv_modify_srq(srq, &ma, 1 << 5) == EINVAL, "unknown mask bit");
	ma.srq_limit = 4;
	CHECK(ibv_modify_srq(srq, &ma, IBV_SRQ_LIMIT) == 0, "arm the limit");
	CHECK(ibv_query_srq(srq, &qa) == 0 && qa.srq_limit == 4, "armed limit %u", qa.srq_limit);
	uint32_t num;
	CHECK(ibv_get_srq_num(srq, &num) == EOPNOTSUPP, "SRQ number of a basic SRQ (XRC only)");

	/* Posting: too many SGEs is refused at once (the WR before it is
	 * posted); the SRQ takes receives until its ring (max_wr), and the
	 * device's SRQ behind it as far as the daemon has moved them there,
	 * are full. */
	struct ibv_sge sg[3] = {0};
	struct ibv_recv_wr r2 = {.wr_id = 2, .sg_list = sg, .num_sge = 3}, r1 = {.wr_id = 1, .next = &r2}, *bad = NULL;
	CHECK(ibv_post_srq_recv(srq, &r1, &bad) == EINVAL && bad == &r2, "3 SGEs on a 2-SGE SRQ");
	int taken = 1, err = 0;
	for (; taken <= 4 * (int)sa.attr.max_wr; taken++) {
		struct ibv_recv_wr r = {.wr_id = 100 + taken};
		if ((err = ibv_post_srq_recv(srq, &r, &bad)))
			break;
	}
	CHECK(err == ENOMEM && taken >= (int)sa.attr.max_wr && taken <= 2 * (int)sa.attr.max_wr,
	      "full SRQ: %d after %d receives", err, taken);

	/* The verbs_context path of ibv_create_srq_ex (a mask the inline
	 * wrapper does not hand to ibv_create_srq). */
	struct ibv_cq *cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	MUST(cq, "create_cq");
	struct ibv_srq_init_attr_ex sx = {.attr = {.max_wr = 4, .max_sge = 1}, .pd = pd, .cq = cq, .srq_type = IBV_SRQT_BASIC,
					  .comp_mask = IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_CQ};
	struct ibv_srq *srq2 = ibv_create_srq_ex(ctx, &sx);
	CHECK(srq2 && sx.attr.max_wr >= 4, "create_srq_ex: %s", strerror(errno));

	/* QPs of every type on the SRQ: no receive queue of their own. */
	enum ibv_qp_type types[] = {IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD};
	struct ibv_qp *qps[3];
	for (int i = 0; i < 3; i++) {
		struct ibv_qp_init_attr ia = {.send_cq = cq, .recv_cq = cq, .srq = srq, .qp_type = types[i],
					      .cap = {.max_send_wr = 4, .max_send_sge = 1, .max_recv_wr = 99, .max_recv_sge = 99}};
		qps[i] = ibv_create_qp(pd, &ia);
		MUST(qps[i], "QP type %d on an SRQ: %s", types[i], strerror(errno));
		CHECK(qps[i]->srq == srq && ia.cap.max_recv_wr == 0 && ia.cap.max_recv_sge == 0, "QP on the SRQ: caps %u %u",
		      ia.cap.max_recv_wr, ia.cap.max_recv_sge);
		to_init(qps[i], types[i]);
		struct ibv_recv_wr r = {.wr_id = 1};
		CHECK(ibv_post_recv(qps[i], &r, &bad) == EINVAL && bad == &r, "post_recv on a QP of an SRQ");
		struct ibv_qp_attr a;
		struct ibv_qp_init_attr qi;
		CHECK(ibv_query_qp(qps[i], &a, IBV_QP_CAP, &qi) == 0 && qi.srq == srq, "query_qp: SRQ %p", (void *)qi.srq);
	}
	CHECK(ibv_destroy_srq(srq) == EBUSY, "destroy an SRQ in use");

	/* A QP on an SRQ that goes to ERR takes no more of its receives:
	 * QP_LAST_WQE_REACHED, and none of the SRQ's receives is flushed. */
	struct ibv_qp_attr e = {.qp_state = IBV_QPS_ERR};
	modify(qps[0], &e, IBV_QP_STATE, 0);
	expect_async(ctx, IBV_EVENT_QP_LAST_WQE_REACHED, qps[0]);
	usleep(100000);
	struct ibv_wc wc;
	CHECK(ibv_poll_cq(cq, 1, &wc) == 0, "a receive of the SRQ completed with its QP: id %llu",
	      (unsigned long long)wc.wr_id);
	for (int i = 0; i < 3; i++)
		CHECK(ibv_destroy_qp(qps[i]) == 0, "destroy QP on the SRQ");
	no_async(ctx);
	CHECK(ibv_destroy_srq(srq) == 0, "destroy_srq");
	if (srq2)
		CHECK(ibv_destroy_srq(srq2) == 0, "destroy the extended SRQ");
	CHECK(ibv_destroy_cq(cq) == 0, "destroy_cq");
}

/* Drains cq: how many completions it held (waiting up to secs for the
 * first want). */
static int drain(struct ibv_cq *cq, int want, double secs)
{
	struct ibv_wc wc[16];
	int got = 0;
	double end = now() + secs;
	for (;;) {
		int n = ibv_poll_cq(cq, 16, wc);
		got += n > 0 ? n : 0;
		if (n <= 0 && (got >= want || now() > end))
			return got;
		if (n <= 0)
			usleep(100);
	}
}

struct destroy_arg {
	struct ibv_cq *cq;
	int err;
	volatile int done;
};

static void *destroy_cq_thread(void *p)
{
	struct destroy_arg *a = p;
	a->err = ibv_destroy_cq(a->cq);
	a->done = 1;
	return NULL;
}

/* Completion channels as rdma-core has them: one-shot notification of the
 * next completion (not of one already there), several CQs on
 * one channel (its fd in poll and in an epoll set), EAGAIN without an event
 * when non-blocking, solicited-only requests woken by completions in error,
 * ibv_destroy_cq waiting for the acknowledgment of its events. */
static void test_channels(struct ibv_context *ctx, struct ibv_pd *pd)
{
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	MUST(ch, "comp channel");
	int fl = fcntl(ch->fd, F_GETFL);
	MUST(fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK) == 0, "non-blocking channel");
	struct ibv_cq *cq1 = ibv_create_cq(ctx, 16, (void *)1, ch, 0), *cq2 = ibv_create_cq(ctx, 16, (void *)2, ch, 0);
	MUST(cq1 && cq2, "create_cq");
	struct ibv_cq *ecq;
	void *ectx;
	errno = 0;
	CHECK(ibv_get_cq_event(ch, &ecq, &ectx) == -1 && errno == EAGAIN, "event before any: errno %d", errno);

	/* Two CQs, both armed (one for solicited completions only: flushes
	 * are errors, hence solicited), one channel: two events. */
	struct ibv_qp *q1 = qp_with_receives(pd, cq1, 2), *q2 = qp_with_receives(pd, cq2, 2);
	CHECK(ibv_req_notify_cq(cq1, 0) == 0 && ibv_req_notify_cq(cq2, 1) == 0, "req_notify_cq");
	int ep = epoll_create1(EPOLL_CLOEXEC);
	struct epoll_event ev = {.events = EPOLLIN};
	MUST(ep >= 0 && epoll_ctl(ep, EPOLL_CTL_ADD, ch->fd, &ev) == 0, "channel fd in an epoll set");
	to_err(q1);
	to_err(q2);
	CHECK(epoll_wait(ep, &ev, 1, 10000) == 1, "the channel's fd never became readable in epoll");
	bool seen[3] = {false};
	for (int i = 0; i < 2; i++) {
		struct pollfd pfd = {.fd = ch->fd, .events = POLLIN};
		CHECK(poll(&pfd, 1, 10000) == 1, "channel fd not readable for event %d", i);
		if (CHECK(ibv_get_cq_event(ch, &ecq, &ectx) == 0 && (ecq == cq1 || ecq == cq2) && ectx == ecq->cq_context,
			  "get_cq_event %d: %s", i, strerror(errno)))
			seen[(uintptr_t)ectx] = true;
	}
	CHECK(seen[1] && seen[2], "events of both CQs");
	ibv_ack_cq_events(cq1, 1);
	ibv_ack_cq_events(cq2, 1);
	CHECK(drain(cq1, 2, 10) == 2 && drain(cq2, 2, 10) == 2, "flushed receives");

	/* One shot: completions after the event, not re-armed, raise none. */
	struct ibv_qp *q3 = qp_with_receives(pd, cq1, 1);
	to_err(q3);
	CHECK(drain(cq1, 1, 10) == 1, "flush of q3");
	struct pollfd pfd = {.fd = ch->fd, .events = POLLIN};
	CHECK(poll(&pfd, 1, 200) == 0, "an event without a request");

	/* A request notifies the next completion, as rxe's does: one already
	 * in the CQ (not yet polled) raises none, one added after does. */
	struct ibv_qp *q4 = qp_with_receives(pd, cq1, 1), *q5 = qp_with_receives(pd, cq1, 1);
	to_err(q4);
	usleep(200000); /* the flush reaches the ring */
	CHECK(ibv_req_notify_cq(cq1, 0) == 0, "req_notify_cq");
	CHECK(poll(&pfd, 1, 200) == 0, "an event for a completion already in the CQ");
	to_err(q5);
	CHECK(poll(&pfd, 1, 10000) == 1 && ibv_get_cq_event(ch, &ecq, &ectx) == 0 && ecq == cq1,
	      "no event for a completion after the request");

	/* ibv_destroy_cq waits until the event handed out is acknowledged. */
	CHECK(ibv_destroy_qp(q1) == 0 && ibv_destroy_qp(q3) == 0 && ibv_destroy_qp(q4) == 0 && ibv_destroy_qp(q5) == 0,
	      "destroy QPs");
	CHECK(drain(cq1, 2, 10) == 2, "flushes of q4 and q5");
	struct destroy_arg da = {.cq = cq1};
	pthread_t th;
	MUST(pthread_create(&th, NULL, destroy_cq_thread, &da) == 0, "thread");
	usleep(200000);
	CHECK(!da.done, "destroy_cq returned with an event unacknowledged");
	ibv_ack_cq_events(cq1, 1);
	pthread_join(th, NULL);
	CHECK(da.done && da.err == 0, "destroy_cq after the acknowledgment: %d", da.err);
	CHECK(ibv_destroy_comp_channel(ch) == EBUSY, "channel with a CQ");
	CHECK(ibv_destroy_qp(q2) == 0 && ibv_destroy_cq(cq2) == 0, "destroy");
	CHECK(ibv_destroy_comp_channel(ch) == 0, "destroy channel");
	close(ep);
}

/* A CQ overrun: more completions than a CQ holds, nobody polling. The CQ
 * reports IBV_EVENT_CQ_ERR, and ibv_destroy_cq waits for its
 * acknowledgment. */
static void test_cq_overrun(struct ibv_context *ctx, struct ibv_pd *pd)
{
	struct ibv_cq *cq = ibv_create_cq(ctx, 1, NULL, NULL, 0);
	MUST(cq, "create_cq");
	struct ibv_qp *qp = qp_with_receives(pd, cq, 8);
	to_err(qp);
	expect_async(ctx, IBV_EVENT_CQ_ERR, cq);
	CHECK(ibv_destroy_qp(qp) == 0 && ibv_destroy_cq(cq) == 0, "destroy after the overrun");
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
	test_idle_poll(ctx, pd);
	test_srq(ctx, pd);
	test_channels(ctx, pd);
	test_cq_overrun(ctx, pd);
	no_async(ctx);
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
	uint32_t qpn[3]; /* traffic: RC, UC; srq: see srq_traffic */
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
		/* The responder refused an invalid request: its QP is in ERR. */
		expect_async(ctx, IBV_EVENT_QP_REQ_ERR, qp[0]);
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
		expect_async(ctx, IBV_EVENT_QP_FATAL, qp[0]);

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
	no_async(ctx); /* a UC send error (SQE) raises none */
	for (int i = 0; i < 2; i++)
		CHECK(ibv_destroy_qp(qp[i]) == 0, "destroy_qp");
	CHECK(ibv_destroy_cq(cq) == 0, "destroy_cq");
	CHECK(ibv_dealloc_pd(pd) == 0, "dealloc_pd");
	CHECK(ibv_close_device(ctx) == 0, "close_device");
	finish();
	return 0;
}

/* ---- SRQs, COMM_EST, solicited events and an access error between two
 * processes ---- */

enum { SRQ_RC, SRQ_UC, ACC_RC, NQP };

/* The server: an RC and a UC QP on one SRQ (the RC one left in RTR, so
 * that its first packet is COMM_EST), an RC QP of its own for the access
 * error, and one CQ on a completion channel, armed for solicited
 * completions only. The client sends. */
static int srq_traffic(const char *host, const char *port)
{
	bool server = host == NULL;
	struct ibv_context *ctx = open_first();
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	MUST(pd, "alloc_pd");
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	MUST(ch, "comp channel");
	struct ibv_cq *cq = ibv_create_cq(ctx, 64, (void *)0xc0, ch, 0);
	MUST(cq, "create_cq");
	struct ibv_srq *srq = NULL;
	if (server) {
		struct ibv_srq_init_attr sa = {.attr = {.max_wr = 16, .max_sge = 1}};
		srq = ibv_create_srq(pd, &sa);
		MUST(srq && sa.attr.max_wr == 16, "create_srq: %s", strerror(errno));
	}
	enum ibv_qp_type types[NQP] = {IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_RC};
	struct ibv_qp *qp[NQP];
	struct endpoint me = {0}, peer;
	for (int i = 0; i < NQP; i++) {
		struct ibv_qp_init_attr a = {.send_cq = cq, .recv_cq = cq, .qp_type = types[i], .srq = i == ACC_RC ? NULL : srq,
					     .cap = {.max_send_wr = 32, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1,
						     .max_inline_data = 64}};
		qp[i] = ibv_create_qp(pd, &a);
		MUST(qp[i], "create_qp: %s", strerror(errno));
		me.qpn[i] = qp[i]->qp_num;
	}
	union ibv_gid g;
	MUST(ibv_query_gid(ctx, 1, 0, &g) == 0, "query_gid");
	memcpy(me.gid, g.raw, 16);
	int fd = tcp_exchange(host, port, &me, &peer);
	MUST(fd >= 0, "out-of-band exchange with the peer");
	for (int i = 0; i < NQP; i++) {
		if (server && i == SRQ_RC) {
			/* Left in RTR: receiving, not sending. */
			to_init(qp[i], types[i]);
			struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = peer.qpn[i],
						.max_dest_rd_atomic = 1, .min_rnr_timer = 12,
						.ah_attr = {.is_global = 1, .port_num = 1, .grh = {.hop_limit = 64}}};
			memcpy(a.ah_attr.grh.dgid.raw, peer.gid, 16);
			modify(qp[i], &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
						  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER, 0);
		} else {
			connect_qp(qp[i], types[i], peer.qpn[i], peer.gid);
		}
	}
	struct ibv_wc wc;
	struct ibv_recv_wr *bad_r;
	struct ibv_send_wr *bad_s;
	if (server) {
		for (int k = 0; k < 16; k++) {
			struct ibv_recv_wr r = {.wr_id = 1000 + k};
			MUST(ibv_post_srq_recv(srq, &r, &bad_r) == 0, "post_srq_recv %d", k);
		}
		struct ibv_srq_attr la = {.srq_limit = 4};
		CHECK(ibv_modify_srq(srq, &la, IBV_SRQ_LIMIT) == 0, "arm the SRQ limit");
		CHECK(ibv_req_notify_cq(cq, 1) == 0, "req_notify_cq, solicited only");
	}
	sync_peer(fd); /* receives posted, CQ armed */

	/* Three SENDs without SE on the RC QP (the client waits for their
	 * ACKs): no completion event for them; the RC QP in RTR reports
	 * COMM_EST. */
	if (!server) {
		for (int k = 0; k < 3; k++) {
			struct ibv_send_wr w = {.wr_id = k, .opcode = IBV_WR_SEND_WITH_IMM, .send_flags = IBV_SEND_SIGNALED,
						.imm_data = htobe32(k)};
			CHECK(ibv_post_send(qp[SRQ_RC], &w, &bad_s) == 0, "post_send %d", k);
			CHECK(poll_one(cq, &wc, 20) == 1 && wc.status == IBV_WC_SUCCESS, "send %d: %s", k,
			      ibv_wc_status_str(wc.status));
		}
	}
	sync_peer(fd);
	struct pollfd pfd = {.fd = ch->fd, .events = POLLIN};
	if (server) {
		expect_async(ctx, IBV_EVENT_COMM_EST, qp[SRQ_RC]);
		usleep(200000);
		CHECK(poll(&pfd, 1, 0) == 0, "a completion event for completions without SE");
		for (int k = 0; k < 3; k++)
			CHECK(poll_one(cq, &wc, 20) == 1 && wc.status == IBV_WC_SUCCESS && wc.qp_num == qp[SRQ_RC]->qp_num &&
				      wc.wr_id >= 1000 && be32toh(wc.imm_data) == (uint32_t)k,
			      "receive %d on the SRQ: id %llu status %s", k, (unsigned long long)wc.wr_id,
			      ibv_wc_status_str(wc.status));
	}
	sync_peer(fd);

	/* One SEND with SE on the UC QP: the event. */
	if (!server) {
		struct ibv_send_wr w = {.wr_id = 9, .opcode = IBV_WR_SEND_WITH_IMM,
					.send_flags = IBV_SEND_SIGNALED | IBV_SEND_SOLICITED, .imm_data = htobe32(9)};
		CHECK(ibv_post_send(qp[SRQ_UC], &w, &bad_s) == 0, "solicited post_send");
		CHECK(poll_one(cq, &wc, 20) == 1 && wc.status == IBV_WC_SUCCESS, "solicited send");
	} else {
		struct ibv_cq *ecq = NULL;
		void *ectx = NULL;
		CHECK(poll(&pfd, 1, 10000) == 1 && ibv_get_cq_event(ch, &ecq, &ectx) == 0 && ecq == cq && ectx == (void *)0xc0,
		      "no completion event for a solicited SEND");
		ibv_ack_cq_events(cq, 1);
		CHECK(poll_one(cq, &wc, 20) == 1 && wc.status == IBV_WC_SUCCESS && wc.qp_num == qp[SRQ_UC]->qp_num &&
			      be32toh(wc.imm_data) == 9,
		      "solicited receive: qp %u status %s", wc.qp_num, ibv_wc_status_str(wc.status));
	}
	sync_peer(fd);

	/* Nine more SENDs: the SRQ holds 3 of 16, fewer than its limit of 4. */
	if (!server) {
		for (int k = 0; k < 9; k++) {
			struct ibv_send_wr w = {.wr_id = 10 + k, .opcode = IBV_WR_SEND_WITH_IMM, .send_flags = IBV_SEND_SIGNALED};
			CHECK(ibv_post_send(qp[SRQ_RC], &w, &bad_s) == 0, "post_send");
			CHECK(poll_one(cq, &wc, 20) == 1 && wc.status == IBV_WC_SUCCESS, "send: %s", ibv_wc_status_str(wc.status));
		}
	} else {
		expect_async(ctx, IBV_EVENT_SRQ_LIMIT_REACHED, srq);
		struct ibv_srq_attr qa;
		CHECK(ibv_query_srq(srq, &qa) == 0 && qa.srq_limit == 0, "limit %u after the event", qa.srq_limit);
		for (int k = 0; k < 9; k++)
			CHECK(poll_one(cq, &wc, 20) == 1 && wc.status == IBV_WC_SUCCESS, "receive %d", k);
	}
	sync_peer(fd);

	/* An inline WRITE with a wrong rkey: the responder refuses it
	 * (QP_ACCESS_ERR), the requester fails (REM_ACCESS_ERR, QP_FATAL). */
	if (!server) {
		char data[8] = "rkey?";
		struct ibv_sge sg = {.addr = (uintptr_t)data, .length = sizeof(data)};
		struct ibv_send_wr w = {.wr_id = 50, .sg_list = &sg, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
					.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE,
					.wr.rdma = {.remote_addr = 0x10000, .rkey = 0xdead}};
		CHECK(ibv_post_send(qp[ACC_RC], &w, &bad_s) == 0, "inline WRITE");
		CHECK(poll_one(cq, &wc, 30) == 1 && wc.wr_id == 50 && wc.status == IBV_WC_REM_ACCESS_ERR,
		      "WRITE with a wrong rkey: id %llu status %s", (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status));
		expect_async(ctx, IBV_EVENT_QP_FATAL, qp[ACC_RC]);
		/* An idle RC QP moved to SQD with notification: SQ_DRAINED. */
		struct ibv_qp_attr a = {.qp_state = IBV_QPS_SQD, .en_sqd_async_notify = 1};
		modify(qp[SRQ_RC], &a, IBV_QP_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY, 0);
		expect_async(ctx, IBV_EVENT_SQ_DRAINED, qp[SRQ_RC]);
	} else {
		expect_async(ctx, IBV_EVENT_QP_ACCESS_ERR, qp[ACC_RC]);
	}
	sync_peer(fd);
	close(fd);
	no_async(ctx);
	for (int i = 0; i < NQP; i++)
		CHECK(ibv_destroy_qp(qp[i]) == 0, "destroy_qp");
	if (srq)
		CHECK(ibv_destroy_srq(srq) == 0, "destroy_srq");
	CHECK(ibv_destroy_cq(cq) == 0, "destroy_cq");
	CHECK(ibv_destroy_comp_channel(ch) == 0, "destroy channel");
	CHECK(ibv_dealloc_pd(pd) == 0, "dealloc_pd");
	CHECK(ibv_close_device(ctx) == 0, "close_device");
	finish();
	return 0;
}

/* Run while the test takes the link down after "ready" and up again after
 * "down". */
static int port_events(void)
{
	struct ibv_context *ctx = open_first();
	struct ibv_port_attr pa;
	CHECK(ibv_query_port(ctx, 1, &pa) == 0 && pa.state == IBV_PORT_ACTIVE, "port state %d", pa.state);
	no_async(ctx);
	printf("ready\n");
	expect_async(ctx, IBV_EVENT_PORT_ERR, NULL);
	CHECK(ibv_query_port(ctx, 1, &pa) == 0 && pa.state == IBV_PORT_DOWN, "port state %d after PORT_ERR", pa.state);
	printf("down\n");
	expect_async(ctx, IBV_EVENT_PORT_ACTIVE, NULL);
	CHECK(ibv_query_port(ctx, 1, &pa) == 0 && pa.state == IBV_PORT_ACTIVE, "port state %d after PORT_ACTIVE",
	      pa.state);
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
	if (argc == 2 && !strcmp(argv[1], "port"))
		return port_events();
	if (argc == 3 && !strcmp(argv[1], "srq-server"))
		return srq_traffic(NULL, argv[2]);
	if (argc == 4 && !strcmp(argv[1], "srq-client"))
		return srq_traffic(argv[2], argv[3]);
	if (argc == 3 && !strcmp(argv[1], "server"))
		return traffic(NULL, argv[2]);
	if (argc == 4 && !strcmp(argv[1], "client"))
		return traffic(argv[2], argv[3]);
	fprintf(stderr, "usage: srn_test control | fatal | port | server PORT | client ADDR PORT | srq-server PORT | "
			"srq-client ADDR PORT\n");
	return 2;
}

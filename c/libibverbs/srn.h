/*
 * softrnic's libibverbs.so.1: what the library's files share.
 *
 * The library is a thin client of the softrnic daemon: control verbs are
 * messages on the daemon's control socket (conn.c), the data path is the
 * shared-memory rings the daemon hands out (ring.h). Everything the
 * protocol defines comes from the generated softrnic_proto.h; the verbs
 * ABI comes from Debian's <infiniband/verbs.h>, so structs and the inline
 * dispatch match what applications were compiled against.
 */
#ifndef SRN_H
#define SRN_H

#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "softrnic_proto.h"

/* verbs.h turns these into inline wrappers; the library defines the
 * exported functions themselves. */
#undef ibv_get_device_list
#undef ibv_query_port
#undef ibv_reg_mr
#undef ibv_reg_mr_iova

#define SRN_EXPORT __attribute__((visibility("default")))
#define SRN_CONTROL_ENV "SOFTRNIC_CONTROL"
#define SRN_DEBUG_ENV "SOFTRNIC_DEBUG"
#define SRN_MR_ENV "SOFTRNIC_MR" /* "copy": registered memory is never moved (share.c) */

/* Prefix of the device name; the interface name follows. */
#define SRN_DEVICE_PREFIX "softrnic_"

/* ---- the daemon connection (conn.c) ---- */

struct srn_conn {
	int fd;
	uint32_t seq;
	pthread_mutex_t lock; /* one call at a time: a reply follows its request */
};

/* The control socket path: $SOFTRNIC_CONTROL, else the protocol default. */
const char *srn_control_path(void);
int srn_conn_open(struct srn_conn *c, const char *path);
void srn_conn_close(struct srn_conn *c);

/*
 * srn_call sends op with the request body (and fds), waits for the reply
 * and copies its body into resp, which must be exactly resp_len bytes, and
 * exactly nfds_out received fds into fds_out. Returns 0 or a positive
 * errno (the daemon's, or the transport's); received fds are closed on any
 * error.
 */
int srn_call(struct srn_conn *c, uint16_t op, const void *req, size_t req_len, const int *fds, int nfds,
	     void *resp, size_t resp_len, int *fds_out, int nfds_out);

/* An operation whose body is one handle and whose reply is empty (the
 * destroys and deallocations). */
int srn_call_handle(struct srn_conn *c, uint16_t op, uint32_t handle);

/* Diagnostics, to stderr when $SOFTRNIC_DEBUG is set (rdma-core's
 * providers are quiet by default too). */
void srn_debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* One line to stderr, always: for what a user must act on. */
void srn_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- objects ---- */

/*
 * The device. Its first members mirror rdma-core's struct verbs_device
 * (device, ops, refcount, list entry, sysfs, core_support) so that the
 * stock libmlx5 and libefa, which applications like perftest load beside
 * libibverbs, find an ops pointer that is not theirs and refuse the device
 * cleanly instead of treating it as one of theirs.
 */
struct srn_device {
	struct ibv_device dev;
	const void *ops;
	int refcount;
	void *entry_next, *entry_prev;
	void *sysfs;
	uint64_t core_support;
	/* ours */
	char control[108]; /* the socket this device was found at */
	struct softrnic_device_info info;
};

/*
 * The objects asynchronous events name, found by the daemon's handle
 * (async.c). An object joins its context's list once created and leaves
 * it, under objs_lock, before its destroy waits for the acknowledgments:
 * an event read later for it is dropped, as the kernel drops the queued
 * events of a destroyed object.
 */
enum srn_obj_kind { SRN_OBJ_CQ = 1, SRN_OBJ_QP, SRN_OBJ_SRQ };

struct srn_obj {
	struct srn_obj *next, *prev;
	uint32_t handle;
	enum srn_obj_kind kind;
	uint32_t events_delivered; /* async events ibv_get_async_event returned for it, under its mutex */
};

struct srn_context {
	struct verbs_context vctx; /* ends with the struct ibv_context applications see */
	struct srn_conn conn;
	struct softrnic_device_info info;
	int pump_db; /* the daemon's doorbell: rung when it sleeps and a ring gets work */
	pthread_mutex_t objs_lock; /* the object list; taken before an object's mutex */
	struct srn_obj objs; /* list head */
	pthread_mutex_t event_lock; /* what ibv_get_async_event reads and reports */
	bool fatal_reported;
	/* this process's address space in the daemon (pd_mr.c), 0 before the
	 * first registration; attached by space_pid (a forked child attaches
	 * its own) */
	uint32_t space;
	pid_t space_pid;
	uint32_t events_lost; /* the daemon's count of dropped events, as last told */
};

static inline struct srn_context *to_sctx(struct ibv_context *ctx)
{
	return (struct srn_context *)((char *)ctx - offsetof(struct srn_context, vctx.context));
}

static inline struct srn_device *to_sdev(struct ibv_device *dev)
{
	return (struct srn_device *)dev;
}

struct srn_pd {
	struct ibv_pd pd;
	uint32_t handle;
};

static inline struct srn_pd *to_spd(struct ibv_pd *pd)
{
	return (struct srn_pd *)pd;
}

struct srn_mr {
	struct ibv_mr mr;
	uint32_t handle;
	uint64_t pinned; /* pages counted against RLIMIT_MEMLOCK (pd_mr.c) */
	uint64_t share_ino; /* the memfd the daemon maps (share.c), 0 on the copy path */
};

/* ---- registered memory moved into shared memory (share.c) ---- */

struct srn_share {
	int fd;       /* the memfd, the caller's to close once it is registered */
	uint64_t off; /* the MR's first byte in it */
	uint64_t ino; /* the reference the MR holds (srn_unshare), 0: none */
};

/* srn_share moves the pages under [a, a+length) into a memfd the daemon
 * can map, or finds the one an earlier MR moved them into: 0, or -1 when
 * the MR must take the copy path. */
int srn_share(uintptr_t a, size_t length, struct srn_share *sh);
/* srn_unshare drops an MR's reference to its memfd (ino 0: none). */
void srn_unshare(uint64_t ino);

#include "ring.h"

struct srn_comp_channel {
	struct ibv_comp_channel ch; /* ch.fd is an epoll set of the member CQs' doorbells */
};

struct srn_cq {
	/* Every CQ is an ibv_cq_ex, whose head is an ibv_cq: the classic and
	 * the extended calls name the same object. */
	union {
		struct ibv_cq cq;
		struct ibv_cq_ex cqx;
	};
	struct ibv_wc cur; /* the ibv_start_poll/ibv_next_poll entry the read_* report */
	uint32_t handle;
	struct srn_ring ring;
	struct srn_consumer cons;
	pthread_spinlock_t lock;
	int db; /* the daemon rings it when the ring's wakeup flag is set */
	uint32_t events_delivered; /* completion events ibv_get_cq_event returned */
	uint32_t empty_polls; /* polls in a row that found the ring empty (cq.c's srn_idle_poll) */
	struct srn_obj obj;
};

static inline struct srn_cq *to_scq(struct ibv_cq *cq)
{
	return (struct srn_cq *)cq;
}

struct srn_qp {
	struct ibv_qp_ex qpx; /* every QP is an ibv_qp_ex (ibv_qp_to_qp_ex) */
	uint32_t handle;
	struct softrnic_ib_qp_caps caps; /* granted */
	struct srn_ring sq, rq;
	struct srn_producer sqp, rqp;
	pthread_spinlock_t slock, rlock;
	/* the ibv_wr_* batch between wr_start and wr_complete */
	int wr_err;		/* first error of the batch, reported by wr_complete */
	uint8_t *wr_slot;	/* the slot of the WR being built, NULL before the first */
	bool sig_all;
	struct srn_obj obj;
};

static inline struct srn_qp *to_sqp(struct ibv_qp *qp)
{
	return (struct srn_qp *)qp;
}

struct srn_srq {
	struct ibv_srq srq;
	uint32_t handle;
	uint32_t max_wr, max_sge; /* granted */
	struct srn_ring ring;
	struct srn_producer prod;
	pthread_spinlock_t lock;
	struct srn_obj obj;
};

static inline struct srn_srq *to_ssrq(struct ibv_srq *srq)
{
	return (struct srn_srq *)srq;
}

struct srn_ah {
	struct ibv_ah ah;
	uint32_t handle; /* the daemon's */
	uint8_t dgid[16];
};

static inline struct srn_ah *to_sah(struct ibv_ah *ah)
{
	return (struct srn_ah *)ah;
}

/* ---- shared between files ---- */

int srn_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr, size_t len);
int srn_query_device_ex(struct ibv_context *ctx, const struct ibv_query_device_ex_input *in,
			struct ibv_device_attr_ex *attr, size_t len);
struct ibv_qp *srn_create_qp_ex(struct ibv_context *ctx, struct ibv_qp_init_attr_ex *attr);
int srn_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc);
struct ibv_cq_ex *srn_create_cq_ex(struct ibv_context *ctx, struct ibv_cq_init_attr_ex *attr);
int srn_req_notify_cq(struct ibv_cq *cq, int solicited_only);
int srn_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
int srn_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
int srn_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
struct ibv_srq *srn_create_srq_ex(struct ibv_context *ctx, struct ibv_srq_init_attr_ex *attr);
/* Writes one receive WR into a ring slot (struct softrnic_recv_slot and
 * its SGEs). */
void srn_put_recv(uint8_t *slot, const struct ibv_recv_wr *wr);
/* The object list of async.c: add once created, remove (then wait for the
 * acknowledgments) before destroying. */
void srn_obj_add(struct srn_context *s, struct srn_obj *o, enum srn_obj_kind kind, uint32_t handle);
void srn_obj_remove(struct srn_context *s, struct srn_obj *o);
void srn_qp_ex_init(struct srn_qp *q);
/* The GID at index of the device, false if there is none. */
bool srn_gid(const struct softrnic_device_info *info, int index, union ibv_gid *gid);
/* Converts between ibv_mtu and bytes. */
enum ibv_mtu srn_mtu_enum(uint32_t bytes);
uint32_t srn_mtu_bytes(enum ibv_mtu mtu);

#endif

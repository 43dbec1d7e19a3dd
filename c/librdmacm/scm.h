/*
 * softrnic's librdmacm.so.1: what the library's files share.
 *
 * The library is rdma_cm for one device, the softrnic daemon's, on top of
 * softrnic's libibverbs.so.1: every ID's verbs is the one context the
 * library opens, applications allocate their PDs and QPs on it, and the CM
 * exchange runs in the daemon (the event-based UCM operations of
 * softrnic_proto.h) on that context's control connection. Like rdma-core's
 * librdmacm over the kernel's rdma_ucm, the library drives the
 * application's QP itself with the attributes the CM negotiated
 * (rdma_init_qp_attr). Address and route resolution map IP addresses to the
 * device's GIDs here, without the daemon.
 *
 * Locks: scm_lock (the device, the ID table, the bound ports) is taken
 * before a channel's lock, which is taken before an ID's mutex. No daemon
 * call is made under a channel's lock.
 */
#ifndef SCM_H
#define SCM_H

#include <infiniband/verbs.h>
#include <pthread.h>
#include <rdma/rdma_cma.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "softrnic_private.h"
#include "softrnic_proto.h"

#define SCM_EXPORT __attribute__((visibility("default")))
#define SCM_DEBUG_ENV "SOFTRNIC_DEBUG"
#define SCM_MAX_GIDS 16

/* Sets errno and returns -1, as rdma-core's calls fail. */
static inline int scm_err(int err)
{
	errno = err;
	return -1;
}

void scm_debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- the device (device.c) ---- */

struct scm_device {
	struct ibv_context *ctx; /* every bound ID's verbs; opened once, kept */
	struct ibv_pd *pd;	 /* rdma_cm's PD (id->pd), while IDs are bound */
	int pd_refs;
	union ibv_gid gids[SCM_MAX_GIDS];
	int ngids;
	enum ibv_mtu active_mtu;
	int max_qp_wr;
	uint8_t max_initiator_depth, max_responder_resources;
	bool gone; /* the daemon went away: no new bindings */
};

extern pthread_mutex_t scm_lock;
extern struct scm_device scm_dev;

/* Opens the device the first time (the daemon at $SOFTRNIC_CONTROL):
 * 0, or -1 with errno ENODEV when there is none, as rdma-core without
 * an RDMA device. */
int scm_init(void);
/* A UCM operation on the device's control connection: 0 or an errno. */
int scm_call(uint16_t op, const void *req, size_t req_len, void *resp, size_t resp_len, int *fds, int nfds);
/* The index of gid in the device's GID table, or -1. Under scm_lock. */
int scm_gid_index(const union ibv_gid *gid);
/* Binds id to the device (verbs, port, PD reference); scm_lock held. */
int scm_acquire_device(struct rdma_cm_id *id);
void scm_release_device(struct rdma_cm_id *id);

/* ---- addresses (addr.c) ---- */

/* The length of an AF_INET or AF_INET6 address, 0 for anything else. */
socklen_t scm_addr_len(const struct sockaddr *sa);
bool scm_addr_any(const struct sockaddr *sa);
uint16_t scm_addr_port(const struct sockaddr *sa); /* host order */
void scm_addr_set_port(struct sockaddr *sa, uint16_t port);
/* An IP address as a RoCE v2 GID (IPv4-mapped for IPv4). */
void scm_addr_gid(const struct sockaddr *sa, union ibv_gid *gid);
/* A GID as an IP address: AF_INET for an IPv4-mapped one. */
void scm_gid_addr(const union ibv_gid *gid, uint16_t port, struct sockaddr_storage *ss);
bool scm_addr_equal(const struct sockaddr *a, const struct sockaddr *b);
/*
 * The device's GID the device would send to dst from: *idx. Returns 0;
 * or an errno to return from rdma_resolve_addr at once (*sync true: no
 * route, as the kernel's address resolution fails synchronously); or one
 * for an ADDR_ERROR event (ENODEV: the route leaves through an interface
 * that is not the device's).
 */
int scm_route_source(const struct sockaddr *dst, int *idx, bool *sync);

/* ---- IDs (id.c) ---- */

enum scm_state {
	SCM_IDLE,
	SCM_BOUND,
	SCM_ADDR_RESOLVED,
	SCM_ROUTE_RESOLVED,
	SCM_LISTEN,
	SCM_CONNECT,	 /* active: REQ sent; passive: request received */
	SCM_CONNECTED,	 /* established (or answered, in the UDP space) */
	SCM_DISCONNECT,
};

struct scm_id {
	struct rdma_cm_id id;
	pthread_mutex_t mut;
	pthread_cond_t cond;
	unsigned events_delivered, events_completed; /* destroy waits for acks */
	bool sync;				     /* id.channel is its own */
	uint32_t handle;			     /* the daemon's ID, 0: none */
	enum scm_state state;
	bool device;	  /* holds a device reference (id.verbs set) */
	bool port_owner;  /* holds its port in the bound-port table */
	bool listening;
	bool connect_error;
	bool removal_reported;
	bool reuseaddr, afonly;
	bool tos_set, timeout_set;
	uint8_t tos, ack_timeout_opt;
	int sgid_index;
	uint32_t psn; /* the first PSN this side's QP expects (its REQ's/REP's Starting PSN) */
	/* what the CM negotiated: set by CONNECT_REQUEST or CONNECT_RESPONSE */
	bool have_peer;
	uint32_t remote_qpn, sq_psn;
	uint8_t path_mtu, ack_timeout, retry_count, rnr_retry_count;
	uint8_t hop_limit, traffic_class;
	uint32_t flow_label;
	uint8_t initiator_depth, responder_resources;
	struct ibv_ece local_ece, remote_ece;
	struct ibv_qp_init_attr *qp_init_attr; /* rdma_create_ep, passive */
	void *connect_data;		       /* rdma_create_ep: ai_connect */
	size_t connect_len;
	struct scm_id *next, *hnext; /* all IDs; IDs by handle */
};

static inline struct scm_id *to_sid(struct rdma_cm_id *id)
{
	return (struct scm_id *)id;
}

/* A new ID on channel (NULL: a private, synchronous one). */
struct scm_id *scm_id_alloc(struct rdma_event_channel *channel, void *context, enum rdma_port_space ps,
			    enum ibv_qp_type qp_type);
void scm_id_free(struct scm_id *s);
/* The ID the daemon calls handle; scm_lock held. */
struct scm_id *scm_id_lookup(uint32_t handle);
void scm_id_set_handle(struct scm_id *s, uint32_t handle);
void scm_id_set_handle_locked(struct scm_id *s, uint32_t handle);
/* A daemon operation that makes an ID (LISTEN, CONNECT): its handle is
 * set before any thread converts an event for it (scm_lock is held
 * across the call), since the daemon's events may reach the channel
 * before the reply is read. 0 or an errno. */
int scm_call_id(struct scm_id *s, uint16_t op, const void *req, size_t req_len);
/* An ID of ch bound to the device whose DEVICE_REMOVAL is not reported
 * yet, now marked reported; scm_lock held. */
struct scm_id *scm_take_removal(struct rdma_event_channel *ch);
/* Binds s to addr (port 0: a free one); scm_lock held. 0 or an errno. */
int scm_bind_locked(struct scm_id *s, const struct sockaddr *addr);
/* For synchronous IDs: waits for the ID's next event, as rdma-core's
 * ucma_complete (0, or -1 with errno from its status). */
int scm_complete(struct scm_id *s);
/* The rdma_cm port space as the protocol's, or -1. */
int scm_port_space(enum rdma_port_space ps);
/* Sets the route's path record from what the ID knows. */
int scm_set_path(struct scm_id *s);

/* ---- events and channels (channel.c) ---- */

struct scm_event {
	struct rdma_cm_event event;
	uint8_t private_data[SOFTRNIC_UCM_MAX_PRIVATE_DATA];
	struct scm_id *owner; /* whose count of events an ack completes */
	bool raw;	      /* a daemon event not yet converted (by handle) */
	struct softrnic_ucm_event ucm;
	struct scm_event *next;
};

struct scm_channel {
	struct rdma_event_channel ch; /* ch.fd: epoll set of the sources below */
	pthread_mutex_t lock;
	struct scm_event *head, *tail; /* the library's own queue */
	int qfd;		       /* eventfd semaphore: one count per queued event */
	int dfd;		       /* the daemon's event socket, -1: none */
	int cfd;		       /* the control connection, watched for hang-up; -1 when reported */
	uint32_t handle;	       /* the daemon's channel, 0: the daemon serves no UCM */
	uint32_t seq;		       /* the last daemon event's sequence number */
};

static inline struct scm_channel *to_sch(struct rdma_event_channel *ch)
{
	return (struct scm_channel *)ch;
}

/* Queues a new event for s on its channel (ADDR_RESOLVED, ...). Returns
 * 0 or -1 with errno. The _locked form is called with scm_lock held. */
int scm_queue_event(struct scm_id *s, enum rdma_cm_event_type type, int status);
int scm_queue_event_locked(struct scm_id *s, enum rdma_cm_event_type type, int status);
/* Takes s's events out of from's queue into into's, or frees them (into
 * NULL: destroy). */
void scm_unqueue(struct scm_id *s, struct scm_channel *from, struct scm_channel *into);
/* Moves every event of the daemon socket of from to queues: those of
 * handle into to's, the others into from's own (migrate). */
void scm_drain_daemon(struct scm_channel *from, uint32_t handle, struct scm_channel *to);
/* Completes an event that will not be delivered. */
void scm_complete_event(struct scm_id *owner);

/* ---- connections (conn.c) ---- */

/*
 * Converts a daemon event into e (whose owner it sets, counting the
 * event as delivered). Returns false when the event is not for the
 * application (an ID destroyed meanwhile, an event after a failed
 * connect): e is then unused.
 */
bool scm_convert(struct scm_channel *c, const struct softrnic_ucm_event *u, struct scm_event *e);
/* The CONNECT_REQUEST's or any event's target in the library: the ID
 * whose channel receives it. */
uint32_t scm_event_target(const struct softrnic_ucm_event *u);
/* Moves id->qp to the error state (no-op without one). */
int scm_qp_error(struct rdma_cm_id *id);

/* ---- QPs (qp.c) ---- */

void scm_destroy_cqs(struct rdma_cm_id *id);

#endif

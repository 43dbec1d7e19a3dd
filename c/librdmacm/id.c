/*
 * IDs: creation and destruction, binding (ports are the process's: the
 * daemon refuses a second listener on a port when the ID listens),
 * address and route resolution, options, migration between channels.
 *
 * Address and route resolution need no daemon: an address is one of the
 * device's GIDs, the route is the one path RoCE has (the GIDs, the port's
 * MTU, the default P_Key), and both complete at once, reported as events
 * on the ID's channel as the kernel reports them.
 */
#define _GNU_SOURCE
#include <endian.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "scm.h"

/* Linux's default ip_local_port_range, whence the kernel's rdma_cm takes
 * the ports of IDs bound to port 0. */
#define SCM_PORT_LO 32768
#define SCM_PORT_HI 60999
/* The packet life time exponent of RoCE paths (Linux: CMA_IBOE_PACKET_LIFETIME). */
#define SCM_PACKET_LIFETIME 18
#define SCM_HOP_LIMIT 64
#define SCM_HASH 256

static struct scm_id *all_ids;		 /* under scm_lock */
static struct scm_id *by_handle[SCM_HASH]; /* under scm_lock */

static uint32_t random_u32(void)
{
	uint32_t v;
	if (getrandom(&v, sizeof(v), 0) != sizeof(v))
		v = (uint32_t)random();
	return v;
}

struct scm_id *scm_id_lookup(uint32_t handle)
{
	for (struct scm_id *s = by_handle[handle % SCM_HASH]; s; s = s->hnext)
		if (s->handle == handle)
			return s;
	return NULL;
}

static void unhash(struct scm_id *s)
{
	if (!s->handle)
		return;
	for (struct scm_id **p = &by_handle[s->handle % SCM_HASH]; *p; p = &(*p)->hnext) {
		if (*p == s) {
			*p = s->hnext;
			break;
		}
	}
	s->handle = 0;
}

void scm_id_set_handle_locked(struct scm_id *s, uint32_t handle)
{
	unhash(s);
	s->handle = handle;
	s->hnext = by_handle[handle % SCM_HASH];
	by_handle[handle % SCM_HASH] = s;
}

void scm_id_set_handle(struct scm_id *s, uint32_t handle)
{
	pthread_mutex_lock(&scm_lock);
	scm_id_set_handle_locked(s, handle);
	pthread_mutex_unlock(&scm_lock);
}

struct scm_id *scm_take_removal(struct rdma_event_channel *ch)
{
	for (struct scm_id *s = all_ids; s; s = s->next) {
		if (s->id.channel == ch && s->device && !s->removal_reported) {
			s->removal_reported = true;
			return s;
		}
	}
	return NULL;
}

int scm_port_space(enum rdma_port_space ps)
{
	switch (ps) {
	case RDMA_PS_TCP: return SOFTRNIC_PORT_SPACE_TCP;
	case RDMA_PS_UDP: return SOFTRNIC_PORT_SPACE_UDP;
	default: return -1; /* RDMA_PS_IB, RDMA_PS_IPOIB: InfiniBand fabrics */
	}
}

struct scm_id *scm_id_alloc(struct rdma_event_channel *channel, void *context, enum rdma_port_space ps,
			    enum ibv_qp_type qp_type)
{
	struct scm_id *s = calloc(1, sizeof(*s));
	if (!s) {
		errno = ENOMEM;
		return NULL;
	}
	if (!channel) {
		channel = rdma_create_event_channel();
		if (!channel) {
			free(s);
			return NULL;
		}
		s->sync = true;
	}
	s->id.channel = channel;
	s->id.context = context;
	s->id.ps = ps;
	s->id.qp_type = qp_type;
	s->psn = random_u32() & 0xffffff;
	s->sgid_index = -1;
	pthread_mutex_init(&s->mut, NULL);
	pthread_cond_init(&s->cond, NULL);
	pthread_mutex_lock(&scm_lock);
	s->next = all_ids;
	all_ids = s;
	pthread_mutex_unlock(&scm_lock);
	return s;
}

/* Unlinks s from every table and gives back its port and device. */
static void unlink_id(struct scm_id *s)
{
	pthread_mutex_lock(&scm_lock);
	for (struct scm_id **p = &all_ids; *p; p = &(*p)->next) {
		if (*p == s) {
			*p = s->next;
			break;
		}
	}
	unhash(s);
	s->port_owner = false;
	scm_release_device(&s->id);
	pthread_mutex_unlock(&scm_lock);
}

void scm_id_free(struct scm_id *s)
{
	unlink_id(s);
	if (s->sync)
		rdma_destroy_event_channel(s->id.channel);
	free(s->id.route.path_rec);
	free(s->qp_init_attr);
	free(s->connect_data);
	pthread_cond_destroy(&s->cond);
	pthread_mutex_destroy(&s->mut);
	free(s);
}

SCM_EXPORT int rdma_create_id(struct rdma_event_channel *channel, struct rdma_cm_id **id, void *context,
			      enum rdma_port_space ps)
{
	if (scm_init())
		return -1;
	enum ibv_qp_type t;
	switch (ps) {
	case RDMA_PS_TCP:
	case RDMA_PS_IB: t = IBV_QPT_RC; break;
	case RDMA_PS_UDP:
	case RDMA_PS_IPOIB: t = IBV_QPT_UD; break;
	default: return scm_err(EINVAL);
	}
	struct scm_id *s = scm_id_alloc(channel, context, ps, t);
	if (!s)
		return -1;
	*id = &s->id;
	return 0;
}

/* Acknowledges the event a synchronous ID holds, then waits until every
 * event handed out for s is acknowledged, as rdma-core's destroy and
 * migrate do. */
static void wait_acks(struct scm_id *s)
{
	if (s->id.event) {
		rdma_ack_cm_event(s->id.event);
		s->id.event = NULL;
	}
	pthread_mutex_lock(&s->mut);
	while (s->events_completed < s->events_delivered)
		pthread_cond_wait(&s->cond, &s->mut);
	pthread_mutex_unlock(&s->mut);
}

SCM_EXPORT int rdma_destroy_id(struct rdma_cm_id *id)
{
	struct scm_id *s = to_sid(id);
	/* The daemon ends what the ID holds there; a daemon that is gone
	 * has ended it already. */
	if (s->handle) {
		struct softrnic_handle_msg m = {.handle = s->handle};
		scm_call(SOFTRNIC_OP_UCM_DESTROY_ID, &m, sizeof(m), NULL, 0, NULL, 0);
	}
	unlink_id(s);
	/* Events not handed out are dropped; those handed out must be
	 * acknowledged first, as with rdma-core. */
	scm_unqueue(s, to_sch(id->channel), NULL);
	wait_acks(s);
	scm_id_free(s);
	return 0;
}

/* Whether an interface of this namespace has the address. */
static bool local_address(const struct sockaddr *sa)
{
	struct ifaddrs *ifs;
	if (getifaddrs(&ifs) < 0)
		return false;
	bool found = false;
	for (struct ifaddrs *i = ifs; i && !found; i = i->ifa_next)
		found = i->ifa_addr && scm_addr_len(i->ifa_addr) && i->ifa_addr->sa_family == sa->sa_family &&
			scm_addr_equal(i->ifa_addr, sa);
	freeifaddrs(ifs);
	return found;
}

/* Whether s may take port on addr: no other ID of its port space holds
 * it on the same address or a wildcard, unless both allow reuse. Under
 * scm_lock. */
static bool port_free(const struct scm_id *s, const struct sockaddr *addr, uint16_t port)
{
	for (const struct scm_id *o = all_ids; o; o = o->next) {
		if (o == s || !o->port_owner || o->id.ps != s->id.ps)
			continue;
		const struct sockaddr *oa = &o->id.route.addr.src_addr;
		if (scm_addr_port(oa) != port)
			continue;
		if (o->reuseaddr && s->reuseaddr && !o->listening)
			continue;
		if (scm_addr_any(oa) || scm_addr_any(addr) || scm_addr_equal(oa, addr))
			return false;
	}
	return true;
}

int scm_bind_locked(struct scm_id *s, const struct sockaddr *addr)
{
	struct rdma_cm_id *id = &s->id;
	socklen_t len = scm_addr_len(addr);
	if (scm_dev.gone)
		return ENODEV;
	int idx = -1;
	union ibv_gid gid;
	scm_addr_gid(addr, &gid);
	if (!scm_addr_any(addr)) {
		idx = scm_gid_index(&gid);
		if (idx < 0) /* the kernel's answers: an address of no RDMA device, or of no interface */
			return local_address(addr) ? ENODEV : EADDRNOTAVAIL;
	}
	uint16_t port = scm_addr_port(addr);
	if (port && !port_free(s, addr, port))
		return EADDRINUSE;
	if (!port) {
		uint32_t span = SCM_PORT_HI - SCM_PORT_LO + 1, start = random_u32() % span;
		for (uint32_t i = 0; i < span && !port; i++) {
			uint16_t p = (uint16_t)(SCM_PORT_LO + (start + i) % span);
			if (port_free(s, addr, p))
				port = p;
		}
		if (!port)
			return EADDRINUSE;
	}
	if (idx >= 0) {
		int err = scm_acquire_device(id);
		if (err)
			return err;
		s->sgid_index = idx;
		id->route.addr.addr.ibaddr.sgid = gid;
	}
	memset(&id->route.addr.src_storage, 0, sizeof(id->route.addr.src_storage));
	memcpy(&id->route.addr.src_storage, addr, len);
	scm_addr_set_port(&id->route.addr.src_addr, port);
	id->route.addr.addr.ibaddr.pkey = htobe16(0xffff);
	s->port_owner = true;
	s->state = SCM_BOUND;
	return 0;
}

SCM_EXPORT int rdma_bind_addr(struct rdma_cm_id *id, struct sockaddr *addr)
{
	struct scm_id *s = to_sid(id);
	if (!scm_addr_len(addr))
		return scm_err(EINVAL);
	pthread_mutex_lock(&scm_lock);
	int err = s->state == SCM_IDLE ? scm_bind_locked(s, addr) : EINVAL;
	pthread_mutex_unlock(&scm_lock);
	return err ? scm_err(err) : 0;
}

int scm_complete(struct scm_id *s)
{
	if (!s->sync)
		return 0;
	if (s->id.event) {
		rdma_ack_cm_event(s->id.event);
		s->id.event = NULL;
	}
	if (rdma_get_cm_event(s->id.channel, &s->id.event))
		return -1;
	int st = s->id.event->status;
	if (!st)
		return 0;
	if (s->id.event->event == RDMA_CM_EVENT_REJECTED)
		return scm_err(ECONNREFUSED);
	return scm_err(st < 0 ? -st : st);
}

SCM_EXPORT int rdma_resolve_addr(struct rdma_cm_id *id, struct sockaddr *src_addr, struct sockaddr *dst_addr,
				 int timeout_ms)
{
	struct scm_id *s = to_sid(id);
	(void)timeout_ms; /* resolution is immediate */
	socklen_t dlen = scm_addr_len(dst_addr);
	if (!dlen || (src_addr && !scm_addr_len(src_addr)))
		return scm_err(EINVAL);
	struct sockaddr_storage dst;
	memset(&dst, 0, sizeof(dst));
	memcpy(&dst, dst_addr, dlen);
	pthread_mutex_lock(&scm_lock);
	int err = 0;
	if (s->state == SCM_IDLE) {
		struct sockaddr_storage any;
		memset(&any, 0, sizeof(any));
		any.ss_family = dst.ss_family;
		err = scm_bind_locked(s, src_addr ? src_addr : (struct sockaddr *)&any);
	} else if (s->state != SCM_BOUND) {
		err = EINVAL;
	}
	const struct sockaddr *src = &id->route.addr.src_addr;
	if (!err && src->sa_family != dst.ss_family)
		err = EINVAL;
	bool bound_any = !err && scm_addr_any(src);
	int idx = s->sgid_index;
	/* A wildcard destination is this host (the kernel's loopback
	 * resolution): the bound address, or the device's first of the
	 * family. */
	if (!err && scm_addr_any((struct sockaddr *)&dst)) {
		if (bound_any) {
			idx = -1;
			for (int i = 0; i < scm_dev.ngids && idx < 0; i++) {
				struct sockaddr_storage g;
				scm_gid_addr(&scm_dev.gids[i], 0, &g);
				if (g.ss_family == dst.ss_family)
					idx = i;
			}
		}
		if (idx >= 0) {
			uint16_t port = scm_addr_port((struct sockaddr *)&dst);
			scm_gid_addr(&scm_dev.gids[idx], port, &dst);
		}
	}
	pthread_mutex_unlock(&scm_lock);
	if (err)
		return scm_err(err);
	memset(&id->route.addr.dst_storage, 0, sizeof(id->route.addr.dst_storage));
	memcpy(&id->route.addr.dst_storage, &dst, dlen);

	int status = 0;
	if (idx < 0) {
		bool sync;
		status = scm_route_source((struct sockaddr *)&dst, &idx, &sync);
		if (status && sync)
			return scm_err(status);
	}
	if (!status) {
		pthread_mutex_lock(&scm_lock);
		status = scm_acquire_device(id);
		if (!status) {
			uint16_t port = scm_addr_port(src);
			s->sgid_index = idx;
			if (bound_any)
				scm_gid_addr(&scm_dev.gids[idx], port, &id->route.addr.src_storage);
			id->route.addr.addr.ibaddr.sgid = scm_dev.gids[idx];
			scm_addr_gid((struct sockaddr *)&dst, &id->route.addr.addr.ibaddr.dgid);
			s->state = SCM_ADDR_RESOLVED;
		}
		pthread_mutex_unlock(&scm_lock);
	}
	if (scm_queue_event(s, status ? RDMA_CM_EVENT_ADDR_ERROR : RDMA_CM_EVENT_ADDR_RESOLVED, -status))
		return -1;
	return scm_complete(s);
}

int scm_set_path(struct scm_id *s)
{
	struct rdma_route *r = &s->id.route;
	if (!r->path_rec) {
		r->path_rec = calloc(1, sizeof(*r->path_rec));
		if (!r->path_rec)
			return ENOMEM;
	}
	struct ibv_sa_path_rec *p = r->path_rec;
	memset(p, 0, sizeof(*p));
	p->sgid = r->addr.addr.ibaddr.sgid;
	p->dgid = r->addr.addr.ibaddr.dgid;
	p->pkey = htobe16(0xffff);
	p->reversible = 1;
	p->numb_path = 1;
	p->hop_limit = s->have_peer ? s->hop_limit : SCM_HOP_LIMIT;
	p->traffic_class = s->have_peer ? s->traffic_class : s->tos;
	p->flow_label = htobe32(s->have_peer ? s->flow_label : 0);
	p->mtu_selector = 2; /* exactly */
	p->mtu = s->have_peer && s->path_mtu ? s->path_mtu : scm_dev.active_mtu;
	p->rate_selector = 2;
	p->rate = 0; /* the port's current rate: a veth has no speed to tell */
	p->packet_life_time_selector = 2;
	p->packet_life_time = SCM_PACKET_LIFETIME;
	r->num_paths = 1;
	return 0;
}

SCM_EXPORT int rdma_resolve_route(struct rdma_cm_id *id, int timeout_ms)
{
	struct scm_id *s = to_sid(id);
	(void)timeout_ms;
	pthread_mutex_lock(&scm_lock);
	int err = s->state == SCM_ADDR_RESOLVED ? scm_set_path(s) : EINVAL;
	if (!err)
		s->state = SCM_ROUTE_RESOLVED;
	pthread_mutex_unlock(&scm_lock);
	if (err)
		return scm_err(err);
	if (scm_queue_event(s, RDMA_CM_EVENT_ROUTE_RESOLVED, 0))
		return -1;
	return scm_complete(s);
}

/* RDMA_OPTION_IB_PATH: the path a route resolution would have found,
 * given by the application (rdma_create_ep with ai_route). */
static int set_ib_path(struct scm_id *s, const struct ibv_path_data *pd, size_t n)
{
	if (!n)
		return EINVAL;
	pthread_mutex_lock(&scm_lock);
	int err = s->state == SCM_ADDR_RESOLVED ? scm_set_path(s) : EINVAL;
	if (!err) {
		struct ibv_sa_path_rec *p = s->id.route.path_rec;
		uint32_t fl = be32toh(pd->path.flowlabel_hoplimit);
		p->flow_label = htobe32(fl >> 8);
		p->hop_limit = (uint8_t)fl;
		p->traffic_class = pd->path.tclass;
		p->sl = be16toh(pd->path.qosclass_sl) & 0xf;
		if ((pd->path.mtu & 0x3f) >= IBV_MTU_256 && (pd->path.mtu & 0x3f) <= scm_dev.active_mtu)
			p->mtu = pd->path.mtu & 0x3f;
		s->state = SCM_ROUTE_RESOLVED;
	}
	pthread_mutex_unlock(&scm_lock);
	if (!err && scm_queue_event(s, RDMA_CM_EVENT_ROUTE_RESOLVED, 0))
		err = errno;
	return err;
}

SCM_EXPORT int rdma_set_option(struct rdma_cm_id *id, int level, int optname, void *optval, size_t optlen)
{
	struct scm_id *s = to_sid(id);
	if (!optval)
		return scm_err(EINVAL);
	int err = 0;
	pthread_mutex_lock(&scm_lock);
	if (level == RDMA_OPTION_ID && optname == RDMA_OPTION_ID_TOS) {
		if (optlen != sizeof(uint8_t))
			err = EINVAL;
		else
			s->tos = *(uint8_t *)optval, s->tos_set = true;
	} else if (level == RDMA_OPTION_ID && (optname == RDMA_OPTION_ID_REUSEADDR || optname == RDMA_OPTION_ID_AFONLY)) {
		if (optlen != sizeof(int) || s->state != SCM_IDLE)
			err = EINVAL;
		else if (optname == RDMA_OPTION_ID_REUSEADDR)
			s->reuseaddr = *(int *)optval != 0;
		else
			s->afonly = *(int *)optval != 0;
	} else if (level == RDMA_OPTION_ID && optname == RDMA_OPTION_ID_ACK_TIMEOUT) {
		if (optlen != sizeof(uint8_t))
			err = EINVAL;
		else
			s->ack_timeout_opt = *(uint8_t *)optval, s->timeout_set = true;
	} else if (level == RDMA_OPTION_IB && optname == RDMA_OPTION_IB_PATH) {
		pthread_mutex_unlock(&scm_lock);
		if (optlen % sizeof(struct ibv_path_data))
			return scm_err(EINVAL);
		/* ROUTE_RESOLVED follows, as from rdma_resolve_route. */
		err = set_ib_path(s, optval, optlen / sizeof(struct ibv_path_data));
		return err ? scm_err(err) : 0;
	} else {
		err = ENOSYS; /* as the kernel answers an option it does not know */
	}
	pthread_mutex_unlock(&scm_lock);
	return err ? scm_err(err) : 0;
}

SCM_EXPORT int rdma_migrate_id(struct rdma_cm_id *id, struct rdma_event_channel *channel)
{
	struct scm_id *s = to_sid(id);
	if (s->sync && !channel)
		return scm_err(EINVAL);
	bool sync = !channel;
	if (sync && !(channel = rdma_create_event_channel()))
		return -1;
	struct scm_channel *from = to_sch(id->channel), *to = to_sch(channel);
	if (s->handle) {
		if (!to->handle) {
			if (sync)
				rdma_destroy_event_channel(channel);
			return scm_err(EINVAL);
		}
		struct softrnic_ucm_migrate_req req = {.id = s->handle, .channel = to->handle};
		int err = scm_call(SOFTRNIC_OP_UCM_MIGRATE, &req, sizeof(req), NULL, 0, NULL, 0);
		if (err) {
			if (sync)
				rdma_destroy_event_channel(channel);
			return scm_err(err);
		}
	}
	/* The daemon sends the ID's events to the new channel from now on:
	 * those already on the old one follow them there, in order. */
	pthread_mutex_lock(&scm_lock);
	id->channel = channel;
	pthread_mutex_unlock(&scm_lock);
	scm_unqueue(s, from, to);
	if (s->handle)
		scm_drain_daemon(from, s->handle, to);
	if (s->sync) {
		/* Events handed out on the old channel are acknowledged before
		 * it goes. */
		wait_acks(s);
		rdma_destroy_event_channel(&from->ch);
	}
	s->sync = sync;
	return 0;
}

SCM_EXPORT __be16 rdma_get_src_port(struct rdma_cm_id *id)
{
	return htobe16(scm_addr_port(&id->route.addr.src_addr));
}

SCM_EXPORT __be16 rdma_get_dst_port(struct rdma_cm_id *id)
{
	return htobe16(scm_addr_port(&id->route.addr.dst_addr));
}

/* ECE (enhanced connection establishment): the local options are kept
 * as rdma-core keeps them; the CM carries no ECE, so the peer's are none,
 * as with a peer that does not offer any. */
SCM_EXPORT int rdma_set_local_ece(struct rdma_cm_id *id, struct ibv_ece *ece)
{
	if (!id || id->qp || !ece || !ece->vendor_id || ece->comp_mask)
		return scm_err(EINVAL);
	to_sid(id)->local_ece = *ece;
	return 0;
}

SCM_EXPORT int rdma_get_remote_ece(struct rdma_cm_id *id, struct ibv_ece *ece)
{
	if (!id || id->qp || !ece)
		return scm_err(EINVAL);
	*ece = to_sid(id)->remote_ece;
	ece->comp_mask = 0;
	return 0;
}

/* Multicast needs the daemon to join groups and a QP to receive them;
 * softrnic has neither yet. */
SCM_EXPORT int rdma_join_multicast_ex(struct rdma_cm_id *id, struct rdma_cm_join_mc_attr_ex *attr, void *context)
{
	(void)id, (void)context;
	if (attr->comp_mask >= RDMA_CM_JOIN_MC_ATTR_RESERVED)
		return scm_err(ENOTSUP);
	if (!(attr->comp_mask & RDMA_CM_JOIN_MC_ATTR_ADDRESS) || !(attr->comp_mask & RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS) ||
	    attr->join_flags >= RDMA_MC_JOIN_FLAG_RESERVED || !scm_addr_len(attr->addr))
		return scm_err(EINVAL);
	return scm_err(EOPNOTSUPP);
}

SCM_EXPORT int rdma_join_multicast(struct rdma_cm_id *id, struct sockaddr *addr, void *context)
{
	(void)id, (void)context;
	if (!scm_addr_len(addr))
		return scm_err(EINVAL);
	return scm_err(EOPNOTSUPP);
}

SCM_EXPORT int rdma_leave_multicast(struct rdma_cm_id *id, struct sockaddr *addr)
{
	(void)id;
	if (!scm_addr_len(addr))
		return scm_err(EINVAL);
	return scm_err(EADDRNOTAVAIL); /* no group was joined */
}

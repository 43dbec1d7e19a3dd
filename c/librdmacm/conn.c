/*
 * Connections: listen, connect, accept, reject, establish, disconnect
 * through the daemon's UCM operations, and the daemon's events turned
 * into the application's.
 *
 * As rdma-core's librdmacm does over the kernel, the library drives the
 * application's QP (id->qp) through INIT, RTR and RTS with the
 * attributes the CM negotiated (rdma_init_qp_attr): at rdma_accept on the
 * passive side, on CONNECT_RESPONSE on the active side, which then sends
 * the RTU and reports ESTABLISHED. Without id->qp (rping -q) the
 * application moves its QP itself and calls rdma_establish.
 *
 * A daemon without the UCM operations serves no connection: rdma_listen,
 * rdma_connect and the rest fail with ENOSYS, as the kernel answers a
 * command it does not implement.
 */
#define _GNU_SOURCE
#include <endian.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "scm.h"

/* The RNR NAK delay our QPs ask of their peers (IB enum 12: 0.64 ms), as
 * softrnic's own rdma_cm agent programs it; the kernel's CM leaves 0
 * (655 ms), too long for a ping-pong whose receives are re-posted in
 * microseconds. */
#define SCM_MIN_RNR_TIMER 12
/* The REQ fields of a connection without rdma_conn_param, as rdma-core's. */
#define SCM_DEFAULT_RETRY 7

uint32_t scm_event_target(const struct softrnic_ucm_event *u)
{
	return u->event == SOFTRNIC_UCM_EVENT_TYPE_CONNECT_REQUEST ? u->listener : u->id;
}

/* The protocol numbers events as librdmacm does. */
_Static_assert(SOFTRNIC_UCM_EVENT_TYPE_CONNECT_REQUEST == RDMA_CM_EVENT_CONNECT_REQUEST, "event numbering");
_Static_assert(SOFTRNIC_UCM_EVENT_TYPE_CONNECT_RESPONSE == RDMA_CM_EVENT_CONNECT_RESPONSE, "event numbering");
_Static_assert(SOFTRNIC_UCM_EVENT_TYPE_UNREACHABLE == RDMA_CM_EVENT_UNREACHABLE, "event numbering");
_Static_assert(SOFTRNIC_UCM_EVENT_TYPE_REJECTED == RDMA_CM_EVENT_REJECTED, "event numbering");
_Static_assert(SOFTRNIC_UCM_EVENT_TYPE_ESTABLISHED == RDMA_CM_EVENT_ESTABLISHED, "event numbering");
_Static_assert(SOFTRNIC_UCM_EVENT_TYPE_DISCONNECTED == RDMA_CM_EVENT_DISCONNECTED, "event numbering");
_Static_assert(SOFTRNIC_UCM_EVENT_TYPE_DEVICE_REMOVAL == RDMA_CM_EVENT_DEVICE_REMOVAL, "event numbering");
_Static_assert(SOFTRNIC_UCM_EVENT_TYPE_TIMEWAIT_EXIT == RDMA_CM_EVENT_TIMEWAIT_EXIT, "event numbering");

static bool is_ud(const struct rdma_cm_id *id)
{
	return id->qp_type == IBV_QPT_UD;
}

/* Whether the CM has a connection for s (REQ sent or received): from
 * then on its QP's access follows the negotiated depths. */
static bool cm_started(const struct scm_id *s)
{
	return s->state == SCM_CONNECT || s->state == SCM_CONNECTED || s->state == SCM_DISCONNECT;
}

SCM_EXPORT int rdma_init_qp_attr(struct rdma_cm_id *id, struct ibv_qp_attr *attr, int *mask)
{
	struct scm_id *s = to_sid(id);
	enum ibv_qp_state st = attr->qp_state;
	if (!s->device)
		return scm_err(EINVAL);
	memset(attr, 0, sizeof(*attr));
	attr->qp_state = st;
	switch (st) {
	case IBV_QPS_INIT:
		*mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
		attr->pkey_index = 0;
		attr->port_num = id->port_num;
		if (is_ud(id)) {
			attr->qkey = RDMA_UDP_QKEY;
			*mask |= IBV_QP_QKEY;
		} else {
			if (cm_started(s))
				attr->qp_access_flags = IBV_ACCESS_REMOTE_WRITE |
							(s->responder_resources ? IBV_ACCESS_REMOTE_READ |
											  IBV_ACCESS_REMOTE_ATOMIC
										: 0);
			*mask |= IBV_QP_ACCESS_FLAGS;
		}
		return 0;
	case IBV_QPS_RTR:
		*mask = IBV_QP_STATE;
		if (is_ud(id))
			return 0;
		if (!s->have_peer)
			return scm_err(EINVAL);
		*mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
		attr->ah_attr.is_global = 1;
		attr->ah_attr.port_num = id->port_num;
		attr->ah_attr.grh.dgid = id->route.addr.addr.ibaddr.dgid;
		attr->ah_attr.grh.sgid_index = (uint8_t)s->sgid_index;
		attr->ah_attr.grh.hop_limit = s->hop_limit;
		attr->ah_attr.grh.traffic_class = s->traffic_class;
		attr->ah_attr.grh.flow_label = s->flow_label;
		attr->path_mtu = s->path_mtu;
		attr->dest_qp_num = s->remote_qpn;
		attr->rq_psn = s->psn;
		if (id->qp_type == IBV_QPT_RC) {
			*mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
			attr->max_dest_rd_atomic = s->responder_resources;
			attr->min_rnr_timer = SCM_MIN_RNR_TIMER;
		}
		return 0;
	case IBV_QPS_RTS:
		*mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
		if (is_ud(id))
			return 0;
		if (!s->have_peer)
			return scm_err(EINVAL);
		attr->sq_psn = s->sq_psn;
		if (id->qp_type == IBV_QPT_RC) {
			*mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
			attr->timeout = s->timeout_set ? s->ack_timeout_opt : s->ack_timeout;
			attr->retry_cnt = s->retry_count;
			attr->rnr_retry = s->rnr_retry_count;
			attr->max_rd_atomic = s->initiator_depth;
		}
		return 0;
	default:
		return scm_err(EINVAL);
	}
}

/* id->qp to RTR (through INIT, which picks up the negotiated access) and
 * RTS; resp_res and init_depth override the CM's unless RDMA_MAX_*. 0 or
 * an errno. */
static int modify_connected(struct rdma_cm_id *id, uint8_t resp_res, uint8_t init_depth)
{
	if (!id->qp)
		return 0;
	static const enum ibv_qp_state steps[] = {IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS};
	for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
		struct ibv_qp_attr a = {.qp_state = steps[i]};
		int mask;
		if (rdma_init_qp_attr(id, &a, &mask))
			return errno;
		if (steps[i] == IBV_QPS_RTR && resp_res != RDMA_MAX_RESP_RES)
			a.max_dest_rd_atomic = resp_res;
		if (steps[i] == IBV_QPS_RTS && init_depth != RDMA_MAX_INIT_DEPTH)
			a.max_rd_atomic = init_depth;
		int err = ibv_modify_qp(id->qp, &a, mask);
		if (err)
			return err;
	}
	return 0;
}

int scm_qp_error(struct rdma_cm_id *id)
{
	if (!id->qp)
		return 0;
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
	int err = ibv_modify_qp(id->qp, &a, IBV_QP_STATE);
	return err ? scm_err(err) : 0;
}

/* The daemon channel an operation of s goes through: 0, or an errno. */
static int ucm_ready(struct scm_id *s, uint32_t *channel)
{
	if (scm_dev.gone)
		return ENODEV;
	if (scm_port_space(s->id.ps) < 0)
		return EOPNOTSUPP;
	*channel = to_sch(s->id.channel)->handle;
	return *channel ? 0 : ENOSYS;
}

int scm_call_id(struct scm_id *s, uint16_t op, const void *req, size_t req_len)
{
	struct softrnic_handle_msg resp;
	pthread_mutex_lock(&scm_lock);
	int err = scm_call(op, req, req_len, &resp, sizeof(resp), NULL, 0);
	if (!err)
		scm_id_set_handle_locked(s, resp.handle);
	pthread_mutex_unlock(&scm_lock);
	return err;
}

static int call_handle(uint16_t op, uint32_t handle)
{
	struct softrnic_handle_msg m = {.handle = handle};
	return scm_call(op, &m, sizeof(m), NULL, 0, NULL, 0);
}

/* rdma_conn_param's checks, as rdma-core's ucma_valid_param. */
static int valid_param(const struct scm_id *s, const struct rdma_conn_param *p)
{
	if (s->id.ps != RDMA_PS_TCP)
		return 0;
	if (!s->id.qp && !p)
		return EINVAL;
	if (p && p->responder_resources != RDMA_MAX_RESP_RES &&
	    p->responder_resources > scm_dev.max_responder_resources)
		return EINVAL;
	if (p && p->initiator_depth != RDMA_MAX_INIT_DEPTH && p->initiator_depth > scm_dev.max_initiator_depth)
		return EINVAL;
	return 0;
}

/* The wire's rdma_conn_param: the ID's depths, the application's other
 * fields and its private data after rdma_create_ep's (ai_connect). */
static int conn_param(struct scm_id *s, const struct rdma_conn_param *p, uint32_t qpn, uint8_t srq, size_t max,
		      struct softrnic_ucm_conn_param *w)
{
	memset(w, 0, sizeof(*w));
	w->qpn = qpn;
	w->srq = srq;
	w->starting_psn = s->psn;
	w->responder_resources = s->responder_resources;
	w->initiator_depth = s->initiator_depth;
	w->retry_count = SCM_DEFAULT_RETRY;
	w->rnr_retry_count = SCM_DEFAULT_RETRY;
	size_t n = s->connect_len + (p && p->private_data ? p->private_data_len : 0);
	if (n > max || n > sizeof(w->private_data))
		return EINVAL;
	if (s->connect_len)
		memcpy(w->private_data, s->connect_data, s->connect_len);
	if (p) {
		w->flow_control = p->flow_control;
		w->retry_count = p->retry_count > 7 ? 7 : p->retry_count;
		w->rnr_retry_count = p->rnr_retry_count > 7 ? 7 : p->rnr_retry_count;
		if (p->private_data && p->private_data_len)
			memcpy(w->private_data + s->connect_len, p->private_data, p->private_data_len);
	}
	w->private_data_len = (uint8_t)n;
	return 0;
}

SCM_EXPORT int rdma_listen(struct rdma_cm_id *id, int backlog)
{
	struct scm_id *s = to_sid(id);
	uint32_t ch;
	int err = ucm_ready(s, &ch);
	if (err)
		return scm_err(err);
	pthread_mutex_lock(&scm_lock);
	if (s->state == SCM_IDLE) {
		/* As the kernel: an unbound ID listens on any IPv4 address. */
		struct sockaddr_in any = {.sin_family = AF_INET};
		err = scm_bind_locked(s, (struct sockaddr *)&any);
	} else if (s->state == SCM_LISTEN) {
		pthread_mutex_unlock(&scm_lock);
		return 0; /* the kernel only updates the backlog */
	} else if (s->state != SCM_BOUND) {
		err = EINVAL;
	}
	struct softrnic_ucm_listen_req req = {.channel = ch, .space = (uint16_t)scm_port_space(id->ps)};
	if (!err) {
		req.port = scm_addr_port(&id->route.addr.src_addr);
		req.backlog = backlog <= 0 || backlog > 1024 ? 0 : (uint32_t)backlog;
		if (!scm_addr_any(&id->route.addr.src_addr))
			memcpy(req.addr, id->route.addr.addr.ibaddr.sgid.raw, sizeof(req.addr));
		req.ip_version = id->route.addr.src_addr.sa_family == AF_INET6 ? 6 : 4;
		req.af_only = req.ip_version == 6 && s->afonly;
		s->listening = true; /* the port is no longer shared */
	}
	pthread_mutex_unlock(&scm_lock);
	if (!err)
		err = scm_call_id(s, SOFTRNIC_OP_UCM_LISTEN, &req, sizeof(req));
	if (err) {
		s->listening = false;
		return scm_err(err);
	}
	s->state = SCM_LISTEN;
	return 0;
}

SCM_EXPORT int rdma_connect(struct rdma_cm_id *id, struct rdma_conn_param *param)
{
	struct scm_id *s = to_sid(id);
	uint32_t ch;
	int err = ucm_ready(s, &ch);
	if (!err && s->state != SCM_ROUTE_RESOLVED)
		err = EINVAL;
	if (!err)
		err = valid_param(s, param);
	if (err)
		return scm_err(err);
	s->initiator_depth = param && param->initiator_depth != RDMA_MAX_INIT_DEPTH ? param->initiator_depth
										      : scm_dev.max_initiator_depth;
	s->responder_resources = param && param->responder_resources != RDMA_MAX_RESP_RES
					 ? param->responder_resources
					 : scm_dev.max_responder_resources;
	uint32_t qpn = id->qp ? id->qp->qp_num : param ? param->qp_num : 0;
	uint8_t srq = id->qp ? id->qp->srq != NULL : param ? param->srq : 0;
	struct softrnic_ucm_connect_req req = {
		.channel = ch,
		.space = (uint16_t)scm_port_space(id->ps),
		.src_port = scm_addr_port(&id->route.addr.src_addr),
		.dst_port = scm_addr_port(&id->route.addr.dst_addr),
		.qp_type = is_ud(id) ? SOFTRNIC_IB_QP_TYPE_UD
			   : id->qp_type == IBV_QPT_UC ? SOFTRNIC_IB_QP_TYPE_UC
						       : SOFTRNIC_IB_QP_TYPE_RC,
		.path_mtu = id->route.path_rec ? id->route.path_rec->mtu : scm_dev.active_mtu,
		.hop_limit = id->route.path_rec ? id->route.path_rec->hop_limit : 64,
		.traffic_class = s->tos,
	};
	memcpy(req.local, id->route.addr.addr.ibaddr.sgid.raw, sizeof(req.local));
	memcpy(req.peer, id->route.addr.addr.ibaddr.dgid.raw, sizeof(req.peer));
	err = conn_param(s, param, qpn, srq,
			 is_ud(id) ? SOFTRNIC_UCM_RESOLVE_PRIVATE_DATA : SOFTRNIC_UCM_CONNECT_PRIVATE_DATA, &req.param);
	if (err)
		return scm_err(err);
	s->retry_count = req.param.retry_count; /* the active side's RTS */
	s->state = SCM_CONNECT; /* before any event of the new handle is converted */
	err = scm_call_id(s, SOFTRNIC_OP_UCM_CONNECT, &req, sizeof(req));
	if (err) {
		s->state = SCM_ROUTE_RESOLVED;
		return scm_err(err);
	}
	free(s->connect_data);
	s->connect_data = NULL;
	s->connect_len = 0;
	return scm_complete(s);
}

SCM_EXPORT int rdma_accept(struct rdma_cm_id *id, struct rdma_conn_param *param)
{
	struct scm_id *s = to_sid(id);
	uint32_t ch;
	int err = ucm_ready(s, &ch);
	if (!err && (!s->handle || s->state != SCM_CONNECT || !s->have_peer))
		err = EINVAL; /* not a connection request */
	if (!err && !id->qp && !param)
		err = EINVAL;
	if (!err)
		err = valid_param(s, param);
	if (err)
		return scm_err(err);
	if (!param || param->initiator_depth == RDMA_MAX_INIT_DEPTH) {
		if (s->initiator_depth > scm_dev.max_initiator_depth)
			s->initiator_depth = scm_dev.max_initiator_depth;
	} else {
		s->initiator_depth = param->initiator_depth;
	}
	if (!param || param->responder_resources == RDMA_MAX_RESP_RES) {
		if (s->responder_resources > scm_dev.max_responder_resources)
			s->responder_resources = scm_dev.max_responder_resources;
	} else {
		s->responder_resources = param->responder_resources;
	}
	if (!is_ud(id) && (err = modify_connected(id, s->responder_resources, s->initiator_depth)))
		return scm_err(err);
	struct softrnic_ucm_accept_req req = {.id = s->handle};
	uint32_t qpn = id->qp ? id->qp->qp_num : param->qp_num;
	uint8_t srq = id->qp ? id->qp->srq != NULL : param->srq;
	err = conn_param(s, param, qpn, srq,
			 is_ud(id) ? SOFTRNIC_UCM_ACCEPT_UD_PRIVATE_DATA : SOFTRNIC_UCM_ACCEPT_PRIVATE_DATA, &req.param);
	if (is_ud(id))
		req.q_key = RDMA_UDP_QKEY;
	if (!err)
		err = scm_call(SOFTRNIC_OP_UCM_ACCEPT, &req, sizeof(req), NULL, 0, NULL, 0);
	if (err) {
		scm_qp_error(id);
		return scm_err(err);
	}
	if (is_ud(id)) {
		s->state = SCM_CONNECTED;
		return 0;
	}
	return scm_complete(s);
}

static int reject(struct rdma_cm_id *id, const void *private_data, uint8_t len, uint16_t reason)
{
	struct scm_id *s = to_sid(id);
	uint32_t ch;
	int err = ucm_ready(s, &ch);
	if (!err && (!s->handle || !s->have_peer || s->state != SCM_CONNECT))
		err = EINVAL;
	size_t max = is_ud(id) ? SOFTRNIC_UCM_REJECT_UDP_PRIVATE_DATA : SOFTRNIC_UCM_REJECT_PRIVATE_DATA;
	if (!err && private_data && len > max)
		err = EINVAL;
	if (err)
		return scm_err(err);
	struct softrnic_ucm_reject_req req = {.id = s->handle, .reason = reason};
	if (private_data && len) {
		memcpy(req.private_data, private_data, len);
		req.private_data_len = len;
	}
	err = scm_call(SOFTRNIC_OP_UCM_REJECT, &req, sizeof(req), NULL, 0, NULL, 0);
	return err ? scm_err(err) : 0;
}

SCM_EXPORT int rdma_reject(struct rdma_cm_id *id, const void *private_data, uint8_t private_data_len)
{
	return reject(id, private_data, private_data_len, SOFTRNIC_UCM_REJECT_CONSUMER_DEFINED);
}

SCM_EXPORT int rdma_reject_ece(struct rdma_cm_id *id, const void *private_data, uint8_t private_data_len)
{
	return reject(id, private_data, private_data_len, SOFTRNIC_UCM_REJECT_VENDOR_OPTION_NOT_SUPPORTED);
}

/* The active side's answer to the REP: RTU. 0 or an errno. */
static int establish(struct scm_id *s)
{
	int err = modify_connected(&s->id, RDMA_MAX_RESP_RES, RDMA_MAX_INIT_DEPTH);
	if (!err)
		err = call_handle(SOFTRNIC_OP_UCM_ESTABLISH, s->handle);
	if (err) {
		scm_qp_error(&s->id);
		struct softrnic_ucm_reject_req req = {.id = s->handle, .reason = SOFTRNIC_UCM_REJECT_CONSUMER_DEFINED};
		scm_call(SOFTRNIC_OP_UCM_REJECT, &req, sizeof(req), NULL, 0, NULL, 0);
		return err;
	}
	s->state = SCM_CONNECTED;
	return 0;
}

SCM_EXPORT int rdma_establish(struct rdma_cm_id *id)
{
	struct scm_id *s = to_sid(id);
	if (id->qp)
		return scm_err(EINVAL); /* the library established it on CONNECT_RESPONSE */
	uint32_t ch;
	int err = ucm_ready(s, &ch);
	if (!err && (!s->handle || !s->have_peer || s->state != SCM_CONNECT))
		err = EINVAL;
	if (!err)
		err = establish(s);
	return err ? scm_err(err) : 0;
}

SCM_EXPORT int rdma_notify(struct rdma_cm_id *id, enum ibv_event_type event)
{
	struct scm_id *s = to_sid(id);
	uint32_t ch;
	int err = ucm_ready(s, &ch);
	if (!err && (event != IBV_EVENT_COMM_EST || !s->handle))
		err = EINVAL; /* path migration: there are no alternate paths */
	if (!err)
		err = call_handle(SOFTRNIC_OP_UCM_NOTIFY, s->handle);
	return err ? scm_err(err) : 0;
}

SCM_EXPORT int rdma_disconnect(struct rdma_cm_id *id)
{
	struct scm_id *s = to_sid(id);
	if (!id->verbs)
		return scm_err(EINVAL);
	if (scm_qp_error(id))
		return -1;
	if (!s->handle || s->listening)
		return scm_err(EINVAL);
	int err = call_handle(SOFTRNIC_OP_UCM_DISCONNECT, s->handle);
	if (err)
		return scm_err(err);
	if (s->state == SCM_CONNECTED || s->state == SCM_CONNECT)
		s->state = SCM_DISCONNECT;
	return scm_complete(s);
}

SCM_EXPORT int rdma_get_request(struct rdma_cm_id *listen, struct rdma_cm_id **id)
{
	struct scm_id *s = to_sid(listen);
	if (!s->sync)
		return scm_err(EINVAL);
	if (listen->event) {
		rdma_ack_cm_event(listen->event);
		listen->event = NULL;
	}
	struct rdma_cm_event *event;
	if (rdma_get_cm_event(listen->channel, &event))
		return -1;
	int err = 0;
	if (event->event == RDMA_CM_EVENT_REJECTED)
		err = ECONNREFUSED;
	else if (event->status)
		err = event->status < 0 ? -event->status : event->status;
	else if (event->event != RDMA_CM_EVENT_CONNECT_REQUEST)
		err = EINVAL;
	if (!err && s->qp_init_attr) {
		struct ibv_qp_init_attr attr = *s->qp_init_attr;
		if (rdma_create_qp(event->id, listen->pd, &attr))
			err = errno;
	}
	if (err) {
		listen->event = event;
		return scm_err(err);
	}
	*id = event->id;
	(*id)->event = event;
	return 0;
}

/* ---- events from the daemon ---- */

static void copy_conn(struct scm_event *e, const struct softrnic_ucm_event *u)
{
	struct rdma_conn_param *p = &e->event.param.conn;
	size_t n = u->param.private_data_len;
	if (n > sizeof(u->param.private_data))
		n = sizeof(u->param.private_data);
	memcpy(e->private_data, u->param.private_data, n);
	p->private_data = n ? e->private_data : NULL;
	p->private_data_len = (uint8_t)n;
	p->responder_resources = u->param.responder_resources;
	p->initiator_depth = u->param.initiator_depth;
	p->flow_control = u->param.flow_control;
	p->retry_count = u->param.retry_count;
	p->rnr_retry_count = u->param.rnr_retry_count;
	p->srq = u->param.srq;
	p->qp_num = u->param.qpn;
}

/* UD parameters; with_ah: the address to send to the peer with (the
 * SIDR_REP of an active ID). */
static void copy_ud(struct scm_event *e, const struct softrnic_ucm_event *u, bool with_ah)
{
	struct rdma_ud_param *p = &e->event.param.ud;
	size_t n = u->param.private_data_len;
	if (n > sizeof(u->param.private_data))
		n = sizeof(u->param.private_data);
	memcpy(e->private_data, u->param.private_data, n);
	p->private_data = n ? e->private_data : NULL;
	p->private_data_len = (uint8_t)n;
	if (!with_ah)
		return;
	union ibv_gid local;
	memcpy(local.raw, u->local, sizeof(local.raw));
	pthread_mutex_lock(&scm_lock);
	int idx = scm_gid_index(&local);
	pthread_mutex_unlock(&scm_lock);
	p->ah_attr.is_global = 1;
	p->ah_attr.port_num = 1;
	memcpy(p->ah_attr.grh.dgid.raw, u->peer, sizeof(u->peer));
	p->ah_attr.grh.sgid_index = idx < 0 ? 0 : (uint8_t)idx;
	p->ah_attr.grh.hop_limit = u->hop_limit;
	p->ah_attr.grh.traffic_class = u->traffic_class;
	p->ah_attr.grh.flow_label = u->flow_label;
	p->qp_num = u->param.qpn;
	p->qkey = u->q_key;
}

/* What the CM negotiated, for rdma_init_qp_attr. */
static void store_peer(struct scm_id *s, const struct softrnic_ucm_event *u, bool passive)
{
	s->have_peer = true;
	s->remote_qpn = u->param.qpn & 0xffffff;
	s->sq_psn = u->param.starting_psn & 0xffffff;
	s->path_mtu = u->path_mtu >= IBV_MTU_256 && u->path_mtu <= scm_dev.active_mtu ? u->path_mtu
										       : scm_dev.active_mtu;
	s->ack_timeout = u->ack_timeout;
	s->rnr_retry_count = u->param.rnr_retry_count;
	s->hop_limit = u->hop_limit;
	s->traffic_class = u->traffic_class;
	s->flow_label = u->flow_label & 0xfffff;
	s->responder_resources = u->param.responder_resources;
	s->initiator_depth = u->param.initiator_depth;
	if (passive)
		s->retry_count = u->param.retry_count;
}

/* A CONNECT_REQUEST: a new ID, on the listener's channel (or a private
 * one if the listener is synchronous). False if it cannot be made: the
 * daemon's request is then refused. */
static bool conn_request(struct scm_id *l, const struct softrnic_ucm_event *u, struct scm_event *e)
{
	struct scm_id *c = scm_id_alloc(l->id.channel, l->id.context, l->id.ps, l->id.qp_type);
	bool ok = c != NULL;
	if (ok) {
		scm_id_set_handle(c, u->id);
		union ibv_gid local, peer;
		memcpy(local.raw, u->local, sizeof(local.raw));
		memcpy(peer.raw, u->peer, sizeof(peer.raw));
		pthread_mutex_lock(&scm_lock);
		c->sgid_index = scm_gid_index(&local);
		ok = c->sgid_index >= 0 && scm_acquire_device(&c->id) == 0;
		if (ok) {
			struct rdma_addr *a = &c->id.route.addr;
			scm_gid_addr(&local, u->local_port, &a->src_storage);
			scm_gid_addr(&peer, u->peer_port, &a->dst_storage);
			a->addr.ibaddr.sgid = local;
			a->addr.ibaddr.dgid = peer;
			a->addr.ibaddr.pkey = htobe16(0xffff);
			store_peer(c, u, true);
			c->state = SCM_CONNECT;
			ok = scm_set_path(c) == 0;
		}
		pthread_mutex_unlock(&scm_lock);
	}
	if (ok && l->sync)
		ok = rdma_migrate_id(&c->id, NULL) == 0;
	if (!ok) {
		scm_debug("connection request %u dropped: %s", u->id, strerror(errno));
		if (c)
			rdma_destroy_id(&c->id); /* the daemon rejects it */
		else
			call_handle(SOFTRNIC_OP_UCM_DESTROY_ID, u->id);
		return false;
	}
	e->event.listen_id = &l->id;
	e->event.id = &c->id;
	if (is_ud(&l->id))
		copy_ud(e, u, false);
	else
		copy_conn(e, u);
	return true;
}

/* CONNECT_RESPONSE: with id->qp the library moves the QP to RTS, sends the
 * RTU and reports ESTABLISHED (CONNECT_ERROR if that fails); without, the
 * application does, then calls rdma_establish. */
static void conn_response(struct scm_id *s, const struct softrnic_ucm_event *u, struct scm_event *e)
{
	store_peer(s, u, false);
	copy_conn(e, u);
	if (!s->id.qp)
		return;
	int err = establish(s);
	e->event.event = err ? RDMA_CM_EVENT_CONNECT_ERROR : RDMA_CM_EVENT_ESTABLISHED;
	e->event.status = -err;
	s->connect_error = err != 0;
}

bool scm_convert(struct scm_channel *c, const struct softrnic_ucm_event *u, struct scm_event *e)
{
	(void)c;
	pthread_mutex_lock(&scm_lock);
	struct scm_id *s = scm_id_lookup(scm_event_target(u));
	if (s) {
		/* Handed out from here on: destroy now waits for its ack. */
		pthread_mutex_lock(&s->mut);
		s->events_delivered++;
		pthread_mutex_unlock(&s->mut);
	}
	pthread_mutex_unlock(&scm_lock);
	if (!s) {
		/* Its ID is gone; a request of a destroyed listener is refused. */
		if (u->event == SOFTRNIC_UCM_EVENT_TYPE_CONNECT_REQUEST)
			call_handle(SOFTRNIC_OP_UCM_DESTROY_ID, u->id);
		return false;
	}
	e->owner = s;
	e->event.id = &s->id;
	e->event.event = u->event;
	e->event.status = u->status;
	bool deliver = true;
	switch (u->event) {
	case RDMA_CM_EVENT_CONNECT_REQUEST:
		if (!s->listening)
			call_handle(SOFTRNIC_OP_UCM_DESTROY_ID, u->id); /* refused */
		deliver = s->listening && conn_request(s, u, e);
		break;
	case RDMA_CM_EVENT_CONNECT_RESPONSE:
		deliver = s->state == SCM_CONNECT && !s->have_peer;
		if (deliver)
			conn_response(s, u, e);
		break;
	case RDMA_CM_EVENT_ESTABLISHED:
		if (is_ud(&s->id)) {
			copy_ud(e, u, true);
			/* The UDP space has one Q_Key: a service answering with
			 * another cannot be sent to (the kernel's cma_set_qkey). */
			if (u->q_key != RDMA_UDP_QKEY) {
				e->event.event = RDMA_CM_EVENT_ADDR_ERROR;
				e->event.status = -EINVAL;
				break;
			}
		} else {
			copy_conn(e, u);
		}
		s->state = SCM_CONNECTED;
		break;
	case RDMA_CM_EVENT_REJECTED:
	case RDMA_CM_EVENT_DISCONNECTED:
		/* After CONNECT_ERROR the connection's end is not news. */
		deliver = !s->connect_error;
		if (!deliver)
			break;
		copy_conn(e, u);
		if (u->event == RDMA_CM_EVENT_REJECTED)
			scm_qp_error(&s->id);
		else
			s->state = SCM_DISCONNECT;
		break;
	case RDMA_CM_EVENT_DEVICE_REMOVAL:
		pthread_mutex_lock(&scm_lock);
		deliver = !s->removal_reported;
		s->removal_reported = true;
		pthread_mutex_unlock(&scm_lock);
		break;
	default:
		if (is_ud(&s->id))
			copy_ud(e, u, false);
		else
			copy_conn(e, u);
		break;
	}
	if (!deliver)
		scm_complete_event(s);
	return deliver;
}

/*
 * Device discovery, contexts and the device, port and GID queries.
 *
 * The device list is the daemon at the control socket ($SOFTRNIC_CONTROL
 * or the protocol's default): one RNIC per daemon, named softrnic_<ifname>.
 * Each ibv_open_device is a connection of its own, a session with its own
 * handle space in the daemon, which frees everything the context created
 * when the connection closes (ibv_close_device, exit, or a crash).
 */
#define _GNU_SOURCE
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "srn.h"

/* What stands at the verbs_device's ops pointer: not any provider's. */
static const char srn_device_ops_tag[] = "softrnic";

static pthread_mutex_t devices_lock = PTHREAD_MUTEX_INITIALIZER;

static void device_put(struct srn_device *d)
{
	pthread_mutex_lock(&devices_lock);
	bool last = --d->refcount == 0;
	pthread_mutex_unlock(&devices_lock);
	if (last)
		free(d);
}

/* Asks the daemon at path for its device attributes. */
static int daemon_info(const char *path, struct softrnic_device_info *info)
{
	struct srn_conn c;
	int err = srn_conn_open(&c, path);
	if (err)
		return err;
	struct softrnic_open_req req = {.version = SOFTRNIC_VERSION};
	int db = -1;
	err = srn_call(&c, SOFTRNIC_OP_OPEN, &req, sizeof(req), NULL, 0, info, sizeof(*info), &db, 1);
	if (!err)
		close(db);
	srn_conn_close(&c);
	return err;
}

SRN_EXPORT struct ibv_device **ibv_get_device_list(int *num_devices)
{
	static bool warned;
	struct ibv_device **list = calloc(2, sizeof(*list));
	if (!list) {
		errno = ENOMEM;
		return NULL;
	}
	if (num_devices)
		*num_devices = 0;
	const char *path = srn_control_path();
	struct softrnic_device_info info;
	int err = daemon_info(path, &info);
	if (err) {
		/* No daemon: no device, as a host without an RNIC has none. */
		if (!warned)
			srn_warn("no softrnic daemon at %s: %s (set %s to its control socket)", path, strerror(err),
				 SRN_CONTROL_ENV);
		warned = true;
		return list;
	}
	struct srn_device *d = calloc(1, sizeof(*d));
	if (!d) {
		free(list);
		errno = ENOMEM;
		return NULL;
	}
	d->ops = srn_device_ops_tag;
	d->refcount = 1; /* the list's; each open context holds another */
	d->info = info;
	snprintf(d->control, sizeof(d->control), "%s", path);
	char ifname[sizeof(info.name) + 1] = {0};
	memcpy(ifname, info.name, sizeof(info.name));
	d->dev.node_type = IBV_NODE_CA;
	d->dev.transport_type = IBV_TRANSPORT_IB; /* as RoCE devices report */
	snprintf(d->dev.name, sizeof(d->dev.name), SRN_DEVICE_PREFIX "%s", ifname);
	snprintf(d->dev.dev_name, sizeof(d->dev.dev_name), "%s", d->dev.name);
	snprintf(d->dev.dev_path, sizeof(d->dev.dev_path), "/sys/class/infiniband_verbs/%s", d->dev.dev_name);
	snprintf(d->dev.ibdev_path, sizeof(d->dev.ibdev_path), "/sys/class/infiniband/%s", d->dev.name);
	list[0] = &d->dev;
	if (num_devices)
		*num_devices = 1;
	return list;
}

SRN_EXPORT void ibv_free_device_list(struct ibv_device **list)
{
	if (!list)
		return;
	for (int i = 0; list[i]; i++)
		device_put(to_sdev(list[i]));
	free(list);
}

SRN_EXPORT const char *ibv_get_device_name(struct ibv_device *device)
{
	return device->name;
}

SRN_EXPORT __be64 ibv_get_device_guid(struct ibv_device *device)
{
	return htobe64(to_sdev(device)->info.device_attr.node_guid);
}

SRN_EXPORT int ibv_get_device_index(struct ibv_device *device)
{
	(void)device;
	return 0; /* the only device of its daemon */
}

SRN_EXPORT struct ibv_context *ibv_open_device(struct ibv_device *device)
{
	struct srn_device *d = to_sdev(device);
	struct srn_context *s = calloc(1, sizeof(*s));
	if (!s) {
		errno = ENOMEM;
		return NULL;
	}
	int evfd = -1;
	s->pump_db = -1;
	int err = srn_conn_open(&s->conn, d->control);
	if (err) {
		free(s);
		errno = err;
		return NULL;
	}
	struct softrnic_open_req req = {.version = SOFTRNIC_VERSION};
	err = srn_call(&s->conn, SOFTRNIC_OP_OPEN, &req, sizeof(req), NULL, 0, &s->info, sizeof(s->info), &s->pump_db,
		       1);
	/* async_fd: the context's event socket (async.c). */
	if (!err)
		err = srn_call(&s->conn, SOFTRNIC_OP_ASYNC_EVENTS, NULL, 0, NULL, 0, NULL, 0, &evfd, 1);
	if (err) {
		if (s->pump_db >= 0)
			close(s->pump_db);
		srn_conn_close(&s->conn);
		free(s);
		errno = err;
		return NULL;
	}
	pthread_mutex_lock(&devices_lock);
	d->refcount++;
	pthread_mutex_unlock(&devices_lock);

	pthread_mutex_init(&s->objs_lock, NULL);
	pthread_mutex_init(&s->event_lock, NULL);
	s->objs.next = s->objs.prev = &s->objs;
	struct ibv_context *ctx = &s->vctx.context;
	ctx->device = device;
	ctx->cmd_fd = s->conn.fd;
	ctx->async_fd = evfd;
	ctx->num_comp_vectors = 1;
	pthread_mutex_init(&ctx->mutex, NULL);
	ctx->abi_compat = __VERBS_ABI_IS_EXTENDED;
	ctx->ops.poll_cq = srn_poll_cq;
	ctx->ops.req_notify_cq = srn_req_notify_cq;
	ctx->ops.post_send = srn_post_send;
	ctx->ops.post_recv = srn_post_recv;
	ctx->ops.post_srq_recv = srn_post_srq_recv;
	/* Extended ops left NULL make the inline wrappers fail with
	 * EOPNOTSUPP, as rdma-core's do for a provider without them. */
	s->vctx.sz = sizeof(s->vctx);
	s->vctx.query_port = srn_query_port;
	s->vctx.query_device_ex = srn_query_device_ex;
	s->vctx.create_qp_ex = srn_create_qp_ex;
	s->vctx.create_cq_ex = srn_create_cq_ex;
	s->vctx.create_srq_ex = srn_create_srq_ex;
	return ctx;
}

SRN_EXPORT int ibv_close_device(struct ibv_context *ctx)
{
	struct srn_context *s = to_sctx(ctx);
	struct srn_device *d = to_sdev(ctx->device);
	/* The daemon releases every object of the session with it. */
	srn_conn_close(&s->conn);
	close(s->pump_db);
	close(ctx->async_fd);
	pthread_mutex_destroy(&ctx->mutex);
	pthread_mutex_destroy(&s->objs_lock);
	pthread_mutex_destroy(&s->event_lock);
	free(s);
	device_put(d);
	return 0;
}

enum ibv_mtu srn_mtu_enum(uint32_t bytes)
{
	if (bytes >= 4096)
		return IBV_MTU_4096;
	if (bytes >= 2048)
		return IBV_MTU_2048;
	if (bytes >= 1024)
		return IBV_MTU_1024;
	if (bytes >= 512)
		return IBV_MTU_512;
	return IBV_MTU_256;
}

uint32_t srn_mtu_bytes(enum ibv_mtu mtu)
{
	return mtu >= IBV_MTU_256 && mtu <= IBV_MTU_4096 ? 128u << mtu : 0;
}

bool srn_gid(const struct softrnic_device_info *info, int index, union ibv_gid *gid)
{
	if (index < 0 || (uint32_t)index >= info->num_gids || (size_t)index >= sizeof(info->gids) / sizeof(info->gids[0]))
		return false;
	memcpy(gid->raw, info->gids[index], sizeof(gid->raw));
	return true;
}

SRN_EXPORT int ibv_query_device(struct ibv_context *ctx, struct ibv_device_attr *a)
{
	const struct softrnic_device_info *in = &to_sctx(ctx)->info;
	memset(a, 0, sizeof(*a));
	snprintf(a->fw_ver, sizeof(a->fw_ver), "softrnic proto %d", SOFTRNIC_VERSION);
	a->node_guid = htobe64(in->device_attr.node_guid);
	a->sys_image_guid = a->node_guid;
	a->max_mr_size = in->device_attr.max_mr_size;
	a->page_size_cap = 0xfffff000; /* any power of two from 4 KiB */
	a->max_qp = in->device_attr.max_qp;
	a->max_qp_wr = in->device_attr.max_qpwr;
	a->device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_SYS_IMAGE_GUID;
	a->max_sge = in->device_attr.max_sge;
	a->max_sge_rd = in->device_attr.max_sge;
	a->max_cq = in->device_attr.max_cq;
	a->max_cqe = in->device_attr.max_cqe;
	a->max_mr = in->device_attr.max_mr;
	a->max_pd = in->device_attr.max_pd;
	/* Every QP has its own responder resources. */
	a->max_qp_rd_atom = (int)in->device_attr.max_qp_rd_atom;
	a->max_qp_init_rd_atom = (int)in->device_attr.max_qp_rd_atom;
	a->max_res_rd_atom = (int)in->device_attr.max_qp_rd_atom * (int)in->device_attr.max_qp;
	a->atomic_cap = IBV_ATOMIC_HCA; /* atomics are serialised in the device */
	a->max_ah = INT32_MAX; /* address handles are the library's own */
	a->max_srq = (int)in->device_attr.max_srq;
	a->max_srq_wr = (int)in->device_attr.max_srqwr;
	a->max_srq_sge = (int)in->device_attr.max_sge;
	a->max_pkeys = 1;
	a->local_ca_ack_delay = 15;
	a->phys_port_cnt = 1;
	return 0;
}

int srn_query_device_ex(struct ibv_context *ctx, const struct ibv_query_device_ex_input *input,
			struct ibv_device_attr_ex *attr, size_t len)
{
	if (input && input->comp_mask)
		return EINVAL;
	if (len < sizeof(attr->orig_attr))
		return EINVAL;
	struct ibv_device_attr_ex a;
	memset(&a, 0, sizeof(a));
	ibv_query_device(ctx, &a.orig_attr);
	memcpy(attr, &a, len < sizeof(a) ? len : sizeof(a));
	return 0;
}

int srn_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr, size_t len)
{
	struct srn_context *s = to_sctx(ctx);
	if (port != 1)
		return EINVAL;
	/* The port's state follows the link: asked of the daemon each time. */
	struct softrnic_device_info now;
	int err = srn_call(&s->conn, SOFTRNIC_OP_QUERY_DEVICE, NULL, 0, NULL, 0, &now, sizeof(now), NULL, 0);
	if (err)
		return err;
	const struct softrnic_device_info *in = &now;
	struct ibv_port_attr a;
	memset(&a, 0, sizeof(a));
	a.state = in->device_attr.port_active ? IBV_PORT_ACTIVE : IBV_PORT_DOWN;
	a.max_mtu = IBV_MTU_4096;
	a.active_mtu = srn_mtu_enum(in->device_attr.active_mtu);
	a.gid_tbl_len = in->num_gids;
	a.port_cap_flags = IBV_PORT_CM_SUP | IBV_PORT_IP_BASED_GIDS;
	a.max_msg_sz = in->device_attr.max_mr_size > UINT32_MAX ? UINT32_MAX : (uint32_t)in->device_attr.max_mr_size;
	a.pkey_tbl_len = 1;
	a.max_vl_num = 1;
	/* Unknown link speed: what rxe reports when ethtool has none. */
	a.active_width = 1;  /* 1X */
	a.active_speed = 1;  /* SDR */
	a.phys_state = in->device_attr.port_active ? 5 /* LinkUp */ : 3 /* Disabled */;
	a.link_layer = IBV_LINK_LAYER_ETHERNET;
	memcpy(attr, &a, len < sizeof(a) ? len : sizeof(a));
	return 0;
}

/* The exported entry point, for binaries built before the inline
 * ___ibv_query_port: their struct is the current one without the fields
 * added since (port_cap_flags2). */
SRN_EXPORT int ibv_query_port(struct ibv_context *ctx, uint8_t port, struct _compat_ibv_port_attr *attr)
{
	return srn_query_port(ctx, port, (struct ibv_port_attr *)attr, offsetof(struct ibv_port_attr, port_cap_flags2));
}

SRN_EXPORT int ibv_query_gid(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid)
{
	const struct softrnic_device_info *in = &to_sctx(ctx)->info;
	if (port != 1 || index < 0 || (size_t)index >= sizeof(in->gids) / sizeof(in->gids[0])) {
		errno = EINVAL;
		return -1;
	}
	/* Entries past the populated ones read as zero GIDs, as sysfs shows
	 * them. */
	if (!srn_gid(in, index, gid))
		memset(gid, 0, sizeof(*gid));
	return 0;
}

SRN_EXPORT int ibv_query_pkey(struct ibv_context *ctx, uint8_t port, int index, __be16 *pkey)
{
	(void)ctx;
	if (port != 1 || index != 0) {
		errno = EINVAL;
		return -1;
	}
	*pkey = htobe16(0xffff); /* RoCE: the default P_Key only */
	return 0;
}

SRN_EXPORT int ibv_get_pkey_index(struct ibv_context *ctx, uint8_t port, __be16 pkey)
{
	(void)ctx;
	if (port != 1 || (be16toh(pkey) & 0x7fff) != 0x7fff) {
		errno = ENOENT;
		return -1;
	}
	return 0;
}

/* rdma-core's private enum ibv_gid_type_sysfs (driver.h). */
enum { SRN_GID_TYPE_SYSFS_IB_ROCE_V1 = 0, SRN_GID_TYPE_SYSFS_ROCE_V2 = 1 };

SRN_EXPORT int ibv_query_gid_type(struct ibv_context *ctx, uint8_t port, unsigned int index, int *type)
{
	union ibv_gid g;
	if (port != 1 || !srn_gid(&to_sctx(ctx)->info, (int)index, &g)) {
		errno = EINVAL;
		return -1;
	}
	*type = SRN_GID_TYPE_SYSFS_ROCE_V2;
	return 0;
}

static int gid_entry(struct srn_context *s, uint32_t port, uint32_t index, struct ibv_gid_entry *e)
{
	union ibv_gid g;
	if (port != 1)
		return EINVAL;
	if (!srn_gid(&s->info, (int)index, &g))
		return index < sizeof(s->info.gids) / sizeof(s->info.gids[0]) ? ENODATA : EINVAL;
	memset(e, 0, sizeof(*e));
	e->gid = g;
	e->gid_index = index;
	e->port_num = port;
	e->gid_type = IBV_GID_TYPE_ROCE_V2;
	e->ndev_ifindex = 0; /* the daemon's interface may be in another namespace */
	return 0;
}

SRN_EXPORT int _ibv_query_gid_ex(struct ibv_context *ctx, uint32_t port, uint32_t index, struct ibv_gid_entry *entry,
				 uint32_t flags, size_t entry_size)
{
	if (flags || entry_size < sizeof(*entry))
		return EINVAL;
	return gid_entry(to_sctx(ctx), port, index, entry);
}

SRN_EXPORT ssize_t _ibv_query_gid_table(struct ibv_context *ctx, struct ibv_gid_entry *entries, size_t max_entries,
					uint32_t flags, size_t entry_size)
{
	struct srn_context *s = to_sctx(ctx);
	if (flags || entry_size < sizeof(*entries))
		return -EINVAL;
	size_t n = 0;
	for (uint32_t i = 0; i < s->info.num_gids && i < sizeof(s->info.gids) / sizeof(s->info.gids[0]); i++) {
		if (n == max_entries)
			return -EINVAL;
		gid_entry(s, 1, i, (struct ibv_gid_entry *)((char *)entries + n * entry_size));
		n++;
	}
	return (ssize_t)n;
}

/*
 * The device: the one context of softrnic's libibverbs that every ID is
 * bound to, opened on first use and kept (as rdma-core keeps its devices
 * open), with rdma_cm's PD for IDs whose application brings none, and the
 * GID table that addresses map to.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "scm.h"

pthread_mutex_t scm_lock = PTHREAD_MUTEX_INITIALIZER;
struct scm_device scm_dev;

void scm_debug(const char *fmt, ...)
{
	if (!getenv(SCM_DEBUG_ENV))
		return;
	va_list ap;
	va_start(ap, fmt);
	fputs("softrnic rdma_cm: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}

static int open_device(void)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list)
		return errno;
	if (n < 1) {
		ibv_free_device_list(list);
		return ENODEV;
	}
	errno = 0;
	struct ibv_context *ctx = ibv_open_device(list[0]);
	int err = errno;
	ibv_free_device_list(list); /* the context keeps its device */
	if (!ctx)
		return err ? err : ENODEV;
	struct ibv_device_attr da;
	struct ibv_port_attr pa;
	if (ibv_query_device(ctx, &da) || ibv_query_port(ctx, 1, &pa)) {
		ibv_close_device(ctx);
		return ENODEV;
	}
	struct scm_device d = {.ctx = ctx, .active_mtu = pa.active_mtu, .max_qp_wr = da.max_qp_wr};
	d.max_initiator_depth = da.max_qp_init_rd_atom > 255 ? 255 : (uint8_t)da.max_qp_init_rd_atom;
	d.max_responder_resources = da.max_qp_rd_atom > 255 ? 255 : (uint8_t)da.max_qp_rd_atom;
	static const union ibv_gid zero;
	for (int i = 0; i < pa.gid_tbl_len && d.ngids < SCM_MAX_GIDS; i++) {
		union ibv_gid g;
		if (ibv_query_gid(ctx, 1, i, &g) == 0 && memcmp(&g, &zero, sizeof(g)))
			d.gids[d.ngids++] = g;
	}
	scm_dev = d;
	return 0;
}

int scm_init(void)
{
	pthread_mutex_lock(&scm_lock);
	int err = scm_dev.ctx ? 0 : open_device();
	pthread_mutex_unlock(&scm_lock);
	return err ? scm_err(err) : 0;
}

int scm_call(uint16_t op, const void *req, size_t req_len, void *resp, size_t resp_len, int *fds, int nfds)
{
	int err = softrnic_call(scm_dev.ctx, op, req, req_len, resp, resp_len, fds, nfds);
	if (err)
		scm_debug("daemon operation %u: %s", op, strerror(err));
	return err;
}

int scm_gid_index(const union ibv_gid *gid)
{
	for (int i = 0; i < scm_dev.ngids; i++)
		if (!memcmp(&scm_dev.gids[i], gid, sizeof(*gid)))
			return i;
	return -1;
}

int scm_acquire_device(struct rdma_cm_id *id)
{
	struct scm_id *s = to_sid(id);
	if (s->device)
		return 0;
	if (scm_dev.gone)
		return ENODEV;
	if (!scm_dev.pd) {
		scm_dev.pd = ibv_alloc_pd(scm_dev.ctx);
		if (!scm_dev.pd)
			return errno ? errno : ENOMEM;
	}
	scm_dev.pd_refs++;
	id->verbs = scm_dev.ctx;
	id->port_num = 1;
	id->pd = scm_dev.pd;
	s->device = true;
	return 0;
}

void scm_release_device(struct rdma_cm_id *id)
{
	struct scm_id *s = to_sid(id);
	if (!s->device)
		return;
	s->device = false;
	/* A PD the application still uses stays, for the next ID. */
	if (--scm_dev.pd_refs == 0 && ibv_dealloc_pd(scm_dev.pd) == 0)
		scm_dev.pd = NULL;
}

SCM_EXPORT struct ibv_context **rdma_get_devices(int *num_devices)
{
	struct ibv_context **list = NULL;
	int n = 0;
	if (scm_init() == 0) {
		list = calloc(2, sizeof(*list));
		pthread_mutex_lock(&scm_lock);
		if (list && !scm_dev.gone)
			list[n++] = scm_dev.ctx;
		pthread_mutex_unlock(&scm_lock);
		if (!list)
			errno = ENOMEM;
	}
	if (num_devices)
		*num_devices = n;
	return list;
}

SCM_EXPORT void rdma_free_devices(struct ibv_context **list)
{
	free(list); /* the contexts stay open, as rdma-core's do */
}

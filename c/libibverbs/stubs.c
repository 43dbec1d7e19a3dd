/*
 * Entry points the library exports for the dynamic linker's sake and
 * cannot serve: a call gets what rdma-core gives for an operation the
 * device does not support (EOPNOTSUPP as the return value or in errno,
 * NULL for objects), never a crash and never a silent success.
 *
 *  - The rest of the public API the daemon protocol has no form for.
 *  - The IBVERBS_1.0 compatibility versions of the 1.1 calls, which take
 *    the structs of libibverbs 1.0 (no binary of this century binds them).
 *  - IBVERBS_PRIVATE_34: the provider interface. The stock libmlx5 and
 *    libefa import it and register themselves from constructors when they
 *    load beside this library (perftest, pyverbs, UCX); the registrations
 *    are accepted and ignored, and their devices never appear.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>

#include "srn.h"

#define COMPAT(name) SRN_EXPORT __attribute__((used, symver(#name "@IBVERBS_1.0")))

static int unsupported(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

static void *unsupported_ptr(void)
{
	errno = EOPNOTSUPP;
	return NULL;
}

/* ---- public calls without a protocol form ---- */

SRN_EXPORT int ibv_attach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
{
	(void)qp, (void)gid, (void)lid;
	return unsupported();
}

SRN_EXPORT int ibv_detach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
{
	(void)qp, (void)gid, (void)lid;
	return unsupported();
}

/* Sharing objects between processes goes through the kernel's uverbs. */
SRN_EXPORT struct ibv_context *ibv_import_device(int cmd_fd)
{
	(void)cmd_fd;
	return unsupported_ptr();
}

SRN_EXPORT struct ibv_pd *ibv_import_pd(struct ibv_context *ctx, uint32_t handle)
{
	(void)ctx, (void)handle;
	return unsupported_ptr();
}

SRN_EXPORT void ibv_unimport_pd(struct ibv_pd *pd)
{
	(void)pd;
}

SRN_EXPORT struct ibv_mr *ibv_import_mr(struct ibv_pd *pd, uint32_t handle)
{
	(void)pd, (void)handle;
	return unsupported_ptr();
}

SRN_EXPORT void ibv_unimport_mr(struct ibv_mr *mr)
{
	(void)mr;
}

SRN_EXPORT struct ibv_dm *ibv_import_dm(struct ibv_context *ctx, uint32_t handle)
{
	(void)ctx, (void)handle;
	return unsupported_ptr();
}

SRN_EXPORT void ibv_unimport_dm(struct ibv_dm *dm)
{
	(void)dm;
}

SRN_EXPORT int ibv_query_ece(struct ibv_qp *qp, struct ibv_ece *ece)
{
	(void)qp, (void)ece;
	return unsupported();
}

SRN_EXPORT int ibv_set_ece(struct ibv_qp *qp, struct ibv_ece *ece)
{
	(void)qp, (void)ece;
	return unsupported();
}

/* Providers of libibverbs 1.0 registered through this; accepted, unused. */
SRN_EXPORT __attribute__((used, symver("ibv_register_driver@IBVERBS_1.1"))) void srn_register_driver_1_1(const char *name,
												  void *init)
{
	(void)name, (void)init;
}

/* ---- IBVERBS_1.0 compatibility versions ---- */

COMPAT(ibv_alloc_pd) void *srn_alloc_pd_1_0(void)
{
	return unsupported_ptr();
}

COMPAT(ibv_create_ah) void *srn_create_ah_1_0(void)
{
	return unsupported_ptr();
}

COMPAT(ibv_create_cq) void *srn_create_cq_1_0(void)
{
	return unsupported_ptr();
}

COMPAT(ibv_create_qp) void *srn_create_qp_1_0(void)
{
	return unsupported_ptr();
}

COMPAT(ibv_create_srq) void *srn_create_srq_1_0(void)
{
	return unsupported_ptr();
}

COMPAT(ibv_get_device_list) void *srn_get_device_list_1_0(void)
{
	return unsupported_ptr();
}

COMPAT(ibv_get_device_name) void *srn_get_device_name_1_0(void)
{
	return unsupported_ptr();
}

COMPAT(ibv_open_device) void *srn_open_device_1_0(void)
{
	return unsupported_ptr();
}

COMPAT(ibv_reg_mr) void *srn_reg_mr_1_0(void)
{
	return unsupported_ptr();
}

COMPAT(ibv_attach_mcast) int srn_attach_mcast_1_0(void)
{
	return unsupported();
}

COMPAT(ibv_close_device) int srn_close_device_1_0(void)
{
	return unsupported();
}

COMPAT(ibv_dealloc_pd) int srn_dealloc_pd_1_0(void)
{
	return unsupported();
}

COMPAT(ibv_dereg_mr) int srn_dereg_mr_1_0(void)
{
	return unsupported();
}

COMPAT(ibv_destroy_ah) int srn_destroy_ah_1_0(void)
{
	return unsupported();
}

COMPAT(ibv_destroy_cq) int srn_destroy_cq_1_0(void)
{
	return unsupported();
}

COMPAT(ibv_destroy_qp) int srn_destroy_qp_1_0(void)
{
	return unsupported();
}

COMPAT(ibv_destroy_srq) int srn_destroy_srq_1_0(void)
{
	return unsupported();
}

COMPAT(ibv_detach_mcast) int srn_detach_mcast_1_0(void)
{
	return unsupported();
}

COMPAT(ibv_get_async_event) int srn_get_async_event_1_0(void)
{
	return unsupported();
}

COMPAT(ibv_get_cq_event) int srn_get_cq_event_1_0(void)
{
	return unsupported();
}

COMPAT(ibv_modify_qp) int srn_modify_qp_1_0(void)
{
	return unsupported();
}

COMPAT(ibv_modify_srq) int srn_modify_srq_1_0(void)
{
	return unsupported();
}

COMPAT(ibv_query_device) int srn_query_device_1_0(void)
{
	return unsupported();
}

COMPAT(ibv_query_gid) int srn_query_gid_1_0(void)
{
	return unsupported();
}

COMPAT(ibv_query_pkey) int srn_query_pkey_1_0(void)
{
	return unsupported();
}

COMPAT(ibv_query_port) int srn_query_port_1_0(void)
{
	return unsupported();
}

COMPAT(ibv_query_qp) int srn_query_qp_1_0(void)
{
	return unsupported();
}

COMPAT(ibv_query_srq) int srn_query_srq_1_0(void)
{
	return unsupported();
}

COMPAT(ibv_resize_cq) int srn_resize_cq_1_0(void)
{
	return unsupported();
}

COMPAT(ibv_ack_async_event) void srn_ack_async_event_1_0(void)
{
}

COMPAT(ibv_ack_cq_events) void srn_ack_cq_events_1_0(void)
{
}

COMPAT(ibv_free_device_list) void srn_free_device_list_1_0(void)
{
}

COMPAT(ibv_get_device_guid) uint64_t srn_get_device_guid_1_0(void)
{
	errno = EOPNOTSUPP;
	return 0;
}

/* ---- IBVERBS_PRIVATE_34 ---- */

SRN_EXPORT bool verbs_allow_disassociate_destroy;

SRN_EXPORT void verbs_register_driver_34(const void *ops)
{
	(void)ops;
}

SRN_EXPORT void __verbs_log(void *ctx, const char *fmt, ...)
{
	(void)ctx, (void)fmt;
}

SRN_EXPORT void *_verbs_init_and_alloc_context(void *device, int cmd_fd, size_t alloc_size, void *context_offset,
					       uint32_t driver_id)
{
	(void)device, (void)cmd_fd, (void)alloc_size, (void)context_offset, (void)driver_id;
	return unsupported_ptr();
}

SRN_EXPORT void *verbs_open_device(struct ibv_device *device, void *private_data)
{
	(void)device, (void)private_data;
	return unsupported_ptr();
}

SRN_EXPORT void verbs_uninit_context(void *ctx)
{
	(void)ctx;
}

SRN_EXPORT void verbs_set_ops(void *ctx, const void *ops)
{
	(void)ctx, (void)ops;
}

SRN_EXPORT int verbs_init_cq(struct ibv_cq *cq, struct ibv_context *ctx, struct ibv_comp_channel *ch, void *cq_context)
{
	(void)cq, (void)ctx, (void)ch, (void)cq_context;
	return unsupported();
}

SRN_EXPORT int execute_ioctl(struct ibv_context *ctx, void *cmd)
{
	(void)ctx, (void)cmd;
	return unsupported();
}

SRN_EXPORT unsigned int __ioctl_final_num_attrs(unsigned int num_attrs, void *link)
{
	(void)link;
	return num_attrs;
}

SRN_EXPORT int ibv_read_ibdev_sysfs_file(char *buf, size_t size, void *sysfs_dev, const char *fnfmt, ...)
{
	(void)buf, (void)size, (void)sysfs_dev, (void)fnfmt;
	errno = ENOENT; /* no sysfs tree: the device is not the kernel's */
	return -1;
}

/* The command layer of the kernel's uverbs: every one fails. */

SRN_EXPORT int ibv_cmd_advise_mr(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_alloc_dm(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_alloc_mw(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_alloc_pd(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_attach_mcast(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_close_xrcd(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_create_ah(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_create_counters(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_create_cq(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_create_cq_ex(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_create_flow(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_create_flow_action_esp(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_create_qp(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_create_qp_ex(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_create_qp_ex2(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_create_rwq_ind_table(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_create_srq(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_create_srq_ex(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_create_wq(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_dealloc_mw(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_dealloc_pd(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_dereg_mr(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_destroy_ah(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_destroy_counters(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_destroy_cq(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_destroy_flow(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_destroy_flow_action(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_destroy_qp(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_destroy_rwq_ind_table(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_destroy_srq(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_destroy_wq(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_detach_mcast(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_free_dm(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_get_context(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_modify_cq(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_modify_flow_action_esp(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_modify_qp(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_modify_qp_ex(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_modify_srq(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_modify_wq(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_open_qp(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_open_xrcd(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_poll_cq(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_post_recv(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_post_send(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_post_srq_recv(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_query_context(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_query_device_any(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_query_mr(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_query_port(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_query_qp(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_query_srq(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_read_counters(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_reg_dm_mr(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_reg_dmabuf_mr(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_reg_mr(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_req_notify_cq(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_rereg_mr(void)
{
	return unsupported();
}

SRN_EXPORT int ibv_cmd_resize_cq(void)
{
	return unsupported();
}

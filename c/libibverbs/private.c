/*
 * The interface softrnic's librdmacm.so.1 uses (softrnic_private.h,
 * version node SOFTRNIC_PRIVATE_1): the daemon connection of a context,
 * for the CM operations that must run in the session owning the QPs.
 */
#include "softrnic_private.h"
#include "srn.h"

SRN_EXPORT int softrnic_call(struct ibv_context *ctx, uint16_t op, const void *req, size_t req_len, void *resp,
			     size_t resp_len, int *fds_out, int nfds_out)
{
	return srn_call(&to_sctx(ctx)->conn, op, req, req_len, NULL, 0, resp, resp_len, fds_out, nfds_out);
}

SRN_EXPORT int softrnic_control_fd(struct ibv_context *ctx)
{
	return to_sctx(ctx)->conn.fd;
}

/*
 * The private interface between softrnic's two drop-in libraries:
 * libibverbs.so.1 exports it under the version node SOFTRNIC_PRIVATE_1,
 * librdmacm.so.1 imports it. librdmacm shares the verbs library's device,
 * contexts and PDs (id->verbs is a context of libibverbs) and speaks the
 * daemon protocol on that context's control connection, so that the QPs
 * its CM operations name are the session's own. Both libraries are built
 * together; a librdmacm.so.1 loaded beside another libibverbs.so.1 fails
 * to load (the version node is missing) instead of misbehaving.
 */
#ifndef SOFTRNIC_PRIVATE_H
#define SOFTRNIC_PRIVATE_H

#include <infiniband/verbs.h>
#include <stddef.h>
#include <stdint.h>

/*
 * softrnic_call sends op with the request body on ctx's control
 * connection, waits for the reply (which the daemon sends at once: no
 * operation waits for a peer) and copies its body, exactly resp_len bytes,
 * into resp and exactly nfds_out received fds into fds_out. Returns 0 or a
 * positive errno (the daemon's, or the connection's: ECONNRESET once the
 * daemon is gone).
 */
int softrnic_call(struct ibv_context *ctx, uint16_t op, const void *req, size_t req_len, void *resp,
		  size_t resp_len, int *fds_out, int nfds_out);

/* The fd of ctx's control connection, to watch for the daemon hanging up
 * (EPOLLRDHUP); never to read or write. */
int softrnic_control_fd(struct ibv_context *ctx);

#endif

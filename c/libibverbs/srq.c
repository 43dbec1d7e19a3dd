/*
 * Shared receive queues: the daemon protocol has no SRQ yet, so they fail
 * as rdma-core's do on a provider without them (ibv_create_srq: NULL with
 * errno EOPNOTSUPP), and no QP can name one.
 */
#define _GNU_SOURCE
#include <errno.h>

#include "srn.h"

SRN_EXPORT struct ibv_srq *ibv_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *attr)
{
	(void)pd, (void)attr;
	errno = EOPNOTSUPP;
	return NULL;
}

SRN_EXPORT int ibv_modify_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr, int mask)
{
	(void)srq, (void)attr, (void)mask;
	return EOPNOTSUPP;
}

SRN_EXPORT int ibv_query_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr)
{
	(void)srq, (void)attr;
	return EOPNOTSUPP;
}

SRN_EXPORT int ibv_destroy_srq(struct ibv_srq *srq)
{
	(void)srq;
	return EOPNOTSUPP;
}

/*
 * Protection domains and memory regions.
 *
 * Every registration goes through srn_reg_mr. The daemon can reach only
 * memory it maps (a sealed memfd per MR); arbitrary application memory
 * (malloc, memalign, file and huge-page mappings, shmget) needs the
 * daemon to read and write this process's address space through an fd of
 * its /proc/self/mem, a protocol addition that is not there yet. Until it
 * is, registration fails with EOPNOTSUPP and says so once.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "srn.h"

SRN_EXPORT struct ibv_pd *ibv_alloc_pd(struct ibv_context *ctx)
{
	struct srn_pd *p = calloc(1, sizeof(*p));
	if (!p) {
		errno = ENOMEM;
		return NULL;
	}
	struct softrnic_handle_msg resp;
	int err = srn_call(&to_sctx(ctx)->conn, SOFTRNIC_OP_ALLOC_PD, NULL, 0, NULL, 0, &resp, sizeof(resp), NULL, 0);
	if (err) {
		free(p);
		errno = err;
		return NULL;
	}
	p->pd.context = ctx;
	p->pd.handle = resp.handle;
	p->handle = resp.handle;
	return &p->pd;
}

SRN_EXPORT int ibv_dealloc_pd(struct ibv_pd *pd)
{
	struct srn_pd *p = to_spd(pd);
	int err = srn_call_handle(&to_sctx(pd->context)->conn, SOFTRNIC_OP_DEALLOC_PD, p->handle);
	if (err)
		return err;
	free(p);
	return 0;
}

/* The access flags a registration may carry; the optional ones
 * (IBV_ACCESS_OPTIONAL_RANGE: relaxed ordering and the like) are hints a
 * device may ignore, and are ignored. */
#define SRN_MR_ACCESS                                                                                          \
	(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC | \
	 IBV_ACCESS_ZERO_BASED)

/* The one place memory is registered. */
static struct ibv_mr *srn_reg_mr(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, unsigned int access)
{
	static bool said;
	access &= ~(unsigned int)IBV_ACCESS_OPTIONAL_RANGE;
	if (!pd || length == 0 || (access & ~(unsigned int)SRN_MR_ACCESS) ||
	    /* remote write or atomic access needs local write, as in rdma-core */
	    ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) && !(access & IBV_ACCESS_LOCAL_WRITE))) {
		errno = EINVAL;
		return NULL;
	}
	(void)addr;
	(void)iova;
	if (!said)
		srn_warn("ibv_reg_mr: registering application memory needs the daemon to reach this process's memory, "
			 "which this softrnic version does not do yet");
	said = true;
	errno = EOPNOTSUPP;
	return NULL;
}

SRN_EXPORT struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
	return srn_reg_mr(pd, addr, length, (uintptr_t)addr, (unsigned int)access);
}

SRN_EXPORT struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, int access)
{
	return srn_reg_mr(pd, addr, length, iova, (unsigned int)access);
}

SRN_EXPORT struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
					   unsigned int access)
{
	return srn_reg_mr(pd, addr, length, iova, access);
}

SRN_EXPORT int ibv_dereg_mr(struct ibv_mr *mr)
{
	struct srn_mr *m = (struct srn_mr *)mr;
	int err = srn_call_handle(&to_sctx(mr->context)->conn, SOFTRNIC_OP_DEREG_MR, m->handle);
	if (err)
		return err;
	free(m);
	return 0;
}

SRN_EXPORT int ibv_rereg_mr(struct ibv_mr *mr, int flags, struct ibv_pd *pd, void *addr, size_t length, int access)
{
	(void)mr, (void)flags, (void)pd, (void)addr, (void)length, (void)access;
	errno = EOPNOTSUPP;
	return IBV_REREG_MR_ERR_INPUT;
}

SRN_EXPORT struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length, uint64_t iova, int fd,
					    int access)
{
	(void)pd, (void)offset, (void)length, (void)iova, (void)fd, (void)access;
	errno = EOPNOTSUPP;
	return NULL;
}

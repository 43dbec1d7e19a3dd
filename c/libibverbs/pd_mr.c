/*
 * Protection domains and memory regions.
 *
 * Every registration goes through srn_reg_mr. An application registers
 * whatever memory it has (malloc, memalign, anonymous and file mappings,
 * MAP_HUGETLB, shmget segments), which the daemon cannot map. Private
 * anonymous pages of a single-threaded process are moved into a memfd the
 * daemon maps (share.c: no copies on the data path). Everything else
 * takes the copy path: at a context's first registration this library
 * passes the daemon its own /proc/self/mem and /proc/self/maps
 * (SCM_RIGHTS): files bound to this address space, opened with this
 * process's own rights. The device reads and writes registered memory
 * through the first, in batches; the daemon checks each registration
 * against the second (mapped, readable, and writable if the access
 * writes: EFAULT otherwise, as pinning fails). Both paths attach the
 * address space, so that what a process may register does not depend on
 * the path.
 *
 * Consequences an application may notice:
 *  - Nothing is pinned: after fork() the device goes on using the
 *    parent's pages, whatever the child does (copy-on-write keeps the two
 *    apart, and share.c gives the child private copies of moved pages),
 *    so no ibv_fork_init or MADV_DONTFORK is needed. A child that
 *    registers memory on a context it inherited attaches its own address
 *    space.
 *  - Registered pages are counted against RLIMIT_MEMLOCK exactly as the
 *    kernel counts pinned pages (ib_umem_get's pinned_vm): every
 *    registration its whole pages, overlaps counted again, ENOMEM past the
 *    limit and EPERM with a limit of 0, both unless the process has
 *    CAP_IPC_LOCK. The pages are not locked (mlock would change the
 *    application's own mappings and be undone by the first munlock).
 *  - Memory on the copy path unmapped while registered makes the next
 *    copy fail: the QP using it goes to the error state (LOC_PROT_ERR,
 *    IBV_EVENT_QP_FATAL), where the kernel's pinning would have kept
 *    writing to the old pages. Moved pages are kept by the daemon's
 *    mapping, as pinning keeps them.
 *  - A process that cannot open its own /proc/self/mem (not dumpable:
 *    set-user-ID, PR_SET_DUMPABLE 0, an LSM) cannot register: EPERM, with
 *    the reason on stderr under SOFTRNIC_DEBUG.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

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

/* Registration state of the process: the pages counted against
 * RLIMIT_MEMLOCK (the kernel's pinned_vm) and, per context, the address
 * space attached to its connection. */
static pthread_mutex_t mem_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t pinned_pages;
static pid_t pinned_pid;

static bool cap_ipc_lock(void)
{
	struct __user_cap_header_struct h = {.version = _LINUX_CAPABILITY_VERSION_3};
	struct __user_cap_data_struct d[_LINUX_CAPABILITY_U32S_3];
	if (syscall(SYS_capget, &h, d) != 0)
		return false;
	return d[CAP_IPC_LOCK / 32].effective & (1u << (CAP_IPC_LOCK % 32));
}

/* Counts n pages against RLIMIT_MEMLOCK as ib_umem_get does; under
 * mem_lock. */
static int pin_account(uint64_t n)
{
	pid_t pid = getpid();
	if (pinned_pid != pid) { /* a forked child starts with nothing pinned */
		pinned_pid = pid;
		pinned_pages = 0;
	}
	struct rlimit rl;
	if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0)
		return errno;
	if (rl.rlim_cur == RLIM_INFINITY) {
		pinned_pages += n;
		return 0;
	}
	long pg = sysconf(_SC_PAGESIZE);
	uint64_t limit = rl.rlim_cur / (uint64_t)pg;
	if (rl.rlim_cur == 0 && !cap_ipc_lock()) {
		srn_debug("ibv_reg_mr: RLIMIT_MEMLOCK is 0 (ulimit -l)");
		return EPERM;
	}
	if (pinned_pages + n > limit && !cap_ipc_lock()) {
		srn_debug("ibv_reg_mr: %llu pages registered and %llu more exceed RLIMIT_MEMLOCK (%llu bytes; ulimit -l)",
			  (unsigned long long)pinned_pages, (unsigned long long)n, (unsigned long long)rl.rlim_cur);
		return ENOMEM;
	}
	pinned_pages += n;
	return 0;
}

static void pin_release(uint64_t n)
{
	pthread_mutex_lock(&mem_lock);
	if (pinned_pid == getpid())
		pinned_pages -= n < pinned_pages ? n : pinned_pages;
	pthread_mutex_unlock(&mem_lock);
}

/* Attaches this process's address space to the context's connection, once
 * per process; under mem_lock. */
static int attach_space(struct srn_context *s)
{
	pid_t pid = getpid();
	if (s->space && s->space_pid == pid)
		return 0;
	int fds[2];
	fds[0] = open("/proc/self/mem", O_RDWR | O_CLOEXEC);
	if (fds[0] < 0) {
		int err = errno;
		int dumpable = prctl(PR_GET_DUMPABLE, 0, 0, 0, 0);
		srn_debug("ibv_reg_mr: cannot open /proc/self/mem (%s)%s: the softrnic daemon reaches registered memory "
			  "through it, so this process cannot register memory",
			  strerror(err),
			  dumpable == 0 ? ": the process is not dumpable (set-user-ID or set-group-ID, PR_SET_DUMPABLE 0, "
					  "or changed its credentials)"
					: "");
		return err == EACCES || err == EPERM ? EPERM : err;
	}
	fds[1] = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
	if (fds[1] < 0) {
		int err = errno;
		close(fds[0]);
		srn_debug("ibv_reg_mr: cannot open /proc/self/maps: %s", strerror(err));
		return err == EACCES || err == EPERM ? EPERM : err;
	}
	struct softrnic_handle_msg resp;
	int err = srn_call(&s->conn, SOFTRNIC_OP_ATTACH_MEM, NULL, 0, fds, 2, &resp, sizeof(resp), NULL, 0);
	close(fds[0]);
	close(fds[1]);
	if (err)
		return err;
	s->space = resp.handle;
	s->space_pid = pid;
	return 0;
}

/* The one place memory is registered. */
static struct ibv_mr *srn_reg_mr(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, unsigned int access)
{
	access &= ~(unsigned int)IBV_ACCESS_OPTIONAL_RANGE;
	if (!pd || length == 0 || (access & ~(unsigned int)SRN_MR_ACCESS) ||
	    /* remote write or atomic access needs local write, as in rdma-core */
	    ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) && !(access & IBV_ACCESS_LOCAL_WRITE))) {
		errno = EINVAL;
		return NULL;
	}
	struct srn_context *s = to_sctx(pd->context);
	struct srn_mr *m = calloc(1, sizeof(*m));
	if (!m) {
		errno = ENOMEM;
		return NULL;
	}
	long pg = sysconf(_SC_PAGESIZE);
	uintptr_t a = (uintptr_t)addr;
	if (a + length < a) {
		free(m);
		errno = EFAULT;
		return NULL;
	}
	m->pinned = ((a + length + pg - 1) / pg) - (a / pg);
	pthread_mutex_lock(&mem_lock);
	int err = pin_account(m->pinned);
	if (!err) {
		err = attach_space(s);
		if (err)
			pinned_pages -= m->pinned;
	}
	uint32_t space = s->space;
	pthread_mutex_unlock(&mem_lock);
	if (err) {
		free(m);
		errno = err;
		return NULL;
	}
	uint32_t mr_access = access & (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
				       IBV_ACCESS_REMOTE_ATOMIC);
	struct softrnic_reg_mr_resp resp;
	struct srn_share sh;
	err = -1;
	if (srn_share(a, length, &sh) == 0) {
		struct softrnic_reg_mr_req req = {
			.pd = to_spd(pd)->handle,
			.access = mr_access,
			.offset = sh.off,
			.length = length,
			.iova = iova,
		};
		err = srn_call(&s->conn, SOFTRNIC_OP_REG_MR, &req, sizeof(req), &sh.fd, 1, &resp, sizeof(resp), NULL, 0);
		close(sh.fd);
		if (err) /* e.g. the daemon's limit on mappings: the copy path may still serve it */
			srn_unshare(sh.ino);
		else
			m->share_ino = sh.ino;
	}
	if (err) {
		struct softrnic_reg_mr_addr_req req = {
			.pd = to_spd(pd)->handle,
			.access = mr_access,
			.space = space,
			.addr = a,
			.length = length,
			.iova = iova,
		};
		err = srn_call(&s->conn, SOFTRNIC_OP_REG_MR_ADDR, &req, sizeof(req), NULL, 0, &resp, sizeof(resp), NULL,
			       0);
	}
	if (err) {
		pin_release(m->pinned);
		free(m);
		errno = err;
		return NULL;
	}
	m->handle = resp.mr;
	m->mr.context = pd->context;
	m->mr.pd = pd;
	m->mr.addr = addr;
	m->mr.length = length;
	m->mr.handle = resp.mr;
	m->mr.lkey = resp.l_key;
	m->mr.rkey = resp.r_key;
	return &m->mr;
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
	if (m->share_ino)
		srn_unshare(m->share_ino);
	pin_release(m->pinned);
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

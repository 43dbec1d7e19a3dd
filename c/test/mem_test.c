/*
 * mem_test: softrnic's test of memory registration through its
 * libibverbs.so.1, built against the stock libibverbs-dev as any
 * application is and run with softrnic's library against a daemon.
 *
 *   mem_test local             one process, its QPs talking to each other
 *                              on the one device (loopback): every kind of
 *                              memory an application has (malloc, memalign,
 *                              anonymous and file mappings shared and
 *                              private, MAP_HUGETLB, shmget with and without
 *                              SHM_HUGETLB) registered and moved with SEND,
 *                              RDMA WRITE and READ and both atomics; the
 *                              registration errors (EINVAL, EFAULT for
 *                              unmapped and read-only memory, ENOMEM and
 *                              EPERM against RLIMIT_MEMLOCK, EPERM when not
 *                              dumpable); a wrong lkey and rkey; which
 *                              memory the library moves into shared
 *                              memory and which it leaves in place (other
 *                              kinds, a second thread, many mappings,
 *                              locked memory, SOFTRNIC_MR=copy);
 *                              registered memory of
 *                              both paths unmapped under a transfer; fork
 *   mem_test hold PORT         registers memory for a peer's WRITEs, waits
 *                              until the peer (mem_test stream) is gone,
 *                              then checks that the daemon still serves it
 *   mem_test stream ADDR PORT  WRITEs to hold's memory without end (the
 *                              test SIGKILLs it mid-transfer)
 *
 * Huge pages are used when the system has some free (else those cases
 * say "skipped"). Asserts rdma-core's documented results; prints
 * "N passed, M failed" and exits non-zero on any failure.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <linux/capability.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/shm.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

#define HUGE (2u << 20)

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int poll_one(struct ibv_cq *cq, struct ibv_wc *wc, double secs)
{
	double end = now() + secs;
	for (;;) {
		int n = ibv_poll_cq(cq, 1, wc);
		if (n != 0)
			return n;
		if (now() > end)
			return 0;
		usleep(20);
	}
}

static struct ibv_context *open_first(void)
{
	int n = -1;
	struct ibv_device **list = ibv_get_device_list(&n);
	MUST(list && n == 1, "device list %p, %d devices", (void *)list, n);
	struct ibv_context *ctx = ibv_open_device(list[0]);
	MUST(ctx, "open: %s", strerror(errno));
	ibv_free_device_list(list);
	return ctx;
}

#define ALL_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC)

/* Two RC QPs of one device connected to each other, or one QP to a peer
 * elsewhere. */
struct conn {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp[2];
	union ibv_gid gid;
};

static struct ibv_qp *make_qp(struct conn *c, enum ibv_qp_type t)
{
	struct ibv_qp_init_attr a = {.send_cq = c->cq, .recv_cq = c->cq, .qp_type = t,
				     .cap = {.max_send_wr = 64, .max_recv_wr = 64, .max_send_sge = 2, .max_recv_sge = 2}};
	struct ibv_qp *qp = ibv_create_qp(c->pd, &a);
	MUST(qp, "create_qp: %s", strerror(errno));
	return qp;
}

/* Moves qp to RTS toward dqpn at dgid with local ACK timeout to (loopback
 * pairs: 10, 4 ms, so that a peer that never answers is given up in well
 * under a second). */
static void connect_qp(struct ibv_qp *qp, uint32_t dqpn, const union ibv_gid *dgid, uint8_t to)
{
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1, .qp_access_flags = ALL_ACCESS & ~IBV_ACCESS_LOCAL_WRITE};
	MUST(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0, "INIT");
	a = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = dqpn, .rq_psn = 7,
				 .max_dest_rd_atomic = 4, .min_rnr_timer = 1,
				 .ah_attr = {.is_global = 1, .port_num = 1, .grh = {.hop_limit = 64, .dgid = *dgid}}};
	MUST(ibv_modify_qp(qp, &a,
			   IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				   IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) == 0,
	     "RTR");
	a = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTS, .sq_psn = 7, .timeout = to, .retry_cnt = 3, .rnr_retry = 7,
				 .max_rd_atomic = 4};
	MUST(ibv_modify_qp(qp, &a,
			   IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				   IBV_QP_MAX_QP_RD_ATOMIC) == 0,
	     "RTS");
}

static void conn_open(struct conn *c, struct ibv_context *ctx)
{
	c->ctx = ctx;
	c->pd = ibv_alloc_pd(ctx);
	MUST(c->pd, "alloc_pd");
	c->cq = ibv_create_cq(ctx, 256, NULL, NULL, 0);
	MUST(c->cq, "create_cq");
	MUST(ibv_query_gid(ctx, 1, 0, &c->gid) == 0, "query_gid");
}

/* A loopback pair: qp[0] and qp[1] connected to each other. */
static void loop_pair(struct conn *c)
{
	c->qp[0] = make_qp(c, IBV_QPT_RC);
	c->qp[1] = make_qp(c, IBV_QPT_RC);
	connect_qp(c->qp[0], c->qp[1]->qp_num, &c->gid, 10);
	connect_qp(c->qp[1], c->qp[0]->qp_num, &c->gid, 10);
}

static void loop_close(struct conn *c)
{
	for (int i = 0; i < 2; i++)
		CHECK(ibv_destroy_qp(c->qp[i]) == 0, "destroy_qp");
}

static int post(struct ibv_qp *qp, uint64_t id, enum ibv_wr_opcode op, struct ibv_mr *mr, void *addr, uint32_t len,
		uint64_t raddr, uint32_t rkey, uint64_t cmp_add, uint64_t swap)
{
	struct ibv_sge sg = {.addr = (uintptr_t)addr, .length = len, .lkey = mr ? mr->lkey : 0};
	struct ibv_send_wr w = {.wr_id = id, .sg_list = &sg, .num_sge = 1, .opcode = op, .send_flags = IBV_SEND_SIGNALED},
			   *bad;
	if (op == IBV_WR_ATOMIC_FETCH_AND_ADD || op == IBV_WR_ATOMIC_CMP_AND_SWP) {
		w.wr.atomic.remote_addr = raddr;
		w.wr.atomic.rkey = rkey;
		w.wr.atomic.compare_add = cmp_add;
		w.wr.atomic.swap = swap;
	} else {
		w.wr.rdma.remote_addr = raddr;
		w.wr.rdma.rkey = rkey;
	}
	return ibv_post_send(qp, &w, &bad);
}

static int post_recv(struct ibv_qp *qp, uint64_t id, struct ibv_mr *mr, void *addr, uint32_t len)
{
	struct ibv_sge sg = {.addr = (uintptr_t)addr, .length = len, .lkey = mr->lkey};
	struct ibv_recv_wr r = {.wr_id = id, .sg_list = &sg, .num_sge = 1}, *bad;
	return ibv_post_recv(qp, &r, &bad);
}

/* Waits for the completion of id with status want. */
static bool expect(struct conn *c, uint64_t id, enum ibv_wc_status want, const char *what)
{
	struct ibv_wc wc;
	int n = poll_one(c->cq, &wc, 20);
	return CHECK(n == 1 && wc.wr_id == id && wc.status == want, "%s: %d completions, id %llu status %s, want id %llu %s",
		     what, n, (unsigned long long)wc.wr_id, n == 1 ? ibv_wc_status_str(wc.status) : "-",
		     (unsigned long long)id, ibv_wc_status_str(want));
}

static void fill(uint8_t *p, size_t n, uint8_t seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(i * 13 + seed);
}

/* Whether the page at p is one the library moved into shared memory for
 * the daemon to map (its memfds are named so in /proc/self/maps). */
static bool shared_at(const void *p)
{
	FILE *f = fopen("/proc/self/maps", "r");
	MUST(f, "/proc/self/maps");
	char line[512];
	bool found = false;
	while (fgets(line, sizeof(line), f)) {
		unsigned long long s, e;
		if (sscanf(line, "%llx-%llx", &s, &e) == 2 && s <= (uintptr_t)p && (uintptr_t)p < e) {
			found = strstr(line, "softrnic-shared-mr") != NULL;
			break;
		}
	}
	fclose(f);
	return found;
}

/* Moves data through one MR of n bytes at p (n at least 64 KiB): the
 * first half is the source, the second the destination of a WRITE, a
 * SEND, a READ and both atomics between the two QPs of c. */
static void exercise(struct conn *c, const char *kind, uint8_t *p, size_t n, int file)
{
	struct ibv_mr *mr = ibv_reg_mr(c->pd, p, n, ALL_ACCESS);
	if (!CHECK(mr, "%s: reg_mr of %zu bytes: %s", kind, n, strerror(errno)))
		return;
	CHECK(mr->addr == p && mr->length == n && mr->lkey != mr->rkey, "%s: MR fields", kind);
	size_t h = n / 2, m = 32768;
	fill(p, h, (uint8_t)n);
	memset(p + h, 0, h);
	uint64_t dst = (uintptr_t)(p + h);
	MUST(post(c->qp[0], 1, IBV_WR_RDMA_WRITE, mr, p, m, dst, mr->rkey, 0, 0) == 0, "post WRITE");
	if (expect(c, 1, IBV_WC_SUCCESS, kind))
		CHECK(memcmp(p, p + h, m) == 0, "%s: WRITE data", kind);
	if (file >= 0) {
		/* A shared file mapping: the WRITE is in the file. */
		uint8_t *b = malloc(m);
		CHECK(pread(file, b, m, h) == (ssize_t)m && memcmp(b, p, m) == 0, "%s: WRITE not in the file", kind);
		free(b);
	}
	MUST(post_recv(c->qp[1], 2, mr, p + h + m, 20000) == 0, "post_recv");
	MUST(post(c->qp[0], 3, IBV_WR_SEND, mr, p + 5, 20000, 0, 0, 0, 0) == 0, "post SEND");
	struct ibv_wc wc[2];
	int got = 0;
	for (double end = now() + 20; got < 2 && now() < end;)
		got += ibv_poll_cq(c->cq, 2 - got, wc + got);
	CHECK(got == 2 && wc[0].status == IBV_WC_SUCCESS && wc[1].status == IBV_WC_SUCCESS, "%s: SEND completions", kind);
	CHECK(memcmp(p + 5, p + h + m, 20000) == 0, "%s: SEND data", kind);
	memset(p, 0, 4096);
	MUST(post(c->qp[1], 4, IBV_WR_RDMA_READ, mr, p, 4096, dst + 100, mr->rkey, 0, 0) == 0, "post READ");
	if (expect(c, 4, IBV_WC_SUCCESS, kind))
		CHECK(memcmp(p, p + h + 100, 4096) == 0, "%s: READ data", kind);
	uint64_t *word = (uint64_t *)(p + n - 64), *old = (uint64_t *)(p + 64);
	*word = 40;
	MUST(post(c->qp[0], 5, IBV_WR_ATOMIC_FETCH_AND_ADD, mr, old, 8, (uintptr_t)word, mr->rkey, 2, 0) == 0, "FETCH_ADD");
	expect(c, 5, IBV_WC_SUCCESS, kind);
	MUST(post(c->qp[0], 6, IBV_WR_ATOMIC_CMP_AND_SWP, mr, old + 1, 8, (uintptr_t)word, mr->rkey, 42, 7) == 0, "CMP_SWP");
	expect(c, 6, IBV_WC_SUCCESS, kind);
	CHECK(old[0] == 40 && old[1] == 42 && *word == 7, "%s: atomics: %llu %llu %llu", kind, (unsigned long long)old[0],
	      (unsigned long long)old[1], (unsigned long long)*word);
	CHECK(ibv_dereg_mr(mr) == 0, "%s: dereg_mr", kind);
}

static int skipped;

static void skip(const char *what, int err)
{
	printf("skipped: %s (%s)\n", what, strerror(err));
	skipped++;
}

/* Every kind of memory. */
static void test_kinds(struct conn *c)
{
	const size_t n = 256 << 10;
	uint8_t *p = malloc(n);
	exercise(c, "malloc", p, n, -1);
	CHECK(shared_at(p), "malloc: moved into shared memory");
	free(p);
	void *q = NULL;
	MUST(posix_memalign(&q, 4096, n) == 0, "memalign");
	exercise(c, "memalign", q, n, -1);
	free(q);
	p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	exercise(c, "anonymous mmap", p, n, -1);
	CHECK(shared_at(p), "anonymous mmap: moved into shared memory");
	munmap(p, n);
	p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	exercise(c, "shared anonymous mmap", p, n, -1);
	CHECK(!shared_at(p), "shared anonymous mmap: left where it is");
	munmap(p, n);

	char path[] = "/tmp/mem_test.XXXXXX";
	int fd = mkstemp(path);
	MUST(fd >= 0 && ftruncate(fd, n) == 0, "temp file");
	unlink(path);
	p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	exercise(c, "file MAP_SHARED", p, n, fd);
	munmap(p, n);
	/* Private: the device writes the process's copy, never the file. */
	uint8_t zero[4096] = {0}, b[4096];
	MUST(pwrite(fd, zero, sizeof(zero), n / 2) == sizeof(zero), "pwrite");
	p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
	exercise(c, "file MAP_PRIVATE", p, n, -1);
	CHECK(!shared_at(p), "file MAP_PRIVATE: left where it is");
	CHECK(pread(fd, b, sizeof(b), n / 2) == sizeof(b) && memcmp(b, zero, sizeof(b)) == 0, "MAP_PRIVATE wrote the file");
	munmap(p, n);
	close(fd);

	p = mmap(NULL, HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
	if (p == MAP_FAILED) {
		skip("MAP_HUGETLB", errno);
	} else {
		exercise(c, "MAP_HUGETLB", p, HUGE, -1);
		munmap(p, HUGE);
	}
	int id = shmget(IPC_PRIVATE, n, IPC_CREAT | 0600);
	MUST(id >= 0, "shmget: %s", strerror(errno));
	p = shmat(id, NULL, 0);
	shmctl(id, IPC_RMID, NULL);
	MUST(p != (void *)-1, "shmat");
	exercise(c, "shmget", p, n, -1);
	shmdt(p);
	id = shmget(IPC_PRIVATE, HUGE, IPC_CREAT | SHM_HUGETLB | 0600);
	if (id < 0) {
		skip("shmget SHM_HUGETLB", errno);
	} else {
		p = shmat(id, NULL, 0);
		shmctl(id, IPC_RMID, NULL);
		MUST(p != (void *)-1, "shmat");
		exercise(c, "shmget SHM_HUGETLB", p, HUGE, -1);
		shmdt(p);
	}
	/* Two MRs within one page and one struct, as rping registers its
	 * receive and send buffers. */
	struct {
		uint64_t a[2];
		pthread_mutex_t m;
		uint64_t b[2];
	} *s = calloc(1, sizeof(*s));
	struct ibv_mr *ma = ibv_reg_mr(c->pd, s->a, sizeof(s->a), IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *mb = ibv_reg_mr(c->pd, s->b, sizeof(s->b), IBV_ACCESS_LOCAL_WRITE);
	CHECK(ma && mb, "two MRs in one struct");
	s->a[0] = 0x1122334455667788;
	MUST(post_recv(c->qp[1], 7, mb, s->b, 16) == 0, "post_recv");
	MUST(post(c->qp[0], 8, IBV_WR_SEND, ma, s->a, 16, 0, 0, 0, 0) == 0, "post SEND");
	struct ibv_wc wc[2];
	int got = 0;
	for (double end = now() + 20; got < 2 && now() < end;)
		got += ibv_poll_cq(c->cq, 2 - got, wc + got);
	CHECK(got == 2 && s->b[0] == 0x1122334455667788, "SEND between two MRs of one struct");
	ibv_dereg_mr(ma);
	ibv_dereg_mr(mb);
	free(s);
}

/* Registration errors, as rdma-core over rxe reports them. */
static void test_reg_errors(struct conn *c)
{
	long pg = sysconf(_SC_PAGESIZE);
	uint8_t *p = mmap(NULL, 4 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	MUST(p != MAP_FAILED, "mmap");
	errno = 0;
	CHECK(!ibv_reg_mr(c->pd, p, 0, IBV_ACCESS_LOCAL_WRITE) && errno == EINVAL, "length 0: %s", strerror(errno));
	errno = 0;
	CHECK(!ibv_reg_mr(c->pd, p, pg, IBV_ACCESS_REMOTE_WRITE) && errno == EINVAL, "remote write without local write: %s",
	      strerror(errno));
	munmap(p + 3 * pg, pg);
	errno = 0;
	CHECK(!ibv_reg_mr(c->pd, p + 2 * pg, 2 * pg, 0) && errno == EFAULT, "partly unmapped: %s", strerror(errno));
	errno = 0;
	CHECK(!ibv_reg_mr(c->pd, NULL, pg, 0) && errno == EFAULT, "NULL: %s", strerror(errno));
	mprotect(p + pg, pg, PROT_READ);
	errno = 0;
	CHECK(!ibv_reg_mr(c->pd, p + pg, pg, IBV_ACCESS_LOCAL_WRITE) && errno == EFAULT, "read-only, local write: %s",
	      strerror(errno));
	errno = 0;
	CHECK(!ibv_reg_mr(c->pd, p, 2 * pg, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE) && errno == EFAULT,
	      "half read-only, remote write: %s", strerror(errno));
	mprotect(p + 2 * pg, pg, PROT_NONE);
	errno = 0;
	CHECK(!ibv_reg_mr(c->pd, p + 2 * pg, pg, 0) && errno == EFAULT, "PROT_NONE: %s", strerror(errno));
	/* Read-only memory with read access serves remote READs. */
	memset(p, 0x5a, pg);
	mprotect(p, 2 * pg, PROT_READ);
	struct ibv_mr *ro = ibv_reg_mr(c->pd, p, 2 * pg, IBV_ACCESS_REMOTE_READ);
	CHECK(ro, "read-only, remote read: %s", strerror(errno));
	uint8_t *dst = calloc(1, pg);
	struct ibv_mr *md = ibv_reg_mr(c->pd, dst, pg, IBV_ACCESS_LOCAL_WRITE);
	if (ro && md) {
		MUST(post(c->qp[0], 10, IBV_WR_RDMA_READ, md, dst, pg, (uintptr_t)p, ro->rkey, 0, 0) == 0, "post READ");
		if (expect(c, 10, IBV_WC_SUCCESS, "READ of read-only memory"))
			CHECK(memcmp(dst, p, pg) == 0, "READ of read-only memory: data");
		/* ...and refuses remote WRITEs, which its access does not grant
		 * (the responder NAKs: REM_ACCESS_ERR, the QPs in error). */
		MUST(post(c->qp[0], 11, IBV_WR_RDMA_WRITE, md, dst, 64, (uintptr_t)p, ro->rkey, 0, 0) == 0, "post WRITE");
		expect(c, 11, IBV_WC_REM_ACCESS_ERR, "WRITE to read-only MR");
		CHECK(p[0] == 0x5a, "the WRITE reached read-only memory");
	}
	if (ro)
		ibv_dereg_mr(ro);
	if (md)
		ibv_dereg_mr(md);
	free(dst);
	munmap(p, 3 * pg);
}

/* A wrong lkey (LOC_PROT_ERR, the QP in error) and a wrong rkey
 * (REM_ACCESS_ERR). */
static void test_keys(struct conn *c)
{
	uint8_t *b = calloc(1, 8192);
	struct ibv_mr *mr = ibv_reg_mr(c->pd, b, 8192, ALL_ACCESS);
	MUST(mr, "reg_mr");
	struct conn k = *c;
	loop_pair(&k);
	struct ibv_sge sg = {.addr = (uintptr_t)b, .length = 64, .lkey = mr->lkey ^ 0x5a5a};
	struct ibv_send_wr w = {.wr_id = 20, .sg_list = &sg, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				.send_flags = IBV_SEND_SIGNALED, .wr.rdma = {(uintptr_t)b + 4096, mr->rkey}},
			   w2 = {.wr_id = 21, .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED}, *bad;
	w.next = &w2;
	CHECK(ibv_post_send(k.qp[0], &w, &bad) == 0, "post with a wrong lkey");
	expect(c, 20, IBV_WC_LOC_PROT_ERR, "wrong lkey");
	expect(c, 21, IBV_WC_WR_FLUSH_ERR, "after a wrong lkey");
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	CHECK(ibv_query_qp(k.qp[0], &qa, IBV_QP_STATE, &qi) == 0 && qa.qp_state == IBV_QPS_ERR, "state %d", qa.qp_state);
	loop_close(&k);
	loop_pair(&k);
	MUST(post(k.qp[0], 22, IBV_WR_RDMA_WRITE, mr, b, 64, (uintptr_t)b + 4096, mr->rkey + 1, 0, 0) == 0, "post");
	expect(c, 22, IBV_WC_REM_ACCESS_ERR, "wrong rkey");
	loop_close(&k);
	ibv_dereg_mr(mr);
	free(b);
}

/* Registered memory on the copy path (SOFTRNIC_MR=copy) unmapped while
 * the device uses it: the copy fails,
 * the QP that needed it reports LOC_PROT_ERR and goes to error, and the
 * device goes on serving everything else. (Each QP pair is made before the
 * munmap: its rings would otherwise be mapped into the hole, and the
 * device would write there, where the kernel's pinning would have kept
 * writing to the old pages.) */
static void test_unmapped(struct conn *c)
{
	long pg = sysconf(_SC_PAGESIZE);
	uint8_t *src = calloc(1, 4 * pg);
	struct ibv_mr *ms = ibv_reg_mr(c->pd, src, 4 * pg, ALL_ACCESS);
	MUST(ms, "reg_mr");
	struct conn k = *c;
	for (int round = 0; round < 2; round++) {
		uint8_t *gone = mmap(NULL, 4 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		setenv("SOFTRNIC_MR", "copy", 1);
		struct ibv_mr *mg = ibv_reg_mr(c->pd, gone, 4 * pg, ALL_ACCESS);
		unsetenv("SOFTRNIC_MR");
		MUST(mg, "reg_mr");
		CHECK(!shared_at(gone), "SOFTRNIC_MR=copy: left where it is");
		loop_pair(&k);
		if (round == 0) {
			/* A receive into it. */
			MUST(post_recv(k.qp[1], 30, mg, gone, 2 * pg) == 0, "post_recv");
			munmap(gone, 4 * pg);
			MUST(post(k.qp[0], 31, IBV_WR_SEND, ms, src, 3000, 0, 0, 0, 0) == 0, "post SEND");
			struct ibv_wc wc[2];
			int got = 0;
			for (double end = now() + 30; got < 2 && now() < end;)
				got += ibv_poll_cq(c->cq, 2 - got, wc + got);
			bool ok = got == 2;
			for (int i = 0; ok && i < 2; i++) {
				if (wc[i].wr_id == 30)
					ok = wc[i].status == IBV_WC_LOC_PROT_ERR;
				else
					ok = wc[i].wr_id == 31 && wc[i].status == IBV_WC_RETRY_EXC_ERR;
			}
			CHECK(ok, "SEND into unmapped memory: %d completions (%llu %s, %llu %s)", got,
			      (unsigned long long)wc[0].wr_id, ibv_wc_status_str(wc[0].status),
			      (unsigned long long)wc[1].wr_id, got > 1 ? ibv_wc_status_str(wc[1].status) : "-");
		} else {
			/* A WRITE from it: never sent. */
			munmap(gone, 4 * pg);
			MUST(post(k.qp[0], 32, IBV_WR_RDMA_WRITE, mg, gone, 2 * pg, (uintptr_t)src, ms->rkey, 0, 0) == 0,
			     "post WRITE");
			expect(c, 32, IBV_WC_LOC_PROT_ERR, "WRITE from unmapped memory");
		}
		loop_close(&k);
		CHECK(ibv_dereg_mr(mg) == 0, "dereg_mr of unmapped memory");
	}

	/* The device is unharmed. */
	loop_pair(&k);
	fill(src, pg, 3);
	MUST(post(k.qp[0], 33, IBV_WR_RDMA_WRITE, ms, src, pg, (uintptr_t)src + 2 * pg, ms->rkey, 0, 0) == 0, "post");
	if (expect(c, 33, IBV_WC_SUCCESS, "WRITE after the faults"))
		CHECK(memcmp(src, src + 2 * pg, pg) == 0, "WRITE after the faults: data");
	loop_close(&k);
	ibv_dereg_mr(ms);
	free(src);
}

/* A child's own context: memory of its own, on a pair of its own. */
static void kinds_child(struct conn *c)
{
	loop_pair(c);
	const size_t n = 128 << 10;
	uint8_t *p = malloc(n);
	exercise(c, "a forked child's malloc", p, n, -1);
	free(p);
	loop_close(c);
}

/* Drops CAP_IPC_LOCK from the effective set (root has it, and it lifts
 * RLIMIT_MEMLOCK). */
static void drop_ipc_lock(void)
{
	struct __user_cap_header_struct h = {.version = _LINUX_CAPABILITY_VERSION_3};
	struct __user_cap_data_struct d[_LINUX_CAPABILITY_U32S_3];
	if (syscall(SYS_capget, &h, d) == 0) {
		d[CAP_IPC_LOCK / 32].effective &= ~(1u << (CAP_IPC_LOCK % 32));
		syscall(SYS_capset, &h, d);
	}
}

/* Runs fn in a child process with its own context; the child's checks
 * count in its exit status. */
static void in_child(const char *what, void (*fn)(struct conn *))
{
	fflush(stdout);
	pid_t pid = fork();
	MUST(pid >= 0, "fork");
	if (pid == 0) {
		passed = failed = 0;
		struct conn k = {0};
		conn_open(&k, open_first());
		fn(&k);
		ibv_close_device(k.ctx);
		_exit(failed ? 1 : 0);
	}
	int st;
	CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: child status %#x", what, st);
}

/* RLIMIT_MEMLOCK counts registered pages as the kernel counts pinned ones. */
static void memlock_child(struct conn *c)
{
	drop_ipc_lock();
	struct rlimit rl;
	getrlimit(RLIMIT_MEMLOCK, &rl);
	rl.rlim_cur = 64 << 10;
	MUST(setrlimit(RLIMIT_MEMLOCK, &rl) == 0, "setrlimit");
	void *b = NULL;
	MUST(posix_memalign(&b, 4096, 256 << 10) == 0, "memalign");
	errno = 0;
	CHECK(!ibv_reg_mr(c->pd, b, 128 << 10, IBV_ACCESS_LOCAL_WRITE) && errno == ENOMEM, "over RLIMIT_MEMLOCK: %s",
	      strerror(errno));
	struct ibv_mr *m1 = ibv_reg_mr(c->pd, b, 40 << 10, IBV_ACCESS_LOCAL_WRITE);
	CHECK(m1, "within RLIMIT_MEMLOCK: %s", strerror(errno));
	errno = 0;
	CHECK(!ibv_reg_mr(c->pd, b, 40 << 10, IBV_ACCESS_LOCAL_WRITE) && errno == ENOMEM,
	      "the same pages again (counted twice, as pinned_vm does): %s", strerror(errno));
	if (m1)
		ibv_dereg_mr(m1);
	struct ibv_mr *m2 = ibv_reg_mr(c->pd, b, 60 << 10, IBV_ACCESS_LOCAL_WRITE);
	CHECK(m2, "after a deregistration: %s", strerror(errno));
	if (m2)
		ibv_dereg_mr(m2);
	rl.rlim_cur = 0;
	MUST(setrlimit(RLIMIT_MEMLOCK, &rl) == 0, "setrlimit 0");
	errno = 0;
	CHECK(!ibv_reg_mr(c->pd, b, 4096, IBV_ACCESS_LOCAL_WRITE) && errno == EPERM, "RLIMIT_MEMLOCK 0: %s",
	      strerror(errno));
	free(b);
}

/* A process that cannot open its own /proc/self/mem (not dumpable after a
 * change of credentials) cannot register: EPERM. */
static void nondumpable_child(struct conn *c)
{
	if (getuid() == 0) {
		MUST(setresgid(65534, 65534, 65534) == 0 && setresuid(65534, 65534, 65534) == 0, "setresuid");
	} else {
		MUST(prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0, "PR_SET_DUMPABLE");
	}
	static uint8_t b[4096];
	errno = 0;
	CHECK(!ibv_reg_mr(c->pd, b, sizeof(b), IBV_ACCESS_LOCAL_WRITE) && errno == EPERM, "not dumpable: %s",
	      strerror(errno));
}

/* Anonymous memory the library moved into shared memory, unmapped while
 * registered: the device goes on using the pages the MR was made over,
 * as it would over rxe, whose pinning keeps them: a WRITE from them
 * carries what they held, a SEND into them completes, and nothing else is
 * touched. */
static void test_unmapped_shared(struct conn *c)
{
	long pg = sysconf(_SC_PAGESIZE);
	uint8_t *dst = calloc(1, 4 * pg);
	struct ibv_mr *md = ibv_reg_mr(c->pd, dst, 4 * pg, ALL_ACCESS);
	MUST(md, "reg_mr");
	uint8_t *gone = mmap(NULL, 4 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	struct ibv_mr *mg = ibv_reg_mr(c->pd, gone, 4 * pg, ALL_ACCESS);
	MUST(mg, "reg_mr");
	CHECK(shared_at(gone), "anonymous mmap: moved into shared memory");
	fill(gone, 4 * pg, 9);
	uint8_t *want = malloc(2 * pg);
	memcpy(want, gone, 2 * pg);
	munmap(gone, 4 * pg);
	struct conn k = *c;
	loop_pair(&k);
	MUST(post(k.qp[0], 34, IBV_WR_RDMA_WRITE, mg, gone, 2 * pg, (uintptr_t)dst, md->rkey, 0, 0) == 0, "post WRITE");
	if (expect(c, 34, IBV_WC_SUCCESS, "WRITE from unmapped shared memory"))
		CHECK(memcmp(dst, want, 2 * pg) == 0, "WRITE from unmapped shared memory: the pages' old contents");
	MUST(post_recv(k.qp[1], 35, mg, gone, 2 * pg) == 0, "post_recv");
	MUST(post(k.qp[0], 36, IBV_WR_SEND, md, dst, 3000, 0, 0, 0, 0) == 0, "post SEND");
	struct ibv_wc wc[2];
	int got = 0;
	for (double end = now() + 20; got < 2 && now() < end;)
		got += ibv_poll_cq(c->cq, 2 - got, wc + got);
	CHECK(got == 2 && wc[0].status == IBV_WC_SUCCESS && wc[1].status == IBV_WC_SUCCESS,
	      "SEND into unmapped shared memory: %d completions", got);
	loop_close(&k);
	CHECK(ibv_dereg_mr(mg) == 0, "dereg_mr of unmapped shared memory");
	ibv_dereg_mr(md);
	free(want);
	free(dst);
}

/* Which memory the library moves into shared memory, and what stays. */
static void test_shared(struct conn *c)
{
	long pg = sysconf(_SC_PAGESIZE);
	/* Heap memory, with its neighbours on the same pages (past the first
	 * page of the allocation: the first page of a mapping aligned to
	 * 64 MiB, which an allocator's region may be, stays in place). */
	uint8_t *h = malloc(4 * pg), *b = h + pg;
	fill(h, 4 * pg, 1);
	struct ibv_mr *m1 = ibv_reg_mr(c->pd, b + 100, pg, ALL_ACCESS);
	MUST(m1, "reg_mr heap");
	CHECK(shared_at(b + 100), "heap: moved into shared memory");
	uint8_t *ref = malloc(4 * pg);
	fill(ref, 4 * pg, 1);
	CHECK(memcmp(h, ref, 4 * pg) == 0, "heap: the pages' contents kept");
	/* A second MR over the same pages uses the same memory. */
	struct ibv_mr *m2 = ibv_reg_mr(c->pd, b + 200, 64, ALL_ACCESS);
	MUST(m2, "reg_mr again");
	struct conn k = *c;
	loop_pair(&k);
	MUST(post(k.qp[0], 37, IBV_WR_RDMA_WRITE, m2, b + 200, 64, (uintptr_t)b + 1000, m1->rkey, 0, 0) == 0, "post");
	if (expect(c, 37, IBV_WC_SUCCESS, "WRITE between two MRs over the same pages"))
		CHECK(memcmp(b + 1000, ref + pg + 200, 64) == 0, "WRITE between two MRs over the same pages: data");
	CHECK(ibv_dereg_mr(m1) == 0 && ibv_dereg_mr(m2) == 0, "dereg_mr");
	/* After the last deregistration the memory stays the application's. */
	b[5] = 0x5a;
	CHECK(b[5] == 0x5a && shared_at(b), "after deregistration: still mapped and writable");
	/* Registered again: whichever path it takes, the device sees the
	 * application's writes and the application the device's. */
	m1 = ibv_reg_mr(c->pd, h, 4 * pg, ALL_ACCESS);
	MUST(m1, "reg_mr after deregistration");
	h[0] = 0x33;
	MUST(post(k.qp[0], 38, IBV_WR_RDMA_WRITE, m1, h, 8, (uintptr_t)h + 2 * pg, m1->rkey, 0, 0) == 0, "post");
	if (expect(c, 38, IBV_WC_SUCCESS, "WRITE after a new registration"))
		CHECK(h[2 * pg] == 0x33, "WRITE after a new registration: data");
	loop_close(&k);
	ibv_dereg_mr(m1);
	free(ref);
	free(h);
	/* Switched off. */
	uint8_t *p = mmap(NULL, 2 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	setenv("SOFTRNIC_MR", "copy", 1);
	m1 = ibv_reg_mr(c->pd, p, 2 * pg, ALL_ACCESS);
	unsetenv("SOFTRNIC_MR");
	CHECK(m1 && !shared_at(p), "SOFTRNIC_MR=copy: left where it is");
	if (m1)
		ibv_dereg_mr(m1);
	/* Read-only memory registered for reading only: left where it is. */
	mprotect(p, 2 * pg, PROT_READ);
	m1 = ibv_reg_mr(c->pd, p, 2 * pg, 0);
	CHECK(m1 && !shared_at(p), "read-only memory: left where it is");
	if (m1)
		ibv_dereg_mr(m1);
	munmap(p, 2 * pg);
}

static void *idle_thread(void *arg)
{
	int *fd = arg;
	char x;
	return read(*fd, &x, 1) == 1 ? NULL : arg;
}

/* Anonymous memory that must stay where it is (why) moves data on a pair
 * of c's own. */
static void exercise_in_place(struct conn *c, const char *why)
{
	loop_pair(c);
	const size_t n = 128 << 10;
	uint8_t *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	MUST(p != MAP_FAILED, "mmap");
	exercise(c, why, p, n, -1);
	CHECK(!shared_at(p), "%s: left where it is", why);
	munmap(p, n);
	loop_close(c);
}

/* A process with a second thread: another thread could write the pages
 * while they are copied, so they are left where they are. */
static void threads_child(struct conn *c)
{
	int fds[2];
	MUST(pipe(fds) == 0, "pipe");
	pthread_t th;
	MUST(pthread_create(&th, NULL, idle_thread, &fds[0]) == 0, "thread");
	exercise_in_place(c, "two threads");
	char x = 'q';
	MUST(write(fds[1], &x, 1) == 1, "pipe");
	pthread_join(th, NULL);
}

/* A process with locked memory: a move would drop an mlock, and which
 * ranges are locked /proc/self/maps does not say, so nothing moves. */
static void locked_child(struct conn *c)
{
	long pg = sysconf(_SC_PAGESIZE);
	uint8_t *l = mmap(NULL, pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	MUST(l != MAP_FAILED, "mmap");
	if (mlock(l, pg) != 0) {
		skip("mlock", errno);
		return;
	}
	/* Sanitizers make mlock a no-op that succeeds. */
	FILE *f = fopen("/proc/self/status", "r");
	MUST(f, "/proc/self/status");
	char line[256];
	long kb = -1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "VmLck: %ld", &kb) == 1)
			break;
	fclose(f);
	if (kb <= 0) {
		skip("mlock (nothing locked: a sanitizer's mlock)", ENOSYS);
		return;
	}
	exercise_in_place(c, "locked memory");
	munlock(l, pg);
	munmap(l, pg);
}

/* A process with half of vm.max_map_count mappings: moving pages would
 * split more, so they are left where they are. */
static void mappings_child(struct conn *c)
{
	FILE *f = fopen("/proc/sys/vm/max_map_count", "r");
	unsigned long max = 65530;
	if (f) {
		MUST(fscanf(f, "%lu", &max) == 1, "max_map_count");
		fclose(f);
	}
	long pg = sysconf(_SC_PAGESIZE);
	size_t n = max / 2 + 16;
	/* One mapping, its pages alternately readable and not: n mappings. */
	uint8_t *many = mmap(NULL, n * pg, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	MUST(many != MAP_FAILED, "mmap");
	for (size_t i = 1; i < n; i += 2)
		MUST(mprotect(many + i * pg, pg, PROT_NONE) == 0, "mprotect");
	exercise_in_place(c, "half of vm.max_map_count mappings");
	munmap(many, n * pg);
}

static int open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	MUST(d, "/proc/self/fd");
	int n = 0;
	while (readdir(d))
		n++;
	closedir(d);
	return n;
}

/* The memfds kept for later MRs are the application's fds too: at most a
 * 16th of RLIMIT_NOFILE of them. Pages whose fd was not kept are still
 * moved, and a second MR over them takes the copy path. */
static void fds_child(struct conn *c)
{
	struct rlimit rl = {.rlim_cur = 64, .rlim_max = 64};
	MUST(setrlimit(RLIMIT_NOFILE, &rl) == 0, "setrlimit");
	long pg = sysconf(_SC_PAGESIZE);
	enum { N = 8 };
	uint8_t *p[N];
	struct ibv_mr *mr[N];
	int before = open_fds();
	for (int i = 0; i < N; i++) {
		p[i] = mmap(NULL, 2 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		mr[i] = ibv_reg_mr(c->pd, p[i], 2 * pg, ALL_ACCESS);
		MUST(mr[i], "reg_mr %d: %s", i, strerror(errno));
		CHECK(shared_at(p[i]), "MR %d: moved into shared memory", i);
	}
	int kept = open_fds() - before;
	CHECK(kept == 4, "RLIMIT_NOFILE 64: %d memfds kept, want 4", kept);
	loop_pair(c);
	struct ibv_mr *again = ibv_reg_mr(c->pd, p[N - 1] + pg, pg, ALL_ACCESS);
	MUST(again, "reg_mr over pages whose fd was not kept: %s", strerror(errno));
	p[N - 1][0] = 0x42;
	MUST(post(c->qp[0], 39, IBV_WR_RDMA_WRITE, mr[N - 1], p[N - 1], 8, (uintptr_t)p[N - 1] + pg, again->rkey, 0, 0) == 0,
	     "post");
	if (expect(c, 39, IBV_WC_SUCCESS, "WRITE into a second MR over moved pages"))
		CHECK(p[N - 1][pg] == 0x42, "WRITE into a second MR over moved pages: data");
	loop_close(c);
	ibv_dereg_mr(again);
	for (int i = 0; i < N; i++)
		ibv_dereg_mr(mr[i]);
	CHECK(open_fds() == before, "after deregistration: %d fds, want %d", open_fds(), before);
	for (int i = 0; i < N; i++)
		munmap(p[i], 2 * pg);
}

/* After fork the device goes on using the parent's pages: the parent
 * sees a WRITE, the child its own copy. A child registers its own memory
 * on a context of its own. */
static void test_fork(struct conn *c)
{
	uint8_t *b = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	struct ibv_mr *mr = ibv_reg_mr(c->pd, b, 8192, ALL_ACCESS);
	MUST(mr, "reg_mr");
	CHECK(shared_at(b), "fork: the MR's memory moved into shared memory");
	memset(b, 'P', 8192);
	int go[2], done[2];
	MUST(pipe(go) == 0 && pipe(done) == 0, "pipe");
	fflush(stdout);
	pid_t pid = fork();
	MUST(pid >= 0, "fork");
	if (pid == 0) {
		char x;
		memset(b + 4096, 'C', 4096); /* the child's copy */
		if (read(go[0], &x, 1) != 1)
			_exit(2);
		/* the child's copy is private again */
		x = b[4096] == 'C' && b[4095] == 'P' && !shared_at(b) ? 'y' : 'n';
		_exit(write(done[1], &x, 1) == 1 && x == 'y' ? 0 : 1);
	}
	memset(b, 'W', 64);
	struct conn k = *c;
	loop_pair(&k);
	MUST(post(k.qp[0], 40, IBV_WR_RDMA_WRITE, mr, b, 64, (uintptr_t)b + 4096, mr->rkey, 0, 0) == 0, "post");
	expect(c, 40, IBV_WC_SUCCESS, "WRITE after fork");
	CHECK(b[4096] == 'W' && b[4096 + 64] == 'P', "after fork the parent's pages: %c %c", b[4096], b[4096 + 64]);
	char x = 'g';
	MUST(write(go[1], &x, 1) == 1, "pipe");
	int st;
	CHECK(read(done[0], &x, 1) == 1 && x == 'y', "the child's copy changed");
	CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status %#x", st);
	loop_close(&k);
	ibv_dereg_mr(mr);
	munmap(b, 8192);
	in_child("a child's own context", kinds_child);
}

/* ibv_req_notify_cq asks for the next completion, as rxe does: one
 * already in the CQ raises no event (perftest's -e latency loops rely on
 * it), one added after the request does. */
static void test_notify(struct conn *c)
{
	struct ibv_comp_channel *ch = ibv_create_comp_channel(c->ctx);
	MUST(ch, "comp channel");
	struct conn k = *c;
	k.cq = ibv_create_cq(c->ctx, 16, NULL, ch, 0);
	MUST(k.cq, "create_cq");
	loop_pair(&k);
	static uint8_t b[64];
	struct ibv_mr *mr = ibv_reg_mr(c->pd, b, sizeof(b), ALL_ACCESS);
	MUST(mr, "reg_mr");
	b[0] = 0x77;
	MUST(post(k.qp[0], 60, IBV_WR_RDMA_WRITE, mr, b, 8, (uintptr_t)b + 32, mr->rkey, 0, 0) == 0, "post");
	struct ibv_wc wc;
	double end = now() + 20;
	while (((volatile uint8_t *)b)[32] != 0x77 && now() < end)
		usleep(100);
	usleep(200000); /* the WRITE's completion is in the CQ by now, not polled */
	CHECK(ibv_req_notify_cq(k.cq, 0) == 0, "req_notify_cq");
	struct pollfd pfd = {.fd = ch->fd, .events = POLLIN};
	CHECK(poll(&pfd, 1, 300) == 0, "an event for a completion that was already in the CQ");
	MUST(post(k.qp[0], 61, IBV_WR_RDMA_WRITE, mr, b, 8, (uintptr_t)b + 32, mr->rkey, 0, 0) == 0, "post");
	CHECK(poll(&pfd, 1, 20000) == 1, "no event for a new completion");
	struct ibv_cq *ecq;
	void *ectx;
	CHECK(ibv_get_cq_event(ch, &ecq, &ectx) == 0 && ecq == k.cq, "get_cq_event");
	ibv_ack_cq_events(k.cq, 1);
	int got = 0;
	for (end = now() + 20; got < 2 && now() < end;)
		got += ibv_poll_cq(k.cq, 1, &wc);
	CHECK(got == 2, "%d completions", got);
	loop_close(&k);
	ibv_dereg_mr(mr);
	CHECK(ibv_destroy_cq(k.cq) == 0, "destroy_cq");
	CHECK(ibv_destroy_comp_channel(ch) == 0, "destroy channel");
}

static int local(void)
{
	struct conn c = {0};
	conn_open(&c, open_first());
	loop_pair(&c);
	test_kinds(&c);
	test_reg_errors(&c);
	loop_close(&c);
	test_notify(&c);
	test_keys(&c);
	test_unmapped(&c);
	test_unmapped_shared(&c);
	test_shared(&c);
	in_child("two threads", threads_child);
	in_child("many mappings", mappings_child);
	in_child("locked memory", locked_child);
	in_child("RLIMIT_NOFILE", fds_child);
	test_fork(&c);
	in_child("RLIMIT_MEMLOCK", memlock_child);
	in_child("not dumpable", nondumpable_child);
	CHECK(ibv_destroy_cq(c.cq) == 0, "destroy_cq");
	CHECK(ibv_dealloc_pd(c.pd) == 0, "dealloc_pd");
	CHECK(ibv_close_device(c.ctx) == 0, "close_device");
	printf("%d skipped\n", skipped);
	finish();
	return 0;
}

/* ---- a client killed mid-transfer ---- */

struct endpoint {
	uint32_t qpn, rkey;
	uint64_t addr;
	uint8_t gid[16];
};

static int tcp_exchange(const char *host, const char *port, struct endpoint *mine, struct endpoint *theirs)
{
	struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = host ? 0 : AI_PASSIVE};
	struct addrinfo *ai;
	if (getaddrinfo(host, port, &hints, &ai))
		return -1;
	int fd = socket(ai->ai_family, SOCK_STREAM, 0), c = -1;
	if (host) {
		for (int i = 0; i < 200 && connect(fd, ai->ai_addr, ai->ai_addrlen); i++) {
			close(fd);
			fd = socket(ai->ai_family, SOCK_STREAM, 0);
			usleep(50000);
		}
		c = fd;
	} else {
		int one = 1;
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (bind(fd, ai->ai_addr, ai->ai_addrlen) || listen(fd, 1))
			return -1;
		printf("listening\n");
		c = accept(fd, NULL, NULL);
		close(fd);
	}
	freeaddrinfo(ai);
	if (c < 0 || write(c, mine, sizeof(*mine)) != sizeof(*mine) || read(c, theirs, sizeof(*theirs)) != sizeof(*theirs))
		return -1;
	return c;
}

enum { STREAM = 1 << 20, CHUNK = 16384 };

static int hold(const char *port)
{
	struct conn c = {0};
	conn_open(&c, open_first());
	c.qp[0] = make_qp(&c, IBV_QPT_RC);
	uint8_t *b = calloc(1, STREAM);
	struct ibv_mr *mr = ibv_reg_mr(c.pd, b, STREAM, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	MUST(mr, "reg_mr: %s", strerror(errno));
	struct endpoint me = {.qpn = c.qp[0]->qp_num, .rkey = mr->rkey, .addr = (uintptr_t)b}, peer;
	memcpy(me.gid, c.gid.raw, 16);
	int fd = tcp_exchange(NULL, port, &me, &peer);
	MUST(fd >= 0, "exchange");
	union ibv_gid g;
	memcpy(g.raw, peer.gid, 16);
	connect_qp(c.qp[0], peer.qpn, &g, 16);
	char x;
	MUST(write(fd, "r", 1) == 1, "ready");
	CHECK(read(fd, &x, 1) == 0, "the streamer said something"); /* until it is killed */
	close(fd);
	uint8_t want[CHUNK];
	fill(want, CHUNK, 9);
	CHECK(memcmp(b, want, CHUNK) == 0, "the streamer's WRITEs did not land");
	/* The daemon still serves this client: a loopback pair. */
	struct conn k = c;
	loop_pair(&k);
	MUST(post(k.qp[0], 50, IBV_WR_RDMA_WRITE, mr, b, CHUNK, (uintptr_t)b + CHUNK, mr->rkey, 0, 0) == 0, "post");
	if (expect(&c, 50, IBV_WC_SUCCESS, "WRITE after the peer died"))
		CHECK(memcmp(b, b + CHUNK, CHUNK) == 0, "WRITE after the peer died: data");
	loop_close(&k);
	CHECK(ibv_destroy_qp(c.qp[0]) == 0, "destroy_qp");
	ibv_dereg_mr(mr);
	finish();
	return 0;
}

__attribute__((noreturn)) static void stream(const char *host, const char *port)
{
	struct conn c = {0};
	conn_open(&c, open_first());
	c.qp[0] = make_qp(&c, IBV_QPT_RC);
	uint8_t *b = malloc(CHUNK);
	fill(b, CHUNK, 9);
	struct ibv_mr *mr = ibv_reg_mr(c.pd, b, CHUNK, IBV_ACCESS_LOCAL_WRITE);
	MUST(mr, "reg_mr: %s", strerror(errno));
	struct endpoint me = {.qpn = c.qp[0]->qp_num}, peer;
	memcpy(me.gid, c.gid.raw, 16);
	int fd = tcp_exchange(host, port, &me, &peer);
	MUST(fd >= 0, "exchange");
	union ibv_gid g;
	memcpy(g.raw, peer.gid, 16);
	connect_qp(c.qp[0], peer.qpn, &g, 16);
	char x;
	MUST(read(fd, &x, 1) == 1, "ready");
	printf("streaming\n");
	fflush(stdout);
	int out = 0;
	for (uint64_t i = 0;; i++) {
		while (out < 32) {
			MUST(post(c.qp[0], i, IBV_WR_RDMA_WRITE, mr, b, CHUNK, peer.addr, peer.rkey, 0, 0) == 0,
			     "post");
			out++;
		}
		struct ibv_wc wc[16];
		int n = ibv_poll_cq(c.cq, 16, wc);
		for (int k = 0; k < n; k++)
			MUST(wc[k].status == IBV_WC_SUCCESS, "WRITE: %s", ibv_wc_status_str(wc[k].status));
		out -= n;
	}
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	signal(SIGPIPE, SIG_IGN);
	if (argc == 2 && !strcmp(argv[1], "local"))
		return local();
	if (argc == 3 && !strcmp(argv[1], "hold"))
		return hold(argv[2]);
	if (argc == 4 && !strcmp(argv[1], "stream"))
		stream(argv[2], argv[3]);
	fprintf(stderr, "usage: mem_test local | hold PORT | stream ADDR PORT\n");
	return 2;
}

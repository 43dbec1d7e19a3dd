/*
 * Registered memory moved into shared memory, so that the daemon maps it.
 *
 * The daemon reaches an application's memory through /proc/PID/mem
 * copies (pd_mr.c), which cost a system call per run of pages on every
 * transfer. For the memory most programs register, private anonymous
 * pages (malloc, memalign, anonymous mmap), it can do without them: at
 * registration the pages under the MR are copied into a sealed memfd
 * that is then mapped over them, at the same address and with the same
 * contents, and the daemon maps the memfd as it maps the Go clients'
 * memory. The application goes on using the same addresses; from then on
 * the device reads and writes those pages directly.
 *
 * Only when that cannot change what the application sees:
 *  - the pages lie in one private anonymous mapping, read and write,
 *    unnamed or the heap (not the stack, files, shm, huge pages: those
 *    stay on the copy path);
 *  - the process has one thread, so no other thread writes the pages
 *    between the copy and the remap (signals are blocked meanwhile), and
 *    no locked memory (a move would drop an mlock). A multi-threaded
 *    process, or one with locked memory, registers through the copy path.
 *  - after fork() the child gets private copies of every such mapping
 *    (a pthread_atfork handler), as it would have had of the anonymous
 *    pages; a mapping that cannot be copied is unmapped in the child, as
 *    MADV_DONTFORK does under rdma-core's ibv_fork_init. Until then the
 *    child's writes reach the parent, so a page glibc's fork writes
 *    first (an arena's header) is never moved. Children made without
 *    fork() (_Fork, a raw clone without CLONE_VM) would share the pages
 *    instead.
 * The memfd stays mapped after the MR is deregistered (it is the
 * application's memory now). The library keeps its fd while an MR uses
 * it, for at most 64 memfds (and a 16th of RLIMIT_NOFILE: the fds are the
 * application's), so that a later registration over the same pages
 * reuses it; one made after the last deregistration, or over pages
 * whose fd was not kept, takes the copy path. Moving
 * stops while the process has half of vm.max_map_count mappings, and a
 * registration the daemon refuses on the moved pages is retried on the
 * copy path. SOFTRNIC_MR=copy turns the whole mechanism off.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "srn.h"

/* The name the memfds carry, which /proc/self/maps shows. */
#define SHARE_NAME "softrnic-shared-mr"
#define SHARE_MAPS_NAME "/memfd:" SHARE_NAME " (deleted)"

/* One mapping of /proc/self/maps. */
struct vma {
	uintptr_t start, end;
	char perms[5];
	uint64_t off, ino;
	char name[80]; /* the path column, cut */
};

/* A memfd in use by MRs of this process. */
struct shared {
	struct shared *next;
	uint64_t ino;
	int fd;
	unsigned refs;
};

static pthread_mutex_t share_lock = PTHREAD_MUTEX_INITIALIZER;
static struct shared *shared_list;
static unsigned long held; /* entries of shared_list */

/* Reads /proc/self/maps with read(2) into a fixed buffer (no malloc: the
 * fork child handler uses it too), calling fn for every mapping until fn
 * returns non-zero, which is returned; -1 when the file cannot be read. */
static int maps_each(int (*fn)(const struct vma *, void *), void *arg)
{
	int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	char buf[8192];
	size_t have = 0;
	int ret = 0;
	for (;;) {
		ssize_t n = read(fd, buf + have, sizeof(buf) - 1 - have);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		have += (size_t)n;
		buf[have] = 0;
		char *line = buf, *nl;
		while ((nl = memchr(line, '\n', have - (size_t)(line - buf)))) {
			*nl = 0;
			struct vma v = {0};
			unsigned long long s, e, off, ino;
			unsigned maj, min;
			int name_at = 0;
			if (sscanf(line, "%llx-%llx %4s %llx %x:%x %llu %n", &s, &e, v.perms, &off, &maj, &min, &ino,
				   &name_at) >= 7) {
				v.start = (uintptr_t)s, v.end = (uintptr_t)e, v.off = off, v.ino = ino;
				if (name_at > 0)
					snprintf(v.name, sizeof(v.name), "%s", line + name_at);
				ret = fn(&v, arg);
				if (ret)
					goto out;
			}
			line = nl + 1;
		}
		have -= (size_t)(line - buf);
		memmove(buf, line, have);
		if (have == sizeof(buf) - 1) /* a line longer than the buffer: drop it */
			have = 0;
	}
out:
	close(fd);
	return ret;
}

static bool is_ours(const struct vma *v)
{
	return strcmp(v->name, SHARE_MAPS_NAME) == 0;
}

/* The mapping holding [start, end), and how many mappings there are. */
struct find {
	uintptr_t start, end;
	struct vma v;
	bool seen, found;
	unsigned long mappings;
};

static int find_fn(const struct vma *v, void *arg)
{
	struct find *f = arg;
	f->mappings++;
	if (!f->seen && v->end > f->start) {
		f->seen = true;
		f->found = v->start <= f->start && f->end <= v->end;
		f->v = *v;
	}
	return 0;
}

/* How many mappings the process may have before moving stops: half of
 * vm.max_map_count. Every move splits a mapping in up to three, and the
 * pieces stay after deregistration, so moving must never run the
 * program out of mappings of its own. */
static unsigned long map_budget(void)
{
	static unsigned long budget;
	if (budget)
		return budget;
	unsigned long max = 65530; /* the kernel's default */
	int fd = open("/proc/sys/vm/max_map_count", O_RDONLY | O_CLOEXEC);
	if (fd >= 0) {
		char b[32];
		ssize_t n = read(fd, b, sizeof(b) - 1);
		if (n > 0) {
			b[n] = 0;
			unsigned long v = strtoul(b, NULL, 10);
			if (v > 0)
				max = v;
		}
		close(fd);
	}
	budget = max / 2;
	return budget;
}

/* Whether the process may have pages moved, from /proc/self/status: one
 * thread (no other could write the pages between the copy and the remap)
 * and no locked memory (a move would drop an mlock(2), and the locked
 * ranges are not in /proc/self/maps). */
static bool movable(void)
{
	int fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	char b[4096];
	ssize_t n = read(fd, b, sizeof(b) - 1);
	close(fd);
	if (n <= 0)
		return false;
	b[n] = 0;
	const char *t = strstr(b, "\nThreads:"), *l = strstr(b, "\nVmLck:");
	return t && l && strtol(t + 9, NULL, 10) == 1 && strtol(l + 7, NULL, 10) == 0;
}

/* Whether the page at ps may hold a glibc malloc arena's header: a heap
 * of a thread's arena starts its mapping, aligned to HEAP_MAX_SIZE (64 MiB
 * on 64-bit). glibc's fork writes the arena's lock in the child before any
 * handler runs, which must not reach the parent's pages. */
static bool arena_header(const struct vma *v, uintptr_t ps)
{
	const uintptr_t heap_max = sizeof(long) == 8 ? 64u << 20 : 1u << 20;
	return ps == v->start && v->start % heap_max == 0;
}

/* Copies n bytes at addr into the memfd at 0 by a raw write(2): the
 * kernel reads the pages, so whole pages around an MR (an allocator's
 * headers, a sanitizer's poisoned redzones) are read without the checks
 * a libc or sanitizer wrapper would apply. */
static int copy_in(int fd, uintptr_t addr, size_t n)
{
	size_t done = 0;
	while (done < n) {
		long w = syscall(SYS_pwrite64, fd, (void *)(addr + done), n - done, (off_t)done);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return w < 0 ? errno : EIO;
		done += (size_t)w;
	}
	return 0;
}

/* ---- fork ---- */

/* Replaces a shared mapping by private anonymous memory with the same
 * contents and protection, in the fork child. */
static int privatize(const struct vma *v)
{
	size_t n = v->end - v->start;
	void *tmp = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (tmp == MAP_FAILED)
		return -1;
	for (size_t done = 0; done < n;) {
		struct iovec l = {(char *)tmp + done, n - done}, r = {(void *)(v->start + done), n - done};
		long got = syscall(SYS_process_vm_readv, getpid(), &l, 1, &r, 1, 0);
		if (got < 0 && errno == EINTR)
			continue;
		if (got <= 0) {
			munmap(tmp, n);
			return -1;
		}
		done += (size_t)got;
	}
	int prot = (v->perms[0] == 'r' ? PROT_READ : 0) | (v->perms[1] == 'w' ? PROT_WRITE : 0) |
		   (v->perms[2] == 'x' ? PROT_EXEC : 0);
	if (mprotect(tmp, n, prot) != 0 ||
	    mremap(tmp, n, n, MREMAP_MAYMOVE | MREMAP_FIXED, (void *)v->start) == MAP_FAILED) {
		munmap(tmp, n);
		return -1;
	}
	return 0;
}

struct ours {
	struct vma v[32];
	int n;
};

static int collect_fn(const struct vma *v, void *arg)
{
	struct ours *o = arg;
	if (is_ours(v))
		o->v[o->n++] = *v;
	return o->n == (int)(sizeof(o->v) / sizeof(o->v[0]));
}

static void atfork_prepare(void)
{
	pthread_mutex_lock(&share_lock);
}

static void atfork_parent(void)
{
	pthread_mutex_unlock(&share_lock);
}

/* In the child: every shared mapping becomes private, and then the fds
 * (the parent's MRs') are closed. Until a mapping is private every write
 * of the child reaches the parent: the list's nodes may lie on moved heap
 * pages, so they are freed only after. */
static void atfork_child(void)
{
	static struct ours o;
	for (int round = 0; round < 1 << 16; round++) {
		o.n = 0;
		if (maps_each(collect_fn, &o) < 0 || o.n == 0)
			break;
		for (int i = 0; i < o.n; i++) {
			if (privatize(&o.v[i]) != 0) {
				/* write(2), not stdio: another thread of the parent may
				 * have held stderr's lock at the fork. */
				char msg[160];
				int n = snprintf(msg, sizeof(msg),
						 "softrnic: fork: a registered mapping at %#lx could not be copied for "
						 "the child: unmapped in the child\n",
						 (unsigned long)o.v[i].start);
				if (getenv(SRN_DEBUG_ENV) && n > 0)
					(void)!write(STDERR_FILENO, msg, (size_t)n < sizeof(msg) ? (size_t)n : sizeof(msg) - 1);
				munmap((void *)o.v[i].start, o.v[i].end - o.v[i].start);
			}
		}
	}
	for (struct shared *s = shared_list, *next; s; s = next) {
		next = s->next;
		close(s->fd);
		free(s);
	}
	shared_list = NULL;
	held = 0;
	pthread_mutex_unlock(&share_lock);
}

/* Registered when the library loads, before the handlers of most
 * libraries a program loads after it: child handlers run in the order
 * they were registered, and one that ran before this one could write
 * moved pages the parent still shares. */
__attribute__((constructor)) static void atfork_register(void)
{
	pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

/* ---- registration ---- */

static struct shared *shared_find(uint64_t ino)
{
	for (struct shared *s = shared_list; s; s = s->next)
		if (s->ino == ino)
			return s;
	return NULL;
}

/* How many memfds the library keeps open for later MRs over the same
 * pages: the fds are the application's too (RLIMIT_NOFILE). */
static unsigned long fd_budget(void)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
		return 0;
	unsigned long b = rl.rlim_cur == RLIM_INFINITY ? 64 : rl.rlim_cur / 16;
	return b < 64 ? b : 64;
}

/* Moves the pages [ps, pe) into a new memfd, mapped in their place; under
 * share_lock. Returns the memfd or -errno. */
static int share_new(uintptr_t ps, uintptr_t pe, uint64_t *ino)
{
	int fd = memfd_create(SHARE_NAME, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -errno;
	size_t n = pe - ps;
	struct stat st;
	if (ftruncate(fd, (off_t)n) != 0 || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0 ||
	    fstat(fd, &st) != 0) {
		int err = errno;
		close(fd);
		return -err;
	}
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	int err = copy_in(fd, ps, n);
	if (!err && mmap((void *)ps, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED)
		err = errno;
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (err) {
		close(fd);
		return -err;
	}
	*ino = st.st_ino;
	return fd;
}

int srn_share(uintptr_t a, size_t length, struct srn_share *sh)
{
	const char *mode = getenv(SRN_MR_ENV);
	if (mode && strcmp(mode, "copy") == 0)
		return -1;
	long pg = sysconf(_SC_PAGESIZE);
	uintptr_t ps = a & ~(uintptr_t)(pg - 1), pe = (a + length + (uintptr_t)pg - 1) & ~(uintptr_t)(pg - 1);
	if (pe <= ps)
		return -1;
	pthread_mutex_lock(&share_lock);
	struct find f = {.start = ps, .end = pe};
	int ret = -1;
	if (maps_each(find_fn, &f) != 0 || !f.found)
		goto out;
	if (is_ours(&f.v)) {
		/* Pages an earlier MR moved: the same memfd, while one holds it. */
		struct shared *s = shared_find(f.v.ino);
		if (!s || (sh->fd = fcntl(s->fd, F_DUPFD_CLOEXEC, 0)) < 0)
			goto out;
		s->refs++;
		sh->off = f.v.off + (a - f.v.start);
		sh->ino = s->ino;
		ret = 0;
		goto out;
	}
	if (strcmp(f.v.perms, "rw-p") != 0 || f.v.ino != 0 || (f.v.name[0] && strcmp(f.v.name, "[heap]") != 0) ||
	    !movable() || f.mappings + 2 > map_budget() || arena_header(&f.v, ps))
		goto out;
	uint64_t ino = 0;
	int fd = share_new(ps, pe, &ino);
	if (fd < 0) {
		srn_debug("ibv_reg_mr: pages at %#lx stay on the copy path: %s", (unsigned long)ps, strerror(-fd));
		goto out;
	}
	sh->fd = fd;
	sh->off = a - ps;
	sh->ino = 0;
	ret = 0;
	/* Kept for later MRs over the same pages, within the budget. */
	struct shared *s = held < fd_budget() ? calloc(1, sizeof(*s)) : NULL;
	if (s && (s->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0)) >= 0) {
		s->ino = ino;
		s->refs = 1;
		s->next = shared_list;
		shared_list = s;
		held++;
		sh->ino = ino;
	} else {
		free(s);
	}
out:
	pthread_mutex_unlock(&share_lock);
	return ret;
}

void srn_unshare(uint64_t ino)
{
	if (!ino)
		return;
	pthread_mutex_lock(&share_lock);
	for (struct shared **p = &shared_list; *p; p = &(*p)->next) {
		struct shared *s = *p;
		if (s->ino == ino) {
			if (--s->refs == 0) {
				*p = s->next;
				close(s->fd);
				free(s);
				held--;
			}
			break;
		}
	}
	pthread_mutex_unlock(&share_lock);
}

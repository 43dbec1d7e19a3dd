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
 *    between the copy and the remap (signals are blocked meanwhile).
 *    A multi-threaded process registers through the copy path.
 *  - after fork() the child gets private copies of every such mapping
 *    (a pthread_atfork handler), as it would have had of the anonymous
 *    pages; a mapping that cannot be copied is unmapped in the child, as
 *    MADV_DONTFORK does under rdma-core's ibv_fork_init. Children made
 *    without fork() (_Fork, a raw clone without CLONE_VM) would share the
 *    pages instead.
 * The memfd stays mapped after the MR is deregistered (it is the
 * application's memory now); the library holds its fd only while an MR
 * uses it, so a later registration over the same pages reuses it, and
 * one made after the last deregistration takes the copy path. Moving
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
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

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

/* The number of threads of this process, from /proc/self/stat; 0 when
 * it cannot be read. */
static long threads(void)
{
	int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	char b[1024];
	ssize_t n = read(fd, b, sizeof(b) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	b[n] = 0;
	char *p = strrchr(b, ')');
	if (!p)
		return 0;
	/* num_threads is the 18th field after the command's ')'. */
	for (int i = 0; i < 18 && p; i++)
		p = strchr(p + 1, ' ');
	return p ? strtol(p + 1, NULL, 10) : 0;
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

/* In the child: every shared mapping becomes private, and the fds (the
 * parent's MRs') are closed. */
static void atfork_child(void)
{
	for (struct shared *s = shared_list, *next; s; s = next) {
		next = s->next;
		close(s->fd);
		free(s);
	}
	shared_list = NULL;
	static struct ours o;
	for (int round = 0; round < 1 << 16; round++) {
		o.n = 0;
		if (maps_each(collect_fn, &o) < 0 || o.n == 0)
			break;
		for (int i = 0; i < o.n; i++) {
			if (privatize(&o.v[i]) != 0) {
				srn_debug("fork: a registered mapping at %#lx could not be copied for the child: "
					  "unmapped in the child",
					  (unsigned long)o.v[i].start);
				munmap((void *)o.v[i].start, o.v[i].end - o.v[i].start);
			}
		}
	}
	pthread_mutex_unlock(&share_lock);
}

static void atfork_register(void)
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

/* Moves the pages under [a, a+length) into a new memfd, mapped in their
 * place; under share_lock. */
static int share_new(uintptr_t ps, uintptr_t pe, struct shared **out)
{
	int fd = memfd_create(SHARE_NAME, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return errno;
	size_t n = pe - ps;
	int err = 0;
	struct stat st;
	struct shared *s = calloc(1, sizeof(*s));
	if (!s || ftruncate(fd, (off_t)n) != 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0 || fstat(fd, &st) != 0) {
		err = s ? errno : ENOMEM;
		goto fail;
	}
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	err = copy_in(fd, ps, n);
	if (!err && mmap((void *)ps, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED)
		err = errno;
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (err)
		goto fail;
	s->ino = st.st_ino;
	s->fd = fd;
	s->next = shared_list;
	shared_list = s;
	*out = s;
	return 0;
fail:
	free(s);
	close(fd);
	return err;
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
	pthread_once(&atfork_once, atfork_register);
	pthread_mutex_lock(&share_lock);
	struct find f = {.start = ps, .end = pe};
	int ret = -1;
	struct shared *s = NULL;
	if (maps_each(find_fn, &f) != 0 || !f.found)
		goto out;
	if (is_ours(&f.v)) {
		/* Pages an earlier MR moved: the same memfd, while one holds it. */
		s = shared_find(f.v.ino);
		if (!s)
			goto out;
		sh->off = f.v.off + (a - f.v.start);
	} else {
		if (strcmp(f.v.perms, "rw-p") != 0 || f.v.ino != 0 ||
		    (f.v.name[0] && strcmp(f.v.name, "[heap]") != 0) || threads() != 1 ||
		    f.mappings + 2 > map_budget())
			goto out;
		int err = share_new(ps, pe, &s);
		if (err) {
			srn_debug("ibv_reg_mr: pages at %#lx stay on the copy path: %s", (unsigned long)ps,
				  strerror(err));
			goto out;
		}
		sh->off = a - ps;
	}
	s->refs++;
	sh->fd = s->fd;
	sh->ino = s->ino;
	ret = 0;
out:
	pthread_mutex_unlock(&share_lock);
	return ret;
}

void srn_unshare(uint64_t ino)
{
	pthread_mutex_lock(&share_lock);
	for (struct shared **p = &shared_list; *p; p = &(*p)->next) {
		struct shared *s = *p;
		if (s->ino == ino) {
			if (--s->refs == 0) {
				*p = s->next;
				close(s->fd);
				free(s);
			}
			break;
		}
	}
	pthread_mutex_unlock(&share_lock);
}

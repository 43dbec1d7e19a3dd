/*
 * rsockets, the socket API over RDMA. softrnic has none: rsocket() fails
 * with EOPNOTSUPP (rdma-core's answer to a socket it cannot make), so no
 * descriptor is ever an rsocket and the calls on one fail with EBADF, as
 * rdma-core's do for a descriptor that is not an rsocket. rpoll and
 * rselect, which rping, udaddy and the other tools call on ordinary
 * descriptors (an event channel's fd), are poll and select, as rdma-core's
 * are for descriptors that are not rsockets.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <rdma/rsocket.h>
#include <sys/select.h>

#include "scm.h"

SCM_EXPORT int rpoll(struct pollfd *fds, nfds_t nfds, int timeout)
{
	return poll(fds, nfds, timeout);
}

SCM_EXPORT int rselect(int nfds, fd_set *readfds, fd_set *writefds, fd_set *exceptfds, struct timeval *timeout)
{
	return select(nfds, readfds, writefds, exceptfds, timeout);
}

SCM_EXPORT int rsocket(int domain, int type, int protocol)
{
	(void)domain, (void)type, (void)protocol;
	return scm_err(EOPNOTSUPP);
}

#define NOT_AN_RSOCKET(ret_type, name, params, ...)       \
	SCM_EXPORT ret_type name params                   \
	{                                                 \
		(void)socket, __VA_ARGS__;                \
		errno = EBADF;                            \
		return (ret_type)-1;                      \
	}

NOT_AN_RSOCKET(int, rbind, (int socket, const struct sockaddr *addr, socklen_t addrlen), (void)addr, (void)addrlen)
NOT_AN_RSOCKET(int, rlisten, (int socket, int backlog), (void)backlog)
NOT_AN_RSOCKET(int, raccept, (int socket, struct sockaddr *addr, socklen_t *addrlen), (void)addr, (void)addrlen)
NOT_AN_RSOCKET(int, rconnect, (int socket, const struct sockaddr *addr, socklen_t addrlen), (void)addr,
	       (void)addrlen)
NOT_AN_RSOCKET(int, rshutdown, (int socket, int how), (void)how)
NOT_AN_RSOCKET(int, rclose, (int socket), (void)0)
NOT_AN_RSOCKET(ssize_t, rrecv, (int socket, void *buf, size_t len, int flags), (void)buf, (void)len, (void)flags)
NOT_AN_RSOCKET(ssize_t, rrecvfrom,
	       (int socket, void *buf, size_t len, int flags, struct sockaddr *src_addr, socklen_t *addrlen),
	       (void)buf, (void)len, (void)flags, (void)src_addr, (void)addrlen)
NOT_AN_RSOCKET(ssize_t, rrecvmsg, (int socket, struct msghdr *msg, int flags), (void)msg, (void)flags)
NOT_AN_RSOCKET(ssize_t, rsend, (int socket, const void *buf, size_t len, int flags), (void)buf, (void)len,
	       (void)flags)
NOT_AN_RSOCKET(ssize_t, rsendto,
	       (int socket, const void *buf, size_t len, int flags, const struct sockaddr *dest_addr,
		socklen_t addrlen),
	       (void)buf, (void)len, (void)flags, (void)dest_addr, (void)addrlen)
NOT_AN_RSOCKET(ssize_t, rsendmsg, (int socket, const struct msghdr *msg, int flags), (void)msg, (void)flags)
NOT_AN_RSOCKET(ssize_t, rread, (int socket, void *buf, size_t count), (void)buf, (void)count)
NOT_AN_RSOCKET(ssize_t, rreadv, (int socket, const struct iovec *iov, int iovcnt), (void)iov, (void)iovcnt)
NOT_AN_RSOCKET(ssize_t, rwrite, (int socket, const void *buf, size_t count), (void)buf, (void)count)
NOT_AN_RSOCKET(ssize_t, rwritev, (int socket, const struct iovec *iov, int iovcnt), (void)iov, (void)iovcnt)
NOT_AN_RSOCKET(int, rgetpeername, (int socket, struct sockaddr *addr, socklen_t *addrlen), (void)addr,
	       (void)addrlen)
NOT_AN_RSOCKET(int, rgetsockname, (int socket, struct sockaddr *addr, socklen_t *addrlen), (void)addr,
	       (void)addrlen)
NOT_AN_RSOCKET(int, rsetsockopt, (int socket, int level, int optname, const void *optval, socklen_t optlen),
	       (void)level, (void)optname, (void)optval, (void)optlen)
NOT_AN_RSOCKET(int, rgetsockopt, (int socket, int level, int optname, void *optval, socklen_t *optlen),
	       (void)level, (void)optname, (void)optval, (void)optlen)
NOT_AN_RSOCKET(int, rfcntl, (int socket, int cmd, ...), (void)cmd)
NOT_AN_RSOCKET(off_t, riomap, (int socket, void *buf, size_t len, int prot, int flags, off_t offset), (void)buf,
	       (void)len, (void)prot, (void)flags, (void)offset)
NOT_AN_RSOCKET(int, riounmap, (int socket, void *buf, size_t len), (void)buf, (void)len)
NOT_AN_RSOCKET(size_t, riowrite, (int socket, const void *buf, size_t count, off_t offset, int flags), (void)buf,
	       (void)count, (void)offset, (void)flags)

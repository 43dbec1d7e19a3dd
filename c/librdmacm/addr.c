/*
 * Addresses: IP addresses as the device's RoCE v2 GIDs, the source GID
 * toward a destination, and rdma_getaddrinfo.
 *
 * The source is what the kernel's rdma_cm would take: the address this
 * namespace's routing sends from, when that is one of the device's GIDs
 * (the daemon's interface is here); a destination with no route fails at
 * once, one routed through another interface gets ADDR_ERROR (-ENODEV).
 * An application in a namespace without the daemon's interface gets the
 * device's first GID of the destination's family instead.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "scm.h"

/* RoCE v2's UDP port: any port would do for a connect that sends
 * nothing. */
#define SCM_PROBE_PORT 4791

socklen_t scm_addr_len(const struct sockaddr *sa)
{
	if (!sa)
		return 0;
	switch (sa->sa_family) {
	case AF_INET: return sizeof(struct sockaddr_in);
	case AF_INET6: return sizeof(struct sockaddr_in6);
	default: return 0; /* AF_IB addressing is not served */
	}
}

bool scm_addr_any(const struct sockaddr *sa)
{
	if (sa->sa_family == AF_INET)
		return ((const struct sockaddr_in *)sa)->sin_addr.s_addr == htonl(INADDR_ANY);
	return IN6_IS_ADDR_UNSPECIFIED(&((const struct sockaddr_in6 *)sa)->sin6_addr);
}

uint16_t scm_addr_port(const struct sockaddr *sa)
{
	if (sa->sa_family == AF_INET)
		return ntohs(((const struct sockaddr_in *)sa)->sin_port);
	if (sa->sa_family == AF_INET6)
		return ntohs(((const struct sockaddr_in6 *)sa)->sin6_port);
	return 0;
}

void scm_addr_set_port(struct sockaddr *sa, uint16_t port)
{
	if (sa->sa_family == AF_INET)
		((struct sockaddr_in *)sa)->sin_port = htons(port);
	else if (sa->sa_family == AF_INET6)
		((struct sockaddr_in6 *)sa)->sin6_port = htons(port);
}

static const uint8_t v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};

void scm_addr_gid(const struct sockaddr *sa, union ibv_gid *gid)
{
	memset(gid, 0, sizeof(*gid));
	if (sa->sa_family == AF_INET) {
		memcpy(gid->raw, v4mapped, sizeof(v4mapped));
		memcpy(gid->raw + 12, &((const struct sockaddr_in *)sa)->sin_addr, 4);
	} else if (sa->sa_family == AF_INET6) {
		memcpy(gid->raw, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
	}
}

void scm_gid_addr(const union ibv_gid *gid, uint16_t port, struct sockaddr_storage *ss)
{
	memset(ss, 0, sizeof(*ss));
	if (!memcmp(gid->raw, v4mapped, sizeof(v4mapped))) {
		struct sockaddr_in *in = (struct sockaddr_in *)ss;
		in->sin_family = AF_INET;
		in->sin_port = htons(port);
		memcpy(&in->sin_addr, gid->raw + 12, 4);
		return;
	}
	struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;
	in6->sin6_family = AF_INET6;
	in6->sin6_port = htons(port);
	memcpy(&in6->sin6_addr, gid->raw, 16);
}

bool scm_addr_equal(const struct sockaddr *a, const struct sockaddr *b)
{
	union ibv_gid ga, gb;
	scm_addr_gid(a, &ga);
	scm_addr_gid(b, &gb);
	return !memcmp(&ga, &gb, sizeof(ga));
}

static bool gid_is_v4(const union ibv_gid *g)
{
	return !memcmp(g->raw, v4mapped, sizeof(v4mapped));
}

static bool gid_link_local(const union ibv_gid *g)
{
	return g->raw[0] == 0xfe && (g->raw[1] & 0xc0) == 0x80;
}

/* Whether an interface of this namespace has one of the device's GIDs:
 * then its routing table is the daemon's. */
static bool device_here(void)
{
	struct ifaddrs *ifs;
	if (getifaddrs(&ifs) < 0)
		return false;
	bool here = false;
	for (struct ifaddrs *i = ifs; i && !here; i = i->ifa_next) {
		if (!i->ifa_addr || !scm_addr_len(i->ifa_addr))
			continue;
		union ibv_gid g;
		scm_addr_gid(i->ifa_addr, &g);
		pthread_mutex_lock(&scm_lock);
		here = scm_gid_index(&g) >= 0;
		pthread_mutex_unlock(&scm_lock);
	}
	freeifaddrs(ifs);
	return here;
}

int scm_route_source(const struct sockaddr *dst, int *idx, bool *sync)
{
	union ibv_gid dg;
	scm_addr_gid(dst, &dg);
	*sync = false;
	if (device_here()) {
		/* The kernel's choice of source, from a connect that sends
		 * nothing. */
		struct sockaddr_storage d, src;
		socklen_t len = scm_addr_len(dst), slen = sizeof(src);
		memcpy(&d, dst, len);
		if (!scm_addr_port((struct sockaddr *)&d))
			scm_addr_set_port((struct sockaddr *)&d, SCM_PROBE_PORT);
		int fd = socket(dst->sa_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
		if (fd < 0)
			return errno;
		if (connect(fd, (struct sockaddr *)&d, len) < 0 || getsockname(fd, (struct sockaddr *)&src, &slen) < 0) {
			int err = errno;
			close(fd);
			*sync = true;
			return err;
		}
		close(fd);
		union ibv_gid sg;
		scm_addr_gid((struct sockaddr *)&src, &sg);
		pthread_mutex_lock(&scm_lock);
		*idx = scm_gid_index(&sg);
		pthread_mutex_unlock(&scm_lock);
		return *idx >= 0 ? 0 : ENODEV;
	}
	/* Elsewhere: the first GID of the family, for IPv6 of the same
	 * scope if there is one. */
	pthread_mutex_lock(&scm_lock);
	int best = -1;
	for (int i = 0; i < scm_dev.ngids; i++) {
		const union ibv_gid *g = &scm_dev.gids[i];
		if (gid_is_v4(g) != gid_is_v4(&dg))
			continue;
		if (best < 0)
			best = i;
		if (!gid_is_v4(g) && gid_link_local(g) == gid_link_local(&dg)) {
			best = i;
			break;
		}
	}
	pthread_mutex_unlock(&scm_lock);
	*idx = best;
	return best >= 0 ? 0 : ENODEV;
}

/* ---- rdma_getaddrinfo ---- */

static int copy_addr(struct sockaddr **dst, socklen_t *dst_len, const struct sockaddr *src, socklen_t len)
{
	*dst = malloc(len);
	if (!*dst)
		return scm_err(ENOMEM);
	memcpy(*dst, src, len);
	*dst_len = len;
	return 0;
}

/* The getaddrinfo hints an rdma_addrinfo's hints stand for. */
static void to_ai_hints(const struct rdma_addrinfo *h, struct addrinfo *ai)
{
	memset(ai, 0, sizeof(*ai));
	if (h->ai_flags & RAI_PASSIVE)
		ai->ai_flags = AI_PASSIVE;
	if (h->ai_flags & RAI_NUMERICHOST)
		ai->ai_flags |= AI_NUMERICHOST;
	ai->ai_family = h->ai_family;
	switch (h->ai_qp_type) {
	case IBV_QPT_RC:
	case IBV_QPT_UC:
	case IBV_QPT_XRC_SEND:
	case IBV_QPT_XRC_RECV: ai->ai_socktype = SOCK_STREAM; break;
	case IBV_QPT_UD: ai->ai_socktype = SOCK_DGRAM; break;
	default: break;
	}
	switch (h->ai_port_space) {
	case RDMA_PS_TCP: ai->ai_protocol = IPPROTO_TCP; break;
	case RDMA_PS_UDP:
	case RDMA_PS_IPOIB: ai->ai_protocol = IPPROTO_UDP; break;
	case RDMA_PS_IB:
		ai->ai_protocol = ai->ai_socktype == SOCK_STREAM  ? IPPROTO_TCP
				  : ai->ai_socktype == SOCK_DGRAM ? IPPROTO_UDP
								  : 0;
		break;
	default: break;
	}
}

/* Fills rai from getaddrinfo's first answer. */
static int from_ai(struct rdma_addrinfo *rai, const struct rdma_addrinfo *h, const struct addrinfo *ai)
{
	rai->ai_qp_type = h->ai_qp_type ? h->ai_qp_type
		      : ai->ai_socktype == SOCK_STREAM ? IBV_QPT_RC
		      : ai->ai_socktype == SOCK_DGRAM ? IBV_QPT_UD
						       : 0;
	if (h->ai_port_space)
		rai->ai_port_space = h->ai_port_space;
	else if (ai->ai_protocol == IPPROTO_TCP)
		rai->ai_port_space = RDMA_PS_TCP;
	else if (ai->ai_protocol == IPPROTO_UDP)
		rai->ai_port_space = RDMA_PS_UDP;
	rai->ai_family = ai->ai_family;
	if (ai->ai_flags & AI_PASSIVE) {
		rai->ai_flags = RAI_PASSIVE;
		if (ai->ai_canonname && !(rai->ai_src_canonname = strdup(ai->ai_canonname)))
			return scm_err(ENOMEM);
		return copy_addr(&rai->ai_src_addr, &rai->ai_src_len, ai->ai_addr, ai->ai_addrlen);
	}
	if (ai->ai_canonname && !(rai->ai_dst_canonname = strdup(ai->ai_canonname)))
		return scm_err(ENOMEM);
	return copy_addr(&rai->ai_dst_addr, &rai->ai_dst_len, ai->ai_addr, ai->ai_addrlen);
}

SCM_EXPORT int rdma_getaddrinfo(const char *node, const char *service, const struct rdma_addrinfo *hints,
				struct rdma_addrinfo **res)
{
	static const struct rdma_addrinfo nohints;
	if (!node && !service && !hints)
		return scm_err(EINVAL);
	if (scm_init())
		return -1;
	if (!hints)
		hints = &nohints;
	/* AF_IB addresses (RAI_FAMILY with AF_IB) need an InfiniBand
	 * fabric: not here. */
	if (hints->ai_family == AF_IB)
		return EAI_FAMILY;
	struct rdma_addrinfo *rai = calloc(1, sizeof(*rai));
	if (!rai)
		return scm_err(ENOMEM);
	int ret = 0;
	if (node || service) {
		struct addrinfo aih, *ai;
		to_ai_hints(hints, &aih);
		ret = getaddrinfo(node, service, hints == &nohints ? NULL : &aih, &ai);
		if (ret) {
			free(rai);
			return ret; /* an EAI_ code, as rdma-core returns it */
		}
		ret = from_ai(rai, hints, ai);
		freeaddrinfo(ai);
	} else {
		rai->ai_flags = hints->ai_flags;
		rai->ai_family = hints->ai_family;
		rai->ai_qp_type = hints->ai_qp_type;
		rai->ai_port_space = hints->ai_port_space;
		if (hints->ai_dst_len)
			ret = copy_addr(&rai->ai_dst_addr, &rai->ai_dst_len, hints->ai_dst_addr, hints->ai_dst_len);
	}
	if (!ret && !rai->ai_src_len && hints->ai_src_len)
		ret = copy_addr(&rai->ai_src_addr, &rai->ai_src_len, hints->ai_src_addr, hints->ai_src_len);
	if (ret) {
		rdma_freeaddrinfo(rai);
		return ret;
	}
	*res = rai;
	return 0;
}

SCM_EXPORT void rdma_freeaddrinfo(struct rdma_addrinfo *res)
{
	while (res) {
		struct rdma_addrinfo *next = res->ai_next;
		free(res->ai_connect);
		free(res->ai_route);
		free(res->ai_src_canonname);
		free(res->ai_dst_canonname);
		free(res->ai_src_addr);
		free(res->ai_dst_addr);
		free(res);
		res = next;
	}
}

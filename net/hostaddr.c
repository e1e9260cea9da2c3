/* The host's own addresses: whether the host would deliver a destination to itself, asked of the
 * kernel's routing (netlink RTM_GETROUTE) at each connect, so that an address added since counts.
 */
#include "config.h"

#include <errno.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "cowbox/net.h"

#define ROUTE_ANSWER_TIMEOUT_MS 1000 /* the kernel answers at once; this only bounds a bug */

/* The address to ask about: IPv4-mapped IPv6 (::ffff:a.b.c.d) folded to IPv4, which is
 * where the kernel delivers it. */
static int dest_of(const struct sockaddr *sa, uint8_t out[16], size_t *len)
{
	static const uint8_t mapped[12] = {[10] = 0xff, [11] = 0xff};

	if (sa->sa_family == AF_INET) {
		memcpy(out, &((const struct sockaddr_in *)sa)->sin_addr, 4);
		*len = 4;
		return AF_INET;
	}
	if (sa->sa_family != AF_INET6)
		return -1;
	memcpy(out, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
	if (!memcmp(out, mapped, 12)) {
		memmove(out, out + 12, 4);
		*len = 4;
		return AF_INET;
	}
	*len = 16;
	return AF_INET6;
}

/* The answer to request seq on fd, which may first hold answers to earlier questions that
 * timed out: 1 local, 0 not, -errno with a message. */
static int route_answer(int fd, uint32_t seq)
{
	union {
		struct nlmsghdr n;
		char buf[8192];
	} ans;

	for (;;) {
		struct pollfd pf = {.fd = fd, .events = POLLIN};
		ssize_t n;

		if (poll(&pf, 1, ROUTE_ANSWER_TIMEOUT_MS) != 1)
			return cb_error_set(ETIMEDOUT, "host addresses: netlink gave no answer");
		n = recv(fd, &ans, sizeof ans, 0);
		if (n < 0)
			return cb_error_set(errno, "host addresses: netlink: %s", strerror(errno));
		for (struct nlmsghdr *h = &ans.n; NLMSG_OK(h, (size_t)n); h = NLMSG_NEXT(h, n)) {
			if (h->nlmsg_seq != seq)
				continue;
			if (h->nlmsg_type == NLMSG_ERROR) {
				const struct nlmsgerr *e = NLMSG_DATA(h);

				/* no route at all (unreachable): certainly not the host's own */
				if (e->error == -ENETUNREACH || e->error == -EHOSTUNREACH ||
				    !e->error)
					return 0;
				return cb_error_set(-e->error, "host addresses: netlink: %s",
						    strerror(-e->error));
			}
			if (h->nlmsg_type == RTM_NEWROUTE) {
				const struct rtmsg *r = NLMSG_DATA(h);

				/* a local route: an address of one of its interfaces (or a range
				 * it claims, as AnyIP does); a broadcast one is delivered to it as
				 * well */
				return r->rtm_type == RTN_LOCAL || r->rtm_type == RTN_BROADCAST;
			}
		}
	}
}

int cb_net_host_own(int *nl, const struct sockaddr *sa)
{
	static uint32_t next_seq;
	struct {
		struct nlmsghdr n;
		struct rtmsg r;
		struct rtattr a;
		uint8_t addr[16];
	} req;
	struct sockaddr_nl kernel = {.nl_family = AF_NETLINK};
	uint8_t addr[16];
	size_t alen;
	int fam = dest_of(sa, addr, &alen), rc;

	if (fam < 0)
		return cb_error_set(EAFNOSUPPORT, "host addresses: not an IP address");
	memset(&req, 0, sizeof req);
	req.n.nlmsg_len = (uint32_t)(NLMSG_LENGTH(sizeof req.r) + RTA_LENGTH(alen));
	req.n.nlmsg_type = RTM_GETROUTE;
	req.n.nlmsg_flags = NLM_F_REQUEST;
	req.n.nlmsg_seq = __atomic_add_fetch(&next_seq, 1, __ATOMIC_RELAXED);
	req.r.rtm_family = (unsigned char)fam;
	req.r.rtm_dst_len = (unsigned char)(alen * 8);
	req.a.rta_type = RTA_DST;
	req.a.rta_len = (unsigned short)RTA_LENGTH(alen);
	memcpy(req.addr, addr, alen);
	/* the caller's socket, kept between questions: a netlink socket's close alone costs
	 * about as much as the question */
	if (*nl < 0 && (*nl = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE)) < 0)
		return cb_error_set(errno, "host addresses: netlink: %s", strerror(errno));
	if (sendto(*nl, &req, req.n.nlmsg_len, 0, (struct sockaddr *)&kernel, sizeof kernel) < 0)
		rc = cb_error_set(errno, "host addresses: netlink: %s", strerror(errno));
	else
		rc = route_answer(*nl, req.n.nlmsg_seq);
	if (rc < 0) { /* a fresh socket next time: nothing stale waits there */
		close(*nl);
		*nl = -1;
	}
	return rc;
}

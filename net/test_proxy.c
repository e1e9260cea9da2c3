/* Unit tests of the egress proxy's event loops, on real loopback sockets: connections handed
 * out over several loops, a stop with tunnels open on all of them, no fd left after either. */
#include "config.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "cowbox/net.h"
#include "net/proxy_conn.h"

#define LOOPS 3
#define MAXC  256

/* A destination on 127.0.0.1 that keeps each connection until its peer ends it. */
struct dest {
	int lfd, port, stop;
	struct pollfd p[MAXC + 1]; /* [0]: the listener */
	nfds_t n;
	pthread_t thread;
};

static void *dest_main(void *arg)
{
	struct dest *d = arg;
	char buf[4096];

	d->p[0] = (struct pollfd){.fd = d->lfd, .events = POLLIN};
	d->n = 1;
	while (!__atomic_load_n(&d->stop, __ATOMIC_RELAXED)) {
		if (poll(d->p, d->n, 50) <= 0)
			continue;
		for (nfds_t i = d->n - 1; i > 0; i--)
			if (d->p[i].revents && read(d->p[i].fd, buf, sizeof buf) <= 0) {
				close(d->p[i].fd);
				d->p[i] = d->p[--d->n];
			}
		if (d->p[0].revents) {
			int fd = accept4(d->lfd, NULL, NULL, SOCK_CLOEXEC);

			if (fd >= 0 && d->n <= MAXC)
				d->p[d->n++] = (struct pollfd){.fd = fd, .events = POLLIN};
			else if (fd >= 0)
				close(fd);
		}
	}
	return NULL;
}

/* A listening socket on 127.0.0.1, its port in *port. */
static int listen_lo(int *port)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof sa;
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	cr_assert(fd >= 0);
	cr_assert(bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0, "%s", strerror(errno));
	cr_assert(listen(fd, 512) == 0);
	cr_assert(getsockname(fd, (struct sockaddr *)&sa, &len) == 0);
	*port = ntohs(sa.sin_port);
	return fd;
}

static int fd_count(void)
{
	DIR *d = opendir("/proc/self/fd");
	int n = 0;

	cr_assert(d);
	while (readdir(d))
		n++;
	closedir(d);
	return n;
}

static int records;

static void count_record(void *arg, const struct cb_net_record *r)
{
	(void)arg;
	cr_expect(r->allowed, "refused: %s", r->rule);
	__atomic_add_fetch(&records, 1, __ATOMIC_RELAXED);
}

static struct dest dest;
static struct cb_net_proxy *proxy;
static int proxy_port;

static void start(void)
{
	struct cb_net_proxy_config cfg = {.record = count_record, .loops = LOOPS};
	struct cb_net_policy *pol;
	char entry[64], *entries[1] = {entry};

	dest.lfd = listen_lo(&dest.port);
	cr_assert(pthread_create(&dest.thread, NULL, dest_main, &dest) == 0);
	snprintf(entry, sizeof entry, "127.0.0.1:%d", dest.port); /* named: loopback allowed */
	cr_assert(cb_net_policy_new(CB_NET_POLICY_ALLOW, entries, 1, &pol) == 0, "%s",
		  cb_error_message());
	cfg.policy = pol;
	cfg.listen_fd = listen_lo(&proxy_port);
	cr_assert(cb_net_proxy_start(&cfg, &proxy) == 0, "%s", cb_error_message());
	cb_net_policy_free(pol);
	cr_assert_eq(cb_net_proxy_loops(proxy), LOOPS);
}

static void stop_dest(void)
{
	__atomic_store_n(&dest.stop, 1, __ATOMIC_RELAXED);
	pthread_join(dest.thread, NULL);
	for (nfds_t i = 0; i < dest.n; i++)
		close(dest.p[i].fd); /* the listener's among them */
	memset(&dest, 0, sizeof dest);
}

/* A tunnel to the destination through the proxy, its 200 read: the client's socket. */
static int tunnel(void)
{
	struct sockaddr_in sa = {.sin_family = AF_INET,
				 .sin_port = htons(proxy_port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	char req[128], buf[256];
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	size_t got = 0;

	cr_assert(connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0, "%s", strerror(errno));
	snprintf(req, sizeof req, "CONNECT 127.0.0.1:%d HTTP/1.1\r\n\r\n", dest.port);
	cr_assert(write(fd, req, strlen(req)) == (ssize_t)strlen(req));
	while (got < sizeof buf - 1 && !memmem(buf, got, "\r\n\r\n", 4)) {
		ssize_t n = read(fd, buf + got, sizeof buf - 1 - got);

		cr_assert(n > 0, "the proxy closed before its answer");
		got += (size_t)n;
	}
	buf[got] = 0;
	cr_assert(!strncmp(buf, "HTTP/1.1 200", 12), "%s", buf);
	return fd;
}

static void wait_open(size_t want)
{
	for (int i = 0; i < 500 && cb_net_proxy_open_count(proxy) != want; i++)
		usleep(10000);
	cr_assert_eq(cb_net_proxy_open_count(proxy), want);
}

Test(loops, connections_spread_and_stop_with_tunnels_open_leaks_no_fd)
{
	int base = fd_count(), fds[MAXC];
	size_t n = 48, sum = 0, least = MAXC, most = 0;

	records = 0;
	start();
	/* held open, so loop 0 (the acceptor) hands each new one to a loop with fewer */
	for (size_t i = 0; i < n; i++)
		fds[i] = tunnel();
	for (int i = 0; i < LOOPS; i++) {
		size_t o = cb_net_proxy_loop_open(proxy, i);

		sum += o;
		least = o < least ? o : least;
		most = o > most ? o : most;
	}
	cr_expect_eq(sum, n);
	cr_expect(least > 0 && most - least <= 2, "loops open %zu to %zu", least, most);
	wait_open(n);
	cb_net_proxy_stop(proxy); /* every loop closes and records its own */
	cr_expect_eq(records, (int)n);
	for (size_t i = 0; i < n; i++) {
		char c;

		cr_expect_eq(read(fds[i], &c, 1), 0, "tunnel %zu not closed by the stop", i);
		close(fds[i]);
	}
	stop_dest();
	cr_expect_eq(fd_count(), base);
}

Test(loops, closed_tunnels_leave_no_fd)
{
	int base = fd_count(), running;

	records = 0;
	start();
	running = fd_count();
	for (int round = 0; round < 10; round++) {
		int fds[20];

		for (int k = 0; k < 20; k++)
			fds[k] = tunnel();
		for (int k = 0; k < 20; k++)
			close(fds[k]);
	}
	wait_open(0);
	/* a loop keeps one connection's two pipes while idle, no more (the destination closes
	 * its ends as it reads their EOF) */
	for (int i = 0; i < 500 && fd_count() > running + 4 * LOOPS; i++)
		usleep(10000);
	cr_expect_leq(fd_count(), running + 4 * LOOPS, "fds %d, %d with the proxy idle", fd_count(),
		      running);
	cb_net_proxy_stop(proxy);
	cr_expect_eq(records, 200);
	stop_dest();
	cr_expect_eq(fd_count(), base);
}

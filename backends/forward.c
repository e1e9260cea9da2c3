/* host_url forwarders: a listener on 127.0.0.1:PORT made inside a sandbox's network namespace
 * and relayed from the daemon to the same port on the host, so only that port is reachable. */
#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "backends/common.h"
#include "cowbox/backend.h"
#include "cowbox/error.h"

struct cb_forwarder {
	int port;
	int listen_fd;
	pthread_t thread;
	struct cb_relays *relays; /* its connections, shut down with it */
	struct cb_forwarder *next;
};

static int loopback_up(void)
{
	struct ifreq ifr = {0};
	int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0), rc = 0;

	if (s < 0)
		return cb_error_set(errno, "netns: socket: %s", strerror(errno));
	snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "lo");
	if (ioctl(s, SIOCGIFFLAGS, &ifr) < 0)
		rc = cb_error_set(errno, "netns: lo flags: %s", strerror(errno));
	ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
	if (!rc && ioctl(s, SIOCSIFFLAGS, &ifr) < 0)
		rc = cb_error_set(errno, "netns: bring lo up: %s", strerror(errno));
	close(s);
	return rc;
}

/* Only this thread moves; the namespace lives on as the returned fd. */
int cb_netns_new(int *out)
{
	int home = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC), rc = 0, fd = -1;

	*out = -1;
	if (home < 0)
		return cb_error_set(errno, "netns: open own namespace: %s", strerror(errno));
	if (unshare(CLONE_NEWNET) < 0) {
		rc = cb_error_set(errno, "netns: unshare: %s", strerror(errno));
		goto out;
	}
	rc = loopback_up();
	if (!rc && (fd = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC)) < 0)
		rc = cb_error_set(errno, "netns: open new namespace: %s", strerror(errno));
	if (setns(home, CLONE_NEWNET) < 0 && !rc)
		rc = cb_error_set(errno, "netns: return to own namespace: %s", strerror(errno));
	if (rc && fd >= 0)
		close(fd);
	else
		*out = fd;
out:
	close(home);
	return rc;
}

static void *forwarder_main(void *arg)
{
	struct cb_forwarder *f = arg;

	for (;;) {
		int c = accept4(f->listen_fd, NULL, NULL, SOCK_CLOEXEC), up;
		struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(f->port)};

		if (c < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			break; /* shut down */
		}
		/* This thread lives in the daemon's namespace: the connect reaches the host. */
		sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		up = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (up < 0 || connect(up, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
		    cb_relay_start(f->relays, c, up) < 0) {
			close(c);
			if (up >= 0)
				close(up);
		}
	}
	return NULL;
}

/* The listening socket belongs to the namespace it was made in, whichever thread uses it. */
static int listen_in(int netns_fd, int port, int *out)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
	int home = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC), fd = -1, one = 1, rc = 0;

	if (home < 0)
		return cb_error_set(errno, "host_url: open own namespace: %s", strerror(errno));
	if (setns(netns_fd, CLONE_NEWNET) < 0) {
		rc = cb_error_set(errno, "host_url: enter the sandbox's network: %s",
				  strerror(errno));
		goto out;
	}
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
	    bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, 64) < 0)
		rc = cb_error_set(errno, "host_url: listen on 127.0.0.1:%d in the sandbox: %s",
				  port, strerror(errno));
	if (setns(home, CLONE_NEWNET) < 0 && !rc)
		rc = cb_error_set(errno, "host_url: return to own namespace: %s", strerror(errno));
out:
	close(home);
	if (rc && fd >= 0)
		close(fd);
	else
		*out = fd;
	return rc;
}

int cb_netns_listen(int netns_fd, int port, int *out)
{
	return listen_in(netns_fd, port, out);
}

int cb_forwarder_add(struct cb_backend *b, int netns_fd, int port)
{
	struct cb_forwarder *f;
	int rc = 0;

	if (port < 1 || port > 65535)
		return cb_error_set(EINVAL, "host_url: port %d is not in 1-65535", port);
	pthread_mutex_lock(&b->lock);
	for (f = b->fwd; f; f = f->next)
		if (f->port == port)
			goto out;
	f = calloc(1, sizeof(*f));
	if (!f) {
		rc = cb_error_set(ENOMEM, "host_url: out of memory");
		goto out;
	}
	f->port = port;
	if ((rc = cb_relays_new(&f->relays)) < 0) {
		free(f);
		goto out;
	}
	if ((rc = listen_in(netns_fd, port, &f->listen_fd)) < 0) {
		cb_relays_close(f->relays);
		free(f);
		goto out;
	}
	if ((rc = pthread_create(&f->thread, NULL, forwarder_main, f))) {
		close(f->listen_fd);
		cb_relays_close(f->relays);
		free(f);
		rc = cb_error_set(rc, "host_url: thread: %s", strerror(rc));
		goto out;
	}
	f->next = b->fwd;
	b->fwd = f;
out:
	pthread_mutex_unlock(&b->lock);
	return rc;
}

void cb_forwarder_stop_all(struct cb_backend *b)
{
	struct cb_forwarder *f, *next;

	pthread_mutex_lock(&b->lock);
	f = b->fwd;
	b->fwd = NULL;
	pthread_mutex_unlock(&b->lock);
	for (; f; f = next) {
		next = f->next;
		shutdown(f->listen_fd, SHUT_RDWR);
		pthread_join(f->thread, NULL);
		close(f->listen_fd);
		cb_relays_close(f->relays);
		free(f);
	}
}

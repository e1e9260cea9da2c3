/* Published ports: a listener on the host's 127.0.0.1 (a free port) relayed to 127.0.0.1:PORT
 * inside the workspace's network namespace, the reverse of host_url's forwarders. */
#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cowbox/backend.h"
#include "cowbox/error.h"

struct cb_published {
	int port;      /* inside the sandbox */
	int host_port; /* on the host's 127.0.0.1 */
	int listen_fd; /* made in the daemon's namespace */
	int netns_fd;  /* a dup of the workspace's */
	pthread_t thread;
	struct cb_published *next;
};

/* This thread moves into the sandbox's namespace for good: the sockets it makes are there. */
static void *publish_main(void *arg)
{
	struct cb_published *p = arg;
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(p->port)};
	int in_ns = setns(p->netns_fd, CLONE_NEWNET) == 0;

	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	for (;;) {
		int c = accept4(p->listen_fd, NULL, NULL, SOCK_CLOEXEC), up;

		if (c < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			break; /* shut down */
		}
		up = in_ns ? socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0) : -1;
		if (up < 0 || connect(up, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
		    cb_relay_start(c, up) < 0) {
			close(c);
			if (up >= 0)
				close(up);
		}
	}
	return NULL;
}

static int listen_host(int *fd, int *port)
{
	struct sockaddr_in sa = {.sin_family = AF_INET};
	socklen_t len = sizeof(sa);

	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	*fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (*fd < 0 || bind(*fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(*fd, 128) < 0 ||
	    getsockname(*fd, (struct sockaddr *)&sa, &len) < 0) {
		int e = errno;

		if (*fd >= 0)
			close(*fd);
		*fd = -1;
		return cb_error_set(e, "publish: listen on the host's 127.0.0.1: %s", strerror(e));
	}
	*port = ntohs(sa.sin_port);
	return 0;
}

int cb_publish_add(struct cb_backend *b, int netns_fd, int port, int *host_port)
{
	struct cb_published *p;
	int rc = 0;

	if (port < 1 || port > 65535)
		return cb_error_set(EINVAL, "publish: port %d is not in 1-65535", port);
	if (netns_fd < 0)
		return cb_error_set(EOPNOTSUPP,
				    "publish: the workspace has no network namespace of "
				    "its own here (network host, or not root)");
	pthread_mutex_lock(&b->lock);
	for (p = b->pub; p; p = p->next)
		if (p->port == port) {
			*host_port = p->host_port;
			goto out;
		}
	if (!(p = calloc(1, sizeof(*p)))) {
		rc = cb_error_set(ENOMEM, "publish: out of memory");
		goto out;
	}
	p->port = port;
	p->netns_fd = fcntl(netns_fd, F_DUPFD_CLOEXEC, 0);
	if (p->netns_fd < 0) {
		rc = cb_error_set(errno, "publish: %s", strerror(errno));
		free(p);
		goto out;
	}
	if (!(rc = listen_host(&p->listen_fd, &p->host_port)) &&
	    (rc = pthread_create(&p->thread, NULL, publish_main, p))) {
		rc = cb_error_set(rc, "publish: thread: %s", strerror(rc));
		close(p->listen_fd);
	}
	if (rc < 0) {
		close(p->netns_fd);
		free(p);
		goto out;
	}
	*host_port = p->host_port;
	p->next = b->pub;
	b->pub = p;
out:
	pthread_mutex_unlock(&b->lock);
	return rc;
}

static void publish_stop(struct cb_published *p)
{
	shutdown(p->listen_fd, SHUT_RDWR);
	pthread_join(p->thread, NULL);
	close(p->listen_fd);
	close(p->netns_fd);
	free(p);
}

int cb_publish_remove(struct cb_backend *b, int port)
{
	struct cb_published **pp, *p = NULL;

	pthread_mutex_lock(&b->lock);
	for (pp = &b->pub; *pp; pp = &(*pp)->next)
		if ((*pp)->port == port) {
			p = *pp;
			*pp = p->next;
			break;
		}
	pthread_mutex_unlock(&b->lock);
	if (!p)
		return cb_error_set(ENOENT, "unpublish: port %d is not published", port);
	publish_stop(p);
	return 0;
}

void cb_publish_stop_all(struct cb_backend *b)
{
	struct cb_published *p, *next;

	pthread_mutex_lock(&b->lock);
	p = b->pub;
	b->pub = NULL;
	pthread_mutex_unlock(&b->lock);
	for (; p; p = next) {
		next = p->next;
		publish_stop(p);
	}
}

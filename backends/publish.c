/* Published ports: a listener on the host's 127.0.0.1 (a free port) relayed to 127.0.0.1:PORT
 * inside the workspace's network namespace, the reverse of host_url's forwarders. The target
 * is fixed here, never taken from the sandbox, and the connection is made from inside its
 * namespace, so a published port reaches nothing of the host's. */
#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backends/common.h"
#include "cowbox/backend.h"
#include "cowbox/error.h"

struct cb_published {
	int port;      /* inside the sandbox */
	int host_port; /* on the host's 127.0.0.1 */
	int listen_fd; /* made in the daemon's namespace */
	int netns_fd;  /* a dup of the workspace's */
	pthread_t thread;
	sem_t started;		  /* posted once the thread has tried to move into netns_fd */
	int moved;		  /* 0, or -errno of that move */
	struct cb_relays *relays; /* its connections, shut down with it */
	struct cb_published *next;
};

/* This thread moves into the sandbox's namespace for good: the sockets it makes are there
 * (and so are those of the relay threads it starts, which make none). cb_publish_add waits
 * for the move and gives up on a failed one, so no connection is made from the daemon's. */
static void *publish_main(void *arg)
{
	struct cb_published *p = arg;
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(p->port)};

	p->moved = setns(p->netns_fd, CLONE_NEWNET) == 0 ? 0 : -errno;
	sem_post(&p->started);
	if (p->moved < 0)
		return NULL;
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	for (;;) {
		int c = accept4(p->listen_fd, NULL, NULL, SOCK_CLOEXEC), up;

		if (c < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			break; /* shut down */
		}
		up = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (up < 0 || connect(up, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
		    cb_relay_start(p->relays, c, up) < 0) {
			close(c);
			if (up >= 0)
				close(up);
		}
	}
	return NULL;
}

/* *port: the host port asked for (0: any free one) in, the one listening out. */
static int listen_host(int *fd, int *port)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)*port)};
	socklen_t len = sizeof(sa);

	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	*fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (*fd < 0 || bind(*fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(*fd, 128) < 0 ||
	    getsockname(*fd, (struct sockaddr *)&sa, &len) < 0) {
		int e = errno;

		if (*fd >= 0)
			close(*fd);
		*fd = -1;
		if (*port)
			return cb_error_set(e, "publish: listen on the host's 127.0.0.1:%d: %s",
					    *port, strerror(e));
		return cb_error_set(e, "publish: listen on the host's 127.0.0.1: %s", strerror(e));
	}
	*port = ntohs(sa.sin_port);
	return 0;
}

/* Refuse a namespace that is the daemon's own (a docker container under network host, or a
 * recycled pid's): the relay would then reach the host's loopback services. */
static int own_namespace(int netns_fd)
{
	struct stat a, h;

	if (fstat(netns_fd, &a) < 0 || stat("/proc/thread-self/ns/net", &h) < 0)
		return cb_error_set(errno, "publish: the network namespaces: %s", strerror(errno));
	if (a.st_dev == h.st_dev && a.st_ino == h.st_ino)
		return cb_error_set(EOPNOTSUPP, "publish: the workspace shares the host's network "
						"namespace (network host): nothing to publish");
	return 0;
}

static void publish_stop(struct cb_published *p)
{
	shutdown(p->listen_fd, SHUT_RDWR);
	pthread_join(p->thread, NULL);
	cb_relays_close(p->relays);
	sem_destroy(&p->started);
	close(p->listen_fd);
	close(p->netns_fd);
	free(p);
}

/* A published port of its own thread; NULL with a message on failure. */
static struct cb_published *publish_new(int netns_fd, int port, int host_port, int *rc)
{
	struct cb_published *p = calloc(1, sizeof(*p));

	if (!p) {
		*rc = cb_error_set(ENOMEM, "publish: out of memory");
		return NULL;
	}
	p->port = port;
	p->host_port = host_port;
	p->listen_fd = p->netns_fd = -1;
	if ((*rc = cb_relays_new(&p->relays)) < 0)
		goto fail;
	if ((p->netns_fd = fcntl(netns_fd, F_DUPFD_CLOEXEC, 0)) < 0) {
		*rc = cb_error_set(errno, "publish: %s", strerror(errno));
		goto fail;
	}
	if ((*rc = listen_host(&p->listen_fd, &p->host_port)) < 0)
		goto fail;
	sem_init(&p->started, 0, 0);
	if ((*rc = pthread_create(&p->thread, NULL, publish_main, p))) {
		*rc = cb_error_set(*rc, "publish: thread: %s", strerror(*rc));
		sem_destroy(&p->started);
		goto fail;
	}
	while (sem_wait(&p->started) < 0 && errno == EINTR)
		;
	if (p->moved < 0) {
		*rc = cb_error_set(p->moved, "publish: enter the workspace's network namespace: %s",
				   strerror(-p->moved));
		publish_stop(p);
		return NULL;
	}
	return p;
fail:
	cb_relays_close(p->relays);
	if (p->listen_fd >= 0)
		close(p->listen_fd);
	if (p->netns_fd >= 0)
		close(p->netns_fd);
	free(p);
	return NULL;
}

int cb_publish_add(struct cb_backend *b, int port, int *host_port)
{
	struct cb_published *p;
	int rc = 0;

	int want = *host_port;

	*host_port = 0;
	if (port < 1 || port > 65535)
		return cb_error_set(EINVAL, "publish: port %d is not in 1-65535", port);
	if (want < 0 || want > 65535)
		return cb_error_set(EINVAL, "publish: host port %d is not in 1-65535", want);
	pthread_mutex_lock(&b->lock);
	for (p = b->pub; p; p = p->next)
		if (p->port == port) {
			if (want && p->host_port != want)
				rc = cb_error_set(EEXIST,
						  "publish: port %d is published at 127.0.0.1:%d "
						  "already (unpublish it first)",
						  port, p->host_port);
			goto out;
		}
	if (!b->created || b->netns_fd < 0) {
		rc = cb_error_set(EOPNOTSUPP, "publish: the workspace has no network namespace of "
					      "its own here (network host, the local backend, or a "
					      "daemon not running as root)");
		goto out;
	}
	if ((rc = own_namespace(b->netns_fd)) < 0 ||
	    !(p = publish_new(b->netns_fd, port, want, &rc)))
		goto out;
	p->next = b->pub;
	b->pub = p;
out:
	if (!rc)
		*host_port = p->host_port;
	pthread_mutex_unlock(&b->lock);
	return rc;
}

json_t *cb_publish_json(struct cb_backend *b)
{
	json_t *list = json_array();
	char addr[32];

	pthread_mutex_lock(&b->lock);
	for (struct cb_published *p = b->pub; list && p; p = p->next) {
		snprintf(addr, sizeof(addr), "127.0.0.1:%d", p->host_port);
		json_array_append_new(list, json_pack("{s:i, s:i, s:s}", "port", p->port,
						      "host_port", p->host_port, "address", addr));
	}
	pthread_mutex_unlock(&b->lock);
	return list;
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

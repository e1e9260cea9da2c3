/* Byte relays between two connected sockets (host_url's forwarders, published ports), each on
 * a thread of its own, kept in a set so that a closing workspace shuts every one of them down. */
#include "config.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "backends/common.h"
#include "cowbox/error.h"

struct relay {
	int fd[2];
	struct cb_relays *set;
	struct relay *prev, *next;
};

struct cb_relays {
	pthread_mutex_t lock;
	pthread_cond_t gone; /* signalled as each relay leaves the set */
	struct relay *head;
	size_t n;
	int closing; /* no new relay joins */
};

int cb_relays_new(struct cb_relays **out)
{
	struct cb_relays *s = calloc(1, sizeof(*s));

	*out = NULL;
	if (!s)
		return cb_error_set(ENOMEM, "relay: out of memory");
	pthread_mutex_init(&s->lock, NULL);
	pthread_cond_init(&s->gone, NULL);
	*out = s;
	return 0;
}

/* Copy what one side sent to the other: 0 while it flows, 1 at its end of file (the other
 * side is told by a half close), -1 when either side failed. */
static int pump(int from, int to, char *buf, size_t len)
{
	ssize_t n = read(from, buf, len);

	if (n < 0)
		return errno == EINTR || errno == EAGAIN ? 0 : -1;
	if (n == 0) {
		shutdown(to, SHUT_WR);
		return 1;
	}
	for (ssize_t off = 0; off < n;) {
		ssize_t w = send(to, buf + off, (size_t)(n - off), MSG_NOSIGNAL);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		off += w;
	}
	return 0;
}

static void *relay_main(void *arg)
{
	struct relay *r = arg;
	struct cb_relays *s = r->set;
	struct pollfd p[2] = {{r->fd[0], POLLIN, 0}, {r->fd[1], POLLIN, 0}};
	char buf[65536];
	int open = 2;

	while (open > 0) {
		if (poll(p, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		for (int i = 0; i < 2; i++) {
			int rc;

			if (p[i].fd < 0 || !(p[i].revents & (POLLIN | POLLHUP | POLLERR)))
				continue;
			if ((rc = pump(p[i].fd, r->fd[1 - i], buf, sizeof(buf))) < 0)
				goto out;
			if (rc > 0) {
				p[i].fd = -1; /* its direction is done; the other may go on */
				open--;
			}
		}
	}
out:
	/* Closed under the lock: cb_relays_close never shuts down an fd number reused since. */
	pthread_mutex_lock(&s->lock);
	close(r->fd[0]);
	close(r->fd[1]);
	if (r->prev)
		r->prev->next = r->next;
	else
		s->head = r->next;
	if (r->next)
		r->next->prev = r->prev;
	s->n--;
	pthread_cond_broadcast(&s->gone);
	pthread_mutex_unlock(&s->lock);
	free(r);
	return NULL;
}

int cb_relay_start(struct cb_relays *s, int a, int b)
{
	struct relay *r = calloc(1, sizeof(*r));
	pthread_t t;
	int rc = 0;

	if (!r)
		return cb_error_set(ENOMEM, "relay: out of memory");
	r->fd[0] = a;
	r->fd[1] = b;
	r->set = s;
	pthread_mutex_lock(&s->lock);
	if (s->closing) {
		rc = cb_error_set(ESHUTDOWN, "relay: closing");
	} else if ((rc = pthread_create(&t, NULL, relay_main, r))) {
		rc = cb_error_set(rc, "relay: thread: %s", strerror(rc));
	} else {
		pthread_detach(t);
		r->next = s->head;
		if (s->head)
			s->head->prev = r;
		s->head = r;
		s->n++;
	}
	pthread_mutex_unlock(&s->lock);
	if (rc)
		free(r);
	return rc;
}

void cb_relays_close(struct cb_relays *s)
{
	if (!s)
		return;
	pthread_mutex_lock(&s->lock);
	s->closing = 1;
	for (struct relay *r = s->head; r; r = r->next) {
		shutdown(r->fd[0], SHUT_RDWR);
		shutdown(r->fd[1], SHUT_RDWR);
	}
	while (s->n)
		pthread_cond_wait(&s->gone, &s->lock);
	pthread_mutex_unlock(&s->lock);
	pthread_cond_destroy(&s->gone);
	pthread_mutex_destroy(&s->lock);
	free(s);
}

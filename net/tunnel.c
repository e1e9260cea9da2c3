/* A plain (not intercepted) tunnel of the egress proxy: each direction spliced from one socket
 * into a pipe and from the pipe into the other socket, so that its bytes never enter user space. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "net/tunnel.h"

/* A new pipe grows from 16 slots (64 KiB at most, less when a TCP fragment fills a slot only in
 * part) to this, so that a bulk transfer moves up to 1 MiB per splice pair; the pool makes
 * that fcntl rare. */
#define PIPE_BULK (1 << 20)
/* A read this large means a bulk stream, read again at once (a 1 GiB download: A/B runs at
 * load 3-4 moved its median from about 1.8 to 2.5 GB/s). */
#define BULK_READ (64 << 10)

struct dir {
	int src, dst; /* indexes into fd[] */
	int pipe[2];
	size_t in_pipe;	  /* spliced in, not yet out */
	size_t pipe_size; /* its capacity */
	char *pre;	  /* bytes for dst before the stream */
	size_t pre_len, pre_off;
	int try_read; /* src may have more: it is a bulk stream (its last read was large) */
	int eof;      /* src ended */
	int done;     /* dst's writing side shut after everything */
	unsigned long long bytes;
};

struct cb_net_tunnel {
	struct cb_net_pipes *pool;
	int fd[2];		     /* 0: the sandbox's side, 1: the destination's */
	struct event *rd[2], *wr[2]; /* rd[i] drives dir[i]; wr[i] drives dir[1 - i] */
	struct dir dir[2];	     /* 0: cli to up, 1: up to cli */
	void (*done)(void *arg);
	void *arg;
};

enum step { WAIT_READ, WAIT_WRITE, FINISHED, FAILED };

static int would_block(void)
{
	return errno == EAGAIN || errno == EWOULDBLOCK;
}

/* Everything that can move in one direction now; what it must wait for next. */
static enum step pump(struct cb_net_tunnel *t, struct dir *d)
{
	int src = t->fd[d->src], dst = t->fd[d->dst];

	if (d->done)
		return FINISHED;
	while (d->pre_off < d->pre_len) {
		ssize_t n = send(dst, d->pre + d->pre_off, d->pre_len - d->pre_off, MSG_NOSIGNAL);

		if (n < 0)
			return would_block() ? WAIT_WRITE : FAILED;
		d->pre_off += (size_t)n;
	}
	for (;;) {
		while (d->in_pipe) {
			ssize_t n = splice(d->pipe[0], NULL, dst, NULL, d->in_pipe,
					   SPLICE_F_MOVE | SPLICE_F_NONBLOCK);

			if (n < 0)
				return would_block() ? WAIT_WRITE : FAILED;
			d->in_pipe -= (size_t)n;
		}
		if (d->eof) {
			/* (the peer may have gone already: its own direction reports that); when
			 * the other direction has ended, the close that follows says it */
			if (!t->dir[!(d - t->dir)].done)
				shutdown(dst, SHUT_WR);
			d->done = 1;
			return FINISHED;
		}
		/* after a short read (a request, an answer) the socket is most likely empty: epoll
		 * (level-triggered) says when there is more, which saves a read that would only
		 * fail with EAGAIN; a bulk stream's sender has most likely written more while the
		 * last chunk went out, and reading again at once saves a poll */
		if (!d->try_read)
			return WAIT_READ;
		ssize_t n = splice(src, NULL, d->pipe[1], NULL, d->pipe_size,
				   SPLICE_F_MOVE | SPLICE_F_NONBLOCK);

		if (n < 0) {
			d->try_read = 0;
			return would_block() ? WAIT_READ : FAILED;
		}
		if (n == 0) {
			d->eof = 1;
			continue;
		}
		d->try_read = (size_t)n >= BULK_READ;
		d->in_pipe = (size_t)n;
		d->bytes += (unsigned long long)n;
	}
}

static void on_io(evutil_socket_t fd, short what, void *arg);

/* Run one direction and arm the one event it waits for; the end is reported once. */
static void run(struct cb_net_tunnel *t, int i)
{
	struct dir *d = &t->dir[i];
	enum step s = pump(t, d);

	if (s == FAILED || (t->dir[0].done && t->dir[1].done)) {
		for (int k = 0; k < 2; k++) {
			event_del(t->rd[k]);
			event_del(t->wr[k]);
		}
		t->done(t->arg);
		return;
	}
	/* a direction waits either for its source to have bytes or for its sink to take them */
	if (s == WAIT_READ) {
		event_del(t->wr[d->dst]);
		event_add(t->rd[d->src], NULL);
	} else if (s == WAIT_WRITE) {
		event_del(t->rd[d->src]);
		event_add(t->wr[d->dst], NULL);
	} else {
		event_del(t->rd[d->src]);
		event_del(t->wr[d->dst]);
	}
}

static void on_io(evutil_socket_t fd, short what, void *arg)
{
	struct cb_net_tunnel *t = arg;
	int side = fd == t->fd[0] ? 0 : 1;

	/* reading side i moves direction i; writing side i moves the other one */
	if (what & EV_READ)
		t->dir[side].try_read = 1;
	run(t, what & EV_READ ? side : 1 - side);
}

/* A pipe for a direction, from the pool or new (grown to PIPE_BULK where it can): 0, -errno. */
static int get_pipe(struct cb_net_pipes *pool, struct dir *d)
{
	int sz;

	if (pool && pool->n) {
		pool->n--;
		memcpy(d->pipe, pool->p[pool->n].fd, sizeof d->pipe);
		d->pipe_size = pool->p[pool->n].size;
		return 0;
	}
	if (pipe2(d->pipe, O_CLOEXEC | O_NONBLOCK) < 0) {
		d->pipe[0] = d->pipe[1] = -1;
		return -errno;
	}
	sz = fcntl(d->pipe[1], F_SETPIPE_SZ, PIPE_BULK);
	d->pipe_size = sz > 0 ? (size_t)sz : 65536;
	return 0;
}

/* What a bufferevent's output holds, and what the other one read ahead, as dst's first bytes
 * (the output keeps them until the tunnel is sure). */
static int take_queued(struct dir *d, struct bufferevent *to, struct bufferevent *from)
{
	struct evbuffer *out = bufferevent_get_output(to), *ahead = bufferevent_get_input(from);
	unsigned char *p;
	size_t n;

	d->bytes = evbuffer_get_length(ahead);
	evbuffer_add_buffer(out, ahead);
	n = evbuffer_get_length(out);
	if (!n)
		return 0;
	/* (not evbuffer_copyout: it refuses a buffer whose start is frozen) */
	if (!(p = evbuffer_pullup(out, -1)) || !(d->pre = malloc(n)))
		return -ENOMEM;
	memcpy(d->pre, p, n);
	d->pre_len = n;
	return 0;
}

/* A socket out of its bufferevent, which then closes nothing when freed. */
static int take_fd(struct bufferevent **bev)
{
	int fd = bufferevent_getfd(*bev);

	bufferevent_setfd(*bev, -1);
	bufferevent_free(*bev);
	*bev = NULL;
	return fd;
}

int cb_net_tunnel_new(struct bufferevent **cli, struct bufferevent **up, struct cb_net_pipes *pool,
		      void (*done)(void *arg), void *arg, struct cb_net_tunnel **out)
{
	struct event_base *base = bufferevent_get_base(*cli);
	struct cb_net_tunnel *t = calloc(1, sizeof(*t));
	int rc = -ENOMEM;

	*out = NULL;
	if (!t)
		goto out;
	t->fd[0] = bufferevent_getfd(*cli);
	t->fd[1] = bufferevent_getfd(*up);
	t->pool = pool;
	t->done = done;
	t->arg = arg;
	for (int i = 0; i < 2; i++) {
		t->dir[i].src = i;
		t->dir[i].dst = 1 - i;
		t->dir[i].pipe[0] = t->dir[i].pipe[1] = -1;
		if (!(t->rd[i] = event_new(base, t->fd[i], EV_READ | EV_PERSIST, on_io, t)) ||
		    !(t->wr[i] = event_new(base, t->fd[i], EV_WRITE | EV_PERSIST, on_io, t)))
			goto out;
	}
	for (int i = 0; i < 2; i++)
		if ((rc = get_pipe(pool, &t->dir[i])) < 0)
			goto out;
	rc = -ENOMEM;
	if (take_queued(&t->dir[0], *up, *cli) < 0 || take_queued(&t->dir[1], *cli, *up) < 0)
		goto out;
	/* emptied: the bufferevent whose callback this is (the connect's) still writes what is
	 * left in its output to the socket it had */
	evbuffer_drain(bufferevent_get_output(*up), t->dir[0].pre_len);
	evbuffer_drain(bufferevent_get_output(*cli), t->dir[1].pre_len);
	take_fd(cli);
	take_fd(up);
	/* both directions first run from the loop, so that done is never called from here;
	 * activating costs no system call */
	event_active(t->wr[1], EV_WRITE, 0);
	event_active(t->wr[0], EV_WRITE, 0);
	*out = t;
	t = NULL;
	rc = 0;
out:
	if (t) {
		t->fd[0] = t->fd[1] = -1; /* still the bufferevents' */
		cb_net_tunnel_free(t);
	}
	return rc;
}

void cb_net_tunnel_bytes(const struct cb_net_tunnel *t, unsigned long long *up,
			 unsigned long long *down)
{
	*up = t->dir[0].bytes;
	*down = t->dir[1].bytes;
}

/* An empty pipe back to the pool while it has room; any other one closed. */
static void put_pipe(struct cb_net_pipes *pool, struct dir *d)
{
	if (d->pipe[0] < 0)
		return;
	if (pool && !d->in_pipe && pool->n < CB_NET_PIPES_MAX) {
		memcpy(pool->p[pool->n].fd, d->pipe, sizeof d->pipe);
		pool->p[pool->n++].size = d->pipe_size;
		return;
	}
	close(d->pipe[0]);
	close(d->pipe[1]);
}

void cb_net_pipes_trim(struct cb_net_pipes *pool, size_t keep)
{
	while (pool->n > keep) {
		pool->n--;
		close(pool->p[pool->n].fd[0]);
		close(pool->p[pool->n].fd[1]);
	}
}

void cb_net_tunnel_free(struct cb_net_tunnel *t)
{
	if (!t)
		return;
	for (int i = 0; i < 2; i++) {
		if (t->rd[i])
			event_free(t->rd[i]);
		if (t->wr[i])
			event_free(t->wr[i]);
		put_pipe(t->pool, &t->dir[i]);
		if (t->fd[i] >= 0)
			close(t->fd[i]);
		free(t->dir[i].pre);
	}
	free(t);
}

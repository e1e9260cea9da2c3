/* Whether the base directory may have changed since the last look: inotify on each of its
 * directories, so that snapshot and rollback walk the whole base only when something moved. */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "daemon.h"

/* Every way a file's bytes, stat or name can change under a directory; reads and opens
 * (the overlay's own, through copy-up) raise none of these. */
#define WATCH_MASK                                                                                 \
	(IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_CREATE | IN_DELETE | IN_DELETE_SELF |         \
	 IN_MOVED_FROM | IN_MOVED_TO | IN_MOVE_SELF | IN_ONLYDIR)

struct cb_daemon_basewatch {
	int fd;	     /* the inotify instance */
	int wake[2]; /* a byte here stops the thread */
	pthread_t thread;
	int have_thread;
	/* 1: the base may differ from what the last look saw (set by any event, by a queue
	 * overflow and when a watch could not be added: then it stays set, and every
	 * snapshot and rollback walks the base, as they would without this module). */
	_Atomic int changed;
	_Atomic int blind;
	_Atomic long long events; /* counts what sets changed, never reset */
};

/* Add a watch on dirfd's directory and on every directory below it. The base is the user's
 * tree, not the sandbox's: no one races it to plant links, and O_NOFOLLOW keeps the walk off
 * symlinks anyway. Returns 0, or -errno when a watch could not be added (too many). */
static int watch_tree(struct cb_daemon_basewatch *w, int dirfd)
{
	char proc[64];
	DIR *dir;
	struct dirent *e;
	int ret = 0;

	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", dirfd);
	if (inotify_add_watch(w->fd, proc, WATCH_MASK) < 0) {
		ret = -errno;
		close(dirfd);
		return ret;
	}
	if (!(dir = fdopendir(dirfd))) {
		ret = -errno;
		close(dirfd);
		return ret;
	}
	while (!ret && (e = readdir(dir))) {
		int sub;

		if (e->d_type != DT_DIR && e->d_type != DT_UNKNOWN)
			continue;
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		sub = openat(dirfd, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (sub >= 0)
			ret = watch_tree(w, sub);
		else if (errno == EMFILE || errno == ENFILE)
			ret = -errno;
	}
	closedir(dir);
	return ret;
}

/* A watch could not be added: the module is blind from now on (every look walks). */
static void watch_blind(struct cb_daemon *d, struct cb_daemon_basewatch *w, int err)
{
	if (!atomic_exchange(&w->blind, 1))
		cb_daemon_log("base watch: %s: %s; every snapshot and rollback looks at the whole "
			      "base",
			      d->base, strerror(err));
}

/* (Re)watch the whole base; a failure leaves the module blind (every look walks). */
static void watch_base(struct cb_daemon *d, struct cb_daemon_basewatch *w)
{
	int fd = open(d->base, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int ret = fd < 0 ? -errno : watch_tree(w, fd);

	if (ret)
		watch_blind(d, w, -ret);
}

void cb_daemon_basewatch_dir(void *arg, int dirfd)
{
	struct cb_daemon *d = arg;
	struct cb_daemon_basewatch *w = d->basewatch;
	char proc[64];

	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", dirfd);
	if (w && inotify_add_watch(w->fd, proc, WATCH_MASK) < 0)
		watch_blind(d, w, errno);
}

void cb_daemon_basewatch_all(struct cb_daemon *d)
{
	if (d->basewatch)
		watch_base(d, d->basewatch);
}

struct watch_arg {
	struct cb_daemon *d;
	struct cb_daemon_basewatch *w;
};

static void *watch_thread(void *arg)
{
	struct watch_arg *a = arg;
	struct cb_daemon_basewatch *w = a->w;
	char buf[64 * 1024] __attribute__((aligned(__alignof__(struct inotify_event))));

	for (;;) {
		struct pollfd p[2] = {{.fd = w->fd, .events = POLLIN},
				      {.fd = w->wake[0], .events = POLLIN}};
		int rewatch = 0;
		ssize_t n;

		if (poll(p, 2, -1) < 0 && errno != EINTR)
			break;
		if (p[1].revents)
			break;
		if (!(p[0].revents & POLLIN))
			continue;
		n = read(w->fd, buf, sizeof(buf));
		if (n <= 0)
			continue;
		for (char *q = buf; q < buf + n;) {
			const struct inotify_event *ev = (const struct inotify_event *)q;

			if (ev->mask & IN_Q_OVERFLOW)
				rewatch = 1;
			/* A directory made or moved in has no watch yet: watch the tree again
			 * (adding a watch twice is harmless). */
			if ((ev->mask & IN_ISDIR) && (ev->mask & (IN_CREATE | IN_MOVED_TO)))
				rewatch = 1;
			if (!(ev->mask & IN_IGNORED)) {
				atomic_store(&w->changed, 1);
				atomic_fetch_add(&w->events, 1);
			}
			q += sizeof(*ev) + ev->len;
		}
		if (rewatch) {
			watch_base(a->d, w);
			/* what landed in a new directory before its watch is seen by the next look
			 */
			atomic_store(&w->changed, 1);
			atomic_fetch_add(&w->events, 1);
		}
	}
	free(a);
	return NULL;
}

int cb_daemon_basewatch_start(struct cb_daemon *d)
{
	int ret = cb_daemon_basewatch_open(d);

	if (!ret)
		cb_daemon_basewatch_all(d);
	return ret;
}

int cb_daemon_basewatch_open(struct cb_daemon *d)
{
	struct cb_daemon_basewatch *w = calloc(1, sizeof(*w));
	struct watch_arg *a = malloc(sizeof(*a));
	int ret = 0;

	if (!w || !a) {
		ret = cb_error_set(ENOMEM, "base watch: out of memory");
		goto out;
	}
	w->wake[0] = w->wake[1] = -1;
	atomic_store(&w->changed, 1);
	w->fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
	if (w->fd < 0 || pipe2(w->wake, O_CLOEXEC) < 0) {
		ret = cb_error_set(errno, "base watch: %s", strerror(errno));
		goto out;
	}
	a->d = d;
	a->w = w;
	if ((ret = -pthread_create(&w->thread, NULL, watch_thread, a))) {
		cb_error_set(-ret, "base watch: thread: %s", strerror(-ret));
		goto out;
	}
	a = NULL;
	w->have_thread = 1;
	d->basewatch = w;
	w = NULL;
out:
	free(a);
	if (w) {
		if (w->fd >= 0)
			close(w->fd);
		if (w->wake[0] >= 0) {
			close(w->wake[0]);
			close(w->wake[1]);
		}
		free(w);
	}
	return ret;
}

int cb_daemon_basewatch_take(struct cb_daemon *d)
{
	struct cb_daemon_basewatch *w = d->basewatch;

	if (!w || atomic_load(&w->blind))
		return 1;
	return atomic_exchange(&w->changed, 0);
}

long long cb_daemon_basewatch_events(struct cb_daemon *d)
{
	struct cb_daemon_basewatch *w = d->basewatch;
	struct pollfd p;

	if (!w || atomic_load(&w->blind))
		return -1;
	/* Events the kernel queued that the thread has not read yet count too. */
	p.fd = w->fd;
	p.events = POLLIN;
	p.revents = 0;
	if (poll(&p, 1, 0) != 0)
		return -1;
	return atomic_load(&w->events);
}

long long cb_daemon_basewatch_settled(struct cb_daemon *d)
{
	struct cb_daemon_basewatch *w = d->basewatch;
	long long events = cb_daemon_basewatch_events(d);

	/* The thread reads what is queued within moments; a blind watch never settles. */
	for (int i = 0; events < 0 && w && !atomic_load(&w->blind) && i < 100; i++) {
		usleep(1000);
		events = cb_daemon_basewatch_events(d);
	}
	return events;
}

void cb_daemon_basewatch_stop(struct cb_daemon *d)
{
	struct cb_daemon_basewatch *w = d->basewatch;

	if (!w)
		return;
	if (w->have_thread) {
		if (write(w->wake[1], "x", 1) < 0)
			cb_daemon_log("base watch: wake: %s", strerror(errno));
		pthread_join(w->thread, NULL);
	}
	close(w->fd);
	close(w->wake[0]);
	close(w->wake[1]);
	free(w);
	d->basewatch = NULL;
}

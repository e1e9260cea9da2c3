/* Background jobs kept past their command's call (spec.keep): each kept tree is its
 * supervisor (the shim), which drains the output they still write and ends them all when
 * the set is freed, e.g. when the workspace closes. */
#include "config.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "cowbox/exec.h"
#include "internal.h"
#include "run.h"

#ifndef P_PIDFD
#define P_PIDFD 3
#endif

struct kept {
	pid_t shim;
	int ctl;   /* the shim's control socket: a kill goes here */
	int pidfd; /* readable once the shim (and, in a sandbox, its whole namespace) is gone */
	struct cb_cgroup *cg;
};

struct cb_exec_keep {
	pthread_mutex_t lock;
	struct kept *v;
	size_t n, cap;
};

int cb_exec_keep_new(struct cb_exec_keep **out)
{
	struct cb_exec_keep *k = calloc(1, sizeof *k);

	*out = k;
	if (!k)
		return cb_error_set(ENOMEM, "exec: out of memory");
	pthread_mutex_init(&k->lock, NULL);
	return 0;
}

/* The shim's pidfd says it has exited: reap exactly it (never another child that took its
 * pid: the daemon's reaper may have reaped it first) and let go of the rest. */
static void kept_release(struct kept *e)
{
	siginfo_t si;

	syscall(SYS_waitid, P_PIDFD, e->pidfd, &si, WEXITED | WNOHANG, NULL);
	close(e->pidfd);
	close(e->ctl);
	cb_cgroup_destroy(e->cg);
}

static int kept_gone(const struct kept *e, int timeout_ms)
{
	struct pollfd pf = {.fd = e->pidfd, .events = POLLIN};

	return poll(&pf, 1, timeout_ms) > 0;
}

/* Drop the trees that have ended by themselves; with k->lock held. */
static void sweep(struct cb_exec_keep *k)
{
	size_t j = 0;

	for (size_t i = 0; i < k->n; i++) {
		if (kept_gone(&k->v[i], 0))
			kept_release(&k->v[i]);
		else
			k->v[j++] = k->v[i];
	}
	k->n = j;
}

int cb_exec_keep_add(struct cb_exec_keep *k, pid_t shim, int ctl, struct cb_cgroup *cg)
{
	int pidfd = (int)syscall(SYS_pidfd_open, shim, 0), rc = 0;

	if (pidfd < 0)
		return cb_error_set(errno, "exec: pidfd_open of the supervisor: %s",
				    strerror(errno));
	pthread_mutex_lock(&k->lock);
	sweep(k);
	if (k->n == k->cap) {
		size_t cap = k->cap ? 2 * k->cap : 8;
		struct kept *v = realloc(k->v, cap * sizeof *v);

		if (!v)
			rc = cb_error_set(ENOMEM, "exec: out of memory");
		else
			k->v = v, k->cap = cap;
	}
	if (!rc)
		k->v[k->n++] = (struct kept){shim, ctl, pidfd, cg};
	pthread_mutex_unlock(&k->lock);
	if (rc)
		close(pidfd);
	return rc;
}

size_t cb_exec_keep_running(struct cb_exec_keep *k)
{
	size_t n;

	pthread_mutex_lock(&k->lock);
	sweep(k);
	n = k->n;
	pthread_mutex_unlock(&k->lock);
	return n;
}

void cb_exec_keep_free(struct cb_exec_keep *k)
{
	char msg[1 + sizeof(int)];
	int sig = SIGKILL;

	if (!k)
		return;
	msg[0] = CB_MSG_KILL;
	memcpy(msg + 1, &sig, sizeof sig);
	/* Every tree is told at once, then waited for (a sandbox's shim is gone only once its
	 * whole pid namespace is): at most 10 s in all, a process stuck in the kernel aside. */
	for (size_t i = 0; i < k->n; i++)
		(void)!send(k->v[i].ctl, msg, sizeof msg, MSG_NOSIGNAL);
	struct timespec t0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (size_t i = 0; i < k->n; i++) {
		struct timespec t;
		long left;

		clock_gettime(CLOCK_MONOTONIC, &t);
		left = 10000 - ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000);
		kept_gone(&k->v[i], left > 0 ? (int)left : 0);
		kept_release(&k->v[i]);
	}
	free(k->v);
	pthread_mutex_destroy(&k->lock);
	free(k);
}

/* User-mode networking for a network namespace: pasta (Debian's passt) relays the namespace's
 * outbound TCP, UDP and DNS through host sockets; the host's loopback stays out of reach, and
 * its other addresses too (exec/pasta_guard.c). */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "cowbox/sandbox.h"
#include "internal.h"
#include "run.h"

#ifndef CLONE_PIDFD
#define CLONE_PIDFD 0x00001000
#endif
#ifndef P_PIDFD
#define P_PIDFD 3
#endif

#define PASTA_START_TIMEOUT 10.0 /* seconds for pasta to configure the namespace */
#define PASTA_NETNS_FD	    3	 /* where pasta finds the namespace: /proc/self/fd/3 */

struct cb_pasta {
	pthread_t keeper;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int netns_fd;	/* ours, not the caller's */
	int log_fd;	/* pasta's stderr */
	char *pid_path; /* pasta writes its pid there once the namespace is configured */
	int pidfd;	/* of the pasta process; -1 until spawned */
	int spawn_err;	/* errno of a failed spawn (keeper to starter) */
	int spawned;	/* the keeper has tried (pidfd or spawn_err is set) */
	int stop;	/* starter to keeper: kill pasta and return */
	char *argv[32]; /* built before clone: the child only calls execve */
	char *envp[2];
	struct cb_pasta_guard *guard; /* the host's own addresses kept out */
};

/* pasta must not open the host's loopback to the namespace nor forward any port either way:
 * -t/-u none (nothing from the host in), -T/-U none (no ns loopback port to the host's),
 * --no-map-gw (the gateway's address is the real gateway, not the host). It runs as root
 * (--runas 0:CB_PASTA_GID: uid 0, and a group of its own that the host's firewall rule for it
 * matches, exec/pasta_guard.c) because dropping to nobody would lose the right to enter the
 * namespace and the parent-death signal that ends it with its keeper; it drops its capabilities but
 * CAP_NET_BIND_SERVICE and CAP_SYS_ADMIN itself and runs under its own seccomp filter. */
static void pasta_argv(struct cb_pasta *p)
{
	static char *const fixed[] = {
	    "pasta",	    "--foreground",
	    "--quiet",	    "--stderr",
	    "--runas",	    "0:" CB_PASTA_GID_TEXT,
	    "--config-net", "--no-map-gw",
	    "-t",	    "none",
	    "-u",	    "none",
	    "-T",	    "none",
	    "-U",	    "none",
	    "--netns",	    "/proc/self/fd/3",
	    "--netns-only", "--no-netns-quit",
	    "--pid",
	};
	size_t n = 0;

	for (; n < sizeof fixed / sizeof *fixed; n++)
		p->argv[n] = fixed[n];
	p->argv[n++] = p->pid_path;
	p->argv[n] = NULL;
	p->envp[0] = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
	p->envp[1] = NULL;
}

/* In the child of a raw clone: async-signal-safe calls only. */
static void pasta_child(struct cb_pasta *p, pid_t keeper_tid)
{
	static const char *const paths[] = {"/usr/bin/pasta", "/usr/local/bin/pasta",
					    "/usr/sbin/pasta"};
	int null = open("/dev/null", O_RDWR | O_CLOEXEC);

	/* Dies with the keeper thread, and so with the process, however that ends. */
	prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
	if (syscall(SYS_tgkill, getppid(), keeper_tid, 0) < 0)
		_exit(126); /* the keeper was already gone */
	if (null < 0 || dup2(null, 0) < 0 || dup2(null, 1) < 0 || dup2(p->log_fd, 2) < 0 ||
	    dup2(p->netns_fd, PASTA_NETNS_FD) < 0)
		_exit(126);
	/* Whatever the caller left without O_CLOEXEC stays out of pasta. */
	if (syscall(SYS_close_range, PASTA_NETNS_FD + 1, ~0U, 0) < 0)
		for (int fd = PASTA_NETNS_FD + 1; fd < 65536; fd++)
			close(fd);
	for (size_t i = 0; i < sizeof paths / sizeof *paths; i++)
		execve(paths[i], p->argv, p->envp);
	(void)!write(2, "cowbox: pasta is not installed (Debian package passt)\n", 54);
	_exit(127);
}

/* The keeper thread: spawns pasta (its parent-death signal is tied to this thread), then
 * waits for cb_pasta_stop to end and reap it. */
static void *pasta_keeper(void *arg)
{
	struct cb_pasta *p = arg;
	pid_t tid = (pid_t)syscall(SYS_gettid);
	int pidfd = -1;
	long pid = syscall(SYS_clone, CLONE_PIDFD | SIGCHLD, 0UL, &pidfd, 0UL, 0UL);

	if (pid == 0)
		pasta_child(p, tid);
	pthread_mutex_lock(&p->lock);
	if (pid < 0)
		p->spawn_err = errno;
	else
		p->pidfd = pidfd;
	p->spawned = 1;
	pthread_cond_broadcast(&p->cond);
	while (!p->stop)
		pthread_cond_wait(&p->cond, &p->lock);
	pthread_mutex_unlock(&p->lock);
	if (pidfd >= 0) {
		siginfo_t si;

		syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, NULL, 0);
		/* The daemon's reaper may have reaped it already (ECHILD): gone either way. */
		while (waitid((idtype_t)P_PIDFD, (id_t)pidfd, &si, WEXITED) < 0 && errno == EINTR)
			;
	}
	return NULL;
}

/* pasta wrote its pid file: the namespace is configured. */
static int pasta_ready(const struct cb_pasta *p)
{
	char buf[32];
	int fd = open(p->pid_path, O_RDONLY | O_CLOEXEC);
	ssize_t n = fd >= 0 ? read(fd, buf, sizeof buf) : -1;

	if (fd >= 0)
		close(fd);
	return n > 0;
}

/* What pasta said before it died, for the error message. */
static void pasta_last_words(const struct cb_pasta *p, char *out, size_t size)
{
	ssize_t n = pread(p->log_fd, out, size - 1, 0);

	out[n > 0 ? n : 0] = 0;
	for (char *c = out; *c; c++)
		if (*c == '\n')
			*c = ' ';
}

int cb_pasta_start(int netns_fd, const char *log_path, const char *pid_path, struct cb_pasta **out)
{
	struct cb_pasta *p = calloc(1, sizeof(*p));
	int rc = 0, keeper = 0;
	double t0 = cb_exec_now();

	*out = NULL;
	if (!p)
		return cb_error_set(ENOMEM, "pasta: out of memory");
	pthread_mutex_init(&p->lock, NULL);
	pthread_cond_init(&p->cond, NULL);
	p->pidfd = p->log_fd = -1;
	p->netns_fd = fcntl(netns_fd, F_DUPFD_CLOEXEC, PASTA_NETNS_FD + 1);
	p->log_fd = open(log_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	p->pid_path = strdup(pid_path);
	if (p->netns_fd < 0 || p->log_fd < 0 || !p->pid_path) {
		rc = cb_error_set(errno ? errno : ENOMEM, "pasta: %s: %s", log_path,
				  strerror(errno ? errno : ENOMEM));
		goto out;
	}
	unlink(pid_path);
	/* before pasta relays a single packet: the host's addresses are refused already, by the
	 * host's rule for pasta's group and by the namespace's own */
	if ((rc = cb_pasta_host_rule()) < 0 ||
	    (rc = cb_pasta_guard_start(p->netns_fd, &p->guard)) < 0)
		goto out;
	pasta_argv(p);
	if ((rc = pthread_create(&p->keeper, NULL, pasta_keeper, p))) {
		rc = cb_error_set(rc, "pasta: keeper thread: %s", strerror(rc));
		goto out;
	}
	keeper = 1;
	pthread_mutex_lock(&p->lock);
	while (!p->spawned)
		pthread_cond_wait(&p->cond, &p->lock);
	pthread_mutex_unlock(&p->lock);
	if (p->pidfd < 0) {
		rc = cb_error_set(p->spawn_err, "pasta: clone: %s", strerror(p->spawn_err));
		goto out;
	}
	for (;;) {
		struct pollfd pf = {.fd = p->pidfd, .events = POLLIN};

		if (pasta_ready(p))
			break;
		if (poll(&pf, 1, 20) > 0 || cb_exec_now() - t0 > PASTA_START_TIMEOUT) {
			char words[400];

			pasta_last_words(p, words, sizeof words);
			rc = cb_error_set(pf.revents ? ECHILD : ETIMEDOUT,
					  "network all: pasta %s: %s (log: %s)",
					  pf.revents ? "exited" : "did not start in time",
					  *words ? words : "no message", log_path);
			goto out;
		}
	}
	*out = p;
	p = NULL;
out:
	if (p && keeper)
		cb_pasta_stop(p);
	else if (p) {
		cb_pasta_guard_stop(p->guard);
		if (p->netns_fd >= 0)
			close(p->netns_fd);
		if (p->log_fd >= 0)
			close(p->log_fd);
		free(p->pid_path);
		pthread_mutex_destroy(&p->lock);
		pthread_cond_destroy(&p->cond);
		free(p);
	}
	return rc;
}

void cb_pasta_stop(struct cb_pasta *p)
{
	if (!p)
		return;
	pthread_mutex_lock(&p->lock);
	p->stop = 1;
	pthread_cond_broadcast(&p->cond);
	pthread_mutex_unlock(&p->lock);
	pthread_join(p->keeper, NULL);
	cb_pasta_guard_stop(p->guard);
	if (p->pidfd >= 0)
		close(p->pidfd);
	close(p->netns_fd);
	close(p->log_fd);
	unlink(p->pid_path);
	free(p->pid_path);
	pthread_mutex_destroy(&p->lock);
	pthread_cond_destroy(&p->cond);
	free(p);
}

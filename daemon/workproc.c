/* The daemon's worker processes: the spawner (forked at start-up) that forks them, the lines
 * they are spoken to with, the turn worker's calls and the pool of file workers. */
#include "config.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cowbox/backend.h"
#include "cowbox/error.h"
#include "cowbox/journal.h"
#include "daemon.h"

/* Why a spawner: a worker must hold no /dev/fuse fd and must be able to use malloc and
 * SQLite, so it cannot be forked from the daemon once its threads run (a lock another thread
 * held at the fork stays held in the child). The spawner is forked before any of that and
 * stays single-threaded; every worker, the first ones and each that replaces a dead one, is
 * its child. It dies with the daemon (PR_SET_PDEATHSIG), and the workers with it. */

/* ---- lines ---- */

json_t *cb_daemon_line_read(struct cb_daemon_lines *r)
{
	for (;;) {
		char *nl = r->buf ? memchr(r->buf, '\n', r->len) : NULL;
		ssize_t n;

		if (nl) {
			json_error_t jerr;
			size_t used = (size_t)(nl - r->buf) + 1;
			json_t *j = json_loadb(r->buf, used - 1, 0, &jerr);

			memmove(r->buf, r->buf + used, r->len - used);
			r->len -= used;
			if (!j)
				cb_error_set(EPROTO, "worker: bad line: %s", jerr.text);
			return j;
		}
		if (r->cap - r->len < 65536) {
			char *nb = realloc(r->buf, r->cap + 65536 + r->cap / 2);

			if (!nb) {
				cb_error_set(ENOMEM, "worker: out of memory");
				return NULL;
			}
			r->buf = nb;
			r->cap += 65536 + r->cap / 2;
		}
		do
			n = read(r->fd, r->buf + r->len, r->cap - r->len);
		while (n < 0 && errno == EINTR);
		if (n <= 0) {
			cb_error_set(n < 0 ? errno : EPIPE, "worker: %s",
				     n < 0 ? strerror(errno) : "connection closed");
			return NULL;
		}
		r->len += (size_t)n;
	}
}

/* Exactly n bytes more into a malloc'd *data (NUL-terminated one past n). */
static int cb_daemon_line_read_data(struct cb_daemon_lines *r, size_t n, void **data)
{
	char *buf = malloc(n + 1);
	size_t got = r->len < n ? r->len : n;

	*data = NULL;
	if (!buf)
		return cb_error_set(ENOMEM, "worker: out of memory");
	memcpy(buf, r->buf, got);
	memmove(r->buf, r->buf + got, r->len - got);
	r->len -= got;
	while (got < n) {
		ssize_t k = read(r->fd, buf + got, n - got);

		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0) {
			free(buf);
			return cb_error_set(k < 0 ? errno : EPIPE, "worker: %s",
					    k < 0 ? strerror(errno) : "connection closed");
		}
		got += (size_t)k;
	}
	buf[n] = 0;
	*data = buf;
	return 0;
}

static int send_all(int fd, const char *p, size_t len)
{
	while (len) {
		ssize_t n = send(fd, p, len, MSG_NOSIGNAL);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return cb_error_set(errno, "worker: %s", strerror(errno));
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

int cb_daemon_line_write(int fd, json_t *j, const void *data, size_t len)
{
	char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
	size_t n;
	int ret;

	json_decref(j);
	if (!s)
		return cb_error_set(ENOMEM, "worker: out of memory");
	n = strlen(s);
	s[n++] = '\n'; /* replaces the terminating NUL: the buffer holds n bytes */
	ret = send_all(fd, s, n);
	free(s);
	if (!ret && len)
		ret = send_all(fd, data, len);
	return ret;
}

/* ---- the spawner ---- */

enum { SPAWN_START = 1, SPAWN_WAIT = 2 };

/* One request or answer (a SOCK_SEQPACKET message): START comes with the new worker's socket
 * (status: 1 for the turn worker) and is answered with its pid (or -errno); WAIT pid is
 * answered with its wait status. */
struct spawn_msg {
	int op;
	pid_t pid;
	int status;
};

static int spawner_recv(int fd, struct spawn_msg *m, int *passed)
{
	char ctl[CMSG_SPACE(sizeof(int))];
	struct iovec iov = {.iov_base = m, .iov_len = sizeof(*m)};
	struct msghdr mh = {
	    .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof(ctl)};
	ssize_t n;

	*passed = -1;
	do
		n = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	if (n != (ssize_t)sizeof(*m))
		return -1;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
			memcpy(passed, CMSG_DATA(c), sizeof(int));
	return 0;
}

static void spawner_loop(int fd, int lock_fd)
{
	pid_t self = getpid();
	struct spawn_msg m;
	int wfd;

	while (spawner_recv(fd, &m, &wfd) == 0) {
		if (m.op == SPAWN_START && wfd >= 0) {
			pid_t pid = fork();

			if (pid == 0) {
				prctl(PR_SET_PDEATHSIG, SIGKILL);
				if (getppid() != self)
					_exit(1);
				/* A file worker's changes are journaled under the name of the
				 * daemon, whose API made them, as when the daemon made them. */
				prctl(PR_SET_NAME, m.status ? "cowbox-worker" : "cowbox");
				for (int i = 3; i < 1024; i++)
					if (i != wfd && i != lock_fd)
						close(i);
				cb_daemon_worker_loop(wfd);
				_exit(0);
			}
			m.pid = pid < 0 ? -errno : pid;
		} else if (m.op == SPAWN_WAIT) {
			m.status = -1;
			while (waitpid(m.pid, &m.status, 0) < 0 && errno == EINTR)
				;
		} else {
			m.pid = -EINVAL;
		}
		if (wfd >= 0)
			close(wfd);
		if (send(fd, &m, sizeof(m), MSG_NOSIGNAL) < 0)
			break;
	}
	/* The daemon is stopping (or gone): the workers' sockets are shut down too. */
	while (wait(NULL) > 0 || errno == EINTR)
		;
}

int cb_daemon_worker_start(struct cb_daemon *d)
{
	int sv[2];
	pid_t pid, parent = getpid();

	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
		return cb_error_set(errno, "worker spawner: socketpair: %s", strerror(errno));
	cb_daemon_spawn_lock();
	pid = fork();
	if (pid > 0 && cb_daemon_child_claim(pid) < 0) {
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
		pid = -1;
		errno = EAGAIN;
	}
	cb_daemon_spawn_unlock();
	if (pid < 0) {
		int err = errno;

		close(sv[0]);
		close(sv[1]);
		return cb_error_set(err, "worker spawner: fork: %s", strerror(err));
	}
	if (pid == 0) {
		/* Die with the daemon; if it is gone already, now. The lock fd stays open (in
		 * every worker too), so the workspace stays locked until they are all gone. */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(1);
		prctl(PR_SET_NAME, "cowbox-spawner");
		close(sv[0]);
		for (int fd = 3; fd < 1024; fd++)
			if (fd != sv[1] && fd != d->lock_fd)
				close(fd);
		spawner_loop(sv[1], d->lock_fd);
		_exit(0);
	}
	close(sv[1]);
	d->spawner_fd = sv[0];
	d->spawner_pid = pid;
	return 0;
}

/* One request to the spawner and its answer (under spawner_lock). */
static int spawner_call(struct cb_daemon *d, struct spawn_msg *m, int pass)
{
	char ctl[CMSG_SPACE(sizeof(int))] = {0};
	struct iovec iov = {.iov_base = m, .iov_len = sizeof(*m)};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
	ssize_t n;
	int ret = 0;

	pthread_mutex_lock(&d->spawner_lock);
	if (pass >= 0) {
		struct cmsghdr *c;

		mh.msg_control = ctl;
		mh.msg_controllen = sizeof(ctl);
		c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &pass, sizeof(int));
	}
	if (d->spawner_pid <= 0 || __atomic_load_n(&d->stopping, __ATOMIC_ACQUIRE))
		ret = cb_error_set(ESHUTDOWN, "the workspace daemon is stopping");
	else if (sendmsg(d->spawner_fd, &mh, MSG_NOSIGNAL) < 0)
		ret = -errno;
	else {
		do
			n = recv(d->spawner_fd, m, sizeof(*m), 0);
		while (n < 0 && errno == EINTR);
		if (n != (ssize_t)sizeof(*m))
			ret = n < 0 ? -errno : -EPIPE;
	}
	if (ret && ret != -ESHUTDOWN)
		ret = cb_error_set(-ret,
				   "the worker spawner (pid %d) is gone (%s); remount the "
				   "workspace (cowbox umount, cowbox mount)",
				   (int)d->spawner_pid, strerror(-ret));
	pthread_mutex_unlock(&d->spawner_lock);
	return ret;
}

static void wproc_close(struct cb_daemon_wproc *wp)
{
	if (wp->r) {
		close(wp->fd);
		free(wp->r->buf);
		free(wp->r);
	}
	wp->r = NULL;
	wp->fd = -1;
	wp->pid = 0;
}

static int wproc_died(struct cb_daemon *d, struct cb_daemon_wproc *wp, const char *what);

/* A new worker in wp, told the workspace's paths. */
static int wproc_spawn(struct cb_daemon *d, struct cb_daemon_wproc *wp)
{
	struct spawn_msg m = {.op = SPAWN_START, .status = wp == &d->worker};
	int sv[2], ret;

	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		return cb_error_set(errno, "worker: socketpair: %s", strerror(errno));
	ret = spawner_call(d, &m, sv[1]);
	close(sv[1]);
	if (!ret && m.pid < 0)
		ret = cb_error_set(-m.pid, "worker: fork: %s", strerror(-m.pid));
	if (ret) {
		close(sv[0]);
		return ret;
	}
	wp->r = calloc(1, sizeof(*wp->r));
	if (!wp->r) {
		close(sv[0]); /* the worker exits at the EOF */
		return cb_error_set(ENOMEM, "worker: out of memory");
	}
	wp->pid = m.pid;
	wp->fd = wp->r->fd = sv[0];
	ret =
	    cb_daemon_line_write(wp->fd,
				 json_pack("{s:s, s:s, s:s?, s:s, s:s, s:b}", "op", "init",
					   "mountpoint", d->mountpoint, "base", d->base, "dir",
					   d->dir, "db_path", d->db_path, "turn", wp == &d->worker),
				 NULL, 0);
	json_t *line = ret ? NULL : cb_daemon_line_read(wp->r);

	while (line && json_object_get(line, "took")) {
		json_decref(line);
		line = cb_daemon_line_read(wp->r);
	}
	if (!line)
		return wproc_died(d, wp, "new worker");
	if (json_object_get(line, "error"))
		ret = cb_error_set(EIO, "%s",
				   json_string_value(json_object_get(line, "message")) ?: "?");
	json_decref(line);
	return ret;
}

/* The worker in wp is gone (its socket said EOF): why, for the error of the call that found
 * out; wp is empty after, so the next call starts a new one. */
static int wproc_died(struct cb_daemon *d, struct cb_daemon_wproc *wp, const char *what)
{
	struct spawn_msg m = {.op = SPAWN_WAIT, .pid = wp->pid, .status = -1};
	pid_t pid = wp->pid;

	wproc_close(wp);
	if (__atomic_load_n(&d->stopping, __ATOMIC_ACQUIRE))
		return cb_error_set(ESHUTDOWN, "the workspace daemon is stopping");
	if (spawner_call(d, &m, -1) == 0 && m.status != -1 && WIFSIGNALED(m.status))
		return cb_error_set(EIO,
				    "the %s (pid %d) was killed by signal %d (%s); the next "
				    "request starts a new one",
				    what, (int)pid, WTERMSIG(m.status),
				    strsignal(WTERMSIG(m.status)));
	return cb_error_set(
	    EIO, "the %s (pid %d) exited (status %d); the next request starts a new one", what,
	    (int)pid, m.status != -1 && WIFEXITED(m.status) ? WEXITSTATUS(m.status) : -1);
}

/* Send req (consumed) and data to the worker in wp and read its answer: progress lines go to
 * conn, *result gets the reply's result (also of an error, for a rollback's count), *in the
 * bytes that followed it. */
static int wproc_call(struct cb_daemon *d, struct cb_daemon_wproc *wp, const char *what,
		      json_t *req, const void *out, size_t out_len, struct cb_daemon_conn *conn,
		      json_t *id, json_t **result, void **in, size_t *in_len)
{
	json_t *line = NULL, *v;
	int ret = 0;

	if (out_len)
		json_object_set_new(req, "n", json_integer((json_int_t)out_len));
	/* A worker that died before it took the request (it says "took" first thing, before
	 * acting on it) is replaced and the request sent again, once: it died while idle, or
	 * is still exiting from a kill that came before. One that dies after taking it fails
	 * the request, naming how it died. */
	for (int tries = 0, took = 0;; tries++) {
		if (!wp->pid && (!d->workers_ready || (ret = wproc_spawn(d, wp)))) {
			json_decref(req);
			return ret ? ret : cb_error_set(EAGAIN, "the %s is not started yet", what);
		}
		if (!cb_daemon_line_write(wp->fd, json_incref(req), out, out_len))
			while ((line = cb_daemon_line_read(wp->r))) {
				if (json_object_get(line, "took"))
					took = 1;
				else if (!(v = json_object_get(line, "progress")))
					break;
				else if (conn)
					cb_daemon_send_frame(
					    conn, id,
					    json_pack("{s:s, s:O, s:O, s:O, s:O}", "stream",
						      "progress", "files_done",
						      json_array_get(v, 0), "files_total",
						      json_array_get(v, 1), "bytes_done",
						      json_array_get(v, 2), "bytes_total",
						      json_array_get(v, 3)));
				json_decref(line);
			}
		if (line)
			break;
		ret = wproc_died(d, wp, what);
		if (took || tries || ret == -ESHUTDOWN) {
			json_decref(req);
			return ret;
		}
	}
	json_decref(req);
	v = json_object_get(line, json_object_get(line, "ok") ? "ok" : "result");
	if (json_object_get(line, "error")) {
		int err = (int)json_integer_value(json_object_get(line, "error"));

		ret = cb_error_set(err > 0 ? err : EIO, "%s",
				   json_string_value(json_object_get(line, "message")) ?: "?");
	} else if (in) {
		size_t n = (size_t)json_integer_value(json_object_get(v, "n"));

		if (cb_daemon_line_read_data(wp->r, n, in)) {
			json_decref(line);
			return wproc_died(d, wp, what);
		}
		*in_len = n;
	}
	if (result)
		*result = json_incref(v);
	json_decref(line);
	return ret;
}

int cb_daemon_worker_init(struct cb_daemon *d)
{
	struct cb_daemon_wproc *wp = &d->worker;
	int ret;

	__atomic_store_n(&d->workers_ready, 1, __ATOMIC_RELEASE);
	pthread_mutex_lock(&d->worker_lock);
	ret = wp->pid ? 0 : wproc_spawn(d, wp);
	pthread_mutex_unlock(&d->worker_lock);
	return ret;
}

int cb_daemon_worker_call(struct cb_daemon *d, json_t *req, struct cb_daemon_conn *conn, json_t *id,
			  json_t **result, long long *touched)
{
	json_t *res = NULL;
	int ret;

	if (result)
		*result = NULL;
	/* The worker reads journal rows from meta.db itself: every mark answered so far must be
	 * a row there, not only a record in the daemon's mark log. */
	if (d->db && (ret = cb_journal_fold(d->db))) {
		json_decref(req);
		return ret;
	}
	pthread_mutex_lock(&d->worker_lock);
	ret = wproc_call(d, &d->worker, "turn worker", req, NULL, 0, conn, id, &res, NULL, NULL);
	pthread_mutex_unlock(&d->worker_lock);
	if (touched)
		*touched = json_integer_value(json_object_get(res, "touched"));
	if (!ret && result)
		*result = res;
	else
		json_decref(res);
	return ret;
}

/* ---- the file workers ---- */

/* A call on an idle file worker: a live one if there is, else a slot to start one in. */
static int files_call(struct cb_daemon *d, json_t *req, const void *out, size_t out_len,
		      json_t **result, void **in, size_t *in_len)
{
	struct cb_daemon_wproc *wp = NULL;
	int ret;

	pthread_mutex_lock(&d->files_lock);
	while (!wp && !__atomic_load_n(&d->stopping, __ATOMIC_ACQUIRE)) {
		for (int pass = 0; !wp && pass < 2; pass++)
			for (int i = 0; !wp && i < CB_DAEMON_FILE_WORKERS; i++)
				if (!d->files[i].busy && (d->files[i].pid == 0) == pass)
					wp = &d->files[i];
		if (!wp)
			pthread_cond_wait(&d->files_cond, &d->files_lock);
	}
	if (wp)
		wp->busy = 1;
	pthread_mutex_unlock(&d->files_lock);
	if (!wp) {
		json_decref(req);
		return cb_error_set(ESHUTDOWN, "the workspace daemon is stopping");
	}
	ret = wproc_call(d, wp, "file worker", req, out, out_len, NULL, NULL, result, in, in_len);
	pthread_mutex_lock(&d->files_lock);
	wp->busy = 0;
	pthread_cond_broadcast(&d->files_cond); /* a caller, or cb_daemon_worker_reap */
	pthread_mutex_unlock(&d->files_lock);
	return ret;
}

static int io_read(void *arg, const char *path, off_t off, size_t len, void **data, size_t *n,
		   off_t *size)
{
	json_t *res = NULL;
	int ret = files_call(arg,
			     json_pack("{s:s, s:s, s:I, s:I}", "op", "read", "path", path, "offset",
				       (json_int_t)off, "length", (json_int_t)len),
			     NULL, 0, &res, data, n);

	if (!ret)
		*size = (off_t)json_integer_value(json_object_get(res, "size"));
	json_decref(res);
	return ret;
}

static int io_write(void *arg, const char *path, off_t off, const void *data, size_t len,
		    int truncate, mode_t mode)
{
	return files_call(arg,
			  json_pack("{s:s, s:s, s:I, s:b, s:i}", "op", "write", "path", path,
				    "offset", (json_int_t)off, "truncate", truncate, "mode",
				    (int)mode),
			  data, len, NULL, NULL, NULL);
}

static int io_mkdirs(void *arg, const char *path)
{
	return files_call(arg, json_pack("{s:s, s:s}", "op", "mkdirs", "path", path), NULL, 0, NULL,
			  NULL, NULL);
}

const struct cb_backend_io cb_daemon_backend_io = {
    .read = io_read,
    .write = io_write,
    .mkdirs = io_mkdirs,
};

int cb_daemon_worker_file_op(const char *root, const char *op, json_t *req,
			     struct cb_daemon_lines *r, json_t **res, void **data, size_t *n)
{
	const char *path = json_string_value(json_object_get(req, "path")) ?: "";
	off_t off = (off_t)json_integer_value(json_object_get(req, "offset"));
	size_t len = (size_t)json_integer_value(json_object_get(req, "n"));
	off_t size = 0;
	void *in = NULL;
	int ret;

	*data = NULL;
	*n = 0;
	if (!strcmp(op, "read")) {
		ret = cb_backend_read_at(root, path, off,
					 (size_t)json_integer_value(json_object_get(req, "length")),
					 data, n, &size);
		if (!ret)
			*res =
			    json_pack("{s:I, s:I}", "size", (json_int_t)size, "n", (json_int_t)*n);
		return ret;
	}
	if (!strcmp(op, "mkdirs"))
		return cb_backend_mkdirs_at(root, path);
	/* A write's bytes follow its line, also when it will fail: read them all first. */
	if ((ret = cb_daemon_line_read_data(r, len, &in)))
		return ret;
	ret = cb_backend_write_at(root, path, off, in, len,
				  json_is_true(json_object_get(req, "truncate")),
				  (mode_t)json_integer_value(json_object_get(req, "mode")));
	free(in);
	return ret;
}

/* ---- stopping ---- */

void cb_daemon_worker_stop(struct cb_daemon *d)
{
	/* EOF for each worker (its loop ends) and for a thread waiting on its answer; no close
	 * yet: such a thread may still be using the descriptor. */
	pthread_mutex_lock(&d->files_lock);
	/* A busy one is its caller's (who may be replacing it): it answers, or fails once the
	 * FUSE session is destroyed, and is closed by cb_daemon_worker_reap. */
	for (int i = 0; i < CB_DAEMON_FILE_WORKERS; i++)
		if (d->files[i].pid && !d->files[i].busy)
			shutdown(d->files[i].fd, SHUT_RDWR);
	pthread_cond_broadcast(&d->files_cond);
	pthread_mutex_unlock(&d->files_lock);
	/* The turn worker's fd is only closed under worker_lock, which a call may hold. */
	if (d->worker.pid)
		shutdown(d->worker.fd, SHUT_RDWR);
}

void cb_daemon_worker_reap(struct cb_daemon *d)
{
	cb_daemon_worker_stop(d);
	/* A connection that outlived the shutdown may still be in a call: it ends at the EOF. */
	pthread_mutex_lock(&d->worker_lock);
	wproc_close(&d->worker);
	pthread_mutex_unlock(&d->worker_lock);
	pthread_mutex_lock(&d->files_lock);
	for (int i = 0; i < CB_DAEMON_FILE_WORKERS; i++) {
		while (d->files[i].busy)
			pthread_cond_wait(&d->files_cond, &d->files_lock);
		wproc_close(&d->files[i]);
	}
	pthread_mutex_unlock(&d->files_lock);
	/* The spawner waits for every worker, then exits at the EOF. */
	pthread_mutex_lock(&d->spawner_lock);
	if (d->spawner_pid > 0) {
		shutdown(d->spawner_fd, SHUT_RDWR);
		close(d->spawner_fd);
		if (waitpid(d->spawner_pid, NULL, 0) == d->spawner_pid)
			cb_daemon_child_release(d->spawner_pid);
	}
	d->spawner_pid = 0;
	d->spawner_fd = -1;
	pthread_mutex_unlock(&d->spawner_lock);
}

/* The turn worker: a child process that does every read and write the turn ops make through
 * the daemon's own mount, so that no daemon thread ever waits for an answer from itself. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "cowbox/turns.h"
#include "daemon.h"

/* Why a process: a thread of the daemon that reads the mount waits in the kernel for the
 * daemon's answer. If the daemon is killed meanwhile, that wait cannot end (the request was
 * already taken by a FUSE thread that is now dead) until /dev/fuse is closed, and /dev/fuse
 * is only closed when the last thread of the daemon is gone: the process never finishes
 * dying. The worker holds no /dev/fuse fd (it is forked before the mount), so when the daemon
 * dies its connection is aborted, the worker's requests fail with ENOTCONN and it exits. */

/* ---- lines over the socket (both ends) ---- */

struct line_reader {
	int fd;
	char *buf;
	size_t len, cap;
};

/* The next line (without its newline) as JSON; NULL at EOF or on an error (message set). */
static json_t *line_read(struct line_reader *r)
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
				cb_error_set(EPROTO, "turn worker: bad line: %s", jerr.text);
			return j;
		}
		if (r->cap - r->len < 65536) {
			char *nb = realloc(r->buf, r->cap + 65536 + r->cap / 2);

			if (!nb) {
				cb_error_set(ENOMEM, "turn worker: out of memory");
				return NULL;
			}
			r->buf = nb;
			r->cap += 65536 + r->cap / 2;
		}
		do
			n = read(r->fd, r->buf + r->len, r->cap - r->len);
		while (n < 0 && errno == EINTR);
		if (n <= 0) {
			cb_error_set(n < 0 ? errno : EPIPE, "turn worker: %s",
				     n < 0 ? strerror(errno) : "connection closed");
			return NULL;
		}
		r->len += (size_t)n;
	}
}

/* Write j (consumed) and a newline, all of it. */
static int line_write(int fd, json_t *j)
{
	char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
	size_t len, off = 0;
	int ret = 0;

	json_decref(j);
	if (!s)
		return cb_error_set(ENOMEM, "turn worker: out of memory");
	len = strlen(s);
	s[len++] = '\n'; /* replaces the terminating NUL: the buffer holds len bytes */
	while (off < len) {
		ssize_t n = send(fd, s + off, len - off, MSG_NOSIGNAL);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			ret = cb_error_set(errno, "turn worker: %s", strerror(errno));
			break;
		}
		off += (size_t)n;
	}
	free(s);
	return ret;
}

/* ---- the worker's side ---- */

struct worker_state {
	int fd;
	char *mountpoint, *base, *dir, *db_path;
	/* What a rollback wrote, for the snapshot that records it. No handle (and so no fd on
	 * the mount) is kept between requests: an idle worker never keeps the mount busy. */
	struct cb_ws_known *known;
};

static void worker_progress(void *arg, long long files_done, long long files_total,
			    long long bytes_done, long long bytes_total)
{
	struct worker_state *w = arg;

	line_write(w->fd, json_pack("{s:[I,I,I,I]}", "progress", (json_int_t)files_done,
				    (json_int_t)files_total, (json_int_t)bytes_done,
				    (json_int_t)bytes_total));
}

/* COWBOX_SNAPSHOT_MAX_BYTES from the daemon's environment: bytes, with an optional K, M,
 * G or T (binary) suffix; "0" or unset is the default bound, "-1" none. */
static int turns_read_bound(long long *out)
{
	const char *v = getenv("COWBOX_SNAPSHOT_MAX_BYTES");
	char *end = NULL;
	long long n;
	int shift = 0;

	*out = 0;
	if (!v || !*v)
		return 0;
	errno = 0;
	n = strtoll(v, &end, 10);
	switch (*end) {
	case 'K':
	case 'k':
		shift = 10;
		break;
	case 'M':
	case 'm':
		shift = 20;
		break;
	case 'G':
	case 'g':
		shift = 30;
		break;
	case 'T':
	case 't':
		shift = 40;
		break;
	}
	if (shift)
		end++;
	if (errno || end == v || *end || n < -1 || (shift && n > (LLONG_MAX >> shift)))
		return cb_error_set(
		    EINVAL,
		    "COWBOX_SNAPSHOT_MAX_BYTES=%s is not a size (bytes, or a number "
		    "with K, M, G or T; -1: no bound)",
		    v);
	*out = n < 0 ? -1 : n << shift;
	return 0;
}

static int worker_open(struct worker_state *w, int progress, struct cb_turns **t)
{
	char blobs[4096];
	long long bound;
	int ret = turns_read_bound(&bound);

	if (ret)
		return ret;
	struct cb_turns_config cfg = {
	    .db_path = w->db_path,
	    .blob_dir = blobs,
	    .base_dir = w->base,
	    .root = w->mountpoint,
	    .progress = progress ? worker_progress : NULL,
	    .progress_arg = w,
	    .snapshot_max_bytes = bound,
	};

	snprintf(blobs, sizeof(blobs), "%s/blobs", w->dir);
	ret = cb_turns_open(&cfg, t);
	if (!ret)
		cb_daemon_basecache_attach(w->dir, *t, w->base);
	return ret;
}

/* Close t, logging what the base hashing of a first map did. */
static void worker_close(struct cb_turns *t, const char *what)
{
	if (t)
		cb_daemon_base_stats_log(t, what);
	cb_turns_close(t);
}

/* Flush dirty pages so that their FUSE writes are journaled before the rows are read. */
static int worker_sync(struct worker_state *w)
{
	int fd = open(w->mountpoint, O_RDONLY | O_DIRECTORY | O_CLOEXEC), ret = 0;

	if (fd < 0)
		return cb_error_set(errno, "open %s: %s", w->mountpoint, strerror(errno));
	/* syncfs reports a writeback error of any file once (errseq), even of a file deleted
	 * since; the second call says whether the flush itself works. */
	if (syncfs(fd) < 0 && syncfs(fd) < 0)
		ret = cb_error_set(errno, "syncfs %s: %s", w->mountpoint, strerror(errno));
	close(fd);
	return ret;
}

static json_t *entry_json(const struct cb_entry *e)
{
	char hex[2 * CB_SHA256_LEN + 1];
	json_t *j = json_pack("{s:s}", "type", cb_entry_type_name(e->type));

	if (!j || e->type == CB_ENTRY_ABSENT)
		return j;
	json_object_set_new(j, "mode", json_integer(e->mode));
	json_object_set_new(j, "size", json_integer(e->size));
	if (e->type == CB_ENTRY_FILE) {
		cb_hex(e->sha256, CB_SHA256_LEN, hex);
		json_object_set_new(j, "sha256", json_string(hex));
	}
	if (e->type == CB_ENTRY_SYMLINK)
		json_object_set_new(j, "target", json_string(e->target));
	return j;
}

/* Where the bytes of a file entry of turn can be read (for --patch): base, blob, or live. */
static json_t *entry_source(struct worker_state *w, struct cb_turns *t, const struct cb_entry *e,
			    long long turn)
{
	char buf[4200], hex[2 * CB_XXH128_LEN + 1];

	if (e->type != CB_ENTRY_FILE)
		return json_null();
	if (turn < 0) {
		snprintf(buf, sizeof(buf), "%s/%s", w->mountpoint, e->path);
		return json_string(buf);
	}
	if (cb_ws_base_holds(t, e->path, e->xxh3) == 1) {
		snprintf(buf, sizeof(buf), "%s/%s", w->base, e->path);
	} else {
		cb_hex(e->xxh3, CB_XXH128_LEN, hex);
		snprintf(buf, sizeof(buf), "%s/blobs/%s", w->dir, hex);
	}
	cb_error_clear();
	return json_string(buf);
}

json_t *cb_daemon_events_json(const char *mountpoint, const char *base, const char *dir,
			      struct cb_turns *t, const struct cb_diff *diff, long long a,
			      long long b, int sources)
{
	struct worker_state ws = {
	    .mountpoint = (char *)mountpoint, .base = (char *)base, .dir = (char *)dir};
	struct worker_state *w = &ws;
	json_t *arr = json_array();

	for (size_t i = 0; arr && i < diff->n; i++) {
		const struct cb_diff_event *ev = &diff->ev[i];
		const struct cb_entry *who =
		    ev->new.type != CB_ENTRY_ABSENT || ev->new.pid ? &ev->new : &ev->old;
		json_t *j =
		    json_pack("{s:s, s:s, s:o, s:o}", "event", cb_ws_diff_kind_name(ev->kind),
			      "path", ev->old.path ? ev->old.path : ev->new.path, "old",
			      entry_json(&ev->old), "new", entry_json(&ev->new));

		if (!j)
			continue;
		json_object_set_new(j, "pid", json_integer(who == &ev->new ? ev->new.pid : 0));
		json_object_set_new(j, "comm",
				    ev->new.comm ? json_string(ev->new.comm) : json_null());
		if (sources) {
			json_object_set_new(j, "old_src", entry_source(w, t, &ev->old, a));
			json_object_set_new(j, "new_src", entry_source(w, t, &ev->new, b));
		}
		json_array_append_new(arr, j);
	}
	return arr;
}

static int files_add(const struct cb_entry *e, void *arg)
{
	char hex[2 * CB_SHA256_LEN + 1];

	if (e->type != CB_ENTRY_FILE)
		return 0;
	cb_hex(e->sha256, CB_SHA256_LEN, hex);
	return json_object_set_new(arg, e->path, json_string(hex)) ? -ENOMEM : 0;
}

/* The dirty list of a request: [[path, subtree, pid, comm], ...]; the strings stay owned by
 * req. */
static int dirty_from_json(json_t *req, struct cb_dirty **out, size_t *n)
{
	json_t *arr = json_object_get(req, "dirty"), *row;
	size_t i;

	*out = NULL;
	*n = json_array_size(arr);
	if (!*n)
		return 0;
	*out = calloc(*n, sizeof(**out));
	if (!*out)
		return cb_error_set(ENOMEM, "turn worker: out of memory");
	json_array_foreach(arr, i, row)
	{
		(*out)[i].path = json_string_value(json_array_get(row, 0));
		(*out)[i].subtree = (int)json_integer_value(json_array_get(row, 1));
		(*out)[i].pid = (pid_t)json_integer_value(json_array_get(row, 2));
		(*out)[i].comm = json_string_value(json_array_get(row, 3));
		if (!(*out)[i].path)
			(*out)[i].path = "";
	}
	return 0;
}

static int worker_snapshot(struct worker_state *w, json_t *req, json_t **res)
{
	long long turn = json_integer_value(json_object_get(req, "turn"));
	int want_changes = json_is_true(json_object_get(req, "changes"));
	struct cb_turns *t = NULL;
	struct cb_diff changes = {0};
	struct cb_dirty *dirty = NULL;
	size_t n = 0;
	int ret = worker_open(w, json_is_true(json_object_get(req, "progress")), &t);

	if (!ret)
		cb_ws_known_put(t, w->known);
	else
		cb_ws_known_free(w->known);
	w->known = NULL;
	if (!ret)
		ret = dirty_from_json(req, &dirty, &n);
	if (!ret)
		ret = cb_ws_snapshot(t, turn, dirty, n,
				     json_string_value(json_object_get(req, "label")),
				     want_changes ? &changes : NULL);
	if (!ret) {
		*res = json_object();
		if (want_changes)
			json_object_set_new(*res, "changes",
					    cb_daemon_events_json(w->mountpoint, w->base, w->dir, t,
								  &changes, turn - 1, turn, 0));
		if (json_is_true(json_object_get(req, "files"))) {
			json_t *files = json_object();

			ret = cb_ws_map_list(t, files_add, files);
			json_object_set_new(*res, "files", files);
		}
	}
	cb_ws_diff_free(&changes);
	free(dirty);
	worker_close(t, "snapshot");
	return ret;
}

static int worker_diff(struct worker_state *w, json_t *req, json_t **res)
{
	long long a = json_integer_value(json_object_get(req, "a"));
	long long b = json_integer_value(json_object_get(req, "b"));
	struct cb_turns *t = NULL;
	struct cb_diff diff = {0};
	struct cb_dirty *dirty = NULL;
	size_t n = 0;
	int ret = worker_open(w, 0, &t);

	if (!ret)
		ret = dirty_from_json(req, &dirty, &n);
	if (!ret)
		ret = cb_ws_diff(t, a, b, dirty, n, &diff);
	if (!ret)
		*res =
		    json_pack("{s:o}", "events",
			      cb_daemon_events_json(w->mountpoint, w->base, w->dir, t, &diff, a, b,
						    json_is_true(json_object_get(req, "sources"))));
	cb_ws_diff_free(&diff);
	free(dirty);
	worker_close(t, "diff");
	return ret;
}

static int worker_rollback(struct worker_state *w, json_t *req, json_t **res)
{
	struct cb_turns *t = NULL;
	struct cb_dirty *dirty = NULL;
	long long touched = 0;
	char pending[4200];
	size_t n = 0;
	int ret = worker_open(w, 0, &t), fd;

	/* Until the rollback is done, its temporary names may be in the tree: the next start
	 * removes them if it finds this mark (cb_daemon_rollback_recover). */
	snprintf(pending, sizeof(pending), "%s/" CB_DAEMON_ROLLBACK_PENDING, w->dir);
	fd = open(pending, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
	if (fd >= 0)
		close(fd);

	if (!ret)
		ret = dirty_from_json(req, &dirty, &n);
	if (!ret)
		ret = cb_ws_rollback(t, json_integer_value(json_object_get(req, "turn")), dirty, n,
				     &touched);
	if (!ret)
		unlink(pending);
	/* An error reply carries no result: the count goes in the error line. */
	*res = json_pack("{s:I}", "touched", (json_int_t)touched);
	if (!ret || touched)
		w->known = cb_ws_known_take(t); /* the daemon snapshots next */
	worker_close(t, "rollback");
	free(dirty);
	return ret;
}

static int worker_init(struct worker_state *w, json_t *req)
{
	const char *base = json_string_value(json_object_get(req, "base"));

	free(w->mountpoint);
	free(w->base);
	free(w->dir);
	free(w->db_path);
	w->mountpoint = strdup(json_string_value(json_object_get(req, "mountpoint")) ?: "");
	w->dir = strdup(json_string_value(json_object_get(req, "dir")) ?: "");
	w->db_path = strdup(json_string_value(json_object_get(req, "db_path")) ?: "");
	w->base = base ? strdup(base) : NULL;
	if (!w->mountpoint || !w->dir || !w->db_path || (base && !w->base))
		return cb_error_set(ENOMEM, "turn worker: out of memory");
	return 0;
}

/* Serve requests until the daemon closes its end (or dies). */
static void worker_loop(int fd)
{
	struct worker_state w = {.fd = fd};
	struct line_reader r = {.fd = fd};
	json_t *req;

	while ((req = line_read(&r))) {
		const char *op = json_string_value(json_object_get(req, "op"));
		json_t *res = NULL, *reply;
		int ret;

		cb_error_clear();
		/* What the rollback wrote is for the snapshot right after it and nothing else. */
		if (w.known && op && strcmp(op, "sync") && strcmp(op, "snapshot")) {
			cb_ws_known_free(w.known);
			w.known = NULL;
		}
		if (!op)
			ret = cb_error_set(EINVAL, "turn worker: request without an op");
		else if (!strcmp(op, "init"))
			ret = worker_init(&w, req);
		else if (!strcmp(op, "sync"))
			ret = worker_sync(&w);
		else if (!strcmp(op, "snapshot"))
			ret = worker_snapshot(&w, req, &res);
		else if (!strcmp(op, "diff"))
			ret = worker_diff(&w, req, &res);
		else if (!strcmp(op, "rollback"))
			ret = worker_rollback(&w, req, &res);
		else
			ret = cb_error_set(EINVAL, "turn worker: unknown op %s", op);
		if (ret)
			reply = json_pack("{s:i, s:s, s:o*}", "error", -ret, "message",
					  cb_error_message(), "result", res);
		else
			reply = json_pack("{s:o}", "ok", res ? res : json_object());
		json_decref(req);
		if (line_write(fd, reply))
			break;
	}
	cb_ws_known_free(w.known);
	free(r.buf);
	free(w.mountpoint);
	free(w.base);
	free(w.dir);
	free(w.db_path);
}

/* ---- the daemon's side ---- */

void cb_daemon_rollback_recover(struct cb_daemon *d)
{
	char pending[4200];
	long long removed = 0;

	snprintf(pending, sizeof(pending), "%s/" CB_DAEMON_ROLLBACK_PENDING, d->dir);
	if (access(pending, F_OK) < 0)
		return;
	if (cb_ws_rollback_clean(d->upper, &removed) == 0)
		unlink(pending);
	else
		fprintf(stderr, "cowbox: %s\n", cb_error_message());
	if (removed)
		fprintf(stderr,
			"cowbox: removed %lld temporary file(s) of an interrupted rollback\n",
			removed);
	cb_error_clear();
}

int cb_daemon_worker_start(struct cb_daemon *d)
{
	int sv[2];
	pid_t pid, parent = getpid();

	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		return cb_error_set(errno, "turn worker: socketpair: %s", strerror(errno));
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
		return cb_error_set(err, "turn worker: fork: %s", strerror(err));
	}
	if (pid == 0) {
		/* Die with the daemon; if it is gone already, now. The lock fd stays open, so
		 * the workspace stays locked until the worker is gone too. */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(1);
		prctl(PR_SET_NAME, "cowbox-worker");
		close(sv[0]);
		for (int fd = 3; fd < 1024; fd++)
			if (fd != sv[1] && fd != d->lock_fd)
				close(fd);
		worker_loop(sv[1]);
		_exit(0);
	}
	close(sv[1]);
	d->worker_fd = sv[0];
	d->worker_pid = pid;
	d->worker_reader = calloc(1, sizeof(struct line_reader));
	if (!d->worker_reader)
		return cb_error_set(ENOMEM, "turn worker: out of memory");
	((struct line_reader *)d->worker_reader)->fd = sv[0];
	return 0;
}

int cb_daemon_worker_init(struct cb_daemon *d)
{
	json_t *req =
	    json_pack("{s:s, s:s, s:s?, s:s, s:s}", "op", "init", "mountpoint", d->mountpoint,
		      "base", d->base, "dir", d->dir, "db_path", d->db_path);

	return cb_daemon_worker_call(d, req, NULL, NULL, NULL, NULL);
}

/* The worker is gone: say how, for the error of the op that found out. */
static int worker_died(struct cb_daemon *d)
{
	int status = 0;
	pid_t pid = d->worker_pid;

	/* Stopping: the worker is being shut down (and reaped by cb_daemon_worker_reap). */
	if (__atomic_load_n(&d->stopping, __ATOMIC_ACQUIRE))
		return cb_error_set(ESHUTDOWN, "the workspace daemon is stopping");

	if (pid > 0 && waitpid(pid, &status, 0) == pid) {
		cb_daemon_child_release(pid);
		d->worker_pid = 0;
	}
	if (d->worker_fd >= 0)
		close(d->worker_fd);
	d->worker_fd = -1;
	if (WIFSIGNALED(status))
		return cb_error_set(EIO,
				    "the turn worker (pid %d) was killed by signal %d (%s); "
				    "remount the workspace (cowbox umount, cowbox mount)",
				    (int)pid, WTERMSIG(status), strsignal(WTERMSIG(status)));
	return cb_error_set(EIO,
			    "the turn worker (pid %d) exited (status %d); remount the workspace "
			    "(cowbox umount, cowbox mount)",
			    (int)pid, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}

int cb_daemon_worker_call(struct cb_daemon *d, json_t *req, struct cb_daemon_conn *conn, json_t *id,
			  json_t **result, long long *touched)
{
	json_t *line = NULL, *v;
	int ret;

	if (result)
		*result = NULL;
	pthread_mutex_lock(&d->worker_lock);
	if (d->worker_fd < 0) {
		json_decref(req);
		ret = cb_error_set(EIO, "the turn worker is gone; remount the workspace");
		goto out;
	}
	ret = line_write(d->worker_fd, req);
	if (ret) {
		ret = worker_died(d);
		goto out;
	}
	for (;;) {
		line = line_read(d->worker_reader);
		if (!line) {
			ret = worker_died(d);
			goto out;
		}
		if (!(v = json_object_get(line, "progress")))
			break;
		if (conn)
			cb_daemon_send_frame(
			    conn, id,
			    json_pack("{s:s, s:O, s:O, s:O, s:O}", "stream", "progress",
				      "files_done", json_array_get(v, 0), "files_total",
				      json_array_get(v, 1), "bytes_done", json_array_get(v, 2),
				      "bytes_total", json_array_get(v, 3)));
		json_decref(line);
	}
	v = json_object_get(line, json_object_get(line, "ok") ? "ok" : "result");
	if (touched)
		*touched = json_integer_value(json_object_get(v, "touched"));
	if (json_object_get(line, "error")) {
		int err = (int)json_integer_value(json_object_get(line, "error"));

		ret = cb_error_set(err > 0 ? err : EIO, "%s",
				   json_string_value(json_object_get(line, "message")) ?: "?");
	} else if (result) {
		*result = json_incref(v);
	}
out:
	json_decref(line);
	pthread_mutex_unlock(&d->worker_lock);
	return ret;
}

void cb_daemon_worker_stop(struct cb_daemon *d)
{
	/* EOF for the worker (its loop ends) and for a thread waiting on its answer; no close
	 * yet: such a thread may still be using the descriptor. */
	if (d->worker_fd >= 0)
		shutdown(d->worker_fd, SHUT_RDWR);
}

void cb_daemon_worker_reap(struct cb_daemon *d)
{
	struct line_reader *r;

	cb_daemon_worker_stop(d);
	/* A connection that outlived the shutdown may still be in a call: it ends at the EOF. */
	pthread_mutex_lock(&d->worker_lock);
	r = d->worker_reader;
	if (d->worker_fd >= 0)
		close(d->worker_fd);
	d->worker_fd = -1;
	if (d->worker_pid > 0 && waitpid(d->worker_pid, NULL, 0) == d->worker_pid)
		cb_daemon_child_release(d->worker_pid);
	d->worker_pid = 0;
	if (r)
		free(r->buf);
	free(r);
	d->worker_reader = NULL;
	pthread_mutex_unlock(&d->worker_lock);
}

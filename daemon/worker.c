/* A worker process's side: every read and write the turn ops and the API's file ops make
 * through the daemon's own mount, so that no daemon thread ever waits for an answer from itself. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cowbox/basecache.h"
#include "cowbox/error.h"
#include "cowbox/turns.h"
#include "cowbox/workspace.h"
#include "daemon.h"

/* Why a process: a thread of the daemon that reads the mount waits in the kernel for the
 * daemon's answer. If the daemon is killed meanwhile, that wait cannot end (the request was
 * already taken by a FUSE thread that is now dead) until /dev/fuse is closed, and /dev/fuse
 * is only closed when the last thread of the daemon is gone: the process never finishes
 * dying. The worker holds no /dev/fuse fd (it is forked before the mount), so when the daemon
 * dies its connection is aborted, the worker's requests fail with ENOTCONN and it exits. */

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

	cb_daemon_line_write(w->fd,
			     json_pack("{s:[I,I,I,I]}", "progress", (json_int_t)files_done,
				       (json_int_t)files_total, (json_int_t)bytes_done,
				       (json_int_t)bytes_total),
			     NULL, 0);
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

/* The daemon shut our socket down (it is stopping) or died: a snapshot hashing a huge file
 * gives up rather than hold the stop up. */
static int worker_daemon_gone(void *arg)
{
	struct worker_state *w = arg;
	struct pollfd p = {.fd = w->fd, .events = POLLRDHUP};

	return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

static int worker_open(struct worker_state *w, int progress, struct cb_turns **t)
{
	char blobs[4096];
	unsigned long ids = 0;
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
	    .stopping = worker_daemon_gone,
	    .stopping_arg = w,
	    .snapshot_max_bytes = bound,
	};

	snprintf(blobs, sizeof(blobs), "%s/blobs", w->dir);
	ret = cb_turns_open(&cfg, t);
	if (!ret)
		cb_daemon_basecache_attach(w->dir, *t, w->base);
	/* A rollback gives files their owners in this workspace's id range (none: as root
	 * made them, as before). */
	if (!ret) {
		if (cb_ws_ids_get(w->dir, &ids) == 0 && ids)
			cb_turns_set_restore_ids(*t, ids);
		cb_error_clear();
	}
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

/* The journal rows a request names: "rows": [names_turn, from, to]. The worker reads them
 * itself, from the database: neither process holds them all, nor a line that lists them. */
static void span_from_json(json_t *req, struct cb_journal_span *span)
{
	json_t *rows = json_object_get(req, "rows");

	span->names_turn = json_integer_value(json_array_get(rows, 0));
	span->from = json_integer_value(json_array_get(rows, 1));
	span->to = json_integer_value(json_array_get(rows, 2));
	if (!json_is_array(rows))
		span->from = 1, span->to = 0; /* none */
}

static int worker_snapshot(struct worker_state *w, json_t *req, json_t **res)
{
	long long turn = json_integer_value(json_object_get(req, "turn"));
	int want_changes = json_is_true(json_object_get(req, "changes"));
	struct cb_turns *t = NULL;
	struct cb_diff changes = {0};
	struct cb_journal_span span;
	int ret = worker_open(w, json_is_true(json_object_get(req, "progress")), &t);

	if (!ret)
		cb_ws_known_put(t, w->known);
	else
		cb_ws_known_free(w->known);
	if (!ret && json_is_true(json_object_get(req, "base_prepared")))
		cb_ws_base_trust_prepared(t);
	if (!ret && json_is_true(json_object_get(req, "defer_map")))
		cb_ws_snapshot_defer_map(t);
	if (!ret && json_is_true(json_object_get(req, "skip_empty")))
		cb_ws_snapshot_skip_empty(t);
	w->known = NULL;
	span_from_json(req, &span);
	if (!ret)
		ret = cb_ws_snapshot_journal(t, turn, &span,
					     json_string_value(json_object_get(req, "label")),
					     want_changes ? &changes : NULL);
	if (!ret) {
		*res = json_object();
		if (cb_ws_snapshot_skipped(t))
			json_object_set_new(*res, "recorded", json_false());
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
	worker_close(t, "snapshot");
	return ret;
}

static int worker_diff(struct worker_state *w, json_t *req, json_t **res)
{
	long long a = json_integer_value(json_object_get(req, "a"));
	long long b = json_integer_value(json_object_get(req, "b"));
	struct cb_turns *t = NULL;
	struct cb_diff diff = {0};
	struct cb_journal_span span;
	struct cb_dirty *dirty = NULL;
	size_t n = 0;
	int ret = worker_open(w, 0, &t);

	span_from_json(req, &span);
	if (!ret)
		ret = cb_ws_journal_dirty(t, &span, &dirty, &n);
	if (!ret)
		ret = cb_ws_diff(t, a, b, dirty, n, &diff);
	if (!ret)
		*res =
		    json_pack("{s:o}", "events",
			      cb_daemon_events_json(w->mountpoint, w->base, w->dir, t, &diff, a, b,
						    json_is_true(json_object_get(req, "sources"))));
	cb_ws_diff_free(&diff);
	cb_ws_dirty_free(dirty, n);
	worker_close(t, "diff");
	return ret;
}

static int worker_rollback(struct worker_state *w, json_t *req, json_t **res)
{
	struct cb_turns *t = NULL;
	struct cb_journal_span span;
	struct cb_dirty *dirty = NULL;
	long long touched = 0;
	char pending[4200];
	const char **check;
	size_t n = 0, ncheck;
	int ret = worker_open(w, 0, &t), fd;

	/* Until the rollback is done, its temporary names may be in the tree: the next start
	 * removes them if it finds this mark (cb_daemon_rollback_recover). */
	snprintf(pending, sizeof(pending), "%s/" CB_DAEMON_ROLLBACK_PENDING, w->dir);
	fd = open(pending, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
	if (fd >= 0)
		close(fd);

	span_from_json(req, &span);
	if (!ret)
		ret = cb_ws_journal_dirty(t, &span, &dirty, &n);
	/* The files the daemon gave back to the base whose turn recorded metadata. */
	ncheck = json_array_size(json_object_get(req, "check"));
	check = calloc(ncheck ? ncheck : 1, sizeof(*check));
	if (!check && !ret)
		ret = cb_error_set(ENOMEM, "rollback: out of memory");
	for (size_t i = 0; check && i < ncheck; i++)
		check[i] =
		    json_string_value(json_array_get(json_object_get(req, "check"), i)) ?: "";
	if (!ret)
		ret = cb_ws_rollback_checked(t, json_integer_value(json_object_get(req, "turn")),
					     dirty, n, check, ncheck, &touched);
	free(check);
	if (!ret)
		unlink(pending);
	/* An error reply carries no result: the count goes in the error line. */
	*res = json_pack("{s:I}", "touched", (json_int_t)touched);
	if (!ret || touched)
		w->known = cb_ws_known_take(t); /* the daemon snapshots next */
	worker_close(t, "rollback");
	cb_ws_dirty_free(dirty, n);
	return ret;
}

/* If dir holds the mark of an interrupted rollback, remove its temporary names from the tree
 * at root (upper/ before mounting, the mount for a worker replacing a killed one). */
static void rollback_recover(const char *dir, const char *root)
{
	char pending[4200];
	long long removed = 0;

	snprintf(pending, sizeof(pending), "%s/" CB_DAEMON_ROLLBACK_PENDING, dir);
	if (access(pending, F_OK) < 0)
		return;
	if (cb_ws_rollback_clean(root, &removed) == 0)
		unlink(pending);
	else
		fprintf(stderr, "cowbox: %s\n", cb_error_message());
	if (removed)
		fprintf(stderr,
			"cowbox: removed %lld temporary file(s) of an interrupted rollback\n",
			removed);
	cb_error_clear();
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
	/* A turn worker that replaces one killed during a rollback: its temporary names are in
	 * the live tree (the start-up's clean-up, cb_daemon_rollback_recover, is long past). */
	if (json_is_true(json_object_get(req, "turn")))
		rollback_recover(w->dir, w->mountpoint);
	return 0;
}

void cb_daemon_worker_loop(int fd)
{
	struct worker_state w = {.fd = fd};
	struct cb_daemon_lines r = {.fd = fd};
	json_t *req;

	while ((req = cb_daemon_line_read(&r))) {
		const char *op = json_string_value(json_object_get(req, "op"));
		json_t *res = NULL, *reply;
		void *data = NULL;
		size_t n = 0;
		int ret;

		cb_error_clear();
		/* Before acting on it: the daemon resends a request its worker died before taking.
		 */
		if (cb_daemon_line_write(fd, json_pack("{s:b}", "took", 1), NULL, 0)) {
			json_decref(req);
			break;
		}
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
		else if (!strcmp(op, "merge"))
			ret = cb_daemon_worker_merge(w.mountpoint, w.dir, w.base, w.db_path, req,
						     &res);
		else if (!strcmp(op, "merge_undo"))
			ret = cb_daemon_worker_merge_undo(w.mountpoint, w.dir, w.base, w.db_path,
							  &res);
		else if (!strcmp(op, "read") || !strcmp(op, "write") || !strcmp(op, "mkdirs"))
			ret = cb_daemon_worker_file_op(w.mountpoint, op, req, &r, &res, &data, &n);
		else
			ret = cb_error_set(EINVAL, "turn worker: unknown op %s", op);
		if (ret)
			reply = json_pack("{s:i, s:s, s:o*}", "error", -ret, "message",
					  cb_error_message(), "result", res);
		else
			reply = json_pack("{s:o}", "ok", res ? res : json_object());
		json_decref(req);
		ret = cb_daemon_line_write(fd, reply, ret ? NULL : data, ret ? 0 : n);
		free(data);
		if (ret)
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
	rollback_recover(d->dir, d->upper);
}

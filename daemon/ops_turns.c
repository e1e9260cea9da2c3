/* The turn ops of the control protocol: snapshot, diff, rollback, prune, fork, turns and
 * blobs. They run under the daemon's turn lock, through the mount, while FUSE keeps serving. */
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "cowbox/grow.h"
#include "cowbox/journal.h"
#include "cowbox/overlay.h"
#include "cowbox/turns.h"
#include "cowbox/workspace.h"
#include "daemon.h"

/* The journal rows of some turns, merged per path. */
struct dirty_list {
	struct cb_dirty *d;
	size_t n, cap;
};

static void dirty_free(struct dirty_list *l)
{
	for (size_t i = 0; i < l->n; i++) {
		free((char *)l->d[i].path);
		free((char *)l->d[i].comm);
	}
	free(l->d);
	memset(l, 0, sizeof(*l));
}

static int dirty_row(const struct cb_journal_row *row, void *arg)
{
	struct dirty_list *l = arg;
	struct cb_dirty *d;
	int rc = cb_grow(&l->d, &l->cap, l->n, sizeof(*l->d), 64, "journal rows");

	if (rc)
		return rc;
	d = &l->d[l->n];
	d->path = strdup(row->path);
	d->comm = row->comm ? strdup(row->comm) : NULL;
	d->subtree = row->subtree;
	d->pid = row->pid;
	if (!d->path)
		return cb_error_set(ENOMEM, "journal rows: out of memory");
	l->n++;
	return 0;
}

/* The rows being sorted, for dirty_cmp (qsort has no argument; ops run one at a time
 * under the turn lock). */
static const struct cb_dirty *dirty_sorting;

/* By path, then by journal order (the index), so the merge below sees rows in order. */
static int dirty_cmp(const void *a, const void *b)
{
	size_t x = *(const size_t *)a, y = *(const size_t *)b;
	int c = strcmp(dirty_sorting[x].path, dirty_sorting[y].path);

	return c ? c : (x > y) - (x < y);
}

/* One entry per path: subtree if any row said so, attributed to its latest change. */
static int dirty_merge(struct dirty_list *l)
{
	size_t *ord, w = 0;
	struct cb_dirty *out;

	if (l->n < 2)
		return 0;
	ord = malloc(l->n * sizeof(*ord));
	out = malloc(l->n * sizeof(*out));
	if (!ord || !out) {
		free(ord);
		free(out);
		return cb_error_set(ENOMEM, "journal rows: out of memory");
	}
	for (size_t i = 0; i < l->n; i++)
		ord[i] = i;
	dirty_sorting = l->d;
	qsort(ord, l->n, sizeof(*ord), dirty_cmp);
	for (size_t i = 0; i < l->n; i++) {
		struct cb_dirty *row = &l->d[ord[i]];

		if (w == 0 || strcmp(out[w - 1].path, row->path)) {
			out[w++] = *row;
			continue;
		}
		out[w - 1].subtree |= row->subtree;
		if (row->pid) {
			free((char *)out[w - 1].comm);
			out[w - 1].pid = row->pid;
			out[w - 1].comm = row->comm;
			row->comm = NULL;
		}
		free((char *)row->path);
		free((char *)row->comm);
	}
	free(ord);
	free(l->d);
	l->d = out;
	l->n = l->cap = w;
	return 0;
}

/* Rows of turns from..to (the open turn and, after an advance, the one after it), merged to
 * one entry per path so that a path written many times is examined once. */
static int dirty_load(struct cb_daemon *d, long long from, long long to, struct dirty_list *l)
{
	int ret = 0;

	for (long long turn = from; turn <= to && !ret; turn++)
		ret = cb_journal_list(d->db, turn, dirty_row, l);
	return ret ? ret : dirty_merge(l);
}

/* Flush dirty pages so that their FUSE writes are journaled before the rows are read. */
static int turns_sync(struct cb_daemon *d)
{
	int fd = open(d->mountpoint, O_RDONLY | O_DIRECTORY | O_CLOEXEC), ret = 0;

	if (fd < 0)
		return cb_error_set(errno, "open %s: %s", d->mountpoint, strerror(errno));
	/* syncfs reports a writeback error of any file once (errseq), even of a file deleted
	 * since; the second call says whether the flush itself works. */
	if (syncfs(fd) < 0 && syncfs(fd) < 0)
		ret = cb_error_set(errno, "syncfs %s: %s", d->mountpoint, strerror(errno));
	close(fd);
	return ret;
}

/* Where progress frames of a request go. */
struct turns_progress {
	struct cb_daemon_conn *conn;
	json_t *id;
};

/* Sent as {"id":..,"stream":"progress",...} frames: the CLI draws a bar from them. */
static void turns_progress_frame(void *arg, long long files_done, long long files_total,
				 long long bytes_done, long long bytes_total)
{
	struct turns_progress *p = arg;

	cb_daemon_send_frame(
	    p->conn, p->id,
	    json_pack("{s:s, s:I, s:I, s:I, s:I}", "stream", "progress", "files_done",
		      (json_int_t)files_done, "files_total", (json_int_t)files_total, "bytes_done",
		      (json_int_t)bytes_done, "bytes_total", (json_int_t)bytes_total));
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

static int turns_open_progress(struct cb_daemon *d, struct cb_turns **t,
			       struct turns_progress *progress)
{
	char blobs[4096];
	long long bound;
	int ret = turns_read_bound(&bound);

	if (ret)
		return ret;
	struct cb_turns_config cfg = {
	    .db_path = d->db_path,
	    .blob_dir = blobs,
	    .base_dir = d->base,
	    .root = d->mountpoint,
	    .progress = progress ? turns_progress_frame : NULL,
	    .progress_arg = progress,
	    .snapshot_max_bytes = bound,
	};

	snprintf(blobs, sizeof(blobs), "%s/blobs", d->dir);
	return cb_turns_open(&cfg, t);
}

static int turns_open(struct cb_daemon *d, struct cb_turns **t)
{
	return turns_open_progress(d, t, NULL);
}

static double elapsed(const struct timespec *a, const struct timespec *b)
{
	return (double)(b->tv_sec - a->tv_sec) + (double)(b->tv_nsec - a->tv_nsec) / 1e9;
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
static json_t *entry_source(struct cb_daemon *d, struct cb_turns *t, const struct cb_entry *e,
			    long long turn)
{
	char buf[4200], hex[2 * CB_XXH128_LEN + 1];

	if (e->type != CB_ENTRY_FILE)
		return json_null();
	if (turn < 0) {
		snprintf(buf, sizeof(buf), "%s/%s", d->mountpoint, e->path);
		return json_string(buf);
	}
	if (cb_ws_base_holds(t, e->path, e->xxh3) == 1) {
		snprintf(buf, sizeof(buf), "%s/%s", d->base, e->path);
	} else {
		cb_hex(e->xxh3, CB_XXH128_LEN, hex);
		snprintf(buf, sizeof(buf), "%s/blobs/%s", d->dir, hex);
	}
	cb_error_clear();
	return json_string(buf);
}

static json_t *events_json(struct cb_daemon *d, struct cb_turns *t, const struct cb_diff *diff,
			   long long a, long long b, int sources)
{
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
			json_object_set_new(j, "old_src", entry_source(d, t, &ev->old, a));
			json_object_set_new(j, "new_src", entry_source(d, t, &ev->new, b));
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

/* Record the open turn: sync, move the journal on to the next turn, then hash what the rows
 * of the closed turn name. Called with the turn lock held. */
static int turns_snapshot(struct cb_daemon *d, struct cb_turns *t, const char *label,
			  struct cb_diff *changes, long long *turn_out)
{
	struct dirty_list dl = {0};
	long long open = cb_journal_turn(d->db), latest = cb_db_turns_latest(cb_turns_db(t));
	long long turn = open > latest ? open : latest + 1;
	int ret;

	ret = turns_sync(d);
	if (!ret)
		ret = cb_overlay_upper_check(d->ov, d->upper);
	if (ret)
		return ret;
	/* New changes belong to the next turn from here; the rows of this one are complete
	 * (a mark commits before its operation is answered). The next turn's rows are read
	 * too: rehashing them now is harmless, and it covers a crash after the advance. */
	cb_db_turns_journal_advance(d->db, turn + 1);
	cb_overlay_turn_advance(d->ov);
	ret = dirty_load(d, open < turn ? open : turn, turn + 1, &dl);
	if (!ret)
		ret = cb_ws_snapshot(t, turn, dl.d, dl.n, label, changes);
	if (ret)
		cb_db_turns_journal_advance(d->db, turn);
	else
		*turn_out = turn;
	dirty_free(&dl);
	return ret;
}

static int op_snapshot(struct cb_daemon *d, struct cb_daemon_conn *conn, json_t *req)
{
	const char *label = json_string_value(json_object_get(req, "label"));
	int want_changes = json_is_true(json_object_get(req, "changes"));
	int want_files = json_is_true(json_object_get(req, "files"));
	struct cb_diff changes = {0};
	struct cb_turns *t = NULL;
	struct timespec t0, t1;
	long long turn = 0;
	json_t *r = NULL;
	struct turns_progress progress = {conn, json_object_get(req, "id")};
	int ret;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	pthread_mutex_lock(&d->turn_lock);
	ret = turns_open_progress(
	    d, &t, json_is_true(json_object_get(req, "progress")) ? &progress : NULL);
	if (!ret)
		ret = turns_snapshot(d, t, label, want_changes ? &changes : NULL, &turn);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	if (!ret) {
		r = json_pack("{s:I, s:f}", "turn", (json_int_t)turn, "seconds",
			      (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9);
		if (want_changes)
			json_object_set_new(r, "changes",
					    events_json(d, t, &changes, turn - 1, turn, 0));
		if (want_files) {
			json_t *files = json_object();

			ret = cb_ws_map_list(t, files_add, files);
			json_object_set_new(r, "files", files);
		}
	}
	cb_ws_diff_free(&changes);
	cb_turns_close(t);
	pthread_mutex_unlock(&d->turn_lock);
	if (ret) {
		json_decref(r);
		return ret;
	}
	return cb_daemon_reply(conn, json_object_get(req, "id"), r);
}

static int op_diff(struct cb_daemon *d, struct cb_daemon_conn *conn, json_t *req)
{
	json_t *ja = json_object_get(req, "a"), *jb = json_object_get(req, "b");
	long long a = json_integer_value(ja), b = json_is_integer(jb) ? json_integer_value(jb) : -1;
	struct dirty_list dl = {0};
	struct cb_diff diff = {0};
	struct cb_turns *t = NULL;
	json_t *r = NULL;
	int ret;

	if (!json_is_integer(ja))
		return cb_error_set(EINVAL, "diff: \"a\" must be a turn number");
	/* Between recorded turns a diff reads committed rows on its own connection (WAL: a
	 * consistent view), so it does not wait behind a long snapshot; against the live tree
	 * it needs the journal and the map at rest. */
	if (b < 0)
		pthread_mutex_lock(&d->turn_lock);
	ret = turns_open(d, &t);
	if (!ret && b < 0)
		ret = turns_sync(d);
	if (!ret && b < 0)
		ret = dirty_load(d, cb_journal_turn(d->db), cb_journal_turn(d->db), &dl);
	if (!ret)
		ret = cb_ws_diff(t, a, b, dl.d, dl.n, &diff);
	if (!ret)
		r = json_pack(
		    "{s:I, s:o, s:o}", "a", (json_int_t)a, "b",
		    b < 0 ? json_string("live") : json_integer(b), "events",
		    events_json(d, t, &diff, a, b, json_is_true(json_object_get(req, "sources"))));
	cb_ws_diff_free(&diff);
	dirty_free(&dl);
	cb_turns_close(t);
	if (b < 0)
		pthread_mutex_unlock(&d->turn_lock);
	return ret ? ret : cb_daemon_reply(conn, json_object_get(req, "id"), r);
}

static int op_rollback(struct cb_daemon *d, struct cb_daemon_conn *conn, json_t *req)
{
	json_t *jt = json_object_get(req, "turn");
	long long to = json_integer_value(jt), touched = 0, turn = 0;
	struct dirty_list dl = {0};
	struct cb_turns *t = NULL;
	struct timespec t0, t1, t2;
	char label[64];
	int ret;

	if (!json_is_integer(jt))
		return cb_error_set(EINVAL, "rollback: \"turn\" must be a turn number");
	snprintf(label, sizeof(label), "rollback to %lld", to);
	pthread_mutex_lock(&d->turn_lock);
	ret = turns_open(d, &t);
	if (!ret)
		ret = turns_sync(d);
	if (!ret)
		ret = dirty_load(d, cb_journal_turn(d->db), cb_journal_turn(d->db), &dl);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	if (!ret)
		ret = cb_ws_rollback(t, to, dl.d, dl.n, &touched);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	/* Even a rollback that failed part-way changed the tree: record what it is now. */
	if (!ret || touched) {
		int sret = turns_snapshot(d, t, label, NULL, &turn);

		if (!ret)
			ret = sret;
	}
	clock_gettime(CLOCK_MONOTONIC, &t2);
	dirty_free(&dl);
	cb_turns_close(t);
	pthread_mutex_unlock(&d->turn_lock);
	if (ret)
		return ret;
	return cb_daemon_reply(conn, json_object_get(req, "id"),
			       json_pack("{s:I, s:I, s:I, s:f, s:f}", "turn", (json_int_t)turn,
					 "rolled_back_to", (json_int_t)to, "restored",
					 (json_int_t)touched, "restore_seconds", elapsed(&t0, &t1),
					 "snapshot_seconds", elapsed(&t1, &t2)));
}

static int op_prune(struct cb_daemon *d, struct cb_daemon_conn *conn, json_t *req)
{
	json_t *jk = json_object_get(req, "keep");
	long long dropped = 0, freed = 0;
	struct cb_turns *t = NULL;
	int ret;

	if (!json_is_integer(jk))
		return cb_error_set(EINVAL, "prune: \"keep\" must be a number of turns");
	pthread_mutex_lock(&d->turn_lock);
	ret = turns_open(d, &t);
	if (!ret)
		ret = cb_ws_prune(t, json_integer_value(jk), &dropped, &freed);
	cb_turns_close(t);
	pthread_mutex_unlock(&d->turn_lock);
	if (ret)
		return ret;
	return cb_daemon_reply(conn, json_object_get(req, "id"),
			       json_pack("{s:I, s:I}", "dropped", (json_int_t)dropped,
					 "freed_bytes", (json_int_t)freed));
}

static int op_fork(struct cb_daemon *d, struct cb_daemon_conn *conn, json_t *req)
{
	json_t *jt = json_object_get(req, "turn");
	const char *name = json_string_value(json_object_get(req, "name"));
	char ref[CB_WS_REF_LEN + 1], *upper = NULL, *db = NULL, *blobs = NULL;
	struct cb_turns *t = NULL;
	int ret, created = 0;

	if (!json_is_integer(jt))
		return cb_error_set(EINVAL, "fork: \"turn\" must be a turn number");
	pthread_mutex_lock(&d->turn_lock);
	ret = turns_open(d, &t);
	if (!ret)
		ret = cb_ws_turn_check(t, json_integer_value(jt));
	if (!ret)
		ret = cb_ws_create(d->base, name, NULL, ref);
	created = !ret;
	if (!ret && !(ret = cb_ws_path(ref, "upper", &upper)) &&
	    !(ret = cb_ws_path(ref, "meta.db", &db)))
		ret = cb_ws_path(ref, "blobs", &blobs);
	if (!ret)
		ret = cb_ws_fork(t, json_integer_value(jt), upper, db, blobs);
	cb_turns_close(t);
	pthread_mutex_unlock(&d->turn_lock);
	if (ret && created) {
		char saved[1024];

		snprintf(saved, sizeof(saved), "%s", cb_error_message());
		cb_ws_remove(ref);
		cb_error_set(ret, "%s", saved);
	}
	free(upper);
	free(db);
	free(blobs);
	if (ret)
		return ret;
	return cb_daemon_reply(conn, json_object_get(req, "id"),
			       json_pack("{s:s, s:s?}", "ref", ref, "name", name));
}

static int turn_row(const struct cb_turn_info *ti, void *arg)
{
	return json_array_append_new(arg, json_pack("{s:I, s:f, s:s?, s:I}", "turn",
						    (json_int_t)ti->turn, "time", ti->time, "label",
						    ti->label, "changes", (json_int_t)ti->changes));
}

static int op_turns(struct cb_daemon *d, struct cb_daemon_conn *conn, json_t *req)
{
	struct cb_turns *t = NULL;
	json_t *arr = json_array();
	long long count = 0, bytes = 0;
	char blobs[4096];
	int ret, fd;

	/* No turn lock: the list is read from committed rows on this op's own connection, so
	 * a long snapshot does not hold it up. */
	ret = turns_open(d, &t);
	if (!ret)
		ret = cb_db_turns_list(cb_turns_db(t), turn_row, arr);
	cb_turns_close(t);
	snprintf(blobs, sizeof(blobs), "%s/blobs", d->dir);
	fd = open(blobs, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (!ret && fd >= 0)
		ret = cb_ws_blob_usage(fd, &count, &bytes);
	if (fd >= 0)
		close(fd);
	if (ret) {
		json_decref(arr);
		return ret;
	}
	return cb_daemon_reply(conn, json_object_get(req, "id"),
			       json_pack("{s:o, s:I, s:I, s:I}", "turns", arr, "open_turn",
					 (json_int_t)cb_journal_turn(d->db), "blob_count",
					 (json_int_t)count, "blob_bytes", (json_int_t)bytes));
}

const struct cb_daemon_op cb_daemon_ops_turns[] = {
    {"snapshot", op_snapshot},
    {"diff", op_diff},
    {"rollback", op_rollback},
    {"prune", op_prune},
    {"fork", op_fork},
    {"turns", op_turns},
    {NULL, NULL},
};

/* The turn ops of the control protocol: snapshot, diff, rollback, prune, fork, turns and
 * blobs. They run under the daemon's turn lock; what reads the mount runs in the worker. */
#include "config.h"

#include <errno.h>
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

/* The rows of the previous turn that are not content writes (see turns_snapshot). */
static int dirty_row_names(const struct cb_journal_row *row, void *arg);

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

static int dirty_row_names(const struct cb_journal_row *row, void *arg)
{
	return row->kind == CB_CHANGE_WRITE ? 0 : dirty_row(row, arg);
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

/* The dirty list as the worker takes it: [[path, subtree, pid, comm], ...]. */
static json_t *dirty_json(const struct dirty_list *l)
{
	json_t *arr = json_array();

	for (size_t i = 0; arr && i < l->n; i++)
		json_array_append_new(arr, json_pack("[s, i, I, s?]", l->d[i].path, l->d[i].subtree,
						     (json_int_t)l->d[i].pid, l->d[i].comm));
	return arr;
}

/* Flush dirty pages so that their FUSE writes are journaled before the rows are read (in
 * the worker: the daemon never waits on its own mount). */
static int turns_sync(struct cb_daemon *d)
{
	return cb_daemon_worker_call(d, json_pack("{s:s}", "op", "sync"), NULL, NULL, NULL, NULL);
}

/* The turns of the workspace without its live tree: what prune, fork and turns read (the
 * base, the blobs and meta.db) needs no I/O through the mount. */
static int turns_open(struct cb_daemon *d, struct cb_turns **t)
{
	char blobs[4096];
	struct cb_turns_config cfg = {
	    .db_path = d->db_path,
	    .blob_dir = blobs,
	    .base_dir = d->base,
	};

	snprintf(blobs, sizeof(blobs), "%s/blobs", d->dir);
	return cb_turns_open(&cfg, t);
}

static double elapsed(const struct timespec *a, const struct timespec *b)
{
	return (double)(b->tv_sec - a->tv_sec) + (double)(b->tv_nsec - a->tv_nsec) / 1e9;
}

/* Record the open turn: sync, move the journal on to the next turn, then have the worker
 * hash what the rows of the closed turn name. Called with the turn lock held. req holds the
 * worker's snapshot request (label, what to return); it gets the turn and the rows. */
static int turns_snapshot(struct cb_daemon *d, json_t *req, struct cb_daemon_conn *conn, json_t *id,
			  json_t **result, long long *turn_out)
{
	struct dirty_list dl = {0};
	long long open = cb_journal_turn(d->db), latest = cb_journal_turn(d->db) - 1;
	struct cb_turns *t = NULL;
	long long turn;
	int ret;

	ret = turns_open(d, &t);
	if (!ret)
		latest = cb_db_turns_latest(cb_turns_db(t));
	cb_turns_close(t);
	turn = open > latest ? open : latest + 1;
	if (!ret)
		ret = turns_sync(d);
	if (!ret)
		ret = cb_overlay_upper_check(d->ov, d->upper);
	if (ret) {
		json_decref(req);
		return ret;
	}
	/* The fenced advance: every change made before it is in the tree and its mark is in
	 * this turn's rows; every change after it is marked in the next turn. The next turn's
	 * rows are read too: rehashing them now is harmless, and it covers a crash after the
	 * advance. */
	cb_overlay_turn_advance(d->ov, turn + 1);
	/* The kernel finishes a name or metadata change (its dentry, its cached attributes) a
	 * moment after we answered it, so the previous snapshot may have seen the old state
	 * through the mount: those paths of the previous turn are looked at once more (first,
	 * so that this turn's rows have the last word on attribution). */
	ret = turn > 1 ? cb_journal_list(d->db, turn - 1, dirty_row_names, &dl) : 0;
	if (!ret)
		ret = dirty_load(d, open < turn ? open : turn, turn + 1, &dl);
	if (!ret) {
		json_object_set_new(req, "op", json_string("snapshot"));
		json_object_set_new(req, "turn", json_integer(turn));
		json_object_set_new(req, "dirty", dirty_json(&dl));
		ret = cb_daemon_worker_call(d, req, conn, id, result, NULL);
	} else {
		json_decref(req);
	}
	if (ret)
		cb_overlay_turn_advance(d->ov, turn);
	else
		*turn_out = turn;
	dirty_free(&dl);
	return ret;
}

/* Where the rows of a whole map go: one object, or frames of FILES_FRAME rows each when the
 * client streams (it writes them out as they come instead of holding one document). */
struct files_out {
	json_t *files;
	struct cb_daemon_conn *conn; /* streaming: frames go here */
	json_t *id;
	long long turn;
	size_t rows;
};

#define FILES_FRAME 2048

static int files_flush(struct files_out *o)
{
	json_t *frame;

	if (!o->conn || !json_object_size(o->files))
		return 0;
	frame = json_pack("{s:s, s:I, s:O}", "stream", "files", "turn", (json_int_t)o->turn,
			  "files", o->files);
	if (!frame)
		return cb_error_set(ENOMEM, "snapshot: out of memory");
	cb_daemon_send_frame(o->conn, o->id, frame);
	json_object_clear(o->files);
	return 0;
}

static int files_add(const struct cb_entry *e, void *arg)
{
	struct files_out *o = arg;
	char hex[2 * CB_SHA256_LEN + 1];

	if (e->type != CB_ENTRY_FILE)
		return 0;
	cb_hex(e->sha256, CB_SHA256_LEN, hex);
	if (json_object_set_new(o->files, e->path, json_string(hex)))
		return cb_error_set(ENOMEM, "snapshot: out of memory");
	return ++o->rows % FILES_FRAME ? 0 : files_flush(o);
}

/* The changes since a client's turn, as two members of the reply. */
static int changes_add(const char *path, const struct cb_entry *now, void *arg)
{
	json_t *r = arg;
	char hex[2 * CB_SHA256_LEN + 1];

	if (!now)
		return json_array_append_new(json_object_get(r, "deleted"), json_string(path))
			   ? cb_error_set(ENOMEM, "snapshot: out of memory")
			   : 0;
	cb_hex(now->sha256, CB_SHA256_LEN, hex);
	return json_object_set_new(json_object_get(r, "changed"), path, json_string(hex))
		   ? cb_error_set(ENOMEM, "snapshot: out of memory")
		   : 0;
}

/* The map of the turn just recorded, into reply r: only the changes when the client holds
 * the map of turn since of this database (map_id), else the whole map ("full"). It reads
 * committed rows of the database only, never the mount, so it runs here and not in the
 * worker (whose reply would carry a whole map through one more JSON line). */
static int snapshot_files(struct cb_daemon *d, struct cb_daemon_conn *conn, json_t *req,
			  long long turn, json_t *r)
{
	json_t *jsince = json_object_get(req, "since");
	const char *client_id = json_string_value(json_object_get(req, "map_id"));
	struct files_out o = {0};
	struct cb_turns *t = NULL;
	char id_hex[17];
	long long id;
	int ret = turns_open(d, &t);

	if (!ret)
		ret = cb_db_turns_map_id(cb_turns_db(t), &id);
	if (ret)
		goto out;
	snprintf(id_hex, sizeof(id_hex), "%016llx", (unsigned long long)id);
	json_object_set_new(r, "map_id", json_string(id_hex));
	if (json_is_integer(jsince) && client_id && !strcmp(client_id, id_hex)) {
		json_object_set_new(r, "changed", json_object());
		json_object_set_new(r, "deleted", json_array());
		ret = cb_ws_map_changes(t, json_integer_value(jsince), changes_add, r);
		if (ret != -ESTALE) {
			json_object_set_new(r, "full", json_false());
			goto out;
		}
		/* Pruned or never recorded: the client starts over from the whole map. */
		cb_error_clear();
		json_object_del(r, "changed");
		json_object_del(r, "deleted");
	}
	json_object_set_new(r, "full", json_true());
	o.files = json_object();
	if (!o.files) {
		ret = cb_error_set(ENOMEM, "snapshot: out of memory");
		goto out;
	}
	if (json_is_true(json_object_get(req, "stream"))) {
		o.conn = conn;
		o.id = json_object_get(req, "id");
		o.turn = turn;
	}
	ret = cb_ws_map_list(t, files_add, &o);
	if (!ret)
		ret = files_flush(&o);
	if (o.conn)
		json_decref(o.files);
	else
		json_object_set_new(r, "files", o.files);
out:
	cb_turns_close(t);
	return ret;
}

static int op_snapshot(struct cb_daemon *d, struct cb_daemon_conn *conn, json_t *req)
{
	json_t *wreq = json_pack("{s:O*, s:b, s:b, s:b}", "label", json_object_get(req, "label"),
				 "changes", json_is_true(json_object_get(req, "changes")), "files",
				 0, "progress", json_is_true(json_object_get(req, "progress")));
	struct timespec t0, t1;
	long long turn = 0;
	json_t *r = NULL;
	int ret;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	pthread_mutex_lock(&d->turn_lock);
	ret = turns_snapshot(d, wreq, conn, json_object_get(req, "id"), &r, &turn);
	/* Still under the lock: the map is the turn's, no later snapshot moved it on. */
	if (!ret && json_is_true(json_object_get(req, "files")))
		ret = snapshot_files(d, conn, req, turn, r);
	pthread_mutex_unlock(&d->turn_lock);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	if (ret) {
		json_decref(r);
		return ret;
	}
	json_object_set_new(r, "turn", json_integer(turn));
	json_object_set_new(r, "seconds", json_real(elapsed(&t0, &t1)));
	return cb_daemon_reply(conn, json_object_get(req, "id"), r);
}

static int op_diff(struct cb_daemon *d, struct cb_daemon_conn *conn, json_t *req)
{
	json_t *ja = json_object_get(req, "a"), *jb = json_object_get(req, "b");
	long long a = json_integer_value(ja), b = json_is_integer(jb) ? json_integer_value(jb) : -1;
	int sources = json_is_true(json_object_get(req, "sources"));
	struct dirty_list dl = {0};
	struct cb_diff diff = {0};
	struct cb_turns *t = NULL;
	json_t *r = NULL;
	int ret = 0;

	if (!json_is_integer(ja))
		return cb_error_set(EINVAL, "diff: \"a\" must be a turn number");
	if (b >= 0) {
		/* Between recorded turns a diff reads committed rows on its own connection (WAL:
		 * a consistent view) and never the mount, so it runs here, beside a long
		 * snapshot, without the turn lock or the worker. */
		ret = turns_open(d, &t);
		if (!ret)
			ret = cb_ws_diff(t, a, b, NULL, 0, &diff);
		if (!ret)
			r = json_pack("{s:o}", "events",
				      cb_daemon_events_json(d->mountpoint, d->base, d->dir, t,
							    &diff, a, b, sources));
		cb_ws_diff_free(&diff);
		cb_turns_close(t);
		goto reply;
	}
	/* Against the live tree: the journal and the map at rest, the tree read by the worker. */
	pthread_mutex_lock(&d->turn_lock);
	ret = turns_sync(d);
	if (!ret)
		ret = dirty_load(d, cb_journal_turn(d->db), cb_journal_turn(d->db), &dl);
	if (!ret)
		ret = cb_daemon_worker_call(d,
					    json_pack("{s:s, s:I, s:I, s:o, s:b}", "op", "diff",
						      "a", (json_int_t)a, "b", (json_int_t)b,
						      "dirty", dirty_json(&dl), "sources", sources),
					    NULL, NULL, &r, NULL);
	dirty_free(&dl);
	pthread_mutex_unlock(&d->turn_lock);
reply:
	if (ret)
		return ret;
	json_object_set_new(r, "a", json_integer(a));
	json_object_set_new(r, "b", b < 0 ? json_string("live") : json_integer(b));
	return cb_daemon_reply(conn, json_object_get(req, "id"), r);
}

static int op_rollback(struct cb_daemon *d, struct cb_daemon_conn *conn, json_t *req)
{
	json_t *jt = json_object_get(req, "turn");
	long long to = json_integer_value(jt), touched = 0, turn = 0;
	struct dirty_list dl = {0};
	struct timespec t0, t1, t2;
	json_t *snap = NULL;
	char label[64];
	int ret;

	if (!json_is_integer(jt))
		return cb_error_set(EINVAL, "rollback: \"turn\" must be a turn number");
	snprintf(label, sizeof(label), "rollback to %lld", to);
	pthread_mutex_lock(&d->turn_lock);
	ret = turns_sync(d);
	/* A base file changed behind our back since the start is in the live tree too. */
	if (!ret)
		ret = cb_daemon_base_watch(d, "rollback");
	if (!ret)
		ret = dirty_load(d, cb_journal_turn(d->db), cb_journal_turn(d->db), &dl);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	if (!ret)
		ret = cb_daemon_worker_call(d,
					    json_pack("{s:s, s:I, s:o}", "op", "rollback", "turn",
						      (json_int_t)to, "dirty", dirty_json(&dl)),
					    NULL, NULL, NULL, &touched);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	/* Even a rollback that failed part-way changed the tree: record what it is now. */
	if (!ret || touched) {
		char saved[1024];
		int sret;

		snprintf(saved, sizeof(saved), "%s", cb_error_message());
		sret =
		    turns_snapshot(d, json_pack("{s:s}", "label", label), NULL, NULL, &snap, &turn);
		if (!ret)
			ret = sret;
		else
			cb_error_set(-ret, "%s", saved);
	}
	json_decref(snap);
	clock_gettime(CLOCK_MONOTONIC, &t2);
	dirty_free(&dl);
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

static int fork_ids(const char *upper)
{
	char *dir = strdup(upper), *slash = dir ? strrchr(dir, '/') : NULL;
	unsigned long base = 0;
	int rc;

	if (!slash) {
		free(dir);
		return cb_error_set(ENOMEM, "fork: out of memory");
	}
	*slash = 0;
	rc = cb_daemon_ids(dir, -1, &base);
	if (!rc && base)
		rc = cb_ws_ids_shift_tree(upper, base);
	free(dir);
	return rc;
}

static int op_fork(struct cb_daemon *d, struct cb_daemon_conn *conn, json_t *req)
{
	json_t *jt = json_object_get(req, "turn");
	const char *name = json_string_value(json_object_get(req, "name"));
	char ref[CB_WS_REF_LEN + 1], *dir = NULL, *upper = NULL, *db = NULL, *blobs = NULL;
	struct cb_turns *t = NULL;
	int ret;

	if (!json_is_integer(jt))
		return cb_error_set(EINVAL, "fork: \"turn\" must be a turn number");
	pthread_mutex_lock(&d->turn_lock);
	ret = turns_open(d, &t);
	if (!ret)
		ret = cb_ws_turn_check(t, json_integer_value(jt));
	/* Built where nothing sees it, published (renamed to its ref, then named) last: a fork
	 * killed midway is never listed and never mounts with part of its tree. */
	if (!ret)
		ret = cb_ws_create_unpublished(d->base, name, ref, &dir);
	if (!ret && (asprintf(&upper, "%s/upper", dir) < 0 ||
		     asprintf(&db, "%s/meta.db", dir) < 0 || asprintf(&blobs, "%s/blobs", dir) < 0))
		ret = cb_error_set(ENOMEM, "fork: out of memory");
	if (!ret)
		ret = cb_ws_fork(t, json_integer_value(jt), upper, db, blobs);
	/* The fork wrote its upper as root: its files get the new workspace's own id range
	 * now, as its mount would have stored them (no set-id file of a host owner). */
	if (!ret)
		ret = fork_ids(upper);
	cb_turns_close(t);
	if (!ret)
		ret = cb_ws_publish(ref, dir, name);
	else if (dir) {
		char saved[1024];

		snprintf(saved, sizeof(saved), "%s", cb_error_message());
		cb_ws_delete_unpublished(dir);
		cb_error_set(-ret, "%s", saved);
	}
	pthread_mutex_unlock(&d->turn_lock);
	free(dir);
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

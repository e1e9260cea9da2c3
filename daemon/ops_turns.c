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
#include "cowbox/merge.h"
#include "cowbox/netlog.h"
#include "cowbox/overlay.h"
#include "cowbox/turns.h"
#include "cowbox/workspace.h"
#include "api.h"
#include "daemon.h"
#include "map_frames.h"
#include "util/clock.h"

/* The journal rows the worker is to read (it reads them from the database itself, so the
 * daemon never holds a turn's rows): [names_turn, from, to], see cb_journal_span. */
static json_t *rows_json(long long names_turn, long long from, long long to)
{
	return json_pack("[I, I, I]", (json_int_t)names_turn, (json_int_t)from, (json_int_t)to);
}

/* Flush dirty pages so that their FUSE writes are journaled before the rows are read (in
 * the worker: the daemon never waits on its own mount). */
static int turns_sync(struct cb_daemon *d)
{
	return cb_daemon_worker_call(d, json_pack("{s:s}", "op", "sync"), NULL, NULL, NULL, NULL);
}

static int net_any_row(const struct cb_netlog_row *row, void *arg)
{
	(void)row;
	(void)arg;
	return 1;
}

/* Record the open turn: sync (unless the caller just did, under the same lock), move the
 * journal on to the next turn, then have the worker hash what the rows of the closed turn
 * name. Called with the turn lock held. req holds the worker's snapshot request (label, what
 * to return); it gets the turn and the rows. With "skip_empty" a snapshot that finds nothing
 * differing from the latest turn (no content, type, mode or metadata change) records no
 * turn: *turn_out is the latest turn and the result says "recorded": false. The first turn
 * is recorded even so (the baseline; "first_too" skips it as well: a rollback's keep), and so
 * is an open turn the egress proxy logged connections in (its diff --network is not
 * empty). */
static int turns_snapshot_synced(struct cb_daemon *d, json_t *req, struct cb_daemon_conn *conn,
				 json_t *id, json_t **result, long long *turn_out, int synced)
{
	long long open = cb_journal_turn(d->db), latest = cb_journal_turn(d->db) - 1;
	long long turn;
	int ret;

	/* On the journal's own connection: opening the turn store for one number cost half a
	 * millisecond of every snapshot (and of the turn a rollback keeps). */
	latest = cb_db_latest_turn(d->db);
	ret = latest < 0 ? -EIO : 0;
	/* Until the fork's drift from turn 0 is known, this snapshot may be the one that freezes
	 * turn 0: note it then (the store is opened only while nothing is known). */
	if (!ret && !d->drift_known) {
		struct cb_turns *t = NULL;

		ret = cb_daemon_turns_open(d, NULL, 0, &t);
		if (!ret)
			cb_daemon_drift_note(d, t);
		cb_turns_close(t);
	}
	turn = open > latest ? open : latest + 1;
	if (!ret && !synced)
		ret = turns_sync(d);
	if (!ret && json_is_true(json_object_get(req, "skip_empty"))) {
		int first = latest < 1 && !json_is_true(json_object_get(req, "first_too")), net = 0;

		if (!first) {
			cb_daemon_net_flush();
			net = cb_db_netlog_range(d->db, latest, -1, net_any_row, NULL);
		}
		if (net < 0)
			ret = net;
		else if (first || net > 0)
			json_object_del(req, "skip_empty");
	}
	/* A base file changed behind our back (the watch saw it) is journaled in this turn. */
	if (!ret)
		ret = cb_daemon_base_watch(d, "snapshot");
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
	json_object_set_new(req, "op", json_string("snapshot"));
	json_object_set_new(req, "turn", json_integer(turn));
	if (cb_daemon_basehash_prepared(d))
		json_object_set_new(req, "base_prepared", json_true());
	json_object_set_new(
	    req, "rows", rows_json(turn > 1 ? turn - 1 : 0, open < turn ? open : turn, turn + 1));
	ret = cb_daemon_worker_call(d, req, conn, id, result, NULL);
	/* Failed, or nothing to record: the journal's turn goes back to the one still open (a
	 * change marked in turn + 1 meanwhile is read by the next snapshot, which reads that
	 * turn's rows too). */
	if (ret || json_is_false(json_object_get(*result, "recorded")))
		cb_overlay_turn_advance(d->ov, turn);
	if (!ret)
		*turn_out = json_is_false(json_object_get(*result, "recorded")) ? latest : turn;
	return ret;
}

static int turns_snapshot(struct cb_daemon *d, json_t *req, struct cb_daemon_conn *conn, json_t *id,
			  json_t **result, long long *turn_out)
{
	return turns_snapshot_synced(d, req, conn, id, result, turn_out, 0);
}

/* The map of the turn just recorded, into reply r: only the changes when the client holds
 * the map of turn since of this database (map_id), else the whole map ("full"). It reads
 * committed rows of the database only, never the mount, so it runs here and not in the
 * worker (whose reply would carry a whole map through one more JSON line). */
static int snapshot_files(struct cb_daemon *d, struct cb_daemon_conn *conn, json_t *req,
			  long long turn, json_t *r, struct cb_turns **tp,
			  struct cb_ws_first_map **pending)
{
	json_t *jsince = json_object_get(req, "since");
	const char *client_id = json_string_value(json_object_get(req, "map_id"));
	struct cb_daemon_map_out o = {0};
	struct cb_turns *t = NULL;
	char id_hex[17];
	long long id;
	int ret = cb_daemon_turns_open(d, NULL, 0, &t);

	if (!ret)
		ret = cb_db_turns_map_id(cb_turns_db(t), &id);
	if (ret)
		goto out;
	snprintf(id_hex, sizeof(id_hex), "%016llx", (unsigned long long)id);
	json_object_set_new(r, "map_id", json_string(id_hex));
	if (json_is_true(json_object_get(req, "stream"))) {
		json_int_t fb = json_integer_value(json_object_get(req, "frame_bytes"));

		o.conn = conn;
		o.id = json_object_get(req, "id");
		o.turn = turn;
		/* Fewer, larger frames cost the client less (one dict from its JSON reader
		 * instead of one per 2048 rows merged into another). */
		if (fb > 0)
			o.frame_bytes =
			    fb < (json_int_t)FRAME_BYTES_MAX ? (size_t)fb : FRAME_BYTES_MAX;
		const char *form = json_string_value(json_object_get(req, "map_form")) ?: "";

		o.raw = !strcmp(form, "raw");
		o.columns = o.raw || !strcmp(form, "columns");
	}
	if (json_is_integer(jsince) && client_id && !strcmp(client_id, id_hex)) {
		o.files = json_object();
		o.deleted = json_array();
		if (!o.files || !o.deleted) {
			ret = cb_error_set(ENOMEM, "snapshot: out of memory");
			goto out;
		}
		ret = cb_ws_map_changes(t, json_integer_value(jsince), cb_daemon_map_change, &o);
		if (ret != -ESTALE) {
			if (!ret)
				ret = cb_daemon_map_flush(&o);
			json_object_set_new(r, "full", json_false());
			if (!o.conn) {
				json_object_set(r, "changed", o.files);
				json_object_set(r, "deleted", o.deleted);
			}
			goto out;
		}
		/* Pruned or never recorded: the client starts over from the whole map. (Nothing
		 * was sent: -ESTALE comes before the first change.) */
		cb_error_clear();
		json_decref(o.files);
		json_decref(o.deleted);
		o.files = NULL;
		o.deleted = NULL;
		o.rows = 0;
	}
	json_object_set_new(r, "full", json_true());
	if (o.conn) {
		char *id = json_dumps(o.id, JSON_ENCODE_ANY | JSON_COMPACT | JSON_ENSURE_ASCII);

		if (!id ||
		    asprintf(&o.head, "{\"id\":%s,\"stream\":\"files\",\"turn\":%lld,%s", id, turn,
			     o.raw	 ? ""
			     : o.columns ? "\"paths\":\""
					 : "\"files\":{") < 0)
			o.head = NULL;
		free(id);
	} else {
		o.files = json_object();
	}
	if (!o.head && !o.files) {
		ret = cb_error_set(ENOMEM, "snapshot: out of memory");
		goto out;
	}
	/* A first map is answered from the walk (the shared base cache vouching for what it
	 * can); its rows are written after the reply. */
	cb_daemon_basecache_attach(d->dir, t, d->base);
	cb_daemon_base_scan_take(d, t);
	ret = cb_ws_map_first(t, cb_daemon_map_file, &o, pending, &id);
	if (!ret)
		ret = cb_daemon_map_flush(&o);
	if (!o.conn)
		json_object_set(r, "files", o.files);
	snprintf(id_hex, sizeof(id_hex), "%016llx", (unsigned long long)id);
	json_object_set_new(r, "map_id", json_string(id_hex));
out:
	json_decref(o.files);
	json_decref(o.deleted);
	free(o.text);
	free(o.hashes);
	free(o.head);
	if (*pending && !ret) {
		*tp = t;
		return 0;
	}
	cb_ws_map_first_free(*pending);
	*pending = NULL;
	cb_turns_close(t);
	return ret;
}

/* After the reply, still under the turn lock: the rows of a map answered from the walk. A
 * failure loses nothing the client relies on: the id it was given is not adopted, so it gets
 * the whole map next time, and the next turn op builds the map from the base. */
static void snapshot_first_write(struct cb_turns *t, struct cb_ws_first_map *p, double answered)
{
	const char *stall = getenv("COWBOX_TEST_MAP_WRITE_STALL");
	struct timespec t0, t1;

	/* Tests only: a window between the reply and the rows, to kill the daemon in. */
	if (stall && *stall)
		usleep((useconds_t)(atof(stall) * 1e6));
	clock_gettime(CLOCK_MONOTONIC, &t0);
	if (cb_ws_map_first_write(t, p))
		cb_daemon_log("snapshot: %s (the next turn op builds the map)", cb_error_message());
	clock_gettime(CLOCK_MONOTONIC, &t1);
	cb_daemon_log("snapshot: first map answered from the walk in %.3f s, its rows written in "
		      "%.3f s after the reply",
		      answered, cb_clock_between(&t0, &t1));
	cb_daemon_base_stats_log(t, "snapshot");
	cb_ws_map_first_free(p);
	cb_turns_close(t);
}

int cb_daemon_snapshot_labelled(struct cb_daemon *d, const char *label, int skip_empty,
				long long *turn)
{
	json_t *r = NULL;
	int ret;

	pthread_mutex_lock(&d->turn_lock);
	ret = turns_snapshot(d,
			     json_pack("{s:s, s:b, s:b, s:b, s:b}", "label", label, "changes", 0,
				       "files", 0, "progress", 0, "skip_empty", skip_empty),
			     NULL, NULL, &r, turn);
	cb_daemon_base_scan_drop(d); /* the worker built the first map, if it was due */
	pthread_mutex_unlock(&d->turn_lock);
	json_decref(r);
	return ret;
}

int cb_daemon_snapshot_locked(struct cb_daemon *d, const char *label, long long *turn)
{
	json_t *r = NULL;
	int ret;

	ret = turns_snapshot(d,
			     json_pack("{s:s, s:b, s:b, s:b}", "label", label, "changes", 0,
				       "files", 0, "progress", 0),
			     NULL, NULL, &r, turn);
	cb_daemon_base_scan_drop(d);
	json_decref(r);
	return ret;
}

static int op_snapshot(struct cb_daemon *d, struct cb_daemon_conn *conn, json_t *req)
{
	int files = json_is_true(json_object_get(req, "files"));
	int progress = json_is_true(json_object_get(req, "progress"));
	json_t *label = json_object_get(req, "label");
	/* With the map asked for, a first one is left to snapshot_files (answered from the walk
	 * of the base, written after the reply); not when progress is asked: the worker's build
	 * of the map reports it while hashing the base. Nothing changed since the latest turn:
	 * that turn is the answer, unless a label asks to name this point (a label is a ref
	 * people type, so it gets a turn of its own, empty or not). */
	json_t *wreq = json_pack("{s:O*, s:b, s:b, s:b, s:b, s:b}", "label", label, "changes",
				 json_is_true(json_object_get(req, "changes")), "files", 0,
				 "progress", progress, "defer_map", files && !progress,
				 "skip_empty", !json_string_length(label));
	struct cb_ws_first_map *pending = NULL;
	struct cb_turns *t = NULL;
	struct timespec t0, t1;
	long long turn = 0;
	json_t *r = NULL;
	int ret;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	pthread_mutex_lock(&d->turn_lock);
	ret = turns_snapshot(d, wreq, conn, json_object_get(req, "id"), &r, &turn);
	/* Still under the lock: the map is the turn's, no later snapshot moved it on. */
	if (!ret && files)
		ret = snapshot_files(d, conn, req, turn, r, &t, &pending);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	if (!ret) {
		json_object_set_new(r, "turn", json_integer(turn));
		json_object_set_new(r, "seconds", json_real(cb_clock_between(&t0, &t1)));
		ret = cb_daemon_reply(conn, json_object_get(req, "id"), r);
		r = NULL;
	}
	/* The rows are durable before the lock lets the next turn op in. */
	if (pending)
		snapshot_first_write(t, pending, cb_clock_between(&t0, &t1));
	/* Taken by snapshot_files, or the worker built the first map: it serves no one now. */
	cb_daemon_base_scan_drop(d);
	pthread_mutex_unlock(&d->turn_lock);
	json_decref(r);
	return ret;
}

static int op_diff(struct cb_daemon *d, struct cb_daemon_conn *conn, json_t *req)
{
	json_t *ja = json_object_get(req, "a"), *jb = json_object_get(req, "b");
	long long a = json_integer_value(ja), b = json_is_integer(jb) ? json_integer_value(jb) : -1;
	int sources = json_is_true(json_object_get(req, "sources"));
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
		ret = cb_daemon_turns_open(d, NULL, 0, &t);
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
		ret = cb_daemon_worker_call(
		    d,
		    json_pack("{s:s, s:I, s:I, s:o, s:b}", "op", "diff", "a", (json_int_t)a, "b",
			      (json_int_t)b, "rows",
			      rows_json(0, cb_journal_turn(d->db), cb_journal_turn(d->db)),
			      "sources", sources),
		    NULL, NULL, &r, NULL);
	pthread_mutex_unlock(&d->turn_lock);
reply:
	/* network: what the egress proxy did in the turns the diff spans (a < turn <= b) */
	if (!ret && json_is_true(json_object_get(req, "network"))) {
		json_t *rows = NULL;

		ret = b >= 0 && b < a ? cb_daemon_net_rows(d, b, a, &rows)
				      : cb_daemon_net_rows(d, a, b, &rows);
		if (ret)
			json_decref(r);
		else
			json_object_set_new(r, "network", rows);
	}
	if (ret)
		return ret;
	json_object_set_new(r, "a", json_integer(a));
	json_object_set_new(r, "b", b < 0 ? json_string("live") : json_integer(b));
	return cb_daemon_reply(conn, json_object_get(req, "id"), r);
}

static int journal_any_row(const struct cb_journal_row *row, void *arg)
{
	(void)row;
	(void)arg;
	return 1;
}

/* Before a rollback overwrites the live tree: record the open turn's changes as a turn of
 * their own ("before rollback to T"), the usual snapshot of the paths the journal names (its
 * cost follows the changes, not the tree), so rolling back to it gives every byte back. An
 * open turn without a journal row records nothing (*kept 0). Called with the turn lock held,
 * right after turns_sync (so every write made so far is a row). */
static int rollback_keep_open_turn(struct cb_daemon *d, long long to, long long *kept)
{
	json_t *snap = NULL;
	char label[64];
	int ret = cb_journal_list(d->db, cb_journal_turn(d->db), journal_any_row, NULL);

	*kept = 0;
	if (ret <= 0)
		return ret;
	snprintf(label, sizeof(label), "before rollback to %lld", to);
	/* op_rollback synced a moment ago, under the same lock */
	ret = turns_snapshot_synced(
	    d, json_pack("{s:s, s:b, s:b}", "label", label, "skip_empty", 1, "first_too", 1), NULL,
	    NULL, &snap, kept, 1);
	/* Rows, but nothing changed (a file opened for writing and left as it was): no turn
	 * (turns_snapshot_synced put the journal's turn back). */
	if (!ret && json_is_false(json_object_get(snap, "recorded")))
		*kept = 0;
	json_decref(snap);
	return ret ? cb_error_wrap(ret, "rollback: keeping the open turn's changes") : 0;
}

/* Give the base back the paths where turn to holds the base's own entry (an rm -rf of base
 * files undone costs no copy in upper): the overlay drops what upper holds there, journaling
 * each path as a request would. What it gave back whose turn recorded a time, owner or
 * xattrs goes to the worker in *check, to compare with what the mount shows then. Called with
 * the turn lock held, after the open turn was recorded. */
static int rollback_to_base(struct cb_daemon *d, long long to, json_t **check, size_t *reverted)
{
	struct cb_ws_revert rv = {0};
	struct cb_turns *t = NULL;
	int ret;

	*reverted = 0;
	*check = json_array();
	if (!*check)
		return cb_error_set(ENOMEM, "rollback: out of memory");
	if (!d->base || d->in_place)
		return 0;
	ret = cb_daemon_turns_open(d, NULL, 1, &t);
	if (!ret)
		ret = cb_ws_revert_plan(t, to, &rv);
	cb_turns_close(t);
	if (!ret)
		ret = cb_overlay_revert(d->ov, (const char *const *)rv.paths, rv.n, reverted);
	for (size_t i = 0; !ret && i < rv.ncheck; i++)
		if (json_array_append_new(*check, json_string(rv.check[i])))
			ret = cb_error_set(ENOMEM, "rollback: out of memory");
	cb_ws_revert_free(&rv);
	return ret;
}

static int op_rollback(struct cb_daemon *d, struct cb_daemon_conn *conn, json_t *req)
{
	json_t *jt = json_object_get(req, "turn");
	long long to = json_integer_value(jt), touched = 0, turn = 0, kept = 0;
	struct timespec tk, t0, t1, t2;
	json_t *snap = NULL, *check = NULL;
	size_t reverted = 0;
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
	/* Nothing unrecorded is ever lost: the open turn becomes a turn first. */
	clock_gettime(CLOCK_MONOTONIC, &tk);
	if (!ret)
		ret = rollback_keep_open_turn(d, to, &kept);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	if (!ret)
		ret = rollback_to_base(d, to, &check, &reverted);
	if (!ret)
		ret = cb_daemon_worker_call(
		    d,
		    json_pack("{s:s, s:I, s:o, s:O}", "op", "rollback", "turn", (json_int_t)to,
			      "rows", rows_json(0, cb_journal_turn(d->db), cb_journal_turn(d->db)),
			      "check", check),
		    NULL, NULL, NULL, &touched);
	json_decref(check);
	/* Paths given back to the base changed the tree too. */
	touched += (long long)reverted;
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
	pthread_mutex_unlock(&d->turn_lock);
	if (ret)
		return ret;
	return cb_daemon_reply(
	    conn, json_object_get(req, "id"),
	    json_pack("{s:I, s:I, s:I, s:I, s:f, s:f, s:f}", "turn", (json_int_t)turn,
		      "rolled_back_to", (json_int_t)to, "kept_turn", (json_int_t)kept, "restored",
		      (json_int_t)touched, "keep_seconds", cb_clock_between(&tk, &t0),
		      "restore_seconds", cb_clock_between(&t0, &t1), "snapshot_seconds",
		      cb_clock_between(&t1, &t2)));
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
	ret = cb_daemon_turns_open(d, NULL, 0, &t);
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
	const struct cb_ws_drift *drift = NULL;
	struct cb_ws_fork_stats fs = {0};
	struct cb_turns *t = NULL;
	struct timespec at;
	double open_s = 0, create_s = 0, drift_s = 0, ids_s = 0, publish_s = 0;
	unsigned long ids = 0;
	int ret, looked = 0;

	if (!json_is_integer(jt))
		return cb_error_set(EINVAL, "fork: \"turn\" must be a turn number");
	pthread_mutex_lock(&d->turn_lock);
	clock_gettime(CLOCK_MONOTONIC, &at);
	ret = cb_daemon_turns_open(d, NULL, 0, &t);
	/* A fork that looks at the whole base compares it with turn 0's by the keys of both
	 * caches (the first map leaves the shared cache's rows there), not by rehashing what
	 * only it holds; so does the base entry of each path it writes. */
	if (!ret)
		cb_daemon_basecache_attach(d->dir, t, d->base);
	if (!ret)
		ret = cb_ws_turn_check(t, json_integer_value(jt));
	open_s = cb_clock_lap(&at);
	/* Built where nothing sees it, published (renamed to its ref, then named) last: a fork
	 * killed midway is never listed and never mounts with part of its tree. */
	if (!ret)
		ret = cb_ws_create_unpublished(d->base, name, ref, &dir);
	if (!ret && (asprintf(&upper, "%s/upper", dir) < 0 ||
		     asprintf(&db, "%s/meta.db", dir) < 0 || asprintf(&blobs, "%s/blobs", dir) < 0))
		ret = cb_error_set(ENOMEM, "fork: out of memory");
	/* Owners are written in the fork's own id range (fork_ids then leaves them). */
	if (!ret)
		ret = cb_daemon_ids(dir, -1, &ids);
	if (!ret && ids)
		cb_turns_set_restore_ids(t, ids);
	create_s = cb_clock_lap(&at);
	/* What moved in the base since turn 0, looked at only when the watch saw it move. */
	if (!ret)
		ret = cb_daemon_drift_get(d, t, &drift, &looked);
	drift_s = cb_clock_lap(&at);
	if (!ret)
		ret = cb_ws_fork(t, json_integer_value(jt), upper, db, blobs, drift, &fs);
	cb_clock_lap(&at); /* the parts are in fs */
	/* The fork wrote its upper as root: its files get the new workspace's own id range
	 * now, as its mount would have stored them (no set-id file of a host owner). */
	if (!ret)
		ret = fork_ids(upper);
	ids_s = cb_clock_lap(&at);
	/* Where it came from, for merge (cowbox/merge.h): the common ancestor of the two. */
	if (!ret)
		ret = cb_ws_origin_write(dir, d->ref, json_integer_value(jt));
	cb_turns_close(t);
	if (!ret)
		ret = cb_ws_publish(ref, dir, name);
	else if (dir) {
		char saved[1024];

		snprintf(saved, sizeof(saved), "%s", cb_error_message());
		cb_ws_delete_unpublished(dir);
		cb_error_set(-ret, "%s", saved);
	}
	publish_s = cb_clock_lap(&at);
	pthread_mutex_unlock(&d->turn_lock);
	free(dir);
	free(upper);
	free(db);
	free(blobs);
	if (ret)
		return ret;
	/* Where the time went (seconds): benchmarks print it; clients may ignore it. */
	return cb_daemon_reply(
	    conn, json_object_get(req, "id"),
	    json_pack("{s:s, s:s?, s:I, s:b, s:{s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}}",
		      "ref", ref, "name", name, "paths", (json_int_t)fs.paths, "looked_at_base",
		      looked, "phases", "open", open_s, "create", create_s, "base", drift_s, "db",
		      fs.db_seconds, "paths", fs.paths_seconds, "write", fs.write_seconds, "commit",
		      fs.commit_seconds, "sync", fs.sync_seconds, "ids", ids_s, "publish",
		      publish_s));
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
	ret = cb_daemon_turns_open(d, NULL, 0, &t);
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
    {"merge", cb_daemon_op_merge}, /* daemon/ops_merge.c */
    {NULL, NULL},
};

/* The merge op: another workspace's changes since the fork that relates the two brought into
 * this one's live tree (through the turn worker) and recorded as one turn. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "cowbox/journal.h"
#include "cowbox/merge.h"
#include "cowbox/turn_store.h"
#include "cowbox/turns.h"
#include "cowbox/workspace.h"
#include "daemon.h"

/* The turn of source that is the common ancestor: source forked from target (its turn 1),
 * target forked from source (the turn it forked from), or both forked from the same turn
 * of a third workspace (turn 1 of each). */
static int merge_ancestor(struct cb_daemon *d, const char *sref, const char *sdir, long long *from)
{
	char sorig[CB_WS_REF_LEN + 8] = "", torig[CB_WS_REF_LEN + 8] = "";
	long long sturn = -1, tturn = -1;
	int sret = cb_ws_origin_read(sdir, sorig, sizeof(sorig), &sturn);
	int tret = cb_ws_origin_read(d->dir, torig, sizeof(torig), &tturn);

	if ((sret && sret != -ENOENT) || (tret && tret != -ENOENT))
		return sret && sret != -ENOENT ? sret : tret;
	cb_error_clear();
	if (!sret && !strcmp(sorig, d->ref))
		*from = 1;
	else if (!tret && !strcmp(torig, sref))
		*from = tturn;
	else if (!sret && !tret && !strcmp(sorig, torig) && sturn == tturn)
		*from = 1;
	else
		return cb_error_set(
		    EINVAL,
		    "merge: %s and %s share no fork point (SOURCE must be a fork of "
		    "TARGET, TARGET a fork of SOURCE, or both forks of the same turn; "
		    "forks made before cowbox kept fork records are not known)",
		    sref, d->ref);
	return 0;
}

/* A merge writing (or killed while writing) keeps this file in the workspace directory: the
 * paths it writes and the turn they were at (ws/merge.c, cb_ws_merge_undo). */
#define MERGE_PENDING "merge.pending"

static double seconds(const struct timespec *a, const struct timespec *b)
{
	return (double)(b->tv_sec - a->tv_sec) + (double)(b->tv_nsec - a->tv_nsec) / 1e9;
}

static json_t *merge_result_json(const struct cb_ws_merge_result *res)
{
	json_t *merged = json_array(), *conflicts = json_array(), *audit = json_array();

	for (size_t i = 0; i < res->nmerged; i++)
		json_array_append_new(merged, json_string(res->merged[i]));
	for (size_t i = 0; i < res->nconflicts; i++)
		json_array_append_new(conflicts,
				      json_pack("{s:s, s:s, s:s}", "path", res->conflicts[i].path,
						"kind", res->conflicts[i].kind, "resolution",
						res->conflicts[i].resolution));
	/* [path, pid, comm]: SOURCE's attribution, for the merge's turn (merge_attribute) */
	for (size_t i = 0; i < res->naudit; i++)
		json_array_append_new(audit,
				      json_pack("[s, I, s?]", res->audit[i].path,
						(json_int_t)res->audit[i].pid, res->audit[i].comm));
	return json_pack("{s:o, s:o, s:I, s:o}", "merged", merged, "conflicts", conflicts,
			 "touched", (json_int_t)res->written, "audit", audit);
}

/* The merge's turn keeps who made each change in SOURCE, not the worker that wrote it:
 * its rows of each path the worker wrote get SOURCE's attribution (the worker's "audit").
 * Called with the turn lock held, after the turn is recorded. */
static int merge_attribute(struct cb_daemon *d, long long turn, json_t *audit)
{
	size_t n = json_array_size(audit), i;
	struct cb_db_turn_attrib *rows = n ? calloc(n, sizeof(*rows)) : NULL;
	struct cb_turns *t = NULL;
	json_t *v;
	int ret;

	if (n && !rows)
		return cb_error_set(ENOMEM, "merge: out of memory");
	json_array_foreach(audit, i, v)
	{
		rows[i].path = json_string_value(json_array_get(v, 0));
		rows[i].pid = (pid_t)json_integer_value(json_array_get(v, 1));
		rows[i].comm = json_string_value(json_array_get(v, 2));
		if (!rows[i].path) {
			free(rows);
			return cb_error_set(EPROTO, "merge: the worker's audit row %zu has no path",
					    i);
		}
	}
	/* The merge's journal rows may still be in the mark log: into the table first. */
	ret = n ? cb_journal_fold(d->db) : 0;
	if (!ret && n)
		ret = cb_daemon_turns_open(d, NULL, 0, &t);
	if (!ret && n)
		ret = cb_db_turns_attribute(cb_turns_db(t), turn, rows, n);
	cb_turns_close(t);
	free(rows);
	return ret;
}

int cb_daemon_worker_merge(const char *mountpoint, const char *dir, const char *base,
			   const char *db_path, json_t *req, json_t **res)
{
	const char *sdir = json_string_value(json_object_get(req, "source_dir"));
	const char *sbase = json_string_value(json_object_get(req, "source_base"));
	const char *label = json_string_value(json_object_get(req, "source_label"));
	long long from = json_integer_value(json_object_get(req, "from"));
	long long to = json_integer_value(json_object_get(req, "to"));
	int dry_run = json_is_true(json_object_get(req, "dry_run"));
	char blobs[4200], sdb[4200], sblobs[4200], pending[4200], intent[4200];
	struct cb_ws_merge_result mr = {0};
	struct cb_turns *t = NULL, *s = NULL;
	enum cb_ws_merge_strategy strategy;
	int ret, fd;

	*res = NULL;
	if (!sdir)
		return cb_error_set(EINVAL, "merge: no source");
	if ((ret = cb_ws_merge_strategy_parse(json_string_value(json_object_get(req, "strategy")),
					      &strategy)))
		return ret;
	snprintf(blobs, sizeof(blobs), "%s/blobs", dir);
	snprintf(sdb, sizeof(sdb), "%s/meta.db", sdir);
	snprintf(sblobs, sizeof(sblobs), "%s/blobs", sdir);
	struct cb_turns_config tcfg = {
	    .db_path = db_path, .blob_dir = blobs, .base_dir = base, .root = mountpoint};
	struct cb_turns_config scfg = {.db_path = sdb, .blob_dir = sblobs, .base_dir = sbase};

	ret = cb_turns_open(&tcfg, &t);
	if (!ret)
		cb_daemon_basecache_attach(dir, t, base);
	if (!ret && (ret = cb_turns_open(&scfg, &s)))
		ret = cb_error_wrap(ret, "merge: SOURCE's turns");
	if (ret)
		goto out;
	if (to < 0)
		to = cb_db_turns_latest(cb_turns_db(s));
	/* Until the merge is done its temporary names (rollback's) may be in the tree: the next
	 * start removes them if it finds this mark. */
	snprintf(pending, sizeof(pending), "%s/" CB_DAEMON_ROLLBACK_PENDING, dir);
	if (!dry_run && (fd = open(pending, O_WRONLY | O_CREAT | O_CLOEXEC, 0600)) >= 0)
		close(fd);
	snprintf(intent, sizeof(intent), "%s/" MERGE_PENDING, dir);
	ret = cb_ws_merge(t, s, from, to, strategy, label, dry_run, intent, &mr);
	if (!ret && !dry_run)
		unlink(pending);
	*res = merge_result_json(&mr);
	json_object_set_new(*res, "to", json_integer(to));
	if (ret == -EBUSY && mr.nblocked) {
		/* Refused before anything was written: an answer, not a failure of the worker. */
		json_t *blocked = json_array();

		for (size_t i = 0; i < mr.nblocked; i++)
			json_array_append_new(blocked, json_string(mr.blocked[i]));
		json_object_set_new(*res, "blocked", blocked);
		json_object_set_new(*res, "message", json_string(cb_error_message()));
		ret = 0;
	}
out:
	cb_ws_merge_result_free(&mr);
	cb_turns_close(s);
	cb_turns_close(t);
	return ret;
}

int cb_daemon_worker_merge_undo(const char *mountpoint, const char *dir, const char *base,
				const char *db_path, json_t **res)
{
	char blobs[4200], intent[4200], pending[4200];
	struct cb_turns *t = NULL;
	long long restored = 0;
	int ret, fd;

	snprintf(blobs, sizeof(blobs), "%s/blobs", dir);
	snprintf(intent, sizeof(intent), "%s/" MERGE_PENDING, dir);
	snprintf(pending, sizeof(pending), "%s/" CB_DAEMON_ROLLBACK_PENDING, dir);
	struct cb_turns_config cfg = {
	    .db_path = db_path, .blob_dir = blobs, .base_dir = base, .root = mountpoint};

	if (access(intent, F_OK) < 0)
		return 0;
	/* The undo is a rollback of those paths: its temporary names are cleaned after a kill
	 * as a rollback's are. */
	if ((fd = open(pending, O_WRONLY | O_CREAT | O_CLOEXEC, 0600)) >= 0)
		close(fd);
	ret = cb_turns_open(&cfg, &t);
	if (!ret)
		ret = cb_ws_merge_undo(t, intent, &restored);
	if (!ret)
		unlink(pending);
	cb_turns_close(t);
	*res = json_pack("{s:I}", "touched", (json_int_t)restored);
	return ret;
}

/* Put back what an unrecorded merge wrote (through the worker); logs what it did. Called
 * with the turn lock held. */
static int merge_undo(struct cb_daemon *d, const char *why)
{
	long long restored = 0;
	int ret = cb_daemon_worker_call(d, json_pack("{s:s}", "op", "merge_undo"), NULL, NULL, NULL,
					&restored);

	if (ret)
		cb_daemon_log("merge: %s; undoing it failed: %s", why, cb_error_message());
	else if (restored)
		cb_daemon_log("merge: %s; %lld path(s) put back as they were before it", why,
			      restored);
	return ret;
}

static pthread_t recover_thread;
static int recover_started;
static sem_t recover_locked;

static void *merge_recover_main(void *arg)
{
	struct cb_daemon *d = arg;

	pthread_mutex_lock(&d->turn_lock);
	sem_post(&recover_locked);
	merge_undo(d, "interrupted (the daemon stopped during it)");
	pthread_mutex_unlock(&d->turn_lock);
	return NULL;
}

void cb_daemon_merge_recover_start(struct cb_daemon *d)
{
	char intent[4200];

	snprintf(intent, sizeof(intent), "%s/" MERGE_PENDING, d->dir);
	if (access(intent, F_OK) < 0)
		return;
	/* On a thread of its own (the mount serves only once the caller runs it), holding the
	 * turn lock before any request can come: no turn op sees the half-written merge. */
	sem_init(&recover_locked, 0, 0);
	recover_started = pthread_create(&recover_thread, NULL, merge_recover_main, d) == 0;
	if (recover_started)
		sem_wait(&recover_locked);
	sem_destroy(&recover_locked);
}

void cb_daemon_merge_recover_join(void)
{
	if (recover_started)
		pthread_join(recover_thread, NULL);
	recover_started = 0;
}

/* {"source": REF|NAME, "turn": N (SOURCE's, default its latest), "strategy", "dry_run"}. */
int cb_daemon_op_merge(struct cb_daemon *d, struct cb_daemon_conn *conn, json_t *req)
{
	const char *source = json_string_value(json_object_get(req, "source"));
	const char *strategy = json_string_value(json_object_get(req, "strategy"));
	json_t *jt = json_object_get(req, "turn"), *id = json_object_get(req, "id");
	int dry_run = json_is_true(json_object_get(req, "dry_run"));
	char sref[CB_WS_REF_LEN + 1], label[256], *sdir = NULL;
	struct cb_ws_info info = {0};
	enum cb_ws_merge_strategy st;
	long long from = 0, to = -1, touched = 0, turn = -1;
	struct timespec t0, t1, t2;
	json_t *r = NULL;
	int ret, have_info = 0;

	if (!source)
		return cb_error_set(EINVAL, "merge: \"source\" must be a workspace ref or name");
	if (jt && !json_is_null(jt) && (!json_is_integer(jt) || json_integer_value(jt) < 0))
		return cb_error_set(EINVAL, "merge: \"turn\" must be a turn number");
	if (jt && json_is_integer(jt))
		to = json_integer_value(jt);
	if ((ret = cb_ws_merge_strategy_parse(strategy, &st)))
		return ret;
	if ((ret = cb_ws_resolve(source, sref)))
		return ret;
	if (!strcmp(sref, d->ref))
		return cb_error_set(EINVAL, "merge: SOURCE and TARGET are the same workspace");
	if ((ret = cb_ws_path(sref, NULL, &sdir)) || (ret = cb_ws_info(sref, &info)))
		goto out;
	have_info = 1;
	if ((ret = merge_ancestor(d, sref, sdir, &from)))
		goto out;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	pthread_mutex_lock(&d->turn_lock);
	ret = cb_daemon_worker_call(d, json_pack("{s:s}", "op", "sync"), NULL, NULL, NULL, NULL);
	if (!ret)
		ret = cb_daemon_base_watch(d, "merge");
	if (!ret)
		ret = cb_daemon_worker_call(
		    d,
		    json_pack("{s:s, s:s, s:s?, s:s, s:I, s:I, s:s, s:b}", "op", "merge",
			      "source_dir", sdir, "source_base", info.base, "source_label",
			      info.name ? info.name : sref, "from", (json_int_t)from, "to",
			      (json_int_t)to, "strategy", strategy ? strategy : "merge", "dry_run",
			      dry_run),
		    NULL, NULL, &r, &touched);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	if (!ret && r)
		to = json_integer_value(json_object_get(r, "to"));
	/* A merge that failed part-way is undone: TARGET is either unchanged or merged whole. */
	if (ret && !dry_run) {
		char saved[1024];

		snprintf(saved, sizeof(saved), "%s", cb_error_message());
		if (merge_undo(d, saved)) {
			/* Cannot put it back: at least record what the tree is now. */
			snprintf(label, sizeof(label), "merge of %s failed part-way",
				 info.name ? info.name : sref);
			cb_daemon_snapshot_locked(d, label, &turn);
			cb_error_set(-ret,
				     "%s (what it wrote could not be put back: recorded as turn "
				     "%lld, see the daemon's log)",
				     saved, turn);
		} else {
			cb_error_set(-ret, "%s (TARGET was left as it was)", saved);
		}
	} else if (!ret && !dry_run && touched > 0) {
		char intent[4200];

		snprintf(label, sizeof(label), "merge of %s turn %lld (%s, from its turn %lld)",
			 info.name ? info.name : sref, to, sref, from);
		snprintf(intent, sizeof(intent), "%s/" MERGE_PENDING, d->dir);
		ret = cb_daemon_snapshot_locked(d, label, &turn);
		if (!ret) {
			unlink(intent);
			/* The merge is recorded either way: a failure here is said, not fatal. */
			if (merge_attribute(d, turn, json_object_get(r, "audit"))) {
				cb_daemon_log("merge: turn %lld keeps the worker as the author of "
					      "its changes: %s",
					      turn, cb_error_message());
				json_object_set_new(r, "audit_error",
						    json_string(cb_error_message()));
			}
		} else {
			char saved[1024];

			snprintf(saved, sizeof(saved), "%s", cb_error_message());
			merge_undo(d, saved);
			cb_error_set(-ret, "merge: recording it: %s", saved);
		}
	}
	clock_gettime(CLOCK_MONOTONIC, &t2);
	pthread_mutex_unlock(&d->turn_lock);
	if (ret)
		goto out;
	if (json_object_get(r, "blocked")) {
		/* Like apply's refusal: code "conflict", "conflicts" saying why per path. */
		json_t *why = json_array(), *v;
		size_t i;

		json_array_foreach(json_object_get(r, "blocked"), i, v)
		{
			char line[4300];

			snprintf(line, sizeof(line), "%s: changed in TARGET since its latest turn",
				 json_string_value(v));
			json_array_append_new(why, json_string(line));
		}
		ret = cb_daemon_send_frame(
		    conn, id,
		    json_pack("{s:{s:s, s:s, s:O, s:O, s:{s:o}}}", "error", "code", "conflict",
			      "message", json_string_value(json_object_get(r, "message")),
			      "blocked", json_object_get(r, "blocked"), "conflicts", why, "result",
			      "conflicts", why));
		ret = ret < 0 ? ret : 0;
		goto out;
	}
	json_object_del(r, "touched");
	json_object_del(r, "to");
	json_object_del(r, "audit");
	json_object_set_new(r, "turn", turn >= 0 ? json_integer(turn) : json_null());
	json_object_set_new(r, "source", json_string(sref));
	json_object_set_new(r, "source_turn", json_integer(to));
	json_object_set_new(r, "ancestor_turn", json_integer(from));
	json_object_set_new(r, "written", json_integer(touched));
	json_object_set_new(r, "dry_run", json_boolean(dry_run));
	json_object_set_new(r, "merge_seconds", json_real(seconds(&t0, &t1)));
	json_object_set_new(r, "snapshot_seconds", json_real(seconds(&t1, &t2)));
	cb_daemon_log(
	    "merge: %s turns %lld..%lld into the live tree: %lld written, %zu conflicts%s", sref,
	    from, to, touched, json_array_size(json_object_get(r, "conflicts")),
	    dry_run ? " (dry run)" : "");
	ret = cb_daemon_reply(conn, id, r);
	r = NULL;
out:
	json_decref(r);
	if (have_info)
		cb_ws_info_free(&info);
	free(sdir);
	return ret;
}

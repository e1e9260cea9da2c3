/* The fsck op: `cowbox fsck` over the control protocol, on a thread of its own so that the
 * connection and the turn operations go on while every blob is read; and its JSON form. */
#include "config.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cowbox/box.h"
#include "cowbox/error.h"
#include "cowbox/fsck.h"
#include "daemon.h"

json_t *cb_fsck_report_json(const struct cb_fsck_report *r, long long *left)
{
	json_t *arr = json_array();

	*left = 0;
	for (size_t i = 0; i < r->n; i++) {
		const struct cb_fsck_problem *p = &r->p[i];

		*left += !p->repaired;
		json_array_append_new(
		    arr, json_pack("{s:s, s:s?, s:s?, s:I, s:I, s:b, s:s}", "kind", p->kind, "path",
				   p->path, "object", p->object, "first_turn",
				   (json_int_t)p->first_turn, "last_turn", (json_int_t)p->last_turn,
				   "repaired", p->repaired, "detail", p->detail ? p->detail : ""));
	}
	return json_pack("{s:s, s:o, s:I, s:I, s:I}", "ref", r->ref, "problems", arr,
			 "blobs_checked", (json_int_t)r->blobs_checked, "base_files_checked",
			 (json_int_t)r->base_checked, "base_cache_rows", (json_int_t)r->cache_rows);
}

struct fsck_job {
	struct cb_daemon *d;
	struct cb_daemon_conn *conn;
	json_t *id;
	int repair;
};

/* One check at a time per daemon; the daemon's stop joins it (cb_daemon_fsck_stop). */
static pthread_mutex_t fsck_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_t fsck_thread;
static int fsck_started, fsck_done;

static void *fsck_main(void *arg)
{
	struct fsck_job *job = arg;
	struct cb_daemon *d = job->d;
	struct cb_fsck_report r;
	long long left = 0;
	json_t *out;
	int rc;

	/* Without the turn lock: a snapshot or rollback meanwhile adds rows fsck does not look
	 * at, never a false problem; a prune can delete a blob between fsck reading its row and
	 * opening it, so whatever looks wrong is checked again (and repaired) under the lock. */
	rc = cb_ws_fsck(d->ref, 0, NULL, &r);
	if (!rc && r.n) {
		cb_ws_fsck_free(&r);
		pthread_mutex_lock(&d->turn_lock);
		rc = cb_ws_fsck(d->ref, job->repair, NULL, &r);
		if (job->repair) /* a rebuilt database may have a turn 0 of its own */
			cb_daemon_drift_forget(d);
		pthread_mutex_unlock(&d->turn_lock);
	}
	/* Finished before the reply goes out: a client may send the next fsck the moment it
	 * reads it, and must not be told one is still running (the join waits only for the
	 * few lines below). */
	pthread_mutex_lock(&fsck_lock);
	fsck_done = 1;
	pthread_mutex_unlock(&fsck_lock);
	if (rc) {
		cb_daemon_reply_error(job->conn, job->id, cb_daemon_error_code(-rc), "fsck: %s",
				      cb_error_message());
	} else {
		out = cb_fsck_report_json(&r, &left);
		json_object_set_new(out, "clean", json_boolean(!left));
		cb_daemon_reply(job->conn, job->id, out);
		cb_ws_fsck_free(&r);
	}
	cb_daemon_conn_unref(job->conn);
	json_decref(job->id);
	free(job);
	return NULL;
}

/* Join a finished check's thread (under fsck_lock). */
static void fsck_reap(void)
{
	if (fsck_started && fsck_done) {
		pthread_join(fsck_thread, NULL);
		fsck_started = fsck_done = 0;
	}
}

static int op_fsck(struct cb_daemon *d, struct cb_daemon_conn *conn, json_t *req)
{
	json_t *repair = json_object_get(req, "repair");
	struct fsck_job *job;
	int rc = 0;

	if (repair && !json_is_boolean(repair))
		return cb_error_set(EPROTO, "fsck: \"repair\" must be true or false");
	pthread_mutex_lock(&fsck_lock);
	fsck_reap();
	if (fsck_started) {
		rc = cb_error_set(EBUSY, "fsck: a check of this workspace is already running");
		goto out;
	}
	job = calloc(1, sizeof(*job));
	if (!job) {
		rc = cb_error_set(ENOMEM, "fsck: out of memory");
		goto out;
	}
	job->d = d;
	job->conn = cb_daemon_conn_ref(conn);
	job->id = json_incref(json_object_get(req, "id"));
	job->repair = json_is_true(repair);
	rc = pthread_create(&fsck_thread, NULL, fsck_main, job);
	if (rc) {
		cb_daemon_conn_unref(job->conn);
		json_decref(job->id);
		free(job);
		rc = cb_error_set(rc, "fsck thread: %s", strerror(rc));
		goto out;
	}
	fsck_started = 1;
out:
	pthread_mutex_unlock(&fsck_lock);
	return rc;
}

void cb_daemon_fsck_stop(void)
{
	int started;

	/* The thread takes fsck_lock as it ends: join outside it. No new check starts now (the
	 * connections are shut down first). */
	pthread_mutex_lock(&fsck_lock);
	started = fsck_started;
	pthread_mutex_unlock(&fsck_lock);
	if (started) {
		pthread_join(fsck_thread, NULL);
		fsck_started = fsck_done = 0;
	}
}

const struct cb_daemon_op cb_daemon_ops_fsck[] = {
    {"fsck", op_fsck},
    {NULL, NULL},
};

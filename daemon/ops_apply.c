/* The apply op: a turn's changes (or everything since the base) written onto the base or
 * another folder outside the workspace, refused with the list of conflicts where that folder
 * changed since. */
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cowbox/apply.h"
#include "cowbox/error.h"
#include "cowbox/journal.h"
#include "cowbox/turn_store.h"
#include "cowbox/turns.h"
#include "cowbox/workspace.h"
#include "daemon.h"

/* 1 if path is dir or below it. */
static int path_within(const char *path, const char *dir)
{
	size_t n = strlen(dir);

	return dir[0] && !strncmp(path, dir, n) && (path[n] == '\0' || path[n] == '/');
}

/* The folder to write: to (absolute, an existing directory) or the base; never the
 * workspace's own directory, its mount or anything else under $COWBOX_HOME. */
static int apply_target(struct cb_daemon *d, json_t *to, char **out)
{
	char *home = NULL, *real_home = NULL;
	const char *want = d->base;
	int rc = 0;

	*out = NULL;
	if (to && !json_is_null(to)) {
		if (!json_is_string(to) || json_string_value(to)[0] != '/')
			return cb_error_set(EINVAL, "apply: \"to\" needs an absolute directory");
		want = json_string_value(to);
	}
	if (!want)
		return cb_error_set(EINVAL,
				    "apply: %s is an empty workspace (no base): give a "
				    "folder to write to",
				    d->ref);
	if (!(*out = realpath(want, NULL)))
		return cb_error_set(errno, "apply: %s: %s", want, strerror(errno));
	if (!cb_ws_home(&home))
		real_home = realpath(home, NULL);
	if (path_within(*out, d->dir) || path_within(*out, d->mountpoint) ||
	    path_within(d->mountpoint, *out) || (real_home && path_within(*out, real_home)))
		rc =
		    cb_error_set(EINVAL,
				 "apply: %s is inside cowbox's own state or the workspace's mount; "
				 "give a folder outside them",
				 *out);
	free(home);
	free(real_home);
	if (rc) {
		free(*out);
		*out = NULL;
	}
	return rc;
}

/* {"turn": N} applies turn N's changes (N-1 to N); without it, a snapshot is recorded first
 * and everything from the base (turn 0) to it is applied. "to": the folder (default: the
 * base). A conflict is the error code "conflict" with "conflicts": ["PATH: why", ...]. */
static int op_apply(struct cb_daemon *d, struct cb_daemon_conn *conn, json_t *req)
{
	json_t *jt = json_object_get(req, "turn"), *id = json_object_get(req, "id"), *list;
	struct cb_ws_apply_result res = {0};
	struct cb_turns *t = NULL;
	long long a = 0, b = 0;
	char *target = NULL;
	int rc;

	if (jt && !json_is_null(jt) && (!json_is_integer(jt) || json_integer_value(jt) < 1))
		return cb_error_set(EINVAL, "apply: \"turn\" needs a turn number >= 1");
	if ((rc = apply_target(d, json_object_get(req, "to"), &target)) < 0)
		return rc;
	/* In place the folder is the live tree: writing it past the mount would not be
	 * journaled, and the changes are there already. */
	if (d->in_place && d->base &&
	    (path_within(target, d->base) || path_within(d->base, target))) {
		rc = cb_error_set(EINVAL,
				  "apply: the workspace is in place: its changes are in %s "
				  "already; give --to a folder outside it",
				  d->base);
		goto out;
	}
	if (jt && !json_is_null(jt)) {
		b = json_integer_value(jt);
		a = b - 1;
	} else if ((rc = cb_daemon_snapshot_labelled(d, "apply", 1, &b)) < 0) {
		goto out;
	}
	pthread_mutex_lock(&d->turn_lock);
	rc = cb_daemon_turns_open(d, NULL, 0, &t);
	if (!rc && (rc = cb_ws_turn_check(t, b)) == 0)
		rc = cb_ws_turn_check(t, a);
	if (!rc)
		rc = cb_ws_apply(t, a, b, target, &res);
	cb_turns_close(t);
	/* Applied onto the base: what the mount cached of those paths is stale now. */
	if (!rc && d->base && !strcmp(target, d->base))
		cb_daemon_base_watch(d, "apply");
	pthread_mutex_unlock(&d->turn_lock);
	if (rc == -EEXIST && res.nconflicts) {
		list = json_array();
		for (size_t i = 0; i < res.nconflicts; i++)
			json_array_append_new(list, json_string(res.conflicts[i]));
		rc =
		    cb_daemon_send_frame(conn, id,
					 json_pack("{s:{s:s, s:s, s:O, s:{s:o}}}", "error", "code",
						   "conflict", "message", cb_error_message(),
						   "conflicts", list, "result", "conflicts", list));
		rc = rc < 0 ? rc : 0;
		goto out;
	}
	if (rc < 0)
		goto out;
	cb_daemon_log(
	    "apply: turns %lld..%lld onto %s: %lld written, %lld deleted, %lld already so", a, b,
	    target, res.written, res.deleted, res.unchanged);
	rc = cb_daemon_reply(conn, id,
			     json_pack("{s:I, s:I, s:s, s:I, s:I, s:I}", "from_turn", (json_int_t)a,
				       "to_turn", (json_int_t)b, "to", target, "written",
				       (json_int_t)res.written, "deleted", (json_int_t)res.deleted,
				       "unchanged", (json_int_t)res.unchanged));
out:
	cb_ws_apply_result_free(&res);
	free(target);
	return rc;
}

const struct cb_daemon_op cb_daemon_ops_apply[] = {
    {"apply", op_apply},
    {NULL, NULL},
};

/* Access levels in the daemon: the level each op needs, the check every request passes, and
 * the access op that lowers a connection's level or the workspace's widest one. */
#include "config.h"

#include <errno.h>
#include <string.h>

#include "cowbox/access.h"
#include "cowbox/workspace.h"
#include "cowbox/error.h"
#include "daemon.h"

/* Ops that need less than full; every other op (exec, run, stdin, kill, which, host_url,
 * apply and any op added later) needs full, so a new op is never open by mistake. */
static const struct {
	const char *op;
	int level;
} op_levels[] = {
    {"hello", CB_ACCESS_NONE},	  {"ping", CB_ACCESS_NONE},	 {"info", CB_ACCESS_NONE},
    {"access", CB_ACCESS_NONE},	  {"close", CB_ACCESS_NONE},	 {"destroy", CB_ACCESS_NONE},
    {"snapshot", CB_ACCESS_NONE}, {"diff", CB_ACCESS_NONE},	 {"turns", CB_ACCESS_NONE},
    {"fsck", CB_ACCESS_NONE},	  {"read", CB_ACCESS_FILES},	 {"write", CB_ACCESS_FILES},
    {"idle", CB_ACCESS_NONE},	  {"rollback", CB_ACCESS_FILES}, {"fork", CB_ACCESS_FILES},
    {"prune", CB_ACCESS_FILES},
};

static int op_level(const char *op, json_t *req)
{
	/* configure only reads the options unless it is given some */
	if (!strcmp(op, "configure"))
		return json_object_get(req, "options") ? CB_ACCESS_FULL : CB_ACCESS_NONE;
	/* the network log is net_log's level (full) wherever it is read */
	if (!strcmp(op, "diff") && json_is_true(json_object_get(req, "network")))
		return CB_ACCESS_FULL;
	for (size_t i = 0; i < sizeof(op_levels) / sizeof(op_levels[0]); i++)
		if (!strcmp(op_levels[i].op, op))
			return op_levels[i].level;
	return CB_ACCESS_FULL;
}

int cb_daemon_access_of(struct cb_daemon_conn *conn)
{
	struct cb_daemon *d = cb_daemon_conn_daemon(conn);
	int own = cb_daemon_conn_level(conn);
	int ws = __atomic_load_n(&d->access, __ATOMIC_ACQUIRE);

	return own < ws ? own : ws;
}

int cb_daemon_access_check(struct cb_daemon_conn *conn, const char *op, json_t *req)
{
	int need = op_level(op, req), have = cb_daemon_access_of(conn);

	if (have >= need)
		return 0;
	return cb_error_set(EACCES,
			    "%s refused: this connection has access %s, and %s needs %s (the "
			    "workspace serves at most %s)",
			    op, cb_access_name(have), op, cb_access_name(need),
			    cb_access_name(__atomic_load_n(&cb_daemon_conn_daemon(conn)->access,
							   __ATOMIC_ACQUIRE)));
}

/* {"level": L} lowers this connection to L; with "workspace": true, the widest level the
 * workspace serves too (recorded in its directory, for every connection and later daemon).
 * A level wider than the connection has is refused: levels are only ever lowered. */
static int op_access(struct cb_daemon *d, struct cb_daemon_conn *conn, json_t *req)
{
	json_t *lv = json_object_get(req, "level"), *ws = json_object_get(req, "workspace");
	int have = cb_daemon_access_of(conn), want = have, rc;

	if (ws && !json_is_boolean(ws))
		return cb_error_set(EINVAL, "access: \"workspace\" needs true or false");
	if (lv && !json_is_null(lv)) {
		if (!json_is_string(lv))
			return cb_error_set(EINVAL, "access: \"level\" needs none, files or full");
		if ((want = cb_access_parse(json_string_value(lv))) < 0)
			return want;
	}
	if (want > have) {
		cb_daemon_reply_error(
		    conn, json_object_get(req, "id"), "access_denied",
		    "access %s refused: %s %s serves at most %s; a level can only be lowered",
		    cb_access_name(want), have < d->access ? "this connection to" : "workspace",
		    d->ref, cb_access_name(have));
		return 0;
	}
	if (json_is_true(ws) && want < d->access) {
		pthread_mutex_lock(&d->conns_lock);
		rc = cb_ws_access_save(d->dir, want);
		if (!rc)
			__atomic_store_n(&d->access, want, __ATOMIC_RELEASE);
		pthread_mutex_unlock(&d->conns_lock);
		if (rc)
			return rc;
		cb_daemon_log("access: the workspace now serves at most %s", cb_access_name(want));
	}
	cb_daemon_conn_set_level(conn, want);
	return cb_daemon_reply(conn, json_object_get(req, "id"), cb_daemon_access_json(conn));
}

json_t *cb_daemon_access_json(struct cb_daemon_conn *conn)
{
	struct cb_daemon *d = cb_daemon_conn_daemon(conn);

	return json_pack("{s:s, s:s}", "access", cb_access_name(cb_daemon_access_of(conn)),
			 "supported_access",
			 cb_access_name(__atomic_load_n(&d->access, __ATOMIC_ACQUIRE)));
}

const struct cb_daemon_op cb_daemon_ops_access[] = {
    {"access", op_access},
    {NULL, NULL},
};

/* The daemon's own ops: hello and ping (is it there), info (what it serves) and close
 * (unmount and exit, keeping everything on disk). */
#include "config.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include "cowbox/backend.h"
#include "cowbox/error.h"
#include "cowbox/journal.h"
#include "cowbox/overlay.h"
#include "api.h"
#include "daemon.h"

static int op_hello(struct cb_daemon *d, struct cb_daemon_conn *conn, json_t *req)
{
	return cb_daemon_reply(conn, json_object_get(req, "id"),
			       json_pack("{s:s, s:i, s:s, s:I}", "hello", "cowbox", "protocol",
					 CB_PROTOCOL_VERSION, "ref", d->ref, "pid",
					 (json_int_t)getpid()));
}

static int op_ping(struct cb_daemon *d, struct cb_daemon_conn *conn, json_t *req)
{
	(void)d;
	return cb_daemon_reply(conn, json_object_get(req, "id"), NULL);
}

/* The backend's network, and a warning when it is the host's own; the limits in effect,
 * with what the upper layer holds against its quota. */
static void info_network(struct cb_daemon *d, json_t *r)
{
	struct cb_backend_options o;
	struct cb_backend_limits lim;
	struct cb_overlay_quota q;
	struct statvfs sv;
	json_t *l;

	if (cb_backend_options_load(d->dir, &o) < 0) {
		cb_error_clear();
		return;
	}
	cb_backend_limits_of(&o, &lim);
	if ((l = cb_backend_limits_json(&lim)) && d->ov) {
		cb_overlay_quota_info(d->ov, &q);
		/* a capped upper/: its filesystem knows, passthrough writes never reach us */
		int by_fs = d->upper_capped && lim.disk_bytes == d->upper_cap;

		if (by_fs && statvfs(d->upper, &sv) == 0)
			q.used_bytes = (unsigned long long)(sv.f_blocks - sv.f_bfree) * sv.f_frsize;
		json_object_set_new(l, "disk_used_bytes", json_integer((json_int_t)q.used_bytes));
		json_object_set_new(l, "disk_used_inodes", json_integer((json_int_t)q.used_inodes));
		if (lim.disk_bytes)
			json_object_set_new(l, "disk_enforced_by",
					    json_string(by_fs ? "filesystem" : "mount"));
	}
	json_object_set_new(r, "limits", l);
	json_object_set_new(r, "network", json_string(cb_backend_net_name(o.net)));
	if (o.net == CB_BACKEND_NET_HOST)
		json_object_set_new(
		    r, "warning",
		    json_string("network host: commands share the host's network "
				"namespace (its loopback services and abstract unix "
				"sockets)"));
	cb_backend_options_free(&o);
}

/* The filesystem's transport and fast paths; with stats, the FUSE requests per opcode. */
static void info_fs(struct cb_daemon *d, json_t *req, json_t *r)
{
	struct cb_overlay_op_stat st[64];
	struct cb_overlay_fs_info fi;
	json_t *ops;
	size_t i, n;

	if (!d->ov)
		return;
	cb_overlay_fs_info(d->ov, &fi);
	json_object_set_new(r, "fs",
			    json_pack("{s:s, s:s, s:I, s:b, s:b, s:b}", "libfuse", fi.libfuse,
				      "transport", fi.transport, "uring_requests",
				      (json_int_t)fi.uring_requests, "passthrough", fi.passthrough,
				      "killpriv_v2", fi.killpriv_v2, "writeback_cache",
				      fi.writeback_cache));
	if (!json_is_true(json_object_get(req, "stats")) || !(ops = json_object()))
		return;
	n = cb_overlay_op_stats(d->ov, st, sizeof(st) / sizeof(st[0]));
	for (i = 0; i < n; i++)
		json_object_set_new(ops, st[i].op,
				    json_pack("{s:I, s:I}", "count", (json_int_t)st[i].count, "ns",
					      (json_int_t)st[i].ns));
	json_object_set_new(r, "fs_stats", ops);
}

static int op_info(struct cb_daemon *d, struct cb_daemon_conn *conn, json_t *req)
{
	json_t *r = json_pack("{s:s, s:s, s:s, s:I, s:I, s:f}", "ref", d->ref, "state", "mounted",
			      "mountpoint", d->mountpoint, "pid", (json_int_t)getpid(), "turn",
			      (json_int_t)cb_journal_turn(d->db), "started", d->started);

	if (r) {
		json_object_set_new(r, "name", d->name ? json_string(d->name) : json_null());
		json_object_set_new(r, "base", d->base ? json_string(d->base) : json_null());
		json_object_set_new(r, "in_place", json_boolean(d->in_place));
		info_network(d, r);
		cb_daemon_publish_info(d, r);
		info_fs(d, req, r);
		cb_daemon_basehash_info(d, r);
		json_object_update_new(r, cb_daemon_access_json(conn));
		cb_daemon_idle_info(d, r);
		pthread_mutex_lock(&d->phase_lock);
		if (d->phase[0])
			json_object_set_new(r, "backend_phase", json_string(d->phase));
		pthread_mutex_unlock(&d->phase_lock);
	}
	return cb_daemon_reply(conn, json_object_get(req, "id"), r);
}

/* The reply goes out before the stop is asked for, so the client sees it. */
static int op_close(struct cb_daemon *d, struct cb_daemon_conn *conn, json_t *req)
{
	cb_daemon_reply(conn, json_object_get(req, "id"), NULL);
	cb_daemon_request_stop(d);
	return 0;
}

const struct cb_daemon_op cb_daemon_ops_core[] = {
    {"hello", op_hello}, {"ping", op_ping}, {"info", op_info}, {"close", op_close}, {NULL, NULL},
};

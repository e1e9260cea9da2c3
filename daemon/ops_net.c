/* The network ops: reaches (what the workspace's policy opens), net_log (what its egress proxy
 * did, per turn), publish/unpublish and netns (for cowbox exec REF). */
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "api.h"
#include "cowbox/error.h"
#include "cowbox/net.h"
#include "cowbox/netlog.h"
#include "daemon.h"

/* reaches {"dest": "host[:port]"} -> {"allowed": bool, "rule": "...", "network": mode} */
static int op_reaches(struct cb_daemon *d, struct cb_daemon_conn *conn, json_t *req)
{
	const char *dest = json_string_value(json_object_get(req, "dest"));
	struct cb_backend_options o;
	struct cb_net_policy *p = NULL;
	struct cb_net_verdict v = {0};
	int rc;

	if (!dest)
		return cb_error_set(EINVAL, "reaches: needs \"dest\", a host[:port]");
	if ((rc = cb_backend_options_load(d->dir, &o)) < 0)
		return rc;
	if ((rc = cb_backend_policy(&o, &p)) < 0)
		goto out;
	if (p) {
		rc = cb_net_reaches(p, dest, &v);
	} else {
		/* none, all, host: the answer does not depend on the destination */
		struct cb_net_policy *any = NULL;

		if ((rc = cb_net_policy_new(CB_NET_POLICY_PUBLIC, NULL, 0, &any)) == 0)
			rc = cb_net_reaches(any, dest, &v); /* to check dest's form */
		cb_net_policy_free(any);
		v.allowed = o.net != CB_BACKEND_NET_NONE;
		snprintf(v.rule, sizeof v.rule, "network %s", cb_backend_net_name(o.net));
	}
	if (rc == 0)
		rc = cb_daemon_reply(conn, json_object_get(req, "id"),
				     json_pack("{s:b, s:s, s:s}", "allowed", v.allowed, "rule",
					       v.rule, "network", cb_backend_net_name(o.net)));
out:
	cb_net_policy_free(p);
	cb_backend_options_free(&o);
	return rc;
}

static int row_json(const struct cb_netlog_row *r, void *arg)
{
	json_t *j = json_pack("{s:I, s:I, s:f, s:s, s:s, s:s, s:i, s:b, s:s, s:I, s:I, s:f, s:b}",
			      "id", (json_int_t)r->id, "turn", (json_int_t)r->turn, "time", r->time,
			      "proto", r->proto, "name", r->name, "address", r->address, "port",
			      r->port, "allowed", r->allowed, "rule", r->rule, "bytes_up",
			      (json_int_t)r->bytes_up, "bytes_down", (json_int_t)r->bytes_down,
			      "duration", r->duration, "secret", r->secret);

	return j && json_array_append_new(arg, j) == 0
		   ? 0
		   : cb_error_set(ENOMEM, "net_log: out of memory");
}

int cb_daemon_net_rows(struct cb_daemon *d, long long after, long long upto, json_t **out)
{
	json_t *rows;
	int rc;

	cb_daemon_net_flush(); /* what the proxy recorded so far is read too */
	rows = json_array();
	rc = rows ? cb_db_netlog_range(d->db, after, upto, row_json, rows)
		  : cb_error_set(ENOMEM, "net_log: out of memory");

	if (rc) {
		json_decref(rows);
		rows = NULL;
	}
	*out = rows;
	return rc;
}

/* net_log {"turn": N (optional)} -> {"rows": [...]}, oldest first. */
static int op_net_log(struct cb_daemon *d, struct cb_daemon_conn *conn, json_t *req)
{
	json_t *turn = json_object_get(req, "turn"), *rows = NULL;
	long long t;
	int rc;

	if (turn && !json_is_null(turn) && (!json_is_integer(turn) || json_integer_value(turn) < 1))
		return cb_error_set(EINVAL, "net_log: \"turn\" is a turn number (1 or more)");
	t = json_is_integer(turn) ? json_integer_value(turn) : -1;
	if ((rc = cb_daemon_net_rows(d, t < 0 ? LLONG_MIN : t - 1, t, &rows)) < 0)
		return rc;
	return cb_daemon_reply(conn, json_object_get(req, "id"), json_pack("{s:o}", "rows", rows));
}

static int port_arg(json_t *req, const char *op, int *port)
{
	json_t *v = json_object_get(req, "port");

	if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 65535)
		return cb_error_set(EINVAL, "%s: needs \"port\", an integer 1-65535", op);
	*port = (int)json_integer_value(v);
	return 0;
}

/* publish {"port"} -> {"address": "127.0.0.1:HOSTPORT", "host_port"}: the host reaches a
 * server listening on that port inside the sandbox (ns, docker). */
static int op_publish(struct cb_daemon *d, struct cb_daemon_conn *conn, json_t *req)
{
	struct cb_backend *b;
	char addr[32];
	int rc, port, host_port = 0;

	json_t *hp = json_object_get(req, "host_port");

	if (hp &&
	    (!json_is_integer(hp) || json_integer_value(hp) < 1 || json_integer_value(hp) > 65535))
		return cb_error_set(EINVAL, "publish: host_port is a port 1-65535");
	host_port = hp ? (int)json_integer_value(hp) : 0;
	if ((rc = port_arg(req, "publish", &port)) < 0 || (rc = cb_api_backend(d, 1, &b)) < 0)
		return rc;
	rc = cb_publish_add(b, port, &host_port);
	cb_api_backend_put(d, b);
	if (rc < 0)
		return rc;
	snprintf(addr, sizeof addr, "127.0.0.1:%d", host_port);
	return cb_daemon_reply(conn, json_object_get(req, "id"),
			       json_pack("{s:s, s:i}", "address", addr, "host_port", host_port));
}

void cb_daemon_publish_info(struct cb_daemon *d, json_t *r)
{
	struct cb_backend *b = NULL;
	int open, busy;

	pthread_mutex_lock(&d->api_lock);
	open = d->api_backend != NULL;
	pthread_mutex_unlock(&d->api_lock);
	pthread_mutex_lock(&d->phase_lock);
	busy = d->phase[0] != 0;
	pthread_mutex_unlock(&d->phase_lock);
	/* A backend not opened yet has published nothing: info does not open it. Nor has one
	 * being created, whose lock its create holds for the whole vm boot or hooks: info
	 * answers meanwhile (with the backend_phase a client shows). */
	if (!open || busy || cb_api_backend(d, 0, &b) < 0) {
		cb_error_clear();
		return;
	}
	if (__atomic_load_n(&b->created, __ATOMIC_ACQUIRE))
		json_object_set_new(r, "published", cb_publish_json(b));
	else
		json_object_set_new(r, "published", json_array());
	cb_api_backend_put(d, b);
}

static int op_unpublish(struct cb_daemon *d, struct cb_daemon_conn *conn, json_t *req)
{
	struct cb_backend *b;
	int rc, port;

	if ((rc = port_arg(req, "unpublish", &port)) < 0 || (rc = cb_api_backend(d, 1, &b)) < 0)
		return rc;
	rc = cb_publish_remove(b, port);
	cb_api_backend_put(d, b);
	return rc < 0 ? rc : cb_daemon_reply(conn, json_object_get(req, "id"), NULL);
}

/* netns -> {"pid", "fd", "inode"}: where `cowbox exec REF` finds the workspace's network
 * namespace (/proc/PID/fd/FD, checked against inode, since the fd may be closed and its number
 * reused by then), so that its commands go through the same egress proxy as the API's. */
static int op_netns(struct cb_daemon *d, struct cb_daemon_conn *conn, json_t *req)
{
	struct cb_backend *b;
	struct stat st;
	int rc, fd;

	if ((rc = cb_api_backend(d, 1, &b)) < 0)
		return rc;
	pthread_mutex_lock(&b->lock);
	fd = b->netns_fd;
	if (fd < 0)
		rc = cb_error_set(EOPNOTSUPP, "netns: the workspace has no network namespace of "
					      "its own (network host, or the local backend)");
	else if (fstat(fd, &st) < 0)
		rc = cb_error_set(errno, "netns: %s", strerror(errno));
	pthread_mutex_unlock(&b->lock);
	cb_api_backend_put(d, b);
	if (rc < 0)
		return rc;
	return cb_daemon_reply(conn, json_object_get(req, "id"),
			       json_pack("{s:i, s:i, s:I}", "pid", (int)getpid(), "fd", fd, "inode",
					 (json_int_t)st.st_ino));
}

const struct cb_daemon_op cb_daemon_ops_net[] = {
    {"reaches", op_reaches},	 {"net_log", op_net_log}, {"publish", op_publish},
    {"unpublish", op_unpublish}, {"netns", op_netns},	  {NULL, NULL},
};

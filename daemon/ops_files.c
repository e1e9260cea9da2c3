/* The API's other ops: read and write (chunked, binary-safe, beneath the workspace root),
 * which, host_url, and the backend's lifecycle: configure (options) and destroy. */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api.h"
#include "cowbox/error.h"

static int field_path(json_t *req, const char **path)
{
	*path = json_string_value(json_object_get(req, "path"));
	return *path ? 0
		     : cb_error_set(EINVAL, "needs \"path\", a string relative to the "
					    "workspace root");
}

static int field_offset(json_t *req, const char *name, long long dflt, long long *out)
{
	json_t *v = json_object_get(req, name);

	*out = dflt;
	if (!v || json_is_null(v))
		return 0;
	if (!json_is_integer(v) || json_integer_value(v) < 0)
		return cb_error_set(EINVAL, "\"%s\" needs a non-negative integer", name);
	*out = json_integer_value(v);
	return 0;
}

static int op_read(struct cb_daemon *d, struct cb_daemon_conn *conn, json_t *req)
{
	struct cb_backend *b;
	const char *path;
	char *full = NULL;
	long long off, len;
	void *data = NULL;
	size_t n = 0;
	off_t size = 0;
	int rc;

	if ((rc = field_path(req, &path)) < 0 || (rc = field_offset(req, "offset", 0, &off)) < 0 ||
	    (rc = field_offset(req, "length", CB_BACKEND_CHUNK, &len)) < 0)
		return rc;
	if ((rc = cb_api_backend(d, 0, &b)) < 0)
		return rc;
	if ((rc = cb_backend_api_path(b->opt.working_dir, path, &full)) == 0)
		rc = cb_backend_read(b, full, (off_t)off, (size_t)len, &data, &n, &size);
	cb_api_backend_put(d, b);
	free(full);
	if (rc < 0)
		return rc;
	rc = cb_daemon_reply(conn, json_object_get(req, "id"),
			     json_pack("{s:o, s:I, s:I, s:b}", "data", cb_api_b64_json(data, n),
				       "size", (json_int_t)size, "offset", (json_int_t)off, "eof",
				       off + (long long)n >= (long long)size));
	free(data);
	return rc;
}

static int op_write(struct cb_daemon *d, struct cb_daemon_conn *conn, json_t *req)
{
	json_t *data = json_object_get(req, "data"), *trunc = json_object_get(req, "truncate");
	struct cb_backend *b;
	const char *path;
	char *full = NULL;
	long long off, mode;
	void *buf = NULL;
	size_t len = 0;
	int rc;

	if ((rc = field_path(req, &path)) < 0 || (rc = field_offset(req, "offset", 0, &off)) < 0 ||
	    (rc = field_offset(req, "mode", 0644, &mode)) < 0)
		return rc;
	if (!json_is_string(data))
		return cb_error_set(EINVAL, "write: needs \"data\", base64");
	if (trunc && !json_is_boolean(trunc))
		return cb_error_set(EINVAL, "write: \"truncate\" needs true or false");
	if ((rc = cb_api_b64_decode("data", json_string_value(data), &buf, &len)) < 0)
		return rc;
	if (len > 4 * CB_BACKEND_CHUNK)
		rc = cb_error_set(EINVAL,
				  "write: a chunk of %zu bytes; send at most %u per "
				  "request",
				  len, 4 * CB_BACKEND_CHUNK);
	if (!rc && !(rc = cb_api_backend(d, 0, &b))) {
		if ((rc = cb_backend_api_path(b->opt.working_dir, path, &full)) == 0)
			rc = cb_backend_write(b, full, (off_t)off, buf, len,
					      trunc ? json_is_true(trunc) : off == 0,
					      (mode_t)(mode & 07777));
		cb_api_backend_put(d, b);
	}
	free(buf);
	free(full);
	if (rc)
		return rc;
	return cb_daemon_reply(conn, json_object_get(req, "id"),
			       json_pack("{s:I}", "written", (json_int_t)len));
}

/* Reply {key: value} to req, value being what a backend operation malloc'd (freed here). */
static int reply_string(struct cb_daemon_conn *conn, json_t *req, const char *key, char *value)
{
	int rc = cb_daemon_reply(conn, json_object_get(req, "id"), json_pack("{s:s}", key, value));

	free(value);
	return rc;
}

static int op_which(struct cb_daemon *d, struct cb_daemon_conn *conn, json_t *req)
{
	const char *bin = json_string_value(json_object_get(req, "binary"));
	struct cb_backend *b;
	char *path = NULL;
	int rc;

	if (!bin || !*bin)
		return cb_error_set(EINVAL, "which: needs \"binary\", a program name");
	if ((rc = cb_api_backend(d, 1, &b)) < 0)
		return rc;
	rc = b->ops->which(b, bin, &path);
	cb_api_backend_put(d, b);
	return rc < 0 ? rc : reply_string(conn, req, "path", path);
}

static int op_host_url(struct cb_daemon *d, struct cb_daemon_conn *conn, json_t *req)
{
	json_t *port = json_object_get(req, "port");
	struct cb_backend *b;
	char *url = NULL;
	int rc;

	if (!json_is_integer(port))
		return cb_error_set(EINVAL, "host_url: needs \"port\", an integer 1-65535");
	/* Checked as sent, before any narrowing: 2^63-1 must not turn into "port -1". */
	if (json_integer_value(port) < 1 || json_integer_value(port) > 65535)
		return cb_error_set(EINVAL, "host_url: port %lld is not in 1-65535",
				    (long long)json_integer_value(port));
	if ((rc = cb_api_backend(d, 1, &b)) < 0)
		return rc;
	rc = b->ops->host_url(b, (int)json_integer_value(port), &url);
	cb_api_backend_put(d, b);
	return rc < 0 ? rc : reply_string(conn, req, "url", url);
}

/* With "options": set them (only before the backend is first created); always: say which.
 * Options with on_create hooks or a setup script boot the backend at once, so that they run
 * at create, and record what they did as a turn labelled "on_create": the baseline the
 * agent's first turn is compared with, not part of it. */
static int op_configure(struct cb_daemon *d, struct cb_daemon_conn *conn, json_t *req)
{
	json_t *opt = json_object_get(req, "options"), *reply;
	char *workdir = NULL;
	long long baseline = -1;
	struct cb_backend *b;
	int rc, hooks;

	if (opt && (rc = cb_api_configure(d, opt)) < 0)
		return rc;
	if ((rc = cb_api_backend(d, 0, &b)) < 0)
		return rc;
	hooks = b->opt.on_create[0] || b->opt.setup_script;
	if (opt && hooks && !b->created && !(rc = cb_backend_ensure(b)))
		rc = cb_daemon_snapshot_labelled(d, "on_create", 0, &baseline);
	if (!rc)
		rc = cb_backend_workdir(b->opt.kind, b->root, b->opt.working_dir, &workdir);
	reply = rc ? NULL
		   : json_pack("{s:o, s:b, s:s}", "options", cb_backend_options_to_json(&b->opt),
			       "created", b->created, "workdir", workdir);
	cb_api_backend_put(d, b);
	free(workdir);
	if (rc)
		return rc;
	if (baseline >= 0)
		json_object_set_new(reply, "baseline_turn", json_integer(baseline));
	return cb_daemon_reply(conn, json_object_get(req, "id"), reply);
}

/* The on_destroy hooks, the backend's resources, then the daemon; `cowbox rm` (or the
 * client's destroy) removes the workspace's disk after. */
static int op_destroy(struct cb_daemon *d, struct cb_daemon_conn *conn, json_t *req)
{
	struct cb_backend *b;
	char marker[4096];
	int rc;

	if ((rc = cb_api_backend(d, 1, &b)) < 0)
		return rc;
	for (int i = 0; !rc && i < CB_BACKEND_MAX_HOOKS && b->opt.on_destroy[i]; i++)
		rc = cb_backend_hook(b, "on_destroy hook", b->opt.on_destroy[i], b->opt.timeout);
	if (!rc)
		rc = b->ops->destroy(b);
	cb_api_backend_put(d, b);
	if (rc < 0)
		return rc;
	snprintf(marker, sizeof(marker), "%s/backend.created", d->dir);
	unlink(marker);
	cb_daemon_reply(conn, json_object_get(req, "id"), NULL);
	cb_daemon_request_stop(d);
	return 0;
}

const struct cb_daemon_op cb_daemon_ops_files[] = {
    {"read", op_read},
    {"write", op_write},
    {"which", op_which},
    {"host_url", op_host_url},
    {"configure", op_configure},
    {"destroy", op_destroy},
    {NULL, NULL},
};

/* libcowbox's high-level API, one request each: files (through the mount or in protocol
 * chunks), which, host_url and the turn operations (snapshot, diff, rollback, fork). */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "box_private.h"
#include "cowbox/apply.h"
#include "cowbox/client.h"
#include "cowbox/backend.h"
#include "cowbox/error.h"

#define BOX_CHUNK  (1u << 20) /* bytes per read/write request */
#define BOX_WINDOW 4	      /* write requests in flight at once */

/* The direct path resolves a path as the daemon does (working_dir, /workspace/...). */
static int box_direct_read(struct cb_box *box, const char *path, void **data, size_t *len)
{
	char *full = NULL;
	int rc = cb_backend_api_path(box->working_dir, path, &full);

	if (!rc)
		rc = cb_box_direct_read(box, full, data, len);
	free(full);
	return rc;
}

static int box_direct_write(struct cb_box *box, const char *path, const void *data, size_t len)
{
	char *full = NULL;
	int rc = cb_backend_api_path(box->working_dir, path, &full);

	if (!rc)
		rc = cb_box_direct_write(box, full, data, len);
	free(full);
	return rc;
}

int cb_box_read(struct cb_box *box, const char *path, void **data, size_t *len)
{
	char what[4200];
	char *buf = NULL;
	size_t have = 0;
	int rc = 0;

	cb_box_set_code("");
	*data = NULL;
	*len = 0;
	snprintf(what, sizeof(what), "read %s", path ? path : "(null)");
	/* The daemon must be up for its mount to be there: a ping boots it if needed. */
	if ((rc = cb_box_request(box, "read", json_pack("{s:s}", "op", "ping"), NULL, NULL)) ||
	    (rc = box_direct_read(box, path, data, len)) <= 0)
		return cb_box_finish(rc);
	for (;;) {
		json_t *reply = NULL;
		void *chunk = NULL;
		size_t n = 0;
		char *grown;

		rc = cb_box_request(box, what,
				    json_pack("{s:s,s:s,s:I,s:I}", "op", "read", "path",
					      path ? path : "", "offset", (json_int_t)have,
					      "length", (json_int_t)BOX_CHUNK),
				    &reply, NULL);
		if (!rc)
			rc = cb_api_b64_decode(
			    "data", json_string_value(json_object_get(reply, "data")) ?: "", &chunk,
			    &n);
		grown = rc ? NULL : realloc(buf, have + n + 1);
		if (!rc && !grown)
			rc = cb_error_set(ENOMEM, "%s: out of memory", what);
		if (rc) {
			json_decref(reply);
			free(chunk);
			goto out;
		}
		buf = grown;
		memcpy(buf + have, chunk, n);
		have += n;
		buf[have] = '\0';
		free(chunk);
		int eof = json_is_true(json_object_get(reply, "eof")) || n == 0;

		json_decref(reply);
		if (eof)
			break;
	}
	*data = buf;
	*len = have;
	buf = NULL;
out:
	free(buf);
	return cb_box_finish(rc);
}

/* Send one write chunk without waiting; its id goes to *id. */
static int write_send(struct cb_box *box, const char *path, const char *what, const char *data,
		      size_t off, size_t n, long long *id)
{
	json_t *req = json_pack("{s:s,s:s,s:o,s:I,s:b}", "op", "write", "path", path, "data",
				cb_api_b64_json(data + off, n), "offset", (json_int_t)off,
				"truncate", off == 0);

	if (!req)
		return cb_error_set(ENOMEM, "%s: out of memory", what);
	return cb_client_send(box->client, req, id);
}

int cb_box_write(struct cb_box *box, const char *path, const void *data, size_t len)
{
	char what[4200];
	long long ids[BOX_WINDOW];
	size_t off, inflight = 0, done;
	int rc;

	cb_box_set_code("");
	snprintf(what, sizeof(what), "write %s", path ? path : "(null)");
	if (!path || (len && !data))
		return cb_box_finish(cb_error_set(EINVAL, "%s: no path or no data", what));
	if ((rc = cb_box_request(box, "write", json_pack("{s:s}", "op", "ping"), NULL, NULL)) ||
	    (rc = box_direct_write(box, path, data, len)) <= 0)
		return cb_box_finish(rc);
	/* The first chunk truncates, so the rest must come after it; those are pipelined. */
	off = len < BOX_CHUNK ? len : BOX_CHUNK;
	rc = cb_box_request(box, what,
			    json_pack("{s:s,s:s,s:o,s:i,s:b}", "op", "write", "path", path, "data",
				      cb_api_b64_json(data, off), "offset", 0, "truncate", 1),
			    NULL, NULL);
	while (!rc && (off < len || inflight)) {
		if (off < len && inflight < BOX_WINDOW) {
			size_t n = len - off < BOX_CHUNK ? len - off : BOX_CHUNK;

			rc = write_send(box, path, what, data, off, n, &ids[inflight]);
			inflight++;
			off += n;
			continue;
		}
		rc = cb_box_wait_reply(box->client, ids, inflight, &done, what, NULL, NULL);
		if (!rc)
			ids[done] = ids[--inflight];
	}
	if (rc && inflight) {
		/* The connection is out of step with its replies: start afresh next time. */
		cb_client_close(box->client);
		box->client = NULL;
	}
	return cb_box_finish(rc);
}

int cb_box_which(struct cb_box *box, const char *binary, char **path)
{
	char what[600];
	json_t *reply = NULL;
	int rc;

	cb_box_set_code("");
	*path = NULL;
	snprintf(what, sizeof(what), "which %.500s", binary ? binary : "(null)");
	rc = cb_box_request(box, what,
			    json_pack("{s:s,s:s}", "op", "which", "binary", binary ? binary : ""),
			    &reply, NULL);
	if (!rc && !(*path = strdup(json_string_value(json_object_get(reply, "path")) ?: "")))
		rc = cb_error_set(ENOMEM, "out of memory");
	json_decref(reply);
	return cb_box_finish(rc);
}

int cb_box_port_op(struct cb_box *box, const char *op, int port, const char *field, char **out)
{
	char what[64];
	json_t *reply = NULL;
	int rc;

	cb_box_set_code("");
	if (out)
		*out = NULL;
	snprintf(what, sizeof(what), "%s %d", op, port);
	rc =
	    cb_box_request(box, what, json_pack("{s:s,s:i}", "op", op, "port", port), &reply, NULL);
	if (!rc && field &&
	    !(*out = strdup(json_string_value(json_object_get(reply, field)) ?: "")))
		rc = cb_error_set(ENOMEM, "out of memory");
	json_decref(reply);
	return cb_box_finish(rc);
}

int cb_box_host_url(struct cb_box *box, int port, char **url)
{
	return cb_box_port_op(box, "host_url", port, "url", url);
}

/* Apply a delta reply (changed, deleted) to map in place. */
static int box_map_apply(json_t *map, json_t *reply)
{
	json_t *changed = json_object_get(reply, "changed"), *v;
	size_t i;

	json_array_foreach(json_object_get(reply, "deleted"), i, v)
	    json_object_del(map, json_string_value(v) ?: "");
	return json_object_update(map, changed) ? cb_error_set(ENOMEM, "out of memory") : 0;
}

/* Record a turn and bring box->map to it: only the changes since box->map_turn travel when
 * the box holds a map of this database. *reply (if not NULL) keeps the reply, for callers that
 * want the delta itself; *full says whether the whole map came instead. */
static long long box_snapshot_map(struct cb_box *box, const char *label, json_t **reply_out,
				  int *full)
{
	json_t *req = json_pack("{s:s,s:b}", "op", "snapshot", "files", 1);
	json_t *reply = NULL, *files;
	const char *id;
	long long rc;

	*full = 1;
	if (req && label)
		json_object_set_new(req, "label", json_string(label));
	if (req && box->map) {
		json_object_set_new(req, "since", json_integer(box->map_turn));
		json_object_set_new(req, "map_id", json_string(box->map_id));
	}
	rc = cb_box_request(box, "snapshot", req, &reply, NULL);
	if (rc)
		goto out;
	rc = json_integer_value(json_object_get(reply, "turn"));
	id = json_string_value(json_object_get(reply, "map_id")) ?: "";
	if (box->map && json_is_false(json_object_get(reply, "full"))) {
		*full = 0;
		/* Unusable if the update fails half-way: the next call starts over. */
		if (box_map_apply(box->map, reply) < 0) {
			json_decref(box->map);
			box->map = NULL;
			rc = -ENOMEM;
			goto out;
		}
	} else {
		files = json_object_get(reply, "files");
		json_decref(box->map);
		box->map = files ? json_incref(files) : json_object();
	}
	box->map_turn = rc;
	snprintf(box->map_id, sizeof(box->map_id), "%s", id);
	if (!*id) { /* a daemon that names no id gives no changes either */
		json_decref(box->map);
		box->map = NULL;
	}
out:
	if (reply_out && rc >= 0)
		*reply_out = reply;
	else
		json_decref(reply);
	return rc;
}

/* cb_box_finish for a call that returns a turn: the turn, or -errno with its code set. */
static long long box_finish_turn(long long rc)
{
	return rc < 0 ? cb_box_finish((int)rc) : (cb_box_finish(0), rc);
}

long long cb_box_snapshot(struct cb_box *box, const char *label, json_t **files)
{
	json_t *req, *reply = NULL;
	long long rc;
	int full;

	cb_box_set_code("");
	if (!files) {
		req = json_pack("{s:s,s:b}", "op", "snapshot", "files", 0);
		if (req && label)
			json_object_set_new(req, "label", json_string(label));
		rc = cb_box_request(box, "snapshot", req, &reply, NULL);
		if (!rc)
			rc = json_integer_value(json_object_get(reply, "turn"));
		json_decref(reply);
		return box_finish_turn(rc);
	}
	*files = NULL;
	rc = box_snapshot_map(box, label, NULL, &full);
	/* A copy: the caller may change it; the box keeps its own for the next delta. */
	if (rc >= 0 && !(*files = json_deep_copy(box->map ? box->map : json_object())))
		rc = cb_error_set(ENOMEM, "out of memory");
	return box_finish_turn(rc);
}

long long cb_box_snapshot_changes(struct cb_box *box, const char *label, json_t **changed,
				  json_t **deleted)
{
	json_t *before = box->map ? json_incref(box->map) : NULL, *reply = NULL;
	json_t *v;
	const char *k;
	long long rc;
	int full;

	cb_box_set_code("");
	*changed = json_object();
	*deleted = json_array();
	if (!*changed || !*deleted) {
		rc = cb_error_set(ENOMEM, "out of memory");
		goto out;
	}
	/* A delta changes box->map in place and is the answer itself; the whole map replaces
	 * box->map (this reference keeps the old one) and is compared with it. */
	rc = box_snapshot_map(box, label, &reply, &full);
	if (rc < 0)
		goto out;
	if (!full) {
		json_object_update(*changed, json_object_get(reply, "changed"));
		json_array_extend(*deleted, json_object_get(reply, "deleted"));
		goto out;
	}
	json_object_foreach(box->map, k, v)
	{
		json_t *old = before ? json_object_get(before, k) : NULL;

		if (!old || !json_equal(old, v))
			json_object_set(*changed, k, v);
	}
	json_object_foreach(before, k, v)
	{
		if (!box->map || !json_object_get(box->map, k))
			json_array_append_new(*deleted, json_string(k));
	}
out:
	json_decref(before);
	json_decref(reply);
	if (rc < 0) {
		json_decref(*changed);
		json_decref(*deleted);
		*changed = *deleted = NULL;
	}
	return box_finish_turn(rc);
}

int cb_box_diff(struct cb_box *box, long long from, long long to, json_t **events)
{
	json_t *req = json_pack("{s:s,s:I}", "op", "diff", "a", (json_int_t)from), *reply = NULL;
	char what[64];
	int rc;

	cb_box_set_code("");
	*events = NULL;
	if (req && to >= 0)
		json_object_set_new(req, "b", json_integer(to));
	snprintf(what, sizeof(what), to >= 0 ? "diff %lld %lld" : "diff %lld", from, to);
	rc = cb_box_request(box, what, req, &reply, NULL);
	if (!rc) {
		*events = json_incref(json_object_get(reply, "events"));
		if (!*events)
			*events = json_array();
		rc = (int)json_array_size(*events);
	}
	json_decref(reply);
	return cb_box_finish(rc);
}

long long cb_box_rollback(struct cb_box *box, long long turn)
{
	json_t *reply = NULL;
	char what[64];
	long long rc;

	cb_box_set_code("");
	snprintf(what, sizeof(what), "rollback %lld", turn);
	rc = cb_box_request(box, what,
			    json_pack("{s:s,s:I}", "op", "rollback", "turn", (json_int_t)turn),
			    &reply, NULL);
	if (!rc)
		rc = json_integer_value(json_object_get(reply, "turn"));
	json_decref(reply);
	return box_finish_turn(rc);
}

int cb_box_fork(struct cb_box *box, long long turn, const char *name, struct cb_box **out)
{
	json_t *req = json_pack("{s:s,s:I}", "op", "fork", "turn", (json_int_t)turn), *reply = NULL;
	char what[64];
	int rc;

	cb_box_set_code("");
	*out = NULL;
	if (req && name)
		json_object_set_new(req, "name", json_string(name));
	snprintf(what, sizeof(what), "fork %lld", turn);
	rc = cb_box_request(box, what, req, &reply, NULL);
	if (!rc)
		rc = cb_box_attach(json_string_value(json_object_get(reply, "ref")) ?: "", NULL,
				   out, NULL);
	json_decref(reply);
	return cb_box_finish(rc);
}

int cb_box_fsck(struct cb_box *box, bool repair, json_t **report)
{
	json_t *reply = NULL;
	long long left = 0;
	int rc;

	cb_box_set_code("");
	*report = NULL;
	rc = cb_box_request(box, "fsck", json_pack("{s:s,s:b}", "op", "fsck", "repair", repair),
			    &reply, NULL);
	if (!rc) {
		json_t *p;
		size_t i;

		json_array_foreach(json_object_get(reply, "problems"), i, p) left +=
		    !json_is_true(json_object_get(p, "repaired"));
		json_object_del(reply, "id");
		json_object_del(reply, "ok");
		*report = reply;
		reply = NULL;
		rc = (int)left;
	}
	json_decref(reply);
	return cb_box_finish(rc);
}

int cb_box_apply(struct cb_box *box, long long turn, const char *to, json_t **report)
{
	json_t *req = json_pack("{s:s}", "op", "apply"), *reply = NULL, *result = NULL;
	int rc;

	cb_box_set_code("");
	if (report)
		*report = NULL;
	if (req && turn > 0)
		json_object_set_new(req, "turn", json_integer(turn));
	if (req && to)
		json_object_set_new(req, "to", json_string(to));
	rc = cb_box_request(box, "apply", req, &reply, &result);
	if (report && rc == -EEXIST) {
		*report = result;
		result = NULL;
	} else if (report) {
		*report = reply;
		reply = NULL;
	}
	json_decref(result);
	json_decref(reply);
	return cb_box_finish(rc);
}

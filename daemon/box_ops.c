/* libcowbox's high-level API, one request each: files (through the mount or in protocol
 * chunks), which, host_url and the turn operations (snapshot, diff, rollback, fork). */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "box_private.h"
#include "cowbox/client.h"
#include "cowbox/error.h"

#define BOX_CHUNK  (1u << 20) /* bytes per read/write request */
#define BOX_WINDOW 4	      /* write requests in flight at once */

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
	    (rc = cb_box_direct_read(box, path, data, len)) <= 0)
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
	    (rc = cb_box_direct_write(box, path, data, len)) <= 0)
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

int cb_box_host_url(struct cb_box *box, int port, char **url)
{
	char what[64];
	json_t *reply = NULL;
	int rc;

	cb_box_set_code("");
	*url = NULL;
	snprintf(what, sizeof(what), "host_url %d", port);
	rc = cb_box_request(box, what, json_pack("{s:s,s:i}", "op", "host_url", "port", port),
			    &reply, NULL);
	if (!rc && !(*url = strdup(json_string_value(json_object_get(reply, "url")) ?: "")))
		rc = cb_error_set(ENOMEM, "out of memory");
	json_decref(reply);
	return cb_box_finish(rc);
}

int cb_box_snapshot(struct cb_box *box, const char *label, json_t **files)
{
	json_t *req = json_pack("{s:s,s:b}", "op", "snapshot", "files", files != NULL);
	json_t *reply = NULL;
	int rc;

	cb_box_set_code("");
	if (files)
		*files = NULL;
	if (req && label)
		json_object_set_new(req, "label", json_string(label));
	rc = cb_box_request(box, "snapshot", req, &reply, NULL);
	if (!rc) {
		rc = (int)json_integer_value(json_object_get(reply, "turn"));
		if (files) {
			*files = json_incref(json_object_get(reply, "files"));
			if (!*files)
				*files = json_object();
		}
	}
	json_decref(reply);
	return cb_box_finish(rc);
}

int cb_box_diff(struct cb_box *box, int from, int to, json_t **events)
{
	json_t *req = json_pack("{s:s,s:i}", "op", "diff", "a", from), *reply = NULL;
	char what[64];
	int rc;

	cb_box_set_code("");
	*events = NULL;
	if (req && to >= 0)
		json_object_set_new(req, "b", json_integer(to));
	snprintf(what, sizeof(what), to >= 0 ? "diff %d %d" : "diff %d", from, to);
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

int cb_box_rollback(struct cb_box *box, int turn)
{
	json_t *reply = NULL;
	char what[64];
	int rc;

	cb_box_set_code("");
	snprintf(what, sizeof(what), "rollback %d", turn);
	rc = cb_box_request(box, what, json_pack("{s:s,s:i}", "op", "rollback", "turn", turn),
			    &reply, NULL);
	if (!rc)
		rc = (int)json_integer_value(json_object_get(reply, "turn"));
	json_decref(reply);
	return cb_box_finish(rc);
}

int cb_box_fork(struct cb_box *box, int turn, const char *name, struct cb_box **out)
{
	json_t *req = json_pack("{s:s,s:i}", "op", "fork", "turn", turn), *reply = NULL;
	char what[64];
	int rc;

	cb_box_set_code("");
	*out = NULL;
	if (req && name)
		json_object_set_new(req, "name", json_string(name));
	snprintf(what, sizeof(what), "fork %d", turn);
	rc = cb_box_request(box, what, req, &reply, NULL);
	if (!rc)
		rc = cb_box_attach(json_string_value(json_object_get(reply, "ref")) ?: "", NULL,
				   out, NULL);
	json_decref(reply);
	return cb_box_finish(rc);
}

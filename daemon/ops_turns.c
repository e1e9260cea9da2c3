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
#include "cowbox/overlay.h"
#include "cowbox/turns.h"
#include "cowbox/workspace.h"
#include "api.h"
#include "daemon.h"

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

/* The turns of the workspace without its live tree: what prune, fork and turns read (the
 * base, the blobs and meta.db) needs no I/O through the mount. */
static double elapsed(const struct timespec *a, const struct timespec *b)
{
	return (double)(b->tv_sec - a->tv_sec) + (double)(b->tv_nsec - a->tv_nsec) / 1e9;
}

/* Record the open turn: sync, move the journal on to the next turn, then have the worker
 * hash what the rows of the closed turn name. Called with the turn lock held. req holds the
 * worker's snapshot request (label, what to return); it gets the turn and the rows. */
static int turns_snapshot(struct cb_daemon *d, json_t *req, struct cb_daemon_conn *conn, json_t *id,
			  json_t **result, long long *turn_out)
{
	long long open = cb_journal_turn(d->db), latest = cb_journal_turn(d->db) - 1;
	struct cb_turns *t = NULL;
	long long turn;
	int ret;

	ret = cb_daemon_turns_open(d, NULL, 0, &t);
	if (!ret)
		latest = cb_db_turns_latest(cb_turns_db(t));
	cb_turns_close(t);
	turn = open > latest ? open : latest + 1;
	if (!ret)
		ret = turns_sync(d);
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
	if (ret)
		cb_overlay_turn_advance(d->ov, turn);
	else
		*turn_out = turn;
	return ret;
}

/* Where the rows of a whole map (or of the changes since a client's turn) go: one object, or
 * frames of FILES_FRAME rows each when the client streams (it applies or writes them out as
 * they come, and the daemon never holds them all). A streamed whole map is written as JSON
 * text straight into one buffer per frame (no object per row: 100k rows of jansson cost
 * more than the rest of the snapshot). */
struct files_out {
	json_t *files;
	json_t *deleted;	     /* a delta: the paths that are no regular file any more */
	struct cb_daemon_conn *conn; /* streaming: frames go here */
	json_t *id;
	long long turn;
	size_t rows;
	char *text; /* the streamed whole map's frame being written */
	size_t len, cap;
	char *head;	    /* its opening: {"id":...,"stream":"files","turn":N,"files":{ */
	size_t frame_bytes; /* > 0: the client's budget per whole-map frame, not FILES_FRAME rows */
	/* map_form "columns": a frame's paths and hashes as two strings ("paths", joined by
	 * "//", which no path holds; "sha256", joined by spaces), which a client splits into a
	 * dict faster than its JSON reader builds one; the hashes gather here meanwhile. */
	int columns;
	/* map_form "raw": the same two columns as bytes after the frame's line (the paths as
	 * they are, joined by NUL; the hashes joined by spaces), which a client takes without
	 * its JSON reader scanning 8 MB of text; the paths gather in text. */
	int raw;
	char *hashes;
	size_t hlen, hcap;
};

/* The most a client may ask a whole-map frame to hold: its line buffer must take it. */
#define FRAME_BYTES_MAX (48u << 20)

#define FILES_FRAME 2048

static int text_grow(struct files_out *o, size_t more)
{
	return o->len + more <= o->cap
		   ? 0
		   : cb_grow(&o->text, &o->cap, o->len + more, 1, 256 * 1024, "snapshot");
}

/* Bytes from 0x80 on must be whole UTF-8 sequences (what a JSON reader accepts): the length
 * of the one at p, 0 if it is not one. */
static size_t utf8_seq(const unsigned char *p)
{
	unsigned c = p[0];
	size_t n = c >= 0xc2 && c <= 0xdf   ? 2
		   : c >= 0xe0 && c <= 0xef ? 3
		   : c >= 0xf0 && c <= 0xf4 ? 4
					    : 0;

	if (!n || (c == 0xe0 && p[1] < 0xa0) || (c == 0xed && p[1] > 0x9f) ||
	    (c == 0xf0 && p[1] < 0x90) || (c == 0xf4 && p[1] > 0x8f))
		return 0;
	for (size_t i = 1; i < n; i++)
		if ((p[i] & 0xc0) != 0x80)
			return 0;
	return n;
}

/* s inside a JSON string (no quotes around it): runs of plain bytes copied at once, '"',
 * '\\' and controls escaped. A name that is not UTF-8 cannot be sent (and is named, not
 * dropped). */
static int text_chars(struct files_out *o, const char *s)
{
	static const char hexd[] = "0123456789abcdef";
	const unsigned char *p = (const unsigned char *)s;
	size_t n = strlen(s);
	int ret = text_grow(o, 6 * n);

	if (ret)
		return ret;
	while (*p) {
		const unsigned char *run = p;

		while (*p >= 0x20 && *p < 0x80 && *p != '"' && *p != '\\')
			p++;
		memcpy(o->text + o->len, run, (size_t)(p - run));
		o->len += (size_t)(p - run);
		if (!*p)
			break;
		if (*p >= 0x80) {
			size_t k = utf8_seq(p);

			if (!k)
				return cb_error_set(EILSEQ, "snapshot: %s: the name is not UTF-8",
						    s);
			memcpy(o->text + o->len, p, k);
			o->len += k;
			p += k;
		} else if (*p == '"' || *p == '\\') {
			o->text[o->len++] = '\\';
			o->text[o->len++] = (char)*p++;
		} else {
			memcpy(o->text + o->len, "\\u00", 4);
			o->text[o->len + 4] = hexd[*p >> 4];
			o->text[o->len + 5] = hexd[*p & 15];
			o->len += 6;
			p++;
		}
	}
	return 0;
}

/* s as raw bytes: whole UTF-8 sequences only, as text_chars asks (the client decodes them as
 * UTF-8); no escape is needed, a path holds no NUL. */
static int raw_chars(struct files_out *o, const char *s)
{
	const unsigned char *p = (const unsigned char *)s;
	size_t n = strlen(s), k;
	int ret = text_grow(o, n);

	if (ret)
		return ret;
	for (; *p; p += k)
		if (!(k = *p < 0x80 ? 1 : utf8_seq(p)))
			return cb_error_set(EILSEQ, "snapshot: %s: the name is not UTF-8", s);
	memcpy(o->text + o->len, s, n);
	o->len += n;
	return 0;
}

/* s as a JSON string. */
static int text_string(struct files_out *o, const char *s)
{
	int ret = text_grow(o, 1);

	if (ret)
		return ret;
	o->text[o->len++] = '"';
	if ((ret = text_chars(o, s)) || (ret = text_grow(o, 1)))
		return ret;
	o->text[o->len++] = '"';
	return 0;
}

/* A raw frame: its line, announcing the bytes of the paths and of the hashes, then both. */
static int files_flush_raw(struct files_out *o)
{
	struct iovec part[3];
	char *line = NULL;
	int n, ret;

	if (!o->len)
		return 0;
	if ((n = asprintf(&line, "%s\"raw\":[%zu,%zu]}\n", o->head, o->len, o->hlen)) < 0)
		return cb_error_set(ENOMEM, "snapshot: out of memory");
	part[0] = (struct iovec){line, (size_t)n};
	part[1] = (struct iovec){o->text, o->len};
	part[2] = (struct iovec){o->hashes, o->hlen};
	ret = cb_daemon_send_parts(o->conn, part, 3);
	free(line);
	o->len = o->hlen = 0;
	return ret;
}

static int files_flush(struct files_out *o)
{
	json_t *frame;
	int ret;

	if (o->head && o->raw)
		return files_flush_raw(o);
	if (o->head && o->columns) {
		static const char mid[] = "\",\"sha256\":\"";

		if (!o->len)
			return 0;
		if ((ret = text_grow(o, sizeof(mid) - 1 + o->hlen + 3)))
			return ret;
		memcpy(o->text + o->len, mid, sizeof(mid) - 1);
		o->len += sizeof(mid) - 1;
		memcpy(o->text + o->len, o->hashes, o->hlen);
		o->len += o->hlen;
		memcpy(o->text + o->len, "\"}\n", 3);
		ret = cb_daemon_send_text(o->conn, o->text, o->len + 3);
		o->len = o->hlen = 0;
		return ret;
	}
	if (o->head) {
		if (!o->len)
			return 0;
		if ((ret = text_grow(o, 3)))
			return ret;
		memcpy(o->text + o->len, "}}\n", 3);
		ret = cb_daemon_send_text(o->conn, o->text, o->len + 3);
		o->len = 0;
		return ret;
	}
	if (!o->conn || !(json_object_size(o->files) || json_array_size(o->deleted)))
		return 0;
	if (o->deleted)
		frame = json_pack("{s:s, s:I, s:O, s:O}", "stream", "changes", "turn",
				  (json_int_t)o->turn, "changed", o->files, "deleted", o->deleted);
	else
		frame = json_pack("{s:s, s:I, s:O}", "stream", "files", "turn", (json_int_t)o->turn,
				  "files", o->files);
	if (!frame)
		return cb_error_set(ENOMEM, "snapshot: out of memory");
	cb_daemon_send_frame(o->conn, o->id, frame);
	json_object_clear(o->files);
	if (o->deleted)
		json_array_clear(o->deleted);
	return 0;
}

/* The next whole-map frame is due: FILES_FRAME rows, or the client's byte budget. */
static int files_due(struct files_out *o)
{
	o->rows++;
	if (o->frame_bytes)
		return o->len + o->hlen < o->frame_bytes ? 0 : files_flush(o);
	return o->rows % FILES_FRAME ? 0 : files_flush(o);
}

/* The start of a row in the frame's text: the frame's head before its first row, else sep
 * after the row before. */
static int frame_row(struct files_out *o, const char *sep)
{
	size_t head = strlen(o->head), n = o->len ? strlen(sep) : head;
	int ret = text_grow(o, n);

	if (!ret) {
		memcpy(o->text + o->len, o->len ? sep : o->head, n);
		o->len += n;
	}
	return ret;
}

/* A row of a streamed whole map: "path":"sha256", into the frame's text. */
static int files_text_add(struct files_out *o, const struct cb_entry *e)
{
	int ret = frame_row(o, ",");

	if (ret)
		return ret;
	if ((ret = text_string(o, e->path)) || (ret = text_grow(o, 2 * CB_SHA256_LEN + 4)))
		return ret;
	memcpy(o->text + o->len, ":\"", 2);
	cb_hex(e->sha256, CB_SHA256_LEN, o->text + o->len + 2);
	o->len += 2 + 2 * CB_SHA256_LEN;
	o->text[o->len++] = '"';
	return files_due(o);
}

/* A row of a streamed whole map in columns: the path onto "paths", its hash onto the
 * hashes. */
static int files_column_add(struct files_out *o, const struct cb_entry *e)
{
	int ret = 0;

	if (o->hlen + 2 * CB_SHA256_LEN + 1 > o->hcap)
		ret = cb_grow(&o->hashes, &o->hcap, o->hlen + 2 * CB_SHA256_LEN + 1, 1, 64 * 1024,
			      "snapshot");
	if (!ret && o->len)
		o->hashes[o->hlen++] = ' ';
	if (ret)
		return ret;
	if (o->raw) {
		if (o->len && !(ret = text_grow(o, 1)))
			o->text[o->len++] = '\0';
		ret = ret ? ret : raw_chars(o, e->path);
	} else if (!(ret = frame_row(o, "//"))) {
		ret = text_chars(o, e->path);
	}
	if (ret)
		return ret;
	cb_hex(e->sha256, CB_SHA256_LEN, o->hashes + o->hlen);
	o->hlen += 2 * CB_SHA256_LEN;
	return files_due(o);
}

static int files_add(const struct cb_entry *e, void *arg)
{
	struct files_out *o = arg;
	char hex[2 * CB_SHA256_LEN + 1];

	if (e->type != CB_ENTRY_FILE)
		return 0;
	if (o->head && o->columns)
		return files_column_add(o, e);
	if (o->head)
		return files_text_add(o, e);
	cb_hex(e->sha256, CB_SHA256_LEN, hex);
	if (json_object_set_new(o->files, e->path, json_string(hex)))
		return cb_error_set(ENOMEM, "snapshot: out of memory");
	return ++o->rows % FILES_FRAME ? 0 : files_flush(o);
}

/* The changes since a client's turn: changed (path: sha256) and deleted (paths), in frames of
 * FILES_FRAME rows when the client streams. */
static int changes_add(const char *path, const struct cb_entry *now, void *arg)
{
	struct files_out *o = arg;
	char hex[2 * CB_SHA256_LEN + 1];
	int rc;

	if (!now) {
		rc = json_array_append_new(o->deleted, json_string(path));
	} else {
		cb_hex(now->sha256, CB_SHA256_LEN, hex);
		rc = json_object_set_new(o->files, path, json_string(hex));
	}
	if (rc)
		return cb_error_set(ENOMEM, "snapshot: out of memory");
	return ++o->rows % FILES_FRAME ? 0 : files_flush(o);
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
	struct files_out o = {0};
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
		ret = cb_ws_map_changes(t, json_integer_value(jsince), changes_add, &o);
		if (ret != -ESTALE) {
			if (!ret)
				ret = files_flush(&o);
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
	ret = cb_ws_map_first(t, files_add, &o, pending, &id);
	if (!ret)
		ret = files_flush(&o);
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
		      answered, elapsed(&t0, &t1));
	cb_daemon_base_stats_log(t, "snapshot");
	cb_ws_map_first_free(p);
	cb_turns_close(t);
}

int cb_daemon_snapshot_labelled(struct cb_daemon *d, const char *label, long long *turn)
{
	json_t *r = NULL;
	int ret;

	pthread_mutex_lock(&d->turn_lock);
	ret = turns_snapshot(d,
			     json_pack("{s:s, s:b, s:b, s:b}", "label", label, "changes", 0,
				       "files", 0, "progress", 0),
			     NULL, NULL, &r, turn);
	cb_daemon_base_scan_drop(d); /* the worker built the first map, if it was due */
	pthread_mutex_unlock(&d->turn_lock);
	json_decref(r);
	return ret;
}

static int op_snapshot(struct cb_daemon *d, struct cb_daemon_conn *conn, json_t *req)
{
	int files = json_is_true(json_object_get(req, "files"));
	int progress = json_is_true(json_object_get(req, "progress"));
	/* With the map asked for, a first one is left to snapshot_files (answered from the walk
	 * of the base, written after the reply); not when progress is asked: the worker's build
	 * of the map reports it while hashing the base. */
	json_t *wreq =
	    json_pack("{s:O*, s:b, s:b, s:b, s:b}", "label", json_object_get(req, "label"),
		      "changes", json_is_true(json_object_get(req, "changes")), "files", 0,
		      "progress", progress, "defer_map", files && !progress);
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
		json_object_set_new(r, "seconds", json_real(elapsed(&t0, &t1)));
		ret = cb_daemon_reply(conn, json_object_get(req, "id"), r);
		r = NULL;
	}
	/* The rows are durable before the lock lets the next turn op in. */
	if (pending)
		snapshot_first_write(t, pending, elapsed(&t0, &t1));
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

static int op_rollback(struct cb_daemon *d, struct cb_daemon_conn *conn, json_t *req)
{
	json_t *jt = json_object_get(req, "turn");
	long long to = json_integer_value(jt), touched = 0, turn = 0;
	struct timespec t0, t1, t2;
	json_t *snap = NULL;
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
	clock_gettime(CLOCK_MONOTONIC, &t0);
	if (!ret)
		ret = cb_daemon_worker_call(
		    d,
		    json_pack("{s:s, s:I, s:o}", "op", "rollback", "turn", (json_int_t)to, "rows",
			      rows_json(0, cb_journal_turn(d->db), cb_journal_turn(d->db))),
		    NULL, NULL, NULL, &touched);
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
	return cb_daemon_reply(conn, json_object_get(req, "id"),
			       json_pack("{s:I, s:I, s:I, s:f, s:f}", "turn", (json_int_t)turn,
					 "rolled_back_to", (json_int_t)to, "restored",
					 (json_int_t)touched, "restore_seconds", elapsed(&t0, &t1),
					 "snapshot_seconds", elapsed(&t1, &t2)));
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
	struct cb_turns *t = NULL;
	int ret;

	if (!json_is_integer(jt))
		return cb_error_set(EINVAL, "fork: \"turn\" must be a turn number");
	pthread_mutex_lock(&d->turn_lock);
	ret = cb_daemon_turns_open(d, NULL, 0, &t);
	/* The fork compares the whole base with turn 0's: by the keys of both caches (the
	 * first map leaves the shared cache's rows there), not by rehashing what only it holds. */
	if (!ret)
		cb_daemon_basecache_attach(d->dir, t, d->base);
	if (!ret)
		ret = cb_ws_turn_check(t, json_integer_value(jt));
	/* Built where nothing sees it, published (renamed to its ref, then named) last: a fork
	 * killed midway is never listed and never mounts with part of its tree. */
	if (!ret)
		ret = cb_ws_create_unpublished(d->base, name, ref, &dir);
	if (!ret && (asprintf(&upper, "%s/upper", dir) < 0 ||
		     asprintf(&db, "%s/meta.db", dir) < 0 || asprintf(&blobs, "%s/blobs", dir) < 0))
		ret = cb_error_set(ENOMEM, "fork: out of memory");
	if (!ret)
		ret = cb_ws_fork(t, json_integer_value(jt), upper, db, blobs);
	/* The fork wrote its upper as root: its files get the new workspace's own id range
	 * now, as its mount would have stored them (no set-id file of a host owner). */
	if (!ret)
		ret = fork_ids(upper);
	cb_turns_close(t);
	if (!ret)
		ret = cb_ws_publish(ref, dir, name);
	else if (dir) {
		char saved[1024];

		snprintf(saved, sizeof(saved), "%s", cb_error_message());
		cb_ws_delete_unpublished(dir);
		cb_error_set(-ret, "%s", saved);
	}
	pthread_mutex_unlock(&d->turn_lock);
	free(dir);
	free(upper);
	free(db);
	free(blobs);
	if (ret)
		return ret;
	return cb_daemon_reply(conn, json_object_get(req, "id"),
			       json_pack("{s:s, s:s?}", "ref", ref, "name", name));
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
    {NULL, NULL},
};

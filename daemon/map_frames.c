/* The snapshot op's map on the wire: rows written as JSON text, columns or raw bytes straight
 * into one buffer per frame (no object per row), each frame sent in one locked stretch. */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "cowbox/error.h"
#include "cowbox/grow.h"
#include "daemon.h"
#include "map_frames.h"

#define FILES_FRAME 2048

static int text_grow(struct cb_daemon_map_out *o, size_t more)
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
static int text_chars(struct cb_daemon_map_out *o, const char *s)
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
static int raw_chars(struct cb_daemon_map_out *o, const char *s)
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
static int text_string(struct cb_daemon_map_out *o, const char *s)
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
static int files_flush_raw(struct cb_daemon_map_out *o)
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

int cb_daemon_map_flush(struct cb_daemon_map_out *o)
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
static int files_due(struct cb_daemon_map_out *o)
{
	o->rows++;
	if (o->frame_bytes)
		return o->len + o->hlen < o->frame_bytes ? 0 : cb_daemon_map_flush(o);
	return o->rows % FILES_FRAME ? 0 : cb_daemon_map_flush(o);
}

/* The start of a row in the frame's text: the frame's head before its first row, else sep
 * after the row before. */
static int frame_row(struct cb_daemon_map_out *o, const char *sep)
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
static int files_text_add(struct cb_daemon_map_out *o, const struct cb_entry *e)
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
static int files_column_add(struct cb_daemon_map_out *o, const struct cb_entry *e)
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

int cb_daemon_map_file(const struct cb_entry *e, void *arg)
{
	struct cb_daemon_map_out *o = arg;
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
	return ++o->rows % FILES_FRAME ? 0 : cb_daemon_map_flush(o);
}

/* The changes since a client's turn: changed (path: sha256) and deleted (paths), in frames of
 * FILES_FRAME rows when the client streams. */
int cb_daemon_map_change(const char *path, const struct cb_entry *now, void *arg)
{
	struct cb_daemon_map_out *o = arg;
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
	return ++o->rows % FILES_FRAME ? 0 : cb_daemon_map_flush(o);
}

/* The journal's mark log ("<db>-marks"): one self-checking record per mark, appended with one
 * write(2), read back whole to fold it into SQLite; a torn or corrupt tail ends the valid part. */
#include "config.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "db.h"

/* A record: magic, body length, FNV-1a 64 of the body, then the body: turn (i64), time (f64),
 * pid (i32), kind, subtree, path length (u32), comm length (u8), path, comm. Host byte order:
 * the log never leaves the machine that wrote it (it is folded at every unmount). A path may
 * be longer than PATH_MAX (a tree reached by relative paths); MARKLOG_PATH only bounds what a
 * damaged length field can make the reader believe. */
#define MARKLOG_MAGIC 0x324d4243u /* "CBM2" */
#define MARKLOG_HEAD  16
#define MARKLOG_FIXED 27
#define MARKLOG_PATH  (1u << 20)

static uint64_t marklog_hash(const unsigned char *p, size_t n)
{
	uint64_t h = 1469598103934665603ULL;

	for (size_t i = 0; i < n; i++)
		h = (h ^ p[i]) * 1099511628211ULL;
	return h;
}

/* See db.h. */
size_t cb_marklog_encode(const struct cb_change *c, long long turn, double time, char *buf,
			 size_t size)
{
	size_t plen = strlen(c->path), clen = c->comm ? strnlen(c->comm, 255) : 0;
	size_t body = MARKLOG_FIXED + plen + clen;
	unsigned char *b = (unsigned char *)buf + MARKLOG_HEAD;
	uint32_t magic = MARKLOG_MAGIC, len = (uint32_t)body;
	int64_t t = turn;
	int32_t pid = c->pid;
	uint32_t pl = (uint32_t)plen;
	uint64_t h;

	if (plen == 0 || plen > MARKLOG_PATH || MARKLOG_HEAD + body > size)
		return 0;
	memcpy(b, &t, 8);
	memcpy(b + 8, &time, 8);
	memcpy(b + 16, &pid, 4);
	b[20] = (unsigned char)c->kind;
	b[21] = c->subtree != 0;
	memcpy(b + 22, &pl, 4);
	b[26] = (unsigned char)clen;
	memcpy(b + MARKLOG_FIXED, c->path, plen);
	memcpy(b + MARKLOG_FIXED + plen, c->comm ? c->comm : "", clen);
	h = marklog_hash(b, body);
	memcpy(buf, &magic, 4);
	memcpy(buf + 4, &len, 4);
	memcpy(buf + 8, &h, 8);
	return MARKLOG_HEAD + body;
}

/* See db.h. */
size_t cb_marklog_max_record(void)
{
	return MARKLOG_HEAD + MARKLOG_FIXED + MARKLOG_PATH + 255;
}

/* See db.h. */
size_t cb_marklog_record_size(const struct cb_change *c)
{
	return MARKLOG_HEAD + MARKLOG_FIXED + strlen(c->path) +
	       (c->comm ? strnlen(c->comm, 255) : 0);
}

/* A body that passed its checksum must still say something the journal accepts: a record
 * whose fields are wrong is the end of the valid log, never a row. */
static int marklog_decode(const unsigned char *b, size_t body, char *path, char *comm,
			  struct cb_journal_row *row)
{
	int64_t t;
	int32_t pid;
	uint32_t pl;
	size_t cl;

	if (body < MARKLOG_FIXED)
		return -1;
	memcpy(&t, b, 8);
	memcpy(&row->time, b + 8, 8);
	memcpy(&pid, b + 16, 4);
	memcpy(&pl, b + 22, 4);
	cl = b[26];
	if (MARKLOG_FIXED + (size_t)pl + cl != body || pl == 0 || pl > MARKLOG_PATH || t < 1 ||
	    b[20] < CB_CHANGE_CREATE || b[20] > CB_CHANGE_RENAME_TO || b[21] > 1)
		return -1;
	memcpy(path, b + MARKLOG_FIXED, pl);
	path[pl] = '\0';
	memcpy(comm, b + MARKLOG_FIXED + pl, cl);
	comm[cl] = '\0';
	if (strlen(path) != pl || strlen(comm) != cl || path[0] == '/' || !strcmp(path, ".") ||
	    !strcmp(path, ".."))
		return -1;
	*row = (struct cb_journal_row){.turn = t,
				       .path = path,
				       .kind = (enum cb_change_kind)b[20],
				       .subtree = b[21],
				       .time = row->time,
				       .pid = pid,
				       .comm = cl ? comm : NULL};
	return 0;
}

/* See db.h. */
int cb_marklog_parse(const char *buf, size_t len, size_t *valid,
		     int (*fn)(const struct cb_journal_row *row, void *arg), void *arg)
{
	char *path = malloc(MARKLOG_PATH + 1), comm[256];
	size_t off = 0;
	int rc = 0;

	if (!path)
		return cb_error_set(ENOMEM, "journal log: out of memory");

	while (len - off >= MARKLOG_HEAD) {
		const unsigned char *p = (const unsigned char *)buf + off;
		struct cb_journal_row row = {0};
		uint32_t magic, body;
		uint64_t h;

		memcpy(&magic, p, 4);
		memcpy(&body, p + 4, 4);
		memcpy(&h, p + 8, 8);
		if (magic != MARKLOG_MAGIC || body > cb_marklog_max_record() ||
		    body > len - off - MARKLOG_HEAD || marklog_hash(p + MARKLOG_HEAD, body) != h ||
		    marklog_decode(p + MARKLOG_HEAD, body, path, comm, &row))
			break;
		off += MARKLOG_HEAD + body;
		if (fn && (rc = fn(&row, arg)))
			break;
	}
	*valid = off;
	free(path);
	return rc;
}

/* See db.h. */
int cb_marklog_read(int fd, const char *name, char **buf, size_t *len)
{
	struct stat st;
	size_t got = 0;
	char *b;

	*buf = NULL;
	*len = 0;
	if (fstat(fd, &st) < 0)
		return cb_error_set(errno, "journal log %s: %s", name, strerror(errno));
	if (st.st_size == 0)
		return 0;
	b = malloc((size_t)st.st_size);
	if (!b)
		return cb_error_set(ENOMEM, "journal log %s: out of memory", name);
	while (got < (size_t)st.st_size) {
		ssize_t n = pread(fd, b + got, (size_t)st.st_size - got, (off_t)got);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			int err = errno;

			free(b);
			return cb_error_set(err, "journal log %s: read: %s", name, strerror(err));
		}
		if (n == 0)
			break; /* shrank meanwhile (a fold by its owner): what was read is it */
		got += (size_t)n;
	}
	*buf = b;
	*len = got;
	return 0;
}

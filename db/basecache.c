/* The shared base hash cache: one SQLite file per base directory under $COWBOX_HOME/basecache,
 * used by every daemon serving a workspace over that base. The only SQL of that file. */
#include "config.h"

#include <errno.h>
#include <libgen.h>
#include <sqlite3.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

#include "cowbox/basecache.h"
#include "cowbox/error.h"
#include "cowbox/grow.h"

/* 'cbbc': a file with another application id is not ours, whatever its tables say. */
#define BC_APP_ID  0x63626263
#define BC_VERSION 1

static const char bc_schema_sql[] =
    "CREATE TABLE base_hash(path TEXT PRIMARY KEY, dev INTEGER, ino INTEGER, size INTEGER, "
    "  mtime_ns INTEGER, ctime_ns INTEGER, sha256 BLOB, xxh3 BLOB, row_sum INTEGER) "
    "  WITHOUT ROWID;"
    "PRAGMA application_id = 1667392099;" /* BC_APP_ID */
    "PRAGMA user_version = 1;";

/* Added to version 1 files by any handle that may write (older binaries ignore it). rows and
 * sum come before data: reading them does not walk the blob's overflow pages. */
static const char bc_pack_schema_sql[] =
    "CREATE TABLE IF NOT EXISTS base_pack(id INTEGER PRIMARY KEY CHECK(id = 1), rows INTEGER, "
    "  sum INTEGER, data BLOB);";

enum { BQ_GET, BQ_PUT, BQ_LIST, BQ_LIST_FROM, BQ_LIST_UNTIL, BQ_LIST_RANGE, BQ_COUNT };

#define BQ_LIST_SQL                                                                                \
	"SELECT path, dev, ino, size, mtime_ns, ctime_ns, sha256, xxh3, row_sum FROM base_hash "

static const char *const bc_sql[BQ_COUNT] = {
    [BQ_GET] = "SELECT dev, ino, size, mtime_ns, ctime_ns, sha256, xxh3, row_sum FROM "
	       "base_hash WHERE path=?1",
    [BQ_PUT] = "INSERT OR REPLACE INTO base_hash VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9)",
    /* the primary key's order, which is strcmp's: no sort; a range is a seek in it */
    [BQ_LIST] = BQ_LIST_SQL "ORDER BY path",
    [BQ_LIST_FROM] = BQ_LIST_SQL "WHERE path >= ?1 ORDER BY path",
    [BQ_LIST_UNTIL] = BQ_LIST_SQL "WHERE path < ?2 ORDER BY path",
    [BQ_LIST_RANGE] = BQ_LIST_SQL "WHERE path >= ?1 AND path < ?2 ORDER BY path",
};

struct cb_db_basecache {
	sqlite3 *db;
	sqlite3_stmt *q[BQ_COUNT];
	char *path;
};

void cb_basecache_key_of(const struct stat *st, struct cb_basecache_key *k)
{
	k->dev = (long long)st->st_dev;
	k->ino = (long long)st->st_ino;
	k->size = (long long)st->st_size;
	k->mtime_ns = (long long)st->st_mtim.tv_sec * 1000000000LL + st->st_mtim.tv_nsec;
	k->ctime_ns = (long long)st->st_ctim.tv_sec * 1000000000LL + st->st_ctim.tv_nsec;
}

static int bc_fail(struct cb_db_basecache *c, const char *what)
{
	int code = sqlite3_errcode(c->db) & 0xff;
	int err = code == SQLITE_BUSY || code == SQLITE_LOCKED	    ? EBUSY
		  : code == SQLITE_NOMEM			    ? ENOMEM
		  : code == SQLITE_FULL				    ? ENOSPC
		  : code == SQLITE_READONLY			    ? EROFS
		  : code == SQLITE_CORRUPT || code == SQLITE_NOTADB ? EUCLEAN
								    : EIO;

	return cb_error_set(err, "shared base cache %s: %s: %s", c->path, what,
			    sqlite3_errmsg(c->db));
}

/* The row's checksum: a row whose bytes changed on disk (a flipped bit in a hash) no longer
 * matches it and is a miss, not a wrong hash. */
static long long bc_row_sum(const char *path, const struct cb_basecache_key *k,
			    const unsigned char *sha256, const unsigned char *xxh3)
{
	long long v[5] = {k->dev, k->ino, k->size, k->mtime_ns, k->ctime_ns};
	XXH64_hash_t h = XXH3_64bits(path, strlen(path) + 1);

	/* chained through the seed: no streaming state, which libxxhash keeps opaque */
	h = XXH3_64bits_withSeed(v, sizeof(v), h);
	h = XXH3_64bits_withSeed(sha256, CB_SHA256_LEN, h);
	h = XXH3_64bits_withSeed(xxh3, CB_XXH128_LEN, h);
	return (long long)h;
}

static long long bc_pragma(sqlite3 *db, const char *sql)
{
	sqlite3_stmt *s = NULL;
	long long v = -1;

	if (sqlite3_prepare_v2(db, sql, -1, &s, NULL) == SQLITE_OK && sqlite3_step(s) == SQLITE_ROW)
		v = sqlite3_column_int64(s, 0);
	sqlite3_finalize(s);
	return v;
}

/* An empty file gets the schema (create) or is refused; anything else must be exactly ours.
 * Creating is done under the write lock, so two daemons opening a new cache at once create it
 * once; a reader only reads. */
static int bc_schema(struct cb_db_basecache *c, int create)
{
	long long app, version, tables;
	int ret = 0;

	if (sqlite3_exec(c->db, create ? "BEGIN IMMEDIATE" : "BEGIN", NULL, NULL, NULL) !=
	    SQLITE_OK)
		return bc_fail(c, "lock");
	app = bc_pragma(c->db, "PRAGMA application_id");
	version = bc_pragma(c->db, "PRAGMA user_version");
	tables = bc_pragma(c->db, "SELECT count(*) FROM sqlite_master");
	if (app < 0 || version < 0 || tables < 0)
		ret = bc_fail(c, "read its schema");
	else if (create && app == 0 && version == 0 && tables == 0) {
		if (sqlite3_exec(c->db, bc_schema_sql, NULL, NULL, NULL) != SQLITE_OK)
			ret = bc_fail(c, "create");
	} else if (app != BC_APP_ID || version != BC_VERSION ||
		   bc_pragma(c->db, "SELECT count(*) FROM sqlite_master WHERE type='table' AND "
				    "name='base_hash'") != 1)
		ret = cb_error_set(EPROTO,
				   "shared base cache %s: not a cache of this version (application "
				   "id %llx, version %lld); it is not used, and may be deleted",
				   c->path, (unsigned long long)app, version);
	if (!ret && create &&
	    sqlite3_exec(c->db, bc_pack_schema_sql, NULL, NULL, NULL) != SQLITE_OK)
		ret = bc_fail(c, "create");
	if (!ret && sqlite3_exec(c->db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK)
		ret = bc_fail(c, "create");
	if (ret)
		sqlite3_exec(c->db, "ROLLBACK", NULL, NULL, NULL);
	return ret;
}

/* A handle on the cache at path; create: the file, its directory and its schema if missing
 * (a reader's file must be there, with the schema). */
static int bc_open(const char *path, int create, struct cb_db_basecache **out)
{
	struct cb_db_basecache *c = calloc(1, sizeof(*c));
	char *dir = NULL;
	int ret = 0;

	*out = NULL;
	if (!c || !(c->path = strdup(path)) || !(dir = strdup(path))) {
		ret = cb_error_set(ENOMEM, "shared base cache %s: out of memory", path);
		goto out;
	}
	if (create && mkdir(dirname(dir), 0700) < 0 && errno != EEXIST) {
		ret = cb_error_set(errno, "shared base cache %s: %s", path, strerror(errno));
		goto out;
	}
	/* No per-call mutex: a handle is used by one thread at a time (its workspace's). */
	if (sqlite3_open_v2(path, &c->db,
			    SQLITE_OPEN_READWRITE | (create ? SQLITE_OPEN_CREATE : 0) |
				SQLITE_OPEN_NOMUTEX,
			    NULL) != SQLITE_OK) {
		ret = c->db ? bc_fail(c, "open")
			    : cb_error_set(ENOMEM, "shared base cache %s: out of memory", path);
		goto out;
	}
	sqlite3_busy_timeout(c->db, 10000);
	/* Losing the last commits to a power cut costs a rehash, never a wrong row: NORMAL. */
	if (sqlite3_exec(c->db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;", NULL, NULL,
			 NULL) != SQLITE_OK) {
		ret = bc_fail(c, "open");
		goto out;
	}
	if ((ret = bc_schema(c, create)))
		goto out;
	for (int i = 0; i < BQ_COUNT; i++)
		if (sqlite3_prepare_v3(c->db, bc_sql[i], -1, SQLITE_PREPARE_PERSISTENT, &c->q[i],
				       NULL) != SQLITE_OK) {
			ret = bc_fail(c, "prepare");
			goto out;
		}
	*out = c;
out:
	free(dir);
	if (ret)
		cb_db_basecache_close(c);
	return ret;
}

int cb_db_basecache_open(const char *path, struct cb_db_basecache **out)
{
	return bc_open(path, 1, out);
}

int cb_db_basecache_open_reader(const struct cb_db_basecache *c, struct cb_db_basecache **out)
{
	return bc_open(c->path, 0, out);
}

void cb_db_basecache_close(struct cb_db_basecache *c)
{
	if (!c)
		return;
	if (c->db && !sqlite3_get_autocommit(c->db))
		sqlite3_exec(c->db, "ROLLBACK", NULL, NULL, NULL);
	for (int i = 0; i < BQ_COUNT; i++)
		sqlite3_finalize(c->q[i]);
	sqlite3_close(c->db);
	free(c->path);
	free(c);
}

int cb_db_basecache_get(struct cb_db_basecache *c, const char *path,
			const struct cb_basecache_key *key, unsigned char *sha256,
			unsigned char *xxh3)
{
	sqlite3_stmt *s = c->q[BQ_GET];
	struct cb_basecache_key k;
	int ret = 0, rc;

	/* Lookups share one read transaction (no lock taken and dropped per row), until the
	 * next write or the close. */
	if (sqlite3_get_autocommit(c->db) &&
	    sqlite3_exec(c->db, "BEGIN DEFERRED", NULL, NULL, NULL) != SQLITE_OK)
		return bc_fail(c, "begin a read");
	sqlite3_reset(s);
	sqlite3_bind_text(s, 1, path, -1, SQLITE_STATIC);
	rc = sqlite3_step(s);
	if (rc == SQLITE_ROW) {
		k.dev = sqlite3_column_int64(s, 0);
		k.ino = sqlite3_column_int64(s, 1);
		k.size = sqlite3_column_int64(s, 2);
		k.mtime_ns = sqlite3_column_int64(s, 3);
		k.ctime_ns = sqlite3_column_int64(s, 4);
		if (!memcmp(&k, key, sizeof(k)) && sqlite3_column_bytes(s, 5) == CB_SHA256_LEN &&
		    sqlite3_column_bytes(s, 6) == CB_XXH128_LEN &&
		    sqlite3_column_type(s, 7) == SQLITE_INTEGER) {
			memcpy(sha256, sqlite3_column_blob(s, 5), CB_SHA256_LEN);
			memcpy(xxh3, sqlite3_column_blob(s, 6), CB_XXH128_LEN);
			ret = sqlite3_column_int64(s, 7) == bc_row_sum(path, key, sha256, xxh3);
		}
	} else if (rc != SQLITE_DONE) {
		ret = bc_fail(c, "lookup");
	}
	sqlite3_reset(s);
	return ret;
}

int cb_db_basecache_list_range(struct cb_db_basecache *c, const char *from, const char *until,
			       int (*fn)(const struct cb_db_basecache_row *row, void *arg),
			       void *arg)
{
	sqlite3_stmt *s =
	    c->q[from ? (until ? BQ_LIST_RANGE : BQ_LIST_FROM) : (until ? BQ_LIST_UNTIL : BQ_LIST)];
	struct cb_db_basecache_row r;
	int ret = 0, rc;

	/* One statement: its own read, ended by the reset (no lock held after). */
	sqlite3_reset(s);
	if (from)
		sqlite3_bind_text(s, 1, from, -1, SQLITE_STATIC);
	if (until)
		sqlite3_bind_text(s, 2, until, -1, SQLITE_STATIC);
	while (!ret && (rc = sqlite3_step(s)) == SQLITE_ROW) {
		r.path = (const char *)sqlite3_column_text(s, 0);
		r.key.dev = sqlite3_column_int64(s, 1);
		r.key.ino = sqlite3_column_int64(s, 2);
		r.key.size = sqlite3_column_int64(s, 3);
		r.key.mtime_ns = sqlite3_column_int64(s, 4);
		r.key.ctime_ns = sqlite3_column_int64(s, 5);
		/* A damaged row is left out, as a lookup would miss it. */
		if (!r.path || sqlite3_column_bytes(s, 6) != CB_SHA256_LEN ||
		    sqlite3_column_bytes(s, 7) != CB_XXH128_LEN ||
		    sqlite3_column_type(s, 8) != SQLITE_INTEGER)
			continue;
		memcpy(r.sha256, sqlite3_column_blob(s, 6), CB_SHA256_LEN);
		memcpy(r.xxh3, sqlite3_column_blob(s, 7), CB_XXH128_LEN);
		if (sqlite3_column_int64(s, 8) == bc_row_sum(r.path, &r.key, r.sha256, r.xxh3))
			ret = fn(&r, arg);
	}
	if (!ret && rc != SQLITE_DONE)
		ret = bc_fail(c, "list");
	sqlite3_reset(s);
	sqlite3_clear_bindings(s);
	return ret;
}

int cb_db_basecache_list(struct cb_db_basecache *c,
			 int (*fn)(const struct cb_db_basecache_row *row, void *arg), void *arg)
{
	return cb_db_basecache_list_range(c, NULL, NULL, fn, arg);
}

int cb_db_basecache_put(struct cb_db_basecache *c, const char *path,
			const struct cb_basecache_key *key, const unsigned char *sha256,
			const unsigned char *xxh3)
{
	sqlite3_stmt *s = c->q[BQ_PUT];
	int ret = 0;

	sqlite3_reset(s);
	sqlite3_bind_text(s, 1, path, -1, SQLITE_STATIC);
	sqlite3_bind_int64(s, 2, key->dev);
	sqlite3_bind_int64(s, 3, key->ino);
	sqlite3_bind_int64(s, 4, key->size);
	sqlite3_bind_int64(s, 5, key->mtime_ns);
	sqlite3_bind_int64(s, 6, key->ctime_ns);
	sqlite3_bind_blob(s, 7, sha256, CB_SHA256_LEN, SQLITE_STATIC);
	sqlite3_bind_blob(s, 8, xxh3, CB_XXH128_LEN, SQLITE_STATIC);
	sqlite3_bind_int64(s, 9, bc_row_sum(path, key, sha256, xxh3));
	if (sqlite3_step(s) != SQLITE_DONE)
		ret = bc_fail(c, "store");
	sqlite3_reset(s);
	return ret;
}

int cb_db_basecache_begin(struct cb_db_basecache *c)
{
	if (!sqlite3_get_autocommit(c->db))
		sqlite3_exec(c->db, "COMMIT", NULL, NULL, NULL); /* the lookups' read */
	return sqlite3_exec(c->db, "BEGIN IMMEDIATE", NULL, NULL, NULL) == SQLITE_OK
		   ? 0
		   : bc_fail(c, "begin");
}

int cb_db_basecache_commit(struct cb_db_basecache *c)
{
	int ret = 0;

	if (sqlite3_exec(c->db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK) {
		ret = bc_fail(c, "commit");
		sqlite3_exec(c->db, "ROLLBACK", NULL, NULL, NULL);
	}
	return ret;
}

/* ---- the pack: every row of one whole base in one blob ----
 * A first map over a base another workspace hashed needs all of its rows; read one by one
 * (~400 ns each in SQLite) they cost more than the walk that checks them. The pack is one
 * row: a header ("cbpk", version 1, the row count) and each row as a u16 path length, the
 * path, the five key fields and both hashes, in path order; its xxh3 is kept beside it. A
 * pack is a copy of rows, checked as they are (the caller compares each key with the file's
 * stat): a stale or damaged pack costs lookups, never a wrong hash. */

#define PACK_MAGIC    0x6b706263u /* "cbpk" */
#define PACK_VERSION  1u
#define PACK_HEAD     16
#define PACK_FIXED    (2 + 5 * 8 + CB_SHA256_LEN + CB_XXH128_LEN) /* a row without its path */
#define PACK_PATH_MAX 4096

struct cb_basecache_pack {
	unsigned char *data;
	size_t len, cap;
	unsigned long long rows;
};

int cb_basecache_pack_new(struct cb_basecache_pack **out)
{
	struct cb_basecache_pack *p = calloc(1, sizeof(*p));
	unsigned int head[2] = {PACK_MAGIC, PACK_VERSION};

	*out = NULL;
	if (!p || cb_grow(&p->data, &p->cap, PACK_HEAD, 1, 1 << 20, "shared base cache pack")) {
		free(p);
		return cb_error_set(ENOMEM, "shared base cache pack: out of memory");
	}
	memcpy(p->data, head, sizeof(head));
	p->len = PACK_HEAD;
	*out = p;
	return 0;
}

int cb_basecache_pack_add(struct cb_basecache_pack *p, const char *path,
			  const struct cb_basecache_key *key, const unsigned char *sha256,
			  const unsigned char *xxh3)
{
	size_t plen = strlen(path);
	long long v[5] = {key->dev, key->ino, key->size, key->mtime_ns, key->ctime_ns};
	unsigned short l = (unsigned short)plen;
	unsigned char *at;

	if (plen == 0 || plen >= PACK_PATH_MAX)
		return cb_error_set(ENAMETOOLONG, "shared base cache pack: %s: path too long",
				    path);
	if (cb_grow(&p->data, &p->cap, p->len + PACK_FIXED + plen, 1, 1 << 20,
		    "shared base cache pack"))
		return -ENOMEM;
	at = p->data + p->len;
	memcpy(at, &l, 2);
	memcpy(at + 2, path, plen);
	memcpy(at + 2 + plen, v, sizeof(v));
	memcpy(at + 2 + plen + sizeof(v), sha256, CB_SHA256_LEN);
	memcpy(at + 2 + plen + sizeof(v) + CB_SHA256_LEN, xxh3, CB_XXH128_LEN);
	p->len += PACK_FIXED + plen;
	p->rows++;
	return 0;
}

void cb_basecache_pack_free(struct cb_basecache_pack *p)
{
	if (!p)
		return;
	free(p->data);
	free(p);
}

/* A statement on base_pack, prepared at first use: a reader's handle on a file that has no
 * pack table yet has no pack. NULL when it cannot be prepared. */
static sqlite3_stmt *bc_pack_stmt(struct cb_db_basecache *c, const char *sql)
{
	sqlite3_stmt *s = NULL;

	if (sqlite3_prepare_v2(c->db, sql, -1, &s, NULL) != SQLITE_OK) {
		sqlite3_finalize(s);
		return NULL;
	}
	return s;
}

int cb_db_basecache_pack_store(struct cb_db_basecache *c, struct cb_basecache_pack *p)
{
	long long sum;
	sqlite3_stmt *s = NULL;
	int ret = 0;

	memcpy(p->data + 8, &p->rows, sizeof(p->rows));
	sum = (long long)XXH3_64bits(p->data, p->len);
	/* The same pack is there already, intact (another pass over the unchanged base): no
	 * write. Its bytes are hashed again, not only its checksum column compared: a pack
	 * damaged on disk is written anew. */
	if ((s = bc_pack_stmt(c, "SELECT data FROM base_pack WHERE id = 1 AND rows = ?1 AND "
				 "sum = ?2"))) {
		sqlite3_bind_int64(s, 1, (long long)p->rows);
		sqlite3_bind_int64(s, 2, sum);
		ret = sqlite3_step(s) == SQLITE_ROW &&
		      (size_t)sqlite3_column_bytes(s, 0) == p->len &&
		      (long long)XXH3_64bits(sqlite3_column_blob(s, 0), p->len) == sum;
		sqlite3_finalize(s);
		if (ret)
			return 0;
	}
	if (!(s = bc_pack_stmt(c, "INSERT OR REPLACE INTO base_pack VALUES(1, ?1, ?2, ?3)")))
		return bc_fail(c, "store the pack");
	sqlite3_bind_int64(s, 1, (long long)p->rows);
	sqlite3_bind_int64(s, 2, sum);
	sqlite3_bind_blob64(s, 3, p->data, p->len, SQLITE_STATIC);
	if (!(ret = cb_db_basecache_begin(c))) {
		if (sqlite3_step(s) != SQLITE_DONE)
			ret = bc_fail(c, "store the pack");
		else
			ret = cb_db_basecache_commit(c);
		if (ret)
			sqlite3_exec(c->db, "ROLLBACK", NULL, NULL, NULL);
	}
	sqlite3_finalize(s);
	return ret;
}

/* Call fn for each row of the pack data[0..len), which holds rows rows: 1 when every row
 * was read, 0 when the bytes are not a whole pack (fn may have had some rows: each stands on
 * its own), or fn's negative return. */
static int bc_pack_read(const unsigned char *data, size_t len, unsigned long long rows,
			int (*fn)(const struct cb_db_basecache_row *row, void *arg), void *arg)
{
	struct cb_db_basecache_row r;
	unsigned int head[2];
	unsigned long long n;
	char path[PACK_PATH_MAX];
	size_t at = PACK_HEAD;
	int ret;

	if (len < PACK_HEAD)
		return 0;
	memcpy(head, data, sizeof(head));
	memcpy(&n, data + 8, sizeof(n));
	if (head[0] != PACK_MAGIC || head[1] != PACK_VERSION || n != rows)
		return 0;
	for (unsigned long long i = 0; i < n; i++) {
		unsigned short l;
		long long v[5];

		if (len - at < PACK_FIXED)
			return 0;
		memcpy(&l, data + at, 2);
		if (!l || l >= PACK_PATH_MAX || len - at < PACK_FIXED + (size_t)l)
			return 0;
		memcpy(path, data + at + 2, l);
		path[l] = '\0';
		at += 2 + l;
		memcpy(v, data + at, sizeof(v));
		r.path = path;
		r.key = (struct cb_basecache_key){v[0], v[1], v[2], v[3], v[4]};
		memcpy(r.sha256, data + at + sizeof(v), CB_SHA256_LEN);
		memcpy(r.xxh3, data + at + sizeof(v) + CB_SHA256_LEN, CB_XXH128_LEN);
		at += sizeof(v) + CB_SHA256_LEN + CB_XXH128_LEN;
		if ((ret = fn(&r, arg)) < 0)
			return ret;
	}
	return at == len;
}

int cb_db_basecache_pack_list(struct cb_db_basecache *c,
			      int (*fn)(const struct cb_db_basecache_row *row, void *arg),
			      void *arg)
{
	sqlite3_stmt *s = bc_pack_stmt(c, "SELECT rows, sum, data FROM base_pack WHERE id = 1");
	int ret = 0, rc;

	if (!s)
		return 0; /* no pack table: no pack */
	/* One statement: its own read; the blob stays valid until the finalize. */
	rc = sqlite3_step(s);
	if (rc == SQLITE_ROW && sqlite3_column_type(s, 2) == SQLITE_BLOB) {
		const unsigned char *data = sqlite3_column_blob(s, 2);
		size_t len = (size_t)sqlite3_column_bytes(s, 2);

		if (data && (long long)XXH3_64bits(data, len) == sqlite3_column_int64(s, 1))
			ret = bc_pack_read(data, len,
					   (unsigned long long)sqlite3_column_int64(s, 0), fn, arg);
	} else if (rc != SQLITE_ROW && rc != SQLITE_DONE) {
		ret = bc_fail(c, "read the pack");
	}
	sqlite3_finalize(s);
	return ret;
}

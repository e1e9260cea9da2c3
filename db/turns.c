/* The turn store: recorded turns, their deltas, the materialized map of the latest turn and
 * the base hash cache, in meta.db over a connection of its own (its whole-table walks are in
 * db/turns_walk.c, its scratch tables in db/turn_scratch.c). */
#include "config.h"

#include <errno.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "cowbox/turn_store.h"
#include "db.h"

/* Deltas are keyed (path, turn) so "newest row of path at or before turn" is one index seek;
 * the (turn, path) index makes "what changed in (a, b]" cost what changed. */
const char cb_db_turns_schema_sql[] =
    "CREATE TABLE IF NOT EXISTS base_cache(path TEXT PRIMARY KEY, size INTEGER, "
    "  mtime_ns INTEGER, ino INTEGER, sha256 BLOB, xxh3 BLOB) WITHOUT ROWID;"
    "CREATE TABLE IF NOT EXISTS turns(turn INTEGER PRIMARY KEY, time REAL, label TEXT, "
    "  changes INTEGER);"
    "CREATE TABLE IF NOT EXISTS turn_delta(path TEXT NOT NULL, turn INTEGER NOT NULL, "
    "  type INTEGER, mode INTEGER, size INTEGER, sha256 BLOB, xxh3 BLOB, target TEXT, "
    "  pid INTEGER, comm TEXT, PRIMARY KEY(path, turn)) WITHOUT ROWID;"
    "CREATE INDEX IF NOT EXISTS turn_delta_by_turn ON turn_delta(turn, path);"
    "CREATE INDEX IF NOT EXISTS turn_delta_by_xxh3 ON turn_delta(xxh3);"
    "CREATE TABLE IF NOT EXISTS turn_map(path TEXT PRIMARY KEY, type INTEGER, mode INTEGER, "
    "  size INTEGER, sha256 BLOB, xxh3 BLOB, target TEXT, pid INTEGER, comm TEXT) WITHOUT ROWID;"
    "CREATE TABLE IF NOT EXISTS turn_meta(key TEXT PRIMARY KEY, value INTEGER);"
    "CREATE TABLE IF NOT EXISTS base_map(path TEXT PRIMARY KEY, type INTEGER, mode INTEGER, "
    "  size INTEGER, sha256 BLOB, xxh3 BLOB, target TEXT, pid INTEGER, comm TEXT) WITHOUT ROWID;";

enum {
	Q_CACHE_GET,
	Q_CACHE_PUT,
	Q_TURN_ADD,
	Q_TURN_LATEST,
	Q_TURN_OLDEST,
	Q_TURN_EXISTS,
	Q_TURN_LIST,
	Q_DELTA_PUT,
	Q_DELTA_AT,
	Q_DELTA_PATHS,
	Q_MAP_TURN,
	Q_MAP_SET_TURN,
	Q_MAP_GET,
	Q_MAP_PUT,
	Q_MAP_DEL,
	Q_MAP_CLEAR,
	Q_MAP_ALL,
	Q_MAP_UNDER,
	Q_MAP_LINK,
	Q_MAP_INO,
	Q_LINK_PATHS,
	Q_BLOB_NEEDED,
	Q_BASE_GET,
	Q_BASE_PUT,
	Q_BASE_BUILT,
	Q_BASE_SET_BUILT,
	Q_COUNT,
	Q_META_TURN = Q_COUNT, /* only when meta.db has the journal's meta table */
	Q_ALL
};

static const char *const tdb_sql[Q_COUNT] = {
    [Q_CACHE_GET] = "SELECT sha256, xxh3 FROM base_cache WHERE path=?1 AND size=?2 AND "
		    "mtime_ns=?3 AND ino=?4 AND ctime_ns=?5",
    [Q_CACHE_PUT] = "INSERT OR REPLACE INTO base_cache(path, size, mtime_ns, ino, sha256, xxh3, "
		    "ctime_ns) VALUES(?1,?2,?3,?4,?5,?6,?7)",
    [Q_TURN_ADD] = "INSERT OR REPLACE INTO turns VALUES(?1,?2,?3,?4)",
    [Q_TURN_LATEST] = "SELECT coalesce(max(turn),0) FROM turns",
    [Q_TURN_OLDEST] = "SELECT coalesce(min(turn),0) FROM turns",
    [Q_TURN_EXISTS] = "SELECT 1 FROM turns WHERE turn=?1",
    [Q_TURN_LIST] = "SELECT turn, time, label, changes FROM turns ORDER BY turn",
    [Q_DELTA_PUT] = "INSERT OR REPLACE INTO turn_delta(path, turn, type, mode, size, sha256, "
		    "xxh3, target, pid, comm, mtime_ns, uid, gid, xattrs, link, ino) "
		    "VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16)",
    [Q_DELTA_AT] = "SELECT path, type, mode, size, sha256, xxh3, target, pid, comm, mtime_ns, uid, "
		   "gid, xattrs, link, ino "
		   "FROM turn_delta WHERE path=?1 AND turn<=?2 ORDER BY turn DESC LIMIT 1",
    [Q_DELTA_PATHS] = "SELECT DISTINCT path FROM turn_delta WHERE turn>?1 AND turn<=?2 "
		      "ORDER BY path",
    [Q_MAP_TURN] = "SELECT value FROM turn_meta WHERE key='map_turn'",
    [Q_MAP_SET_TURN] = "INSERT OR REPLACE INTO turn_meta VALUES('map_turn', ?1)",
    [Q_MAP_GET] = "SELECT path, type, mode, size, sha256, xxh3, target, pid, comm, mtime_ns, uid, "
		  "gid, xattrs, link, ino "
		  "FROM turn_map WHERE path=?1",
    [Q_MAP_PUT] =
	"INSERT OR REPLACE INTO turn_map(path, type, mode, size, sha256, xxh3, "
	"target, pid, comm, mtime_ns, uid, gid, xattrs, link, ino) VALUES(?1,?2,?3,?4,?5,?6,?7,?8,"
	"?9,?10,?11,?12,?13,?14,?15)",
    [Q_MAP_DEL] = "DELETE FROM turn_map WHERE path=?1",
    [Q_MAP_CLEAR] = "DELETE FROM turn_map",
    [Q_MAP_ALL] = "SELECT path, type, mode, size, sha256, xxh3, target, pid, comm, mtime_ns, uid, "
		  "gid, xattrs, link, ino "
		  "FROM turn_map ORDER BY path",
    /* '/' + 1 == '0': the byte range of every path below prefix/ */
    [Q_MAP_UNDER] = "SELECT path, type, mode, size, sha256, xxh3, target, pid, comm, mtime_ns, "
		    "uid, gid, xattrs, link, ino "
		    "FROM turn_map WHERE path>?1||'/' AND path<?1||'0' ORDER BY path",
    [Q_MAP_LINK] = "SELECT path, type, mode, size, sha256, xxh3, target, pid, comm, mtime_ns, "
		   "uid, gid, xattrs, link, ino FROM turn_map WHERE link=?1 ORDER BY path",
    [Q_MAP_INO] = "SELECT path, type, mode, size, sha256, xxh3, target, pid, comm, mtime_ns, "
		  "uid, gid, xattrs, link, ino FROM turn_map WHERE ino=?1 ORDER BY path",
    [Q_LINK_PATHS] = "SELECT DISTINCT path FROM turn_delta WHERE link=?1 AND turn<=?2 "
		     "ORDER BY path",
    [Q_BLOB_NEEDED] = "SELECT 1 FROM turn_delta WHERE xxh3=?1 AND type=1 LIMIT 1",
    [Q_BASE_GET] = "SELECT path, type, mode, size, sha256, xxh3, target, pid, comm, mtime_ns, uid, "
		   "gid, xattrs, link, ino "
		   "FROM base_map WHERE path=?1",
    /* a base entry's time is the base file's own: none is recorded */
    [Q_BASE_PUT] = "INSERT OR REPLACE INTO base_map(path, type, mode, size, sha256, xxh3, "
		   "target, pid, comm) VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9)",
    [Q_BASE_BUILT] = "SELECT value FROM turn_meta WHERE key='base_map'",
    [Q_BASE_SET_BUILT] = "INSERT OR REPLACE INTO turn_meta VALUES('base_map', 1)",
};

static const char tdb_meta_turn_sql[] = "UPDATE meta SET value=?1 WHERE key='turn'";

struct cb_db_turns {
	sqlite3 *db;
	sqlite3_stmt *q[Q_ALL];
};

/* See db.h. */
int cb_db_turns_fail(struct cb_db_turns *t, const char *what)
{
	int code = sqlite3_errcode(t->db);
	int err = code == SQLITE_BUSY || code == SQLITE_LOCKED ? EBUSY
		  : code == SQLITE_NOMEM		       ? ENOMEM
		  : code == SQLITE_FULL			       ? ENOSPC
		  : code == SQLITE_READONLY		       ? EROFS
							       : EIO;
	char hint[4400];

	cb_db_damage_hint(sqlite3_db_filename(t->db, "main"), code, hint, sizeof(hint));
	return cb_error_set(err, "turn store: %s: %s%s", what, sqlite3_errmsg(t->db), hint);
}

/* A prepared statement, reset and cleared for a new use. */
static sqlite3_stmt *tdb_q(struct cb_db_turns *t, int which)
{
	sqlite3_stmt *s = t->q[which];

	sqlite3_reset(s);
	sqlite3_clear_bindings(s);
	return s;
}

/* The tables a meta.db whose schema is at version 2 or later must have: CREATE TABLE IF NOT
 * EXISTS would otherwise quietly replace a lost one with an empty one (a damaged file that
 * says "0 paths restored"). */
static const char *const tdb_tables[] = {"base_cache", "turns",	    "turn_delta",
					 "turn_map",   "turn_meta", "base_map"};

int cb_db_turns_schema_check(sqlite3 *db, const char *path)
{
	sqlite3_stmt *s = NULL;
	long long version = 0;
	int ret = 0;

	if (sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &s, NULL) == SQLITE_OK &&
	    sqlite3_step(s) == SQLITE_ROW)
		version = sqlite3_column_int64(s, 0);
	sqlite3_finalize(s);
	if (version < 2)
		return 0;
	if (sqlite3_prepare_v2(db, "SELECT 1 FROM sqlite_master WHERE type='table' AND name=?1", -1,
			       &s, NULL) != SQLITE_OK)
		return cb_error_set(EIO, "database %s: schema check: %s", path, sqlite3_errmsg(db));
	for (size_t i = 0; i < sizeof(tdb_tables) / sizeof(tdb_tables[0]) && !ret; i++) {
		sqlite3_reset(s);
		sqlite3_bind_text(s, 1, tdb_tables[i], -1, SQLITE_STATIC);
		if (sqlite3_step(s) != SQLITE_ROW)
			ret = cb_error_set(EUCLEAN,
					   "database %s is damaged: its table %s is missing (the "
					   "turns cannot be read); 'cowbox fsck REF --repair' "
					   "rebuilds it as a workspace with no turns, keeping the "
					   "files",
					   path, tdb_tables[i]);
	}
	sqlite3_finalize(s);
	return ret;
}

/* The tables of entries gained a file's metadata after the schema shipped (mtime_ns, the
 * owner as the sandbox sees it, the kept xattrs, the hard-link group and inode;
 * docs/turns.md): a database without them
 * gets them here, its older rows none (NULL: restored as before the columns existed). Two
 * connections may race to add one: the loser sees it. */
int cb_db_turns_add_meta_columns(sqlite3 *db, const char *path)
{
	static const char *const tables[] = {"turn_delta", "turn_map", "base_map"};
	static const char *const cols[][2] = {{"mtime_ns", "INTEGER"}, {"uid", "INTEGER"},
					      {"gid", "INTEGER"},      {"xattrs", "BLOB"},
					      {"link", "TEXT"},	       {"ino", "INTEGER"}};
	char sql[128];
	int ret = 0;

	for (size_t i = 0; i < sizeof(tables) / sizeof(tables[0]) && !ret; i++) {
		/* the usual case, one statement: all are there */
		snprintf(sql, sizeof(sql),
			 "SELECT mtime_ns, uid, gid, xattrs, link, ino FROM %s LIMIT 0", tables[i]);
		if (sqlite3_exec(db, sql, NULL, NULL, NULL) == SQLITE_OK)
			continue;
		for (size_t c = 0; c < sizeof(cols) / sizeof(cols[0]) && !ret; c++) {
			snprintf(sql, sizeof(sql), "SELECT %s FROM %s LIMIT 0", cols[c][0],
				 tables[i]);
			if (sqlite3_exec(db, sql, NULL, NULL, NULL) == SQLITE_OK)
				continue;
			snprintf(sql, sizeof(sql), "ALTER TABLE %s ADD COLUMN %s %s", tables[i],
				 cols[c][0], cols[c][1]);
			if (sqlite3_exec(db, sql, NULL, NULL, NULL) == SQLITE_OK)
				continue;
			snprintf(sql, sizeof(sql), "SELECT %s FROM %s LIMIT 0", cols[c][0],
				 tables[i]);
			if (sqlite3_exec(db, sql, NULL, NULL, NULL) != SQLITE_OK)
				ret = cb_error_set(EIO, "turn tables in %s: add %s.%s: %s", path,
						   tables[i], cols[c][0], sqlite3_errmsg(db));
		}
	}
	/* The hard links of a turn are found by their group and their inode: indexes that
	 * hold only the rows of files with more than one name (none, mostly). */
	if (!ret &&
	    sqlite3_exec(db,
			 "CREATE INDEX IF NOT EXISTS turn_map_by_link ON turn_map(link) "
			 "WHERE link IS NOT NULL;"
			 "CREATE INDEX IF NOT EXISTS turn_map_by_ino ON turn_map(ino) "
			 "WHERE ino IS NOT NULL;"
			 "CREATE INDEX IF NOT EXISTS turn_delta_by_link ON turn_delta(link, "
			 "turn) WHERE link IS NOT NULL;",
			 NULL, NULL, NULL) != SQLITE_OK)
		ret = cb_error_set(EIO, "turn tables in %s: link indexes: %s", path,
				   sqlite3_errmsg(db));
	return ret;
}

int cb_db_turns_open(const char *path, struct cb_db_turns **out)
{
	struct cb_db_turns *t = calloc(1, sizeof(*t));
	char *msg = NULL;
	int ret = 0;

	*out = NULL;
	if (!t)
		return cb_error_set(ENOMEM, "turn store %s: out of memory", path);
	/* NOMUTEX: a handle is used by one thread at a time (each op, the worker and the
	 * background pass open their own), and a whole map's 100k rows would otherwise take
	 * and drop the connection's mutex at every column read. */
	if (sqlite3_open_v2(path, &t->db,
			    SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
			    NULL) != SQLITE_OK) {
		ret = cb_error_set(EIO, "open %s: %s", path,
				   t->db ? sqlite3_errmsg(t->db) : "out of memory");
		goto out;
	}
	sqlite3_busy_timeout(t->db, 10000);
	if (sqlite3_exec(t->db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;", NULL, NULL,
			 &msg) != SQLITE_OK) {
		ret = cb_error_set(EIO, "turn tables in %s: %s", path, msg ? msg : "?");
		goto out;
	}
	ret = cb_db_turns_schema_check(t->db, path);
	if (ret)
		goto out;
	if (sqlite3_exec(t->db, cb_db_turns_schema_sql, NULL, NULL, &msg) != SQLITE_OK) {
		ret = cb_error_set(EIO, "turn tables in %s: %s", path, msg ? msg : "?");
		goto out;
	}
	/* The cache key gained ctime_ns after the schema shipped: older rows have none and so
	 * never match (rehashed once). */
	if (sqlite3_exec(t->db, "SELECT ctime_ns FROM base_cache LIMIT 0", NULL, NULL, NULL) !=
		SQLITE_OK &&
	    sqlite3_exec(t->db, "ALTER TABLE base_cache ADD COLUMN ctime_ns INTEGER", NULL, NULL,
			 &msg) != SQLITE_OK &&
	    /* another connection (the daemon's base hash) added it first */
	    sqlite3_exec(t->db, "SELECT ctime_ns FROM base_cache LIMIT 0", NULL, NULL, NULL) !=
		SQLITE_OK) {
		ret =
		    cb_error_set(EIO, "turn tables in %s: add ctime_ns: %s", path, msg ? msg : "?");
		goto out;
	}
	ret = cb_db_turns_add_meta_columns(t->db, path);
	if (ret)
		goto out;
	for (int i = 0; i < Q_COUNT; i++)
		if (sqlite3_prepare_v3(t->db, tdb_sql[i], -1, SQLITE_PREPARE_PERSISTENT, &t->q[i],
				       NULL) != SQLITE_OK) {
			ret = cb_db_turns_fail(t, "prepare");
			goto out;
		}
	/* Without the journal's meta (a bare turn store in unit tests) there is no open turn
	 * to advance. */
	if (sqlite3_prepare_v3(t->db, tdb_meta_turn_sql, -1, SQLITE_PREPARE_PERSISTENT,
			       &t->q[Q_META_TURN], NULL) != SQLITE_OK)
		t->q[Q_META_TURN] = NULL;
	*out = t;
out:
	sqlite3_free(msg);
	if (ret)
		cb_db_turns_close(t);
	return ret;
}

sqlite3 *cb_db_turns_sqlite(struct cb_db_turns *t)
{
	return t->db;
}

void cb_db_turns_close(struct cb_db_turns *t)
{
	if (!t)
		return;
	for (int i = 0; i < Q_ALL; i++)
		sqlite3_finalize(t->q[i]);
	sqlite3_close(t->db);
	free(t);
}

static int tdb_exec(struct cb_db_turns *t, const char *sql)
{
	if (sqlite3_exec(t->db, sql, NULL, NULL, NULL) != SQLITE_OK)
		return cb_db_turns_fail(t, sql);
	return 0;
}

/* IMMEDIATE: take the write lock up front, so a long read-then-write never fails midway. */
int cb_db_turns_begin(struct cb_db_turns *t)
{
	return tdb_exec(t, "BEGIN IMMEDIATE");
}

int cb_db_turns_begin_read(struct cb_db_turns *t)
{
	return tdb_exec(t, "BEGIN DEFERRED");
}

int cb_db_turns_commit(struct cb_db_turns *t)
{
	return tdb_exec(t, "COMMIT");
}

void cb_db_turns_rollback(struct cb_db_turns *t)
{
	if (!sqlite3_get_autocommit(t->db))
		sqlite3_exec(t->db, "ROLLBACK", NULL, NULL, NULL);
}

/* Step a statement that returns no row. */
static int tdb_done(struct cb_db_turns *t, sqlite3_stmt *s, const char *what)
{
	int rc = sqlite3_step(s);
	int ret = rc == SQLITE_DONE ? 0 : cb_db_turns_fail(t, what);

	sqlite3_reset(s);
	return ret;
}

/* Step a statement that returns one integer (def when there is no row). */
static long long tdb_int(sqlite3_stmt *s, long long def)
{
	long long v = def;

	if (sqlite3_step(s) == SQLITE_ROW)
		v = sqlite3_column_int64(s, 0);
	sqlite3_reset(s);
	return v;
}

int cb_db_turns_base_cache_get(struct cb_db_turns *t, const char *path, long long size,
			       long long mtime_ns, long long ctime_ns, long long ino,
			       unsigned char *sha256, unsigned char *xxh3)
{
	sqlite3_stmt *s = tdb_q(t, Q_CACHE_GET);
	int ret = 0, rc;

	sqlite3_bind_text(s, 1, path, -1, SQLITE_STATIC);
	sqlite3_bind_int64(s, 2, size);
	sqlite3_bind_int64(s, 3, mtime_ns);
	sqlite3_bind_int64(s, 4, ino);
	sqlite3_bind_int64(s, 5, ctime_ns);
	rc = sqlite3_step(s);
	if (rc == SQLITE_ROW && sqlite3_column_bytes(s, 0) == CB_SHA256_LEN &&
	    sqlite3_column_bytes(s, 1) == CB_XXH128_LEN) {
		memcpy(sha256, sqlite3_column_blob(s, 0), CB_SHA256_LEN);
		memcpy(xxh3, sqlite3_column_blob(s, 1), CB_XXH128_LEN);
		ret = 1;
	} else if (rc != SQLITE_ROW && rc != SQLITE_DONE) {
		ret = cb_db_turns_fail(t, "base cache lookup");
	}
	sqlite3_reset(s);
	return ret;
}

int cb_db_turns_base_cache_put(struct cb_db_turns *t, const char *path, long long size,
			       long long mtime_ns, long long ctime_ns, long long ino,
			       const unsigned char *sha256, const unsigned char *xxh3)
{
	sqlite3_stmt *s = tdb_q(t, Q_CACHE_PUT);

	sqlite3_bind_int64(s, 7, ctime_ns);
	sqlite3_bind_text(s, 1, path, -1, SQLITE_STATIC);
	sqlite3_bind_int64(s, 2, size);
	sqlite3_bind_int64(s, 3, mtime_ns);
	sqlite3_bind_int64(s, 4, ino);
	sqlite3_bind_blob(s, 5, sha256, CB_SHA256_LEN, SQLITE_STATIC);
	sqlite3_bind_blob(s, 6, xxh3, CB_XXH128_LEN, SQLITE_STATIC);
	return tdb_done(t, s, "base cache store");
}

int cb_db_turns_add(struct cb_db_turns *t, long long turn, double time, const char *label,
		    long long changes)
{
	sqlite3_stmt *s = tdb_q(t, Q_TURN_ADD);
	char next[32];
	int ret;

	sqlite3_bind_int64(s, 1, turn);
	sqlite3_bind_double(s, 2, time);
	if (label)
		sqlite3_bind_text(s, 3, label, -1, SQLITE_STATIC);
	sqlite3_bind_int64(s, 4, changes);
	ret = tdb_done(t, s, "record turn");
	if (ret || !t->q[Q_META_TURN])
		return ret;
	/* In the same transaction: the turn is recorded if and only if the open turn moved on. */
	s = tdb_q(t, Q_META_TURN);
	snprintf(next, sizeof(next), "%lld", turn + 1);
	sqlite3_bind_text(s, 1, next, -1, SQLITE_TRANSIENT);
	return tdb_done(t, s, "advance the open turn");
}

void cb_db_turns_journal_advance(struct cb_db *db, long long turn)
{
	cb_journal_set_turn(db, turn);
}

long long cb_db_turns_latest(struct cb_db_turns *t)
{
	return tdb_int(tdb_q(t, Q_TURN_LATEST), 0);
}

long long cb_db_turns_oldest(struct cb_db_turns *t)
{
	return tdb_int(tdb_q(t, Q_TURN_OLDEST), 0);
}

int cb_db_turns_exists(struct cb_db_turns *t, long long turn)
{
	sqlite3_stmt *s;

	if (turn == 0)
		return 1;
	s = tdb_q(t, Q_TURN_EXISTS);
	sqlite3_bind_int64(s, 1, turn);
	return (int)tdb_int(s, 0);
}

int cb_db_turns_list(struct cb_db_turns *t, int (*fn)(const struct cb_turn_info *, void *),
		     void *arg)
{
	sqlite3_stmt *s = tdb_q(t, Q_TURN_LIST);
	int ret = 0, rc;

	while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
		struct cb_turn_info ti = {
		    .turn = sqlite3_column_int64(s, 0),
		    .time = sqlite3_column_double(s, 1),
		    .label = (const char *)sqlite3_column_text(s, 2),
		    .changes = sqlite3_column_int64(s, 3),
		};
		ret = fn(&ti, arg);
		if (ret)
			goto out;
	}
	if (rc != SQLITE_DONE)
		ret = cb_db_turns_fail(t, "list turns");
out:
	sqlite3_reset(s);
	return ret;
}

void cb_db_turns_bind_entry(sqlite3_stmt *s, int pathpos, int first, const struct cb_entry *e)
{
	sqlite3_bind_text(s, pathpos, e->path, -1, SQLITE_STATIC);
	sqlite3_bind_int(s, first, e->type);
	sqlite3_bind_int(s, first + 1, (int)e->mode);
	sqlite3_bind_int64(s, first + 2, e->size);
	if (e->type == CB_ENTRY_FILE || e->type == CB_ENTRY_SYMLINK) {
		sqlite3_bind_blob(s, first + 3, e->sha256, CB_SHA256_LEN, SQLITE_STATIC);
		sqlite3_bind_blob(s, first + 4, e->xxh3, CB_XXH128_LEN, SQLITE_STATIC);
	}
	if (e->target)
		sqlite3_bind_text(s, first + 5, e->target, -1, SQLITE_STATIC);
	if (e->pid)
		sqlite3_bind_int64(s, first + 6, e->pid);
	if (e->comm)
		sqlite3_bind_text(s, first + 7, e->comm, -1, SQLITE_STATIC);
}

void cb_db_turns_column_entry(sqlite3_stmt *s, struct cb_entry *e)
{
	memset(e, 0, sizeof(*e));
	e->path = (char *)sqlite3_column_text(s, 0);
	e->type = sqlite3_column_int(s, 1);
	e->mode = (unsigned)sqlite3_column_int(s, 2);
	e->size = sqlite3_column_int64(s, 3);
	if (sqlite3_column_bytes(s, 4) == CB_SHA256_LEN)
		memcpy(e->sha256, sqlite3_column_blob(s, 4), CB_SHA256_LEN);
	if (sqlite3_column_bytes(s, 5) == CB_XXH128_LEN)
		memcpy(e->xxh3, sqlite3_column_blob(s, 5), CB_XXH128_LEN);
	e->target = (char *)sqlite3_column_text(s, 6);
	e->pid = (pid_t)sqlite3_column_int64(s, 7);
	e->comm = (char *)sqlite3_column_text(s, 8);
}

void cb_db_turns_bind_meta(sqlite3_stmt *s, int pos, const struct cb_entry *e)
{
	if (e->type == CB_ENTRY_ABSENT)
		return;
	if (e->has_mtime)
		sqlite3_bind_int64(s, pos, e->mtime_ns);
	if (e->has_owner) {
		sqlite3_bind_int64(s, pos + 1, e->uid);
		sqlite3_bind_int64(s, pos + 2, e->gid);
	}
	if (e->xattrs_len)
		sqlite3_bind_blob(s, pos + 3, e->xattrs, (int)e->xattrs_len, SQLITE_STATIC);
	if (e->type == CB_ENTRY_FILE && e->link)
		sqlite3_bind_text(s, pos + 4, e->link, -1, SQLITE_STATIC);
	if (e->type == CB_ENTRY_FILE && e->ino)
		sqlite3_bind_int64(s, pos + 5, e->ino);
}

void cb_db_turns_column_meta(sqlite3_stmt *s, int col, struct cb_entry *e)
{
	e->has_mtime = sqlite3_column_type(s, col) == SQLITE_INTEGER;
	e->mtime_ns = e->has_mtime ? sqlite3_column_int64(s, col) : 0;
	e->has_owner = sqlite3_column_type(s, col + 1) == SQLITE_INTEGER &&
		       sqlite3_column_type(s, col + 2) == SQLITE_INTEGER;
	e->uid = e->has_owner ? (unsigned)sqlite3_column_int64(s, col + 1) : 0;
	e->gid = e->has_owner ? (unsigned)sqlite3_column_int64(s, col + 2) : 0;
	e->xattrs_len = (size_t)sqlite3_column_bytes(s, col + 3);
	e->xattrs = e->xattrs_len ? (unsigned char *)sqlite3_column_blob(s, col + 3) : NULL;
	if (!e->xattrs)
		e->xattrs_len = 0;
	e->link = (char *)sqlite3_column_text(s, col + 4);
	e->ino = sqlite3_column_int64(s, col + 5);
}

int cb_db_turns_delta_put(struct cb_db_turns *t, long long turn, const struct cb_entry *e)
{
	sqlite3_stmt *s = tdb_q(t, Q_DELTA_PUT);

	cb_db_turns_bind_entry(s, 1, 3, e);
	cb_db_turns_bind_meta(s, 11, e);
	sqlite3_bind_int64(s, 2, turn);
	return tdb_done(t, s, "record delta");
}

/* One-row lookup into an owned entry: 1 found, 0 none, -errno. */
static int tdb_lookup(struct cb_db_turns *t, sqlite3_stmt *s, struct cb_entry *out,
		      const char *what)
{
	struct cb_entry row;
	int rc = sqlite3_step(s), ret = 0;

	if (rc == SQLITE_ROW) {
		cb_db_turns_column_entry(s, &row);
		cb_db_turns_column_meta(s, 9, &row);
		ret = cb_entry_copy(out, &row);
		if (ret == 0)
			ret = 1;
	} else if (rc != SQLITE_DONE) {
		ret = cb_db_turns_fail(t, what);
	}
	sqlite3_reset(s);
	return ret;
}

int cb_db_turns_delta_at(struct cb_db_turns *t, const char *path, long long turn,
			 struct cb_entry *out)
{
	sqlite3_stmt *s = tdb_q(t, Q_DELTA_AT);

	sqlite3_bind_text(s, 1, path, -1, SQLITE_STATIC);
	sqlite3_bind_int64(s, 2, turn);
	return tdb_lookup(t, s, out, "delta lookup");
}

int cb_db_turns_delta_paths(struct cb_db_turns *t, long long from, long long to,
			    int (*fn)(const char *path, void *), void *arg)
{
	sqlite3_stmt *s = tdb_q(t, Q_DELTA_PATHS);
	int ret = 0, rc;

	sqlite3_bind_int64(s, 1, from);
	sqlite3_bind_int64(s, 2, to);
	while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
		ret = fn((const char *)sqlite3_column_text(s, 0), arg);
		if (ret)
			goto out;
	}
	if (rc != SQLITE_DONE)
		ret = cb_db_turns_fail(t, "changed paths");
out:
	sqlite3_reset(s);
	return ret;
}

long long cb_db_turns_map_turn(struct cb_db_turns *t)
{
	return tdb_int(tdb_q(t, Q_MAP_TURN), -1);
}

int cb_db_turns_map_set_turn(struct cb_db_turns *t, long long turn)
{
	sqlite3_stmt *s = tdb_q(t, Q_MAP_SET_TURN);

	sqlite3_bind_int64(s, 1, turn);
	return tdb_done(t, s, "map turn");
}

int cb_db_turns_map_get(struct cb_db_turns *t, const char *path, struct cb_entry *out)
{
	sqlite3_stmt *s = tdb_q(t, Q_MAP_GET);

	sqlite3_bind_text(s, 1, path, -1, SQLITE_STATIC);
	return tdb_lookup(t, s, out, "map lookup");
}

int cb_db_turns_map_put(struct cb_db_turns *t, const struct cb_entry *e)
{
	sqlite3_stmt *s = tdb_q(t, Q_MAP_PUT);

	cb_db_turns_bind_entry(s, 1, 2, e);
	cb_db_turns_bind_meta(s, 10, e);
	return tdb_done(t, s, "map store");
}

int cb_db_turns_map_del(struct cb_db_turns *t, const char *path)
{
	sqlite3_stmt *s = tdb_q(t, Q_MAP_DEL);

	sqlite3_bind_text(s, 1, path, -1, SQLITE_STATIC);
	return tdb_done(t, s, "map delete");
}

int cb_db_turns_map_clear(struct cb_db_turns *t)
{
	return tdb_done(t, tdb_q(t, Q_MAP_CLEAR), "map clear");
}

int cb_db_turns_map_list(struct cb_db_turns *t, const char *prefix,
			 int (*fn)(const struct cb_entry *, void *), void *arg)
{
	sqlite3_stmt *s = tdb_q(t, prefix ? Q_MAP_UNDER : Q_MAP_ALL);
	struct cb_entry e;
	int ret = 0, rc;

	if (prefix)
		sqlite3_bind_text(s, 1, prefix, -1, SQLITE_STATIC);
	while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
		cb_db_turns_column_entry(s, &e);
		cb_db_turns_column_meta(s, 9, &e);
		ret = fn(&e, arg);
		if (ret)
			goto out;
	}
	if (rc != SQLITE_DONE)
		ret = cb_db_turns_fail(t, "map list");
out:
	sqlite3_reset(s);
	return ret;
}

/* The newest row at or before keep_from of each path changed before it becomes a row of
 * keep_from itself (unless keep_from changed that path too), then the older rows go. */
int cb_db_turns_prune(struct cb_db_turns *t, long long keep_from)
{
	static const char *const steps[] = {
	    "INSERT OR IGNORE INTO turn_delta(path, turn, type, mode, size, sha256, xxh3, target, "
	    "pid, comm, mtime_ns, uid, gid, xattrs, link, ino) SELECT d.path, ?1, d.type, d.mode, "
	    "d.size, d.sha256, d.xxh3, d.target, d.pid, d.comm, d.mtime_ns, d.uid, d.gid, "
	    "d.xattrs, d.link, d.ino FROM "
	    "turn_delta d WHERE "
	    "d.turn>0 AND "
	    "d.turn<?1 AND d.turn=(SELECT max(turn) FROM turn_delta x WHERE x.path=d.path "
	    "AND x.turn<=?1)",
	    "DELETE FROM turn_delta WHERE turn>0 AND turn<?1",
	    "DELETE FROM turns WHERE turn<?1",
	};
	int ret = 0;

	for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]) && !ret; i++) {
		sqlite3_stmt *s = NULL;

		if (sqlite3_prepare_v2(t->db, steps[i], -1, &s, NULL) != SQLITE_OK) {
			ret = cb_db_turns_fail(t, "prune");
			break;
		}
		sqlite3_bind_int64(s, 1, keep_from);
		if (sqlite3_step(s) != SQLITE_DONE)
			ret = cb_db_turns_fail(t, "prune");
		sqlite3_finalize(s);
	}
	return ret;
}

int cb_db_turns_unsynced(struct cb_db_turns *t)
{
	if (sqlite3_exec(t->db, "PRAGMA synchronous=OFF", NULL, NULL, NULL) != SQLITE_OK)
		return cb_db_turns_fail(t, "set synchronous");
	return 0;
}

int cb_db_turns_base_cache_from(struct cb_db_turns *t, const char *db_path)
{
	sqlite3_stmt *s = NULL;
	int ret = 0;

	if (sqlite3_prepare_v2(t->db, "INSERT OR REPLACE INTO turn_meta VALUES('cache_from', ?1)",
			       -1, &s, NULL) != SQLITE_OK)
		return cb_db_turns_fail(t, "remember the base cache's source");
	sqlite3_bind_text(s, 1, db_path, -1, SQLITE_STATIC);
	if (sqlite3_step(s) != SQLITE_DONE)
		ret = cb_db_turns_fail(t, "remember the base cache's source");
	sqlite3_finalize(s);
	return ret;
}

/* Copy the base cache of the workspace this one was forked from, once: a fork shares the base,
 * so its hashes are valid here too (rows are still checked by size, mtime, ctime and inode). A
 * source that is gone or unreadable only costs a rehash. */
int cb_db_turns_base_cache_import(struct cb_db_turns *t)
{
	sqlite3_stmt *s = NULL;
	char *from = NULL;

	if (sqlite3_prepare_v2(t->db, "SELECT value FROM turn_meta WHERE key='cache_from'", -1, &s,
			       NULL) != SQLITE_OK)
		return cb_db_turns_fail(t, "base cache source");
	if (sqlite3_step(s) == SQLITE_ROW && sqlite3_column_text(s, 0))
		from = sqlite3_mprintf("%s", sqlite3_column_text(s, 0));
	sqlite3_finalize(s);
	if (!from)
		return 0;
	/* ATTACH would create an empty database where the source was removed: look first. */
	if (access(from, R_OK) == 0 &&
	    sqlite3_prepare_v2(t->db, "ATTACH ?1 AS forked_from", -1, &s, NULL) == SQLITE_OK) {
		sqlite3_bind_text(s, 1, from, -1, SQLITE_STATIC);
		if (sqlite3_step(s) == SQLITE_DONE) {
			sqlite3_exec(t->db,
				     "INSERT OR IGNORE INTO main.base_cache(path, size, mtime_ns, "
				     "ino, sha256, xxh3, ctime_ns) SELECT path, size, mtime_ns, "
				     "ino, sha256, xxh3, ctime_ns FROM forked_from.base_cache",
				     NULL, NULL, NULL);
			sqlite3_exec(t->db, "DETACH forked_from", NULL, NULL, NULL);
		}
		sqlite3_finalize(s);
	}
	sqlite3_free(from);
	return tdb_exec(t, "DELETE FROM turn_meta WHERE key='cache_from'");
}

int cb_db_turns_base_map_built(struct cb_db_turns *t)
{
	return tdb_int(tdb_q(t, Q_BASE_BUILT), 0) == 1;
}

int cb_db_turns_base_map_set_built(struct cb_db_turns *t)
{
	return tdb_done(t, tdb_q(t, Q_BASE_SET_BUILT), "base map built");
}

int cb_db_turns_base_map_get(struct cb_db_turns *t, const char *path, struct cb_entry *out)
{
	sqlite3_stmt *s = tdb_q(t, Q_BASE_GET);

	sqlite3_bind_text(s, 1, path, -1, SQLITE_STATIC);
	return tdb_lookup(t, s, out, "base map lookup");
}

int cb_db_turns_base_map_put(struct cb_db_turns *t, const struct cb_entry *e)
{
	sqlite3_stmt *s = tdb_q(t, Q_BASE_PUT);

	cb_db_turns_bind_entry(s, 1, 2, e);
	return tdb_done(t, s, "base map store");
}

int cb_db_turns_base_map_clear(struct cb_db_turns *t)
{
	return tdb_exec(t, "DELETE FROM base_map");
}

int cb_db_turns_base_prepared(struct cb_db_turns *t)
{
	sqlite3_stmt *s = NULL;
	int ret;

	if (sqlite3_prepare_v2(t->db, "SELECT value FROM turn_meta WHERE key='base_prepared'", -1,
			       &s, NULL) != SQLITE_OK)
		return cb_db_turns_fail(t, "prepared base map");
	ret = (int)tdb_int(s, 0) == 1;
	sqlite3_finalize(s);
	return ret;
}

int cb_db_turns_base_prepared_set(struct cb_db_turns *t, int on)
{
	return tdb_exec(t, on ? "INSERT OR REPLACE INTO turn_meta VALUES('base_prepared', 1)"
			      : "DELETE FROM turn_meta WHERE key='base_prepared'");
}

int cb_db_turns_map_from_base(struct cb_db_turns *t)
{
	return tdb_exec(
	    t, "INSERT OR REPLACE INTO turn_map(path, type, mode, size, sha256, xxh3, "
	       "target, pid, comm, mtime_ns, uid, gid, xattrs, link, ino) SELECT path, type, mode, "
	       "size, sha256, xxh3, target, pid, comm, mtime_ns, uid, gid, xattrs, link, ino FROM "
	       "base_map");
}

int cb_db_turns_blob_needed(struct cb_db_turns *t, const unsigned char *xxh3)
{
	sqlite3_stmt *s = tdb_q(t, Q_BLOB_NEEDED);

	sqlite3_bind_blob(s, 1, xxh3, CB_XXH128_LEN, SQLITE_STATIC);
	return (int)tdb_int(s, 0);
}

int cb_db_meta_peek(const char *path, const char *key, char **value)
{
	sqlite3 *db = NULL;
	sqlite3_stmt *s = NULL;
	int ret = -ENOENT;

	*value = NULL;
	if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK &&
	    sqlite3_prepare_v2(db, "SELECT value FROM meta WHERE key = ?1", -1, &s, NULL) ==
		SQLITE_OK) {
		sqlite3_bind_text(s, 1, key, -1, SQLITE_STATIC);
		if (sqlite3_step(s) == SQLITE_ROW && sqlite3_column_text(s, 0)) {
			*value = strdup((const char *)sqlite3_column_text(s, 0));
			ret = *value ? 0 : -ENOMEM;
		}
	}
	sqlite3_finalize(s);
	sqlite3_close(db);
	return ret;
}

/* Random, so that a map id never names two databases: not the workspace's ref (a fork or a
 * workspace made again under one name starts over at turn 1) nor anything a client could
 * have seen from another database. Kept once made: the turns it names stay what they were. */
int cb_db_turns_map_id_fresh(long long *out)
{
	unsigned long long r = 0;

	*out = 0;
	if (getrandom(&r, sizeof(r), 0) != (ssize_t)sizeof(r))
		return cb_error_set(errno ? errno : EIO, "map id: getrandom: %s", strerror(errno));
	*out = (long long)((r >> 2) | 1); /* positive and never 0 as a signed 64-bit integer */
	return 0;
}

/* How a map id is written: "OR IGNORE" keeps the first one made, "OR REPLACE" adopts one. */
static int map_id_put(struct cb_db_turns *t, const char *verb, long long id)
{
	char sql[96];
	sqlite3_stmt *s = NULL;
	int ret = 0;

	snprintf(sql, sizeof(sql), "INSERT OR %s INTO turn_meta VALUES('map_id', ?1)", verb);
	if (sqlite3_prepare_v2(t->db, sql, -1, &s, NULL) != SQLITE_OK)
		return cb_db_turns_fail(t, "map id");
	sqlite3_bind_int64(s, 1, id);
	if (sqlite3_step(s) != SQLITE_DONE)
		ret = cb_db_turns_fail(t, "map id");
	sqlite3_finalize(s);
	return ret;
}

int cb_db_turns_map_id_set(struct cb_db_turns *t, long long id)
{
	return map_id_put(t, "REPLACE", id);
}

int cb_db_turns_map_id(struct cb_db_turns *t, long long *out)
{
	sqlite3_stmt *s = NULL;
	long long r = 0;
	int ret = 0;

	*out = 0;
	if (sqlite3_prepare_v2(t->db, "SELECT value FROM turn_meta WHERE key='map_id'", -1, &s,
			       NULL) != SQLITE_OK)
		return cb_db_turns_fail(t, "map id");
	if (sqlite3_step(s) == SQLITE_ROW)
		*out = sqlite3_column_int64(s, 0);
	sqlite3_finalize(s);
	if (*out > 0)
		return 0;
	if ((ret = cb_db_turns_map_id_fresh(&r)) || (ret = map_id_put(t, "IGNORE", r)))
		return ret;
	if (sqlite3_prepare_v2(t->db, "SELECT value FROM turn_meta WHERE key='map_id'", -1, &s,
			       NULL) == SQLITE_OK) {
		if (sqlite3_step(s) == SQLITE_ROW)
			*out = sqlite3_column_int64(s, 0);
		sqlite3_finalize(s);
	}
	return ret;
}

/* Each map row the statement (bound by the caller) yields, to fn. */
static int tdb_rows(struct cb_db_turns *t, sqlite3_stmt *s, const char *what,
		    int (*fn)(const struct cb_entry *, void *), void *arg)
{
	struct cb_entry e;
	int ret = 0, rc;

	while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
		cb_db_turns_column_entry(s, &e);
		cb_db_turns_column_meta(s, 9, &e);
		if ((ret = fn(&e, arg)))
			break;
	}
	if (!ret && rc != SQLITE_DONE)
		ret = cb_db_turns_fail(t, what);
	sqlite3_reset(s);
	return ret;
}

int cb_db_turns_map_by_link(struct cb_db_turns *t, const char *link,
			    int (*fn)(const struct cb_entry *, void *), void *arg)
{
	sqlite3_stmt *s = tdb_q(t, Q_MAP_LINK);

	sqlite3_bind_text(s, 1, link, -1, SQLITE_STATIC);
	return tdb_rows(t, s, "map rows of a link group", fn, arg);
}

int cb_db_turns_map_by_ino(struct cb_db_turns *t, long long ino,
			   int (*fn)(const struct cb_entry *, void *), void *arg)
{
	sqlite3_stmt *s = tdb_q(t, Q_MAP_INO);

	sqlite3_bind_int64(s, 1, ino);
	return tdb_rows(t, s, "map rows of an inode", fn, arg);
}

int cb_db_turns_link_paths(struct cb_db_turns *t, const char *link, long long turn,
			   int (*fn)(const char *path, void *), void *arg)
{
	sqlite3_stmt *s = tdb_q(t, Q_LINK_PATHS);
	int ret = 0, rc;

	sqlite3_bind_text(s, 1, link, -1, SQLITE_STATIC);
	sqlite3_bind_int64(s, 2, turn);
	while ((rc = sqlite3_step(s)) == SQLITE_ROW)
		if ((ret = fn((const char *)sqlite3_column_text(s, 0), arg)))
			break;
	if (!ret && rc != SQLITE_DONE)
		ret = cb_db_turns_fail(t, "paths of a link group");
	sqlite3_reset(s);
	return ret;
}

/* Whole-table walks of the turn store: every file delta with the turns it lived in, the base
 * map's files and entries, the base cache's rows (fsck, rollback in place, the shared cache). */
#include "config.h"

#include <sqlite3.h>
#include <string.h>

#include "cowbox/turn_store.h"
#include "db.h"

/* Run sql (no parameters) and hand each row to row(): one-off statements, as none of these
 * walks is on a hot path. */
static int walk_each(struct cb_db_turns *t, const char *sql,
		     int (*row)(sqlite3_stmt *, void *, void *), void *fn, void *arg,
		     const char *what)
{
	sqlite3_stmt *s = NULL;
	int ret = 0, rc;

	if (sqlite3_prepare_v2(cb_db_turns_sqlite(t), sql, -1, &s, NULL) != SQLITE_OK)
		return cb_db_turns_fail(t, what);
	while ((rc = sqlite3_step(s)) == SQLITE_ROW && !ret)
		ret = row(s, fn, arg);
	if (!ret && rc != SQLITE_DONE && rc != SQLITE_ROW)
		ret = cb_db_turns_fail(t, what);
	sqlite3_finalize(s);
	return ret;
}

static int walk_file_row(sqlite3_stmt *s, void *fn, void *arg)
{
	int (*cb)(const struct cb_entry *, long long, long long, void *) =
	    (int (*)(const struct cb_entry *, long long, long long, void *))fn;
	struct cb_entry e;

	cb_db_turns_column_entry(s, &e);
	return cb(&e, sqlite3_column_int64(s, 9),
		  sqlite3_column_type(s, 10) == SQLITE_NULL ? -1 : sqlite3_column_int64(s, 10),
		  arg);
}

/* See turn_store.h. */
int cb_db_turns_file_deltas(struct cb_db_turns *t,
			    int (*fn)(const struct cb_entry *e, long long from, long long until,
				      void *arg),
			    void *arg)
{
	return walk_each(t,
			 "SELECT path, type, mode, size, sha256, xxh3, target, pid, comm, turn, "
			 "(SELECT min(n.turn) FROM turn_delta n WHERE n.path = d.path AND n.turn > "
			 "d.turn) FROM turn_delta d WHERE type = 1 ORDER BY xxh3, path, turn",
			 walk_file_row, (void *)fn, arg, "list file deltas");
}

/* See turn_store.h. */
int cb_db_turns_base_files(struct cb_db_turns *t,
			   int (*fn)(const struct cb_entry *e, long long from, long long until,
				     void *arg),
			   void *arg)
{
	return walk_each(t,
			 "SELECT path, type, mode, size, sha256, xxh3, target, pid, comm, 0, "
			 "(SELECT min(n.turn) FROM turn_delta n WHERE n.path = b.path) "
			 "FROM base_map b WHERE type = 1 AND (SELECT value FROM turn_meta WHERE "
			 "key = 'base_map') = 1 ORDER BY path",
			 walk_file_row, (void *)fn, arg, "list base files");
}

/* See turn_store.h. */
int cb_db_turns_base_entries(struct cb_db_turns *t,
			     int (*fn)(const struct cb_entry *e, long long from, long long until,
				       void *arg),
			     void *arg)
{
	return walk_each(t,
			 "SELECT path, type, mode, size, sha256, xxh3, target, pid, comm, 0, NULL "
			 "FROM base_map ORDER BY path",
			 walk_file_row, (void *)fn, arg, "list the base map");
}

static int walk_cache_row(sqlite3_stmt *s, void *fn, void *arg)
{
	int (*cb)(const struct cb_db_cache_row *, void *) =
	    (int (*)(const struct cb_db_cache_row *, void *))fn;
	struct cb_db_cache_row r = {
	    .path = (const char *)sqlite3_column_text(s, 0),
	    .size = sqlite3_column_int64(s, 1),
	    .mtime_ns = sqlite3_column_int64(s, 2),
	    .ino = sqlite3_column_int64(s, 3),
	    .ctime_ns = sqlite3_column_type(s, 6) == SQLITE_NULL ? -1 : sqlite3_column_int64(s, 6),
	};

	if (sqlite3_column_bytes(s, 4) == CB_SHA256_LEN)
		memcpy(r.sha256, sqlite3_column_blob(s, 4), CB_SHA256_LEN);
	if (sqlite3_column_bytes(s, 5) == CB_XXH128_LEN)
		memcpy(r.xxh3, sqlite3_column_blob(s, 5), CB_XXH128_LEN);
	return r.path ? cb(&r, arg) : 0;
}

/* See turn_store.h. */
int cb_db_turns_base_cache_list(struct cb_db_turns *t,
				int (*fn)(const struct cb_db_cache_row *row, void *arg), void *arg)
{
	return walk_each(t,
			 "SELECT path, size, mtime_ns, ino, sha256, xxh3, ctime_ns FROM base_cache "
			 "ORDER BY path",
			 walk_cache_row, (void *)fn, arg, "list the base cache");
}

/* See turn_store.h. */
int cb_db_turns_base_cache_del(struct cb_db_turns *t, const char *path)
{
	sqlite3_stmt *s = NULL;
	int ret = 0;

	if (sqlite3_prepare_v2(cb_db_turns_sqlite(t), "DELETE FROM base_cache WHERE path = ?1", -1,
			       &s, NULL) != SQLITE_OK)
		return cb_db_turns_fail(t, "drop a base cache row");
	sqlite3_bind_text(s, 1, path, -1, SQLITE_STATIC);
	if (sqlite3_step(s) != SQLITE_DONE)
		ret = cb_db_turns_fail(t, "drop a base cache row");
	sqlite3_finalize(s);
	return ret;
}

static int walk_short_row(sqlite3_stmt *s, void *fn, void *arg)
{
	int (*cb)(long long, long long, long long, void *) =
	    (int (*)(long long, long long, long long, void *))fn;

	return cb(sqlite3_column_int64(s, 0), sqlite3_column_int64(s, 1),
		  sqlite3_column_int64(s, 2), arg);
}

/* See turn_store.h. A prune adds rows to the oldest turn it keeps (never takes any), so only
 * fewer rows than recorded is a loss. */
int cb_db_turns_short_turns(struct cb_db_turns *t,
			    int (*fn)(long long turn, long long recorded, long long held,
				      void *arg),
			    void *arg)
{
	return walk_each(t,
			 "SELECT turn, changes, held FROM (SELECT t.turn, t.changes, (SELECT "
			 "count(*) FROM turn_delta d WHERE d.turn = t.turn) AS held FROM turns t) "
			 "WHERE held < changes ORDER BY turn",
			 walk_short_row, (void *)fn, arg, "count each turn's rows");
}

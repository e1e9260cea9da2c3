/* A turn operation's scratch space: temporary tables (on disk, beside the connection) for the
 * journal's rows, the paths to examine and their entries, so a turn of any size costs bounded
 * memory. */
#include "config.h"

#include <errno.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>

#include "cowbox/error.h"
#include "cowbox/journal.h"
#include "cowbox/turn_store.h"
#include "db.h"

/* snap_dirty: the journal's rows merged per path (subtree if any row said so, attributed to
 * the latest row with a pid). snap_path: every path to examine. snap_res: each examined path's
 * entry before (o_*) and now, and whether it changed. Temp tables live in SQLite's temporary
 * file, so their size costs disk, not memory. */
static const char scratch_schema[] =
    "PRAGMA temp_store=FILE;"
    "CREATE TEMP TABLE IF NOT EXISTS snap_dirty(path TEXT PRIMARY KEY, subtree INTEGER, "
    "  pid INTEGER, comm TEXT, names INTEGER) WITHOUT ROWID;"
    "CREATE TEMP TABLE IF NOT EXISTS snap_path(path TEXT PRIMARY KEY, pid INTEGER, comm TEXT) "
    "  WITHOUT ROWID;"
    "CREATE TEMP TABLE IF NOT EXISTS snap_res(path TEXT PRIMARY KEY, type INTEGER, "
    "  mode INTEGER, size INTEGER, sha256 BLOB, xxh3 BLOB, target TEXT, pid INTEGER, "
    "  comm TEXT, changed INTEGER, o_type INTEGER, o_mode INTEGER, o_size INTEGER, "
    "  o_sha256 BLOB, o_xxh3 BLOB, o_target TEXT, mtime_ns INTEGER, uid INTEGER, gid INTEGER, "
    "  xattrs BLOB, link TEXT, ino INTEGER, o_link TEXT) WITHOUT ROWID;"
    "DELETE FROM temp.snap_dirty; DELETE FROM temp.snap_path; DELETE FROM temp.snap_res;";

/* Rows are merged in journal order: a later row with a pid takes the attribution. */
#define DIRTY_UPSERT                                                                               \
	" ON CONFLICT(path) DO UPDATE SET subtree=max(subtree, excluded.subtree), "                \
	"names=max(names, excluded.names), "                                                       \
	"pid=CASE WHEN excluded.pid<>0 THEN excluded.pid ELSE pid END, "                           \
	"comm=CASE WHEN excluded.pid<>0 THEN excluded.comm ELSE comm END"

enum {
	S_DIRTY_ADD,
	S_DIRTY_PAGE,
	S_PATH_ADD,
	S_PATH_HAS,
	S_PATH_PAGE,
	S_RES_PUT,
	S_RES_TYPE,
	S_RES_CHANGED,
	S_REC_DELTA,
	S_REC_MAP_DEL,
	S_REC_MAP_PUT,
	S_REC_COUNT,
	S_REC_ANY,
	S_LINKED,
	S_SET_LINK,
	S_COUNT,
	S_DIRTY_JOURNAL = S_COUNT, /* only when meta.db has the journal */
	S_ALL
};

static const char *const scratch_sql[S_ALL] = {
    [S_DIRTY_ADD] = "INSERT INTO temp.snap_dirty VALUES(?1,?2,?3,?4,?5)" DIRTY_UPSERT,
    [S_DIRTY_PAGE] = "SELECT path, subtree, pid, comm, names FROM temp.snap_dirty WHERE path>?1 "
		     "ORDER BY path LIMIT ?2",
    [S_PATH_ADD] = "INSERT INTO temp.snap_path VALUES(?1,?2,?3) ON CONFLICT(path) DO UPDATE "
		   "SET pid=excluded.pid, comm=excluded.comm WHERE pid=0",
    [S_PATH_HAS] = "SELECT 1 FROM temp.snap_path WHERE path=?1",
    [S_PATH_PAGE] = "SELECT path, 0, pid, comm, 1 FROM temp.snap_path WHERE path>?1 "
		    "ORDER BY path LIMIT ?2",
    [S_RES_PUT] = "INSERT OR REPLACE INTO temp.snap_res VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,"
		  "?11,?12,?13,?14,?15,?16,?17,?18,?19,?20,?21,?22,?23)",
    [S_RES_TYPE] = "SELECT type FROM temp.snap_res WHERE path=?1",
    /* changed 2: only the recorded metadata moved (a row, but no event nor count) */
    [S_RES_CHANGED] = "SELECT path, type, mode, size, sha256, xxh3, target, pid, comm, "
		      "o_type, o_mode, o_size, o_sha256, o_xxh3, o_target, mtime_ns, uid, gid, "
		      "xattrs, link, ino "
		      "FROM temp.snap_res WHERE changed=1 ORDER BY path",
    [S_REC_DELTA] = "INSERT OR REPLACE INTO main.turn_delta(path, turn, type, mode, size, "
		    "sha256, xxh3, target, pid, comm, mtime_ns, uid, gid, xattrs, link, ino) "
		    "SELECT path, ?1, type, mode, size, sha256, xxh3, target, pid, comm, mtime_ns, "
		    "uid, gid, xattrs, link, ino FROM temp.snap_res WHERE changed",
    [S_REC_MAP_DEL] = "DELETE FROM main.turn_map WHERE path IN "
		      "(SELECT path FROM temp.snap_res WHERE changed AND type=0)",
    [S_REC_MAP_PUT] =
	"INSERT OR REPLACE INTO main.turn_map(path, type, mode, size, sha256, xxh3, target, pid, "
	"comm, mtime_ns, uid, gid, xattrs, link, ino) SELECT path, type, mode, size, sha256, "
	"xxh3, target, pid, comm, mtime_ns, uid, gid, xattrs, link, ino FROM temp.snap_res WHERE "
	"changed AND type<>0",
    [S_LINKED] = "SELECT path, type, mode, size, sha256, xxh3, target, pid, comm, mtime_ns, "
		 "uid, gid, xattrs, link, ino, o_link FROM temp.snap_res WHERE (type=1 AND ino IS "
		 "NOT NULL) OR o_link IS NOT NULL ORDER BY path",
    /* another group than before: a row (2) unless it changed anyway (1) */
    [S_SET_LINK] = "UPDATE temp.snap_res SET link=?2, changed=CASE WHEN changed=1 THEN 1 "
		   "WHEN ?2 IS NOT o_link THEN 2 ELSE changed END WHERE path=?1",
    [S_REC_COUNT] = "SELECT count(*) FROM temp.snap_res WHERE changed=1",
    [S_REC_ANY] = "SELECT count(*) FROM temp.snap_res WHERE changed",
    /* names: a row that made, removed or moved a name (not a write nor a change of
     * metadata), which moves its directory's time */
    [S_DIRTY_JOURNAL] = "INSERT INTO temp.snap_dirty SELECT path, subtree, pid, comm, "
			"kind NOT IN (?4, ?5) FROM main.journal WHERE turn BETWEEN ?1 AND ?2 "
			"AND kind<>?3 ORDER BY id" DIRTY_UPSERT,
};

struct cb_db_scratch {
	sqlite3 *db;
	sqlite3_stmt *q[S_ALL];
};

static int scratch_fail(struct cb_db_scratch *s, const char *what)
{
	int code = sqlite3_errcode(s->db);
	int err = code == SQLITE_BUSY || code == SQLITE_LOCKED ? EBUSY
		  : code == SQLITE_NOMEM		       ? ENOMEM
		  : code == SQLITE_FULL			       ? ENOSPC
							       : EIO;

	return cb_error_set(err, "turn scratch: %s: %s", what, sqlite3_errmsg(s->db));
}

static sqlite3_stmt *scratch_q(struct cb_db_scratch *s, int which)
{
	sqlite3_stmt *q = s->q[which];

	sqlite3_reset(q);
	sqlite3_clear_bindings(q);
	return q;
}

static int scratch_done(struct cb_db_scratch *s, sqlite3_stmt *q, const char *what)
{
	int rc = sqlite3_step(q);
	int ret = rc == SQLITE_DONE ? 0 : scratch_fail(s, what);

	sqlite3_reset(q);
	return ret;
}

int cb_db_scratch_open(struct cb_db_turns *t, struct cb_db_scratch **out)
{
	struct cb_db_scratch *s = calloc(1, sizeof(*s));
	int ret = 0;

	*out = NULL;
	if (!s)
		return cb_error_set(ENOMEM, "turn scratch: out of memory");
	s->db = cb_db_turns_sqlite(t);
	if (sqlite3_exec(s->db, scratch_schema, NULL, NULL, NULL) != SQLITE_OK) {
		ret = scratch_fail(s, "create");
		goto out;
	}
	for (int i = 0; i < S_ALL; i++)
		if (sqlite3_prepare_v3(s->db, scratch_sql[i], -1, SQLITE_PREPARE_PERSISTENT,
				       &s->q[i], NULL) != SQLITE_OK) {
			/* A bare turn store (unit tests) has no journal to read. */
			if (i == S_DIRTY_JOURNAL)
				continue;
			ret = scratch_fail(s, "prepare");
			goto out;
		}
	*out = s;
out:
	if (ret)
		cb_db_scratch_close(s);
	return ret;
}

void cb_db_scratch_close(struct cb_db_scratch *s)
{
	if (!s)
		return;
	for (int i = 0; i < S_ALL; i++)
		sqlite3_finalize(s->q[i]);
	/* Give the temporary file's pages back now, not when the connection closes. */
	sqlite3_exec(s->db,
		     "DROP TABLE IF EXISTS temp.snap_dirty; DROP TABLE IF EXISTS temp.snap_path;"
		     "DROP TABLE IF EXISTS temp.snap_res;",
		     NULL, NULL, NULL);
	free(s);
}

int cb_db_scratch_begin(struct cb_db_scratch *s)
{
	return sqlite3_exec(s->db, "BEGIN", NULL, NULL, NULL) == SQLITE_OK
		   ? 0
		   : scratch_fail(s, "begin");
}

int cb_db_scratch_commit(struct cb_db_scratch *s)
{
	if (sqlite3_exec(s->db, "COMMIT", NULL, NULL, NULL) == SQLITE_OK)
		return 0;
	int ret = scratch_fail(s, "commit");

	sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
	return ret;
}

int cb_db_scratch_dirty_add(struct cb_db_scratch *s, const struct cb_scratch_row *d)
{
	sqlite3_stmt *q = scratch_q(s, S_DIRTY_ADD);

	sqlite3_bind_text(q, 1, d->path, -1, SQLITE_STATIC);
	sqlite3_bind_int(q, 2, d->subtree != 0);
	sqlite3_bind_int64(q, 3, d->pid);
	if (d->comm)
		sqlite3_bind_text(q, 4, d->comm, -1, SQLITE_STATIC);
	sqlite3_bind_int(q, 5, !d->same_names);
	return scratch_done(s, q, "dirty row");
}

int cb_db_scratch_dirty_journal(struct cb_db_scratch *s, long long from, long long to,
				int skip_kind)
{
	sqlite3_stmt *q = s->q[S_DIRTY_JOURNAL];

	if (!q)
		return cb_error_set(ENOENT, "turn scratch: this database has no journal");
	q = scratch_q(s, S_DIRTY_JOURNAL);
	sqlite3_bind_int64(q, 1, from);
	sqlite3_bind_int64(q, 2, to);
	sqlite3_bind_int(q, 3, skip_kind);
	sqlite3_bind_int(q, 4, CB_CHANGE_WRITE);
	sqlite3_bind_int(q, 5, CB_CHANGE_META);
	return scratch_done(s, q, "read journal");
}

void cb_db_scratch_rows_free(struct cb_scratch_row *rows, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		free(rows[i].path);
		free(rows[i].comm);
		rows[i].path = rows[i].comm = NULL;
	}
}

/* Up to max rows of page statement which after after, copied (the statement is done before
 * the caller does anything else with the connection). */
static int scratch_page(struct cb_db_scratch *s, int which, const char *after,
			struct cb_scratch_row *rows, size_t max)
{
	sqlite3_stmt *q = scratch_q(s, which);
	size_t n = 0;
	int rc;

	sqlite3_bind_text(q, 1, after ? after : "", -1, SQLITE_TRANSIENT);
	sqlite3_bind_int64(q, 2, (sqlite3_int64)max);
	while (n < max && (rc = sqlite3_step(q)) == SQLITE_ROW) {
		const char *comm = (const char *)sqlite3_column_text(q, 3);
		struct cb_scratch_row *r = &rows[n];

		r->path = strdup((const char *)sqlite3_column_text(q, 0));
		r->subtree = sqlite3_column_int(q, 1);
		r->pid = (pid_t)sqlite3_column_int64(q, 2);
		r->comm = comm ? strdup(comm) : NULL;
		r->same_names = !sqlite3_column_int(q, 4);
		n++;
		if (!r->path || (comm && !r->comm)) {
			sqlite3_reset(q);
			cb_db_scratch_rows_free(rows, n);
			return cb_error_set(ENOMEM, "turn scratch: out of memory");
		}
	}
	if (n < max && rc != SQLITE_DONE) {
		int ret = scratch_fail(s, "read page");

		sqlite3_reset(q);
		cb_db_scratch_rows_free(rows, n);
		return ret;
	}
	sqlite3_reset(q);
	return (int)n;
}

int cb_db_scratch_dirty_page(struct cb_db_scratch *s, const char *after,
			     struct cb_scratch_row *rows, size_t max)
{
	return scratch_page(s, S_DIRTY_PAGE, after, rows, max);
}

int cb_db_scratch_path_page(struct cb_db_scratch *s, const char *after, struct cb_scratch_row *rows,
			    size_t max)
{
	return scratch_page(s, S_PATH_PAGE, after, rows, max);
}

int cb_db_scratch_path_add(struct cb_db_scratch *s, const char *path, pid_t pid, const char *comm)
{
	sqlite3_stmt *q = scratch_q(s, S_PATH_ADD);

	sqlite3_bind_text(q, 1, path, -1, SQLITE_STATIC);
	sqlite3_bind_int64(q, 2, pid);
	if (comm)
		sqlite3_bind_text(q, 3, comm, -1, SQLITE_STATIC);
	return scratch_done(s, q, "path");
}

int cb_db_scratch_path_has(struct cb_db_scratch *s, const char *path)
{
	sqlite3_stmt *q = scratch_q(s, S_PATH_HAS);
	int rc;

	sqlite3_bind_text(q, 1, path, -1, SQLITE_STATIC);
	rc = sqlite3_step(q);
	sqlite3_reset(q);
	return rc == SQLITE_ROW ? 1 : rc == SQLITE_DONE ? 0 : scratch_fail(s, "path lookup");
}

int cb_db_scratch_res_put(struct cb_db_scratch *s, const struct cb_entry *old,
			  const struct cb_entry *now, int changed)
{
	sqlite3_stmt *q = scratch_q(s, S_RES_PUT);

	cb_db_turns_bind_entry(q, 1, 2, now);
	cb_db_turns_bind_meta(q, 17, now);
	sqlite3_bind_int(q, 10, changed);
	sqlite3_bind_int(q, 11, old->type);
	sqlite3_bind_int(q, 12, (int)old->mode);
	sqlite3_bind_int64(q, 13, old->size);
	if (old->type == CB_ENTRY_FILE || old->type == CB_ENTRY_SYMLINK) {
		sqlite3_bind_blob(q, 14, old->sha256, CB_SHA256_LEN, SQLITE_STATIC);
		sqlite3_bind_blob(q, 15, old->xxh3, CB_XXH128_LEN, SQLITE_STATIC);
	}
	if (old->target)
		sqlite3_bind_text(q, 16, old->target, -1, SQLITE_STATIC);
	if (old->type == CB_ENTRY_FILE && old->link)
		sqlite3_bind_text(q, 23, old->link, -1, SQLITE_STATIC);
	return scratch_done(s, q, "entry");
}

int cb_db_scratch_res_type(struct cb_db_scratch *s, const char *path, int *type)
{
	sqlite3_stmt *q = scratch_q(s, S_RES_TYPE);
	int rc;

	sqlite3_bind_text(q, 1, path, -1, SQLITE_STATIC);
	rc = sqlite3_step(q);
	if (rc == SQLITE_ROW)
		*type = sqlite3_column_int(q, 0);
	sqlite3_reset(q);
	return rc == SQLITE_ROW ? 1 : rc == SQLITE_DONE ? 0 : scratch_fail(s, "entry lookup");
}

int cb_db_scratch_record(struct cb_db_scratch *s, long long turn, long long *nchanged)
{
	sqlite3_stmt *q = scratch_q(s, S_REC_DELTA);
	int ret;

	sqlite3_bind_int64(q, 1, turn);
	ret = scratch_done(s, q, "record deltas");
	if (!ret)
		ret = scratch_done(s, scratch_q(s, S_REC_MAP_DEL), "map deletes");
	if (!ret)
		ret = scratch_done(s, scratch_q(s, S_REC_MAP_PUT), "map rows");
	if (!ret) {
		q = scratch_q(s, S_REC_COUNT);
		if (sqlite3_step(q) == SQLITE_ROW)
			*nchanged = sqlite3_column_int64(q, 0);
		else
			ret = scratch_fail(s, "count");
		sqlite3_reset(q);
	}
	return ret;
}

int cb_db_scratch_changed_count(struct cb_db_scratch *s, long long *n)
{
	sqlite3_stmt *q = scratch_q(s, S_REC_ANY);
	int ret = 0;

	if (sqlite3_step(q) == SQLITE_ROW)
		*n = sqlite3_column_int64(q, 0);
	else
		ret = scratch_fail(s, "count");
	sqlite3_reset(q);
	return ret;
}

int cb_db_scratch_changes(struct cb_db_scratch *s,
			  int (*fn)(const struct cb_entry *old, const struct cb_entry *now, void *),
			  void *arg)
{
	sqlite3_stmt *q = scratch_q(s, S_RES_CHANGED);
	struct cb_entry old, now;
	int ret = 0, rc;

	while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
		cb_db_turns_column_entry(q, &now);
		cb_db_turns_column_meta(q, 15, &now);
		memset(&old, 0, sizeof(old));
		old.path = now.path;
		old.type = sqlite3_column_int(q, 9);
		old.mode = (unsigned)sqlite3_column_int(q, 10);
		old.size = sqlite3_column_int64(q, 11);
		if (sqlite3_column_bytes(q, 12) == CB_SHA256_LEN)
			memcpy(old.sha256, sqlite3_column_blob(q, 12), CB_SHA256_LEN);
		if (sqlite3_column_bytes(q, 13) == CB_XXH128_LEN)
			memcpy(old.xxh3, sqlite3_column_blob(q, 13), CB_XXH128_LEN);
		old.target = (char *)sqlite3_column_text(q, 14);
		ret = fn(&old, &now, arg);
		if (ret)
			goto out;
	}
	if (rc != SQLITE_DONE)
		ret = scratch_fail(s, "changes");
out:
	sqlite3_reset(q);
	return ret;
}

int cb_db_scratch_linked(struct cb_db_scratch *s,
			 int (*fn)(const struct cb_entry *now, const char *o_link, void *),
			 void *arg)
{
	sqlite3_stmt *q = scratch_q(s, S_LINKED);
	struct cb_entry now;
	int ret = 0, rc;

	while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
		cb_db_turns_column_entry(q, &now);
		cb_db_turns_column_meta(q, 9, &now);
		if ((ret = fn(&now, (const char *)sqlite3_column_text(q, 15), arg)))
			break;
	}
	if (!ret && rc != SQLITE_DONE)
		ret = scratch_fail(s, "linked entries");
	sqlite3_reset(q);
	return ret;
}

int cb_db_scratch_set_link(struct cb_db_scratch *s, const char *path, const char *link)
{
	sqlite3_stmt *q = scratch_q(s, S_SET_LINK);

	sqlite3_bind_text(q, 1, path, -1, SQLITE_STATIC);
	if (link)
		sqlite3_bind_text(q, 2, link, -1, SQLITE_STATIC);
	return scratch_done(s, q, "link group");
}

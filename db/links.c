/* The names of multiply-linked upper files, by upper inode number: a change through one name
 * changes every name, also those the overlay has not looked up since it was mounted. */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cowbox/error.h"
#include "db.h"

/* Rows are hints, never trusted: a reader checks that a path still names the inode, so a
 * stale row (an unlink, a rename's source) costs a stat and a missing one a missed mark. */

/* Runs sql with its parameters :ino, :a, :b; for each row (ino, path), fn. A statement run
 * on every rename or first write is kept in *keep (the handle's), the rest prepared each
 * time. Caller holds sql_lock. */
static int links_run(struct cb_db *db, sqlite3_stmt **keep, const char *sql, unsigned long long ino,
		     const char *a, const char *b,
		     int (*fn)(unsigned long long ino, const char *path, void *arg), void *arg,
		     const char *what)
{
	sqlite3_stmt *st = keep ? *keep : NULL;
	int rc = SQLITE_OK;

	CB_ASSERT_HELD(&db->sql_lock);
	if (!st)
		rc = sqlite3_prepare_v3(db->sql, sql, -1, keep ? SQLITE_PREPARE_PERSISTENT : 0, &st,
					NULL);
	if (rc != SQLITE_OK)
		return cb_db_error(db, rc, what);
	if (keep)
		*keep = st;
	for (int i = 1; i <= sqlite3_bind_parameter_count(st); i++) {
		const char *name = sqlite3_bind_parameter_name(st, i);

		if (name && !strcmp(name, ":ino"))
			sqlite3_bind_int64(st, i, (sqlite3_int64)ino);
		else if (name && !strcmp(name, ":a"))
			sqlite3_bind_text(st, i, a, -1, SQLITE_STATIC);
		else if (name && !strcmp(name, ":b"))
			sqlite3_bind_text(st, i, b, -1, SQLITE_STATIC);
	}
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		int stop = fn ? fn((unsigned long long)sqlite3_column_int64(st, 0),
				   (const char *)sqlite3_column_text(st, 1), arg)
			      : 0;

		if (stop) {
			rc = stop;
			goto out;
		}
	}
	rc = rc == SQLITE_DONE ? 0 : cb_db_error(db, rc, what);
out:
	if (keep) {
		sqlite3_reset(st);
		sqlite3_clear_bindings(st);
	} else {
		sqlite3_finalize(st);
	}
	return rc;
}

/* Whether the table has a row, asked once per handle (then kept by the writers): an overlay
 * without hard links pays nothing per rename. Caller holds sql_lock. */
static int links_found(unsigned long long ino, const char *path, void *arg)
{
	(void)ino;
	(void)path;
	*(int *)arg = 1;
	return 0;
}

static int links_any(struct cb_db *db)
{
	int any = 0;

	if (db->links_any < 0 && !links_run(db, NULL, "SELECT ino, path FROM link_names LIMIT 1", 0,
					    NULL, NULL, links_found, &any, "link names"))
		db->links_any = any;
	return db->links_any != 0; /* unknown (a failed read): asked */
}

int cb_links_add(struct cb_db *db, unsigned long long ino, const char *path)
{
	int rc;

	cb_mutex_lock(&db->sql_lock);
	rc = links_run(db, NULL, "INSERT OR IGNORE INTO link_names (ino, path) VALUES (:ino, :a)",
		       ino, path, NULL, NULL, NULL, "record a link name");
	if (!rc)
		db->links_any = 1;
	cb_mutex_unlock(&db->sql_lock);
	return rc;
}

int cb_links_names(struct cb_db *db, unsigned long long ino,
		   int (*fn)(unsigned long long ino, const char *path, void *arg), void *arg)
{
	int rc = 0;

	cb_mutex_lock(&db->sql_lock);
	if (links_any(db))
		rc = links_run(db, &db->st_links_names,
			       "SELECT ino, path FROM link_names WHERE ino = :ino ORDER BY path",
			       ino, NULL, NULL, fn, arg, "read link names");
	cb_mutex_unlock(&db->sql_lock);
	return rc;
}

int cb_links_forget(struct cb_db *db, unsigned long long ino, const char *path)
{
	int rc = 0;

	cb_mutex_lock(&db->sql_lock);
	if (links_any(db))
		rc = links_run(db, NULL, "DELETE FROM link_names WHERE ino = :ino AND path = :a",
			       ino, path, NULL, NULL, NULL, "forget a link name");
	cb_mutex_unlock(&db->sql_lock);
	return rc;
}

/* The rows at or below a (a path, then '/' and more; '0' is the byte after '/'). */
#define LINKS_BELOW " (path = :a OR (path > :a || '/' AND path < :a || '0'))"

int cb_links_rename(struct cb_db *db, const char *from, const char *to)
{
	int rc = 0, below = 0;

	cb_mutex_lock(&db->sql_lock);
	/* asked first: most renames have no row below them, and a read takes no write lock */
	if (links_any(db))
		rc = links_run(db, &db->st_links_below,
			       "SELECT ino, path FROM link_names WHERE" LINKS_BELOW " LIMIT 1", 0,
			       from, NULL, links_found, &below, "rename link names");
	/* substr counts characters, as length does; both cut where from's bytes end (the next
	 * byte in path is '/', never a UTF-8 continuation byte) */
	if (!rc && below)
		rc = links_run(db, NULL,
			       "INSERT OR IGNORE INTO link_names (ino, path) SELECT ino, :b || "
			       "substr(path, length(:a) + 1) FROM link_names WHERE" LINKS_BELOW,
			       0, from, to, NULL, NULL, "rename link names");
	cb_mutex_unlock(&db->sql_lock);
	return rc < 0 ? rc : below;
}

int cb_links_drop(struct cb_db *db, const char *path)
{
	int rc = 0;

	cb_mutex_lock(&db->sql_lock);
	if (links_any(db))
		rc = links_run(db, NULL, "DELETE FROM link_names WHERE" LINKS_BELOW, 0, path, NULL,
			       NULL, NULL, "drop link names");
	cb_mutex_unlock(&db->sql_lock);
	return rc;
}

/* Opening and closing meta.db: pragmas, the migration runner, key/value metadata and the
 * error messages that name the file. */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cowbox/error.h"
#include "db.h"

/* SQLite result codes mapped to the errno a caller can act on. */
static int db_errno(int rc)
{
	switch (rc & 0xff) {
	case SQLITE_BUSY:
	case SQLITE_LOCKED:
		return EBUSY;
	case SQLITE_NOMEM:
		return ENOMEM;
	case SQLITE_READONLY:
	case SQLITE_PERM:
		return EACCES;
	case SQLITE_CANTOPEN:
		return ENOENT;
	case SQLITE_FULL:
		return ENOSPC;
	case SQLITE_CORRUPT:
	case SQLITE_NOTADB:
		return EILSEQ;
	default:
		return EIO;
	}
}

/* Messages look like "meta.db /x/meta.db: migrate: file is not a database". */
/* See db.h. */
void cb_db_damage_hint(const char *path, int rc, char *buf, size_t size)
{
	char dir[4096], *slash;
	const char *ref;

	buf[0] = '\0';
	if ((rc & 0xff) != SQLITE_CORRUPT && (rc & 0xff) != SQLITE_NOTADB)
		return;
	/* <home>/workspaces/<ref>/meta.db: the ref is the directory's name */
	snprintf(dir, sizeof(dir), "%s", path ? path : "");
	if ((slash = strrchr(dir, '/')))
		*slash = '\0';
	ref = (slash = strrchr(dir, '/')) ? slash + 1 : "REF";
	snprintf(buf, size,
		 " (the file is damaged: run `cowbox fsck --repair %s`, which keeps it aside and "
		 "rebuilds it from its readable rows and upper/)",
		 ref[0] ? ref : "REF");
}

int cb_db_error(struct cb_db *db, int rc, const char *what)
{
	const char *why = db && db->sql ? sqlite3_errmsg(db->sql) : sqlite3_errstr(rc);
	char hint[4400];

	cb_db_damage_hint(db ? db->path : NULL, rc, hint, sizeof(hint));
	if (!hint[0] && db && db->sql)
		cb_db_damage_hint(db->path, sqlite3_errcode(db->sql), hint, sizeof(hint));
	return cb_error_set(db_errno(rc), "database %s: %s: %s%s", db ? db->path : "?", what, why,
			    hint);
}

static int db_exec(struct cb_db *db, const char *sql, const char *what)
{
	int rc = sqlite3_exec(db->sql, sql, NULL, NULL, NULL);

	return rc == SQLITE_OK ? 0 : cb_db_error(db, rc, what);
}

/* The schema version of the open file into *out. */
static int db_user_version(struct cb_db *db, long long *out)
{
	sqlite3_stmt *st = NULL;
	int rc = sqlite3_prepare_v2(db->sql, "PRAGMA user_version", -1, &st, NULL);

	if (rc != SQLITE_OK)
		return cb_db_error(db, rc, "read schema version");
	rc = sqlite3_step(st);
	if (rc == SQLITE_ROW) {
		*out = sqlite3_column_int64(st, 0);
		rc = 0;
	} else {
		rc = cb_db_error(db, rc, "read schema version");
	}
	sqlite3_finalize(st);
	return rc;
}

/* Each migration and its user_version bump commit together, so a crash leaves the file at
 * one version or the next, never between. The version is read inside each step's write
 * transaction: two processes opening a new file at once (a create and an `image prune`
 * listing workspaces) would otherwise both run the same step, and the second fail with
 * "table meta already exists". */
static int cb_db_migrate(struct cb_db *db)
{
	long long version = 0;
	char bump[64];
	int rc = db_user_version(db, &version);

	/* Current already (every open but a file's first): no write lock taken. */
	if (rc || version == (long long)cb_db_migration_count)
		return rc;
	for (;;) {
		rc = db_exec(db, "BEGIN IMMEDIATE", "migrate");
		if (rc)
			return rc;
		rc = db_user_version(db, &version);
		if (!rc && version > (long long)cb_db_migration_count)
			rc = cb_error_set(
			    EPROTO,
			    "database %s: schema version %lld is newer than this cowbox (%zu)",
			    db->path, version, cb_db_migration_count);
		if (!rc && version == (long long)cb_db_migration_count) {
			rc = db_exec(db, "COMMIT", "migrate");
			break;
		}
		snprintf(bump, sizeof(bump), "PRAGMA user_version = %lld", version + 1);
		if (!rc)
			rc = db_exec(db, cb_db_migrations[version], "migrate");
		if (!rc)
			rc = db_exec(db, bump, "migrate");
		if (!rc)
			rc = db_exec(db, "COMMIT", "migrate");
		if (rc)
			break;
	}
	if (rc)
		sqlite3_exec(db->sql, "ROLLBACK", NULL, NULL, NULL);
	return rc;
}

/* The journal's own tables: a file at a schema version that has them must have them (a
 * table dropped by damage is reported, not quietly taken as empty). */
static int db_tables_check(struct cb_db *db)
{
	static const char *const tables[] = {"meta", "journal"};
	sqlite3_stmt *st = NULL;
	int rc = sqlite3_prepare_v2(
	    db->sql, "SELECT 1 FROM sqlite_master WHERE type='table' AND name=?1", -1, &st, NULL);

	if (rc != SQLITE_OK)
		return cb_db_error(db, rc, "schema check");
	rc = 0;
	for (size_t i = 0; i < sizeof(tables) / sizeof(tables[0]) && !rc; i++) {
		sqlite3_reset(st);
		sqlite3_bind_text(st, 1, tables[i], -1, SQLITE_STATIC);
		if (sqlite3_step(st) != SQLITE_ROW)
			rc = cb_error_set(EUCLEAN,
					  "database %s is damaged: its table %s is missing; "
					  "'cowbox fsck REF --repair' rebuilds it as a workspace "
					  "with no turns, keeping the files",
					  db->path, tables[i]);
	}
	sqlite3_finalize(st);
	return rc;
}

static int db_prepare(struct cb_db *db, const char *sql, sqlite3_stmt **st)
{
	int rc = sqlite3_prepare_v3(db->sql, sql, -1, SQLITE_PREPARE_PERSISTENT, st, NULL);

	return rc == SQLITE_OK ? 0 : cb_db_error(db, rc, "prepare");
}

/* The pragmas come first: journal_mode=WAL is also the first read of the file, so a file that
 * is not a database is reported here with its name. */
static int db_open(const char *path, int synced, struct cb_db **out)
{
	struct cb_db *db;
	int rc;

	*out = NULL;
	db = calloc(1, sizeof(*db));
	if (!db)
		return cb_error_set(ENOMEM, "database %s: out of memory", path);
	db->path = strdup(path);
	cb_mutex_init(&db->sql_lock, NULL);
	cb_mutex_init(&db->queue_lock, NULL);
	db->log_fd = -1;
	db->turn = 1;
	db->links_any = -1;
	if (!db->path) {
		rc = cb_error_set(ENOMEM, "database %s: out of memory", path);
		goto fail;
	}
	rc = sqlite3_open_v2(path, &db->sql,
			     SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX |
				 SQLITE_OPEN_NOFOLLOW,
			     NULL);
	if (rc != SQLITE_OK) {
		rc = cb_db_error(db, rc, "open");
		goto fail;
	}
	sqlite3_extended_result_codes(db->sql, 1);
	/* A long write of another connection (a snapshot) delays a mark rather than failing the
	 * filesystem operation waiting on it. */
	sqlite3_busy_timeout(db->sql, 30000);
	/* SQLite quietly falls back to read-only when the file cannot be written; a journal
	 * that cannot record anything must fail here, not at the first mark. */
	if (sqlite3_db_readonly(db->sql, "main") == 1) {
		rc = cb_error_set(EACCES, "database %s: the file is not writable", path);
		goto fail;
	}
	/* Unsynced: OFF first, or making a new file WAL syncs its journal, directory and file. */
	rc = synced ? 0 : db_exec(db, "PRAGMA synchronous=OFF", "set synchronous");
	if (!rc)
		rc = db_exec(db, "PRAGMA journal_mode=WAL", "set WAL mode");
	if (!rc && synced)
		rc = db_exec(db, "PRAGMA synchronous=NORMAL", "set synchronous");
	if (!rc)
		rc = db_exec(db, "PRAGMA foreign_keys=ON", "set foreign keys");
	if (!rc)
		rc = cb_db_migrate(db);
	if (!rc)
		rc = db_tables_check(db);
	if (!rc)
		rc = cb_db_turns_schema_check(db->sql, path);
	if (!rc)
		rc = db_prepare(db, "SELECT value FROM meta WHERE key = ?1", &db->st_meta_get);
	if (!rc)
		rc = db_prepare(db,
				"INSERT INTO meta (key, value) VALUES (?1, ?2) "
				"ON CONFLICT (key) DO UPDATE SET value = excluded.value",
				&db->st_meta_set);
	if (!rc)
		rc = cb_journal_init(db);
	if (rc)
		goto fail;
	*out = db;
	return 0;
fail:
	cb_db_close(db);
	return rc;
}

int cb_db_open(const char *path, struct cb_db **out)
{
	return db_open(path, 1, out);
}

int cb_db_open_unsynced(const char *path, struct cb_db **out)
{
	return db_open(path, 0, out);
}

void cb_db_close(struct cb_db *db)
{
	if (!db)
		return;
	cb_journal_fini(db);
	sqlite3_finalize(db->st_meta_get);
	sqlite3_finalize(db->st_meta_set);
	sqlite3_finalize(db->st_links_below);
	sqlite3_finalize(db->st_links_names);
	/* sqlite3_close_v2 checkpoints the WAL when this is the last connection. */
	sqlite3_close_v2(db->sql);
	cb_mutex_destroy(&db->queue_lock);
	cb_mutex_destroy(&db->sql_lock);
	free(db->path);
	free(db);
}

/* Copies the value out while the statement is still positioned on the row. */
int cb_db_meta_get(struct cb_db *db, const char *key, char **value)
{
	int rc;

	*value = NULL;
	cb_mutex_lock(&db->sql_lock);
	sqlite3_bind_text(db->st_meta_get, 1, key, -1, SQLITE_STATIC);
	rc = sqlite3_step(db->st_meta_get);
	if (rc == SQLITE_ROW) {
		const char *v = (const char *)sqlite3_column_text(db->st_meta_get, 0);

		*value = strdup(v ? v : "");
		rc = *value ? 0 : cb_error_set(ENOMEM, "database %s: out of memory", db->path);
	} else if (rc == SQLITE_DONE) {
		rc = cb_error_set(ENOENT, "database %s: no '%s' recorded", db->path, key);
	} else {
		rc = cb_db_error(db, rc, "read meta");
	}
	sqlite3_reset(db->st_meta_get);
	sqlite3_clear_bindings(db->st_meta_get);
	cb_mutex_unlock(&db->sql_lock);
	return rc;
}

long long cb_db_latest_turn(struct cb_db *db)
{
	sqlite3_stmt *st = NULL;
	long long turn = -1;
	int rc;

	cb_mutex_lock(&db->sql_lock);
	rc = sqlite3_prepare_v2(db->sql, "SELECT COALESCE(MAX(turn), 0) FROM turns", -1, &st, NULL);
	if (rc == SQLITE_OK && (rc = sqlite3_step(st)) == SQLITE_ROW)
		turn = sqlite3_column_int64(st, 0);
	else
		cb_db_error(db, rc, "read the latest turn");
	sqlite3_finalize(st);
	cb_mutex_unlock(&db->sql_lock);
	return turn;
}

int cb_db_meta_set(struct cb_db *db, const char *key, const char *value)
{
	int rc;

	cb_mutex_lock(&db->sql_lock);
	sqlite3_bind_text(db->st_meta_set, 1, key, -1, SQLITE_STATIC);
	sqlite3_bind_text(db->st_meta_set, 2, value, -1, SQLITE_STATIC);
	rc = sqlite3_step(db->st_meta_set);
	rc = rc == SQLITE_DONE ? 0 : cb_db_error(db, rc, "write meta");
	sqlite3_reset(db->st_meta_set);
	sqlite3_clear_bindings(db->st_meta_set);
	cb_mutex_unlock(&db->sql_lock);
	return rc;
}

int cb_db_meta_del(struct cb_db *db, const char *key)
{
	sqlite3_stmt *st = NULL;
	int rc;

	cb_mutex_lock(&db->sql_lock);
	rc = sqlite3_prepare_v2(db->sql, "DELETE FROM meta WHERE key = ?1", -1, &st, NULL);
	if (rc == SQLITE_OK) {
		sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
		rc = sqlite3_step(st);
	}
	rc = rc == SQLITE_DONE ? 0 : cb_db_error(db, rc, "delete meta");
	sqlite3_finalize(st);
	cb_mutex_unlock(&db->sql_lock);
	return rc;
}

/* Rebuilding a damaged meta.db from what SQLite itself can still read of it: each table copied
 * row by row, forward to its first damaged page and backward from its end to it. */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cowbox/error.h"
#include "cowbox/journal.h"
#include "db.h"

/* Debian 12's SQLite 3.40 has neither the recover extension (sqlite3_recover_*) nor the
 * sqlite_dbpage table that the sqlite3 shell's .recover needs ("no such table:
 * sqlite_dbpage"), so no page is read here by hand either: SQLite's own b-tree cursors read
 * every row they can reach. A scan in key order stops at the first page that is damaged; a
 * second one from the other end reads back to it. What lies between two damaged pages of a
 * table is lost, and said so.
 *
 * The tables and their keys (the order of a scan). The turn map and the journal are not
 * copied: the map is rebuilt from the rows kept, the journal from upper/ (cb_ws_fsck); nor
 * is the base cache, a hint whose every miss is only a rehash. */
static const struct {
	const char *table, *key;
} salvage_tables[] = {
    {"meta", "key"},	  {"turns", "turn"},	{"turn_delta", "path, turn"},
    {"turn_meta", "key"}, {"base_map", "path"},
};

/* "INSERT OR IGNORE INTO main.T (c1, ...) VALUES (?1, ...)" for the columns of sel. */
static char *salvage_insert_sql(sqlite3_stmt *sel, const char *table, int replace)
{
	int n = sqlite3_column_count(sel);
	size_t len = 64 + strlen(table);
	char *sql, *p;

	for (int i = 0; i < n; i++)
		len += strlen(sqlite3_column_name(sel, i)) + 12;
	if (!(sql = malloc(len)))
		return NULL;
	p = sql +
	    sprintf(sql, "INSERT OR %s INTO main.%s (", replace ? "REPLACE" : "IGNORE", table);
	for (int i = 0; i < n; i++)
		p += sprintf(p, "%s\"%s\"", i ? ", " : "", sqlite3_column_name(sel, i));
	p += sprintf(p, ") VALUES (");
	for (int i = 0; i < n; i++)
		p += sprintf(p, "%s?%d", i ? ", " : "", i + 1);
	sprintf(p, ")");
	return sql;
}

/* One scan of dmg.table (desc: from its end) into main.table: rows copied into *rows; 1 when
 * it met a damaged page, 0 when it read to the end (or, backward, to a row the forward scan
 * had), -errno when the new file could not take a row. */
static int salvage_scan(sqlite3 *src, struct cb_db *db, const char *table, const char *key,
			int desc, long long *rows)
{
	char sql[256], *ins_sql = NULL;
	sqlite3_stmt *sel = NULL, *ins = NULL;
	int rc, damaged = 0, replace = !strcmp(table, "meta");

	snprintf(sql, sizeof(sql), "SELECT * FROM %s ORDER BY %s%s", table, key,
		 desc ? " DESC" : "");
	if (desc) /* "path, turn DESC" would mix orders: each key column descends */
		for (char *c = strchr(sql, ','); c; c = strchr(c + 1, ','))
			if (strncmp(c, ", turn", 6) == 0) {
				snprintf(sql, sizeof(sql),
					 "SELECT * FROM %s ORDER BY path DESC, turn DESC", table);
				break;
			}
	if (sqlite3_prepare_v2(src, sql, -1, &sel, NULL) != SQLITE_OK)
		return 1; /* the table itself is unreadable (its schema or root page) */
	while ((rc = sqlite3_step(sel)) == SQLITE_ROW) {
		if (!ins) {
			if (!(ins_sql = salvage_insert_sql(sel, table, replace))) {
				rc = cb_error_set(ENOMEM, "salvage: out of memory");
				goto out;
			}
			if (sqlite3_prepare_v2(db->sql, ins_sql, -1, &ins, NULL) != SQLITE_OK) {
				rc = cb_db_error(db, sqlite3_errcode(db->sql), "salvage");
				goto out;
			}
		}
		for (int i = 0; i < sqlite3_column_count(sel); i++)
			sqlite3_bind_value(ins, i + 1, sqlite3_column_value(sel, i));
		if ((rc = sqlite3_step(ins)) != SQLITE_DONE) {
			rc = cb_error_set(EIO, "salvage: copy a row of %s into %s: %s (%d)", table,
					  db->path, sqlite3_errmsg(db->sql), rc);
			goto out;
		}
		sqlite3_reset(ins);
		if (desc && !replace && sqlite3_changes(db->sql) == 0)
			break; /* back to where the forward scan got */
		(*rows)++;
	}
	damaged = rc != SQLITE_ROW && rc != SQLITE_DONE;
	rc = damaged;
out:
	sqlite3_finalize(sel);
	sqlite3_finalize(ins);
	free(ins_sql);
	return rc;
}

static long long salvage_int(struct cb_db *db, const char *sql, long long dflt)
{
	sqlite3_stmt *s = NULL;
	long long v = dflt;

	if (sqlite3_prepare_v2(db->sql, sql, -1, &s, NULL) == SQLITE_OK &&
	    sqlite3_step(s) == SQLITE_ROW && sqlite3_column_type(s, 0) != SQLITE_NULL)
		v = sqlite3_column_int64(s, 0);
	sqlite3_finalize(s);
	return v;
}

/* The turns kept (0..kept) and the rest of the database made to agree with them. */
static int salvage_trim(struct cb_db *db, struct cb_db_salvage *res)
{
	char sql[1024];
	int base_map_ok = !res->lost_base_map &&
			  salvage_int(db, "SELECT value FROM turn_meta WHERE key = 'base_map'", 0);
	long long t;

	res->latest = salvage_int(db,
				  "SELECT max(m) FROM (SELECT max(turn) AS m FROM turns UNION ALL "
				  "SELECT max(turn) FROM turn_delta)",
				  0);
	res->oldest = salvage_int(db, "SELECT min(turn) FROM turns WHERE turn > 0", 1);
	if (res->oldest < 1)
		res->oldest = 1;
	/* The first turn that is missing, or holds fewer rows than it recorded (a prune only
	 * adds rows to the oldest turn it keeps), ends what can be trusted: a later turn's tree
	 * is its own rows over the ones before. */
	res->kept = res->oldest - 1;
	for (t = res->oldest; t <= res->latest; t++) {
		snprintf(sql, sizeof(sql),
			 "SELECT (SELECT count(*) FROM turn_delta WHERE turn = %lld) >= changes "
			 "FROM turns WHERE turn = %lld",
			 t, t);
		if (salvage_int(db, sql, 0) != 1)
			break;
		res->kept = t;
	}
	if (res->kept < res->oldest)
		res->kept = 0; /* nothing after the base can be trusted */
	snprintf(sql, sizeof(sql),
		 "DELETE FROM turns WHERE turn > %lld;"
		 "DELETE FROM turn_delta WHERE turn > %lld;"
		 "DELETE FROM turn_map;"
		 "%s"
		 "INSERT OR REPLACE INTO turn_map (path, type, mode, size, sha256, xxh3, target, "
		 "pid, comm, mtime_ns, uid, gid, xattrs, link, ino) SELECT path, type, mode, size, "
		 "sha256, xxh3, target, pid, comm, mtime_ns, uid, gid, xattrs, link, ino FROM "
		 "turn_delta d WHERE d.turn <= %lld AND d.turn = (SELECT max(turn) FROM "
		 "turn_delta x WHERE x.path = d.path AND x.turn <= %lld);"
		 "DELETE FROM turn_map WHERE type = 0;"
		 "INSERT OR REPLACE INTO turn_meta VALUES('map_turn', %lld);"
		 "INSERT OR REPLACE INTO meta (key, value) VALUES('turn', '%lld');",
		 res->kept, res->kept,
		 base_map_ok ? "INSERT INTO turn_map SELECT * FROM base_map;" : "", res->kept,
		 res->kept, base_map_ok ? res->kept : -1, res->kept + 1);
	if (!base_map_ok) {
		/* a base map with holes is worse than none: built from the base when needed */
		if (sqlite3_exec(
			db->sql,
			"DELETE FROM base_map; DELETE FROM turn_meta WHERE key = 'base_map'", NULL,
			NULL, NULL) != SQLITE_OK)
			return cb_db_error(db, sqlite3_errcode(db->sql), "salvage: base map");
	}
	if (sqlite3_exec(db->sql, sql, NULL, NULL, NULL) != SQLITE_OK)
		return cb_db_error(db, sqlite3_errcode(db->sql), "salvage: keep the good turns");
	return 0;
}

/* See db.h. */
int cb_db_salvage(struct cb_db *db, const char *damaged, struct cb_db_salvage *res)
{
	sqlite3 *src = NULL;
	sqlite3_stmt *st = NULL;
	int rc = 0;

	memset(res, 0, sizeof(*res));
	/* A connection of its own, read-only: an error that SQLite meets in the damaged file
	 * (which may end a transaction of that connection) never touches the new one's. */
	if (sqlite3_open_v2(damaged, &src, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK ||
	    sqlite3_prepare_v2(src,
			       "SELECT count(*) FROM sqlite_schema WHERE name IN ('meta', 'turns')",
			       -1, &st, NULL) != SQLITE_OK ||
	    sqlite3_step(st) != SQLITE_ROW || sqlite3_column_int(st, 0) == 0) {
		/* not even the schema (or an empty file): nothing to copy */
		sqlite3_finalize(st);
		res->unreadable = 1;
		goto out;
	}
	sqlite3_finalize(st);
	cb_mutex_lock(&db->sql_lock);
	if (sqlite3_exec(db->sql, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK) {
		rc = cb_db_error(db, sqlite3_errcode(db->sql), "salvage: begin");
		goto unlock;
	}
	/* the rows copied may carry a file's metadata, which a new file's tables lack yet */
	if ((rc = cb_db_turns_add_meta_columns(db->sql, damaged)) < 0) {
		sqlite3_exec(db->sql, "ROLLBACK", NULL, NULL, NULL);
		goto unlock;
	}
	for (size_t i = 0; i < sizeof(salvage_tables) / sizeof(salvage_tables[0]) && rc >= 0; i++) {
		const char *tb = salvage_tables[i].table, *key = salvage_tables[i].key;
		int lost = salvage_scan(src, db, tb, key, 0, &res->rows);

		if (lost == 1)
			lost = salvage_scan(src, db, tb, key, 1, &res->rows) < 0 ? -EIO : 1;
		if (lost < 0) {
			rc = lost;
			break;
		}
		if (lost) {
			res->damaged_tables++;
			if (!strcmp(tb, "base_map"))
				res->lost_base_map = 1;
			if (!strcmp(tb, "meta"))
				res->lost_meta = 1;
		}
	}
	if (rc >= 0)
		rc = salvage_trim(db, res);
	if (rc >= 0 && sqlite3_exec(db->sql, "COMMIT", NULL, NULL, NULL) != SQLITE_OK)
		rc = cb_db_error(db, sqlite3_errcode(db->sql), "salvage: commit");
	if (rc < 0)
		sqlite3_exec(db->sql, "ROLLBACK", NULL, NULL, NULL);
unlock:
	cb_mutex_unlock(&db->sql_lock);
out:
	sqlite3_close(src);
	return rc < 0 ? rc : 0;
}

/* See db.h. */
int cb_db_quick_check(struct cb_db *db)
{
	sqlite3_stmt *s = NULL;
	char first[512] = "";
	int rc, bad = 0;

	cb_mutex_lock(&db->sql_lock);
	rc = sqlite3_prepare_v2(db->sql, "PRAGMA quick_check(1)", -1, &s, NULL);
	if (rc == SQLITE_OK && (rc = sqlite3_step(s)) == SQLITE_ROW) {
		const char *v = (const char *)sqlite3_column_text(s, 0);

		bad = !v || strcmp(v, "ok");
		snprintf(first, sizeof(first), "%s", v ? v : "?");
		rc = SQLITE_OK;
	} else {
		bad = 1;
		snprintf(first, sizeof(first), "%s", sqlite3_errmsg(db->sql));
	}
	sqlite3_finalize(s);
	cb_mutex_unlock(&db->sql_lock);
	if (!bad)
		return 0;
	return cb_error_set(EILSEQ, "database %s is damaged (SQLite's check: %s)", db->path, first);
}

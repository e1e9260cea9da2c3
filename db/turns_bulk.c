/* The first map's base rows written many to a statement: the same rows as one
 * cb_db_turns_base_map_put each, without SQLite's per-statement cost for every row. */
#include "config.h"

#include <errno.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>

#include "cowbox/basecache.h"
#include "cowbox/error.h"
#include "db.h"

#define BULK_ROWS 64 /* 9 columns each: far under SQLite's 32,766 parameters */
#define BULK_COLS 9

/* "INSERT OR REPLACE INTO base_map VALUES(?,...),..." for rows rows (malloc'ed). */
static char *bulk_sql(size_t rows)
{
	static const char head[] = "INSERT OR REPLACE INTO base_map(path, type, mode, size, "
				   "sha256, xxh3, target, pid, comm) VALUES";
	static const char row[] = "(?,?,?,?,?,?,?,?,?),";
	char *sql = malloc(sizeof(head) + rows * (sizeof(row) - 1));
	char *p = sql;

	if (!sql)
		return NULL;
	memcpy(p, head, sizeof(head) - 1);
	p += sizeof(head) - 1;
	for (size_t i = 0; i < rows; i++, p += sizeof(row) - 1)
		memcpy(p, row, sizeof(row) - 1);
	p[-1] = '\0'; /* the last comma */
	return sql;
}

static int bulk_put(struct cb_db_turns *t, sqlite3_stmt **s, const struct cb_entry *e, size_t rows)
{
	char *sql;
	int ret = 0;

	if (!*s) {
		if (!(sql = bulk_sql(rows)))
			return cb_error_set(ENOMEM, "base map store: out of memory");
		if (sqlite3_prepare_v2(cb_db_turns_sqlite(t), sql, -1, s, NULL) != SQLITE_OK)
			ret = cb_db_turns_fail(t, "base map store");
		free(sql);
		if (ret)
			return ret;
	}
	/* a column a row leaves unbound (no target, no pid) is NULL, not the last batch's */
	sqlite3_clear_bindings(*s);
	for (size_t i = 0; i < rows; i++)
		cb_db_turns_bind_entry(*s, (int)(i * BULK_COLS) + 1, (int)(i * BULK_COLS) + 2,
				       &e[i]);
	if (sqlite3_step(*s) != SQLITE_DONE)
		ret = cb_db_turns_fail(t, "base map store");
	sqlite3_reset(*s);
	return ret;
}

int cb_db_turns_base_map_put_many(struct cb_db_turns *t, const struct cb_entry *e, size_t n)
{
	sqlite3_stmt *full = NULL, *rest = NULL;
	size_t i = 0;
	int ret = 0;

	for (; !ret && n - i >= BULK_ROWS; i += BULK_ROWS)
		ret = bulk_put(t, &full, e + i, BULK_ROWS);
	if (!ret && i < n)
		ret = bulk_put(t, &rest, e + i, n - i);
	sqlite3_finalize(full);
	sqlite3_finalize(rest);
	return ret;
}

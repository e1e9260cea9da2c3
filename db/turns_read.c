/* Read transactions of the turn store: many lookups under one snapshot of meta.db, so each
 * does not take and drop SQLite's locks (fcntl and WAL index locks) on its own. */
#include "config.h"

#include <errno.h>
#include <sqlite3.h>

#include "cowbox/error.h"
#include "cowbox/turn_store.h"
#include "db.h"

int cb_db_turns_read_begin(struct cb_db_turns *t)
{
	sqlite3 *db = cb_db_turns_sqlite(t);

	/* DEFERRED: a shared lock only, taken by the first read; writers go on meanwhile. */
	if (sqlite3_exec(db, "BEGIN DEFERRED", NULL, NULL, NULL) != SQLITE_OK)
		return cb_error_set(EIO, "turn store: begin a read: %s", sqlite3_errmsg(db));
	return 0;
}

void cb_db_turns_read_end(struct cb_db_turns *t)
{
	sqlite3 *db = cb_db_turns_sqlite(t);

	if (!sqlite3_get_autocommit(db))
		sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
}

/* The in-place mark of a turn store: its workspace's upper layer is the user's folder, which
 * is also its base, so no file there is a trusted copy of a recorded content. */
#include "config.h"

#include <errno.h>
#include <sqlite3.h>

#include "cowbox/error.h"
#include "cowbox/turn_store.h"
#include "db.h"

int cb_db_turns_in_place(struct cb_db_turns *t)
{
	sqlite3 *db = cb_db_turns_sqlite(t);
	sqlite3_stmt *s = NULL;
	int ret;

	if (sqlite3_prepare_v2(db, "SELECT value FROM turn_meta WHERE key='in_place'", -1, &s,
			       NULL) != SQLITE_OK)
		return cb_error_set(EIO, "turn store: in-place mark: %s", sqlite3_errmsg(db));
	ret = sqlite3_step(s);
	if (ret == SQLITE_ROW)
		ret = sqlite3_column_int64(s, 0) == 1;
	else if (ret == SQLITE_DONE)
		ret = 0;
	else
		ret = cb_error_set(EIO, "turn store: in-place mark: %s", sqlite3_errmsg(db));
	sqlite3_finalize(s);
	return ret;
}

int cb_db_turns_in_place_set(struct cb_db_turns *t)
{
	sqlite3 *db = cb_db_turns_sqlite(t);

	/* The index lets prune ask per blob whether turn 0 needs it (only in place do turn
	 * 0's files have blobs). */
	if (sqlite3_exec(db,
			 "INSERT OR REPLACE INTO turn_meta VALUES('in_place', 1);"
			 "CREATE INDEX IF NOT EXISTS base_map_xxh3 ON base_map(xxh3)",
			 NULL, NULL, NULL) != SQLITE_OK)
		return cb_error_set(EIO, "turn store: set the in-place mark: %s",
				    sqlite3_errmsg(db));
	return 0;
}

int cb_db_turns_base_blob_needed(struct cb_db_turns *t, const unsigned char *xxh3)
{
	sqlite3 *db = cb_db_turns_sqlite(t);
	sqlite3_stmt *s = NULL;
	int ret;

	if (sqlite3_prepare_v2(db, "SELECT 1 FROM base_map WHERE xxh3=?1 AND type=1 LIMIT 1", -1,
			       &s, NULL) != SQLITE_OK)
		return cb_error_set(EIO, "turn store: base blob: %s", sqlite3_errmsg(db));
	sqlite3_bind_blob(s, 1, xxh3, CB_XXH128_LEN, SQLITE_STATIC);
	ret = sqlite3_step(s);
	if (ret == SQLITE_ROW || ret == SQLITE_DONE)
		ret = ret == SQLITE_ROW;
	else
		ret = cb_error_set(EIO, "turn store: base blob: %s", sqlite3_errmsg(db));
	sqlite3_finalize(s);
	return ret;
}

/* Attribution rewritten after the fact: the rows of a recorded turn (its deltas, the map,
 * the journal) told who really made a change, for a turn whose writer was cowbox itself. */
#include "config.h"

#include <errno.h>
#include <sqlite3.h>
#include <string.h>

#include "cowbox/error.h"
#include "cowbox/turn_store.h"
#include "db.h"

/* Each statement is an index seek on (path, turn) or (turn, path): the cost is the rows'. */
static const char *const attrib_sql[] = {
    "UPDATE turn_delta SET pid=?3, comm=?4 WHERE path=?2 AND turn=?1",
    /* the map holds the latest turn's entries: only when that is this turn */
    "UPDATE turn_map SET pid=?3, comm=?4 WHERE path=?2 AND "
    "(SELECT value FROM turn_meta WHERE key='map_turn')=?1",
    /* the journal's rows are "UNIQUE (turn, path, kind)"; a store without the journal's
     * table (a turn store of its own) has no such rows */
    "UPDATE journal SET pid=?3, comm=?4 WHERE turn=?1 AND path=?2",
};

#define ATTRIB_NSQL (sizeof(attrib_sql) / sizeof(attrib_sql[0]))

/* 1 if the database has the journal's table, 0 if not, or -errno. */
static int attrib_has_journal(sqlite3 *db)
{
	sqlite3_stmt *s = NULL;
	int ret;

	if (sqlite3_prepare_v2(db,
			       "SELECT 1 FROM sqlite_master WHERE type='table' AND name='journal'",
			       -1, &s, NULL) != SQLITE_OK)
		return cb_error_set(EIO, "turn store: attribution: %s", sqlite3_errmsg(db));
	ret = sqlite3_step(s);
	ret = ret == SQLITE_ROW ? 1
	      : ret == SQLITE_DONE
		  ? 0
		  : cb_error_set(EIO, "turn store: attribution: %s", sqlite3_errmsg(db));
	sqlite3_finalize(s);
	return ret;
}

int cb_db_turns_attribute(struct cb_db_turns *t, long long turn,
			  const struct cb_db_turn_attrib *rows, size_t n)
{
	sqlite3 *db = cb_db_turns_sqlite(t);
	sqlite3_stmt *q[ATTRIB_NSQL] = {0};
	size_t nq = ATTRIB_NSQL;
	int ret, began = 0;

	if (!n)
		return 0;
	if ((ret = attrib_has_journal(db)) < 0)
		return ret;
	if (!ret)
		nq--; /* the journal's statement is the last */
	ret = 0;
	for (size_t i = 0; i < nq && !ret; i++)
		if (sqlite3_prepare_v2(db, attrib_sql[i], -1, &q[i], NULL) != SQLITE_OK)
			ret = cb_db_turns_fail(t, "attribution");
	if (!ret && !(ret = cb_db_turns_begin(t)))
		began = 1;
	for (size_t r = 0; r < n && !ret; r++) {
		for (size_t i = 0; i < nq && !ret; i++) {
			sqlite3_reset(q[i]);
			sqlite3_clear_bindings(q[i]);
			sqlite3_bind_int64(q[i], 1, turn);
			sqlite3_bind_text(q[i], 2, rows[r].path, -1, SQLITE_STATIC);
			sqlite3_bind_int64(q[i], 3, rows[r].pid); /* the journal's is NOT NULL */
			if (rows[r].comm)
				sqlite3_bind_text(q[i], 4, rows[r].comm, -1, SQLITE_STATIC);
			if (sqlite3_step(q[i]) != SQLITE_DONE)
				ret = cb_db_turns_fail(t, "attribution");
		}
	}
	if (!ret && began)
		ret = cb_db_turns_commit(t);
	if (ret && began)
		cb_db_turns_rollback(t);
	for (size_t i = 0; i < ATTRIB_NSQL; i++)
		sqlite3_finalize(q[i]);
	return ret ? cb_error_wrap(ret, "turn %lld: attribution", turn) : 0;
}

/* The network log: rows written by the daemon as its egress proxy closes each connection, read
 * back per turn by net_log; the only SQL about the network. */
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>

#include "cowbox/error.h"
#include "cowbox/netlog.h"
#include "db.h"

const char cb_db_netlog_schema_sql[] = "CREATE TABLE net_log ("
				       "  id INTEGER PRIMARY KEY,"
				       "  turn INTEGER NOT NULL,"
				       "  time REAL NOT NULL,"
				       "  proto TEXT NOT NULL,"
				       "  name TEXT NOT NULL,"
				       "  address TEXT NOT NULL,"
				       "  port INTEGER NOT NULL,"
				       "  allowed INTEGER NOT NULL,"
				       "  rule TEXT NOT NULL,"
				       "  bytes_up INTEGER NOT NULL,"
				       "  bytes_down INTEGER NOT NULL,"
				       "  duration REAL NOT NULL,"
				       "  secret INTEGER NOT NULL DEFAULT 0);"
				       "CREATE INDEX net_log_turn ON net_log (turn);";

int cb_db_netlog_add(struct cb_db *db, const struct cb_netlog_row *r)
{
	return cb_db_netlog_add_many(db, r, 1);
}

int cb_db_netlog_add_many(struct cb_db *db, const struct cb_netlog_row *rows, size_t n)
{
	static const char sql[] = "INSERT INTO net_log (turn, time, proto, name, address, port, "
				  "allowed, rule, bytes_up, bytes_down, duration, secret) "
				  "VALUES (?,?,?,?,?,?,?,?,?,?,?,?)";
	sqlite3_stmt *st = NULL;
	int rc, tx = 0;

	cb_mutex_lock(&db->sql_lock);
	/* one transaction for the batch: one WAL commit instead of one per row */
	if (n > 1 && (rc = sqlite3_exec(db->sql, "BEGIN", NULL, NULL, NULL)) != SQLITE_OK)
		goto out;
	tx = n > 1;
	if ((rc = sqlite3_prepare_v2(db->sql, sql, -1, &st, NULL)) != SQLITE_OK)
		goto out;
	for (size_t i = 0; i < n; i++) {
		const struct cb_netlog_row *r = &rows[i];

		sqlite3_reset(st);
		sqlite3_bind_int64(st, 1, r->turn);
		sqlite3_bind_double(st, 2, r->time);
		sqlite3_bind_text(st, 3, r->proto ? r->proto : "", -1, SQLITE_STATIC);
		sqlite3_bind_text(st, 4, r->name ? r->name : "", -1, SQLITE_STATIC);
		sqlite3_bind_text(st, 5, r->address ? r->address : "", -1, SQLITE_STATIC);
		sqlite3_bind_int(st, 6, r->port);
		sqlite3_bind_int(st, 7, !!r->allowed);
		sqlite3_bind_text(st, 8, r->rule ? r->rule : "", -1, SQLITE_STATIC);
		sqlite3_bind_int64(st, 9, r->bytes_up);
		sqlite3_bind_int64(st, 10, r->bytes_down);
		sqlite3_bind_double(st, 11, r->duration);
		sqlite3_bind_int(st, 12, !!r->secret);
		if ((rc = sqlite3_step(st)) != SQLITE_DONE)
			goto out;
	}
	rc = tx ? sqlite3_exec(db->sql, "COMMIT", NULL, NULL, NULL) : SQLITE_OK;
	tx = 0;
out:
	rc =
	    rc == SQLITE_OK || rc == SQLITE_DONE ? 0 : cb_db_error(db, rc, "write the network log");
	sqlite3_finalize(st);
	if (tx)
		sqlite3_exec(db->sql, "ROLLBACK", NULL, NULL, NULL);
	cb_mutex_unlock(&db->sql_lock);
	return rc;
}

static const char *text(sqlite3_stmt *st, int col)
{
	const char *s = (const char *)sqlite3_column_text(st, col);

	return s ? s : "";
}

int cb_db_netlog_list(struct cb_db *db, long long turn,
		      int (*fn)(const struct cb_netlog_row *row, void *arg), void *arg)
{
	return cb_db_netlog_range(db, turn < 0 ? LLONG_MIN : turn - 1, turn < 0 ? -1 : turn, fn,
				  arg);
}

int cb_db_netlog_range(struct cb_db *db, long long after, long long upto,
		       int (*fn)(const struct cb_netlog_row *row, void *arg), void *arg)
{
	static const char sql[] = "SELECT id, turn, time, proto, name, address, port, allowed, "
				  "rule, bytes_up, bytes_down, duration, secret FROM net_log "
				  "WHERE turn > ?1 AND (?2 < 0 OR turn <= ?2) ORDER BY id";
	sqlite3_stmt *st = NULL;
	int rc;

	cb_mutex_lock(&db->sql_lock);
	rc = sqlite3_prepare_v2(db->sql, sql, -1, &st, NULL);
	if (rc != SQLITE_OK) {
		rc = cb_db_error(db, rc, "read the network log");
		goto out;
	}
	sqlite3_bind_int64(st, 1, after);
	sqlite3_bind_int64(st, 2, upto);
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		struct cb_netlog_row r = {
		    .id = sqlite3_column_int64(st, 0),
		    .turn = sqlite3_column_int64(st, 1),
		    .time = sqlite3_column_double(st, 2),
		    .proto = text(st, 3),
		    .name = text(st, 4),
		    .address = text(st, 5),
		    .port = sqlite3_column_int(st, 6),
		    .allowed = sqlite3_column_int(st, 7),
		    .rule = text(st, 8),
		    .bytes_up = sqlite3_column_int64(st, 9),
		    .bytes_down = sqlite3_column_int64(st, 10),
		    .duration = sqlite3_column_double(st, 11),
		    .secret = sqlite3_column_int(st, 12),
		};

		if ((rc = fn(&r, arg)))
			goto out;
	}
	rc = rc == SQLITE_DONE ? 0 : cb_db_error(db, rc, "read the network log");
out:
	sqlite3_finalize(st);
	cb_mutex_unlock(&db->sql_lock);
	return rc;
}

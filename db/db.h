/* db/ internals shared by its files (schema, journal, meta): the connection, its lock, the
 * cached statements and the group-commit queue. Only db/ includes this header. */
#ifndef COWBOX_DB_INTERNAL_H
#define COWBOX_DB_INTERNAL_H

#include <pthread.h>
#include <sqlite3.h>
#include <stddef.h>

#include "cowbox/journal.h"

/* A caller of cb_journal_mark waiting for its rows to be committed by the group leader. */
struct cb_mark_waiter {
	const struct cb_change *changes;
	size_t n;
	int done;
	int rc;
	struct cb_mark_waiter *next;
	pthread_cond_t cond; /* signalled when done, or when it is to lead the next batch */
};

/* The set of (turn, path, kind) keys already committed in the open turn, so that a repeated
 * mark costs a hash lookup and no SQLite work. Open addressing, power-of-two size. */
struct cb_mark_set {
	char **keys; /* "<kind>\t<path>" owned strings; NULL = empty slot */
	size_t size;
	size_t count;
};

struct cb_db {
	sqlite3 *sql;
	char *path;
	pthread_mutex_t sql_lock; /* serializes every use of sql and its statements */

	/* Prepared once, reused (guarded by sql_lock). */
	sqlite3_stmt *st_insert;
	sqlite3_stmt *st_list_turn;
	sqlite3_stmt *st_list_all;
	sqlite3_stmt *st_meta_get;
	sqlite3_stmt *st_meta_set;

	/* Group commit: waiters queue under queue_lock; one leader at a time commits a batch. */
	pthread_mutex_t queue_lock;
	struct cb_mark_waiter *queue_head, **queue_tail;
	int leader_active;
	struct cb_mark_set marked; /* guarded by queue_lock */
	long long turn;		   /* the open turn; guarded by queue_lock */
	char batch_error[512];	   /* why the last failed batch failed, for its followers */
	int dir_synced;		   /* the directory was fsynced once (cb_journal_sync) */
	int reserve_held;	   /* "<path>-reserve" is allocated; only the leader touches it */
	long long reserve_tried;   /* when it was last given back or taken (seconds) */

	/* Counters for tests and benchmarks (guarded by queue_lock). */
	unsigned long long stat_marks, stat_rows, stat_transactions;
};

/* The ordered list of schema migrations (db/schema.c); entry i moves user_version i -> i+1. */
extern const char *const cb_db_migrations[];
extern const size_t cb_db_migration_count;

/* Run every migration past the file's user_version, each in its own transaction. Called with
 * sql_lock held (or before the handle is shared). */
int cb_db_migrate(struct cb_db *db);

/* Prepare the journal's statements and load the open turn; called once by cb_db_open. */
int cb_journal_init(struct cb_db *db);

/* Finalize the journal's statements and free the mark set; called once by cb_db_close. */
void cb_journal_fini(struct cb_db *db);

/* Forget which paths were marked: a new turn starts (the snapshot code calls it with the
 * new turn after committing it to meta). */
void cb_journal_set_turn(struct cb_db *db, long long turn);

/* Fail with -EUCLEAN naming the file and the table unless every turn table is there in a
 * database whose schema version says they were created (db/turns.c). */
int cb_db_turns_schema_check(sqlite3 *db, const char *path);

/* The turn store's connection, for db/turn_scratch.c's temporary tables on it. */
struct cb_db_turns;
sqlite3 *cb_db_turns_sqlite(struct cb_db_turns *t);

/* Set an error message from SQLite's last error on db, naming the file and the step. */
int cb_db_error(struct cb_db *db, int rc, const char *what);

#endif

/* db/ internals shared by its files (schema, journal, meta): the connection, its lock, the
 * cached statements and the mark log. Only db/ includes this header. */
#ifndef COWBOX_DB_INTERNAL_H
#define COWBOX_DB_INTERNAL_H

#include <pthread.h>
#include <sqlite3.h>
#include <stddef.h>

#include "cowbox/journal.h"
#include "util/lock.h"

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
	struct cb_mutex sql_lock; /* serializes every use of sql and its statements */

	/* Prepared once, reused (guarded by sql_lock). */
	sqlite3_stmt *st_insert;
	sqlite3_stmt *st_list_turn;
	sqlite3_stmt *st_list_all;
	sqlite3_stmt *st_meta_get;
	sqlite3_stmt *st_meta_set;

	/* Marks: appended to the mark log (log_fd, owned under an exclusive flock) and folded
	 * into SQLite in batches; a handle that cannot own the log commits each mark. */
	struct cb_mutex queue_lock; /* guards the fields below and every write to the log; taken
				       before sql_lock, never after it */
	struct cb_mark_set marked;
	long long turn;		 /* the open turn */
	int log_fd;		 /* "<path>-marks", -1 while not owned */
	size_t log_size;	 /* bytes in it, all whole records */
	int log_synced;		 /* fdatasynced since the last fold: fold fsyncs the WAL first */
	long long log_tried;	 /* when taking it last failed (seconds) */
	int dir_synced;		 /* the directory was fsynced once (cb_journal_sync) */
	int reserve_held;	 /* "<path>-reserve" is allocated */
	long long reserve_tried; /* when it was last given back or taken (seconds) */

	/* Counters for tests and benchmarks (guarded by queue_lock). */
	unsigned long long stat_marks, stat_rows, stat_transactions, stat_dropped;
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
struct cb_entry;
sqlite3 *cb_db_turns_sqlite(struct cb_db_turns *t);

/* Set an error message from the turn store connection's last error (the step in what) and
 * return its -errno: EBUSY, ENOMEM, ENOSPC, EROFS, else EIO. */
int cb_db_turns_fail(struct cb_db_turns *t, const char *what);

/* Bind an entry's columns from position first (path at pathpos, then type, mode, size,
 * sha256, xxh3, target, pid, comm); strings are borrowed. */
void cb_db_turns_bind_entry(sqlite3_stmt *s, int pathpos, int first, const struct cb_entry *e);

/* Read columns path, type, mode, size, sha256, xxh3, target, pid, comm; strings borrowed. */
void cb_db_turns_column_entry(sqlite3_stmt *s, struct cb_entry *e);

/* The mark log's records (db/marklog.c). Encode one mark of turn into buf: its length, or 0
 * when it does not fit (size >= cb_marklog_max_record() always fits a valid mark). */
size_t cb_marklog_encode(const struct cb_change *c, long long turn, double time, char *buf,
			 size_t size);
size_t cb_marklog_max_record(void);

/* The size of c's record in the log (what cb_marklog_encode needs for it). */
size_t cb_marklog_record_size(const struct cb_change *c);

/* Call fn (if not NULL) for each whole, valid record of buf in order; *valid gets the length
 * of that prefix: a record that is cut short, fails its checksum or says nothing valid ends
 * it, and nothing after it is ever returned. Returns fn's first non-zero value, else 0. */
int cb_marklog_parse(const char *buf, size_t len, size_t *valid,
		     int (*fn)(const struct cb_journal_row *row, void *arg), void *arg);

/* The whole log file open on fd into *buf (malloc'd, NULL when empty); name is for errors. */
int cb_marklog_read(int fd, const char *name, char **buf, size_t *len);

/* fsync the WAL: every commit so far survives power loss (db/journal.c). */
int cb_journal_sync_wal(struct cb_db *db);

/* Set an error message from SQLite's last error on db, naming the file and the step. */
int cb_db_error(struct cb_db *db, int rc, const char *what);

#endif

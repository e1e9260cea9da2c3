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
	int links_any; /* link_names has a row: 1, 0, -1 not asked yet (db/links.c) */
	sqlite3_stmt *st_links_below, *st_links_names; /* prepared at first use */

	/* Marks: appended to the mark log (log_fd, owned under an exclusive flock) and folded
	 * into SQLite in batches by the folder thread (db/journal_log.c); a handle that cannot
	 * own the log commits each mark. */
	struct cb_mutex queue_lock; /* guards the fields below and every write to the log; taken
				       before sql_lock, never after it */
	struct cb_mark_set marked;
	long long turn;		 /* the open turn */
	int log_fd;		 /* "<path>-marks", -1 while not owned */
	size_t log_size;	 /* bytes in it, all whole records */
	int log_synced;		 /* fdatasynced since the last fold: fold fsyncs the WAL first */
	long long log_tried;	 /* when taking it last failed (seconds) */
	unsigned names_gen;	 /* bumped when the log gets a new name (taken, rotated) */
	unsigned synced_gen;	 /* names_gen at the last directory fsync (atomic) */
	int reserve_held;	 /* "<path>-reserve" is allocated */
	long long reserve_tried; /* when it was last given back or taken (seconds) */

	/* The rotated log ("<path>-marks.fold") and the thread that folds it. */
	enum { CB_FOLD_IDLE = 0, CB_FOLD_PENDING, CB_FOLD_BUSY } fold_state;
	int fold_fd;		  /* the rotated log while fold_state != IDLE */
	int fold_synced;	  /* it was fdatasynced: its fold fsyncs the WAL first */
	int conds_ready;	  /* the two conditions are initialized */
	pthread_cond_t fold_done; /* fold_state left BUSY */
	pthread_cond_t folder_wake;
	pthread_t folder;
	int folder_running, folder_stop;

	/* Counters for tests and benchmarks (guarded by queue_lock). */
	unsigned long long stat_marks, stat_rows, stat_transactions, stat_dropped;
	unsigned long long stat_folds_behind; /* rotated logs folded off the request path */
	unsigned long long stat_folds_inline; /* folds a marker made (backpressure) */
};

/* The ordered list of schema migrations (db/schema.c); entry i moves user_version i -> i+1. */
extern const char *const cb_db_migrations[];
extern const size_t cb_db_migration_count;

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

/* For an SQLite result rc that says the file at path is damaged (SQLITE_CORRUPT,
 * SQLITE_NOTADB): " (the file is damaged: run `cowbox fsck --repair REF` ...)" into buf, the
 * ref taken from path's directory; else "". */
void cb_db_damage_hint(const char *path, int rc, char *buf, size_t size);

/* The metadata columns mtime_ns, uid, gid, xattrs (added after the tables shipped, so the
 * last of each): bind e's from pos (NULL where it has none; only a file has any), read them
 * from column col into e (the xattrs borrowed, like the strings). */
/* Give the tables of entries of the database db (at path, for messages) the metadata columns
 * when it lacks them (a database made before them, or by a salvage): 0 or -errno. */
int cb_db_turns_add_meta_columns(sqlite3 *db, const char *path);
void cb_db_turns_bind_meta(sqlite3_stmt *s, int pos, const struct cb_entry *e);
void cb_db_turns_column_meta(sqlite3_stmt *s, int col, struct cb_entry *e);

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

/* One journal row, inside a transaction the caller opened (sql_lock held); *rows counts the
 * rows it added (0 for one already there). */
int cb_journal_insert(struct cb_db *db, const struct cb_journal_row *r, unsigned long long *rows);

/* The mark log's lifecycle (db/journal_log.c). "<db>-marks<suffix>" into buf. */
void cb_journal_log_name(const struct cb_db *db, const char *suffix, char *buf, size_t size);

/* Take the mark log (queue_lock held): 1 when this handle owns it now (log_fd set, and what
 * an earlier owner left, rotated or not, folded first), 0 when another live handle does (or,
 * without create, when there is none), else -errno. */
int cb_journal_log_open(struct cb_db *db, int create);

/* Start the folder thread of an owned log (queue_lock held); without one, logs fold inline. */
void cb_journal_log_start(struct cb_db *db);

/* After an append (queue_lock held): wake the folder once the log is big enough to rotate;
 * fold inline only when the log outgrew what the folder keeps up with. */
void cb_journal_log_appended(struct cb_db *db);

/* Fold every mark appended so far into the table (queue_lock held; it may be dropped and
 * taken again while a rotated log is folded): the one in flight is waited for, a pending
 * rotated log is folded, then the log itself, in that order. */
int cb_journal_log_fold_all(struct cb_db *db);

/* Stop the folder, fold everything and close the logs (cb_journal_fini). */
void cb_journal_log_close(struct cb_db *db);

/* Another owner's unfolded marks: the rotated log (*older) and the log (*newer), malloc'd,
 * NULL when absent or empty. */
int cb_journal_log_read_unowned(struct cb_db *db, char **older, size_t *olen, char **newer,
				size_t *nlen);

/* Set an error message from SQLite's last error on db, naming the file and the step. */
int cb_db_error(struct cb_db *db, int rc, const char *what);

#endif

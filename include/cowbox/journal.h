/* The workspace database (db/): schema, migrations and the change journal. Nothing outside
 * db/ speaks SQL; every other layer goes through these functions. */
#ifndef COWBOX_JOURNAL_H
#define COWBOX_JOURNAL_H

#include <stddef.h>
#include <sys/types.h>

struct cb_db;

/* What a journal row says happened to a path. */
enum cb_change_kind {
	CB_CHANGE_CREATE = 1, /* a new name: file, directory, symlink, node, hard link */
	CB_CHANGE_WRITE,      /* content: write, truncate, fallocate, open for writing */
	CB_CHANGE_META,	      /* mode, owner, times, xattrs */
	CB_CHANGE_DELETE,     /* unlink, rmdir */
	CB_CHANGE_RENAME_FROM,
	CB_CHANGE_RENAME_TO,
};

/* One change to record. path is relative to the workspace root, no leading '/', never
 * "." or "..". subtree != 0 means every path below a directory changed too (a renamed
 * directory): readers must expand it by walking the tree. */
struct cb_change {
	const char *path;
	enum cb_change_kind kind;
	int subtree;
	pid_t pid;	  /* the process that asked (FUSE request context), 0 if unknown */
	const char *comm; /* its command name (/proc/PID/comm), NULL if unknown */
};

/* A journal row as read back. */
struct cb_journal_row {
	long long id;
	long long turn; /* the turn the change belongs to: latest snapshot + 1 */
	const char *path;
	enum cb_change_kind kind;
	int subtree;
	double time; /* seconds since the epoch */
	pid_t pid;
	const char *comm;
};

/* Open, creating if needed, the database at path: WAL, synchronous=NORMAL, schema migrated
 * to the current version. On failure *out is NULL and the message names the file. */
int cb_db_open(const char *path, struct cb_db **out);
/* The same without a single fsync (synchronous=OFF, set before the file becomes WAL): for a
 * database no one uses until the caller has fsynced it, such as a fork's before it is
 * published (ten fsyncs of a new database and its checkpoints become one). */
int cb_db_open_unsynced(const char *path, struct cb_db **out);

/* Flush and close; NULL is accepted. */
void cb_db_close(struct cb_db *db);

/* The prefix of cowbox's own temporary names in a workspace's tree: rollback and merge build a
 * file under one beside its path and rename it over the path. Reserved: never journaled
 * (cb_journal_mark drops them, so `cowbox log` never shows them) and never recorded by a
 * snapshot. */
#define CB_JOURNAL_TMP_PREFIX ".cowbox-rollback."

/* 1 if path's last component is one of those temporary names. */
int cb_journal_tmp_name(const char *path);

/* Record changes durably: when this returns 0 they survive a kill -9 of the process (a
 * record in the mark log "<db>-marks", in the page cache; or, when another handle owns the
 * log, a commit to the WAL). The log is folded into the journal table in batches: once it
 * holds 1 MiB, by a thread of the handle's own (the log is renamed to "<db>-marks.fold" and
 * a new one started, so marks never wait for SQLite), at cb_journal_fold and cb_db_close,
 * and at the next cb_db_open after a crash. Only a log that outgrew 8 MiB (the thread
 * behind) is folded by the mark that finds it so. A (turn, path, kind) already recorded is
 * not recorded again, nor a temporary name (cb_journal_tmp_name). */
int cb_journal_mark(struct cb_db *db, const struct cb_change *changes, size_t n);

/* The names of multiply-linked files in the upper layer, by its inode number, kept so that a
 * change through one name can be marked under every name (the overlay knows only the names
 * looked up since it was mounted). The rows are hints: a reader checks that a path still
 * names the inode. cb_links_add records one; cb_links_names calls fn (which must not use db)
 * for each of ino's; cb_links_forget drops one found stale; cb_links_rename copies the rows
 * at or below from to the same paths below to (before a rename: the rows of the new names
 * exist before the names do; returns 1 if there were any, else 0), cb_links_drop deletes
 * those at or below path (after it). */
int cb_links_add(struct cb_db *db, unsigned long long ino, const char *path);
int cb_links_names(struct cb_db *db, unsigned long long ino,
		   int (*fn)(unsigned long long ino, const char *path, void *arg), void *arg);
int cb_links_forget(struct cb_db *db, unsigned long long ino, const char *path);
int cb_links_rename(struct cb_db *db, const char *from, const char *to);
int cb_links_drop(struct cb_db *db, const char *path);

/* 1 if path has a mark of any kind in the current turn through this handle (as far as its
 * memory of the turn's marks goes: 0 may also mean forgotten), else 0. */
int cb_journal_marked(struct cb_db *db, const char *path);

/* Fold the mark log into the journal table now (after the fold in flight, if any): when it
 * returns 0 every mark recorded so far is a row that any connection to the database reads. Whoever
 * reads the table through another connection (the turn worker) must have the log's owner call this
 * first. */
int cb_journal_fold(struct cb_db *db);

/* Make everything recorded so far durable against power loss too (fdatasync of the mark log
 * and of a rotated one still being folded, fsync of the WAL, and of the directory after the
 * logs got new names); the filesystem calls it when a program fsyncs and at unmount. */
int cb_journal_sync(struct cb_db *db);

/* The latest recorded turn (0: none yet), read on this handle's own connection: what a turn
 * op needs without opening the turn store. -1 with a message when it cannot be read. */
long long cb_db_latest_turn(struct cb_db *db);

/* The turn that new changes belong to (1 before the first snapshot). */
long long cb_journal_turn(struct cb_db *db);

/* Call fn for each row of the given turn (turn <= 0: every turn), oldest first; the marks
 * still in the log are rows too (folded first, or read from the log of a live owner). fn
 * returns 0 to go on; a non-zero value stops the walk and is returned. */
int cb_journal_list(struct cb_db *db, long long turn,
		    int (*fn)(const struct cb_journal_row *row, void *arg), void *arg);

/* Read a key of the workspace's metadata (base, name, turn, ...) into *value (malloc'd, the
 * caller frees). -ENOENT with a message if the key was never set. */
int cb_db_meta_get(struct cb_db *db, const char *key, char **value);

/* Set a key of the workspace's metadata, committed before it returns. */
int cb_db_meta_set(struct cb_db *db, const char *key, const char *value);

/* Remove a key of the workspace's metadata (none there is no error), committed before it
 * returns. */
int cb_db_meta_del(struct cb_db *db, const char *key);

/* Meta keys a fold of a damaged mark log sets (db/journal_log.c): LOST says which log lost
 * which bytes (kept until `cowbox fsck --repair` has seen it), RESCAN that the upper layer
 * still has to be walked and every path that differs from the last turn journaled
 * (cleared by the walk: cb_ws_marks_rescan). */
/* What cb_db_salvage got back from a damaged file. */
struct cb_db_salvage {
	int unreadable;	    /* not even its schema could be read: nothing copied */
	long long rows;	    /* rows copied */
	int damaged_tables; /* tables a damaged page cut short */
	int lost_base_map, lost_meta;
	long long oldest, latest; /* the turns the damaged file had (as far as it says) */
	long long kept;		  /* turns oldest..kept are whole and kept (0: none) */
};

/* Fill db (a fresh database, schema made, nothing else yet) with every row SQLite can still
 * read of the damaged file at path damaged (meta, turns, turn_delta, turn_meta, base_map;
 * each table scanned forward to its first damaged page and backward to it),
 * then keep the turns up to the first one that is missing or short of rows (later turns are
 * built on it), rebuild the turn map for the last one kept, and make the open turn the next.
 * A damaged base map is dropped (built from the base again when needed). Nothing of the
 * damaged file is changed. 0 with *res filled (res->unreadable when nothing could be read),
 * or -errno when db could not take the rows. */
int cb_db_salvage(struct cb_db *db, const char *damaged, struct cb_db_salvage *res);

/* SQLite's quick_check of the whole file: 0 when it is sound, -EILSEQ with a message naming
 * the file and SQLite's first finding otherwise. */
int cb_db_quick_check(struct cb_db *db);

#define CB_MARKS_LOST_KEY   "marks_lost"
#define CB_MARKS_RESCAN_KEY "marks_rescan"

/* Counters since this handle was opened: marks asked for, rows recorded (log records, or rows
 * committed without the log), SQLite transactions (folds of the log, or commits without it). */
void cb_journal_stats(struct cb_db *db, unsigned long long *marks, unsigned long long *rows,
		      unsigned long long *transactions);

/* "create", "write", ... for output; "unknown" for a bad value. */
const char *cb_change_kind_name(enum cb_change_kind kind);

#endif

/* The turn store: what a turn's map holds per path (struct cb_entry) and the SQL tables of
 * turns, deltas, the map and the base hash cache in meta.db (db/turns.c, cb_db_turns_). */
#ifndef COWBOX_TURN_STORE_H
#define COWBOX_TURN_STORE_H

#include <stddef.h>
#include <sys/types.h>

/* ---- entries: one path of a turn's map ---- */

enum cb_entry_type {
	CB_ENTRY_ABSENT = 0, /* a tombstone: the path does not exist */
	CB_ENTRY_FILE = 1,
	CB_ENTRY_DIR = 2,
	CB_ENTRY_SYMLINK = 3,
};

#define CB_SHA256_LEN 32
#define CB_XXH128_LEN 16

/* What a turn knows about a path. Strings are owned by the entry when it comes from
 * cb_entry_* helpers, borrowed when handed to a callback. */
struct cb_entry {
	char *path; /* relative to the workspace root, no leading '/' */
	enum cb_entry_type type;
	unsigned mode;			     /* permission and special bits (07777), no S_IFMT */
	long long size;			     /* file bytes; symlink target length; 0 for dirs */
	unsigned char sha256[CB_SHA256_LEN]; /* files: content; symlinks: the target's bytes */
	unsigned char xxh3[CB_XXH128_LEN];   /* the same, xxh3-128 (canonical big-endian) */
	char *target;			     /* symlinks: where it points; else NULL */
	pid_t pid;			     /* journal attribution of the change, 0 if unknown */
	char *comm;			     /* its command name, NULL if unknown */
	/* The metadata a turn keeps of a file, directory or symlink besides its content
	 * (docs/turns.md), which rollback, fork and apply give back; none of it is part of
	 * cb_entry_same (no diff event). The modification time in ns since the epoch
	 * (has_mtime 0: none recorded: a base entry, whose time is the base's own, or an
	 * older row). */
	long long mtime_ns;
	int has_mtime;
	/* Owner and group as the sandbox sees them (ids of its own range, 0..65535); has_owner
	 * 0: none recorded (a file owned outside the range, a base entry). */
	int has_owner;
	unsigned uid, gid;
	/* The kept extended attributes (user.* and the POSIX ACL) of a file or directory (a
	 * symlink can have neither), serialized by ws/meta.c; NULL (len 0): none. Owned like
	 * the strings. */
	unsigned char *xattrs;
	size_t xattrs_len;
	/* Regular files with more than one name: the files of a turn that share a link (an
	 * opaque group id, owned like the strings; NULL: none) are one inode, hard links of
	 * each other, and rollback, fork and apply give them back so. ino: the inode number the
	 * live tree showed when it was recorded (0: none), to find the group's other names;
	 * nlink: the live link count when read from the live tree (never stored). */
	char *link;
	long long ino;
	unsigned long nlink;
};

/* Free the strings an entry owns and reset it to an absent entry. */
void cb_entry_clear(struct cb_entry *e);

/* Deep copy src into dst (dst's old strings are freed). */
int cb_entry_copy(struct cb_entry *dst, const struct cb_entry *src);

/* 1 when a and b describe the same thing (type, mode, content or target), else 0. */
int cb_entry_same(const struct cb_entry *a, const struct cb_entry *b);

/* 1 when a and b are the same file, directory or symlink (cb_entry_same) whose kept
 * metadata differs (b has a time or owner that a lacks or has otherwise, or other xattrs):
 * a change a snapshot records (so a restore gives it back) but no diff event. */
int cb_entry_meta_moved(const struct cb_entry *a, const struct cb_entry *b);

/* "file", "dir", "symlink" or "absent". */
const char *cb_entry_type_name(enum cb_entry_type type);

/* Lowercase hex of n bytes into out (2n+1 bytes). */
void cb_hex(const unsigned char *bytes, size_t n, char *out);

struct cb_db_turns;

/* The SQL of the turn tables, run as migration 2 of meta.db (idempotent). */
extern const char cb_db_turns_schema_sql[];

/* Open a connection of its own to the workspace database at path (creating the turn tables
 * if the migration has not), so turn transactions never interleave with the journal's. */
int cb_db_turns_open(const char *path, struct cb_db_turns **out);
/* No fsync on this connection from now on (its commits and its checkpoint at close): for a
 * database the caller fsyncs before anyone uses it (cb_db_open_unsynced). */
int cb_db_turns_unsynced(struct cb_db_turns *t);
/* Finalize and close; NULL is accepted. */
void cb_db_turns_close(struct cb_db_turns *t);

/* A write transaction (the write lock taken at once), its commit, and its rollback (a no-op
 * outside a transaction, so cleanup paths can always call it). */
int cb_db_turns_begin(struct cb_db_turns *t);
int cb_db_turns_commit(struct cb_db_turns *t);
void cb_db_turns_rollback(struct cb_db_turns *t);
/* A read transaction: every read until the rollback sees the database as its first read
 * found it (WAL: writers go on meanwhile), for a reader that must not mix two states. */
int cb_db_turns_begin_read(struct cb_db_turns *t);

/* Base hash cache by (path, size, mtime_ns, ctime_ns, ino): returns 1 and fills the hashes
 * on a hit, 0 on a miss (also when the file changed since it was cached: a file replaced or
 * rewritten behind our back with its size and mtime put back still has a new ctime or inode,
 * and is rehashed, never trusted). */
int cb_db_turns_base_cache_get(struct cb_db_turns *t, const char *path, long long size,
			       long long mtime_ns, long long ctime_ns, long long ino,
			       unsigned char *sha256, unsigned char *xxh3);
/* Remember a base file's hashes under its current key (replacing an older row). */
int cb_db_turns_base_cache_put(struct cb_db_turns *t, const char *path, long long size,
			       long long mtime_ns, long long ctime_ns, long long ino,
			       const unsigned char *sha256, const unsigned char *xxh3);

/* A fork remembers the database it came from; its first map build imports that base cache
 * (cb_db_turns_base_cache_import) instead of hashing the shared base again. */
int cb_db_turns_base_cache_from(struct cb_db_turns *t, const char *db_path);
/* Import (once) the base cache of the database recorded by cb_db_turns_base_cache_from; a
 * source that is gone is skipped. */
int cb_db_turns_base_cache_import(struct cb_db_turns *t);

/* The base as the first snapshot saw it (turn 0's map), frozen: a base that changes behind
 * cowbox's back does not change what turn 0 and the turns after it were. built is 1 once
 * it has been recorded. get: 1 and *out (owned) if the base had path, 0 if not. */
int cb_db_turns_base_map_built(struct cb_db_turns *t);
int cb_db_turns_base_map_set_built(struct cb_db_turns *t);
int cb_db_turns_base_map_get(struct cb_db_turns *t, const char *path, struct cb_entry *out);
int cb_db_turns_base_map_put(struct cb_db_turns *t, const struct cb_entry *e);
/* Copy the whole base map into the turn map (the start of a rebuild). */
int cb_db_turns_map_from_base(struct cb_db_turns *t);

/* A recorded turn. */
struct cb_turn_info {
	long long turn;
	double time;
	const char *label;
	long long changes;
};

/* Record a turn; in the same transaction the journal's open turn (meta) becomes turn + 1. */
int cb_db_turns_add(struct cb_db_turns *t, long long turn, double time, const char *label,
		    long long changes);
struct cb_db;
/* Tell the journal's in-memory state that new changes belong to turn (db/journal.c). */
void cb_db_turns_journal_advance(struct cb_db *db, long long turn);
/* The newest recorded turn (0 if none) and the oldest still kept (0 if none). */
long long cb_db_turns_latest(struct cb_db_turns *t);
long long cb_db_turns_oldest(struct cb_db_turns *t);
/* 1 if turn is recorded (turn 0, the base, always is), 0 if not. */
int cb_db_turns_exists(struct cb_db_turns *t, long long turn);
/* Call fn for every recorded turn, oldest first; a non-zero return stops and is returned. */
int cb_db_turns_list(struct cb_db_turns *t, int (*fn)(const struct cb_turn_info *, void *),
		     void *arg);

/* Record that path became e (e->type == CB_ENTRY_ABSENT: deleted) in turn. */
int cb_db_turns_delta_put(struct cb_db_turns *t, long long turn, const struct cb_entry *e);
/* The newest delta row of path at or before turn: 1 and *out filled (maybe a tombstone),
 * or 0 if no turn up to `turn` changed it (the base entry applies). */
int cb_db_turns_delta_at(struct cb_db_turns *t, const char *path, long long turn,
			 struct cb_entry *out);
/* Each distinct path changed in a turn in (from, to], sorted. */
int cb_db_turns_delta_paths(struct cb_db_turns *t, long long from, long long to,
			    int (*fn)(const char *path, void *), void *arg);

/* The materialized map of the latest turn. map_turn is the turn it reflects, -1 if it was
 * never built (it is built on demand from the base and the deltas). */
long long cb_db_turns_map_turn(struct cb_db_turns *t);
int cb_db_turns_map_set_turn(struct cb_db_turns *t, long long turn);
/* 1 and *out (owned) if the map has path, 0 if not. */
int cb_db_turns_map_get(struct cb_db_turns *t, const char *path, struct cb_entry *out);
/* Insert or replace e; delete one path; empty the map. */
int cb_db_turns_map_put(struct cb_db_turns *t, const struct cb_entry *e);
int cb_db_turns_map_del(struct cb_db_turns *t, const char *path);
int cb_db_turns_map_clear(struct cb_db_turns *t);
/* Every entry (prefix NULL) or every entry strictly below directory prefix, sorted by path
 * in byte order. */
int cb_db_turns_map_list(struct cb_db_turns *t, const char *prefix,
			 int (*fn)(const struct cb_entry *, void *), void *arg);

/* The identity of this database's turns (> 0), made on first use and kept: a client that
 * holds a map of turn N of this id can ask for the changes since N; turn N of another id is
 * another workspace's (a fork, a workspace made again under the same name). */
int cb_db_turns_map_id(struct cb_db_turns *t, long long *out);
/* A new random map id (> 0) that no database holds yet, for cb_db_turns_map_id_set. */
int cb_db_turns_map_id_fresh(long long *out);
/* Make id this database's map id (in the caller's transaction): every map a client holds
 * under the previous id is answered whole next time. */
int cb_db_turns_map_id_set(struct cb_db_turns *t, long long id);

/* fn for each map entry of the hard-link group link, or recorded with inode number ino,
 * by path. */
int cb_db_turns_map_by_link(struct cb_db_turns *t, const char *link,
			    int (*fn)(const struct cb_entry *, void *), void *arg);
int cb_db_turns_map_by_ino(struct cb_db_turns *t, long long ino,
			   int (*fn)(const struct cb_entry *, void *), void *arg);
/* Each path a delta row up to turn recorded in the hard-link group link, sorted (whether the
 * path is still in it at turn is its newest row's to say). */
int cb_db_turns_link_paths(struct cb_db_turns *t, const char *link, long long turn,
			   int (*fn)(const char *path, void *), void *arg);

/* Fold every turn before keep_from into keep_from and forget them. */
int cb_db_turns_prune(struct cb_db_turns *t, long long keep_from);
/* 1 if some remaining turn or the map needs the blob with this xxh3, else 0. */
int cb_db_turns_blob_needed(struct cb_db_turns *t, const unsigned char *xxh3);

/* ---- for cowbox fsck ---- */

/* Every file entry recorded in a delta (ordered by content, then path, then turn), with the
 * turn it was recorded at (from) and the next turn that recorded that path again (until; -1
 * if none): the entry is the path's content for the turns from .. until-1. */
int cb_db_turns_file_deltas(struct cb_db_turns *t,
			    int (*fn)(const struct cb_entry *e, long long from, long long until,
				      void *arg),
			    void *arg);
/* The same for turn 0's files (the frozen base map): from is 0, until the first delta. */
int cb_db_turns_base_files(struct cb_db_turns *t,
			   int (*fn)(const struct cb_entry *e, long long from, long long until,
				     void *arg),
			   void *arg);

/* Every entry of turn 0 (files, directories, symlinks), by path; from 0, until -1. */
int cb_db_turns_base_entries(struct cb_db_turns *t,
			     int (*fn)(const struct cb_entry *e, long long from, long long until,
				       void *arg),
			     void *arg);

/* 1 if the workspace is in place (its base is also its upper layer: the user's folder), 0
 * if not, or -errno. Set once, when an in-place workspace is created. */
int cb_db_turns_in_place(struct cb_db_turns *t);
int cb_db_turns_in_place_set(struct cb_db_turns *t);
/* 1 if a file of turn 0 (the base map) has the content xxh3, else 0, or -errno: in place,
 * what keeps its blob from prune. */
int cb_db_turns_base_blob_needed(struct cb_db_turns *t, const unsigned char *xxh3);

/* Who made the change to a path (db/turn_attrib.c). */
struct cb_db_turn_attrib {
	const char *path;
	pid_t pid;	  /* 0: unknown */
	const char *comm; /* NULL: unknown */
};
/* Give recorded turn `turn`'s rows of each path in rows (its delta, the map's when the map is
 * that turn's, the journal's) that attribution, in one transaction: for a turn cowbox wrote
 * on someone's behalf (a merge). Rows of other paths and turns are left alone; a path with
 * no row is skipped. Costs n index seeks. The journal's rows must be in its table (the
 * owner's cb_journal_fold) first. 0 or -errno (message). */
int cb_db_turns_attribute(struct cb_db_turns *t, long long turn,
			  const struct cb_db_turn_attrib *rows, size_t n);

/* A row of the base cache (ctime_ns -1: a row from before ctime was part of the key). */
struct cb_db_cache_row {
	const char *path;
	long long size, mtime_ns, ctime_ns, ino;
	unsigned char sha256[CB_SHA256_LEN];
	unsigned char xxh3[CB_XXH128_LEN];
};

/* Every row of the base cache, by path; and dropping one. */
int cb_db_turns_base_cache_list(struct cb_db_turns *t,
				int (*fn)(const struct cb_db_cache_row *row, void *arg), void *arg);
int cb_db_turns_base_cache_del(struct cb_db_turns *t, const char *path);

/* Each turn whose turn_delta rows are fewer than the changed paths it recorded (rows deleted
 * behind cowbox's back): fn gets the turn, the count it recorded and the rows left, by turn. */
int cb_db_turns_short_turns(struct cb_db_turns *t,
			    int (*fn)(long long turn, long long recorded, long long held,
				      void *arg),
			    void *arg);

/* Read one key of meta.db's metadata without opening it for writing (no migration, nothing
 * created): for a damaged file. 0 and *value (malloc'd), or -ENOENT; no message set. */
int cb_db_meta_peek(const char *path, const char *key, char **value);

/* ---- a turn operation's scratch space (db/turn_scratch.c) ----
 * Temporary tables on the turn store's connection, in SQLite's temporary file: the journal's
 * rows merged per path, the paths to examine and their entries. They let a snapshot of any
 * number of paths hold only a page of them in memory at a time. One at a time per handle. */
struct cb_db_scratch;

/* A journal row merged per path (subtree if any row said so, attributed to its latest row
 * with a pid), or a path to examine (subtree 0); strings owned by whoever filled it. */
struct cb_scratch_row {
	char *path;
	int subtree;
	pid_t pid;
	char *comm;
	int same_names; /* as cb_dirty's (cowbox/turns.h): no row made, removed or moved a name */
};

/* Create (empty) the scratch tables on t's connection; close drops them. */
int cb_db_scratch_open(struct cb_db_turns *t, struct cb_db_scratch **out);
void cb_db_scratch_close(struct cb_db_scratch *s);

/* A deferred transaction for a page of scratch writes (they take no lock on meta.db). */
int cb_db_scratch_begin(struct cb_db_scratch *s);
/* Commit it; on failure it is rolled back. */
int cb_db_scratch_commit(struct cb_db_scratch *s);

/* Merge one dirty row (strings borrowed) into the dirty set. */
int cb_db_scratch_dirty_add(struct cb_db_scratch *s, const struct cb_scratch_row *d);
/* Merge the journal's rows of turns from..to (in journal order), except those of kind
 * skip_kind (-1: none), into the dirty set; -ENOENT without a journal. */
int cb_db_scratch_dirty_journal(struct cb_db_scratch *s, long long from, long long to,
				int skip_kind);

/* The next (at most max) rows of the dirty set, or of the paths to examine, after path after
 * (NULL: from the first) in byte order, copied into rows: their count, 0 at the end, or
 * -errno. Free the copies with cb_db_scratch_rows_free. */
int cb_db_scratch_dirty_page(struct cb_db_scratch *s, const char *after,
			     struct cb_scratch_row *rows, size_t max);
int cb_db_scratch_path_page(struct cb_db_scratch *s, const char *after, struct cb_scratch_row *rows,
			    size_t max);
void cb_db_scratch_rows_free(struct cb_scratch_row *rows, size_t n);

/* Add a path to examine (once; a later attribution fills one that had no pid). */
int cb_db_scratch_path_add(struct cb_db_scratch *s, const char *path, pid_t pid, const char *comm);
/* 1 if path is to be examined, 0 if not, -errno. */
int cb_db_scratch_path_has(struct cb_db_scratch *s, const char *path);

/* Keep path's entry before (old) and now (the path is now's), and whether it changed: 1
 * (a change: an event, counted), 2 (only the recorded modification time moved: a row of the
 * turn, no event, not counted) or 0. */
int cb_db_scratch_res_put(struct cb_db_scratch *s, const struct cb_entry *old,
			  const struct cb_entry *now, int changed);
/* 1 and *type if path's entry was kept, 0 if not, -errno. */
int cb_db_scratch_res_type(struct cb_db_scratch *s, const char *path, int *type);

/* Write every changed entry as a delta row of turn and into the map (the caller holds the
 * write transaction); *nchanged gets their count. */
int cb_db_scratch_record(struct cb_db_scratch *s, long long turn, long long *nchanged);
/* How many kept entries a turn would record (a changed time included): *n. 0 or -errno. */
int cb_db_scratch_changed_count(struct cb_db_scratch *s, long long *n);
/* fn(now, o_link, arg) for each kept entry that is a file with more than one name (its
 * ino set) or was one of a hard-link group before (o_link, else NULL), in path order. */
int cb_db_scratch_linked(struct cb_db_scratch *s,
			 int (*fn)(const struct cb_entry *now, const char *o_link, void *),
			 void *arg);
/* Give the kept entry of path the hard-link group link (NULL: none); a group other than the
 * one it had before is a change of its metadata (a row, no event). */
int cb_db_scratch_set_link(struct cb_db_scratch *s, const char *path, const char *link);

/* fn(old, now) for each changed entry in path order (strings borrowed for the call). */
int cb_db_scratch_changes(struct cb_db_scratch *s,
			  int (*fn)(const struct cb_entry *old, const struct cb_entry *now, void *),
			  void *arg);

#endif

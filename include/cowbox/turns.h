/* Turns: incremental snapshots of a workspace, diffs between any two turns, rollback, prune
 * and fork. db/turns.c keeps the maps and deltas (cb_db_turns_), ws/ computes them (cb_ws_). */
#ifndef COWBOX_TURNS_H
#define COWBOX_TURNS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
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
};

/* Free the strings an entry owns and reset it to an absent entry. */
void cb_entry_clear(struct cb_entry *e);

/* Deep copy src into dst (dst's old strings are freed). */
int cb_entry_copy(struct cb_entry *dst, const struct cb_entry *src);

/* 1 when a and b describe the same thing (type, mode, content or target), else 0. */
int cb_entry_same(const struct cb_entry *a, const struct cb_entry *b);

/* "file", "dir", "symlink" or "absent". */
const char *cb_entry_type_name(enum cb_entry_type type);

/* Lowercase hex of n bytes into out (2n+1 bytes). */
void cb_hex(const unsigned char *bytes, size_t n, char *out);

/* ---- db/turns.c: the turn store in meta.db ---- */

struct cb_db_turns;

/* The SQL of the turn tables, run as migration 2 of meta.db (idempotent). */
extern const char cb_db_turns_schema_sql[];

/* Open a connection of its own to the workspace database at path (creating the turn tables
 * if the migration has not), so turn transactions never interleave with the journal's. */
int cb_db_turns_open(const char *path, struct cb_db_turns **out);
/* Finalize and close; NULL is accepted. */
void cb_db_turns_close(struct cb_db_turns *t);

/* A write transaction (the write lock taken at once), its commit, and its rollback (a no-op
 * outside a transaction, so cleanup paths can always call it). */
int cb_db_turns_begin(struct cb_db_turns *t);
int cb_db_turns_commit(struct cb_db_turns *t);
void cb_db_turns_rollback(struct cb_db_turns *t);

/* Base hash cache by (path, size, mtime_ns, ino): returns 1 and fills the hashes on a hit,
 * 0 on a miss (also when the file changed since it was cached). */
int cb_db_turns_base_cache_get(struct cb_db_turns *t, const char *path, long long size,
			       long long mtime_ns, long long ino, unsigned char *sha256,
			       unsigned char *xxh3);
/* Remember a base file's hashes under its current key (replacing an older row). */
int cb_db_turns_base_cache_put(struct cb_db_turns *t, const char *path, long long size,
			       long long mtime_ns, long long ino, const unsigned char *sha256,
			       const unsigned char *xxh3);

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

/* Fold every turn before keep_from into keep_from and forget them. */
int cb_db_turns_prune(struct cb_db_turns *t, long long keep_from);
/* 1 if some remaining turn or the map needs the blob with this xxh3, else 0. */
int cb_db_turns_blob_needed(struct cb_db_turns *t, const unsigned char *xxh3);

/* ---- ws/hash.c ---- */

struct cb_hash {
	unsigned char sha256[CB_SHA256_LEN];
	unsigned char xxh3[CB_XXH128_LEN];
};

/* Hash an open file from its current offset to EOF in one read pass (SHA-256 and xxh3-128);
 * when copy_fd >= 0 every byte read is also written there. *size gets the byte count. */
int cb_ws_hash_fd(int fd, int copy_fd, struct cb_hash *out, long long *size);

/* Hash the regular file dirfd/path consistently: between two fstat()s that agree on size,
 * mtime and ctime, retrying a few times while it changes. *st gets the stat it is valid for.
 * copy_fd as above (rewound and truncated on each retry). */
int cb_ws_hash_file_at(int dirfd, const char *path, int copy_fd, struct cb_hash *out,
		       struct stat *st);

/* Hash a byte string (a symlink's target). */
void cb_ws_hash_bytes(const void *data, size_t len, struct cb_hash *out);

/* ---- ws/blobs.c: content-addressed copies under blobs/<xxh3 hex> ---- */

/* The blob's file name: 32 hex digits + NUL. */
void cb_ws_blob_name(const unsigned char *xxh3, char out[2 * CB_XXH128_LEN + 1]);
/* 1 if present, 0 if not. */
int cb_ws_blob_has(int blob_fd, const unsigned char *xxh3);
/* Keep a copy of the regular file src_fd (read from offset 0) as the blob xxh3, unless one is
 * already there: reflink first, copy_file_range, then plain read/write. */
int cb_ws_blob_put_fd(int blob_fd, int src_fd, const unsigned char *xxh3);
/* Make a temp file in the blob dir for a copy made while hashing, then publish it. */
int cb_ws_blob_tmp(int blob_fd, char name[64]);
int cb_ws_blob_publish(int blob_fd, const char *tmpname, const unsigned char *xxh3);
/* Open the blob for reading. */
int cb_ws_blob_open(int blob_fd, const unsigned char *xxh3);
/* Copy all of src_fd into dst_fd (both from offset 0): reflink, copy_file_range, read/write. */
int cb_ws_copy_fd(int src_fd, int dst_fd);
/* Count and bytes (allocated) of the blob store. */
int cb_ws_blob_usage(int blob_fd, long long *count, long long *bytes);
/* The same for a blob directory by path; a missing one is empty (no turn kept a blob). */
int cb_ws_blob_usage_dir(const char *blob_dir, long long *count, long long *bytes);
/* Remove every blob for which needed() says 0; *freed gets the bytes returned. */
int cb_ws_blob_gc(int blob_fd, int (*needed)(const unsigned char *xxh3, void *), void *arg,
		  long long *removed, long long *freed);
/* Hard-link the blob xxh3 from one store into another (a copy across devices); present
 * already is fine. */
int cb_ws_blob_share(int from_fd, int to_fd, const unsigned char *xxh3);

/* ---- ws/: turns of a live tree ---- */

struct cb_turns;

struct cb_turns_config {
	const char *db_path;  /* meta.db */
	const char *blob_dir; /* blobs/, created if missing */
	const char *base_dir; /* the read-only base; NULL for an empty one */
	const char *root;     /* the live tree: the mount point (a plain directory in tests) */
	/* Called while the base is hashed (first snapshot): files and bytes hashed so far out
	 * of those to hash; at the start, at most ten times a second, and at the end. From the
	 * hashing threads, one call at a time. NULL: no reports. */
	void (*progress)(void *arg, long long files_done, long long files_total,
			 long long bytes_done, long long bytes_total);
	void *progress_arg;
};

/* Open the turns of one workspace: its turn store, blob store, base and live tree. The
 * handle is for one thread at a time (the daemon holds its turn lock around it). */
int cb_turns_open(const struct cb_turns_config *cfg, struct cb_turns **out);
/* Close everything; NULL is accepted. */
void cb_turns_close(struct cb_turns *t);
/* The turn store underneath, for listing turns. */
struct cb_db_turns *cb_turns_db(struct cb_turns *t);

/* A path the journal says changed in the open turn. */
struct cb_dirty {
	const char *path;
	int subtree; /* everything below it changed too */
	pid_t pid;
	const char *comm;
};

enum cb_diff_kind {
	CB_DIFF_CREATED = 1,
	CB_DIFF_MODIFIED,
	CB_DIFF_DELETED,
	CB_DIFF_TYPE_CHANGED,
	CB_DIFF_MODE_CHANGED,
};

struct cb_diff_event {
	enum cb_diff_kind kind;
	struct cb_entry old; /* type ABSENT when created */
	struct cb_entry new; /* type ABSENT when deleted; carries the attribution */
};

/* A sorted list of events; free with cb_ws_diff_free. */
struct cb_diff {
	struct cb_diff_event *ev;
	size_t n, cap;
};

/* Free the events and reset the list to empty. */
void cb_ws_diff_free(struct cb_diff *d);
/* "created", "modified", "deleted", "type_changed", "mode_changed"; "unknown" otherwise. */
const char *cb_ws_diff_kind_name(enum cb_diff_kind kind);

/* Record turn `turn` (the open turn, which the caller has just closed in the journal) from
 * the paths the journal names, rehashing only those through the live tree; on the first
 * snapshot the base is hashed too (cached). Contents not in the base are kept as blobs.
 * changes (optional) gets what changed since the previous turn. */
int cb_ws_snapshot(struct cb_turns *t, long long turn, const struct cb_dirty *dirty, size_t n,
		   const char *label, struct cb_diff *changes);

/* Call fn for every entry of the latest turn's map, sorted (building the map if needed). */
int cb_ws_map_list(struct cb_turns *t, int (*fn)(const struct cb_entry *, void *), void *arg);

/* 0 if turn can be read (recorded, or 0 = the base), else -ENOENT saying why (pruned...). */
int cb_ws_turn_check(struct cb_turns *t, long long turn);

/* 1 if the base directory's file at path holds the content xxh3 right now, else 0. */
int cb_ws_base_holds(struct cb_turns *t, const char *path, const unsigned char *xxh3);

/* The entry of path at turn (0 = the base). */
int cb_ws_entry_at(struct cb_turns *t, const char *path, long long turn, struct cb_entry *out);

/* Events from turn a to turn b; b < 0 means the live tree, whose changes since the latest
 * turn are the dirty paths given (rehashed, nothing recorded). */
int cb_ws_diff(struct cb_turns *t, long long a, long long b, const struct cb_dirty *dirty, size_t n,
	       struct cb_diff *out);

/* Make the live tree equal turn's map, touching only the paths that differ (those changed
 * after turn plus the dirty ones). The caller snapshots afterwards. *touched gets how many
 * paths were restored. */
int cb_ws_rollback(struct cb_turns *t, long long turn, const struct cb_dirty *dirty, size_t n,
		   long long *touched);

/* Keep the newest keep turns; fold the older ones and delete unneeded blobs. */
int cb_ws_prune(struct cb_turns *t, long long keep, long long *dropped, long long *freed);

/* Write into new_upper (overlayfs format) what differs from the base at turn, record it as
 * turn 1 of the new workspace's database and share the blobs it needs. */
int cb_ws_fork(struct cb_turns *t, long long turn, const char *new_upper, const char *new_db,
	       const char *new_blob_dir);

#endif

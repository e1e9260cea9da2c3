/* Turns: incremental snapshots of a workspace, diffs between any two turns, rollback, prune
 * and fork, computed over the live tree by ws/ (cb_ws_); the store they keep is
 * cowbox/turn_store.h. */
#ifndef COWBOX_TURNS_H
#define COWBOX_TURNS_H

#include <stddef.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "cowbox/journal.h"
#include "cowbox/turn_store.h"

/* ---- ws/hash.c ---- */

struct cb_hash {
	unsigned char sha256[CB_SHA256_LEN];
	unsigned char xxh3[CB_XXH128_LEN];
};

/* Hash an open file, all of it, in one read pass (SHA-256 and xxh3-128);
 * when copy_fd >= 0 every byte read is also written there (at the same offset; holes and
 * zero runs are left as holes). *size gets the byte count. */
int cb_ws_hash_fd(int fd, int copy_fd, struct cb_hash *out, long long *size);

/* Hash the regular file dirfd/path consistently: between two fstat()s that agree on size,
 * mtime and ctime, retrying a few times while it changes. *st gets the stat it is valid for.
 * copy_fd as above (rewound and truncated on each retry). */
int cb_ws_hash_file_at(int dirfd, const char *path, int copy_fd, struct cb_hash *out,
		       struct stat *st);

/* The same for a regular file already open for reading at offset 0 (fd stays open); path
 * only names it in messages. */
int cb_ws_hash_open_file(int fd, const char *path, int copy_fd, struct cb_hash *out,
			 struct stat *st);

/* Hash a byte string (a symlink's target). */
void cb_ws_hash_bytes(const void *data, size_t len, struct cb_hash *out);

/* ---- ws/blobs.c: content-addressed copies under blobs/<xxh3 hex> ---- */

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
/* Copy src_fd into dst_fd (truncated first; holes kept) while hashing what is read, and fail
 * with -EBADMSG, naming what (the blob or base file) and want->path, unless the bytes are
 * exactly want's (size, xxh3 and SHA-256): nothing damaged is ever passed on as good.
 * dst_fd -1: only check. */
int cb_ws_copy_checked(int src_fd, int dst_fd, const struct cb_entry *want, const char *what);
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

/* The default bound on one snapshot's reads: 64 GiB (a 1 TiB sparse file fails at once). */
#define CB_SNAPSHOT_MAX_BYTES (64LL << 30)

struct cb_turns_config {
	const char *db_path;  /* meta.db */
	const char *blob_dir; /* blobs/, created if missing */
	const char *base_dir; /* the read-only base; NULL for an empty one */
	const char *root;     /* the live tree: the mount point (a plain directory in tests);
			       * NULL for ops that never read it (prune, fork, listing turns) */
	/* Called while the base is hashed (first snapshot): files and bytes hashed so far out
	 * of those to hash; at the start, at most ten times a second, and at the end. From the
	 * hashing threads, one call at a time. NULL: no reports. */
	void (*progress)(void *arg, long long files_done, long long files_total,
			 long long bytes_done, long long bytes_total);
	void *progress_arg;
	/* Asked while a snapshot hashes (the base's files before each one, and every 64 MiB of
	 * any file): non-zero gives the snapshot up (-ECANCELED, nothing recorded), so a stop
	 * of the daemon does not wait for a huge file to be read. NULL: never. */
	int (*stopping)(void *arg);
	void *stopping_arg;
	/* The most file bytes one snapshot may read (the sizes of the files it hashes, holes
	 * included): past it the snapshot fails naming the file, before reading it. 0: the
	 * default, CB_SNAPSHOT_MAX_BYTES; < 0: no bound. */
	long long snapshot_max_bytes;
};

/* Open the turns of one workspace: its turn store, blob store, base and live tree. The
 * handle is for one thread at a time (the daemon holds its turn lock around it). */
int cb_turns_open(const struct cb_turns_config *cfg, struct cb_turns **out);
/* Close everything; NULL is accepted. */
void cb_turns_close(struct cb_turns *t);
/* Whose files rollback and fork may leave setuid/setgid: owner uid (and group gid, for
 * setgid) in first .. first + count - 1, the sandbox's own ids. Until this is called (or
 * with count 0): nobody's, so a turn's setuid-root file comes back without the bits. */
void cb_turns_set_setid_range(struct cb_turns *t, unsigned first, unsigned count);
/* The host id range (its base, CB_WS_IDS_*) of the tree that rollback and fork write into:
 * a restored file gets its recorded owner (the sandbox's ids) as ids of that range. Until
 * this is called, owners are not restored. */
void cb_turns_set_restore_ids(struct cb_turns *t, unsigned long base);
/* The turn store underneath, for listing turns. */
struct cb_db_turns *cb_turns_db(struct cb_turns *t);

/* A path the journal says changed in the open turn. */
struct cb_dirty {
	const char *path;
	int subtree; /* everything below it changed too */
	pid_t pid;
	const char *comm;
	/* 1: its rows only wrote the content or changed metadata, so its directory's time did
	 * not move (the directory is not looked at for it); 0: unknown, or a name changed. */
	int same_names;
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

/* The journal rows a turn operation looks at: names_turn's rows that are not content writes
 * (0: none), then every row of turns from..to; merged per path (subtree if any row says so,
 * attributed to the latest row with a pid). */
struct cb_journal_span {
	long long names_turn;
	long long from, to;
};

/* cb_ws_snapshot with the paths the journal's span names, read from the workspace database
 * by this handle (it needs the journal's tables): however many paths changed, a snapshot
 * holds a bounded number of them (a page) in memory at a time. */
int cb_ws_snapshot_journal(struct cb_turns *t, long long turn, const struct cb_journal_span *span,
			   const char *label, struct cb_diff *changes);

/* The journal span's rows merged per path, sorted by path, as a dirty list for cb_ws_diff or
 * cb_ws_rollback (strings owned: free with cb_ws_dirty_free). */
int cb_ws_journal_dirty(struct cb_turns *t, const struct cb_journal_span *span,
			struct cb_dirty **out, size_t *n);
void cb_ws_dirty_free(struct cb_dirty *d, size_t n);

/* Call fn for every entry of the latest turn's map, sorted (building the map if needed). */
int cb_ws_map_list(struct cb_turns *t, int (*fn)(const struct cb_entry *, void *), void *arg);

/* The next snapshot through t may leave the map unbuilt when it examines no path and the map
 * would be built from a walk of the base: the caller answers the whole map next, with
 * cb_ws_map_first, under the same turn lock. */
void cb_ws_snapshot_defer_map(struct cb_turns *t);

/* The next snapshot through t records no turn when it finds no path changed (the rows of the
 * open turn named files opened for writing and left as they were): it returns 0 and
 * cb_ws_snapshot_skipped says 1 afterwards. */
void cb_ws_snapshot_skip_empty(struct cb_turns *t);
int cb_ws_snapshot_skipped(struct cb_turns *t);

/* A walk of the base read ahead of the first map (cb_ws_base_scan_ahead). */
struct cb_ws_base_scan;

/* When the next map would be built from a walk of the base (none built yet), read the base
 * now as that build would, short of hashing: every entry stat'ed, dir_opened(arg, fd) told of
 * each directory's fd before it is read (NULL: not told), the caches consulted. *out is NULL
 * when no walk would be made. 0 or -errno. */
int cb_ws_base_scan_ahead(struct cb_turns *t, void (*dir_opened)(void *, int dirfd), void *arg,
			  struct cb_ws_base_scan **out);
/* Give t a scan read ahead (t owns it): the next map built from a walk through t takes it
 * instead of walking. The caller vouches that nothing in the base changed since the scan
 * began (the base watch saw nothing). */
void cb_ws_base_scan_use(struct cb_turns *t, struct cb_ws_base_scan *s);
void cb_ws_base_scan_free(struct cb_ws_base_scan *s);
/* How many base entries a scan holds (0 for NULL). */
size_t cb_ws_base_scan_entries(const struct cb_ws_base_scan *s);

/* A first map answered before its rows are written (cb_ws_map_first). */
struct cb_ws_first_map;

/* Like cb_ws_map_list, but given only regular files, and a map never built whose latest turn
 * changed nothing is answered from the walk of the base before any row is written: then
 * *pending holds the walk, and the caller must cb_ws_map_first_write it (or drop it) before
 * the next turn operation. *map_id is the id a client keeps with this map: the database's,
 * or when pending a fresh one that the write adopts, so that a client given a map whose rows
 * never reached the disk (a crash in between) is answered whole next time. */
int cb_ws_map_first(struct cb_turns *t, int (*fn)(const struct cb_entry *, void *), void *arg,
		    struct cb_ws_first_map **pending, long long *map_id);

/* Write a pending first map's rows (base map, turn map, new cache rows) and adopt its map id,
 * in one transaction. If the map was built meanwhile its rows stand and the id is not
 * adopted. 0 or -errno. */
int cb_ws_map_first_write(struct cb_turns *t, struct cb_ws_first_map *p);
void cb_ws_map_first_free(struct cb_ws_first_map *p);

/* What changed in the latest turn's map since turn since (at or after the oldest kept):
 * fn(path, entry) for each regular file added or changed, fn(path, NULL) for each path that
 * was a regular file at since and is none now; sorted by path, and costing what changed.
 * -ESTALE if since cannot be read (pruned, never recorded): the caller needs the whole map. */
int cb_ws_map_changes(struct cb_turns *t, long long since,
		      int (*fn)(const char *path, const struct cb_entry *now, void *), void *arg);

/* 0 if turn can be read (recorded, or 0 = the base), else -ENOENT saying why (pruned...). */
int cb_ws_turn_check(struct cb_turns *t, long long turn);

/* 1 if the base directory's file at path holds the content xxh3 right now, else 0. */
int cb_ws_base_holds(struct cb_turns *t, const char *path, const unsigned char *xxh3);

/* What a look at the whole base found: entries stat'ed, files rehashed (their stat had
 * moved from the base cache, or they are new), paths whose state changed. */
struct cb_ws_base_stats {
	long long entries, hashed, changed;
};

/* The base is watched. Look at every base entry now (t's root must be the upper layer, never
 * the mount): each file whose inode, size, mtime or ctime differs from the base cache is
 * rehashed and re-cached (never trusted; the others are only stat'ed), and changed(arg, path)
 * is called, in path order, for every path where the mount now shows something other than the
 * latest turn's map because the base changed behind cowbox's back (a base file modified, added
 * or deleted that the upper layer does not hide). The caller journals those paths, so that
 * the next snapshot records what is there now. A non-zero return of changed() stops and is
 * returned. Nothing to do before the first snapshot froze the base. */
int cb_ws_base_check(struct cb_turns *t, int (*changed)(void *arg, const char *path), void *arg,
		     struct cb_ws_base_stats *stats);

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

/* What a rollback to a turn can give back to the base instead of copying (the daemon has the
 * overlay drop what upper holds there, cb_overlay_revert, before cb_ws_rollback runs). */
struct cb_ws_revert {
	char **paths; /* where the turn's entry is what the base shows now: any directory
		       * over a directory, else the same type, mode and content; sorted */
	size_t n;
	/* The files among them whose turn recorded a time, owner or xattrs: the base may show
	 * others, and then cb_ws_rollback_checked gives them a copy of their own. */
	char **check;
	size_t ncheck;
};
/* The paths that differ between turn and the latest turn (the daemon records the open turn
 * first) whose entry at turn the base holds now; reads meta.db and the base, never the live
 * tree. Nothing in place, without a base, or when turn is the latest. */
int cb_ws_revert_plan(struct cb_turns *t, long long turn, struct cb_ws_revert *out);
void cb_ws_revert_free(struct cb_ws_revert *r);

/* cb_ws_rollback, and the files of check[0..ncheck) (sorted; cb_ws_revert.check), whose
 * content the live tree already holds, get the turn's time, owner and xattrs back (a copy
 * written through the mount) when the mount shows others. */
int cb_ws_rollback_checked(struct cb_turns *t, long long turn, const struct cb_dirty *dirty,
			   size_t n, const char *const *check, size_t ncheck, long long *touched);

/* What a rollback wrote, for the snapshot that records it (it then reads none of it back):
 * taken out of t so that t can be closed in between, and put into the handle that takes
 * the snapshot (which owns it from then on). NULL: nothing to hand over. */
struct cb_ws_known;
struct cb_ws_known *cb_ws_known_take(struct cb_turns *t);
void cb_ws_known_put(struct cb_turns *t, struct cb_ws_known *known);
void cb_ws_known_free(struct cb_ws_known *known);

/* The prefix of a rollback's temporary names (a file is built beside its path and renamed
 * over it): reserved, never journaled nor recorded by a snapshot (cowbox/journal.h). */
#define CB_WS_ROLLBACK_TMP CB_JOURNAL_TMP_PREFIX

/* Remove every temporary name a rollback left in upper (the upper layer, not mounted) when it
 * was killed or failed to clean up; *removed gets how many. */
int cb_ws_rollback_clean(const char *upper, long long *removed);

/* Keep the newest keep turns; fold the older ones and delete unneeded blobs. */
int cb_ws_prune(struct cb_turns *t, long long keep, long long *dropped, long long *freed);

/* The paths whose base entry is no longer turn 0's (the base changed behind cowbox's back
 * since the first snapshot froze it), sorted: what a fork writes besides the turns' changes. */
struct cb_ws_drift {
	char **paths;
	size_t n;
};

/* Look at the whole base (a stat of every entry, a rehash of files whose stat moved) and fill
 * *out (empty before the first snapshot). The caller frees it with cb_ws_drift_free. */
int cb_ws_base_drift(struct cb_turns *t, struct cb_ws_drift *out);
void cb_ws_drift_free(struct cb_ws_drift *d);

/* Where a fork's time went (seconds), and how many paths it looked at. */
struct cb_ws_fork_stats {
	long long paths;
	double db_seconds;     /* the new database created */
	double paths_seconds;  /* the paths to look at: the turns' changes and the base's */
	double write_seconds;  /* the upper layer, the rows and the blobs of those paths */
	double commit_seconds; /* the new database's commit */
	double sync_seconds;   /* its checkpoint and its one fsync */
};

/* Write into new_upper (overlayfs format) what differs from the base at turn, record it as
 * turn 1 of the new workspace's database and share the blobs it needs. drift: the base's
 * drift from turn 0 if the caller knows it (cb_ws_base_drift, kept while nothing moved in the
 * base), or NULL to look at the whole base here. stats may be NULL. */
int cb_ws_fork(struct cb_turns *t, long long turn, const char *new_upper, const char *new_db,
	       const char *new_blob_dir, const struct cb_ws_drift *drift,
	       struct cb_ws_fork_stats *stats);

#endif

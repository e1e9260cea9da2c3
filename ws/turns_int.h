/* Internal to ws/'s turn code: the handle of one workspace's turns and the helpers that
 * snapshot, diff, rollback, prune and fork share. */
#ifndef COWBOX_WS_TURNS_INT_H
#define COWBOX_WS_TURNS_INT_H

#include "cowbox/turns.h"
#include "util/beneath.h"

/* A file a rollback just wrote, with the stat it had right after: while the file still has
 * that stat (inode, size, mtime, ctime), the next snapshot takes its entry without reading
 * it again (any write since changes mtime and ctime). */
struct ws_known {
	struct cb_entry e;
	struct stat st;
};

struct cb_turns {
	struct cb_db_turns *db;
	char *db_path; /* meta.db, for a fork to import the base cache from */
	int root_fd;   /* the live tree */
	int base_fd;   /* -1: an empty base */
	int blob_fd;
	void (*progress)(void *, long long, long long, long long, long long);
	void *progress_arg;
	int (*stopping)(void *); /* cb_turns_config's */
	void *stopping_arg;
	struct ws_known *known; /* sorted by path; emptied by the next snapshot */
	/* The host id range base that restores write owners into (cb_turns_set_restore_ids);
	 * -1: unknown, owners left as they are. */
	long long restore_id_base;
	/* Whose files rollback and fork may leave setuid/setgid (cb_turns_set_setid_range). */
	struct cb_beneath_setid setid;
	size_t nknown;
	long long read_max;  /* snapshot bound (< 0: none) */
	long long read_left; /* what the running snapshot may still read; < 0: unbounded */
	long long read_done;
	struct ws_basecache *bc; /* the shared base cache (ws/basecache.c), NULL if none */
	int base_prepared_ok;	 /* cb_ws_base_trust_prepared was called */
	/* In place (cb_db_turns_in_place): the base is the live upper layer, never a source of
	 * recorded bytes; every recorded content is kept as a blob. */
	int in_place;
	/* cb_ws_snapshot_defer_map: a snapshot that examines nothing leaves a map that would be
	 * built from a walk to the caller (cb_ws_map_first answers from that walk). */
	int defer_map;
	/* cb_ws_snapshot_skip_empty: a snapshot that finds no change records no turn (skipped
	 * says it did so). */
	int skip_empty, skipped;
	/* cb_ws_base_scan_use: a walk of the base read ahead, vouched for by the caller; the
	 * next map built from a walk takes it instead of walking. */
	struct cb_ws_base_scan *ahead;
};

/* cb_ws_hash_file_at and cb_ws_hash_open_file that give up (-ECANCELED, "hash: stopped
 * after N bytes") as soon as stopping(arg) says so; it is asked every 64 MiB of the file
 * (holes included), so a stop of the daemon never waits for a huge file to be read. NULL:
 * never. */
int ws_hash_file_at(int dirfd, const char *path, int copy_fd, struct cb_hash *out, struct stat *st,
		    int (*stopping)(void *), void *arg);
int ws_hash_open_file(int fd, const char *path, int copy_fd, struct cb_hash *out, struct stat *st,
		      int (*stopping)(void *), void *arg);

/* Remember files just written (takes ownership of the array), forget them. */
void ws_known_set(struct cb_turns *t, struct ws_known *known, size_t n);
void ws_known_clear(struct cb_turns *t);

/* 1 if SEEK_DATA/SEEK_HOLE on fd tell the truth: not on a FUSE mount, whose server does not
 * see what the kernel's writeback cache still holds (a hole there may be data). */
int ws_holes_trusted(int fd);

/* ws/meta.c: the metadata a turn keeps of a file, directory or symlink besides its content. */

/* Fill out's owner (as the sandbox sees it: kept only for ids of a workspace range) from st
 * and its kept xattrs (user.*, the POSIX ACL with its named ids made the sandbox's) from the
 * file open as fd (O_PATH is fine: read through /proc/self/fd, never by path). 0 or -errno
 * naming path. */
int ws_meta_read(int fd, const struct stat *st, const char *path, struct cb_entry *out);
/* Give dst (a regular file open for writing, its content restored from e) e's recorded
 * owner in the id range at id_base (< 0: unknown, left as it is). */
int ws_restore_owner(int dst, const struct cb_entry *e, long long id_base);
/* Set e's recorded xattrs on dst (any descriptor, O_PATH too); an ACL's named ids become ids
 * of the range at id_base (< 0: as recorded); acl 0 leaves the ACL out. prune: first remove
 * the kept xattrs dst has and e did not record. -EBADMSG when the record is damaged. */
int ws_restore_xattrs(int dst, const struct cb_entry *e, long long id_base, int acl, int prune);
/* Give the entry at e->path beneath root (its content, target or directory already e's)
 * e's recorded owner (in the range at id_base; < 0: left), its mode (not a symlink's: under
 * setid), its kept xattrs (pruned as above) and, with time, its modification time. Nothing
 * on the way nor the entry itself is followed. 0 or -errno naming e's path. */
int ws_restore_meta_at(int root, const struct cb_entry *e, long long id_base, int acl,
		       const struct cb_beneath_setid *setid, int time);
/* Only the modification time e recorded (none: left as it is), of the entry at e->path
 * itself: a directory's after everything in it was written. */
int ws_restore_time_at(int root, const struct cb_entry *e);
/* Give dst the modification time e recorded; without one, that of src (the base file it was
 * copied from, >= 0), else leave it. The access time is left as it is. 0 or -errno naming
 * e's path. */
int ws_restore_mtime(int dst, const struct cb_entry *e, int src);

/* 1 if path's last component is a rollback's temporary name (never part of a turn). */
int ws_is_tmp_name(const char *path);

/* The process umask (022 if /proc cannot say), read without changing it: umask() would race
 * with other threads. Rollback and merge use it to know which mode bits a create dropped. */
mode_t ws_process_umask(void);

/* A set of paths (sorted, unique after ws_pathset_sort) with the journal attribution each
 * came from. */
struct ws_path {
	char *path;
	pid_t pid;
	const char *comm; /* borrowed from the dirty list */
};

struct ws_pathset {
	struct ws_path *p;
	size_t n, cap;
};

/* Append a copy of path with its attribution (comm is borrowed); 0 or -ENOMEM. */
int ws_pathset_add(struct ws_pathset *s, const char *path, pid_t pid, const char *comm);
void ws_pathset_sort(struct ws_pathset *s);
/* Free the copies and the array and leave the set empty, ready for reuse. */
void ws_pathset_free(struct ws_pathset *s);

/* ws/links.c: hard links between the files of a turn. */

/* The snapshot's last look at what it kept (turn being recorded): every examined file with
 * more than one name gets its inode's group id (that of its unexamined names, found by the
 * group it had and by its inode, else a new one), and one no longer linked none; a new
 * group is a row of the turn. */
int ws_snap_links(struct cb_turns *t, struct cb_db_scratch *s, long long turn);
/* Add to out (sorted) every path whose entry at turn is a file of group key. */
int ws_link_group(struct cb_turns *t, long long turn, const char *key, struct ws_pathset *out);
/* Make to (a new name) a hard link of from, both beneath root, nothing followed. */
int ws_link_at(int root, const char *from, const char *to);
/* 1 if a and b beneath root are the same inode now (either missing: 0). */
int ws_same_inode(int root, const char *a, const char *b);

/* Turn 0's entry for path (absent if the base had none): the frozen base map once the first
 * snapshot recorded it, else what the base holds now. */
int ws_base_entry(struct cb_turns *t, const char *path, struct cb_entry *out);

/* What the base directory holds at path now (absent if nothing), hashes from the base cache
 * by (size, mtime, inode) or computed and cached. */
int ws_base_now(struct cb_turns *t, const char *path, struct cb_entry *out);

/* 1 if the base file at path holds the content xxh3 now (so it can be copied from), else 0. */
int ws_base_holds(struct cb_turns *t, const char *path, const unsigned char *xxh3);

/* The live tree's entry for path, hashed now. keep_blob: also keep its content as a blob
 * unless it is the base's content at the same path. */
int ws_live_entry(struct cb_turns *t, const char *path, int keep_blob, struct cb_entry *out);

/* The live tree's entry for path without its content's hashes: type, mode, size, time,
 * owner and xattrs (a rollback compares a file's metadata with what its turn recorded). */
int ws_live_meta(struct cb_turns *t, const char *path, struct cb_entry *out);

/* The entry of path at a recorded turn (0 = base). */
int ws_entry_at(struct cb_turns *t, const char *path, long long turn, struct cb_entry *out);

/* Add to set (unsorted) every path whose base entry now differs from the record: from turn 0's
 * (vs_map 0: what a fork must write itself) or, where the upper layer (t's root) does not
 * hide it, from the latest turn's map (vs_map 1: what the mount shows that no turn recorded).
 * Base files are stat'ed, and rehashed only when their stat moved from the cache. */
int ws_base_changes(struct cb_turns *t, int vs_map, struct ws_pathset *set,
		    struct cb_ws_base_stats *stats);
/* Base hashes by stat: 1 from meta.db's cache, 2 from the shared cache, 0 a miss. */
int ws_base_cache_get(struct cb_turns *t, const char *path, const struct stat *st,
		      struct cb_hash *h);
/* A base entry as ws_base_walk found it, and what the caches say of it. */
struct ws_base_file {
	char *path;
	struct stat st;
	int cached; /* 1: meta.db's cache vouched for st, 2: the shared one; 0: to hash */
	struct cb_hash h;
	int err; /* hashing failed (errno) */
};
/* Every regular file, directory and symlink below the base (no link followed, each stat'ed
 * beside its directory's fd), sorted by strcmp of path: *out (malloc'ed, n entries). Two
 * threads share out the directories, each holding one directory fd at a time. Fails (-errno,
 * nothing returned) when an entry cannot be read. */
int ws_base_walk(int base_fd, struct ws_base_file **out, size_t *n);
/* The same walk, calling dir_opened(arg, fd) with each directory's fd before reading it (a
 * watch set there then sees every change the read could miss). */
int ws_base_walk_watched(int base_fd, void (*dir_opened)(void *, int dirfd), void *arg,
			 struct ws_base_file **out, size_t *n);
void ws_base_files_free(struct ws_base_file *f, size_t n);
/* The hashes of the regular files of f[0..n) (sorted by strcmp of path) whose stat is still
 * a cache row's key: one scan of meta.db's cache, then one of the shared cache for what it
 * lacked, each merged with f (no lookup per file). Sets cached and h; 0 or -errno. */
int ws_base_cache_find(struct cb_turns *t, struct ws_base_file *f, size_t n);
/* Count in t's cache statistics what another handle's ws_base_cache_find found in f (a walk
 * read ahead, taken by t). */
void ws_base_cache_found(struct cb_turns *t, const struct ws_base_file *f, size_t n);
/* Store a base file's hashes in meta.db's cache (in the caller's transaction, if any) and,
 * when hashed (read now, not found in a cache), in the shared cache later. */
int ws_base_cache_put(struct cb_turns *t, const char *path, const struct stat *st,
		      const struct cb_hash *h, int hashed);
/* Write what is pending to the shared cache and close it. */
void ws_basecache_detach(struct cb_turns *t);
/* Row i of an array the caller knows: its path, stat and hashes. */
typedef void (*ws_basecache_row_fn)(const void *arr, size_t i, const char **path,
				    const struct stat **st, const struct cb_hash **h);
/* Make the regular files of arr[0..n) (a whole walk of the base in path order, every one
 * hashed: row gives each) the shared cache's pack, for the first map of the next workspace
 * over this base. Best effort: nothing is written for a base of more than 262,144 entries
 * or when the same pack is there, and a failure drops the shared cache for t, as any other. */
void ws_basecache_pack(struct cb_turns *t, const void *arr, size_t n, ws_basecache_row_fn row);

/* Build the materialized map for the latest turn if it is not current. */
int ws_map_ensure(struct cb_turns *t);
/* 1 if building the latest turn's map means walking the base (never built, not prepared). */
int ws_map_would_walk(struct cb_turns *t);

/* Put the base map's row of the base entry at path (st: its stat; h: its hashes when it is
 * a regular file). Called in a transaction. */
int ws_base_map_row(struct cb_turns *t, const char *path, const struct stat *st,
		    const struct cb_hash *h);

/* Where expanded paths go: add(arg, path, pid, comm) copies what it keeps (0 or -errno). */
struct ws_sink {
	int (*add)(void *arg, const char *path, pid_t pid, const char *comm);
	void *arg;
};

/* The paths whose entries one dirty row may have changed, given to sink in two halves: the
 * row's own path (credited to its own first change), and all below it when it is (or was) a
 * directory that moved, was replaced or is new (credited to d's change). Giving every row's
 * own path first lets a sink that keeps the first credit give each path its own change's
 * (issue 30.9: a file made in a new directory is not the directory's creator's). */
int ws_dirty_add_own(const struct cb_dirty *d, const struct ws_sink *sink);
int ws_dirty_expand_below(struct cb_turns *t, const struct cb_dirty *d, const struct ws_sink *sink);

/* Add to set the paths whose entries the dirty list may have changed: each dirty path, all
 * below it when it is (or was) a directory that moved, was replaced or is new. */
int ws_dirty_expand(struct cb_turns *t, const struct cb_dirty *dirty, size_t n,
		    struct ws_pathset *set);

/* Check a turn can be read: recorded (or 0) and not pruned. */
int ws_turn_check(struct cb_turns *t, long long turn);

/* Append an event for old -> new (nothing if they are the same). */
int ws_diff_add(struct cb_diff *d, const struct cb_entry *old, const struct cb_entry *new);
/* The same, and also an event (kind CB_DIFF_MODE_CHANGED) when they are the same but old
 * recorded metadata that new lacks or has otherwise (cb_entry_meta_moved): what a restore
 * to old must give back. */
int ws_diff_add_meta(struct cb_diff *d, const struct cb_entry *old, const struct cb_entry *new);
/* cb_ws_diff, with_meta: through ws_diff_add_meta (for a rollback). */
int ws_diff_run(struct cb_turns *t, long long a, long long b, const struct cb_dirty *dirty,
		size_t n, int with_meta, struct cb_diff *out);

#endif

/* The base hash cache shared by every workspace over one base directory: the SQL store
 * (db/basecache.c, cb_db_basecache_) and the workspace side that uses it (ws/basecache.c). */
#ifndef COWBOX_BASECACHE_H
#define COWBOX_BASECACHE_H

#include <sys/stat.h>

#include "cowbox/turn_store.h"

/* ---- db/basecache.c: $COWBOX_HOME/basecache/<key>.db ---- */

struct cb_db_basecache;

/* What a row is valid for: the file's stat when it was hashed. A row is trusted only while
 * all of these (and the path) still match the file: a file rewritten behind our back with
 * its size and mtime put back still has a new ctime or inode. */
struct cb_basecache_key {
	long long dev, ino, size, mtime_ns, ctime_ns;
};

/* The key of a stat. */
void cb_basecache_key_of(const struct stat *st, struct cb_basecache_key *k);

/* Open (creating it, and its directory, if missing) the shared cache at path, in WAL mode
 * with a busy timeout, so several daemons may use it at once. A file that is not a cache of
 * this version (another program's database, a newer schema, garbage) is refused with
 * -EPROTO or -EUCLEAN and left untouched; the caller hashes without it. */
int cb_db_basecache_open(const char *path, struct cb_db_basecache **out);
/* A second handle on c's file, for another thread to read from while c's thread reads too
 * (a handle serves one thread at a time); it never creates the file or its schema. */
int cb_db_basecache_open_reader(const struct cb_db_basecache *c, struct cb_db_basecache **out);
/* Roll back what was not committed, finalize and close; NULL is accepted. */
void cb_db_basecache_close(struct cb_db_basecache *c);

/* 1 and the hashes when a row for path matches key exactly and its checksum holds; 0 when
 * there is none, it is stale or it is damaged (never a wrong hash); -errno when the database
 * cannot be read. Lookups run in one read transaction, ended by the next begin or the close. */
int cb_db_basecache_get(struct cb_db_basecache *c, const char *path,
			const struct cb_basecache_key *key, unsigned char *sha256,
			unsigned char *xxh3);
/* One row of the shared cache whose checksum holds, as cb_db_basecache_list gives it. */
struct cb_db_basecache_row {
	const char *path; /* valid during the call only */
	struct cb_basecache_key key;
	unsigned char sha256[CB_SHA256_LEN];
	unsigned char xxh3[CB_XXH128_LEN];
};
/* Call fn for every intact row, in path order (strcmp's), in one scan instead of a lookup
 * per file; a damaged row is skipped as a lookup would miss it. fn's nonzero return ends the
 * scan and is returned; -errno when the database cannot be read. The caller still compares
 * each row's key with the file's stat: a row says what the file was, not what it is. */
int cb_db_basecache_list(struct cb_db_basecache *c,
			 int (*fn)(const struct cb_db_basecache_row *row, void *arg), void *arg);
/* As cb_db_basecache_list, for the rows whose path is >= from and < until (strcmp's order;
 * NULL: no bound on that side), so that two threads can share out one scan. */
int cb_db_basecache_list_range(struct cb_db_basecache *c, const char *from, const char *until,
			       int (*fn)(const struct cb_db_basecache_row *row, void *arg),
			       void *arg);
/* Remember path's hashes under key (replacing an older row), with the row's checksum. Puts
 * between begin and commit land together or not at all (a kill -9 leaves no half row). */
int cb_db_basecache_put(struct cb_db_basecache *c, const char *path,
			const struct cb_basecache_key *key, const unsigned char *sha256,
			const unsigned char *xxh3);
int cb_db_basecache_begin(struct cb_db_basecache *c);
int cb_db_basecache_commit(struct cb_db_basecache *c);

/* The pack: every row of a whole base in one blob beside the rows, so that a first map reads
 * them in one step (one row at a time costs more than the walk that checks them). */
struct cb_basecache_pack;
/* An empty pack, to add rows to in path order (strcmp's). 0 or -ENOMEM. */
int cb_basecache_pack_new(struct cb_basecache_pack **out);
/* Append one row; -ENAMETOOLONG for a path of PATH_MAX bytes or more, -ENOMEM. */
int cb_basecache_pack_add(struct cb_basecache_pack *p, const char *path,
			  const struct cb_basecache_key *key, const unsigned char *sha256,
			  const unsigned char *xxh3);
void cb_basecache_pack_free(struct cb_basecache_pack *p);
/* Make p the cache's pack (replacing the one there, in one transaction; nothing is written
 * when the same pack is there already). 0 or -errno. */
int cb_db_basecache_pack_store(struct cb_db_basecache *c, struct cb_basecache_pack *p);
/* Call fn for each row of the cache's pack, in the order they were added; fn returns 0, or
 * -errno to end the read. 1 when the whole pack was read; 0 when there is none or it is
 * damaged (its checksum or its layout is wrong: the rows fn had are intact, and the rest are
 * for the caller to look up); fn's error or -errno when the database cannot be read. As
 * with the rows, the caller compares each key with the file's stat. */
int cb_db_basecache_pack_list(struct cb_db_basecache *c,
			      int (*fn)(const struct cb_db_basecache_row *row, void *arg),
			      void *arg);

/* ---- db/turns_read.c: read transactions of the turn store ---- */

struct cb_db_turns;

/* Many lookups (the base cache of a whole base) as one read of meta.db: begin, and end (a
 * no-op outside a transaction). Nothing may be written in between. */
int cb_db_turns_read_begin(struct cb_db_turns *t);
void cb_db_turns_read_end(struct cb_db_turns *t);

/* ---- db/turns.c: the base map the background pass prepared ---- */

/* Empty base_map (before the first map fills it: it may hold prepared rows). */
int cb_db_turns_base_map_clear(struct cb_db_turns *t);
/* 1 when base_map holds the rows a finished background pass wrote (not yet frozen), 0 if
 * not, -errno. */
int cb_db_turns_base_prepared(struct cb_db_turns *t);
int cb_db_turns_base_prepared_set(struct cb_db_turns *t, int on);

/* ---- db/turns_bulk.c: the first map's rows in bulk ---- */

/* The same as a cb_db_turns_base_map_put of each of e[0..n), many rows to a statement; in the
 * caller's transaction. */
int cb_db_turns_base_map_put_many(struct cb_db_turns *t, const struct cb_entry *e, size_t n);

/* ---- ws/basecache.c: the workspace side ---- */

struct cb_turns;

/* The shared cache file of the base directory base_dir, under cache_dir: its name comes from
 * the base's device, inode and real path (*out is malloc'ed). */
int cb_ws_basecache_path(const char *cache_dir, const char *base_dir, char **out);

/* Use the shared cache under cache_dir for t's base (base_dir, as given to cb_turns_open):
 * lookups that miss meta.db's own cache try it, and newly hashed base files are added to it
 * when the handle is closed. A cache that cannot be opened (damaged, other schema) is not
 * used: -errno with a message to log, and t goes on without it. */
int cb_ws_basecache_attach(struct cb_turns *t, const char *cache_dir, const char *base_dir);

/* What the base hashing of one handle did, for the daemon's log and info. */
struct cb_ws_basecache_counts {
	long long from_own;    /* base files whose hashes meta.db's cache held */
	long long from_shared; /* ... the shared cache held */
	long long hashed;      /* base files read and hashed */
	long long shared_added;
	char damage[256]; /* non-empty: the shared cache failed (why) and is no longer used */
};
/* What t did so far, after writing its pending rows to the shared cache. */
void cb_ws_basecache_stats(struct cb_turns *t, struct cb_ws_basecache_counts *out);

/* Progress of a background base hash: read by other threads while it runs (atomics). */
struct cb_ws_prehash {
	/* set by the caller; called between files */
	int (*busy)(void *arg);	    /* 1: a turn op wants the base now */
	int (*wait)(void *arg);	    /* after the pass committed its rows: wait until it may go on;
				     * 1 to stop for good */
	int (*stopping)(void *arg); /* 1: end now (the daemon stops) */
	void *arg;
	/* written by the pass */
	int state; /* enum cb_ws_prehash_state */
	long long files_total, files_done, bytes_total, bytes_done;
	long long from_shared, hashed;
};

enum cb_ws_prehash_state {
	CB_PREHASH_IDLE = 0,
	CB_PREHASH_WALKING,
	CB_PREHASH_HASHING,
	CB_PREHASH_DONE,    /* every base file's hash is in meta.db's cache */
	CB_PREHASH_TAKEN,   /* the first snapshot recorded the base meanwhile */
	CB_PREHASH_STOPPED, /* the daemon stopped first */
	CB_PREHASH_FAILED,
};

/* The base has not changed since the background pass that prepared its map began walking
 * it (the daemon's base watch saw nothing move since): the first map takes the prepared rows
 * as they are, without walking the base again. Without this call it never does. */
void cb_ws_base_trust_prepared(struct cb_turns *t);

/* "walking", "hashing", ... */
const char *cb_ws_prehash_state_name(int state);

/* Hash the base ahead of the first snapshot, at the caller's priority: every regular file of
 * the base gets its row in meta.db's cache (from the shared cache when it holds a row that
 * still matches, else hashed and added to both), committed in small batches of complete
 * rows. Does nothing once the first snapshot recorded the base. Returns 0 (also when stopped
 * or overtaken) or -errno. */
int cb_ws_base_prehash(struct cb_turns *t, struct cb_ws_prehash *p);

#endif

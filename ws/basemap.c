/* The materialized map of the latest turn: built once from a walk of the base (hashes from
 * the base cache, the misses hashed on two threads, reporting progress) plus the deltas. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cowbox/basecache.h"
#include "cowbox/error.h"
#include "cowbox/grow.h"
#include "turns_int.h"
#include "util/beneath.h"

#define BASE_THREADS 2

struct base_walk {
	struct ws_base_file *it; /* sorted by path (ws_base_walk) */
	size_t n;
	/* hashing on threads */
	int base_fd;
	size_t next, done, misses;
	long long bytes_done, bytes_total;
	pthread_mutex_t lock;
	void (*progress)(void *, long long, long long, long long, long long);
	void *progress_arg;
	int (*stopping)(void *);
	void *stopping_arg;
	int stopped; /* under lock: a hash was given up, or stopping() said so */
	double last_draw;
};

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Called under w->lock: report progress at most ten times a second, and always at the start
 * and the end, so even a short hash shows a whole bar. */
static void base_report(struct base_walk *w, int force)
{
	double now = now_s();

	if (!w->progress || (!force && now - w->last_draw < 0.1))
		return;
	w->last_draw = now;
	w->progress(w->progress_arg, (long long)w->done, (long long)w->misses, w->bytes_done,
		    w->bytes_total);
}

static void *base_hash_thread(void *arg)
{
	struct base_walk *w = arg;

	for (unsigned files = 0;; files++) {
		struct ws_base_file *it = NULL;
		/* every 32 files: a small file hashes in tens of microseconds */
		int stop = w->stopping && !(files % 32) && w->stopping(w->stopping_arg);

		pthread_mutex_lock(&w->lock);
		w->stopped |= stop;
		while (w->next < w->n &&
		       (w->it[w->next].cached || !S_ISREG(w->it[w->next].st.st_mode)))
			w->next++;
		if (w->next < w->n && !w->stopped)
			it = &w->it[w->next++];
		pthread_mutex_unlock(&w->lock);
		if (!it)
			break;
		it->err = ws_hash_file_at(w->base_fd, it->path, -1, &it->h, &it->st, w->stopping,
					  w->stopping_arg);
		pthread_mutex_lock(&w->lock);
		w->stopped |= it->err == -ECANCELED;
		w->done++;
		w->bytes_done += it->st.st_size;
		base_report(w, 0);
		pthread_mutex_unlock(&w->lock);
	}
	return NULL;
}

/* Hash every cache miss; two threads when there is enough to share. */
static int base_hash_misses(struct base_walk *w)
{
	pthread_t th[BASE_THREADS];
	int nth = w->misses > 64 ? BASE_THREADS : 1, started = 0;

	pthread_mutex_init(&w->lock, NULL);
	if (w->misses)
		base_report(w, 1);
	for (int i = 1; i < nth; i++)
		if (pthread_create(&th[i], NULL, base_hash_thread, w) == 0)
			started++;
	base_hash_thread(w);
	for (int i = 1; i <= started; i++)
		pthread_join(th[i], NULL);
	pthread_mutex_lock(&w->lock);
	if (w->misses)
		base_report(w, 1);
	pthread_mutex_unlock(&w->lock);
	pthread_mutex_destroy(&w->lock);
	/* Files were left unhashed: nothing may be built from this walk. */
	if (w->stopped)
		return cb_error_set(ECANCELED, "hash base: given up, the daemon is stopping");
	for (size_t i = 0; i < w->n; i++)
		if (w->it[i].err)
			return cb_error_set(w->it[i].err, "hash base %s: failed", w->it[i].path);
	return 0;
}

/* The base map's entry of a walked item into e: a file's borrows path (*owned 0); a
 * directory's or a symlink's is read now by ws_base_now (the target; *owned 1), absent if
 * it went away meanwhile. */
static int base_entry_of(struct cb_turns *t, const char *path, const struct stat *st,
			 const struct cb_hash *h, struct cb_entry *e, char *owned)
{
	memset(e, 0, sizeof(*e));
	*owned = !S_ISREG(st->st_mode);
	if (*owned)
		return ws_base_now(t, path, e);
	e->path = (char *)path;
	e->type = CB_ENTRY_FILE;
	e->mode = st->st_mode & 07777;
	e->size = st->st_size;
	memcpy(e->sha256, h->sha256, CB_SHA256_LEN);
	memcpy(e->xxh3, h->xxh3, CB_XXH128_LEN);
	return 0;
}

int ws_base_map_row(struct cb_turns *t, const char *path, const struct stat *st,
		    const struct cb_hash *h)
{
	struct cb_entry e;
	char owned;
	int ret = base_entry_of(t, path, st, h, &e, &owned);

	if (!ret && e.type != CB_ENTRY_ABSENT)
		ret = cb_db_turns_base_map_put(t->db, &e);
	if (owned)
		cb_entry_clear(&e);
	return ret;
}

#define FILL_BATCH 1024

/* Put every base entry, frozen, in the base map (and new hashes in the cache), in path
 * order: each insert lands beside the last instead of at a random page of the b-tree, and
 * many rows go to one statement. The map is then copied from it in one statement. Called in
 * a transaction. */
static int base_fill(struct cb_turns *t, struct base_walk *w)
{
	struct cb_entry *e = calloc(FILL_BATCH, sizeof(*e));
	char owned[FILL_BATCH];
	size_t k = 0;
	int ret =
	    e ? cb_db_turns_base_map_clear(t->db) : cb_error_set(ENOMEM, "base map: out of memory");

	for (size_t i = 0; i < w->n && !ret; i++) {
		struct ws_base_file *it = &w->it[i];

		/* Hashed now. A row of the shared cache is not copied: meta.db's lookups fall
		 * through to it (ws_base_cache_get, ws_base_cache_find). */
		if (S_ISREG(it->st.st_mode) && !it->cached)
			ret = ws_base_cache_put(t, it->path, &it->st, &it->h, 1);
		if (!ret)
			ret = base_entry_of(t, it->path, &it->st, &it->h, &e[k], &owned[k]);
		if (ret || e[k].type == CB_ENTRY_ABSENT) {
			if (owned[k])
				cb_entry_clear(&e[k]);
			continue;
		}
		if (++k == FILL_BATCH) {
			ret = cb_db_turns_base_map_put_many(t->db, e, k);
			for (; k > 0; k--)
				if (owned[k - 1])
					cb_entry_clear(&e[k - 1]);
		}
	}
	if (!ret && k)
		ret = cb_db_turns_base_map_put_many(t->db, e, k);
	for (; k > 0; k--)
		if (owned[k - 1])
			cb_entry_clear(&e[k - 1]);
	free(e);
	return ret;
}

struct apply_arg {
	struct cb_turns *t;
	long long turn;
	struct ws_pathset paths;
};

static int collect_path(const char *path, void *arg)
{
	struct apply_arg *a = arg;

	return ws_pathset_add(&a->paths, path, 0, NULL);
}

/* What no cache vouched for: the files to hash and their bytes. */
static void base_count_misses(struct base_walk *w)
{
	w->misses = 0;
	w->bytes_total = 0;
	for (size_t i = 0; i < w->n; i++) {
		struct ws_base_file *it = &w->it[i];

		if (S_ISREG(it->st.st_mode) && !it->cached) {
			w->misses++;
			w->bytes_total += it->st.st_size;
		}
	}
}

/* The base read for a first map, short of hashing: meta.db's cache imported, the walk
 * (sorted; dir_opened told of each directory), what the caches vouch for. */
static int base_read(struct cb_turns *t, struct base_walk *w, void (*dir_opened)(void *, int),
		     void *arg)
{
	int ret = cb_db_turns_base_cache_import(t->db);

	/* In path order: the caches are read in one pass each, merged with it, and the inserts
	 * of base_fill walk each b-tree from left to right. */
	if (!ret)
		ret = ws_base_walk_watched(t->base_fd, dir_opened, arg, &w->it, &w->n);
	if (!ret)
		ret = ws_base_cache_find(t, w->it, w->n);
	if (!ret)
		base_count_misses(w);
	return ret;
}

struct cb_ws_base_scan {
	struct base_walk w;
};

void cb_ws_base_scan_free(struct cb_ws_base_scan *s)
{
	if (!s)
		return;
	ws_base_files_free(s->w.it, s->w.n);
	free(s);
}

int cb_ws_base_scan_ahead(struct cb_turns *t, void (*dir_opened)(void *, int), void *arg,
			  struct cb_ws_base_scan **out)
{
	struct cb_ws_base_scan *s;
	int ret;

	*out = NULL;
	/* Not whether the latest turn has its map: no turn may be recorded yet. */
	if (t->in_place || t->base_fd < 0 || cb_db_turns_base_map_built(t->db))
		return 0;
	if (!(s = calloc(1, sizeof(*s))))
		return cb_error_set(ENOMEM, "base scan: out of memory");
	if ((ret = base_read(t, &s->w, dir_opened, arg))) {
		cb_ws_base_scan_free(s);
		return cb_error_wrap(ret, "read the base ahead");
	}
	*out = s;
	return 0;
}

size_t cb_ws_base_scan_entries(const struct cb_ws_base_scan *s)
{
	return s ? s->w.n : 0;
}

void cb_ws_base_scan_use(struct cb_turns *t, struct cb_ws_base_scan *s)
{
	cb_ws_base_scan_free(t->ahead);
	t->ahead = s;
}

/* The base read for a first map: the scan read ahead when the caller gave one (the base has
 * not moved since it began), else base_read now; then the misses hashed. */
static int base_scan(struct cb_turns *t, struct base_walk *w)
{
	struct cb_ws_base_scan *ahead = t->ahead;
	int ret = 0;

	t->ahead = NULL;
	if (ahead) {
		*w = ahead->w;
		free(ahead);
		ws_base_cache_found(t, w->it, w->n);
		/* Rows added to a cache since the walk (another workspace hashed the base
		 * meanwhile) vouch for its misses too. */
		if (w->misses && !(ret = ws_base_cache_find(t, w->it, w->n)))
			base_count_misses(w);
	} else {
		ret = base_read(t, w, NULL, NULL);
	}
	w->base_fd = t->base_fd;
	w->progress = t->progress;
	w->progress_arg = t->progress_arg;
	w->stopping = t->stopping;
	w->stopping_arg = t->stopping_arg;
	return ret ? ret : base_hash_misses(w);
}

/* The map's rows in the caller's transaction: the base map (unless frozen or prepared: w is
 * then empty) copied into turn_map, the deltas up to latest (a's paths) applied. */
static int map_write(struct cb_turns *t, struct base_walk *w, int frozen, int prepared,
		     struct apply_arg *a)
{
	struct cb_entry e = {0};
	/* Prepared: the pass wrote turn_map as a copy of base_map in the same transaction, and
	 * nothing writes either before they are frozen (this function clears both first). */
	int ret = prepared ? 0 : cb_db_turns_map_clear(t->db);

	if (!ret && !frozen && !prepared)
		ret = base_fill(t, w);
	if (!ret && !prepared)
		ret = cb_db_turns_map_from_base(t->db);
	if (!ret && !frozen)
		ret = cb_db_turns_base_map_set_built(t->db);
	if (!ret && !frozen)
		ret = cb_db_turns_base_prepared_set(t->db, 0);
	for (size_t i = 0; i < a->paths.n && !ret; i++) {
		ret = cb_db_turns_delta_at(t->db, a->paths.p[i].path, a->turn, &e);
		if (ret == 1)
			ret = e.type == CB_ENTRY_ABSENT ? cb_db_turns_map_del(t->db, e.path)
							: cb_db_turns_map_put(t->db, &e);
	}
	if (!ret)
		ret = cb_db_turns_map_set_turn(t->db, a->turn);
	cb_entry_clear(&e);
	return ret;
}

/* A walked entry for ws_basecache_pack. */
static void walk_row(const void *arr, size_t i, const char **path, const struct stat **st,
		     const struct cb_hash **h)
{
	const struct ws_base_file *f = (const struct ws_base_file *)arr + i;

	*path = f->path;
	*st = &f->st;
	*h = &f->h;
}

/* 1 if the background pass prepared the base map and the caller may trust it. */
static int map_prepared(struct cb_turns *t)
{
	return t->base_prepared_ok && t->base_fd >= 0 && cb_db_turns_base_prepared(t->db) == 1;
}

int ws_map_would_walk(struct cb_turns *t)
{
	return !t->in_place && t->base_fd >= 0 &&
	       cb_db_turns_map_turn(t->db) != cb_db_turns_latest(t->db) &&
	       !cb_db_turns_base_map_built(t->db) && !map_prepared(t);
}

int ws_map_ensure(struct cb_turns *t)
{
	long long latest = cb_db_turns_latest(t->db);
	struct base_walk w = {.base_fd = -1};
	struct apply_arg a = {t, latest, {0}};
	int ret = 0, intx = 0, frozen, prepared = 0;

	if (cb_db_turns_map_turn(t->db) == latest)
		return 0;
	/* Once recorded, the base map is the base: no walk, and a base changed since does not
	 * rewrite history. */
	frozen = cb_db_turns_base_map_built(t->db);
	/* The background pass wrote the base map and nothing moved in the base since its walk
	 * began: it is frozen as it is (no walk, no stat). */
	if (!frozen)
		prepared = map_prepared(t);
	if (!frozen && !prepared && t->base_fd >= 0)
		ret = base_scan(t, &w);
	if (!ret)
		ret = cb_db_turns_delta_paths(t->db, 0, latest, collect_path, &a);
	if (!ret)
		ret = cb_db_turns_begin(t->db);
	if (ret)
		goto out;
	intx = 1;
	ret = map_write(t, &w, frozen, prepared, &a);
	if (!ret)
		ret = cb_db_turns_commit(t->db);
	if (!ret)
		intx = 0;
	if (!ret && w.n)
		ws_basecache_pack(t, w.it, w.n, walk_row);
out:
	if (intx)
		cb_db_turns_rollback(t->db);
	ws_pathset_free(&a.paths);
	ws_base_files_free(w.it, w.n);
	return ret ? cb_error_wrap(ret, "build the turn map") : 0;
}

struct cb_ws_first_map {
	struct base_walk w;
	long long turn;
	long long map_id; /* fresh: adopted when the rows are committed */
};

void cb_ws_map_first_free(struct cb_ws_first_map *p)
{
	if (!p)
		return;
	ws_base_files_free(p->w.it, p->w.n);
	free(p);
}

static int count_path(const char *path, void *arg)
{
	(void)path;
	++*(size_t *)arg;
	return 0;
}

/* The first map's answer from the walk itself: every regular file, in path order. */
static int first_list(struct cb_ws_first_map *p, int (*fn)(const struct cb_entry *, void *),
		      void *arg)
{
	int ret = 0;

	for (size_t i = 0; i < p->w.n && !ret; i++) {
		const struct ws_base_file *it = &p->w.it[i];
		struct cb_entry e = {
		    .path = it->path,
		    .type = CB_ENTRY_FILE,
		    .mode = it->st.st_mode & 07777,
		    .size = it->st.st_size,
		};

		if (!S_ISREG(it->st.st_mode))
			continue;
		memcpy(e.sha256, it->h.sha256, CB_SHA256_LEN);
		memcpy(e.xxh3, it->h.xxh3, CB_XXH128_LEN);
		ret = fn(&e, arg);
	}
	return ret;
}

int cb_ws_map_first(struct cb_turns *t, int (*fn)(const struct cb_entry *, void *), void *arg,
		    struct cb_ws_first_map **pending, long long *map_id)
{
	struct cb_ws_first_map *p = NULL;
	size_t deltas = 0;
	int ret = 0;

	*pending = NULL;
	/* Only a map that would be built from a walk of the base, with no delta on top (the
	 * latest turn recorded nothing): anything else is read from the rows as ever. */
	if (ws_map_would_walk(t))
		ret = cb_db_turns_delta_paths(t->db, 0, cb_db_turns_latest(t->db), count_path,
					      &deltas);
	if (ret || !ws_map_would_walk(t) || deltas) {
		if (!ret)
			ret = cb_db_turns_map_id(t->db, map_id);
		return ret ? ret : cb_ws_map_list(t, fn, arg);
	}
	if (!(p = calloc(1, sizeof(*p))))
		return cb_error_set(ENOMEM, "first map: out of memory");
	p->w.base_fd = -1;
	p->turn = cb_db_turns_latest(t->db);
	ret = cb_db_turns_map_id_fresh(&p->map_id);
	if (!ret)
		ret = base_scan(t, &p->w);
	if (!ret)
		ret = first_list(p, fn, arg);
	if (ret) {
		cb_ws_map_first_free(p);
		return cb_error_wrap(ret, "build the turn map");
	}
	*map_id = p->map_id;
	*pending = p;
	return 0;
}

int cb_ws_map_first_write(struct cb_turns *t, struct cb_ws_first_map *p)
{
	struct apply_arg a = {t, p->turn, {0}};
	int ret = cb_db_turns_begin(t->db);

	if (ret)
		return cb_error_wrap(ret, "write the first map");
	/* Someone built the map meanwhile (a diff between recorded turns ensures it without the
	 * turn lock), maybe from another walk: its rows stand, and the id the client was given
	 * is never adopted, so that client gets the whole map once more. */
	if (cb_db_turns_latest(t->db) != p->turn || cb_db_turns_map_turn(t->db) == p->turn ||
	    cb_db_turns_base_map_built(t->db))
		goto out;
	ret = map_write(t, &p->w, 0, 0, &a);
	if (!ret)
		ret = cb_db_turns_map_id_set(t->db, p->map_id);
	if (!ret)
		ret = cb_db_turns_commit(t->db);
	/* The walk, every file hashed: the next workspace's first map reads it as one pack.
	 * (After meta.db's commit: never while holding its write lock.) */
	if (!ret)
		ws_basecache_pack(t, p->w.it, p->w.n, walk_row);
out:
	cb_db_turns_rollback(t->db);
	return ret ? cb_error_wrap(ret, "write the first map") : 0;
}

int cb_ws_map_list(struct cb_turns *t, int (*fn)(const struct cb_entry *, void *), void *arg)
{
	int ret = ws_map_ensure(t);

	return ret ? ret : cb_db_turns_map_list(t->db, NULL, fn, arg);
}

static long long ns_of(const struct timespec *ts)
{
	return (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec;
}

struct base_changes {
	struct cb_turns *t;
	struct base_walk *w; /* sorted by path */
	size_t at;	     /* merge position in w */
	int vs_map;
	struct ws_pathset *set;
	struct cb_entry now;
	long long *hashed;
};

/* Rehash (and re-cache) every walked file the cache did not vouch for: its stat moved since
 * it was hashed, or it is new. Never trusted. A file gone since the walk stays a miss. */
static int base_rehash_misses(struct base_changes *c)
{
	struct cb_turns *t = c->t;
	int ret = 0;

	for (size_t i = 0; i < c->w->n && !ret; i++) {
		struct ws_base_file *it = &c->w->it[i];
		struct stat hst;

		if (it->cached || !S_ISREG(it->st.st_mode))
			continue;
		(*c->hashed)++;
		ret = cb_ws_hash_file_at(t->base_fd, it->path, -1, &it->h, &hst);
		if (ret == -ENOENT) {
			it->err = ENOENT;
			ret = 0;
			continue;
		}
		if (ret)
			return cb_error_wrap(ret, "base");
		it->st = hst;
		it->cached = 1;
		ret = cb_db_turns_base_cache_put(t->db, it->path, hst.st_size, ns_of(&hst.st_mtim),
						 ns_of(&hst.st_ctim), (long long)hst.st_ino,
						 it->h.sha256, it->h.xxh3);
	}
	return ret;
}

/* 1 if the mount shows the base's entry at path: the upper layer holds nothing there (a file,
 * directory or whiteout of its own at path, or a non-directory above it, hides the base). */
static int base_visible(struct cb_turns *t, const char *path)
{
	struct stat st;

	/* In place, the base is the upper layer: the mount shows it everywhere. */
	return t->in_place || cb_beneath_stat(t->root_fd, path, &st) == -ENOENT;
}

/* The base's entry for a walked item now (absent if it went away meanwhile). */
static int base_item_entry(struct cb_turns *t, const struct ws_base_file *it, struct cb_entry *now)
{
	cb_entry_clear(now);
	if (!S_ISREG(it->st.st_mode))
		return ws_base_now(t, it->path, now);
	if (it->err)
		return 0;
	if (!(now->path = strdup(it->path)))
		return cb_error_set(ENOMEM, "base %s: out of memory", it->path);
	now->type = CB_ENTRY_FILE;
	now->mode = it->st.st_mode & 07777;
	now->size = it->st.st_size;
	memcpy(now->sha256, it->h.sha256, CB_SHA256_LEN);
	memcpy(now->xxh3, it->h.xxh3, CB_XXH128_LEN);
	return 0;
}

/* Compare what the base holds at path now (it, or NULL: nothing) with the recorded entry
 * (ref, or NULL: none) and add the path when they differ where the mount would show it. */
static int base_compare(struct base_changes *c, const char *path, const struct ws_base_file *it,
			const struct cb_entry *ref)
{
	static const struct cb_entry absent = {0};
	int ret = 0;

	cb_entry_clear(&c->now);
	if (it && (ret = base_item_entry(c->t, it, &c->now)))
		return ret;
	if (cb_entry_same(&c->now, ref ? ref : &absent))
		return 0;
	if (c->vs_map && !base_visible(c->t, path))
		return 0;
	return ws_pathset_add(c->set, path, 0, NULL);
}

/* One pass over the recorded entries (in path order) merged with the sorted walk: a base
 * entry before the next recorded one was added, a recorded one the walk lacks was deleted. */
static int base_ref_merge(const struct cb_entry *ref, void *arg)
{
	struct base_changes *c = arg;
	struct base_walk *w = c->w;
	int ret = 0;

	while (!ret && c->at < w->n && strcmp(w->it[c->at].path, ref->path) < 0) {
		ret = base_compare(c, w->it[c->at].path, &w->it[c->at], NULL);
		c->at++;
	}
	if (ret)
		return ret;
	if (c->at < w->n && !strcmp(w->it[c->at].path, ref->path))
		return base_compare(c, ref->path, &w->it[c->at++], ref);
	return ref->type == CB_ENTRY_ABSENT ? 0 : base_compare(c, ref->path, NULL, ref);
}

static int base_ref_row(const struct cb_entry *e, long long from, long long until, void *arg)
{
	(void)from;
	(void)until;
	return base_ref_merge(e, arg);
}

int ws_base_changes(struct cb_turns *t, int vs_map, struct ws_pathset *set,
		    struct cb_ws_base_stats *stats)
{
	struct base_walk w = {0};
	struct base_changes c = {.t = t, .w = &w, .vs_map = vs_map, .set = set};
	size_t n0 = set->n;
	int ret = 0;

	memset(stats, 0, sizeof(*stats));
	c.hashed = &stats->hashed;
	/* Before the first snapshot froze the base there is no record it could differ from. */
	if (t->base_fd < 0 || !cb_db_turns_base_map_built(t->db))
		return 0;
	if (vs_map && (ret = ws_map_ensure(t)))
		goto out;
	/* Sorted like SQLite's ORDER BY path (bytes), so that the caches and the record are
	 * each read in one pass instead of a look-up per file. */
	ret = ws_base_walk(t->base_fd, &w.it, &w.n);
	if (ret)
		goto out;
	stats->entries = (long long)w.n;
	ret = ws_base_cache_find(t, w.it, w.n);
	if (!ret)
		ret = base_rehash_misses(&c);
	c.at = 0;
	if (!ret)
		ret = vs_map ? cb_db_turns_map_list(t->db, NULL, base_ref_merge, &c)
			     : cb_db_turns_base_entries(t->db, base_ref_row, &c);
	for (; !ret && c.at < w.n; c.at++)
		ret = base_compare(&c, w.it[c.at].path, &w.it[c.at], NULL);
	if (!ret)
		stats->changed = (long long)(set->n - n0);
out:
	cb_entry_clear(&c.now);
	ws_base_files_free(w.it, w.n);
	return ret ? cb_error_wrap(ret, "check the base") : 0;
}

int cb_ws_base_check(struct cb_turns *t, int (*changed)(void *, const char *), void *arg,
		     struct cb_ws_base_stats *stats)
{
	struct ws_pathset set = {0};
	int ret = ws_base_changes(t, 1, &set, stats);

	ws_pathset_sort(&set);
	for (size_t i = 0; i < set.n && !ret; i++)
		ret = changed(arg, set.p[i].path);
	ws_pathset_free(&set);
	return ret;
}

struct changes_arg {
	struct cb_turns *t;
	long long since;
	int (*fn)(const char *path, const struct cb_entry *now, void *);
	void *arg;
};

/* One path a delta after since names, as the statement that lists them steps (it reads only
 * other statements' rows): nothing is collected, however many paths changed. */
static int changes_one(const char *path, void *arg)
{
	struct changes_arg *a = arg;
	struct cb_entry now = {0}, then = {0};
	int ret = cb_db_turns_map_get(a->t->db, path, &now);

	if (ret == 1 && now.type == CB_ENTRY_FILE) {
		ret = a->fn(path, &now, a->arg);
	} else if (ret >= 0) {
		/* Not a file now: deleted for the client only if it was one at since. */
		ret = ws_entry_at(a->t, path, a->since, &then);
		if (!ret && then.type == CB_ENTRY_FILE)
			ret = a->fn(path, NULL, a->arg);
	}
	cb_entry_clear(&now);
	cb_entry_clear(&then);
	return ret;
}

/* Only the paths the deltas after since name are looked at: a snapshot after ten changes
 * answers with ten rows whatever the size of the tree. */
int cb_ws_map_changes(struct cb_turns *t, long long since,
		      int (*fn)(const char *path, const struct cb_entry *now, void *), void *arg)
{
	long long latest = cb_db_turns_latest(t->db);
	struct changes_arg a = {t, since, fn, arg};
	int ret = ws_map_ensure(t);

	if (!ret && since > latest)
		ret =
		    cb_error_set(ESTALE, "turn %lld does not exist (latest: %lld)", since, latest);
	if (!ret && (ret = ws_turn_check(t, since))) {
		char why[512];

		snprintf(why, sizeof(why), "%s", cb_error_message());
		ret = cb_error_set(ESTALE, "%s", why);
	}
	if (!ret)
		ret = cb_db_turns_delta_paths(t->db, since, latest, changes_one, &a);
	return ret;
}

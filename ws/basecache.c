/* The workspace side of the shared base hash cache: lookups that fall through from meta.db's
 * own cache to the shared one, and the background pass that fills both before the first map. */
#include "config.h"

#include <dirent.h>
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

struct bc_row {
	char *path;
	struct cb_basecache_key key;
	struct cb_hash h;
};

struct ws_basecache {
	struct cb_db_basecache *db; /* NULL once dropped after a failure */
	struct cb_ws_basecache_counts stats;
	/* Rows hashed by this handle, for the shared cache: written after meta.db's transaction
	 * (never while holding its write lock, which the journal needs too). */
	struct bc_row *pending;
	size_t npending, cap;
};

/* Stop using the shared cache after a failure: what it said goes to stats.damage for the
 * daemon's log; every later lookup is a miss, so the base is hashed instead. */
static void bc_drop(struct ws_basecache *bc, const char *why)
{
	if (!bc->stats.damage[0])
		snprintf(bc->stats.damage, sizeof(bc->stats.damage), "%s", why);
	cb_db_basecache_close(bc->db);
	bc->db = NULL;
	cb_error_clear();
}

int cb_ws_basecache_path(const char *cache_dir, const char *base_dir, char **out)
{
	char *real = realpath(base_dir, NULL), *key = NULL;
	char hex[2 * CB_SHA256_LEN + 1];
	struct cb_hash h;
	struct stat st;
	int ret = 0;

	*out = NULL;
	if (!real || stat(real, &st) < 0) {
		ret = cb_error_set(errno, "base %s: %s", base_dir, strerror(errno));
		goto out;
	}
	/* The same path over another directory (the repo cloned anew) gets a cache of its own. */
	if (asprintf(&key, "%llu:%llu:%s", (unsigned long long)st.st_dev,
		     (unsigned long long)st.st_ino, real) < 0) {
		key = NULL;
		ret = cb_error_set(ENOMEM, "base %s: out of memory", base_dir);
		goto out;
	}
	cb_ws_hash_bytes(key, strlen(key), &h);
	cb_hex(h.sha256, 16, hex);
	if (asprintf(out, "%s/%s.db", cache_dir, hex) < 0) {
		*out = NULL;
		ret = cb_error_set(ENOMEM, "base %s: out of memory", base_dir);
	}
out:
	free(real);
	free(key);
	return ret;
}

int cb_ws_basecache_attach(struct cb_turns *t, const char *cache_dir, const char *base_dir)
{
	char *path = NULL;
	int ret;

	if (t->bc || t->base_fd < 0)
		return 0;
	if (!(t->bc = calloc(1, sizeof(*t->bc))))
		return cb_error_set(ENOMEM, "shared base cache: out of memory");
	ret = cb_ws_basecache_path(cache_dir, base_dir, &path);
	if (!ret)
		ret = cb_db_basecache_open(path, &t->bc->db);
	free(path);
	return ret ? cb_error_wrap(ret, "hashing the base without the shared cache") : 0;
}

/* Write the pending rows to the shared cache in one transaction. A failure drops the cache
 * (the rows are lost: other workspaces hash those files themselves). */
static void bc_share_flush(struct ws_basecache *bc)
{
	int ret = 0;

	if (bc->db && bc->npending) {
		ret = cb_db_basecache_begin(bc->db);
		for (size_t i = 0; i < bc->npending && !ret; i++)
			ret = cb_db_basecache_put(bc->db, bc->pending[i].path, &bc->pending[i].key,
						  bc->pending[i].h.sha256, bc->pending[i].h.xxh3);
		if (!ret)
			ret = cb_db_basecache_commit(bc->db);
		if (ret)
			bc_drop(bc, cb_error_message());
		else
			bc->stats.shared_added += (long long)bc->npending;
	}
	for (size_t i = 0; i < bc->npending; i++)
		free(bc->pending[i].path);
	bc->npending = 0;
}

void ws_basecache_detach(struct cb_turns *t)
{
	struct ws_basecache *bc = t->bc;

	if (!bc)
		return;
	bc_share_flush(bc);
	cb_db_basecache_close(bc->db);
	free(bc->pending);
	free(bc);
	t->bc = NULL;
}

void cb_ws_basecache_stats(struct cb_turns *t, struct cb_ws_basecache_counts *out)
{
	memset(out, 0, sizeof(*out));
	if (!t->bc)
		return;
	bc_share_flush(t->bc);
	*out = t->bc->stats;
}

int ws_base_cache_get(struct cb_turns *t, const char *path, const struct stat *st,
		      struct cb_hash *h)
{
	struct cb_basecache_key k;
	int ret;

	cb_basecache_key_of(st, &k);
	ret = cb_db_turns_base_cache_get(t->db, path, k.size, k.mtime_ns, k.ctime_ns, k.ino,
					 h->sha256, h->xxh3);
	if (ret == 1 && t->bc)
		t->bc->stats.from_own++;
	if (ret || !t->bc || !t->bc->db)
		return ret;
	ret = cb_db_basecache_get(t->bc->db, path, &k, h->sha256, h->xxh3);
	if (ret < 0) {
		bc_drop(t->bc, cb_error_message());
		return 0;
	}
	if (ret)
		t->bc->stats.from_shared++;
	return ret ? 2 : 0;
}

int ws_base_cache_put(struct cb_turns *t, const char *path, const struct stat *st,
		      const struct cb_hash *h, int hashed)
{
	struct ws_basecache *bc = t->bc;
	struct cb_basecache_key k;
	int ret;

	cb_basecache_key_of(st, &k);
	ret = cb_db_turns_base_cache_put(t->db, path, k.size, k.mtime_ns, k.ctime_ns, k.ino,
					 h->sha256, h->xxh3);
	if (ret || !hashed || !bc)
		return ret;
	bc->stats.hashed++;
	if (!bc->db)
		return 0;
	ret = cb_grow(&bc->pending, &bc->cap, bc->npending, sizeof(*bc->pending), 256,
		      "shared base cache");
	if (!ret && !(bc->pending[bc->npending].path = strdup(path)))
		ret = cb_error_set(ENOMEM, "shared base cache: out of memory");
	if (ret) {
		bc_drop(bc, cb_error_message());
		return 0;
	}
	bc->pending[bc->npending].key = k;
	bc->pending[bc->npending++].h = *h;
	return 0;
}

struct find_merge {
	struct ws_base_file *f;
	size_t n, at;
	long long found;
};

/* The file at path in the sorted files, if it is there, still to be found, and its stat is
 * the row's key (a row says what the file was when hashed, not what it is): it takes the
 * row's hashes. own: a row of meta.db's cache, whose rows are of this base (no device). */
static void find_take(struct find_merge *m, const char *path, const struct cb_basecache_key *key,
		      int own, const unsigned char *sha256, const unsigned char *xxh3)
{
	struct cb_basecache_key k;
	struct ws_base_file *f;
	int c = 1;

	while (m->at < m->n && (c = strcmp(m->f[m->at].path, path)) < 0)
		m->at++;
	if (m->at >= m->n || c || m->f[m->at].cached || !S_ISREG(m->f[m->at].st.st_mode))
		return;
	f = &m->f[m->at];
	cb_basecache_key_of(&f->st, &k);
	if (own)
		k.dev = key->dev;
	if (memcmp(&k, key, sizeof(k)))
		return;
	f->cached = own ? 1 : 2;
	memcpy(f->h.sha256, sha256, CB_SHA256_LEN);
	memcpy(f->h.xxh3, xxh3, CB_XXH128_LEN);
	m->found++;
}

static int find_own_row(const struct cb_db_cache_row *row, void *arg)
{
	struct cb_basecache_key key = {.ino = row->ino,
				       .size = row->size,
				       .mtime_ns = row->mtime_ns,
				       .ctime_ns = row->ctime_ns};

	find_take(arg, row->path, &key, 1, row->sha256, row->xxh3);
	return 0;
}

static int find_shared_row(const struct cb_db_basecache_row *row, void *arg)
{
	find_take(arg, row->path, &row->key, 0, row->sha256, row->xxh3);
	return 0;
}

/* Fewer files than this are read from the shared cache on one thread: a second handle and
 * thread cost more than half of a small scan. */
#define FIND_SPLIT_MIN 8192

/* One half of the shared cache's scan, on its own handle: the rows from the path of its first
 * file on, merged into its files (which come after the other half's). */
struct find_half {
	struct cb_db_basecache *db;
	struct find_merge m;
	int ret;
	char msg[512];
};

static void *find_half_thread(void *arg)
{
	struct find_half *h = arg;

	h->ret = cb_db_basecache_list_range(h->db, h->m.f[0].path, NULL, find_shared_row, &h->m);
	if (h->ret < 0)
		snprintf(h->msg, sizeof(h->msg), "%s", cb_error_message());
	return NULL;
}

/* The shared cache's rows merged into files f, in one scan or, for many files, two at once
 * (a thread and a second handle taking the rows from the middle file's path on). The rows
 * found are counted in m->found. */
static int find_shared_rows(struct ws_basecache *bc, struct find_merge *m)
{
	struct find_half h = {.ret = 0};
	size_t half = m->n / 2;
	pthread_t id;
	int ret, split = 0;

	if (m->n >= FIND_SPLIT_MIN && !cb_db_basecache_open_reader(bc->db, &h.db)) {
		h.m = (struct find_merge){.f = m->f + half, .n = m->n - half};
		split = pthread_create(&id, NULL, find_half_thread, &h) == 0;
	}
	cb_error_clear(); /* without a second handle or thread, one scan does it all */
	if (!split) {
		ret = cb_db_basecache_list_range(bc->db, NULL, NULL, find_shared_row, m);
	} else {
		struct find_merge lo = {.f = m->f, .n = half};

		ret =
		    cb_db_basecache_list_range(bc->db, NULL, m->f[half].path, find_shared_row, &lo);
		pthread_join(id, NULL);
		m->found += lo.found + h.m.found;
		if (!ret && h.ret)
			ret = cb_error_set(h.ret, "%s", h.msg);
	}
	cb_db_basecache_close(h.db);
	return ret;
}

/* Fewer files than this still missing after the pack are looked up one by one; more, and
 * the rows are scanned. */
#define FIND_LOOKUP_MAX 4096

/* The shared cache merged into files f: its pack first (one read for a whole base), then the
 * rows for what the pack did not vouch for (a file changed since, or no pack at all). */
static int find_shared(struct ws_basecache *bc, struct find_merge *m)
{
	int packed = cb_db_basecache_pack_list(bc->db, find_shared_row, m);
	size_t misses = 0;
	int ret = 0;

	if (packed < 0)
		return packed;
	for (size_t i = 0; i < m->n; i++)
		misses += S_ISREG(m->f[i].st.st_mode) && !m->f[i].cached;
	if (!misses)
		return 0;
	if (!packed || misses > FIND_LOOKUP_MAX) {
		m->at = 0;
		return find_shared_rows(bc, m);
	}
	for (size_t i = 0; i < m->n && ret >= 0; i++) {
		struct ws_base_file *f = &m->f[i];
		struct cb_basecache_key k;

		if (!S_ISREG(f->st.st_mode) || f->cached)
			continue;
		cb_basecache_key_of(&f->st, &k);
		ret = cb_db_basecache_get(bc->db, f->path, &k, f->h.sha256, f->h.xxh3);
		if (ret > 0) {
			f->cached = 2;
			m->found++;
		}
	}
	return ret < 0 ? ret : 0;
}

int ws_base_cache_find(struct cb_turns *t, struct ws_base_file *f, size_t n)
{
	struct find_merge m = {.f = f, .n = n};
	long long own;
	int ret = cb_db_turns_base_cache_list(t->db, find_own_row, &m);

	if (ret)
		return ret;
	own = m.found;
	if (t->bc)
		t->bc->stats.from_own += own;
	if (!t->bc || !t->bc->db || (size_t)own == n)
		return 0;
	m.at = 0;
	ret = find_shared(t->bc, &m);
	/* What was read holds (intact rows whose key matched); as after a failed lookup, the
	 * shared cache is dropped and the rest hashed. */
	if (ret < 0)
		bc_drop(t->bc, cb_error_message());
	t->bc->stats.from_shared += m.found - own;
	return 0;
}

void ws_base_cache_found(struct cb_turns *t, const struct ws_base_file *f, size_t n)
{
	if (!t->bc)
		return;
	for (size_t i = 0; i < n; i++) {
		if (f[i].cached == 1)
			t->bc->stats.from_own++;
		else if (f[i].cached == 2)
			t->bc->stats.from_shared++;
	}
}

/* The most rows a pack is made of (about 30 MB): larger bases are read row by row. */
#define PACK_ROWS_MAX 262144

void ws_basecache_pack(struct cb_turns *t, const void *arr, size_t n, ws_basecache_row_fn row)
{
	struct cb_basecache_pack *pack = NULL;
	struct cb_basecache_key k;
	int ret;

	if (!t->bc || !t->bc->db || n > PACK_ROWS_MAX)
		return;
	ret = cb_basecache_pack_new(&pack);
	for (size_t i = 0; i < n && !ret; i++) {
		const struct stat *st;
		const struct cb_hash *h;
		const char *path;

		row(arr, i, &path, &st, &h);
		if (!S_ISREG(st->st_mode))
			continue;
		cb_basecache_key_of(st, &k);
		ret = cb_basecache_pack_add(pack, path, &k, h->sha256, h->xxh3);
	}
	if (!ret)
		ret = cb_db_basecache_pack_store(t->bc->db, pack);
	if (ret)
		bc_drop(t->bc, cb_error_message());
	cb_basecache_pack_free(pack);
}

/* ---- the background pass ---- */

struct pre_file {
	char *path;
	struct stat st;
	struct cb_hash h;
	int hashed; /* read here (else copied from the shared cache) */
	int store;  /* a row for meta.db's cache */
	int failed; /* gone or unreadable: no base map can be prepared */
};

struct pre_walk {
	struct pre_file *f;
	size_t n, cap;
	struct cb_ws_prehash *p;
	struct cb_turns *t;
	size_t seen;
	int failed;  /* an entry could not be read: the walk is not the whole base */
	int stopped; /* the walk ended early: the daemon stops, or the first map was built */
};

/* Every few entries: while a turn op runs (the first snapshot walks the base itself, on both
 * cores) the pass waits instead of competing; it ends if that op built the first map. */
static int pre_yield(struct pre_walk *w)
{
	struct cb_ws_prehash *p = w->p;

	if ((++w->seen & 255) || !p->busy || !p->busy(p->arg))
		return 0;
	if ((p->wait && p->wait(p->arg)) || cb_db_turns_base_map_built(w->t->db))
		w->stopped = 1;
	return w->stopped;
}

static int pre_add(struct pre_walk *w, const char *path, const struct stat *st)
{
	int ret = cb_grow(&w->f, &w->cap, w->n, sizeof(*w->f), 1024, "base walk");

	if (ret)
		return ret;
	memset(&w->f[w->n], 0, sizeof(w->f[w->n]));
	if (!(w->f[w->n].path = strdup(path)))
		return cb_error_set(ENOMEM, "base walk: out of memory");
	w->f[w->n++].st = *st;
	if (S_ISREG(st->st_mode)) {
		__atomic_add_fetch(&w->p->files_total, 1, __ATOMIC_RELAXED);
		__atomic_add_fetch(&w->p->bytes_total, (long long)st->st_size, __ATOMIC_RELAXED);
	}
	return 0;
}

/* The entries below path (regular files, directories and symlinks, as the first map takes
 * them), read beside each directory's fd (beneath the base, no link followed); a name gone
 * meanwhile is skipped (the snapshot's own walk sees the truth). */
static int pre_walk_dir(struct pre_walk *w, int base_fd, const char *path)
{
	int fd = cb_beneath_open(base_fd, path[0] ? path : ".", O_RDONLY | O_DIRECTORY, 0);
	struct dirent *de;
	DIR *dir;
	int ret = 0;

	if (fd < 0) {
		w->failed = 1;
		return cb_beneath_gone(fd) ? 0 : cb_error_wrap(fd, "base");
	}
	if (!(dir = fdopendir(fd))) {
		close(fd);
		return cb_error_set(errno, "base %s: %s", path, strerror(errno));
	}
	while (!ret && (de = readdir(dir))) {
		struct stat st;
		char *child;

		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if ((w->p->stopping && w->p->stopping(w->p->arg)) || w->stopped || pre_yield(w)) {
			w->stopped = 1;
			break;
		}
		if (asprintf(&child, "%s%s%s", path, path[0] ? "/" : "", de->d_name) < 0) {
			ret = cb_error_set(ENOMEM, "base walk: out of memory");
			break;
		}
		if (fstatat(dirfd(dir), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
			w->failed = 1;
		} else if (S_ISREG(st.st_mode) || S_ISDIR(st.st_mode) || S_ISLNK(st.st_mode)) {
			ret = pre_add(w, child, &st);
			if (!ret && S_ISDIR(st.st_mode))
				ret = pre_walk_dir(w, base_fd, child);
		}
		free(child);
	}
	closedir(dir);
	return ret;
}

/* Commit the rows of files [from, to): complete rows only, in one transaction each. */
static int pre_flush(struct cb_turns *t, struct pre_walk *w, size_t from, size_t to)
{
	int ret = from < to ? cb_db_turns_begin(t->db) : 0;

	if (from >= to)
		return 0;
	for (size_t i = from; i < to && !ret; i++)
		if (w->f[i].store)
			ret = ws_base_cache_put(t, w->f[i].path, &w->f[i].st, &w->f[i].h,
						w->f[i].hashed);
	if (!ret)
		ret = cb_db_turns_commit(t->db);
	if (ret)
		cb_db_turns_rollback(t->db);
	/* The shared rows go out with each batch too, so another daemon sees them soon. */
	if (!ret && t->bc)
		bc_share_flush(t->bc);
	return ret;
}

static double mono_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* One file: from meta.db's cache (nothing to store), the shared cache or a fresh hash. */
static int pre_one(struct cb_turns *t, struct pre_file *f, struct cb_ws_prehash *p)
{
	struct stat hst;
	int ret = S_ISREG(f->st.st_mode) ? ws_base_cache_get(t, f->path, &f->st, &f->h) : 1;

	if (ret < 0)
		return ret;
	if (ret == 2)
		__atomic_add_fetch(&p->from_shared, 1, __ATOMIC_RELAXED);
	if (ret != 0) {
		f->store = ret == 2;
		return 0;
	}
	ret = ws_hash_file_at(t->base_fd, f->path, -1, &f->h, &hst, p->stopping, p->arg);
	if (ret) {
		/* Gone or unreadable now: the snapshot meets it and says so; not ours to fail.
		 * Given up for a stop: the loop sees the stop next. */
		cb_error_clear();
		f->failed = 1;
		return 0;
	}
	f->st = hst; /* the stat the hash is valid for */
	f->hashed = 1;
	f->store = 1;
	__atomic_add_fetch(&p->hashed, 1, __ATOMIC_RELAXED);
	return 0;
}

static int pre_file_cmp(const void *a, const void *b)
{
	return strcmp(((const struct pre_file *)a)->path, ((const struct pre_file *)b)->path);
}

/* A file of the pass's walk for ws_basecache_pack. */
static void pre_row(const void *arr, size_t i, const char **path, const struct stat **st,
		    const struct cb_hash **h)
{
	const struct pre_file *f = (const struct pre_file *)arr + i;

	*path = f->path;
	*st = &f->st;
	*h = &f->h;
}

/* The whole walk is hashed: write the base map the first snapshot would build from it (in
 * path order), marked prepared, so that the first snapshot only freezes it when the base
 * did not move since (cb_ws_base_trust_prepared). Nothing is prepared when an entry could
 * not be read. */
static int pre_prepare_map(struct cb_turns *t, struct pre_walk *w)
{
	int ret;

	for (size_t i = 0; i < w->n; i++)
		if (w->f[i].failed)
			w->failed = 1;
	if (w->failed)
		return 0;
	if (w->n) /* an empty base has no array to sort */
		qsort(w->f, w->n, sizeof(*w->f), pre_file_cmp);
	if ((ret = cb_db_turns_begin(t->db)))
		return ret;
	/* The first snapshot may have frozen the base meanwhile: its map is the one. */
	if (cb_db_turns_base_map_built(t->db))
		goto out;
	ret = cb_db_turns_base_prepared_set(t->db, 0);
	if (!ret)
		ret = cb_db_turns_base_map_clear(t->db);
	for (size_t i = 0; i < w->n && !ret; i++)
		ret = ws_base_map_row(t, w->f[i].path, &w->f[i].st, &w->f[i].h);
	/* The map of turn 0 too (every later turn's starts from it): the first snapshot then
	 * writes only its own changes, not a copy of the whole base. */
	if (!ret)
		ret = cb_db_turns_map_clear(t->db);
	if (!ret)
		ret = cb_db_turns_map_from_base(t->db);
	if (!ret)
		ret = cb_db_turns_base_prepared_set(t->db, 1);
out:
	if (!ret)
		ret = cb_db_turns_commit(t->db);
	if (ret)
		cb_db_turns_rollback(t->db);
	if (!ret)
		ws_basecache_pack(t, w->f, w->n, pre_row);
	return ret;
}

void cb_ws_base_trust_prepared(struct cb_turns *t)
{
	t->base_prepared_ok = 1;
}

int cb_ws_base_prehash(struct cb_turns *t, struct cb_ws_prehash *p)
{
	struct pre_walk w = {.p = p, .t = t};
	size_t i, flushed = 0;
	double last = mono_now();
	int ret = 0, state = CB_PREHASH_DONE;

	if (t->base_fd < 0 || cb_db_turns_base_map_built(t->db)) {
		__atomic_store_n(&p->state, CB_PREHASH_TAKEN, __ATOMIC_RELEASE);
		return 0;
	}
	__atomic_store_n(&p->state, CB_PREHASH_WALKING, __ATOMIC_RELEASE);
	ret = pre_walk_dir(&w, t->base_fd, "");
	if (ret)
		goto out;
	/* A snapshot may have come and gone during the walk: nothing left to do for it. */
	if (cb_db_turns_base_map_built(t->db)) {
		state = CB_PREHASH_TAKEN;
		goto out;
	}
	/* A part of the base is not a walk of it: nothing is hashed or prepared from it. */
	if (w.stopped) {
		state = CB_PREHASH_STOPPED;
		goto out;
	}
	__atomic_store_n(&p->state, CB_PREHASH_HASHING, __ATOMIC_RELEASE);
	for (i = 0; i < w.n && !ret; i++) {
		if (p->stopping && p->stopping(p->arg)) {
			state = CB_PREHASH_STOPPED;
			break;
		}
		if (p->busy && p->busy(p->arg)) {
			/* A turn op runs: what is done is committed for it to use, and we wait. */
			ret = pre_flush(t, &w, flushed, i);
			flushed = i;
			if (!ret && p->wait && p->wait(p->arg)) {
				state = CB_PREHASH_STOPPED;
				break;
			}
			if (!ret && cb_db_turns_base_map_built(t->db)) {
				state = CB_PREHASH_TAKEN;
				break;
			}
		}
		if (!ret)
			ret = pre_one(t, &w.f[i], p);
		if (!ret && p->stopping && p->stopping(p->arg)) {
			state = CB_PREHASH_STOPPED; /* and this file's hash was given up */
			break;
		}
		if (S_ISREG(w.f[i].st.st_mode)) {
			__atomic_add_fetch(&p->files_done, 1, __ATOMIC_RELAXED);
			__atomic_add_fetch(&p->bytes_done, (long long)w.f[i].st.st_size,
					   __ATOMIC_RELAXED);
		}
		if (!ret && (i + 1 - flushed >= 512 || mono_now() - last > 0.25)) {
			ret = pre_flush(t, &w, flushed, i + 1);
			flushed = i + 1;
			last = mono_now();
		}
	}
	if (!ret)
		ret = pre_flush(t, &w, flushed, i);
	if (!ret && state == CB_PREHASH_DONE)
		ret = pre_prepare_map(t, &w);
out:
	__atomic_store_n(&p->state, ret ? CB_PREHASH_FAILED : state, __ATOMIC_RELEASE);
	for (i = 0; i < w.n; i++)
		free(w.f[i].path);
	free(w.f);
	return ret ? cb_error_wrap(ret, "hash the base in the background") : 0;
}

const char *cb_ws_prehash_state_name(int state)
{
	static const char *const names[] = {"idle",  "walking", "hashing", "done",
					    "taken", "stopped", "failed"};

	return state >= 0 && state <= CB_PREHASH_FAILED ? names[state] : "?";
}

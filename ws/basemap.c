/* The materialized map of the latest turn: built once from a walk of the base (hashes from
 * the base cache, the misses hashed on two threads, reporting progress) plus the deltas. */
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

#define BASE_THREADS 2

struct base_item {
	char *path;
	struct stat st;
	int cached; /* 1: in meta.db's cache, 2: in the shared one */
	struct cb_hash h;
	int err;
};

struct base_walk {
	struct base_item *it;
	size_t n, cap;
	/* hashing on threads */
	int base_fd;
	size_t next, done, misses;
	long long bytes_done, bytes_total;
	pthread_mutex_t lock;
	void (*progress)(void *, long long, long long, long long, long long);
	void *progress_arg;
	double last_draw;
};

static int base_add(struct base_walk *w, const char *path, const struct stat *st)
{
	int rc = cb_grow(&w->it, &w->cap, w->n, sizeof(*w->it), 1024, "base walk");

	if (rc)
		return rc;
	memset(&w->it[w->n], 0, sizeof(w->it[w->n]));
	w->it[w->n].path = strdup(path);
	if (!w->it[w->n].path)
		return cb_error_set(ENOMEM, "base walk: out of memory");
	w->it[w->n].st = *st;
	w->n++;
	return 0;
}

static int base_walk_dir(struct base_walk *w, int base_fd, const char *path)
{
	int fd = cb_beneath_open(base_fd, path[0] ? path : ".", O_RDONLY | O_DIRECTORY, 0);
	struct dirent *de;
	DIR *dir;
	int ret = 0;

	if (fd < 0)
		return cb_error_wrap(fd, "base");
	dir = fdopendir(fd);
	if (!dir) {
		close(fd);
		return cb_error_set(errno, "base %s: %s", path, strerror(errno));
	}
	while (!ret && (de = readdir(dir))) {
		struct stat st;
		char *child;

		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (asprintf(&child, "%s%s%s", path, path[0] ? "/" : "", de->d_name) < 0)
			return closedir(dir), cb_error_set(ENOMEM, "base walk: out of memory");
		/* Beside its directory's fd: the name is looked up in the directory just read. */
		if (fstatat(dirfd(dir), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
			ret = cb_error_set(errno, "base %s: %s", child, strerror(errno));
		} else if (S_ISREG(st.st_mode) || S_ISDIR(st.st_mode) || S_ISLNK(st.st_mode)) {
			ret = base_add(w, child, &st);
			if (!ret && S_ISDIR(st.st_mode))
				ret = base_walk_dir(w, base_fd, child);
		}
		free(child);
	}
	closedir(dir);
	return ret;
}

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

	for (;;) {
		struct base_item *it = NULL;

		pthread_mutex_lock(&w->lock);
		while (w->next < w->n &&
		       (w->it[w->next].cached || !S_ISREG(w->it[w->next].st.st_mode)))
			w->next++;
		if (w->next < w->n)
			it = &w->it[w->next++];
		pthread_mutex_unlock(&w->lock);
		if (!it)
			break;
		it->err = cb_ws_hash_file_at(w->base_fd, it->path, -1, &it->h, &it->st);
		pthread_mutex_lock(&w->lock);
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
	for (size_t i = 0; i < w->n; i++)
		if (w->it[i].err)
			return cb_error_set(w->it[i].err, "hash base %s: failed", w->it[i].path);
	return 0;
}

/* Put every base entry in the map and, frozen, in the base map (and new hashes in the
 * cache). Called in a transaction. */
static int base_fill(struct cb_turns *t, struct base_walk *w)
{
	struct cb_entry e = {0};
	int ret = 0;

	for (size_t i = 0; i < w->n && !ret; i++) {
		struct base_item *it = &w->it[i];

		if (S_ISREG(it->st.st_mode)) {
			if (it->cached != 1) /* hashed now, or from the shared cache */
				ret = ws_base_cache_put(t, it->path, &it->st, &it->h, !it->cached);
			memset(&e, 0, sizeof(e));
			e.path = it->path;
			e.type = CB_ENTRY_FILE;
			e.mode = it->st.st_mode & 07777;
			e.size = it->st.st_size;
			memcpy(e.sha256, it->h.sha256, CB_SHA256_LEN);
			memcpy(e.xxh3, it->h.xxh3, CB_XXH128_LEN);
			if (!ret)
				ret = cb_db_turns_map_put(t->db, &e);
			if (!ret)
				ret = cb_db_turns_base_map_put(t->db, &e);
		} else {
			/* dirs and symlinks: ws_base_now reads the target */
			struct cb_entry be = {0};

			ret = ws_base_now(t, it->path, &be);
			if (!ret && be.type != CB_ENTRY_ABSENT)
				ret = cb_db_turns_map_put(t->db, &be);
			if (!ret && be.type != CB_ENTRY_ABSENT)
				ret = cb_db_turns_base_map_put(t->db, &be);
			cb_entry_clear(&be);
		}
	}
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

int ws_map_ensure(struct cb_turns *t)
{
	long long latest = cb_db_turns_latest(t->db);
	struct base_walk w = {0};
	struct apply_arg a = {t, latest, {0}};
	struct cb_entry e = {0};
	int ret = 0, intx = 0, frozen;

	if (cb_db_turns_map_turn(t->db) == latest)
		return 0;
	/* Once recorded, the base map is the base: no walk, and a base changed since does not
	 * rewrite history. */
	frozen = cb_db_turns_base_map_built(t->db);
	ret = frozen ? 0 : cb_db_turns_base_cache_import(t->db);
	if (ret)
		goto out;
	w.base_fd = frozen ? -1 : t->base_fd;
	w.progress = t->progress;
	w.progress_arg = t->progress_arg;
	if (w.base_fd >= 0) {
		ret = base_walk_dir(&w, t->base_fd, "");
		if (!ret)
			ret = cb_db_turns_read_begin(t->db);
		if (ret)
			goto out;
		for (size_t i = 0; i < w.n && !ret; i++) {
			struct base_item *it = &w.it[i];

			if (!S_ISREG(it->st.st_mode))
				continue;
			ret = ws_base_cache_get(t, it->path, &it->st, &it->h);
			it->cached = ret > 0 ? ret : 0;
			if (ret >= 0) {
				ret = 0;
				if (!it->cached) {
					w.misses++;
					w.bytes_total += it->st.st_size;
				}
			}
		}
		cb_db_turns_read_end(t->db);
		if (!ret)
			ret = base_hash_misses(&w);
		if (ret)
			goto out;
	}
	ret = cb_db_turns_delta_paths(t->db, 0, latest, collect_path, &a);
	if (ret)
		goto out;
	ret = cb_db_turns_begin(t->db);
	if (ret)
		goto out;
	intx = 1;
	ret = cb_db_turns_map_clear(t->db);
	if (!ret && frozen)
		ret = cb_db_turns_map_from_base(t->db);
	else if (!ret)
		ret = base_fill(t, &w);
	if (!ret && !frozen)
		ret = cb_db_turns_base_map_set_built(t->db);
	for (size_t i = 0; i < a.paths.n && !ret; i++) {
		ret = cb_db_turns_delta_at(t->db, a.paths.p[i].path, latest, &e);
		if (ret == 1)
			ret = e.type == CB_ENTRY_ABSENT ? cb_db_turns_map_del(t->db, e.path)
							: cb_db_turns_map_put(t->db, &e);
	}
	if (!ret)
		ret = cb_db_turns_map_set_turn(t->db, latest);
	if (!ret)
		ret = cb_db_turns_commit(t->db);
	if (!ret)
		intx = 0;
out:
	if (intx)
		cb_db_turns_rollback(t->db);
	cb_entry_clear(&e);
	ws_pathset_free(&a.paths);
	for (size_t i = 0; i < w.n; i++)
		free(w.it[i].path);
	free(w.it);
	return ret ? cb_error_wrap(ret, "build the turn map") : 0;
}

int cb_ws_map_list(struct cb_turns *t, int (*fn)(const struct cb_entry *, void *), void *arg)
{
	int ret = ws_map_ensure(t);

	return ret ? ret : cb_db_turns_map_list(t->db, NULL, fn, arg);
}

int cb_ws_base_check(struct cb_turns *t, void (*changed)(void *, const char *, const char *),
		     void *arg, long long *nchanged)
{
	struct base_walk w = {0};
	struct cb_entry turn0 = {0}, now = {0};
	int ret = 0;

	*nchanged = 0;
	/* Before the first snapshot there is no recorded base to differ from. */
	if (t->base_fd < 0 || !cb_db_turns_base_map_built(t->db))
		return 0;
	ret = base_walk_dir(&w, t->base_fd, "");
	for (size_t i = 0; i < w.n && !ret; i++) {
		const char *path = w.it[i].path;

		if (!S_ISREG(w.it[i].st.st_mode))
			continue;
		/* ws_base_now trusts a cache row only while inode, size, mtime and ctime all
		 * agree, and rehashes (and re-caches) the file otherwise. */
		ret = ws_base_now(t, path, &now);
		if (!ret)
			ret = cb_db_turns_base_map_get(t->db, path, &turn0);
		if (ret < 0)
			break;
		ret = 0;
		if (turn0.type == CB_ENTRY_FILE && now.type == CB_ENTRY_FILE &&
		    (turn0.size != now.size || memcmp(turn0.xxh3, now.xxh3, CB_XXH128_LEN))) {
			(*nchanged)++;
			if (changed)
				changed(arg, path,
					"its content changed behind cowbox's back since turn 0 was "
					"recorded; turns that need the old content cannot be "
					"restored from the base");
		}
		cb_entry_clear(&turn0);
		cb_entry_clear(&now);
	}
	cb_entry_clear(&turn0);
	cb_entry_clear(&now);
	for (size_t i = 0; i < w.n; i++)
		free(w.it[i].path);
	free(w.it);
	return ret ? cb_error_wrap(ret, "check the base") : 0;
}

static int changes_collect(const char *path, void *arg)
{
	return ws_pathset_add(arg, path, 0, NULL);
}

/* Only the paths the deltas after since name are looked at: a snapshot after ten changes
 * answers with ten rows whatever the size of the tree. */
int cb_ws_map_changes(struct cb_turns *t, long long since,
		      int (*fn)(const char *path, const struct cb_entry *now, void *), void *arg)
{
	long long latest = cb_db_turns_latest(t->db);
	struct ws_pathset set = {0};
	struct cb_entry now = {0}, then = {0};
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
		ret = cb_db_turns_delta_paths(t->db, since, latest, changes_collect, &set);
	for (size_t i = 0; i < set.n && !ret; i++) {
		const char *path = set.p[i].path;

		ret = cb_db_turns_map_get(t->db, path, &now);
		if (ret < 0)
			break;
		if (ret == 1 && now.type == CB_ENTRY_FILE) {
			ret = fn(path, &now, arg);
		} else {
			/* Not a file now: deleted for the client only if it was one at since. */
			ret = ws_entry_at(t, path, since, &then);
			if (!ret && then.type == CB_ENTRY_FILE)
				ret = fn(path, NULL, arg);
		}
		cb_entry_clear(&now);
		cb_entry_clear(&then);
	}
	cb_entry_clear(&now);
	cb_entry_clear(&then);
	ws_pathset_free(&set);
	return ret;
}

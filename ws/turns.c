/* The turns handle of a workspace and what every turn operation needs: entries of the base,
 * of the live tree and of a recorded turn, path sets, and expanding journal paths. */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "cowbox/grow.h"
#include "turns_int.h"
#include "util/beneath.h"

int cb_turns_open(const struct cb_turns_config *cfg, struct cb_turns **out)
{
	struct cb_turns *t = calloc(1, sizeof(*t));
	int ret = 0;

	*out = NULL;
	if (!t)
		return cb_error_set(ENOMEM, "turns: out of memory");
	t->root_fd = t->base_fd = t->blob_fd = -1;
	t->progress = cfg->progress;
	t->progress_arg = cfg->progress_arg;
	t->stopping = cfg->stopping;
	t->stopping_arg = cfg->stopping_arg;
	t->read_max = cfg->snapshot_max_bytes ? cfg->snapshot_max_bytes : CB_SNAPSHOT_MAX_BYTES;
	t->read_left = -1;
	t->restore_id_base = -1;
	if (mkdir(cfg->blob_dir, 0700) < 0 && errno != EEXIST) {
		ret = cb_error_set(errno, "blob store %s: %s", cfg->blob_dir, strerror(errno));
		goto out;
	}
	t->blob_fd = open(cfg->blob_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (t->blob_fd < 0) {
		ret = cb_error_set(errno, "blob store %s: %s", cfg->blob_dir, strerror(errno));
		goto out;
	}
	if (cfg->root)
		t->root_fd = open(cfg->root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (cfg->root && t->root_fd < 0) {
		ret = cb_error_set(errno, "workspace tree %s: %s", cfg->root, strerror(errno));
		goto out;
	}
	if (cfg->base_dir) {
		t->base_fd = open(cfg->base_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (t->base_fd < 0) {
			ret = cb_error_set(errno, "base %s: %s", cfg->base_dir, strerror(errno));
			goto out;
		}
	}
	t->db_path = strdup(cfg->db_path);
	if (!t->db_path) {
		ret = cb_error_set(ENOMEM, "turns: out of memory");
		goto out;
	}
	ret = cb_db_turns_open(cfg->db_path, &t->db);
	if (!ret && (ret = cb_db_turns_in_place(t->db)) >= 0) {
		t->in_place = ret;
		ret = 0;
	}
out:
	if (ret)
		cb_turns_close(t);
	else
		*out = t;
	return ret;
}

void cb_turns_set_setid_range(struct cb_turns *t, unsigned first, unsigned count)
{
	t->setid = (struct cb_beneath_setid){first, count};
}

void cb_turns_set_restore_ids(struct cb_turns *t, unsigned long base)
{
	t->restore_id_base = (long long)base;
}

void cb_turns_close(struct cb_turns *t)
{
	if (!t)
		return;
	cb_ws_base_scan_free(t->ahead);
	ws_basecache_detach(t);
	cb_db_turns_close(t->db);
	ws_known_clear(t);
	free(t->db_path);
	if (t->root_fd >= 0)
		close(t->root_fd);
	if (t->base_fd >= 0)
		close(t->base_fd);
	if (t->blob_fd >= 0)
		close(t->blob_fd);
	free(t);
}

struct cb_db_turns *cb_turns_db(struct cb_turns *t)
{
	return t->db;
}

int ws_pathset_add(struct ws_pathset *s, const char *path, pid_t pid, const char *comm)
{
	int rc = cb_grow(&s->p, &s->cap, s->n, sizeof(*s->p), 64, "path set");

	if (rc)
		return rc;
	s->p[s->n].path = strdup(path);
	if (!s->p[s->n].path)
		return cb_error_set(ENOMEM, "path set: out of memory");
	s->p[s->n].pid = pid;
	s->p[s->n].comm = comm;
	s->n++;
	return 0;
}

static int pathset_cmp(const void *a, const void *b)
{
	return strcmp(((const struct ws_path *)a)->path, ((const struct ws_path *)b)->path);
}

/* Sort in byte order (SQLite's too) and drop repeats, keeping the first attribution. */
void ws_pathset_sort(struct ws_pathset *s)
{
	size_t w = 0;

	if (s->n == 0)
		return;
	qsort(s->p, s->n, sizeof(*s->p), pathset_cmp);
	for (size_t r = 1; r < s->n; r++) {
		if (!strcmp(s->p[w].path, s->p[r].path)) {
			if (!s->p[w].pid)
				s->p[w].pid = s->p[r].pid, s->p[w].comm = s->p[r].comm;
			free(s->p[r].path);
		} else {
			s->p[++w] = s->p[r];
		}
	}
	s->n = w + 1;
}

void ws_pathset_free(struct ws_pathset *s)
{
	for (size_t i = 0; i < s->n; i++)
		free(s->p[i].path);
	free(s->p);
	memset(s, 0, sizeof(*s));
}

static long long stat_mtime_ns(const struct stat *st)
{
	return (long long)st->st_mtim.tv_sec * 1000000000LL + st->st_mtim.tv_nsec;
}

static long long stat_ctime_ns(const struct stat *st)
{
	return (long long)st->st_ctim.tv_sec * 1000000000LL + st->st_ctim.tv_nsec;
}

/* Read path's entry beneath dirfd (no symlink followed on the way): 1 and *st, *out filled,
 * 0 if there is no such path (out absent), -errno. Files get no hash here. Everything comes
 * from one O_PATH descriptor of what is at path at that moment, so a path swapped for
 * another type meanwhile gives the entry of one of them, never the stat of one and the
 * readlink of the other. *fdp (if not NULL) keeps that descriptor open for a file, a
 * directory or a symlink, else -1. */
static int entry_read(int dirfd, const char *path, struct stat *st, struct cb_entry *out, int *fdp)
{
	const char *name;
	int pfd, fd = -1, ret = 1;

	cb_entry_clear(out);
	if (fdp)
		*fdp = -1;
	pfd = cb_beneath_parent(dirfd, path, &name);
	if (pfd < 0)
		return cb_beneath_gone(pfd)
			   ? 0
			   : cb_error_set(-pfd, "stat %s: %s", path, strerror(-pfd));
	fd = openat(pfd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0 || fstat(fd, st) < 0) {
		ret = cb_beneath_gone(-errno)
			  ? 0
			  : cb_error_set(errno, "stat %s: %s", path, strerror(errno));
		goto out;
	}
	out->path = strdup(path);
	if (!out->path) {
		ret = cb_error_set(ENOMEM, "entry %s: out of memory", path);
		goto out;
	}
	out->mode = st->st_mode & 07777;
	out->mtime_ns = stat_mtime_ns(st);
	out->has_mtime = 1;
	if (S_ISDIR(st->st_mode)) {
		out->type = CB_ENTRY_DIR;
	} else if (S_ISREG(st->st_mode)) {
		out->type = CB_ENTRY_FILE;
		out->size = st->st_size;
	} else if (S_ISLNK(st->st_mode)) {
		char buf[4096];
		struct cb_hash h;
		/* The symlink the descriptor is, not whatever holds its name now. */
		ssize_t n = readlinkat(fd, "", buf, sizeof(buf) - 1);

		if (n < 0) {
			ret = cb_error_set(errno, "readlink %s: %s", path, strerror(errno));
			goto out;
		}
		buf[n] = '\0';
		out->type = CB_ENTRY_SYMLINK;
		out->mode = 0777;
		out->size = n;
		out->target = strdup(buf);
		if (!out->target) {
			ret = cb_error_set(ENOMEM, "entry %s: out of memory", path);
			goto out;
		}
		cb_ws_hash_bytes(buf, (size_t)n, &h);
		memcpy(out->sha256, h.sha256, CB_SHA256_LEN);
		memcpy(out->xxh3, h.xxh3, CB_XXH128_LEN);
	}
	/* Sockets, fifos and devices are not part of a turn: they stay ABSENT. */
	if (out->type == CB_ENTRY_ABSENT)
		out->has_mtime = 0;
	else if (fdp) {
		*fdp = fd;
		fd = -1;
	}
out:
	if (fd >= 0)
		close(fd);
	close(pfd);
	return ret;
}

int ws_base_entry(struct cb_turns *t, const char *path, struct cb_entry *out)
{
	int ret;

	cb_entry_clear(out);
	if (!cb_db_turns_base_map_built(t->db))
		return ws_base_now(t, path, out);
	ret = cb_db_turns_base_map_get(t->db, path, out);
	if (ret < 0)
		return ret;
	if (!out->path && !(out->path = strdup(path)))
		return cb_error_set(ENOMEM, "entry %s: out of memory", path);
	return 0;
}

int ws_base_holds(struct cb_turns *t, const char *path, const unsigned char *xxh3)
{
	struct cb_entry now = {0};
	int ret;

	/* In place, the folder holds the live bytes, which a sandbox may be rewriting: the
	 * blob, kept since the content was recorded, is the only source. */
	if (t->in_place)
		return 0;
	ret = ws_base_now(t, path, &now);
	if (ret == 0)
		ret = now.type == CB_ENTRY_FILE && !memcmp(now.xxh3, xxh3, CB_XXH128_LEN);
	cb_entry_clear(&now);
	return ret;
}

int cb_ws_base_holds(struct cb_turns *t, const char *path, const unsigned char *xxh3)
{
	return ws_base_holds(t, path, xxh3);
}

int ws_base_now(struct cb_turns *t, const char *path, struct cb_entry *out)
{
	struct cb_hash h;
	struct stat st;
	int ret;

	cb_entry_clear(out);
	if (t->base_fd < 0)
		return 0;
	ret = entry_read(t->base_fd, path, &st, out, NULL);
	if (ret <= 0 || out->type != CB_ENTRY_FILE)
		return ret < 0 ? ret : 0;
	/* meta.db's cache, then the shared one (the first map does not copy its rows) */
	ret = ws_base_cache_get(t, path, &st, &h);
	if (ret > 0) {
		memcpy(out->sha256, h.sha256, CB_SHA256_LEN);
		memcpy(out->xxh3, h.xxh3, CB_XXH128_LEN);
	}
	if (ret)
		return ret < 0 ? ret : 0;
	/* Not cached, or changed behind our back since it was: hash what is there now. */
	ret = ws_hash_file_at(t->base_fd, path, -1, &h, &st, t->stopping, t->stopping_arg);
	if (ret)
		return cb_error_wrap(ret, "base");
	memcpy(out->sha256, h.sha256, CB_SHA256_LEN);
	memcpy(out->xxh3, h.xxh3, CB_XXH128_LEN);
	out->size = st.st_size;
	return cb_db_turns_base_cache_put(t->db, path, st.st_size, stat_mtime_ns(&st),
					  stat_ctime_ns(&st), (long long)st.st_ino, h.sha256,
					  h.xxh3);
}

/* Hash the live file open as fd (an O_PATH descriptor from entry_read: the inode that was
 * at path, whatever holds the name now), copying its bytes into copy_fd when that is >= 0,
 * and fill out's size, mode and hashes; h keeps the hashes that name the blob. */
static int live_hash(struct cb_turns *t, const char *path, int fd, int copy_fd, struct cb_hash *h,
		     struct cb_entry *out)
{
	char proc[64];
	struct stat st;
	int rfd, ret;

	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
	rfd = open(proc, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
	if (rfd < 0)
		return cb_error_set(errno, "hash %s: open: %s", path, strerror(errno));
	ret = ws_hash_open_file(rfd, path, copy_fd, h, &st, t->stopping, t->stopping_arg);
	close(rfd);
	if (ret)
		return ret;
	out->size = st.st_size;
	out->mode = st.st_mode & 07777;
	out->mtime_ns = stat_mtime_ns(&st); /* the time of the bytes just hashed */
	out->has_mtime = 1;
	memcpy(out->sha256, h->sha256, CB_SHA256_LEN);
	memcpy(out->xxh3, h->xxh3, CB_XXH128_LEN);
	return 0;
}

/* Hash the live file, keeping a blob when its content is not the base's at that path:
 * copied during the hash pass when the sizes already say so (one read through FUSE for new
 * content, the common case), else in a second pass when the blob is missing. */
static int live_file(struct cb_turns *t, const char *path, int fd, int keep_blob,
		     struct cb_entry *out)
{
	struct cb_entry base = {0};
	struct cb_hash h;
	char tmp[64] = "";
	int copy_fd = -1, ret;

	/* A snapshot's reads are bounded: a huge (or hugely sparse) file fails it at once,
	 * before a byte is read, instead of every turn operation waiting behind it. */
	if (keep_blob && t->read_left >= 0) {
		if (out->size > t->read_left) {
			ret = cb_error_set(EFBIG,
					   "%s is %lld bytes: this snapshot would read more than "
					   "its bound of %lld bytes (%lld read already); a huge or "
					   "sparse file? remove it, or raise the bound "
					   "(COWBOX_SNAPSHOT_MAX_BYTES for the daemon)",
					   path, out->size, t->read_max, t->read_done);
			goto out;
		}
		t->read_left -= out->size;
		t->read_done += out->size;
	}
	/* In place, the base is this very file: its content needs a blob like any other. */
	if (keep_blob && !t->in_place && (ret = ws_base_now(t, path, &base)) < 0)
		goto out;
	if (keep_blob && (base.type != CB_ENTRY_FILE || base.size != out->size)) {
		copy_fd = cb_ws_blob_tmp(t->blob_fd, tmp);
		if (copy_fd < 0) {
			ret = copy_fd;
			goto out;
		}
	}
	ret = live_hash(t, path, fd, copy_fd, &h, out);
	if (ret || !keep_blob)
		goto out;
	if (base.type == CB_ENTRY_FILE && !memcmp(base.xxh3, h.xxh3, CB_XXH128_LEN))
		goto out; /* the base holds these bytes; the temp copy (if any) goes */
	if (copy_fd < 0) {
		if (cb_ws_blob_has(t->blob_fd, h.xxh3))
			goto out;
		/* Not kept yet: hash again while copying, so the blob's name is the hash of
		 * exactly what it holds (the file may have changed since the first pass). */
		cb_entry_clear(&base);
		copy_fd = cb_ws_blob_tmp(t->blob_fd, tmp);
		if (copy_fd < 0) {
			ret = copy_fd;
			goto out;
		}
		ret = live_hash(t, path, fd, copy_fd, &h, out);
		if (ret)
			goto out;
	}
	close(copy_fd);
	copy_fd = -1;
	ret = cb_ws_blob_publish(t->blob_fd, tmp, h.xxh3);
	tmp[0] = '\0';
out:
	if (copy_fd >= 0)
		close(copy_fd);
	if (tmp[0])
		unlinkat(t->blob_fd, tmp, 0);
	cb_entry_clear(&base);
	return ret;
}

static int known_cmp(const void *a, const void *b)
{
	return strcmp(((const struct ws_known *)a)->e.path, ((const struct ws_known *)b)->e.path);
}

void ws_known_clear(struct cb_turns *t)
{
	for (size_t i = 0; i < t->nknown; i++)
		cb_entry_clear(&t->known[i].e);
	free(t->known);
	t->known = NULL;
	t->nknown = 0;
}

struct cb_ws_known {
	struct ws_known *known;
	size_t n;
};

struct cb_ws_known *cb_ws_known_take(struct cb_turns *t)
{
	struct cb_ws_known *k;

	if (!t->nknown || !(k = malloc(sizeof(*k))))
		return NULL;
	k->known = t->known;
	k->n = t->nknown;
	t->known = NULL;
	t->nknown = 0;
	return k;
}

void cb_ws_known_put(struct cb_turns *t, struct cb_ws_known *k)
{
	if (!k)
		return;
	ws_known_set(t, k->known, k->n);
	free(k);
}

void cb_ws_known_free(struct cb_ws_known *k)
{
	if (!k)
		return;
	for (size_t i = 0; i < k->n; i++)
		cb_entry_clear(&k->known[i].e);
	free(k->known);
	free(k);
}

void ws_known_set(struct cb_turns *t, struct ws_known *known, size_t n)
{
	ws_known_clear(t);
	t->known = known;
	t->nknown = n;
	if (n)
		qsort(known, n, sizeof(*known), known_cmp);
}

/* The entry a rollback wrote at path, if the file still has the stat it had then. */
static const struct cb_entry *known_entry(struct cb_turns *t, const char *path,
					  const struct stat *st)
{
	struct ws_known key = {.e.path = (char *)path};
	const struct ws_known *k;

	if (!t->nknown)
		return NULL;
	k = bsearch(&key, t->known, t->nknown, sizeof(*t->known), known_cmp);
	if (!k || k->st.st_ino != st->st_ino || k->st.st_size != st->st_size ||
	    k->st.st_mtim.tv_sec != st->st_mtim.tv_sec ||
	    k->st.st_mtim.tv_nsec != st->st_mtim.tv_nsec ||
	    k->st.st_ctim.tv_sec != st->st_ctim.tv_sec ||
	    k->st.st_ctim.tv_nsec != st->st_ctim.tv_nsec ||
	    (k->st.st_mode & 07777) != (st->st_mode & 07777))
		return NULL;
	return &k->e;
}

int ws_live_meta(struct cb_turns *t, const char *path, struct cb_entry *out)
{
	struct stat st;
	int fd = -1, ret = entry_read(t->root_fd, path, &st, out, &fd);

	if (ret > 0 && out->type == CB_ENTRY_FILE)
		ret = ws_meta_read(fd, &st, path, out);
	if (fd >= 0)
		close(fd);
	return ret < 0 ? ret : 0;
}

int ws_live_entry(struct cb_turns *t, const char *path, int keep_blob, struct cb_entry *out)
{
	const struct cb_entry *known;
	struct stat st;
	int fd = -1, ret;

	cb_entry_clear(out);
	for (int tries = 0; tries < 3; tries++) {
		ret = entry_read(t->root_fd, path, &st, out, &fd);
		if (ret <= 0 || out->type == CB_ENTRY_ABSENT)
			return ret < 0 ? ret : 0;
		/* one of several names of an inode: ws_snap_links finds the others by it */
		if (out->type == CB_ENTRY_FILE && st.st_nlink > 1) {
			out->nlink = (unsigned long)st.st_nlink;
			out->ino = (long long)st.st_ino;
		}
		/* Owner and xattrs go with the content; a file's time is the hash's (live_hash),
		 * a directory's or symlink's the stat's. */
		ret = ws_meta_read(fd, &st, path, out);
		if (ret || out->type != CB_ENTRY_FILE) {
			if (fd >= 0)
				close(fd);
			if (!ret)
				return 0;
			if (!cb_beneath_gone(ret))
				return ret;
			cb_entry_clear(out);
			continue;
		}
		/* Just restored by a rollback and untouched since: its content (and blob or base
		 * copy) is known. */
		known = keep_blob ? known_entry(t, path, &st) : NULL;
		if (known) {
			memcpy(out->sha256, known->sha256, CB_SHA256_LEN);
			memcpy(out->xxh3, known->xxh3, CB_XXH128_LEN);
			close(fd);
			return 0;
		}
		ret = live_file(t, path, fd, keep_blob, out);
		close(fd);
		/* Deleted (and gone for good) between the lookup and the open: look again. */
		if (!cb_beneath_gone(ret))
			return ret;
		cb_entry_clear(out);
	}
	return ret;
}

int ws_turn_check(struct cb_turns *t, long long turn)
{
	long long oldest = cb_db_turns_oldest(t->db);

	if (turn < 0)
		return cb_error_set(EINVAL, "turn %lld: turns are numbered from 0 (the base)",
				    turn);
	if (!cb_db_turns_exists(t->db, turn)) {
		if (turn > 0 && turn < oldest)
			return cb_error_set(ENOENT, "turn %lld was pruned (oldest kept: %lld)",
					    turn, oldest);
		return cb_error_set(ENOENT, "turn %lld does not exist (latest: %lld)", turn,
				    cb_db_turns_latest(t->db));
	}
	return 0;
}

int cb_ws_turn_check(struct cb_turns *t, long long turn)
{
	return ws_turn_check(t, turn);
}

int ws_entry_at(struct cb_turns *t, const char *path, long long turn, struct cb_entry *out)
{
	int ret;

	/* One index seek on (path, turn); the map would be no faster and has no tombstones to
	 * say who deleted a path. */
	cb_entry_clear(out);
	ret = cb_db_turns_delta_at(t->db, path, turn, out);
	if (ret < 0)
		return ret;
	if (ret == 0)
		ret = ws_base_entry(t, path, out);
	else
		ret = 0;
	if (!ret && !out->path && !(out->path = strdup(path)))
		ret = cb_error_set(ENOMEM, "entry %s: out of memory", path);
	return ret;
}

int cb_ws_entry_at(struct cb_turns *t, const char *path, long long turn, struct cb_entry *out)
{
	int ret = ws_turn_check(t, turn);

	return ret ? ret : ws_entry_at(t, path, turn, out);
}

/* Walk dirfd/path (a directory) adding everything below it to sink. */
static int walk_add(int dirfd, const char *path, const struct ws_sink *sink, pid_t pid,
		    const char *comm);

static int walk_dir(int dirfd, const char *path, const struct ws_sink *sink, pid_t pid,
		    const char *comm)
{
	int fd = cb_beneath_open(dirfd, path[0] ? path : ".", O_RDONLY | O_DIRECTORY, 0);
	struct dirent *de;
	DIR *dir;
	int ret = 0;

	if (fd < 0)
		return cb_beneath_gone(fd) ? 0 : cb_error_wrap(fd, "walk");
	dir = fdopendir(fd);
	if (!dir) {
		close(fd);
		return cb_error_set(errno, "walk %s: %s", path, strerror(errno));
	}
	while (!ret && (de = readdir(dir))) {
		char *child;

		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") ||
		    ws_is_tmp_name(de->d_name))
			continue;
		if (asprintf(&child, "%s%s%s", path, path[0] ? "/" : "", de->d_name) < 0) {
			ret = cb_error_set(ENOMEM, "walk %s: out of memory", path);
			break;
		}
		ret = sink->add(sink->arg, child, pid, comm);
		if (!ret && (de->d_type == DT_DIR || de->d_type == DT_UNKNOWN))
			ret = walk_add(dirfd, child, sink, pid, comm);
		free(child);
	}
	closedir(dir);
	return ret;
}

static int walk_add(int dirfd, const char *path, const struct ws_sink *sink, pid_t pid,
		    const char *comm)
{
	struct stat st;

	if (cb_beneath_stat(dirfd, path, &st) < 0 || !S_ISDIR(st.st_mode))
		return 0;
	return walk_dir(dirfd, path, sink, pid, comm);
}

struct expand_arg {
	const struct ws_sink *sink;
	pid_t pid;
	const char *comm;
};

static int expand_old(const struct cb_entry *e, void *arg)
{
	struct expand_arg *a = arg;

	return a->sink->add(a->sink->arg, e->path, a->pid, a->comm);
}

int ws_dirty_add_own(const struct cb_dirty *d, const struct ws_sink *sink)
{
	const char *slash;
	char *parent;
	int ret;

	if (!d->path[0] || !strcmp(d->path, ".") || ws_is_tmp_name(d->path))
		return 0;
	ret = sink->add(sink->arg, d->path, d->pid, d->comm);
	/* A name made, removed or moved in a directory changes the directory's time, which
	 * the turn keeps: the parent is looked at too, credited to nobody (its own row, if
	 * any, keeps its credit; one whose time alone moved is a row without an event). A
	 * write or a change of metadata moves no directory's time. */
	if (ret || d->same_names || !(slash = strrchr(d->path, '/')))
		return ret;
	if (!(parent = strndup(d->path, (size_t)(slash - d->path))))
		return cb_error_set(ENOMEM, "%s: out of memory", d->path);
	ret = sink->add(sink->arg, parent, 0, NULL);
	free(parent);
	return ret;
}

int ws_dirty_expand_below(struct cb_turns *t, const struct cb_dirty *d, const struct ws_sink *sink)
{
	struct expand_arg a = {sink, d->pid, d->comm};
	struct cb_entry old = {0};
	struct stat st;
	int live_dir, old_dir, ret;

	if (!d->path[0] || !strcmp(d->path, ".") || ws_is_tmp_name(d->path))
		return 0;
	ret = cb_db_turns_map_get(t->db, d->path, &old);
	if (ret < 0)
		return ret;
	old_dir = ret == 1 && old.type == CB_ENTRY_DIR;
	cb_entry_clear(&old);
	live_dir = cb_beneath_stat(t->root_fd, d->path, &st) == 0 && S_ISDIR(st.st_mode);
	ret = 0;
	/* What the map had below it is gone or moved unless it is still the same dir. */
	if (old_dir && (d->subtree || !live_dir))
		ret = cb_db_turns_map_list(t->db, d->path, expand_old, &a);
	/* A new or moved-in directory: everything in it is new to the map. */
	if (!ret && live_dir && (d->subtree || !old_dir))
		ret = walk_dir(t->root_fd, d->path, sink, d->pid, d->comm);
	return ret;
}

static int pathset_sink(void *arg, const char *path, pid_t pid, const char *comm)
{
	return ws_pathset_add(arg, path, pid, comm);
}

/* The set's first n_own paths (sorted) came from the dirty rows themselves. */
struct below_set {
	struct ws_pathset *set;
	size_t n_own;
};

/* A path found below a new or moved directory, unless its own row credits it already. */
static int below_sink(void *arg, const char *path, pid_t pid, const char *comm)
{
	struct below_set *b = arg;
	size_t lo = 0, hi = b->n_own;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		int c = strcmp(b->set->p[mid].path, path);

		if (c == 0)
			return b->set->p[mid].pid ? 0 : ws_pathset_add(b->set, path, pid, comm);
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return ws_pathset_add(b->set, path, pid, comm);
}

int ws_dirty_expand(struct cb_turns *t, const struct cb_dirty *dirty, size_t n,
		    struct ws_pathset *set)
{
	struct ws_sink own = {pathset_sink, set};
	struct below_set b = {set, 0};
	struct ws_sink below = {below_sink, &b};
	int ret = 0;

	/* Each path is credited to its own first change (what log shows), and only what has no
	 * row of its own to the change of the directory it came in with: the own rows first. */
	for (size_t i = 0; i < n && !ret; i++)
		ret = ws_dirty_add_own(&dirty[i], &own);
	ws_pathset_sort(set);
	b.n_own = set->n;
	for (size_t i = 0; i < n && !ret; i++)
		ret = ws_dirty_expand_below(t, &dirty[i], &below);
	return ret;
}

/* Fork: a new workspace starting at a turn of this one. Its upper layer gets only what
 * differs from the base at that turn (overlayfs format), its db records that as turn 1,
 * and it shares this workspace's blobs by hard links. Cost follows the changed paths. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "cowbox/grow.h"
#include "turns_int.h"
#include "util/clock.h"

struct fork_ctx {
	struct cb_turns *t;
	long long turn;
	int upper_fd, blob_fd;
	struct cb_db_turns *db;
	struct ws_pathset dirs; /* made in the upper: their times are given back last */
	/* the first name written of each hard-link group: the others are linked to it */
	struct fork_link {
		char *key, *path;
	} * links;
	size_t nlinks, links_cap;
};

/* The name written first of group key, or NULL. */
static const char *fork_link_of(const struct fork_ctx *f, const char *key)
{
	for (size_t i = 0; i < f->nlinks; i++)
		if (!strcmp(f->links[i].key, key))
			return f->links[i].path;
	return NULL;
}

static int fork_link_add(struct fork_ctx *f, const struct cb_entry *e)
{
	int ret = cb_grow(&f->links, &f->links_cap, f->nlinks, sizeof(*f->links), 8, "fork");

	if (ret)
		return ret;
	f->links[f->nlinks].key = strdup(e->link);
	f->links[f->nlinks].path = strdup(e->path);
	if (!f->links[f->nlinks].key || !f->links[f->nlinks].path) {
		free(f->links[f->nlinks].key);
		free(f->links[f->nlinks].path);
		return cb_error_set(ENOMEM, "fork: out of memory");
	}
	f->nlinks++;
	return 0;
}

/* Create the upper's parent directories of path, with the modes they have at the turn. Every
 * entry of the upper is made through util/beneath: whatever a turn recorded (a symlink where
 * a directory of a later path should be), nothing is ever made outside the new upper. */
static int fork_parents(struct fork_ctx *f, const char *path)
{
	char *buf = strdup(path); /* any length: a tree can be deeper than PATH_MAX */
	struct cb_entry e = {0};
	int ret = 0;

	if (!buf)
		return cb_error_set(ENOMEM, "fork %s: out of memory", path);
	for (char *s = strchr(buf, '/'); s && !ret; s = strchr(s + 1, '/')) {
		struct stat st;

		*s = '\0';
		if (cb_beneath_stat(f->upper_fd, buf, &st) == -ENOENT) {
			mode_t mode;

			ret = ws_entry_at(f->t, buf, f->turn, &e);
			mode = e.type == CB_ENTRY_DIR ? e.mode : 0755;
			/* chmod after mkdir: the umask must not change what the turn says */
			if (!ret)
				ret = cb_beneath_mkdir(f->upper_fd, buf, 0700);
			if (!ret)
				ret = cb_beneath_chmod(f->upper_fd, buf, mode, &f->t->setid);
			if (!ret && e.type == CB_ENTRY_DIR)
				ret = ws_restore_meta_at(f->upper_fd, &e, f->t->restore_id_base, 1,
							 &f->t->setid, 0);
			if (!ret)
				ret = ws_pathset_add(&f->dirs, buf, 0, NULL);
			if (ret)
				ret = cb_error_wrap(ret, "fork");
		}
		*s = '/';
	}
	cb_entry_clear(&e);
	free(buf);
	return ret;
}

/* Copy e's content into the fork's upper from the base file (from_base) or its blob, checked
 * against the turn's hashes while copying. */
static int fork_copy(struct fork_ctx *f, const struct cb_entry *e, int from_base, int dst)
{
	char hex[2 * CB_XXH128_LEN + 1], what[128];
	int src, ret;

	cb_hex(e->xxh3, CB_XXH128_LEN, hex);
	if (from_base) {
		snprintf(what, sizeof(what), "base file %s", e->path);
		src = cb_beneath_open(f->t->base_fd, e->path, O_RDONLY, 0);
		if (src < 0)
			return cb_error_wrap(src, "fork: base");
	} else {
		snprintf(what, sizeof(what), "blob %s", hex);
		src = cb_ws_blob_open(f->t->blob_fd, e->xxh3);
		if (src < 0)
			return cb_error_wrap(src, "fork: content of %s", e->path);
	}
	ret = cb_ws_copy_checked(src, dst, e, what);
	close(src);
	return ret;
}

/* Set dst's modification time to e's recorded one, or the base file's when from_base and
 * none was recorded. */
static int fork_time(struct fork_ctx *f, const struct cb_entry *e, int from_base, int dst)
{
	int src = -1, ret;

	if (!e->has_mtime && from_base) {
		src = cb_beneath_open(f->t->base_fd, e->path, O_RDONLY, 0);
		if (src < 0)
			return cb_error_wrap(src, "fork: base");
	}
	ret = ws_restore_mtime(dst, e, src);
	if (src >= 0)
		close(src);
	return ret;
}

static int fork_file(struct fork_ctx *f, const struct cb_entry *e, const struct cb_entry *base)
{
	int from_base = base->type == CB_ENTRY_FILE && !memcmp(base->xxh3, e->xxh3, CB_XXH128_LEN);
	int dst, ret;

	dst = cb_beneath_open(f->upper_fd, e->path, O_RDWR | O_CREAT | O_TRUNC, 0600);
	if (dst < 0)
		return cb_error_wrap(dst, "fork: create");
	ret = fork_copy(f, e, from_base, dst);
	/* The base file changed after it was hashed: its blob, if kept, is the content. */
	if (ret == -EBADMSG && from_base && cb_ws_blob_has(f->t->blob_fd, e->xxh3)) {
		from_base = 0;
		ret = fork_copy(f, e, 0, dst);
	}
	/* The owner in the fork's own id range (before the mode: a chown drops set-id bits),
	 * the xattrs after it, and the recorded time last, so a build in the fork sees what was
	 * up to date as up to date (a base file's own time when the turn recorded none). */
	if (!ret)
		ret = ws_restore_owner(dst, e, f->t->restore_id_base);
	if (!ret)
		ret = cb_beneath_fchmod(dst, e->path, e->mode, &f->t->setid);
	if (!ret)
		ret = ws_restore_xattrs(dst, e, f->t->restore_id_base, 1, 0);
	if (!ret)
		ret = fork_time(f, e, from_base, dst);
	close(dst);
	if (!ret && !from_base)
		ret = cb_ws_blob_share(f->t->blob_fd, f->blob_fd, e->xxh3);
	return ret ? cb_error_wrap(ret, "fork: %s", e->path) : 0;
}

/* Whether the parent directory of path is a directory at the turn (always for a top-level
 * path): a turn that says otherwise has nothing there a tree could hold. */
static int fork_parent_exists(struct fork_ctx *f, const char *path, int *exists)
{
	const char *slash = strrchr(path, '/');
	struct cb_entry p = {0};
	char *parent;
	int ret;

	*exists = 1;
	if (!slash)
		return 0;
	parent = strndup(path, (size_t)(slash - path));
	if (!parent)
		return cb_error_set(ENOMEM, "fork: out of memory");
	ret = ws_entry_at(f->t, parent, f->turn, &p);
	*exists = p.type == CB_ENTRY_DIR;
	cb_entry_clear(&p);
	free(parent);
	return ret;
}

/* Put path as it is at the turn into the fork's upper layer and its turn 1. */
static int fork_one(const char *path, struct fork_ctx *f)
{
	struct cb_entry e = {0}, base = {0};
	int ret, parent = 1;

	ret = ws_entry_at(f->t, path, f->turn, &e);
	if (!ret)
		ret =
		    ws_base_now(f->t, path, &base); /* the fork's base is the directory as it is */
	/* The base's own file shows through with its own time (unless it is one name of a
	 * hard-link group); a directory or symlink whose recorded metadata is not the base's
	 * is made in the upper to carry it. */
	if (ret || (cb_entry_same(&e, &base) &&
		    (e.type == CB_ENTRY_FILE ? !e.link : !cb_entry_meta_moved(&base, &e))))
		goto out;
	/* Below a directory gone at the turn: its whiteout already hides all of it. Below a
	 * symlink or file (a turn recorded while the tree changed type under it): no such path
	 * in a tree, so none in the fork either. */
	if ((ret = fork_parent_exists(f, path, &parent)))
		goto out;
	if (!parent) {
		/* Nothing to write (the parent's whiteout or non-directory hides it), but the
		 * fork's turn 1 must still say the base's entry is gone, or its map keeps it. */
		if (base.type == CB_ENTRY_ABSENT)
			goto out;
		cb_entry_clear(&e);
		if (!(e.path = strdup(path))) {
			ret = cb_error_set(ENOMEM, "fork: out of memory");
			goto out;
		}
		ret = cb_db_turns_delta_put(f->db, 1, &e);
		goto out;
	}
	ret = cb_db_turns_delta_put(f->db, 1, &e);
	if (ret)
		goto out;
	ret = fork_parents(f, path);
	if (ret)
		goto out;
	switch (e.type) {
	case CB_ENTRY_ABSENT:
		/* overlayfs whiteout: a 0/0 character device hides the base entry */
		ret = cb_beneath_mknod(f->upper_fd, path, S_IFCHR | 0000, makedev(0, 0));
		ret = ret ? cb_error_wrap(ret, "fork: whiteout") : 0;
		break;
	case CB_ENTRY_DIR:
		ret = cb_beneath_mkdir(f->upper_fd, path, e.mode);
		/* owner, mode and xattrs now, the time once everything in it is written */
		if (!ret || ret == -EEXIST)
			ret = ws_restore_meta_at(f->upper_fd, &e, f->t->restore_id_base, 1,
						 &f->t->setid, 0);
		if (!ret)
			ret = ws_pathset_add(&f->dirs, path, 0, NULL);
		ret = ret ? cb_error_wrap(ret, "fork") : 0;
		break;
	case CB_ENTRY_SYMLINK:
		ret = cb_beneath_symlink(f->upper_fd, e.target, path);
		if (!ret)
			ret = ws_restore_meta_at(f->upper_fd, &e, f->t->restore_id_base, 1,
						 &f->t->setid, 1);
		ret = ret ? cb_error_wrap(ret, "fork") : 0;
		break;
	case CB_ENTRY_FILE:
		if (e.link && fork_link_of(f, e.link)) {
			ret = ws_link_at(f->upper_fd, fork_link_of(f, e.link), path);
			ret = ret ? cb_error_wrap(ret, "fork") : 0;
			break;
		}
		ret = fork_file(f, &e, &base);
		if (!ret && e.link)
			ret = fork_link_add(f, &e);
		break;
	}
out:
	cb_entry_clear(&e);
	cb_entry_clear(&base);
	return ret;
}

/* Last, deepest first: each directory made in the upper gets the time the turn recorded (the
 * base directory's own when it recorded none), after everything in it was written. */
static int fork_dir_times(struct fork_ctx *f)
{
	struct cb_entry e = {0}, base = {0};
	int ret = 0;

	ws_pathset_sort(&f->dirs);
	for (size_t i = f->dirs.n; i-- > 0 && !ret;) {
		ret = ws_entry_at(f->t, f->dirs.p[i].path, f->turn, &e);
		if (!ret && e.type == CB_ENTRY_DIR && !e.has_mtime) {
			ret = ws_base_now(f->t, e.path, &base);
			e.has_mtime = base.type == CB_ENTRY_DIR && base.has_mtime;
			e.mtime_ns = base.mtime_ns;
		}
		if (!ret && e.type == CB_ENTRY_DIR)
			ret = ws_restore_time_at(f->upper_fd, &e);
	}
	cb_entry_clear(&e);
	cb_entry_clear(&base);
	return ret ? cb_error_wrap(ret, "fork") : 0;
}

static int fork_collect(const char *path, void *arg)
{
	return ws_pathset_add(arg, path, 0, NULL);
}

/* The one fsync of the new database (written unsynced, checkpointed at close) and of the
 * directory that holds it, before the fork is published. */
static int fork_sync(const char *db_path)
{
	char *wal = NULL, *dir = strdup(db_path), *slash = dir ? strrchr(dir, '/') : NULL;
	int ret = 0;

	if (!slash || asprintf(&wal, "%s-wal", db_path) < 0) {
		free(dir);
		return cb_error_set(ENOMEM, "fork: out of memory");
	}
	*slash = '\0';
	/* The WAL only if a connection elsewhere kept it from the checkpoint at close. */
	const char *names[] = {db_path, wal, dir};

	for (size_t i = 0; i < 3 && !ret; i++) {
		int fd = open(names[i], O_RDONLY | O_CLOEXEC);

		if ((fd < 0 && (i != 1 || errno != ENOENT)) || (fd >= 0 && fsync(fd) < 0))
			ret = cb_error_set(errno, "fork: fsync %s: %s", names[i], strerror(errno));
		if (fd >= 0)
			close(fd);
	}
	free(wal);
	free(dir);
	return ret;
}

int cb_ws_base_drift(struct cb_turns *t, struct cb_ws_drift *out)
{
	struct ws_pathset set = {0};
	struct cb_ws_base_stats stats;
	int ret;

	memset(out, 0, sizeof(*out));
	ret = ws_base_changes(t, 0, &set, &stats);
	ws_pathset_sort(&set);
	if (!ret && set.n && !(out->paths = calloc(set.n, sizeof(*out->paths))))
		ret = cb_error_set(ENOMEM, "base drift: out of memory");
	for (size_t i = 0; !ret && i < set.n; i++) {
		out->paths[i] = set.p[i].path; /* moved: the set keeps none of them */
		set.p[i].path = NULL;
		out->n++;
	}
	ws_pathset_free(&set);
	if (ret)
		cb_ws_drift_free(out);
	return ret;
}

void cb_ws_drift_free(struct cb_ws_drift *d)
{
	for (size_t i = 0; i < d->n; i++)
		free(d->paths[i]);
	free(d->paths);
	memset(d, 0, sizeof(*d));
}

int cb_ws_fork(struct cb_turns *t, long long turn, const char *new_upper, const char *new_db,
	       const char *new_blob_dir, const struct cb_ws_drift *drift,
	       struct cb_ws_fork_stats *stats)
{
	struct cb_ws_fork_stats none;
	struct fork_ctx f = {.t = t, .turn = turn, .upper_fd = -1, .blob_fd = -1};
	struct ws_pathset paths = {0};
	struct cb_ws_base_stats base_stats;
	char label[64];
	struct timespec ts, at;
	int ret, intx = 0;

	/* A fork's base would be the folder the in-place workspace keeps rewriting. */
	if (t->in_place)
		return cb_error_set(EINVAL, "fork: the workspace is in place (its base is the live "
					    "folder); cowbox apply REF --turn N --to DIR copies a "
					    "turn out instead");
	if (!stats)
		stats = &none;
	memset(stats, 0, sizeof(*stats));
	clock_gettime(CLOCK_MONOTONIC, &at);
	ret = ws_turn_check(t, turn);
	if (ret)
		return ret;
	if (mkdir(new_blob_dir, 0700) < 0 && errno != EEXIST)
		return cb_error_set(errno, "fork: %s: %s", new_blob_dir, strerror(errno));
	f.upper_fd = open(new_upper, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	f.blob_fd = open(new_blob_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (f.upper_fd < 0 || f.blob_fd < 0) {
		ret = cb_error_set(errno, "fork: open %s: %s",
				   f.upper_fd < 0 ? new_upper : new_blob_dir, strerror(errno));
		goto out;
	}
	ret = cb_db_turns_open(new_db, &f.db);
	/* Nothing uses this database before it is fsynced once, below. */
	if (!ret)
		ret = cb_db_turns_unsynced(f.db);
	if (ret)
		goto out;
	ret = cb_db_turns_begin(f.db);
	if (ret)
		goto out;
	intx = 1;
	stats->db_seconds = cb_clock_lap(&at);
	/* The paths the turns changed, and those whose base entry is no longer turn 0's: the
	 * fork's tree is the base as it is now plus its upper layer, so a base changed behind
	 * our back must not show through where the turn had the old entry (its content comes
	 * from a blob, or the fork fails naming the path). Sorted: a whited-out directory comes
	 * before everything that was below it. */
	ret = cb_db_turns_delta_paths(t->db, 0, turn, fork_collect, &paths);
	for (size_t i = 0; drift && !ret && i < drift->n; i++)
		ret = ws_pathset_add(&paths, drift->paths[i], 0, NULL);
	if (!ret && !drift)
		ret = ws_base_changes(t, 0, &paths, &base_stats);
	if (!ret)
		ws_pathset_sort(&paths);
	stats->paths = (long long)paths.n;
	stats->paths_seconds = cb_clock_lap(&at);
	for (size_t i = 0; i < paths.n && !ret; i++)
		ret = fork_one(paths.p[i].path, &f);
	if (!ret)
		ret = fork_dir_times(&f);
	clock_gettime(CLOCK_REALTIME, &ts);
	snprintf(label, sizeof(label), "fork of turn %lld", turn);
	if (!ret)
		ret = cb_db_turns_base_cache_from(f.db, t->db_path);
	if (!ret)
		ret = cb_db_turns_add(f.db, 1, (double)ts.tv_sec + ts.tv_nsec / 1e9, label, 0);
	stats->write_seconds = cb_clock_lap(&at);
	if (!ret)
		ret = cb_db_turns_commit(f.db);
	if (!ret)
		intx = 0;
	stats->commit_seconds = cb_clock_lap(&at);
out:
	if (intx)
		cb_db_turns_rollback(f.db);
	cb_db_turns_close(f.db); /* the checkpoint: every row is in the file now */
	if (!ret)
		ret = fork_sync(new_db);
	stats->sync_seconds = cb_clock_lap(&at);
	ws_pathset_free(&paths);
	ws_pathset_free(&f.dirs);
	for (size_t i = 0; i < f.nlinks; i++) {
		free(f.links[i].key);
		free(f.links[i].path);
	}
	free(f.links);
	if (f.upper_fd >= 0)
		close(f.upper_fd);
	if (f.blob_fd >= 0)
		close(f.blob_fd);
	return ret ? cb_error_wrap(ret, "fork turn %lld", turn) : 0;
}

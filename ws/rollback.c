/* Rollback: make the live tree equal a turn's map with ordinary file operations through the
 * mount (so the journal records them and every kernel cache stays coherent), touching only
 * the paths that differ. Sources are checked against the turn's hashes before the tree is
 * touched and while copying; files are replaced by rename, never rewritten in place. */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "turns_int.h"

#define RB_THREADS 4

/* rm -rf of path beneath root, through no symlink at any depth (a symlink on the way means
 * the path is not in the tree: nothing to remove). */
static int rb_remove_path(int root_fd, const char *path)
{
	int ret = cb_beneath_remove_tree(root_fd, path);

	return ret ? cb_error_wrap(ret, "rollback") : 0;
}

/* A name beside path for building its replacement: rename over path is then atomic for
 * every reader (old or new content, never a mix). Names with this prefix are cowbox's:
 * snapshots skip them and a start after a crash removes them (cb_ws_rollback_clean). */
static void rb_tmpname(char *buf, size_t len)
{
	static unsigned counter;

	snprintf(buf, len, CB_WS_ROLLBACK_TMP "%d.%u", (int)getpid(),
		 __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED));
}

/* Open the source of e's content: the base file at its path or its blob; what names it. */
static int rb_open_source(struct cb_turns *t, const struct cb_entry *e, int from_base, char *what,
			  size_t len)
{
	char hex[2 * CB_XXH128_LEN + 1];
	int fd;

	cb_hex(e->xxh3, CB_XXH128_LEN, hex);
	if (from_base) {
		snprintf(what, len, "base file %s", e->path);
		fd = cb_beneath_open(t->base_fd, e->path, O_RDONLY, 0);
		return fd < 0 ? cb_error_wrap(fd, "base") : fd;
	}
	snprintf(what, len, "%s (blob %s)", e->path, hex);
	return cb_ws_blob_open(t->blob_fd, e->xxh3);
}

/* 0 if the source holds exactly e's bytes, -EBADMSG (message names it) if not. */
static int rb_check_source(struct cb_turns *t, const struct cb_entry *e, int from_base)
{
	char what[128];
	int fd = rb_open_source(t, e, from_base, what, sizeof(what)), ret;

	if (fd < 0)
		return fd;
	ret = cb_ws_copy_checked(fd, -1, e, what);
	close(fd);
	return ret;
}

int ws_is_tmp_name(const char *path)
{
	return cb_journal_tmp_name(path);
}

/* Remove the temporary names below dirfd (a directory of the upper layer), recursively. */
static int rb_clean_dir(int fd_in, long long *removed)
{
	struct dirent *de;
	DIR *dir = fdopendir(fd_in);
	int ret = 0;

	if (!dir) {
		ret = cb_error_set(errno, "clean: %s", strerror(errno));
		close(fd_in);
		return ret;
	}
	while ((de = readdir(dir))) {
		int fd;

		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (ws_is_tmp_name(de->d_name)) {
			/* A rollback temp is a file or a symlink, never a directory. */
			if (unlinkat(dirfd(dir), de->d_name, 0) == 0)
				(*removed)++;
			else if (errno != ENOENT && !ret)
				ret = cb_error_set(errno, "remove %s: %s", de->d_name,
						   strerror(errno));
			continue;
		}
		if (de->d_type != DT_DIR && de->d_type != DT_UNKNOWN)
			continue;
		fd =
		    openat(dirfd(dir), de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (fd >= 0) {
			int r = rb_clean_dir(fd, removed);

			if (r && !ret)
				ret = r;
		}
	}
	closedir(dir);
	return ret;
}

int cb_ws_rollback_clean(const char *upper, long long *removed)
{
	int fd = open(upper, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

	*removed = 0;
	if (fd < 0)
		return cb_error_set(errno, "%s: %s", upper, strerror(errno));
	return rb_clean_dir(fd, removed);
}

/* Where the content of e (a file of the target turn) comes from: the base file at the same
 * path when it still holds these bytes (1), else its blob (0); either is read whole and
 * checked against the turn's hashes first, so a damaged or missing one fails the rollback
 * before the tree is touched. Uses the db: call it from the rollback's own thread only. */
static int rb_resolve(struct cb_turns *t, const struct cb_entry *e, long long turn)
{
	char hex[2 * CB_XXH128_LEN + 1];
	int from_base = ws_base_holds(t, e->path, e->xxh3), has_blob, ret;

	if (from_base < 0)
		return from_base;
	has_blob = cb_ws_blob_has(t->blob_fd, e->xxh3);
	cb_hex(e->xxh3, CB_XXH128_LEN, hex);
	if (!from_base && !has_blob)
		return cb_error_set(ENOENT,
				    "%s at turn %lld: content %s is neither in the base (changed "
				    "since it was hashed?) nor in the blob store (blob %s missing)",
				    e->path, turn, hex, hex);
	ret = rb_check_source(t, e, from_base);
	/* The base changed between its cache check and now: the blob may still be good. */
	if (ret == -EBADMSG && from_base && has_blob) {
		from_base = 0;
		ret = rb_check_source(t, e, 0);
	}
	if (ret)
		return cb_error_wrap(ret, "%s at turn %lld cannot be restored", e->path, turn);
	return from_base;
}

/* The process umask, read without changing it (umask() would race with other threads). */
mode_t ws_process_umask(void)
{
	char line[128];
	unsigned m = 022;
	FILE *f = fopen("/proc/self/status", "re");

	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "Umask: %o", &m) == 1)
			break;
	if (f)
		fclose(f);
	return (mode_t)m;
}

static int rb_file(struct cb_turns *t, const struct cb_entry *e, int from_base, mode_t um,
		   struct stat *after, int *written)
{
	const char *name;
	char tmp[64], what[128];
	int src = -1, dst = -1, pfd, ret = 0;

	pfd = cb_beneath_parent(t->root_fd, e->path, &name);
	if (pfd < 0)
		return cb_error_wrap(pfd, "restore %s: its directory", e->path);
	src = rb_open_source(t, e, from_base, what, sizeof(what));
	if (src < 0) {
		ret = src;
		goto out;
	}
	rb_tmpname(tmp, sizeof(tmp));
	/* Created with its mode (a read-only mode does not stop this open for writing) in the
	 * pinned directory, as a new name (O_EXCL: nothing planted is opened); a chmod (one
	 * more FUSE round trip and journal mark) only when the umask took bits away. */
	dst = openat(pfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC,
		     e->mode & 0777);
	if (dst < 0) {
		ret = cb_error_set(errno, "restore %s: create: %s", e->path, strerror(errno));
		goto out;
	}
	/* Checked again while copying: what lands in the tree is what the turn recorded, and
	 * the hash the next snapshot is given for it was computed from these very bytes. */
	ret = cb_ws_copy_checked(src, dst, e, what);
	/* The owner first (a chown drops set-id bits: the chmod then puts them back), the
	 * xattrs after the mode (an ACL and the mode share the group bits), the time the turn
	 * recorded (a base file's own when it comes from the base) last. */
	if (!ret)
		ret = ws_restore_owner(dst, e, t->restore_id_base);
	if (!ret && (e->mode & (um | 07000) || e->has_owner))
		ret = cb_beneath_fchmod(dst, e->path, e->mode, &t->setid);
	if (!ret)
		ret = ws_restore_xattrs(dst, e, t->restore_id_base, 1, 0);
	if (!ret)
		ret = ws_restore_mtime(dst, e, from_base ? src : -1);
	if (close(dst) < 0 && !ret)
		ret = cb_error_set(errno, "restore %s: close: %s", e->path, strerror(errno));
	if (!ret && renameat(pfd, tmp, pfd, name) < 0)
		ret = cb_error_set(errno, "restore %s: rename: %s", e->path, strerror(errno));
	if (ret)
		unlinkat(pfd, tmp, 0);
	else
		*written = fstatat(pfd, name, after, AT_SYMLINK_NOFOLLOW) == 0;
out:
	if (src >= 0)
		close(src);
	close(pfd);
	return ret ? cb_error_wrap(ret, "rollback") : 0;
}

static int rb_symlink(struct cb_turns *t, const struct cb_entry *e)
{
	const char *name;
	char tmp[64];
	int pfd = cb_beneath_parent(t->root_fd, e->path, &name), ret = 0;

	if (pfd < 0)
		return cb_error_wrap(pfd, "restore symlink");
	rb_tmpname(tmp, sizeof(tmp));
	if (symlinkat(e->target, pfd, tmp) < 0)
		ret = cb_error_set(errno, "restore symlink %s: %s", e->path, strerror(errno));
	else if (renameat(pfd, tmp, pfd, name) < 0) {
		ret = cb_error_set(errno, "restore symlink %s: %s", e->path, strerror(errno));
		unlinkat(pfd, tmp, 0);
	}
	close(pfd);
	return ret;
}

static int rb_mkdir(struct cb_turns *t, const char *path)
{
	int ret = cb_beneath_mkdir(t->root_fd, path, 0700);

	return ret && ret != -EEXIST ? cb_error_wrap(ret, "restore dir") : 0;
}

/* A file whose content must be written, and where it comes from. */
struct rb_job {
	const struct cb_entry *want;
	int from_base;
	int written;	/* renamed into place */
	struct stat st; /* its stat right after */
};

struct rb_jobs {
	struct cb_turns *t;
	struct rb_job *job;
	size_t n, next;
	mode_t um;
	pthread_mutex_t lock;
	int err;
	char msg[512];
};

/* 1 if the path needs its file content written (not just its mode). */
static int rb_needs_content(const struct cb_diff_event *ev)
{
	const struct cb_entry *want = &ev->old, *have = &ev->new;

	return want->type == CB_ENTRY_FILE &&
	       !(have->type == CB_ENTRY_FILE && have->size == want->size &&
		 !memcmp(have->sha256, want->sha256, CB_SHA256_LEN));
}

/* The recorded owner, mode, xattrs and time of want, on the entry at its path. */
static int rb_meta(struct cb_turns *t, const struct cb_entry *want, int time)
{
	int ret = ws_restore_meta_at(t->root_fd, want, t->restore_id_base, 1, &t->setid, time);

	return ret ? cb_error_wrap(ret, "rollback") : 0;
}

/* Restore one path whose live entry (ev->new) differs from the turn's (ev->old), in content
 * or in metadata only; what had to go is already gone. Files that need content are jobs
 * already (rb_plan); directories get their metadata last (rb_dirs_last). */
static int rb_restore(struct cb_turns *t, const struct cb_diff_event *ev)
{
	const struct cb_entry *want = &ev->old, *have = &ev->new;
	int ret;

	switch (want->type) {
	case CB_ENTRY_ABSENT:
		return 0;
	case CB_ENTRY_DIR:
		return want->type == have->type ? 0 : rb_mkdir(t, want->path);
	case CB_ENTRY_SYMLINK:
		/* the same target with other metadata: the symlink stays, its metadata goes */
		ret = cb_entry_same(want, have) ? 0 : rb_symlink(t, want);
		return ret ? ret : rb_meta(t, want, 1);
	case CB_ENTRY_FILE:
		return rb_needs_content(ev) ? 0 : rb_meta(t, want, 1);
	}
	return 0;
}

static const struct cb_diff_event *rb_event(const struct cb_diff *d, const char *path)
{
	size_t lo = 0, hi = d->n;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		int c = strcmp(d->ev[mid].old.path, path);

		if (c == 0)
			return &d->ev[mid];
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

/* Make path (a file of the turn) a hard link of anchor, the first name of its group: a new
 * name beside it, renamed over it. */
static int rb_relink(struct cb_turns *t, const char *anchor, const char *path)
{
	const char *slash = strrchr(path, '/');
	char tmp[64], *tmppath = NULL;
	int ret;

	rb_tmpname(tmp, sizeof(tmp));
	if (asprintf(&tmppath, "%.*s%s", slash ? (int)(slash - path + 1) : 0, path, tmp) < 0)
		return cb_error_set(ENOMEM, "rollback: out of memory");
	ret = ws_link_at(t->root_fd, anchor, tmppath);
	if (!ret && (ret = cb_beneath_rename(t->root_fd, tmppath, path, 0)))
		cb_beneath_unlink(t->root_fd, tmppath, 0);
	free(tmppath);
	return ret ? cb_error_wrap(ret, "rollback: hard link %s", path) : 0;
}

/* After the contents: the names of each hard-link group of the turn that a restored file
 * is in become one inode again, that of the group's first name (relinked: the others). */
static int rb_links(struct cb_turns *t, const struct cb_diff *d, long long turn,
		    struct ws_pathset *relinked)
{
	struct ws_pathset done = {0}, group = {0};
	int ret = 0;

	for (size_t i = 0; i < d->n && !ret; i++) {
		const struct cb_entry *want = &d->ev[i].old;
		int seen = 0;

		if (want->type != CB_ENTRY_FILE || !want->link)
			continue;
		for (size_t j = 0; j < done.n && !seen; j++)
			seen = !strcmp(done.p[j].path, want->link);
		if (seen || (ret = ws_pathset_add(&done, want->link, 0, NULL)))
			continue;
		ret = ws_link_group(t, turn, want->link, &group);
		for (size_t j = 1; j < group.n && !ret; j++)
			if (!ws_same_inode(t->root_fd, group.p[0].path, group.p[j].path) &&
			    !(ret = rb_relink(t, group.p[0].path, group.p[j].path)))
				ret = ws_pathset_add(relinked, group.p[j].path, 0, NULL);
		ws_pathset_free(&group);
	}
	ws_pathset_free(&done);
	return ret;
}

/* Last, deepest first (so a read-only directory blocks nothing and nothing written after
 * moves a time again): each directory of the turn that changed gets its recorded mode,
 * owner, xattrs and time, and each directory the rollback wrote in (a parent of a path
 * restored or relinked) its recorded time back. */
static int rb_dirs_last(struct cb_turns *t, const struct cb_diff *d, long long turn,
			const struct ws_pathset *relinked)
{
	struct ws_pathset dirs = {0};
	struct cb_entry e = {0};
	int ret = 0;

	for (size_t i = 0; i < d->n + relinked->n && !ret; i++) {
		const char *path = i < d->n ? d->ev[i].old.path : relinked->p[i - d->n].path;
		const char *slash = strrchr(path, '/');
		char *parent;

		if (i < d->n && d->ev[i].old.type == CB_ENTRY_DIR)
			ret = ws_pathset_add(&dirs, path, 0, NULL);
		if (ret || !slash)
			continue;
		if (!(parent = strndup(path, (size_t)(slash - path))))
			ret = cb_error_set(ENOMEM, "rollback: out of memory");
		else
			ret = ws_pathset_add(&dirs, parent, 0, NULL);
		free(parent);
	}
	ws_pathset_sort(&dirs);
	for (size_t i = dirs.n; i-- > 0 && !ret;) {
		const struct cb_diff_event *ev = rb_event(d, dirs.p[i].path);

		if (ev && ev->old.type == CB_ENTRY_DIR) {
			ret = rb_meta(t, &ev->old, 1);
			continue;
		}
		ret = ws_entry_at(t, dirs.p[i].path, turn, &e);
		if (!ret && e.type == CB_ENTRY_DIR)
			ret = ws_restore_time_at(t->root_fd, &e);
	}
	cb_entry_clear(&e);
	ws_pathset_free(&dirs);
	return ret ? cb_error_wrap(ret, "rollback") : 0;
}

/* Find (and check) the source of every file to write before anything is changed. */
static int rb_plan(struct cb_turns *t, const struct cb_diff *d, long long turn,
		   struct rb_jobs *jobs)
{
	for (size_t i = 0; i < d->n; i++) {
		int from_base;

		if (!rb_needs_content(&d->ev[i]))
			continue;
		from_base = rb_resolve(t, &d->ev[i].old, turn);
		if (from_base < 0)
			return from_base;
		jobs->job[jobs->n++] =
		    (struct rb_job){.want = &d->ev[i].old, .from_base = from_base};
	}
	return 0;
}

static void *rb_worker(void *arg)
{
	struct rb_jobs *j = arg;

	for (;;) {
		struct rb_job *job = NULL;
		int ret;

		pthread_mutex_lock(&j->lock);
		if (!j->err && j->next < j->n)
			job = &j->job[j->next++];
		pthread_mutex_unlock(&j->lock);
		if (!job)
			return NULL;
		ret = rb_file(j->t, job->want, job->from_base, j->um, &job->st, &job->written);
		if (ret) {
			pthread_mutex_lock(&j->lock);
			if (!j->err) {
				j->err = ret;
				snprintf(j->msg, sizeof(j->msg), "%s", cb_error_message());
			}
			pthread_mutex_unlock(&j->lock);
		}
	}
}

/* Write the files on a few threads: each one is several FUSE round trips and journal marks,
 * and concurrent marks share one group commit. */
static int rb_run_jobs(struct rb_jobs *j)
{
	pthread_t th[RB_THREADS];
	size_t started = 0;

	for (size_t i = 0; i + 1 < RB_THREADS && i + 1 < j->n; i++)
		if (pthread_create(&th[started], NULL, rb_worker, j) == 0)
			started++;
	rb_worker(j);
	for (size_t i = 0; i < started; i++)
		pthread_join(th[i], NULL);
	if (j->err)
		return cb_error_set(j->err, "%s", j->msg);
	return 0;
}

/* Hand the files written to the snapshot that records the rollback (ws_known_set). */
static int rb_remember(struct cb_turns *t, struct rb_jobs *j)
{
	struct ws_known *known = calloc(j->n ? j->n : 1, sizeof(*known));
	size_t n = 0;
	int ret = 0;

	if (!known)
		return cb_error_set(ENOMEM, "rollback: out of memory");
	for (size_t i = 0; i < j->n && !ret; i++) {
		if (!j->job[i].written)
			continue;
		ret = cb_entry_copy(&known[n].e, j->job[i].want);
		known[n].st = j->job[i].st;
		n += !ret;
	}
	if (ret) {
		for (size_t i = 0; i < n; i++)
			cb_entry_clear(&known[i].e);
		free(known);
		return ret;
	}
	ws_known_set(t, known, n);
	return 0;
}

/* 1 if the diff has an event at path (its events are in byte order of path). */
static int rb_has_event(const struct cb_diff *d, const char *path)
{
	size_t lo = 0, hi = d->n;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		int c =
		    strcmp(d->ev[mid].old.path ? d->ev[mid].old.path : d->ev[mid].new.path, path);

		if (!c)
			return 1;
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return 0;
}

/* The checked files (given back to the base) that hold the turn's content but show another
 * time, owner or xattrs than it recorded: each becomes a job, a copy of its own written with
 * the turn's metadata. want[] holds their entries (ncheck of them, the caller frees). */
static int rb_plan_meta(struct cb_turns *t, const struct cb_diff *d, long long turn,
			const char *const *check, size_t ncheck, struct cb_entry *want,
			struct rb_jobs *jobs)
{
	struct cb_entry live = {0};
	int ret = 0;

	for (size_t i = 0; i < ncheck && !ret; i++) {
		int from_base;

		/* A path with an event is restored whole already. */
		if (rb_has_event(d, check[i]))
			continue;
		ret = ws_entry_at(t, check[i], turn, &want[i]);
		if (!ret)
			ret = ws_live_meta(t, check[i], &live);
		if (ret || want[i].type != CB_ENTRY_FILE || live.type != CB_ENTRY_FILE ||
		    live.size != want[i].size)
			continue; /* changed meanwhile: the snapshot records what is there */
		memcpy(live.sha256, want[i].sha256, CB_SHA256_LEN);
		memcpy(live.xxh3, want[i].xxh3, CB_XXH128_LEN);
		if (!cb_entry_meta_moved(&live, &want[i]))
			continue;
		from_base = rb_resolve(t, &want[i], turn);
		if (from_base < 0)
			ret = from_base;
		else
			jobs->job[jobs->n++] =
			    (struct rb_job){.want = &want[i], .from_base = from_base};
	}
	cb_entry_clear(&live);
	return ret;
}

int cb_ws_rollback(struct cb_turns *t, long long turn, const struct cb_dirty *dirty, size_t n,
		   long long *touched)
{
	return cb_ws_rollback_checked(t, turn, dirty, n, NULL, 0, touched);
}

int cb_ws_rollback_checked(struct cb_turns *t, long long turn, const struct cb_dirty *dirty,
			   size_t n, const char *const *check, size_t ncheck, long long *touched)
{
	struct rb_jobs jobs = {.t = t, .um = ws_process_umask()};
	struct cb_entry *metas = calloc(ncheck ? ncheck : 1, sizeof(*metas));
	struct ws_pathset relinked = {0};
	struct cb_diff d = {0};
	size_t planned = 0;
	int ret = metas ? 0 : cb_error_set(ENOMEM, "out of memory");

	*touched = 0;
	pthread_mutex_init(&jobs.lock, NULL);
	/* old = the turn's entry, new = the live one: exactly the paths to put back. */
	if (!ret)
		ret = ws_diff_run(t, turn, -1, dirty, n, 1, &d);
	if (ret)
		goto out;
	jobs.job = calloc(d.n + ncheck + 1, sizeof(*jobs.job));
	if (!jobs.job) {
		ret = cb_error_set(ENOMEM, "out of memory");
		goto out;
	}
	ret = rb_plan(t, &d, turn, &jobs);
	planned = jobs.n;
	if (!ret)
		ret = rb_plan_meta(t, &d, turn, check, ncheck, metas, &jobs);
	/* Children before parents: remove what the turn does not have (or has as another type). */
	for (size_t i = d.n; i-- > 0 && !ret;) {
		const struct cb_diff_event *ev = &d.ev[i];

		if (ev->new.type != CB_ENTRY_ABSENT && ev->old.type != ev->new.type)
			ret = rb_remove_path(t->root_fd, ev->new.path);
	}
	/* Parents before children: directories exist before what goes in them. */
	for (size_t i = 0; i < d.n && !ret; i++)
		ret = rb_restore(t, &d.ev[i]);
	if (!ret)
		ret = rb_run_jobs(&jobs);
	if (!ret)
		ret = rb_remember(t, &jobs);
	if (!ret)
		ret = rb_links(t, &d, turn, &relinked);
	if (!ret)
		ret = rb_dirs_last(t, &d, turn, &relinked);
	*touched = (long long)(d.n + jobs.n - planned);
out:
	for (size_t i = 0; metas && i < ncheck; i++)
		cb_entry_clear(&metas[i]);
	free(metas);
	free(jobs.job);
	ws_pathset_free(&relinked);
	pthread_mutex_destroy(&jobs.lock);
	cb_ws_diff_free(&d);
	return ret ? cb_error_wrap(ret, "rollback to turn %lld", turn) : 0;
}

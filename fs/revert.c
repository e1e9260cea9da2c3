/* Rollback's way back to the base: a path whose recorded entry is the base's own again loses
 * what upper holds there (a whiteout, a copy) instead of gaining one more copy of the base's
 * bytes, so undoing an rm -rf costs no space. Served for the daemon, not for a FUSE request. */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "ov.h"
#include "util/beneath.h"

/* What the kernel must forget once the locks are let go: parent's entry name (its negative
 * or old entry), and parent's attributes and cached listing. */
struct rv_inval {
	fuse_ino_t parent;
	char *name;
};

struct rv_state {
	struct cb_overlay *ov;
	struct rv_inval *v;
	size_t n, cap;
};

static fuse_ino_t rv_ino(const struct ov_inode *in)
{
	return in->is_root ? FUSE_ROOT_ID : (fuse_ino_t)(uintptr_t)in;
}

/* The inode the table knows for the entry with stat st, or NULL; pinned (one more kernel
 * reference, given back by rv_unpin): a FORGET frees an inode nothing refers to without
 * taking ns. Caller holds ns. */
static struct ov_inode *rv_known(struct cb_overlay *ov, const struct stat *st)
{
	struct ov_inode *in;

	cb_mutex_lock(&ov->tab.lock);
	in = ov_table_find(&ov->tab, st->st_dev, st->st_ino);
	if (in)
		in->nlookup++;
	cb_mutex_unlock(&ov->tab.lock);
	return in;
}

static void rv_unpin(struct cb_overlay *ov, struct ov_inode *in)
{
	if (in && in != ov->root)
		ov_forget_one(ov, in, 1);
}

/* The directory at path as the table knows it (pinned, see rv_known): by its upper identity
 * (ust), else by its base one while it still lives there; the root for "". NULL: the kernel
 * holds nothing of it (no entry below it can be cached either). */
static struct ov_inode *rv_dir(struct cb_overlay *ov, const char *path, const struct stat *ust)
{
	struct ov_inode *in;
	struct stat bst;

	if (!path[0])
		return ov->root;
	in = rv_known(ov, ust);
	if (!in && cb_beneath_stat(ov->base_fd, path, &bst) == 0) {
		in = rv_known(ov, &bst);
		if (in && atomic_load(&in->layer) != OV_BASE) {
			rv_unpin(ov, in);
			in = NULL;
		}
	}
	return in;
}

static int rv_inval_add(struct rv_state *s, struct ov_inode *parent, const char *name)
{
	struct rv_inval *grown;

	if (!parent)
		return 0;
	if (s->n == s->cap) {
		size_t cap = s->cap ? 2 * s->cap : 16;

		if (!(grown = realloc(s->v, cap * sizeof(*grown))))
			return -ENOMEM;
		s->v = grown;
		s->cap = cap;
	}
	s->v[s->n].parent = rv_ino(parent);
	if (!(s->v[s->n].name = strdup(name)))
		return -ENOMEM;
	s->n++;
	return 0;
}

/* The opaque upper directory at path (ufd, open for reading) over a base directory becomes a
 * merged one showing exactly what it showed: first a whiteout for every base entry it hid,
 * and the opaque mark on each upper directory in it that the base has too (an opaque parent
 * kept the base's out of it), then its own opaque mark goes (a crash in between leaves it
 * opaque, with marks it does not need). The base then shows wherever a path below it loses
 * its whiteout. */
static int rv_unopaque(struct cb_overlay *ov, const char *path, int ufd)
{
	int bfd = cb_beneath_open(ov->base_fd, path, O_RDONLY | O_DIRECTORY, 0), r = 0;
	struct stat st, bst;
	struct dirent *de;
	DIR *d;

	if (bfd < 0)
		return bfd;
	if (!(d = fdopendir(bfd))) {
		close(bfd);
		return cb_error_set(errno, "revert %s: %s", path, strerror(errno));
	}
	while (!r && (de = readdir(d))) {
		int cfd;

		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (fstatat(ufd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
			if (errno != ENOENT || mknodat(ufd, de->d_name, S_IFCHR, makedev(0, 0)) < 0)
				r = cb_error_set(errno, "revert %s/%s: whiteout: %s", path,
						 de->d_name, strerror(errno));
			continue;
		}
		if (!S_ISDIR(st.st_mode) ||
		    fstatat(dirfd(d), de->d_name, &bst, AT_SYMLINK_NOFOLLOW) < 0 ||
		    !S_ISDIR(bst.st_mode))
			continue;
		cfd = openat(ufd, de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (cfd < 0 || fsetxattr(cfd, OV_OPAQUE_XATTR, "y", 1, 0) < 0)
			r = cb_error_set(errno, "revert %s/%s: opaque mark: %s", path, de->d_name,
					 strerror(errno));
		if (cfd >= 0)
			close(cfd);
	}
	closedir(d);
	if (!r && fremovexattr(ufd, OV_OPAQUE_XATTR) < 0 && errno != ENODATA)
		r = cb_error_set(errno, "revert %s: opaque mark: %s", path, strerror(errno));
	return r;
}

/* Make the upper directory at path (stat ust) merge with the base's there, if it does not;
 * 1 if it now does, 0 if it cannot (the base has no directory there). Caller holds ns write. */
static int rv_merge_dir(struct cb_overlay *ov, const char *path, const struct stat *ust)
{
	struct ov_inode *in;
	struct stat bst;
	char v[2];
	int fd, r = 1;

	if (cb_beneath_stat(ov->base_fd, path, &bst) < 0 || !S_ISDIR(bst.st_mode))
		return 0;
	fd = cb_beneath_open(ov->upper_fd, path, O_RDONLY | O_DIRECTORY, 0);
	if (fd < 0)
		return fd;
	if (fgetxattr(fd, OV_OPAQUE_XATTR, v, sizeof(v)) == 1 && v[0] == 'y') {
		r = rv_unopaque(ov, path, fd);
		if (!r && (in = rv_known(ov, ust))) {
			in->merged = 1;
			rv_unpin(ov, in);
		}
		r = r ? r : 1;
	}
	close(fd);
	return r;
}

/* 1 if every directory above path shows the base's below it (an opaque one is made to), so
 * that what upper drops at path lets the base's entry show; 0 if one cannot (a whiteout, a
 * non-directory, or a directory the base lacks), or -errno. Caller holds ns write. */
static int rv_ancestors(struct cb_overlay *ov, const char *path)
{
	char *dir = strdup(path), *slash;
	struct stat st;
	int r = 1;

	if (!dir)
		return -ENOMEM;
	for (slash = strchr(dir, '/'); slash && r == 1; slash = strchr(slash + 1, '/')) {
		*slash = '\0';
		/* Not in upper: the base's, and so is all below it. */
		if (cb_beneath_stat(ov->upper_fd, dir, &st) < 0)
			break;
		r = S_ISDIR(st.st_mode) ? rv_merge_dir(ov, dir, &st) : 0;
		*slash = '/';
	}
	free(dir);
	return r;
}

/* Drop what upper holds at path so that the base's entry shows. Caller holds ns write and
 * the fence's shared side. 1 if something changed, 0 if nothing had to (or could), -errno. */
static int rv_one(struct rv_state *s, const char *path)
{
	struct cb_overlay *ov = s->ov;
	struct ov_inode *parent = NULL, *in = NULL;
	struct stat ust, bst, pst;
	const char *name;
	char *dir = NULL;
	long long xattrs = 0;
	int r, pfd = -1, keep = -1, is_dir;

	r = rv_ancestors(ov, path);
	if (r <= 0)
		return r;
	if (cb_beneath_stat(ov->base_fd, path, &bst) < 0)
		return 0; /* nothing to show through */
	pfd = cb_beneath_parent(ov->upper_fd, path, &name);
	if (pfd < 0)
		return cb_beneath_gone(pfd) ? 0 : pfd;
	if (fstatat(pfd, name, &ust, AT_SYMLINK_NOFOLLOW) < 0) {
		r = errno == ENOENT ? 0
				    : cb_error_set(errno, "revert %s: %s", path, strerror(errno));
		goto out;
	}
	is_dir = S_ISDIR(bst.st_mode);
	if (S_ISDIR(ust.st_mode)) {
		/* A directory over the base's merges with it; over a file it stays (the
		 * rollback writes the file through the mount). */
		r = is_dir ? rv_merge_dir(ov, path, &ust) : 0;
		r = r == 1 ? 0 : r;
		goto out;
	}
	if (!(dir = strndup(path, (size_t)(name - path - (name > path)))) || fstat(pfd, &pst) < 0) {
		r = -ENOMEM;
		goto out;
	}
	parent = rv_dir(ov, dir, &pst);
	in = ov_is_whiteout(&ust) ? NULL : rv_known(ov, &ust);
	/* The journal first (the change then happens, or fails and the snapshot finds the
	 * path as it is): a directory's whole subtree is new to the mount. */
	r = ov_mark_path(ov, NULL, path, ov_is_whiteout(&ust) ? CB_CHANGE_CREATE : CB_CHANGE_WRITE,
			 is_dir);
	if (r < 0)
		goto out;
	if (!ov_is_whiteout(&ust)) {
		keep = in ? ov_keep_fd_for(ov, in, path) : -1;
		xattrs = ov_quota_xattr_gone(ov, path, &ust);
	}
	if (unlinkat(pfd, name, 0) < 0) {
		r = cb_error_set(errno, "revert %s: %s", path, strerror(errno));
		goto out;
	}
	if (!ov_is_whiteout(&ust)) {
		ov_upper_name_gone(ov, in, &ust, keep);
		if (xattrs)
			ov_quota_give(ov, xattrs, 0);
	}
	if (in && parent) {
		ov_name_gone(ov, in, parent, name, keep);
		keep = -1;
	}
	r = rv_inval_add(s, parent, name) < 0 ? -ENOMEM : 1;
out:
	if (keep >= 0)
		close(keep);
	rv_unpin(ov, in);
	rv_unpin(ov, parent);
	free(dir);
	close(pfd);
	return r;
}

/* Upper holds a non-directory at path (a whiteout, a copy): its entry is about to change, so
 * the kernel is told to forget it first (rv_notify). Caller holds ns. */
static int rv_will_change(struct rv_state *s, const char *path)
{
	struct stat st, pst;
	const char *name;
	char *dir;
	int pfd = cb_beneath_parent(s->ov->upper_fd, path, &name), r = 0;

	if (pfd < 0)
		return 0;
	if (fstatat(pfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISDIR(st.st_mode) &&
	    fstat(pfd, &pst) == 0) {
		struct ov_inode *parent;

		dir = strndup(path, (size_t)(name - path - (name > path)));
		parent = dir ? rv_dir(s->ov, dir, &pst) : NULL;
		r = dir ? rv_inval_add(s, parent, name) : -ENOMEM;
		rv_unpin(s->ov, parent);
		free(dir);
	}
	close(pfd);
	return r;
}

/* Tell the kernel to forget the entries collected (and their directories' attributes and
 * listings), with no lock held: a notification can make it send requests. */
static void rv_notify(struct rv_state *s)
{
	for (size_t i = 0; i < s->n; i++) {
		if (s->ov->se) {
			fuse_lowlevel_notify_inval_entry(s->ov->se, s->v[i].parent, s->v[i].name,
							 strlen(s->v[i].name));
			fuse_lowlevel_notify_inval_inode(s->ov->se, s->v[i].parent, 0, 0);
		}
		free(s->v[i].name);
	}
	s->n = 0;
}

int cb_overlay_revert(struct cb_overlay *ov, const char *const *paths, size_t n, size_t *reverted)
{
	struct rv_state s = {.ov = ov};
	int r = 0;

	*reverted = 0;
	if (!ov || ov->base_fd < 0 || !n)
		return 0;
	/* The kernel's cached entries of the paths that change are forgotten before the change
	 * and again after it, and none it learns meanwhile is cached: a request that raced in
	 * with the old state (a rename of a name it still held) is looked up anew at its next
	 * use, instead of the kernel keeping the old entry under some name for a day. */
	atomic_fetch_add(&ov->reverting, 1);
	cb_rwlock_read(&ov->tab.ns);
	for (size_t i = 0; i < n && r >= 0; i++)
		r = rv_will_change(&s, paths[i]);
	cb_rwlock_unlock(&ov->tab.ns);
	rv_notify(&s);
	for (size_t i = 0; i < n && r >= 0; i++) {
		ov_fence_enter(ov);
		cb_rwlock_write(&ov->tab.ns);
		r = rv_one(&s, paths[i]);
		cb_rwlock_unlock(&ov->tab.ns);
		ov_fence_leave(ov);
		if (r > 0)
			(*reverted)++;
		if (r < 0)
			r = cb_error_wrap(r, "revert %s", paths[i]);
	}
	rv_notify(&s);
	atomic_fetch_sub(&ov->reverting, 1);
	free(s.v);
	return r < 0 ? r : 0;
}

/* Copy-up: bringing a file or directory from the base into the upper layer before it is
 * changed, with its mode, owner, times and xattrs, atomically for files (O_TMPFILE + link). */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "ov.h"

static int ov_copy_data(int in, int out)
{
	char buf[65536];
	ssize_t n;

	if (ioctl(out, FICLONE, in) == 0)
		return 0;
	for (;;) {
		n = copy_file_range(in, NULL, out, NULL, 1 << 30, 0);
		if (n == 0)
			return 0;
		if (n < 0)
			break;
	}
	if (errno != EXDEV && errno != EINVAL && errno != EOPNOTSUPP && errno != ENOSYS)
		return -errno;
	while ((n = read(in, buf, sizeof(buf))) > 0) {
		char *p = buf;
		while (n > 0) {
			ssize_t w = write(out, p, (size_t)n);
			if (w < 0)
				return -errno;
			p += w;
			n -= w;
		}
	}
	return n < 0 ? -errno : 0;
}

/* Copies the xattrs of src (a path) to dstfd, or to the path dst when dstfd is -1, skipping
 * the overlay's own; ACLs get their ids shifted like the owner. */
static int ov_copy_xattrs(struct cb_overlay *ov, const char *src, int dstfd, const char *dst)
{
	char list[8192], val[65536];
	ssize_t n = llistxattr(src, list, sizeof(list)), v;
	char *name;

	if (n < 0)
		return errno == ENOTSUP ? 0 : -errno;
	for (name = list; name < list + n; name += strlen(name) + 1) {
		if (ov_name_is_private(name))
			continue;
		v = lgetxattr(src, name, val, sizeof(val));
		if (v < 0)
			continue;
		if (ov_acl_xattr(name))
			ov_acl_shift(ov, val, (size_t)v, 0);
		if ((dstfd >= 0 ? fsetxattr(dstfd, name, val, (size_t)v, 0)
				: lsetxattr(dst, name, val, (size_t)v, 0)) < 0 &&
		    errno != ENOTSUP)
			return -errno;
	}
	return 0;
}

static int ov_copy_meta(struct cb_overlay *ov, const char *path, const struct stat *st)
{
	char *src = NULL, *dst = NULL;
	struct timespec ts[2] = {st->st_atim, st->st_mtim};
	int r, sheld = -1, dheld = -1;

	uid_t uid = ov_id_store(ov, st->st_uid);
	gid_t gid = (gid_t)ov_id_store(ov, st->st_gid);

	if (ov_fchownat(ov->upper_fd, path, uid, gid, AT_SYMLINK_NOFOLLOW) < 0)
		return -errno;
	if (!S_ISLNK(st->st_mode) &&
	    ov_fchmodat(ov->upper_fd, path, ov_mode_allowed(ov, st->st_mode, uid, gid) & 07777, 0) <
		0)
		return -errno;
	if ((r = ov_proc_path(ov->base_fd, path, &src, &sheld)) < 0 ||
	    (r = ov_proc_path(ov->upper_fd, path, &dst, &dheld)) < 0)
		goto out;
	r = ov_copy_xattrs(ov, src, -1, dst);
	if (r < 0)
		goto out;
	if (ov_utimensat(ov->upper_fd, path, ts, AT_SYMLINK_NOFOLLOW) < 0)
		r = -errno;
out:
	ov_proc_path_free(src, sheld);
	ov_proc_path_free(dst, dheld);
	return r;
}

/* Copies the regular file at path (whose parent exists in upper) into upper atomically. */
static int ov_copy_file(struct cb_overlay *ov, const char *path, const struct stat *st,
			int with_data)
{
	char *dir, proc[64], *src = NULL;
	const char *slash = strrchr(path, '/');
	int in = -1, out = -1, r = 0, held = -1;
	struct timespec ts[2] = {st->st_atim, st->st_mtim};

	dir = slash ? strndup(path, (size_t)(slash - path)) : strdup(".");
	if (!dir)
		return -ENOMEM;
	out = ov_openat(ov->upper_fd, dir, O_TMPFILE | O_RDWR | O_CLOEXEC, st->st_mode & 07777);
	if (out < 0) {
		r = -errno;
		goto out;
	}
	if (with_data && st->st_size > 0) {
		in = ov_openat(ov->base_fd, path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC, 0);
		if (in < 0) {
			r = -errno;
			goto out;
		}
		r = ov_copy_data(in, out);
		if (r < 0)
			goto out;
	}
	uid_t uid = ov_id_store(ov, st->st_uid);
	gid_t gid = (gid_t)ov_id_store(ov, st->st_gid);
	if (fchown(out, uid, gid) < 0 ||
	    fchmod(out, ov_mode_allowed(ov, st->st_mode, uid, gid) & 07777) < 0) {
		r = -errno;
		goto out;
	}
	r = ov_proc_path(ov->base_fd, path, &src, &held);
	if (r < 0)
		goto out;
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", out);
	r = ov_copy_xattrs(ov, src, out, NULL);
	if (r < 0)
		goto out;
	if (futimens(out, ts) < 0 ||
	    ov_linkat(AT_FDCWD, proc, ov->upper_fd, path, AT_SYMLINK_FOLLOW) < 0)
		r = -errno;
out:
	ov_proc_path_free(src, held);
	free(dir);
	if (in >= 0)
		close(in);
	if (out >= 0)
		close(out);
	return r;
}

/* Creates in upper a copy of the non-directory, non-regular entry at path. */
static int ov_copy_special(struct cb_overlay *ov, const char *path, const struct stat *st)
{
	char target[PATH_MAX];
	ssize_t n;

	if (S_ISLNK(st->st_mode)) {
		n = ov_readlinkat(ov->base_fd, path, target, sizeof(target) - 1);
		if (n < 0)
			return -errno;
		target[n] = '\0';
		if (ov_symlinkat(target, ov->upper_fd, path) < 0)
			return -errno;
	} else if (ov_node_is_whiteout(st->st_mode, st->st_rdev)) {
		/* a base 0/0 device copied to upper would become a whiteout and hide itself */
		return cb_error_set(EPERM,
				    "copy-up %s: a 0/0 character device is a whiteout in "
				    "the upper layer",
				    path);
	} else if (ov_mknodat(ov->upper_fd, path, st->st_mode, st->st_rdev) < 0) {
		return -errno;
	}
	return ov_copy_meta(ov, path, st);
}

/* Copies one entry at path from base to upper (a directory without its contents). */
static int ov_copy_entry(struct cb_overlay *ov, const char *path, const struct stat *st,
			 int with_data)
{
	long long cost = S_ISREG(st->st_mode) && !with_data
			     ? 0
			     : (long long)ov_quota_cost(st->st_mode, st->st_size);
	int r = ov_quota_take(ov, cost, 1);

	if (r < 0)
		return cb_error_set(ENOSPC,
				    "copy-up %s: the workspace's disk quota has no room for its "
				    "%lld bytes",
				    path, cost);
	if (S_ISREG(st->st_mode)) {
		r = ov_copy_file(ov, path, st, with_data);
	} else if (S_ISDIR(st->st_mode)) {
		if (ov_mkdirat(ov->upper_fd, path, 0700) < 0)
			r = -errno;
		if (r == -EEXIST) { /* already there, and counted */
			ov_quota_give(ov, cost, 1);
			cost = -1;
			r = 0;
		}
		if (r == 0)
			r = ov_copy_meta(ov, path, st);
	} else {
		r = ov_copy_special(ov, path, st);
	}
	struct stat now;
	if (r < 0 && cost >= 0 && ov_lstat(ov->upper_fd, path, &now) < 0)
		ov_quota_give(ov, cost, 1); /* nothing was made */
	return r;
}

/* Switches in's identity to the upper file at path. Caller holds in->lock. */
static int ov_rehome(struct cb_overlay *ov, struct ov_inode *in, const char *path)
{
	struct stat st;
	int r;

	CB_ASSERT_HELD(&in->lock);
	r = ov_lstat(ov->upper_fd, path, &st);
	if (r < 0)
		return r;
	cb_mutex_lock(&ov->tab.lock);
	ov_table_remove(&ov->tab, in);
	in->dev = st.st_dev;
	in->rino = st.st_ino;
	if (!ov_table_find(&ov->tab, in->dev, in->rino))
		ov_table_insert(&ov->tab, in);
	cb_mutex_unlock(&ov->tab.lock);
	atomic_store(&in->layer, OV_UPPER);
	return 0;
}

/* Makes sure directory dir exists in upper (copying it and its parents up); caller holds ns
 * (read or write). Returns 0 or -errno with a message. */
int ov_ensure_upper_dir(struct cb_overlay *ov, struct ov_inode *dir)
{
	if (atomic_load(&dir->layer) == OV_UPPER)
		return 0;
	return ov_copy_up(ov, dir, 0);
}

/* Copies inode in up from the base (with its bytes when with_data), first its parent
 * directories; no-op if already in upper. Caller holds ns (read or write). 0 or -errno. */
int ov_copy_up(struct cb_overlay *ov, struct ov_inode *in, int with_data)
{
	char *path = NULL;
	struct stat st;
	int r;

	if (atomic_load(&in->layer) == OV_UPPER)
		return 0;
	if (!in->names || in->is_root)
		return cb_error_set(ESTALE, "copy-up of an unlinked or root inode");
	r = ov_ensure_upper_dir(ov, in->names->parent);
	if (r < 0)
		return r;
	cb_mutex_lock(&in->lock);
	if (atomic_load(&in->layer) == OV_UPPER)
		goto out;
	r = ov_path(&ov->tab, in, NULL, &path);
	if (r < 0)
		goto out;
	r = ov_lstat(ov->base_fd, path, &st);
	if (r < 0) {
		cb_error_set(-r, "copy-up %s: stat in base: %s", path, strerror(-r));
		goto out;
	}
	r = ov_copy_entry(ov, path, &st, with_data);
	if (r < 0) {
		cb_error_set(-r, "copy-up %s: %s", path, strerror(-r));
		goto out;
	}
	r = ov_rehome(ov, in, path);
out:
	cb_mutex_unlock(&in->lock);
	free(path);
	return r;
}

/* Copies the directory at path and everything under it that is visible from the base into
 * upper, moving known inodes to their upper identity. Caller holds ns write. */
static int ov_copy_tree_path(struct cb_overlay *ov, const char *path)
{
	char *child = NULL;
	int fd, r = 0;
	DIR *d;
	struct dirent *de;

	fd = ov_openat(ov->base_fd, path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC, 0);
	if (fd < 0)
		return errno == ENOENT || errno == ENOTDIR ? 0 : -errno;
	d = fdopendir(fd);
	if (!d) {
		close(fd);
		return -errno;
	}
	while ((de = readdir(d))) {
		struct stat bst, ust;
		struct ov_inode *in;

		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		free(child);
		if (asprintf(&child, "%s/%s", path, de->d_name) < 0) {
			child = NULL;
			r = -ENOMEM;
			break;
		}
		if (fstatat(fd, de->d_name, &bst, AT_SYMLINK_NOFOLLOW) < 0) {
			r = -errno;
			break;
		}
		if (ov_lstat(ov->upper_fd, child, &ust) == 0) {
			/* present in upper: a whiteout, a file that hides it, or a directory
			 * that merges with it unless opaque */
			if (S_ISDIR(ust.st_mode) && S_ISDIR(bst.st_mode) &&
			    !ov_is_opaque(ov->upper_fd, child))
				r = ov_copy_tree_path(ov, child);
		} else {
			r = ov_copy_entry(ov, child, &bst, 1);
			if (r == 0 && S_ISDIR(bst.st_mode))
				r = ov_copy_tree_path(ov, child);
			if (r == 0 && ov_lstat(ov->upper_fd, child, &ust) == 0) {
				cb_mutex_lock(&ov->tab.lock);
				in = ov_table_find(&ov->tab, bst.st_dev, bst.st_ino);
				if (in && atomic_load(&in->layer) == OV_BASE) {
					ov_table_remove(&ov->tab, in);
					in->dev = ust.st_dev;
					in->rino = ust.st_ino;
					ov_table_insert(&ov->tab, in);
					atomic_store(&in->layer, OV_UPPER);
				}
				cb_mutex_unlock(&ov->tab.lock);
			}
		}
		if (r < 0)
			break;
		if (S_ISDIR(bst.st_mode)) {
			cb_mutex_lock(&ov->tab.lock);
			in = ov_table_find(&ov->tab, ust.st_dev, ust.st_ino);
			if (in)
				in->merged = 0;
			cb_mutex_unlock(&ov->tab.lock);
		}
	}
	closedir(d);
	free(child);
	return r;
}

/* Copies directory dir and its whole visible subtree into upper and marks it opaque, so it
 * no longer depends on the base at its path and can be renamed. Caller holds ns write. */
int ov_copy_up_tree(struct cb_overlay *ov, struct ov_inode *dir)
{
	char *path = NULL;
	int r = ov_copy_up(ov, dir, 0);

	if (r < 0)
		return r;
	r = ov_path(&ov->tab, dir, NULL, &path);
	if (r < 0)
		return r;
	if (dir->merged) {
		r = ov_copy_tree_path(ov, path);
		if (r < 0) {
			r = cb_error_set(-r, "copy-up of directory %s: %s", path, strerror(-r));
			goto out;
		}
	}
	r = ov_set_opaque(ov->upper_fd, path);
	if (r < 0) {
		r = cb_error_set(-r, "mark %s opaque: %s", path, strerror(-r));
		goto out;
	}
	dir->merged = 0;
out:
	free(path);
	return r;
}

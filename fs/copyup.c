/* Copy-up: bringing a file or directory from the base into the upper layer before it is
 * changed, with its mode, owner, times and xattrs, atomically for files (O_TMPFILE + link). */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "ov.h"

/* Copies size bytes (what lstat said) from in to out. copy_file_range clones where the
 * filesystem can (XFS, btrfs: it tries remap_file_range first, as FICLONE would) and else
 * copies inside the kernel; bounded by the size, a small file is one call. Other
 * filesystem pairs fall back to read and write from where it stopped. */
static int ov_copy_data(int in, int out, off_t size)
{
	char buf[65536];
	off_t done = 0;
	ssize_t n;

	while (done < size) {
		n = copy_file_range(in, NULL, out, NULL,
				    (size_t)(size - done < (1 << 30) ? size - done : (1 << 30)), 0);
		if (n == 0)
			return 0; /* shorter than it was: what is there is copied */
		if (n < 0)
			break;
		done += n;
	}
	if (done >= size)
		return 0;
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

/* Copies the xattrs of the source (the fd srcfd, else the path src) to dstfd, else to the
 * path dst, skipping the overlay's own; ACLs get their ids shifted like the owner. *caps
 * (if given) says whether the source has security.capability: a copy-up answers the
 * kernel's question before each write with it. */
static int ov_copy_xattrs(struct cb_overlay *ov, int srcfd, const char *src, int dstfd,
			  const char *dst, int *caps)
{
	char list[8192], val[65536];
	ssize_t n = srcfd >= 0 ? flistxattr(srcfd, list, sizeof(list))
			       : llistxattr(src, list, sizeof(list)),
		v;
	char *name;

	if (caps)
		*caps = 0;
	if (n < 0)
		return errno == ENOTSUP ? 0 : -errno;
	for (name = list; name < list + n; name += strlen(name) + 1) {
		if (ov_name_is_private(name))
			continue;
		if (caps && strcmp(name, OV_CAPS_XATTR) == 0)
			*caps = 1;
		v = srcfd >= 0 ? fgetxattr(srcfd, name, val, sizeof(val))
			       : lgetxattr(src, name, val, sizeof(val));
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

/* The xattrs of the base entry at path (by a /proc name: path-only calls) onto dstfd or the
 * upper entry at path. */
static int ov_copy_xattrs_at(struct cb_overlay *ov, const char *path, int dstfd, int *caps)
{
	char *src = NULL, *dst = NULL;
	int r, sheld = -1, dheld = -1;

	if ((r = ov_proc_path(ov->base_fd, path, &src, &sheld)) < 0 ||
	    (dstfd < 0 && (r = ov_proc_path(ov->upper_fd, path, &dst, &dheld)) < 0))
		goto out;
	r = ov_copy_xattrs(ov, -1, src, dstfd, dst, caps);
out:
	ov_proc_path_free(src, sheld);
	ov_proc_path_free(dst, dheld);
	return r;
}

static int ov_copy_meta(struct cb_overlay *ov, const char *path, const struct stat *st)
{
	struct timespec ts[2] = {st->st_atim, st->st_mtim};
	int r;

	uid_t uid = ov_id_store(ov, st->st_uid);
	gid_t gid = (gid_t)ov_id_store(ov, st->st_gid);

	if (ov_fchownat(ov->upper_fd, path, uid, gid, AT_SYMLINK_NOFOLLOW) < 0)
		return -errno;
	if (!S_ISLNK(st->st_mode) &&
	    ov_fchmodat(ov->upper_fd, path, ov_mode_allowed(ov, st->st_mode, uid, gid) & 07777, 0) <
		0)
		return -errno;
	r = ov_copy_xattrs_at(ov, path, -1, NULL);
	if (r == 0 && ov_utimensat(ov->upper_fd, path, ts, AT_SYMLINK_NOFOLLOW) < 0)
		r = -errno;
	return r;
}

/* Set once linkat(AT_EMPTY_PATH) was refused (it needs CAP_DAC_READ_SEARCH): the /proc name
 * of the fd then, which costs a lookup in /proc more. Process-wide, as capabilities are. */
static _Atomic int ov_no_empty_path_link;

/* Links the O_TMPFILE fd at path in upper; -1 with errno. */
static int ov_link_tmpfile(struct cb_overlay *ov, int fd, const char *path)
{
	char proc[64];
	const char *rest;
	int nfd, r, tried = 0;

	if (!atomic_load(&ov_no_empty_path_link)) {
		nfd = ov_near(ov->upper_fd, path, &rest);
		if (nfd == -1)
			return -1;
		r = linkat(fd, "", nfd, rest, AT_EMPTY_PATH);
		ov_near_put(ov->upper_fd, nfd);
		if (r == 0 || (errno != ENOENT && errno != EPERM))
			return r;
		tried = 1;
	}
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
	r = ov_linkat(AT_FDCWD, proc, ov->upper_fd, path, AT_SYMLINK_FOLLOW);
	/* ENOENT is also what a missing parent says: only a /proc link that works shows that
	 * the capability was missing */
	if (r == 0 && tried)
		atomic_store(&ov_no_empty_path_link, 1);
	return r;
}

/* What a copy-up made: the new upper entry's identity, whether it has file capabilities,
 * and (regular files, when want_fd) its O_RDWR fd, handed to the caller (else -1). */
struct ov_made {
	struct stat st;
	int caps;
	int want_fd;
	int fd;
};

/* Copies the regular file at path (whose parent exists in upper) into upper atomically: an
 * O_TMPFILE in the parent gets the bytes and metadata and is linked at path once complete,
 * so a crash leaves nothing half-copied visible. The base file is read through one fd
 * (bytes and xattrs), the new one written through another (no path walk per call). With
 * made->want_fd, the new file's fd is handed over in made->fd instead of closed. */
static int ov_copy_file(struct cb_overlay *ov, const char *path, const struct stat *st,
			int with_data, struct ov_made *made)
{
	char *dir;
	const char *slash = strrchr(path, '/');
	int in = -1, out = -1, r = 0;
	struct timespec ts[2] = {st->st_atim, st->st_mtim};

	made->fd = -1;
	dir = slash ? strndup(path, (size_t)(slash - path)) : strdup(".");
	if (!dir)
		return -ENOMEM;
	out = ov_openat(ov->upper_fd, dir, O_TMPFILE | O_RDWR | O_CLOEXEC, st->st_mode & 07777);
	if (out < 0) {
		r = -errno;
		goto out;
	}
	/* O_NOATIME: reading the base to copy it leaves the base as it was (a daemon that is
	 * neither root nor the owner may not ask). O_NONBLOCK: the base is not the sandbox's to
	 * change, but a fifo in its place must not hang us. */
	in = ov_openat(ov->base_fd, path,
		       O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOATIME, 0);
	if (in < 0 && errno == EPERM)
		in =
		    ov_openat(ov->base_fd, path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0);
	if (in < 0 && with_data && st->st_size > 0) {
		r = -errno;
		goto out;
	}
	if (in >= 0 && with_data && st->st_size > 0) {
		r = ov_copy_data(in, out, st->st_size);
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
	/* an unreadable empty file (a daemon without CAP_DAC_OVERRIDE) still has its xattrs */
	r = in >= 0 ? ov_copy_xattrs(ov, in, NULL, out, NULL, &made->caps)
		    : ov_copy_xattrs_at(ov, path, out, &made->caps);
	if (r < 0)
		goto out;
	if (futimens(out, ts) < 0 || fstat(out, &made->st) < 0 ||
	    ov_link_tmpfile(ov, out, path) < 0) {
		r = -errno;
		goto out;
	}
	if (made->want_fd) {
		made->fd = out;
		out = -1;
	}
out:
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

/* Copies one entry at path from base to upper (a directory without its contents), and says
 * in made what it made (made->fd: as ov_copy_file). */
static int ov_copy_entry(struct cb_overlay *ov, const char *path, const struct stat *st,
			 int with_data, struct ov_made *made)
{
	/* The base entry's xattrs are copied with it: they count from now on, as the next
	 * mount's walk of upper/ would count them. */
	long long cost = (S_ISREG(st->st_mode) && !with_data
			      ? 0
			      : (long long)ov_quota_cost(st->st_mode, st->st_size)) +
			 ov_quota_xattr_copied(ov, path, st);
	int r = ov_quota_take(ov, cost, 1);
	struct stat now;

	made->caps = 0;
	if (r < 0)
		return cb_error_set(ENOSPC,
				    "copy-up %s: the workspace's disk quota has no room for its "
				    "%lld bytes",
				    path, cost);
	if (S_ISREG(st->st_mode)) {
		r = ov_copy_file(ov, path, st, with_data, made);
	} else {
		made->fd = -1;
		if (S_ISDIR(st->st_mode)) {
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
		if (r == 0)
			r = ov_lstat(ov->upper_fd, path, &made->st);
	}
	if (r < 0 && cost >= 0 && ov_lstat(ov->upper_fd, path, &now) < 0)
		ov_quota_give(ov, cost, 1); /* nothing was made */
	return r;
}

/* Switches in's identity to st, the upper entry made for it. Caller holds in->lock. */
static void ov_rehome(struct cb_overlay *ov, struct ov_inode *in, const struct stat *st)
{
	CB_ASSERT_HELD(&in->lock);
	cb_mutex_lock(&ov->tab.lock);
	ov_table_remove(&ov->tab, in);
	in->dev = st->st_dev;
	in->rino = st->st_ino;
	if (!ov_table_find(&ov->tab, in->dev, in->rino))
		ov_table_insert(&ov->tab, in);
	cb_mutex_unlock(&ov->tab.lock);
	atomic_store(&in->layer, OV_UPPER);
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
	return ov_copy_up_open(ov, in, with_data, NULL);
}

/* A base file with several names the mount has looked up is one inode to the kernel, and its
 * copy is made at the first name's path: the copy is linked at the other names too, or a
 * write through one name would land under another (the rest keep the base's file, as
 * overlayfs without an index). The paths of names 2.. in *others (malloc'd), their
 * directories made in upper. Caller holds ns (either side), not in->lock. */
static int ov_copy_up_names(struct cb_overlay *ov, struct ov_inode *in, char ***others, size_t *n)
{
	struct ov_inode *parents[64];
	struct ov_name *nm;
	size_t count = 0;
	int r = 0;

	*others = NULL;
	*n = 0;
	if (in->type != S_IFREG || atomic_load(&in->layer) == OV_UPPER)
		return 0;
	cb_mutex_lock(&ov->tab.lock);
	for (nm = in->names ? in->names->next : NULL; nm; nm = nm->next)
		count++;
	if (count > sizeof(parents) / sizeof(parents[0]))
		count = sizeof(parents) / sizeof(parents[0]); /* the rest keep the base's */
	if (count && !(*others = calloc(count, sizeof(**others))))
		r = -ENOMEM;
	for (nm = in->names ? in->names->next : NULL; nm && !r && *n < count; nm = nm->next) {
		int len = ov_path_of_name(&ov->tab, nm, &(*others)[*n]);

		if (len == -ENOENT)
			continue;
		r = len < 0 ? len : 0;
		if (!r)
			parents[(*n)++] = nm->parent;
	}
	cb_mutex_unlock(&ov->tab.lock);
	/* names are removed only under ns write, so the parents stay */
	for (size_t i = 0; i < *n && !r; i++)
		r = ov_ensure_upper_dir(ov, parents[i]);
	return r;
}

/* Links the upper copy at path under the other names' paths (ov_copy_up_names) and records
 * them all for the journal (cb_links_names). A name that cannot be linked keeps the base's
 * file. */
static void ov_copy_up_link(struct cb_overlay *ov, struct ov_inode *in, const char *path,
			    const struct stat *made, char **others, size_t n)
{
	unsigned linked = 1;

	for (size_t i = 0; i < n; i++) {
		/* on record before the name exists, or later marks would miss it */
		if (ov->db && ((i == 0 && cb_links_add(ov->db, made->st_ino, path) < 0) ||
			       cb_links_add(ov->db, made->st_ino, others[i]) < 0)) {
			fprintf(stderr, "cowbox fs: copy-up of %s: %s\n", path, cb_error_message());
			break;
		}
		if (ov_linkat(ov->upper_fd, path, ov->upper_fd, others[i], 0) < 0)
			fprintf(stderr, "cowbox fs: copy-up of %s: its link %s: %s\n", path,
				others[i], strerror(errno));
		else
			linked++;
	}
	atomic_store(&in->nlink, linked);
}

/* See ov.h. A regular file's copy-up also says whether it has file capabilities (no_caps),
 * so the kernel's question before every write costs no syscall from the first. */
int ov_copy_up_open(struct cb_overlay *ov, struct ov_inode *in, int with_data, int *fdp)
{
	struct ov_made made = {.want_fd = fdp != NULL, .fd = -1};
	char *path = NULL, **others = NULL;
	size_t nothers = 0;
	struct stat st;
	int r;

	if (fdp)
		*fdp = -1;
	if (atomic_load(&in->layer) == OV_UPPER)
		return 0;
	if (!in->names || in->is_root)
		return cb_error_set(ESTALE, "copy-up of an unlinked or root inode");
	r = ov_ensure_upper_dir(ov, in->names->parent);
	if (r == 0)
		r = ov_copy_up_names(ov, in, &others, &nothers);
	if (r < 0)
		goto out_names;
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
	r = ov_copy_entry(ov, path, &st, with_data, &made);
	if (r < 0) {
		cb_error_set(-r, "copy-up %s: %s", path, strerror(-r));
		goto out;
	}
	if (S_ISREG(st.st_mode))
		atomic_store(&in->no_caps, !made.caps);
	if (S_ISREG(st.st_mode) && nothers)
		ov_copy_up_link(ov, in, path, &made.st, others, nothers);
	ov_rehome(ov, in, &made.st);
	if (fdp) {
		*fdp = made.fd;
		made.fd = -1;
	}
out:
	cb_mutex_unlock(&in->lock);
	if (made.fd >= 0)
		close(made.fd);
	free(path);
out_names:
	for (size_t i = 0; i < nothers; i++)
		free(others[i]);
	free(others);
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
			struct ov_made made = {.fd = -1};

			r = ov_copy_entry(ov, child, &bst, 1, &made);
			ust = made.st;
			if (r == 0 && S_ISDIR(bst.st_mode))
				r = ov_copy_tree_path(ov, child);
			if (r == 0) {
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

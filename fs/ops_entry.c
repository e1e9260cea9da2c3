/* FUSE operations on names and attributes: lookup (upper, then base, hiding whiteouts),
 * forget, getattr, setattr (with copy-up), readlink and statfs. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "ov.h"

/* The inode behind a kernel node id (node ids are inode addresses, the root is 1). */
struct ov_inode *ov_inode_get(struct cb_overlay *ov, fuse_ino_t ino)
{
	return ino == FUSE_ROOT_ID ? ov->root : (struct ov_inode *)(uintptr_t)ino;
}

/* The root fd of a layer. */
int ov_layer_fd(struct cb_overlay *ov, int layer)
{
	return layer == OV_UPPER ? ov->upper_fd : ov->base_fd;
}

/* Where parent's child at path is: its stat, the layer that shows it and whether it is a
 * directory merging with the base's; -ENOENT when the mount shows nothing there. */
static int ov_lookup_at(struct cb_overlay *ov, struct ov_inode *parent, const char *path,
			struct stat *st, int *layerp, int *mergedp)
{
	struct stat bst;
	int r, layer = -1, merged = 0;

	if (atomic_load(&parent->layer) == OV_UPPER) {
		r = ov_lstat(ov->upper_fd, path, st);
		if (r == 0) {
			if (ov_is_whiteout(st))
				return -ENOENT;
			layer = OV_UPPER;
			if (S_ISDIR(st->st_mode) && parent->merged &&
			    ov_lstat(ov->base_fd, path, &bst) == 0 && S_ISDIR(bst.st_mode) &&
			    !ov_is_opaque(ov->upper_fd, path))
				merged = 1;
		} else if (r != -ENOENT && r != -ENOTDIR) {
			return r;
		}
	}
	if (layer < 0) {
		if (!parent->merged)
			return -ENOENT;
		r = ov_lstat(ov->base_fd, path, st);
		if (r < 0)
			return r == -ENOTDIR ? -ENOENT : r;
		layer = OV_BASE;
		merged = S_ISDIR(st->st_mode);
	}
	*layerp = layer;
	*mergedp = merged;
	return 0;
}

/* See ov.h: parent/name, found in layer with stat st, as an entry with one more kernel
 * reference. */
int ov_child_found(struct cb_overlay *ov, struct ov_inode *parent, const char *name,
		   struct stat *st, int layer, int merged, struct fuse_entry_param *e)
{
	struct ov_inode *in;

	memset(e, 0, sizeof(*e));
	e->attr_timeout = e->entry_timeout = ov_entry_timeout(ov);
	cb_mutex_lock(&ov->tab.lock);
	in = ov_table_find(&ov->tab, st->st_dev, st->st_ino);
	if (!in) {
		in = ov_inode_new(layer, st);
		if (!in || ov_inode_add_name(&ov->tab, in, parent, name) < 0) {
			free(in);
			cb_mutex_unlock(&ov->tab.lock);
			return -ENOMEM;
		}
		in->merged = merged;
		ov_table_insert(&ov->tab, in);
		ov_table_track(&ov->tab, in);
	} else if (!ov_inode_has_name(&ov->tab, in, parent, name)) {
		if (ov_inode_add_name(&ov->tab, in, parent, name) < 0) {
			cb_mutex_unlock(&ov->tab.lock);
			return -ENOMEM;
		}
	}
	in->nlookup++;
	cb_mutex_unlock(&ov->tab.lock);
	atomic_store(&in->nlink, layer == OV_UPPER && S_ISREG(st->st_mode) ? st->st_nlink : 1);
	st->st_ino = in->st_ino;
	ov_ids_present(ov, st);
	e->attr = *st;
	e->ino = (fuse_ino_t)(uintptr_t)in;
	return 0;
}

/* Finds parent/name in upper then base, and returns its inode with one more kernel
 * reference in e (e->ino 0 and -ENOENT when it does not exist). Caller holds ns read. */
int ov_lookup_child(struct cb_overlay *ov, struct ov_inode *parent, const char *name,
		    struct fuse_entry_param *e)
{
	char *path;
	struct stat st;
	int r, layer = -1, merged = 0;

	memset(e, 0, sizeof(*e));
	e->attr_timeout = e->entry_timeout = ov_entry_timeout(ov);
	r = ov_path(&ov->tab, parent, name, &path);
	if (r < 0)
		return r;
	r = ov_lookup_at(ov, parent, path, &st, &layer, &merged);
	free(path);
	if (r < 0)
		return r;
	return ov_child_found(ov, parent, name, &st, layer, merged, e);
}

/* Drops n kernel references to in, freeing it when nothing refers to it any more. */
void ov_forget_one(struct cb_overlay *ov, struct ov_inode *in, uint64_t n)
{
	cb_mutex_lock(&ov->tab.lock);
	in->nlookup = in->nlookup > n ? in->nlookup - n : 0;
	ov_inode_release(&ov->tab, in);
	cb_mutex_unlock(&ov->tab.lock);
}

/* The stat of in as the mount shows it. Caller holds ns read. */
int ov_stat_inode(struct cb_overlay *ov, struct ov_inode *in, struct stat *st)
{
	char *path;
	int r;

	if (in->keep_fd >= 0) {
		if (fstatat(in->keep_fd, "", st, AT_EMPTY_PATH) < 0)
			return -errno;
	} else {
		r = ov_path(&ov->tab, in, NULL, &path);
		if (r < 0)
			return r;
		r = ov_lstat(ov_layer_fd(ov, atomic_load(&in->layer)), path, st);
		free(path);
		if (r < 0)
			return r;
	}
	st->st_ino = in->st_ino;
	ov_ids_present(ov, st);
	return 0;
}

/* LOOKUP: parent/name's inode with one more kernel reference, or a negative entry the kernel
 * may cache (we are the tree's only writer). */
void ov_op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct cb_overlay *ov = ov_of(req);
	struct fuse_entry_param e;
	int r;

	cb_rwlock_read(&ov->tab.ns);
	r = ov_lookup_child(ov, ov_inode_get(ov, parent), name, &e);
	cb_rwlock_unlock(&ov->tab.ns);
	if (r == -ENOENT) {
		/* a negative entry: we are the only writer, so the kernel may cache it */
		e.ino = 0;
		fuse_reply_entry(req, &e);
		return;
	}
	if (r < 0)
		fuse_reply_err(req, -r);
	else
		fuse_reply_entry(req, &e);
}

/* FORGET: the kernel dropped nlookup references; an inode nothing refers to is freed. */
void ov_op_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
	struct cb_overlay *ov = ov_of(req);

	ov_forget_one(ov, ov_inode_get(ov, ino), nlookup);
	fuse_reply_none(req);
}

/* BATCH_FORGET: FORGET for many inodes in one request. */
void ov_op_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *forgets)
{
	struct cb_overlay *ov = ov_of(req);
	size_t i;

	for (i = 0; i < count; i++)
		ov_forget_one(ov, ov_inode_get(ov, forgets[i].ino), forgets[i].nlookup);
	fuse_reply_none(req);
}

/* GETATTR: the inode's stat as the mount shows it (ids shifted, the origin's inode number). */
void ov_op_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct cb_overlay *ov = ov_of(req);
	struct stat st;
	int r;

	(void)fi;
	cb_rwlock_read(&ov->tab.ns);
	r = ov_stat_inode(ov, ov_inode_get(ov, ino), &st);
	cb_rwlock_unlock(&ov->tab.ns);
	if (r < 0)
		fuse_reply_err(req, -r);
	else
		fuse_reply_attr(req, &st, OV_TIMEOUT);
}

/* Where to apply a path-based change to in: (dirfd, path, flags). */
static int ov_target(struct cb_overlay *ov, struct ov_inode *in, char **path, int *dirfd,
		     int *nofollow)
{
	if (in->keep_fd >= 0) {
		*dirfd = AT_FDCWD;
		*nofollow = 0;
		if (asprintf(path, "/proc/self/fd/%d", in->keep_fd) < 0) {
			*path = NULL;
			return -ENOMEM;
		}
		return 0;
	}
	*dirfd = ov->upper_fd;
	*nofollow = AT_SYMLINK_NOFOLLOW;
	return ov_path(&ov->tab, in, NULL, path);
}

static int ov_apply_setattr_at(struct cb_overlay *ov, struct ov_inode *in, struct stat *attr,
			       int to_set, struct fuse_file_info *fi, int dirfd, const char *path,
			       int nofollow)
{
	struct ov_file *f = fi ? (struct ov_file *)(uintptr_t)fi->fh : NULL;
	int r;

	if (to_set & (FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID)) {
		uid_t uid = (to_set & FUSE_SET_ATTR_UID) ? attr->st_uid : (uid_t)-1;
		gid_t gid = (to_set & FUSE_SET_ATTR_GID) ? attr->st_gid : (gid_t)-1;
		if (ov_fchownat(dirfd, path, ov_uid_disk(ov, uid), ov_gid_disk(ov, gid), nofollow) <
		    0)
			return -errno;
	}
	if (to_set & FUSE_SET_ATTR_MODE) {
		mode_t mode = attr->st_mode & 07777;
		struct stat cur;
		if (ov->id_base && (mode & 06000)) {
			if (ov_fstatat(dirfd, path, &cur, nofollow) < 0)
				return -errno;
			mode = ov_mode_allowed(ov, (cur.st_mode & S_IFMT) | mode, cur.st_uid,
					       cur.st_gid) &
			       07777;
		}
		if (ov_fchmodat(dirfd, path, mode, 0) < 0)
			return -errno;
	}
	if (to_set & FUSE_SET_ATTR_SIZE) {
		int fd = -1;
		struct ov_quota_resize q;

		if (!(f && atomic_load(&f->layer) == OV_UPPER && ov_file_writable(f)) &&
		    (fd = ov_openat(dirfd, path, O_WRONLY | (nofollow ? O_NOFOLLOW : 0) | O_CLOEXEC,
				    0)) < 0)
			return -errno;
		/* a sparse file costs its length: growing it is checked like a write */
		r = ov_quota_resize_begin(ov, in, fd >= 0 ? fd : f->fd, attr->st_size, &q);
		if (r == 0 && ftruncate(fd >= 0 ? fd : f->fd, attr->st_size) < 0)
			r = -errno;
		ov_quota_resize_end(ov, &q);
		if (fd >= 0)
			close(fd);
		if (r < 0)
			return r;
	}
	if (to_set & (FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_MTIME | FUSE_SET_ATTR_CTIME)) {
		struct timespec ts[2] = {{.tv_nsec = UTIME_OMIT}, {.tv_nsec = UTIME_OMIT}};
		if (to_set & FUSE_SET_ATTR_ATIME_NOW)
			ts[0].tv_nsec = UTIME_NOW;
		else if (to_set & FUSE_SET_ATTR_ATIME)
			ts[0] = attr->st_atim;
		if (to_set & FUSE_SET_ATTR_MTIME_NOW)
			ts[1].tv_nsec = UTIME_NOW;
		else if (to_set & FUSE_SET_ATTR_MTIME)
			ts[1] = attr->st_mtim;
		if ((to_set & (FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_MTIME)) &&
		    ov_utimensat(dirfd, path, ts, nofollow) < 0)
			return -errno;
	}
	return 0;
}

static int ov_apply_setattr(struct cb_overlay *ov, struct ov_inode *in, struct stat *attr,
			    int to_set, struct fuse_file_info *fi)
{
	char *path;
	int dirfd, nofollow, r;

	r = ov_target(ov, in, &path, &dirfd, &nofollow);
	if (r < 0)
		return r;
	r = ov_apply_setattr_at(ov, in, attr, to_set, fi, dirfd, path, nofollow);
	free(path);
	return r;
}

/* SETATTR: chmod, chown, truncate, utimes: copies up and marks before it changes anything. */
void ov_op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
		   struct fuse_file_info *fi)
{
	struct cb_overlay *ov = ov_of(req);
	struct ov_inode *in = ov_inode_get(ov, ino);
	struct stat st;
	int r, content = (to_set & FUSE_SET_ATTR_SIZE) != 0;
	int meta = (to_set & ~(FUSE_SET_ATTR_SIZE | FUSE_SET_ATTR_CTIME)) != 0;

	cb_rwlock_read(&ov->tab.ns);
	r = ov_copy_up(ov, in, !(content && attr->st_size == 0));
	if (r == 0 && content)
		r = ov_mark_inode(ov, req, in, CB_CHANGE_WRITE);
	if (r == 0 && meta)
		r = ov_mark_inode(ov, req, in, CB_CHANGE_META);
	if (r == 0)
		r = ov_apply_setattr(ov, in, attr, to_set, fi);
	if (r == 0)
		r = ov_stat_inode(ov, in, &st);
	cb_rwlock_unlock(&ov->tab.ns);
	if (r < 0)
		fuse_reply_err(req, -r);
	else
		fuse_reply_attr(req, &st, OV_TIMEOUT);
}

/* READLINK: a symlink's target, from whichever layer holds it. */
void ov_op_readlink(fuse_req_t req, fuse_ino_t ino)
{
	struct cb_overlay *ov = ov_of(req);
	struct ov_inode *in = ov_inode_get(ov, ino);
	char *path = NULL, target[PATH_MAX];
	ssize_t n;
	int r;

	cb_rwlock_read(&ov->tab.ns);
	if (in->keep_fd >= 0)
		n = readlinkat(in->keep_fd, "", target, sizeof(target) - 1);
	else if ((r = ov_path(&ov->tab, in, NULL, &path)) < 0)
		n = r, errno = -r;
	else
		n = ov_readlinkat(ov_layer_fd(ov, atomic_load(&in->layer)), path, target,
				  sizeof(target) - 1);
	cb_rwlock_unlock(&ov->tab.ns);
	free(path);
	if (n < 0) {
		fuse_reply_err(req, errno);
		return;
	}
	target[n] = '\0';
	fuse_reply_readlink(req, target);
}

/* STATFS: the upper layer's filesystem, where every change lands. */
void ov_op_statfs(fuse_req_t req, fuse_ino_t ino)
{
	struct cb_overlay *ov = ov_of(req);
	struct statvfs sv;

	(void)ino;
	if (fstatvfs(ov->upper_fd, &sv) < 0)
		fuse_reply_err(req, errno);
	else
		fuse_reply_statfs(req, &sv);
}

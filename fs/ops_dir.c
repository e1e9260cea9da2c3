/* FUSE operations that change names: create, mkdir, mknod, symlink, link, unlink, rmdir and
 * rename, with whiteouts where a base entry must disappear and journal marks before each. */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "ov.h"

/* Gets parent ready for a new upper entry parent/name (it is copied up); *path is the entry's
 * path (malloc'd, also on an error after it was made: the caller frees it). Caller holds ns. */
static int ov_prepare_new(struct cb_overlay *ov, struct ov_inode *parent, const char *name,
			  char **path)
{
	int r = ov_ensure_upper_dir(ov, parent);

	if (r < 0)
		return r;
	r = ov_path(&ov->tab, parent, name, path);
	return r < 0 ? r : 0;
}

/* Removes the whiteout at path in upper, if one is there: 1 if one was, 0 if not, or -errno.
 * A creation asks only after its call failed with EEXIST: the kernel creates only names the
 * mount does not show, so a whiteout is the one thing upper can have there, and most new
 * names are in no layer (untar: a stat per entry saved). */
static int ov_clear_whiteout(struct cb_overlay *ov, const char *path)
{
	struct stat st;

	if (ov_lstat(ov->upper_fd, path, &st) < 0 || !ov_is_whiteout(&st))
		return 0;
	return ov_unlinkat(ov->upper_fd, path, 0) < 0 ? -errno : 1;
}

/* Gives a new upper entry the caller's owner and the exact mode it asked for; *st is its stat
 * afterwards (from fd when there is one: no second walk of the path). */
static int ov_finish_new(struct cb_overlay *ov, fuse_req_t req, const char *path, mode_t mode,
			 int fd, struct stat *st)
{
	const struct fuse_ctx *ctx = fuse_req_ctx(req);
	uid_t uid = ov_uid_disk(ov, ctx->uid);
	gid_t gid = ov_gid_disk(ov, ctx->gid), set_gid = gid;
	int changed = 0,
	    r = fd >= 0 ? (fstat(fd, st) < 0 ? -errno : 0) : ov_lstat(ov->upper_fd, path, st);

	if (r < 0)
		return r;
	if (st->st_gid != getegid()) {
		gid = st->st_gid; /* inherited from a setgid directory */
		set_gid = (gid_t)-1;
	}
	if (uid != st->st_uid || (set_gid != (gid_t)-1 && set_gid != st->st_gid)) {
		if (ov_fchownat(ov->upper_fd, path, uid, set_gid, AT_SYMLINK_NOFOLLOW) < 0)
			return -errno;
		changed = 1;
	}
	mode_t want = ov_mode_allowed(ov, mode, uid, gid);
	/* chown dropped any set-id bits the creation kept; the umask may have cut others */
	if (!S_ISLNK(mode) && ((mode & ov->umask & 07777) || (want & 06000) || want != mode)) {
		if (fd >= 0 ? fchmod(fd, want & 07777)
			    : ov_fchmodat(ov->upper_fd, path, want & 07777, 0))
			return -errno;
		changed = 1;
	}
	if (!changed)
		return 0;
	return fd >= 0 ? (fstat(fd, st) < 0 ? -errno : 0) : ov_lstat(ov->upper_fd, path, st);
}

/* Journals a new entry and makes its inode clean for the rest of the turn. */
static void ov_new_inode_clean(struct cb_overlay *ov, fuse_ino_t ino)
{
	struct ov_inode *in = ov_inode_get(ov, ino);
	uint64_t g = atomic_load(&ov->gen);

	atomic_store(&in->write_gen, g);
	atomic_store(&in->meta_gen, g);
}

static int ov_make_at(struct cb_overlay *ov, const char *path, mode_t mode, dev_t rdev,
		      const char *link_target)
{
	int r;

	if (link_target)
		r = ov_symlinkat(link_target, ov->upper_fd, path);
	else if (S_ISDIR(mode))
		r = ov_mkdirat(ov->upper_fd, path, mode & 07777);
	else
		r = ov_mknodat(ov->upper_fd, path, mode, rdev);
	return r < 0 ? -errno : 0;
}

static void ov_make_node(fuse_req_t req, fuse_ino_t parent_ino, const char *name, mode_t mode,
			 dev_t rdev, const char *link_target)
{
	struct cb_overlay *ov = ov_of(req);
	struct ov_inode *parent = ov_inode_get(ov, parent_ino);
	struct fuse_entry_param e;
	struct stat st;
	char *path = NULL;
	int r, had_whiteout = 0;

	/* A 0/0 character device is what a whiteout is on disk: made in upper it would hide its
	 * own name (and what base has there) for good. Kernel overlayfs refuses it the same way,
	 * before anything is copied up, journaled or created. */
	if (!link_target && ov_node_is_whiteout(mode, rdev)) {
		fuse_reply_err(req, EPERM);
		return;
	}
	cb_rwlock_read(&ov->tab.ns);
	r = ov_prepare_new(ov, parent, name, &path);
	if (r == 0)
		r = ov_quota_take(ov, (long long)ov_quota_cost(mode, 0), 1);
	if (r == 0 && (r = ov_mark_child(ov, req, parent, name, CB_CHANGE_CREATE, 0)) < 0)
		ov_quota_give(ov, (long long)ov_quota_cost(mode, 0), 1);
	if (r < 0)
		goto out;
	r = ov_make_at(ov, path, mode, rdev, link_target);
	if (r == -EEXIST && (had_whiteout = ov_clear_whiteout(ov, path)) != 0)
		r = had_whiteout < 0 ? had_whiteout : ov_make_at(ov, path, mode, rdev, link_target);
	if (r < 0) {
		ov_quota_give(ov, (long long)ov_quota_cost(mode, 0), 1);
		goto out;
	}
	/* a directory made where a base entry was deleted must not show the base's contents */
	if (S_ISDIR(mode) && had_whiteout > 0)
		r = ov_set_opaque(ov->upper_fd, path);
	if (r == 0)
		r = ov_finish_new(ov, req, path, link_target ? S_IFLNK : mode, -1, &st);
	if (r == 0)
		r = ov_child_found(ov, parent, name, &st, OV_UPPER, 0, &e);
	if (r == 0) {
		ov_inode_get(ov, e.ino)->merged = 0;
		ov_new_inode_clean(ov, e.ino);
	}
out:
	cb_rwlock_unlock(&ov->tab.ns);
	free(path);
	if (r < 0)
		fuse_reply_err(req, -r);
	else
		fuse_reply_entry(req, &e);
}

/* MKDIR: a new directory in upper (opaque when it replaces a whiteout). */
void ov_op_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode)
{
	ov_make_node(req, parent, name, S_IFDIR | (mode & 07777), 0, NULL);
}

/* MKNOD: a new node in upper; a 0/0 character device is refused (it is a whiteout). */
void ov_op_mknod(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, dev_t rdev)
{
	ov_make_node(req, parent, name, mode, rdev, NULL);
}

/* SYMLINK: a new symlink in upper. */
void ov_op_symlink(fuse_req_t req, const char *link, fuse_ino_t parent, const char *name)
{
	ov_make_node(req, parent, name, S_IFLNK | 0777, 0, link);
}

/* The open flags for a file of this mount: the writeback cache needs read access on writable
 * files and does O_APPEND itself. */
int ov_open_flags(int flags)
{
	flags &= ~(O_CREAT | O_EXCL | O_NOCTTY | O_DIRECT);
	if ((flags & O_ACCMODE) == O_WRONLY)
		flags = (flags & ~O_ACCMODE) | O_RDWR;
	return (flags & ~O_APPEND) | O_CLOEXEC | O_NOFOLLOW;
}

/* CREATE: a new regular file in upper, opened; the kernel sends this for open(O_CREAT) of a
 * missing name. */
void ov_op_create(fuse_req_t req, fuse_ino_t parent_ino, const char *name, mode_t mode,
		  struct fuse_file_info *fi)
{
	struct cb_overlay *ov = ov_of(req);
	struct ov_inode *parent = ov_inode_get(ov, parent_ino);
	struct fuse_entry_param e;
	struct ov_file *f = NULL;
	struct stat st;
	char *path = NULL;
	int r, fd = -1, made;

	cb_rwlock_read(&ov->tab.ns);
	r = ov_prepare_new(ov, parent, name, &path);
	if (r == 0)
		r = ov_quota_take(ov, 0, 1);
	if (r == 0 && (r = ov_mark_child(ov, req, parent, name, CB_CHANGE_CREATE, 0)) < 0)
		ov_quota_give(ov, 0, 1);
	if (r < 0)
		goto out;
	fd = ov_openat(ov->upper_fd, path, ov_open_flags(fi->flags) | O_CREAT | O_EXCL,
		       mode & 07777);
	made = fd >= 0;
	/* something there (ov_clear_whiteout): a whiteout goes, anything else is opened as
	 * open(O_CREAT) would */
	if (fd < 0 && errno == EEXIST && (r = ov_clear_whiteout(ov, path)) >= 0)
		fd =
		    ov_openat(ov->upper_fd, path, ov_open_flags(fi->flags) | O_CREAT, mode & 07777);
	if (fd < 0) {
		r = r < 0 ? r : -errno;
		ov_quota_give(ov, 0, 1);
		goto out;
	}
	r = ov_finish_new(ov, req, path, mode, fd, &st);
	if (r == 0)
		r = ov_child_found(ov, parent, name, &st, OV_UPPER, 0, &e);
	if (r < 0)
		goto out;
	ov_new_inode_clean(ov, e.ino);
	/* a file this call made has no file capabilities, which the kernel asks about (GETXATTR
	 * security.capability) at its first write and again after tar's chown */
	if (made)
		atomic_store(&ov_inode_get(ov, e.ino)->no_caps, 1);
	f = calloc(1, sizeof(*f));
	if (!f) {
		ov_forget_one(ov, ov_inode_get(ov, e.ino), 1);
		r = -ENOMEM;
		goto out;
	}
	f->fd = fd;
	atomic_init(&f->layer, OV_UPPER);
	f->flags = ov_open_flags(fi->flags);
	f->inode = ov_inode_get(ov, e.ino);
	f->overlay = ov;
	ov_file_choose_mode(req, f, fi);
	ov_handle_add(ov, &f->h, ov_file_free);
	fd = -1;
	fi->fh = (uint64_t)(uintptr_t)f;
	if (f->mode == OV_OPEN_CACHED && ov_space_low(ov))
		fi->direct_io = 1; /* see ov_op_open: ENOSPC at write(2) on a nearly full disk */
out:
	cb_rwlock_unlock(&ov->tab.ns);
	free(path);
	if (fd >= 0)
		close(fd);
	if (r < 0)
		fuse_reply_err(req, -r);
	else if (fuse_reply_create(req, &e, fi) == -ENOENT) {
		ov_file_drop_mode(req, f);
		ov_file_free(&f->h);
		ov_forget_one(ov, ov_inode_get(ov, e.ino), 1);
	}
}

/* LINK: a new name for an inode, copied up first (a hard link lives in one layer). */
void ov_op_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent_ino, const char *newname)
{
	struct cb_overlay *ov = ov_of(req);
	struct ov_inode *in = ov_inode_get(ov, ino), *parent = ov_inode_get(ov, newparent_ino);
	struct fuse_entry_param e;
	char *path = NULL, *oldpath = NULL;
	int r;

	cb_rwlock_read(&ov->tab.ns);
	r = ov_copy_up(ov, in, 1);
	if (r == 0)
		r = ov_prepare_new(ov, parent, newname, &path);
	if (r == 0)
		r = ov_path(&ov->tab, in, NULL, &oldpath);
	if (r >= 0)
		r = ov_mark_child(ov, req, parent, newname, CB_CHANGE_CREATE, 0);
	/* both names on record before the link exists (see cb_links_names) */
	if (r >= 0 && ov->db &&
	    (cb_links_add(ov->db, in->rino, oldpath) < 0 ||
	     cb_links_add(ov->db, in->rino, path) < 0)) {
		fprintf(stderr, "cowbox fs: link names of %s: %s\n", oldpath, cb_error_message());
		r = -EIO;
	}
	/* the existing name is one of several now: a turn looks at it too, to group them */
	if (r >= 0)
		r = ov_mark_inode(ov, req, in, CB_CHANGE_META);
	if (r < 0)
		goto out;
	if (ov_linkat(ov->upper_fd, oldpath, ov->upper_fd, path, 0) < 0) {
		r = -errno;
		if (r == -EEXIST && (r = ov_clear_whiteout(ov, path)) > 0)
			r = ov_linkat(ov->upper_fd, oldpath, ov->upper_fd, path, 0) < 0 ? -errno
											: 0;
		else if (r == 0)
			r = -EEXIST;
		if (r < 0)
			goto out;
	}
	r = ov_lookup_child(ov, parent, newname, &e);
out:
	cb_rwlock_unlock(&ov->tab.ns);
	free(path);
	free(oldpath);
	if (r < 0)
		fuse_reply_err(req, -r);
	else
		fuse_reply_entry(req, &e);
}

/* Where parent/name lives now: *in_upper (a real upper entry, not a whiteout) and *in_base
 * (a base entry that shows through or is hidden by the upper one), with their stats. */
void ov_locate(struct cb_overlay *ov, struct ov_inode *parent, const char *path, int *in_upper,
	       struct stat *ust, int *in_base, struct stat *bst)
{
	*in_upper = atomic_load(&parent->layer) == OV_UPPER &&
		    ov_lstat(ov->upper_fd, path, ust) == 0 && !ov_is_whiteout(ust);
	*in_base = parent->merged && ov_lstat(ov->base_fd, path, bst) == 0;
	if (*in_base && atomic_load(&parent->layer) == OV_UPPER && !*in_upper &&
	    ov_lstat(ov->upper_fd, path, ust) == 0)
		*in_base = 0; /* whited out */
}

/* 0 if the directory at path shows no entries in the mount, -ENOTEMPTY if it does. */
int ov_dir_empty(struct cb_overlay *ov, const char *path, int in_upper, int merged)
{
	char *child = NULL;
	int r = 0;
	DIR *d;
	struct dirent *de;
	int fd;

	if (in_upper) {
		fd = ov_openat(ov->upper_fd, path, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
		if (fd < 0 || !(d = fdopendir(fd))) {
			if (fd >= 0)
				close(fd);
			return -errno;
		}
		while (r == 0 && (de = readdir(d))) {
			struct stat st;
			if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
				continue;
			if (fstatat(fd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 ||
			    !ov_is_whiteout(&st))
				r = -ENOTEMPTY;
		}
		closedir(d);
	}
	if (r < 0 || !merged)
		return r;
	fd = ov_openat(ov->base_fd, path, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
	if (fd < 0 || !(d = fdopendir(fd))) {
		if (fd >= 0)
			close(fd);
		return 0;
	}
	while (r == 0 && (de = readdir(d))) {
		struct stat st;
		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		free(child);
		if (asprintf(&child, "%s/%s", path, de->d_name) < 0) {
			child = NULL;
			r = -ENOMEM;
		} else if (!in_upper || ov_lstat(ov->upper_fd, child, &st) < 0 ||
			   !ov_is_whiteout(&st)) {
			r = -ENOTEMPTY;
		}
	}
	closedir(d);
	free(child);
	return r;
}

/* The inode that ov knows for the entry described by (in_upper ? ust : bst), or NULL. */
struct ov_inode *ov_known(struct cb_overlay *ov, int in_upper, const struct stat *ust,
			  const struct stat *bst)
{
	const struct stat *st = in_upper ? ust : bst;
	struct ov_inode *in;

	cb_mutex_lock(&ov->tab.lock);
	in = ov_table_find(&ov->tab, st->st_dev, st->st_ino);
	cb_mutex_unlock(&ov->tab.lock);
	return in;
}

/* parent/name of in is gone: forget it, and keep an O_PATH fd if the kernel still refers to
 * in after its last name went (an open, unlinked file). Caller holds ns write. */
void ov_name_gone(struct cb_overlay *ov, struct ov_inode *in, struct ov_inode *parent,
		  const char *name, int keep_fd)
{
	cb_mutex_lock(&ov->tab.lock);
	ov_inode_drop_name(&ov->tab, in, parent, name);
	if (!in->names) {
		ov_table_remove(&ov->tab, in);
		if (in->keep_fd < 0)
			in->keep_fd = keep_fd, keep_fd = -1;
	}
	ov_inode_release(&ov->tab, in);
	cb_mutex_unlock(&ov->tab.lock);
	if (keep_fd >= 0)
		close(keep_fd);
}

/* An O_PATH fd on in's bytes, if in is about to lose its last name while still referenced. */
int ov_keep_fd_for(struct cb_overlay *ov, struct ov_inode *in, const char *path)
{
	if (!in || !in->names || in->names->next || in->nlookup == 0)
		return -1;
	return ov_openat(ov_layer_fd(ov, atomic_load(&in->layer)), path,
			 O_PATH | O_NOFOLLOW | O_CLOEXEC, 0);
}

/* An upper entry (ust) lost a name: its inode leaves the quota now, or at the last close if
 * it is still open (its bytes stay on disk, and can still grow, until then). */
void ov_upper_name_gone(struct cb_overlay *ov, struct ov_inode *in, const struct stat *ust,
			int keep_fd)
{
	int open = 0;

	if (S_ISREG(ust->st_mode) && ust->st_nlink <= 1 && keep_fd >= 0 && in) {
		cb_mutex_lock(&in->lock);
		open = in->backing_opens + in->cached_opens > 0;
		in->quota_deferred = open;
		cb_mutex_unlock(&in->lock);
	}
	if (!open)
		ov_quota_gone(ov, ust);
}

static void ov_remove(fuse_req_t req, fuse_ino_t parent_ino, const char *name, int dir)
{
	struct cb_overlay *ov = ov_of(req);
	struct ov_inode *parent = ov_inode_get(ov, parent_ino), *in;
	char *path = NULL;
	struct stat ust, bst;
	long long xattrs = 0;
	int r, in_upper, in_base, keep = -1;

	cb_rwlock_write(&ov->tab.ns);
	r = ov_path(&ov->tab, parent, name, &path);
	if (r < 0)
		goto out;
	ov_locate(ov, parent, path, &in_upper, &ust, &in_base, &bst);
	if (!in_upper && !in_base) {
		r = -ENOENT;
		goto out;
	}
	if (dir) {
		int merged = in_base && S_ISDIR(bst.st_mode) &&
			     (!in_upper || !ov_is_opaque(ov->upper_fd, path));
		if (!S_ISDIR((in_upper ? ust : bst).st_mode)) {
			r = -ENOTDIR;
			goto out;
		}
		r = ov_dir_empty(ov, path, in_upper, merged);
		if (r < 0)
			goto out;
	}
	in = ov_known(ov, in_upper, &ust, &bst);
	r = ov_mark_child(ov, req, parent, name, CB_CHANGE_DELETE, 0);
	if (r < 0)
		goto out;
	if (!dir)
		keep = ov_keep_fd_for(ov, in, path);
	if (in_upper)
		xattrs = ov_quota_xattr_gone(ov, path, &ust);
	if (in_upper && dir) {
		r = ov_clear_whiteouts(ov->upper_fd, path);
		if (r == 0 && ov_unlinkat(ov->upper_fd, path, AT_REMOVEDIR) < 0)
			r = -errno;
		if (r == 0)
			ov_quota_gone(ov, &ust);
		if (r == 0 && in_base)
			r = ov_make_whiteout(ov->upper_fd, path);
	} else if (in_upper) {
		r = in_base ? ov_whiteout_replace(ov->upper_fd, path)
		    : ov_unlinkat(ov->upper_fd, path, 0) < 0 ? -errno
							     : 0;
		if (r == 0)
			ov_upper_name_gone(ov, in, &ust, keep);
	} else {
		r = ov_ensure_upper_dir(ov, parent);
		if (r == 0)
			r = ov_make_whiteout(ov->upper_fd, path);
	}
	if (r == 0 && xattrs)
		ov_quota_give(ov, xattrs, 0);
	if (r == 0 && in)
		ov_name_gone(ov, in, parent, name, keep), keep = -1;
out:
	cb_rwlock_unlock(&ov->tab.ns);
	free(path);
	if (keep >= 0)
		close(keep);
	fuse_reply_err(req, -r);
}

/* UNLINK: removes a non-directory; a name the base also has leaves a whiteout. */
void ov_op_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	ov_remove(req, parent, name, 0);
}

/* RMDIR: removes an empty directory (merged with the base's view); a whiteout hides the
 * base's. */
void ov_op_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	ov_remove(req, parent, name, 1);
}

/* RENAME: renameat2 with NOREPLACE or EXCHANGE, under the names lock's write side
 * (rename.c). */
void ov_op_rename(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent,
		  const char *newname, unsigned int flags)
{
	struct cb_overlay *ov = ov_of(req);
	int r;

	cb_rwlock_write(&ov->tab.ns);
	r = ov_rename_locked(ov, req, ov_inode_get(ov, parent), name, ov_inode_get(ov, newparent),
			     newname, flags);
	cb_rwlock_unlock(&ov->tab.ns);
	fuse_reply_err(req, -r);
}

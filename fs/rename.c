/* rename(2) over the overlay: files and whole directories, across the base and upper layers,
 * RENAME_NOREPLACE and RENAME_EXCHANGE, leaving whiteouts where base entries must vanish. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "ov.h"

/* The inode for parent/name, creating it in the table if the kernel never looked it up;
 * *temp says a reference was taken that the caller must drop. Caller holds ns write. */
static struct ov_inode *ov_rename_inode(struct cb_overlay *ov, struct ov_inode *parent,
					const char *name, int in_upper, const struct stat *ust,
					const struct stat *bst, int *temp)
{
	struct ov_inode *in = ov_known(ov, in_upper, ust, bst);
	struct fuse_entry_param e;

	*temp = 0;
	if (in)
		return in;
	if (ov_lookup_child(ov, parent, name, &e) < 0)
		return NULL;
	*temp = 1;
	return ov_inode_get(ov, e.ino);
}

/* Brings in (and for a directory everything under it) into upper, independent of the base
 * at its current path, so that it can move. */
static int ov_rename_prepare(struct cb_overlay *ov, struct ov_inode *in)
{
	if (in->type == S_IFDIR)
		return ov_copy_up_tree(ov, in);
	return ov_copy_up(ov, in, 1);
}

static int ov_rename_marks(struct cb_overlay *ov, fuse_req_t req, struct ov_inode *sp,
			   const char *sname, int sdir, struct ov_inode *dp, const char *dname,
			   int ddir, unsigned flags)
{
	int r = ov_mark_child(ov, req, sp, sname, CB_CHANGE_RENAME_FROM, sdir);

	if (r == 0)
		r = ov_mark_child(ov, req, dp, dname, CB_CHANGE_RENAME_TO, sdir);
	if (r == 0 && (flags & RENAME_EXCHANGE))
		r = ov_mark_child(ov, req, dp, dname, CB_CHANGE_RENAME_FROM, ddir);
	if (r == 0 && (flags & RENAME_EXCHANGE))
		r = ov_mark_child(ov, req, sp, sname, CB_CHANGE_RENAME_TO, ddir);
	return r;
}

/* Clears what is in upper at dpath so a plain rename can land there: a whiteout goes, a
 * directory that only holds whiteouts is emptied. */
static int ov_rename_clear_target(struct cb_overlay *ov, const char *dpath)
{
	struct stat st;

	if (ov_lstat(ov->upper_fd, dpath, &st) < 0)
		return 0;
	if (ov_is_whiteout(&st))
		return ov_unlinkat(ov->upper_fd, dpath, 0) < 0 ? -errno : 0;
	if (S_ISDIR(st.st_mode))
		return ov_clear_whiteouts(ov->upper_fd, dpath);
	return 0;
}

/* ov_rename_locked once the layer paths of both names are known. */
/* The link names (cb_links_names) at or below the source, copied under the destination
 * before the rename (and back, for an exchange): a name must be on record before it exists,
 * or a later change through another name would miss it. *moved: the source had some. */
static int ov_rename_link_names(struct cb_overlay *ov, const char *spath, const char *dpath,
				int exchange, int *moved)
{
	int r = 0;

	*moved = 0;
	if (ov->db && (r = cb_links_rename(ov->db, spath, dpath)) >= 0) {
		*moved = r;
		if (exchange)
			r = cb_links_rename(ov->db, dpath, spath);
	}
	if (r < 0) {
		fprintf(stderr, "cowbox fs: link names below %s: %s\n", spath, cb_error_message());
		return -EIO;
	}
	return 0;
}

static int ov_rename_at(struct cb_overlay *ov, fuse_req_t req, struct ov_inode *sp,
			const char *sname, struct ov_inode *dp, const char *dname, unsigned flags,
			const char *spath, const char *dpath)
{
	struct stat sust, sbst, dust, dbst;
	long long dxattrs = 0;
	struct ov_inode *sin = NULL, *din = NULL;
	int s_up, s_base, d_up, d_base, r = 0, stemp = 0, dtemp = 0, keep = -1, sdir, ddir = 0;
	int exchange = (flags & RENAME_EXCHANGE) != 0, moved = 0;

	ov_locate(ov, sp, spath, &s_up, &sust, &s_base, &sbst);
	if (!s_up && !s_base)
		return -ENOENT;
	ov_locate(ov, dp, dpath, &d_up, &dust, &d_base, &dbst);
	sdir = S_ISDIR((s_up ? sust : sbst).st_mode);
	if (d_up || d_base)
		ddir = S_ISDIR((d_up ? dust : dbst).st_mode);
	if ((flags & RENAME_NOREPLACE) && (d_up || d_base))
		return -EEXIST;
	if (exchange && !d_up && !d_base)
		return -ENOENT;
	sin = ov_rename_inode(ov, sp, sname, s_up, &sust, &sbst, &stemp);
	if (!sin)
		return -ENOENT;
	if (d_up || d_base) {
		din = ov_rename_inode(ov, dp, dname, d_up, &dust, &dbst, &dtemp);
		if (din == sin)
			goto out; /* two names of one file: rename does nothing */
	}
	if (!exchange && din) {
		if (sdir && !ddir) {
			r = -ENOTDIR;
			goto out;
		}
		if (!sdir && ddir) {
			r = -EISDIR;
			goto out;
		}
		if (ddir) {
			int merged = d_base && S_ISDIR(dbst.st_mode) &&
				     (!d_up || !ov_is_opaque(ov->upper_fd, dpath));
			r = ov_dir_empty(ov, dpath, d_up, merged);
			if (r < 0)
				goto out;
		}
	}
	r = ov_rename_marks(ov, req, sp, sname, sdir, dp, dname, ddir, flags);
	if (r == 0)
		r = ov_rename_prepare(ov, sin);
	if (r == 0 && exchange)
		r = ov_rename_prepare(ov, din);
	if (r == 0)
		r = ov_ensure_upper_dir(ov, dp);
	if (r == 0)
		r = ov_rename_link_names(ov, spath, dpath, exchange, &moved);
	if (r < 0)
		goto out;
	if (exchange) {
		if (ov_renameat(ov->upper_fd, spath, dpath, RENAME_EXCHANGE) < 0) {
			r = -errno;
			goto out;
		}
	} else {
		if (din && !ddir)
			keep = ov_keep_fd_for(ov, din, dpath);
		if (d_up) /* the replaced entry's xattrs go with it */
			dxattrs = ov_quota_xattr_gone(ov, dpath, &dust);
		r = ov_rename_clear_target(ov, dpath);
		if (r < 0)
			goto out;
		if (ov_renameat(ov->upper_fd, spath, dpath, s_base ? RENAME_WHITEOUT : 0) < 0) {
			if (!s_base || errno != EINVAL ||
			    ov_renameat(ov->upper_fd, spath, dpath, 0) < 0) {
				r = -errno;
				goto out;
			}
			r = ov_make_whiteout(ov->upper_fd, spath);
			if (r < 0)
				goto out;
		}
	}
	if (!exchange && moved && cb_links_drop(ov->db, spath) < 0)
		fprintf(stderr, "cowbox fs: link names below %s: %s\n", spath, cb_error_message());
	if (!exchange && d_up && ddir)
		ov_quota_gone(ov, &dust);
	else if (!exchange && d_up)
		ov_upper_name_gone(ov, din, &dust, keep);
	if (!exchange && dxattrs)
		ov_quota_give(ov, dxattrs, 0);
	if (!exchange && din) {
		ov_name_gone(ov, din, dp, dname, keep);
		keep = -1;
		if (dtemp) {
			dtemp = 0;
			ov_forget_one(ov, din, 1);
		}
	}
	cb_mutex_lock(&ov->tab.lock);
	r = ov_inode_rename_name(&ov->tab, sin, sp, sname, dp, dname);
	if (r == 0 && exchange)
		r = ov_inode_rename_name(&ov->tab, din, dp, dname, sp, sname);
	ov_inode_release(&ov->tab, sp);
	ov_inode_release(&ov->tab, dp);
	cb_mutex_unlock(&ov->tab.lock);
	if (r == -ENOENT)
		r = 0; /* a name the table did not know: nothing to move */
out:
	if (keep >= 0)
		close(keep);
	if (stemp)
		ov_forget_one(ov, sin, 1);
	if (dtemp)
		ov_forget_one(ov, din, 1);
	return r;
}

/* Renames sp/sname to dp/dname with renameat2 flags (only NOREPLACE and EXCHANGE); errors as
 * rename(2) gives them. Caller holds ns write. */
int ov_rename_locked(struct cb_overlay *ov, fuse_req_t req, struct ov_inode *sp, const char *sname,
		     struct ov_inode *dp, const char *dname, unsigned flags)
{
	char *spath = NULL, *dpath = NULL;
	int r;

	if (flags & ~(RENAME_NOREPLACE | RENAME_EXCHANGE))
		return -EINVAL;
	if ((r = ov_path(&ov->tab, sp, sname, &spath)) >= 0 &&
	    (r = ov_path(&ov->tab, dp, dname, &dpath)) >= 0)
		r = ov_rename_at(ov, req, sp, sname, dp, dname, flags, spath, dpath);
	free(spath);
	free(dpath);
	return r;
}

/* Extended attributes through the overlay: read from the layer that holds the file, changed
 * after copy-up; the overlay's own trusted.overlay.* names are neither shown nor settable. */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>

#include "ov.h"

/* A path for the *xattr calls on in: "/proc/self/fd/ROOT/rel" (no following: l*xattr) or
 * "/proc/self/fd/KEEP" for an unlinked inode (following: *xattr), malloc'd in *out, with an
 * fd in *held to close with it (ov_proc_path_free). Caller holds ns read. */
static int ov_xattr_path(struct cb_overlay *ov, struct ov_inode *in, char **out, int *held,
			 int *follow)
{
	char *rel;
	int r;

	*follow = 0;
	*held = -1;
	*out = NULL;
	if (in->keep_fd >= 0) {
		*follow = 1;
		if (asprintf(out, "/proc/self/fd/%d", in->keep_fd) < 0) {
			*out = NULL;
			return -ENOMEM;
		}
		return 0;
	}
	r = ov_path(&ov->tab, in, NULL, &rel);
	if (r < 0)
		return r;
	r = ov_proc_path(ov_layer_fd(ov, atomic_load(&in->layer)), rel, out, held);
	free(rel);
	return r;
}

/* GETXATTR: an extended attribute; overlayfs's private ones are never shown. */
void ov_op_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size)
{
	struct cb_overlay *ov = ov_of(req);
	char *path = NULL, *buf = NULL;
	ssize_t n = 0;
	int follow, held = -1, r;

	if (ov_name_is_private(name) ||
	    (strcmp(name, OV_CAPS_XATTR) == 0 && atomic_load(&ov_inode_get(ov, ino)->no_caps))) {
		fuse_reply_err(req, ENODATA);
		return;
	}
	if (size && !(buf = malloc(size))) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	cb_rwlock_read(&ov->tab.ns);
	r = ov_xattr_path(ov, ov_inode_get(ov, ino), &path, &held, &follow);
	if (r == 0) {
		n = follow ? getxattr(path, name, buf, size) : lgetxattr(path, name, buf, size);
		r = n < 0 ? -errno : 0;
	}
	cb_rwlock_unlock(&ov->tab.ns);
	ov_proc_path_free(path, held);
	/* the kernel asks for this before every write(2) to drop capabilities: remember that
	 * there are none, so the question costs no syscall next time */
	if (r == -ENODATA && strcmp(name, OV_CAPS_XATTR) == 0)
		atomic_store(&ov_inode_get(ov, ino)->no_caps, 1);
	if (r == 0 && size && ov_acl_xattr(name))
		ov_acl_shift(ov, buf, (size_t)n, 0); /* a base file's ACL names host ids */
	if (r < 0)
		fuse_reply_err(req, -r);
	else if (size == 0)
		fuse_reply_xattr(req, (size_t)n);
	else
		fuse_reply_buf(req, buf, (size_t)n);
	free(buf);
}

/* LISTXATTR: the extended attributes' names, without overlayfs's private ones. */
void ov_op_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
	struct cb_overlay *ov = ov_of(req);
	char *path = NULL, *buf = NULL, *p, *out;
	ssize_t n = 0, len = 0;
	int follow, held = -1, r;

	cb_rwlock_read(&ov->tab.ns);
	r = ov_xattr_path(ov, ov_inode_get(ov, ino), &path, &held, &follow);
	if (r == 0) {
		n = follow ? listxattr(path, NULL, 0) : llistxattr(path, NULL, 0);
		if (n > 0 && (buf = malloc((size_t)n)))
			n = follow ? listxattr(path, buf, (size_t)n)
				   : llistxattr(path, buf, (size_t)n);
		else if (n > 0)
			n = -1, errno = ENOMEM;
		r = n < 0 ? -errno : 0;
	}
	cb_rwlock_unlock(&ov->tab.ns);
	ov_proc_path_free(path, held);
	if (r < 0) {
		fuse_reply_err(req, -r);
		goto out;
	}
	/* drop the overlay's own names in place */
	for (p = out = buf; p && p < buf + n; p += strlen(p) + 1) {
		size_t l = strlen(p) + 1;
		if (ov_name_is_private(p))
			continue;
		memmove(out, p, l);
		out += l;
		len += (ssize_t)l;
	}
	if (size == 0)
		fuse_reply_xattr(req, (size_t)len);
	else if ((size_t)len > size)
		fuse_reply_err(req, ERANGE);
	else
		fuse_reply_buf(req, buf, (size_t)len);
out:
	free(buf);
}

static void ov_change_xattr(fuse_req_t req, fuse_ino_t ino, const char *name, const char *value,
			    size_t size, int flags, int remove)
{
	struct cb_overlay *ov = ov_of(req);
	struct ov_inode *in = ov_inode_get(ov, ino);
	char *path = NULL, *acl = NULL;
	long long old_cost = 0, new_cost = 0, taken = 0;
	ssize_t old;
	int follow, held = -1, r;

	if (ov_name_is_private(name)) {
		fuse_reply_err(req, remove ? ENODATA : EPERM);
		return;
	}
	/* An ACL's ids are stored shifted like owners; one outside the range is refused. */
	if (!remove && ov_acl_xattr(name)) {
		if (!(acl = malloc(size ? size : 1))) {
			fuse_reply_err(req, ENOMEM);
			return;
		}
		memcpy(acl, value, size);
		r = ov_acl_shift(ov, acl, size, 1);
		if (r < 0) {
			free(acl);
			fuse_reply_err(req, -r);
			return;
		}
		value = acl;
	}
	if (strcmp(name, OV_CAPS_XATTR) == 0)
		atomic_store(&in->no_caps, 0);
	cb_rwlock_read(&ov->tab.ns);
	r = ov_copy_up(ov, in, 1);
	if (r == 0)
		r = ov_mark_inode(ov, req, in, CB_CHANGE_META);
	if (r == 0)
		r = ov_xattr_path(ov, in, &path, &held, &follow);
	/* Names and values count toward the disk quota: what a change adds is taken before
	 * it (ENOSPC past the limit), what it frees given back after. */
	if (r == 0) {
		old = follow ? getxattr(path, name, NULL, 0) : lgetxattr(path, name, NULL, 0);
		old_cost = old < 0 ? 0 : (long long)(strlen(name) + (size_t)old);
		new_cost = remove ? 0 : (long long)(strlen(name) + size);
		if (new_cost > old_cost && (r = ov_quota_take(ov, new_cost - old_cost, 0)) == 0)
			taken = new_cost - old_cost;
	}
	if (r == 0 && remove)
		r = (follow ? removexattr(path, name) : lremovexattr(path, name)) < 0 ? -errno : 0;
	else if (r == 0)
		r = (follow ? setxattr(path, name, value, size, flags)
			    : lsetxattr(path, name, value, size, flags)) < 0
			? -errno
			: 0;
	if (r < 0 && taken)
		ov_quota_give(ov, taken, 0);
	else if (r == 0 && old_cost > new_cost)
		ov_quota_give(ov, old_cost - new_cost, 0);
	cb_rwlock_unlock(&ov->tab.ns);
	ov_proc_path_free(path, held);
	free(acl);
	fuse_reply_err(req, -r);
}

/* SETXATTR: copies up and marks the inode (metadata) first; private names are refused. */
void ov_op_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name, const char *value,
		    size_t size, int flags)
{
	ov_change_xattr(req, ino, name, value, size, flags, 0);
}

/* REMOVEXATTR: as SETXATTR, removing. */
void ov_op_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name)
{
	ov_change_xattr(req, ino, name, NULL, 0, 0, 1);
}

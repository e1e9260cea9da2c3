/* libcowbox's high-level API, files straight through the mount when this process sees it:
 * the daemon's own path rule (openat2 beneath the root) without base64 and JSON in the way. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "box_private.h"
#include "cowbox/error.h"

#ifndef FUSE_SUPER_MAGIC
#define FUSE_SUPER_MAGIC 0x65735546
#endif

static int openat2_beneath(int dirfd, const char *path, int flags, mode_t mode)
{
	struct open_how how = {
	    .flags = (unsigned long long)(flags | O_CLOEXEC),
	    .mode = (flags & O_CREAT) ? mode : 0,
	    .resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS,
	};
	long fd;

	do
		fd = syscall(SYS_openat2, dirfd, path, &how, sizeof(how));
	while (fd < 0 && errno == EAGAIN);
	return fd < 0 ? -errno : (int)fd;
}

/* The workspace's root, if this process sees the daemon's live mount of it; else -1. */
static int direct_root(struct cb_box *box)
{
	char source[128], want[sizeof(source)];
	const char *env = getenv("COWBOX_DIRECT_IO");
	struct statfs sfs;
	int fd;

	if ((env && !strcmp(env, "0")) || !box->mountpoint || !*box->mountpoint)
		return -1;
	snprintf(want, sizeof(want), "cowbox:%s", box->ref);
	if (cb_ws_fuse_mount_source(box->mountpoint, source, sizeof(source)) != 1 ||
	    strcmp(source, want))
		return -1;
	fd = open(box->mountpoint, O_PATH | O_DIRECTORY | O_CLOEXEC);
	/* A dead mount (ENOTCONN) or a plain directory is the protocol's to handle. */
	if (fd >= 0 && (fstatfs(fd, &sfs) < 0 || sfs.f_type != FUSE_SUPER_MAGIC)) {
		close(fd);
		fd = -1;
	}
	return fd;
}

/* Errors the daemon would give for this path; anything else goes through the protocol. */
static int direct_error(const char *op, const char *path, int err)
{
	if (err == EXDEV || err == ELOOP) {
		cb_box_set_code("invalid_path");
		return cb_error_set(
		    EINVAL, "%s %s: invalid_path: the path leaves the workspace root", op, path);
	}
	if (err == ENOENT) {
		cb_box_set_code("not_found");
		return cb_error_set(ENOENT, "%s %s: not_found: %s", op, path, strerror(err));
	}
	return 1;
}

/* Refusals that need no file system: absolute paths (the protocol's invalid_path). */
static int direct_check(const char *op, const char *path)
{
	if (!path || !*path)
		return 1;
	if (path[0] == '/') {
		cb_box_set_code("invalid_path");
		return cb_error_set(EINVAL,
				    "%s %s: invalid_path: absolute paths are refused; give a path "
				    "relative to the workspace root",
				    op, path);
	}
	return 0;
}

int cb_box_direct_read(struct cb_box *box, const char *path, void **data, size_t *len)
{
	int root, fd = -1, rc;
	char *buf = NULL;
	size_t have = 0, cap;
	struct stat st;

	if ((rc = direct_check("read", path)) || (root = direct_root(box)) < 0)
		return rc ? rc : 1;
	fd = openat2_beneath(root, path, O_RDONLY, 0);
	close(root);
	if (fd < 0)
		return direct_error("read", path, -fd);
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		rc = 1;
		goto out;
	}
	cap = (size_t)st.st_size + 1;
	for (;;) {
		ssize_t n;

		if (have + 1 >= cap || !buf) {
			char *grown = realloc(buf, cap = have + 1 >= cap ? cap * 2 : cap);

			if (!grown) {
				rc = cb_error_set(ENOMEM, "read %s: out of memory", path);
				goto out;
			}
			buf = grown;
		}
		n = read(fd, buf + have, cap - have - 1);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			rc = cb_error_set(errno, "read %s: %s", path, strerror(errno));
			goto out;
		}
		if (n == 0)
			break;
		have += (size_t)n;
	}
	buf[have] = '\0';
	*data = buf;
	*len = have;
	buf = NULL;
	rc = 0;
out:
	free(buf);
	close(fd);
	return rc;
}

/* Make the parent directories of path beneath root, as the daemon's write does. */
static int direct_parents(int root, const char *path)
{
	char *copy = strdup(path), *slash;
	int rc = 0;

	if (!copy)
		return cb_error_set(ENOMEM, "write %s: out of memory", path);
	for (slash = strchr(copy, '/'); slash && !rc; slash = strchr(slash + 1, '/')) {
		char *leaf = slash;
		int dfd;

		*slash = '\0';
		dfd = *copy ? openat2_beneath(root, copy, O_PATH | O_DIRECTORY, 0) : dup(root);
		if (dfd == -ENOENT) {
			/* Make the missing component in its (existing) parent. */
			while (leaf > copy && leaf[-1] != '/')
				leaf--;
			if (leaf > copy)
				leaf[-1] = '\0';
			int pfd = leaf > copy ? openat2_beneath(root, copy, O_PATH | O_DIRECTORY, 0)
					      : dup(root);

			if (leaf > copy)
				leaf[-1] = '/';
			if (pfd < 0)
				rc = direct_error("write", path, -pfd);
			else if (mkdirat(pfd, leaf, 0755) < 0 && errno != EEXIST)
				rc = direct_error("write", path, errno);
			if (pfd >= 0)
				close(pfd);
		} else if (dfd < 0) {
			rc = direct_error("write", path, -dfd);
		} else {
			close(dfd);
		}
		*slash = '/';
	}
	free(copy);
	return rc;
}

int cb_box_direct_write(struct cb_box *box, const char *path, const void *data, size_t len)
{
	int root, fd, rc;
	size_t off = 0;

	if ((rc = direct_check("write", path)) || (root = direct_root(box)) < 0)
		return rc ? rc : 1;
	if ((rc = direct_parents(root, path))) {
		close(root);
		return rc;
	}
	fd = openat2_beneath(root, path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	close(root);
	if (fd < 0)
		return direct_error("write", path, -fd);
	while (off < len) {
		ssize_t n = write(fd, (const char *)data + off, len - off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			rc = cb_error_set(errno, "write %s: %s", path, strerror(errno));
			break;
		}
		off += (size_t)n;
	}
	if (close(fd) < 0 && !rc)
		rc = cb_error_set(errno, "write %s: %s", path, strerror(errno));
	return rc;
}

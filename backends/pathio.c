/* read and write of workspace files for every backend: paths resolved beneath the workspace
 * root with openat2, so that .., absolute paths and symlinks out of the root are refused. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "cowbox/backend.h"
#include "cowbox/error.h"

#define PATHIO_RESOLVE (RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)

/* The root is opened per call: an fd held on the mount point would make its umount fail. */
static int open_root(struct cb_backend *b)
{
	int fd = open(b->root, O_PATH | O_DIRECTORY | O_CLOEXEC);

	if (fd < 0)
		return cb_error_set(errno, "open workspace root %s: %s", b->root, strerror(errno));
	return fd;
}

static int open_beneath(int root_fd, const char *path, int flags, mode_t mode)
{
	struct open_how how = {
	    .flags = (unsigned long long)(flags | O_CLOEXEC),
	    .mode = (flags & O_CREAT) ? mode : 0,
	    .resolve = PATHIO_RESOLVE,
	};
	int fd;

	do
		fd = (int)syscall(SYS_openat2, root_fd, path, &how, sizeof(how));
	while (fd < 0 && errno == EAGAIN);
	return fd;
}

/* Refused before the kernel sees it, so the message says why in words. */
static int path_check(const char *path)
{
	if (!path || !*path)
		return cb_error_set(EINVAL, "empty path");
	if (path[0] == '/')
		return cb_error_set(EXDEV,
				    "%s: absolute paths are refused; give a path relative to the "
				    "workspace root",
				    path);
	if (strlen(path) >= 4096)
		return cb_error_set(ENAMETOOLONG, "%.64s...: path too long", path);
	return 0;
}

static int path_error(const char *op, const char *path, int err)
{
	if (err == EXDEV || err == ELOOP)
		return cb_error_set(EXDEV, "%s %s: the path leaves the workspace root", op, path);
	return cb_error_set(err, "%s %s: %s", op, path, strerror(err));
}

int cb_backend_read(struct cb_backend *b, const char *path, off_t off, size_t len, void **data,
		    size_t *n, off_t *size)
{
	struct stat st;
	char *buf = NULL;
	size_t got = 0;
	int fd = -1, root, rc;

	*data = NULL;
	*n = 0;
	if ((rc = path_check(path)) < 0)
		return rc;
	if (off < 0)
		return cb_error_set(EINVAL, "read %s: negative offset", path);
	if ((root = open_root(b)) < 0)
		return root;
	fd = open_beneath(root, path, O_RDONLY, 0);
	close(root);
	if (fd < 0)
		return path_error("read", path, errno);
	if (fstat(fd, &st) < 0) {
		rc = path_error("read", path, errno);
		goto out;
	}
	if (!S_ISREG(st.st_mode)) {
		rc = cb_error_set(EINVAL, "read %s: not a regular file", path);
		goto out;
	}
	*size = st.st_size;
	if (len > 4 * CB_BACKEND_CHUNK)
		len = 4 * CB_BACKEND_CHUNK;
	buf = malloc(len ? len : 1);
	if (!buf) {
		rc = cb_error_set(ENOMEM, "read %s: out of memory", path);
		goto out;
	}
	while (got < len) {
		ssize_t r = pread(fd, buf + got, len - got, off + (off_t)got);

		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			rc = path_error("read", path, errno);
			goto out;
		}
		if (r == 0)
			break;
		got += (size_t)r;
	}
	*data = buf;
	*n = got;
	buf = NULL;
out:
	free(buf);
	close(fd);
	return rc;
}

/* mkdir -p of path's parent, one component at a time beneath the root. */
static int make_parents(int root_fd, const char *path)
{
	char *copy = strdup(path), *slash;
	int rc = 0;

	if (!copy)
		return cb_error_set(ENOMEM, "write %s: out of memory", path);
	for (slash = strchr(copy, '/'); slash; slash = strchr(slash + 1, '/')) {
		char *name;
		int dfd;

		*slash = 0;
		name = strrchr(copy, '/');
		if (!*copy || (name && !name[1])) {
			*slash = '/';
			continue;
		}
		dfd = open_beneath(root_fd, copy, O_PATH | O_DIRECTORY, 0);
		if (dfd < 0 && errno == ENOENT) {
			char *leaf = name ? name + 1 : copy;
			int pfd = root_fd;

			if (name) {
				*name = 0;
				pfd = open_beneath(root_fd, copy, O_PATH | O_DIRECTORY, 0);
				*name = '/';
			}
			if (pfd < 0 || (mkdirat(pfd, leaf, 0755) < 0 && errno != EEXIST))
				rc = path_error("write", path, errno);
			if (pfd >= 0 && pfd != root_fd)
				close(pfd);
		} else if (dfd < 0) {
			rc = path_error("write", path, errno);
		} else {
			close(dfd);
		}
		*slash = '/';
		if (rc)
			break;
	}
	free(copy);
	return rc;
}

int cb_backend_write(struct cb_backend *b, const char *path, off_t off, const void *data,
		     size_t len, int truncate, mode_t mode)
{
	size_t done = 0;
	int fd, root, rc;

	if ((rc = path_check(path)) < 0)
		return rc;
	if (off < 0)
		return cb_error_set(EINVAL, "write %s: negative offset", path);
	if ((root = open_root(b)) < 0)
		return root;
	if ((rc = make_parents(root, path)) < 0) {
		close(root);
		return rc;
	}
	fd = open_beneath(root, path, O_WRONLY | O_CREAT | (truncate ? O_TRUNC : 0),
			  mode ? mode : 0644);
	close(root);
	if (fd < 0)
		return path_error("write", path, errno);
	while (done < len) {
		ssize_t w = pwrite(fd, (const char *)data + done, len - done, off + (off_t)done);

		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0) {
			rc = path_error("write", path, errno);
			break;
		}
		done += (size_t)w;
	}
	if (close(fd) < 0 && !rc)
		rc = path_error("write", path, errno);
	return rc;
}

int cb_backend_mkdirs(struct cb_backend *b, const char *path)
{
	char *leaf = NULL;
	int root, rc;

	if ((rc = path_check(path)) < 0)
		return rc;
	if (asprintf(&leaf, "%s/.", path) < 0)
		return cb_error_set(ENOMEM, "mkdir %s: out of memory", path);
	if ((root = open_root(b)) < 0) {
		free(leaf);
		return root;
	}
	rc = make_parents(root, leaf);
	close(root);
	free(leaf);
	return rc;
}

/* read and write of workspace files for every backend, through util/beneath: beneath the
 * workspace root, through no symlink, never blocking on a FIFO or device. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cowbox/backend.h"
#include "cowbox/error.h"
#include "util/beneath.h"

/* The root is opened per call: an fd held on the mount point would make its umount fail. */
static int open_root(const char *root)
{
	int fd = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);

	if (fd < 0)
		return cb_error_set(errno, "open workspace root %s: %s", root, strerror(errno));
	return fd;
}

static size_t read_bound(size_t len)
{
	return len > 4 * CB_BACKEND_CHUNK ? 4 * CB_BACKEND_CHUNK : len;
}

int cb_backend_read_at(const char *root, const char *path, off_t off, size_t len, void **data,
		       size_t *n, off_t *size)
{
	int fd, rc;

	*data = NULL;
	*n = 0;
	if ((rc = cb_beneath_check(path)) < 0)
		return cb_error_wrap(rc, "read");
	if ((fd = open_root(root)) < 0)
		return fd;
	rc = cb_beneath_read_file(fd, path, off, read_bound(len), data, n, size);
	close(fd);
	return rc;
}

int cb_backend_write_at(const char *root, const char *path, off_t off, const void *data, size_t len,
			int truncate, mode_t mode)
{
	int fd, rc;

	if ((rc = cb_beneath_check(path)) < 0)
		return cb_error_wrap(rc, "write");
	if ((fd = open_root(root)) < 0)
		return fd;
	rc = cb_beneath_write_file(fd, path, off, data, len, truncate, mode);
	close(fd);
	return rc;
}

int cb_backend_mkdirs_at(const char *root, const char *path)
{
	int fd, rc;

	if ((rc = cb_beneath_check(path)) < 0)
		return cb_error_wrap(rc, "mkdir");
	if ((fd = open_root(root)) < 0)
		return fd;
	rc = cb_beneath_mkdirs(fd, path, 0755);
	close(fd);
	return rc;
}

int cb_backend_read(struct cb_backend *b, const char *path, off_t off, size_t len, void **data,
		    size_t *n, off_t *size)
{
	int rc;

	*data = NULL;
	*n = 0;
	if (!b->io)
		return cb_backend_read_at(b->root, path, off, len, data, n, size);
	if ((rc = cb_beneath_check(path)) < 0)
		return cb_error_wrap(rc, "read");
	return b->io->read(b->io_arg, path, off, read_bound(len), data, n, size);
}

int cb_backend_write(struct cb_backend *b, const char *path, off_t off, const void *data,
		     size_t len, int truncate, mode_t mode)
{
	int rc;

	if (!b->io)
		return cb_backend_write_at(b->root, path, off, data, len, truncate, mode);
	if ((rc = cb_beneath_check(path)) < 0)
		return cb_error_wrap(rc, "write");
	return b->io->write(b->io_arg, path, off, data, len, truncate, mode);
}

int cb_backend_mkdirs(struct cb_backend *b, const char *path)
{
	int rc;

	if (!b->io)
		return cb_backend_mkdirs_at(b->root, path);
	if ((rc = cb_beneath_check(path)) < 0)
		return cb_error_wrap(rc, "mkdir");
	return b->io->mkdirs(b->io_arg, path);
}

int cb_backend_api_path(const char *working_dir, const char *path, char **out)
{
	static const char ws[] = "/workspace";
	int n;

	*out = NULL;
	if (!path)
		return cb_error_set(EINVAL, "no path given");
	if (!strncmp(path, ws, sizeof ws - 1) && path[sizeof ws - 1] == '/' &&
	    path[sizeof ws - 1 + strspn(path + sizeof ws - 1, "/")])
		n = asprintf(out, "%s", path + sizeof ws - 1 + strspn(path + sizeof ws - 1, "/"));
	else if (path[0] != '/' && working_dir && *working_dir)
		n = asprintf(out, "%s/%s", working_dir, path);
	else
		n = asprintf(out, "%s", path);
	if (n < 0) {
		*out = NULL;
		return cb_error_set(ENOMEM, "out of memory");
	}
	return 0;
}

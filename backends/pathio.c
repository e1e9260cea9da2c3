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
static int open_root(struct cb_backend *b)
{
	int fd = open(b->root, O_PATH | O_DIRECTORY | O_CLOEXEC);

	if (fd < 0)
		return cb_error_set(errno, "open workspace root %s: %s", b->root, strerror(errno));
	return fd;
}

int cb_backend_read(struct cb_backend *b, const char *path, off_t off, size_t len, void **data,
		    size_t *n, off_t *size)
{
	int root, rc;

	*data = NULL;
	*n = 0;
	if ((rc = cb_beneath_check(path)) < 0)
		return cb_error_wrap(rc, "read");
	if ((root = open_root(b)) < 0)
		return root;
	rc = cb_beneath_read_file(root, path, off,
				  len > 4 * CB_BACKEND_CHUNK ? 4 * CB_BACKEND_CHUNK : len, data, n,
				  size);
	close(root);
	return rc;
}

int cb_backend_write(struct cb_backend *b, const char *path, off_t off, const void *data,
		     size_t len, int truncate, mode_t mode)
{
	int root, rc;

	if ((rc = cb_beneath_check(path)) < 0)
		return cb_error_wrap(rc, "write");
	if ((root = open_root(b)) < 0)
		return root;
	rc = cb_beneath_write_file(root, path, off, data, len, truncate, mode);
	close(root);
	return rc;
}

int cb_backend_mkdirs(struct cb_backend *b, const char *path)
{
	int root, rc;

	if ((rc = cb_beneath_check(path)) < 0)
		return cb_error_wrap(rc, "mkdir");
	if ((root = open_root(b)) < 0)
		return root;
	rc = cb_beneath_mkdirs(root, path, 0755);
	close(root);
	return rc;
}

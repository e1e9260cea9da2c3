/* Small state files of a workspace directory: one read, or one write to a temporary name
 * renamed over the old file. Shared by the ids, access and idle_timeout files. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "util/smallfile.h"

/* See smallfile.h. */
int cb_smallfile_read(const char *dir, const char *name, char *buf, size_t size)
{
	char path[4096];
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT ? -ENOENT
				       : cb_error_set(errno, "open %s: %s", path, strerror(errno));
	n = read(fd, buf, size - 1);
	if (n < 0)
		n = cb_error_set(errno, "read %s: %s", path, strerror(errno));
	else
		buf[n] = '\0';
	close(fd);
	return (int)n;
}

/* See smallfile.h. */
int cb_smallfile_write(const char *dir, const char *name, const char *text, mode_t mode)
{
	char path[4096], tmp[4200];
	size_t len = strlen(text);
	int fd, rc = 0;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, mode);
	if (fd < 0)
		return cb_error_set(errno, "create %s: %s", tmp, strerror(errno));
	errno = 0;
	if (write(fd, text, len) != (ssize_t)len || fsync(fd) < 0)
		rc = cb_error_set(errno ? errno : EIO, "write %s: %s", tmp,
				  strerror(errno ? errno : EIO));
	close(fd);
	if (!rc && rename(tmp, path) < 0)
		rc = cb_error_set(errno, "rename %s: %s", tmp, strerror(errno));
	if (rc)
		unlink(tmp);
	return rc;
}

/* Access levels: their names, and the widest level a workspace serves, kept as one word in
 * the file "access" of its directory (absent: full). */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cowbox/access.h"
#include "cowbox/error.h"

static const char *const access_names[] = {"none", "files", "full"};

int cb_access_parse(const char *name)
{
	for (int i = CB_ACCESS_NONE; i <= CB_ACCESS_FULL; i++)
		if (name && !strcmp(name, access_names[i]))
			return i;
	return cb_error_set(EINVAL, "access '%s': expected none, files or full",
			    name ? name : "(null)");
}

const char *cb_access_name(int level)
{
	return level >= CB_ACCESS_NONE && level < CB_ACCESS_FULL ? access_names[level] : "full";
}

int cb_ws_access_load(const char *dir)
{
	char path[4096], buf[16];
	int fd, rc;
	ssize_t n;

	snprintf(path, sizeof(path), "%s/access", dir);
	fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT ? CB_ACCESS_FULL
				       : cb_error_set(errno, "open %s: %s", path, strerror(errno));
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n < 0)
		return cb_error_set(errno, "read %s: %s", path, strerror(errno));
	buf[n] = '\0';
	buf[strcspn(buf, "\n")] = '\0';
	rc = cb_access_parse(buf);
	return rc < 0 ? cb_error_wrap(rc, "%s", path) : rc;
}

int cb_ws_access_save(const char *dir, int level)
{
	char path[4096], tmp[4200];
	const char *name = cb_access_name(level);
	int fd, rc = 0;

	snprintf(path, sizeof(path), "%s/access", dir);
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		return cb_error_set(errno, "create %s: %s", tmp, strerror(errno));
	if (dprintf(fd, "%s\n", name) < 0 || fsync(fd) < 0)
		rc = cb_error_set(errno ? errno : EIO, "write %s: %s", tmp, strerror(errno));
	close(fd);
	if (!rc && rename(tmp, path) < 0)
		rc = cb_error_set(errno, "rename %s: %s", tmp, strerror(errno));
	if (rc)
		unlink(tmp);
	return rc;
}

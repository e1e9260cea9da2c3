/* Path resolution for turns in a tree that programs change under us: beneath the tree's root
 * and through no symlink, so a symlink planted in the workspace never leads the daemon out. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "turns_int.h"

#ifndef SYS_fchmodat2
#define SYS_fchmodat2 452
#endif

int ws_open_beneath(int dirfd, const char *path, int flags, mode_t mode)
{
	struct open_how how = {
	    .flags = (unsigned long long)(flags | O_CLOEXEC),
	    .mode = (flags & O_CREAT) ? mode : 0,
	    .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
	};
	long fd = syscall(SYS_openat2, dirfd, path, &how, sizeof(how));

	return fd < 0 ? -errno : (int)fd;
}

int ws_parent_beneath(int dirfd, const char *path, const char **name)
{
	const char *slash = strrchr(path, '/');
	char *dir;
	int fd;

	*name = slash ? slash + 1 : path;
	if (!slash)
		return ws_open_beneath(dirfd, ".", O_PATH | O_DIRECTORY, 0);
	dir = strndup(path, (size_t)(slash - path));
	if (!dir)
		return -ENOMEM;
	fd = ws_open_beneath(dirfd, dir, O_PATH | O_DIRECTORY, 0);
	free(dir);
	return fd;
}

int ws_lstat_beneath(int dirfd, const char *path, struct stat *st)
{
	const char *name;
	int pfd = ws_parent_beneath(dirfd, path, &name), ret = 0;

	if (pfd < 0)
		return pfd;
	if (fstatat(pfd, name, st, AT_SYMLINK_NOFOLLOW) < 0)
		ret = -errno;
	close(pfd);
	return ret;
}

int ws_chmod_beneath(int dirfd, const char *path, mode_t mode)
{
	const char *name;
	int pfd = ws_parent_beneath(dirfd, path, &name), ret = 0;

	if (pfd < 0)
		return pfd;
	/* fchmodat2 can refuse to follow a symlink that replaced the entry meanwhile. */
	if (syscall(SYS_fchmodat2, pfd, name, mode, AT_SYMLINK_NOFOLLOW) < 0) {
		ret = -errno;
		if (ret == -ENOSYS)
			ret = fchmodat(pfd, name, mode, 0) < 0 ? -errno : 0;
	}
	close(pfd);
	return ret;
}

int ws_gone(int err)
{
	return err == -ENOENT || err == -ENOTDIR || err == -ELOOP || err == -EXDEV;
}

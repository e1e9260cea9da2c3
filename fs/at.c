/* Layer-relative paths of any length: a tree can be deeper than the PATH_MAX bytes one syscall
 * takes, so the *at() calls of fs/ reach a long path through a directory fd near its end. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ov.h"
#include "util/beneath.h"

/* Room left below PATH_MAX for what is put around a path: "/proc/self/fd/N/" before it, a
 * temporary name's suffix after it. */
#define OV_NEAR_MAX (PATH_MAX - 256)

static int ov_open_dir(int dirfd, const char *piece)
{
	/* fs/ is upper/'s only writer and walks its own names, as a short path's *at() call
	 * does in one step (see docs/hacking.md on util/beneath.c) */
	int fd = openat(dirfd, piece, O_PATH | O_DIRECTORY | O_CLOEXEC);

	return fd < 0 ? -errno : fd;
}

int ov_near(int rootfd, const char *path, const char **rest)
{
	int fd;

	*rest = path; /* AT_FDCWD (a /proc path) passes through: it is short */
	if (rootfd < 0 && rootfd != AT_FDCWD) {
		errno = EBADF; /* no such layer: what the call itself would say */
		return -1;
	}
	if (strlen(path) < OV_NEAR_MAX)
		return rootfd;
	fd = cb_beneath_near(rootfd, path, OV_NEAR_MAX, ov_open_dir, rest);
	if (fd < 0) {
		errno = -fd;
		return -1;
	}
	return fd;
}

void ov_near_put(int rootfd, int fd)
{
	int err = errno;

	if (fd >= 0 && fd != rootfd)
		close(fd);
	errno = err;
}

/* Each wrapper below: the libc call on (near fd, rest), its result and errno unchanged. */
#define OV_AT_CALL(type, rootfd, path, call)                                                       \
	do {                                                                                       \
		const char *rest;                                                                  \
		int nfd = ov_near(rootfd, path, &rest);                                            \
		type r_;                                                                           \
		if (nfd == -1)                                                                     \
			return -1;                                                                 \
		r_ = call;                                                                         \
		ov_near_put(rootfd, nfd);                                                          \
		return r_;                                                                         \
	} while (0)

int ov_fstatat(int rootfd, const char *path, struct stat *st, int flags)
{
	OV_AT_CALL(int, rootfd, path, fstatat(nfd, rest, st, flags));
}

int ov_openat(int rootfd, const char *path, int flags, mode_t mode)
{
	OV_AT_CALL(int, rootfd, path, openat(nfd, rest, flags, mode));
}

int ov_unlinkat(int rootfd, const char *path, int flags)
{
	OV_AT_CALL(int, rootfd, path, unlinkat(nfd, rest, flags));
}

int ov_mkdirat(int rootfd, const char *path, mode_t mode)
{
	OV_AT_CALL(int, rootfd, path, mkdirat(nfd, rest, mode));
}

int ov_mknodat(int rootfd, const char *path, mode_t mode, dev_t dev)
{
	OV_AT_CALL(int, rootfd, path, mknodat(nfd, rest, mode, dev));
}

int ov_symlinkat(const char *target, int rootfd, const char *path)
{
	OV_AT_CALL(int, rootfd, path, symlinkat(target, nfd, rest));
}

ssize_t ov_readlinkat(int rootfd, const char *path, char *buf, size_t size)
{
	OV_AT_CALL(ssize_t, rootfd, path, readlinkat(nfd, rest, buf, size));
}

int ov_fchownat(int rootfd, const char *path, uid_t uid, gid_t gid, int flags)
{
	OV_AT_CALL(int, rootfd, path, fchownat(nfd, rest, uid, gid, flags));
}

int ov_fchmodat(int rootfd, const char *path, mode_t mode, int flags)
{
	OV_AT_CALL(int, rootfd, path, fchmodat(nfd, rest, mode, flags));
}

int ov_utimensat(int rootfd, const char *path, const struct timespec ts[2], int flags)
{
	OV_AT_CALL(int, rootfd, path, utimensat(nfd, rest, ts, flags));
}

/* The two-path calls: each path through its own near fd. */
int ov_linkat(int oldroot, const char *oldpath, int newroot, const char *newpath, int flags)
{
	const char *orest, *nrest;
	int ofd, nfd, r = -1;

	if ((ofd = ov_near(oldroot, oldpath, &orest)) == -1)
		return -1;
	nfd = ov_near(newroot, newpath, &nrest);
	if (nfd != -1) {
		r = linkat(ofd, orest, nfd, nrest, flags);
		ov_near_put(newroot, nfd);
	}
	ov_near_put(oldroot, ofd);
	return r;
}

int ov_renameat(int rootfd, const char *oldpath, const char *newpath, unsigned flags)
{
	const char *orest, *nrest;
	int ofd, nfd, r = -1;

	if ((ofd = ov_near(rootfd, oldpath, &orest)) < 0)
		return -1;
	nfd = ov_near(rootfd, newpath, &nrest);
	if (nfd >= 0) {
		r = renameat2(ofd, orest, nfd, nrest, flags);
		ov_near_put(rootfd, nfd);
	}
	ov_near_put(rootfd, ofd);
	return r;
}

int ov_proc_path(int rootfd, const char *path, char **out, int *held)
{
	const char *rest;
	int fd = ov_near(rootfd, path, &rest);

	*out = NULL;
	*held = -1;
	if (fd < 0)
		return -errno;
	if (asprintf(out, "/proc/self/fd/%d/%s", fd, rest) < 0) {
		*out = NULL;
		ov_near_put(rootfd, fd);
		return -ENOMEM;
	}
	if (fd != rootfd)
		*held = fd;
	return 0;
}

void ov_proc_path_free(char *path, int held)
{
	free(path);
	if (held >= 0)
		close(held);
}

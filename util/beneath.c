/* The one place where workspace paths are resolved: beneath a root fd, through no symlink,
 * no "..", no absolute path, and with no blocking open of a FIFO or device (see beneath.h).
 * Whole trees (the walk, rm -rf) are in util/beneath_tree.c. */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "util/beneath.h"

#ifndef SYS_fchmodat2
#define SYS_fchmodat2 452
#endif

#define BENEATH_RESOLVE (RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)
#define BENEATH_SETID	(S_ISUID | S_ISGID)
/* openat2 says EAGAIN when a concurrent rename made its ".." check unsure; retry a little. */
#define BENEATH_EAGAIN_TRIES 64

static int chmod_fallback_forced = -1; /* -1: not decided yet (read the environment) */

void cb_beneath_force_chmod_fallback(int on)
{
	__atomic_store_n(&chmod_fallback_forced, on ? 1 : 0, __ATOMIC_RELAXED);
}

static int chmod_fallback(void)
{
	int v = __atomic_load_n(&chmod_fallback_forced, __ATOMIC_RELAXED);

	if (v < 0) {
		const char *env = getenv("COWBOX_BENEATH_NO_FCHMODAT2");

		v = env && !strcmp(env, "1");
		__atomic_store_n(&chmod_fallback_forced, v, __ATOMIC_RELAXED);
	}
	return v;
}

static const char *type_name(mode_t mode)
{
	switch (mode & S_IFMT) {
	case S_IFIFO:
		return "a FIFO";
	case S_IFCHR:
		return "a character device";
	case S_IFBLK:
		return "a block device";
	case S_IFSOCK:
		return "a socket";
	case S_IFLNK:
		return "a symlink";
	case S_IFDIR:
		return "a directory";
	default:
		return "not a regular file";
	}
}

/* See beneath.h: the words for the two failures that matter. */
int cb_beneath_fail(const char *op, const char *path, int err)
{
	if (err == ELOOP)
		return cb_error_set(
		    ELOOP,
		    "%s %s: a symlink on the way (symlinks in the workspace are not "
		    "followed by cowbox)",
		    op, path);
	if (err == EXDEV)
		return cb_error_set(EXDEV, "%s %s: the path leaves the workspace root", op, path);
	return cb_error_set(err, "%s %s: %s", op, path, strerror(err));
}

int cb_beneath_check(const char *path)
{
	const char *s;

	if (!path || !*path)
		return cb_error_set(EINVAL,
				    "empty path: give a path relative to the workspace root");
	if (path[0] == '/')
		return cb_error_set(EXDEV,
				    "%s: absolute paths are refused; give a path relative to the "
				    "workspace root",
				    path);
	for (s = path; *s;) {
		size_t n = strcspn(s, "/");

		if (n == 2 && s[0] == '.' && s[1] == '.')
			return cb_error_set(EXDEV,
					    "%s: '..' is refused; give a path inside the "
					    "workspace root",
					    path);
		if (n > NAME_MAX)
			return cb_error_set(ENAMETOOLONG, "%.64s...: a name longer than %d bytes",
					    path, NAME_MAX);
		s += n;
		while (*s == '/')
			s++;
	}
	return 0;
}

/* openat2 beneath dirfd through no symlink; the fd or -errno (no message). */
static int open_resolved_short(int dirfd, const char *path, int flags, mode_t mode)
{
	struct open_how how = {
	    .flags = (unsigned long long)(flags | O_CLOEXEC),
	    .mode = (flags & (O_CREAT | __O_TMPFILE)) ? mode : 0,
	    .resolve = BENEATH_RESOLVE,
	};
	long fd;
	int tries = 0;

	do
		fd = syscall(SYS_openat2, dirfd, path, &how, sizeof(how));
	while (fd < 0 && errno == EAGAIN && ++tries < BENEATH_EAGAIN_TRIES);
	return fd < 0 ? -errno : (int)fd;
}

int cb_beneath_near(int root, const char *path, size_t max,
		    int (*open_dir)(int dirfd, const char *piece), const char **rest)
{
	size_t len = strlen(path);
	int fd = -1, next = 0;
	char *piece = malloc(max);

	if (!piece)
		return -ENOMEM;
	while (len >= max) {
		size_t cut = max - 1;

		while (cut > 0 && path[cut] != '/')
			cut--;
		if (cut == 0) {
			next = -ENAMETOOLONG;
			break;
		}
		memcpy(piece, path, cut);
		piece[cut] = '\0';
		if ((next = open_dir(fd < 0 ? root : fd, piece)) < 0)
			break;
		if (fd >= 0)
			close(fd);
		fd = next;
		while (path[cut] == '/')
			cut++;
		path += cut;
		len -= cut;
	}
	free(piece);
	if (next < 0) {
		if (fd >= 0)
			close(fd);
		return next;
	}
	*rest = *path ? path : ".";
	return fd;
}

static int open_resolved_dir(int dirfd, const char *piece)
{
	return open_resolved_short(dirfd, piece, O_PATH | O_DIRECTORY, 0);
}

/* open_resolved_short for a path of any length: a longer path than one syscall takes is
 * walked in pieces, each opened beneath the last under the same resolve rules (no "..":
 * every piece stays beneath dirfd). */
static int open_resolved(int dirfd, const char *path, int flags, mode_t mode)
{
	const char *rest;
	int fd, ret;

	if (strlen(path) < PATH_MAX)
		return open_resolved_short(dirfd, path, flags, mode);
	if ((fd = cb_beneath_near(dirfd, path, PATH_MAX, open_resolved_dir, &rest)) < 0)
		return fd;
	ret = open_resolved_short(fd, rest, flags, mode);
	close(fd);
	return ret;
}

int cb_beneath_parent(int root, const char *path, const char **name)
{
	const char *slash;
	char *dir;
	int fd, ret;

	*name = NULL;
	if ((ret = cb_beneath_check(path)) < 0)
		return ret;
	slash = strrchr(path, '/');
	*name = slash ? slash + 1 : path;
	if (!**name || !strcmp(*name, "."))
		return cb_error_set(EINVAL, "%s: names no entry (ends with '/' or '.')", path);
	if (!slash) {
		fd = open_resolved(root, ".", O_PATH | O_DIRECTORY, 0);
		return fd < 0 ? cb_beneath_fail("open", ".", -fd) : fd;
	}
	dir = strndup(path, (size_t)(slash - path));
	if (!dir)
		return cb_error_set(ENOMEM, "%s: out of memory", path);
	fd = open_resolved(root, dir, O_PATH | O_DIRECTORY, 0);
	free(dir);
	return fd < 0 ? cb_beneath_fail("open", path, -fd) : fd;
}

int cb_beneath_stat(int root, const char *path, struct stat *st)
{
	const char *name;
	int pfd, ret = 0;

	if (path && !strcmp(path, "."))
		return fstat(root, st) < 0 ? cb_beneath_fail("stat", path, errno) : 0;
	if ((pfd = cb_beneath_parent(root, path, &name)) < 0)
		return pfd;
	if (fstatat(pfd, name, st, AT_SYMLINK_NOFOLLOW) < 0)
		ret = cb_beneath_fail("stat", path, errno);
	close(pfd);
	return ret;
}

/* Refuse what open must not reach: only regular files (or directories with O_DIRECTORY). */
static int open_type_ok(const char *path, const struct stat *st, int flags)
{
	if (S_ISREG(st->st_mode) || ((flags & O_DIRECTORY) && S_ISDIR(st->st_mode)))
		return 0;
	if (S_ISDIR(st->st_mode))
		return cb_error_set(EISDIR, "open %s: a directory, not a file", path);
	return cb_error_set(EINVAL, "open %s: %s; cowbox reads and writes regular files only", path,
			    type_name(st->st_mode));
}

/* A FIFO with no reader (or a device) said ENXIO to a non-blocking open. */
static int not_a_file(const char *path)
{
	return cb_error_set(EINVAL,
			    "open %s: a FIFO or device; cowbox reads and writes regular "
			    "files only",
			    path);
}

int cb_beneath_open(int root, const char *path, int flags, mode_t mode)
{
	int want_nonblock = flags & O_NONBLOCK, fd = -1, pfd = -1, ret;
	const char *name;
	struct stat st;

	if ((ret = cb_beneath_check(path)) < 0)
		return ret;
	if (flags & O_PATH) {
		fd = open_resolved(root, path, flags, 0);
		return fd < 0 ? cb_beneath_fail("open", path, -fd) : fd;
	}
	flags |= O_NONBLOCK | O_NOCTTY | O_CLOEXEC;
	if (flags & O_CREAT) {
		if ((pfd = cb_beneath_parent(root, path, &name)) < 0)
			return pfd;
		/* Look before opening: an existing FIFO or device is never opened at all. */
		if (fstatat(pfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISREG(st.st_mode) &&
		    !(S_ISLNK(st.st_mode) && (flags & O_EXCL))) {
			ret = S_ISLNK(st.st_mode) ? cb_beneath_fail("open", path, ELOOP)
						  : open_type_ok(path, &st, flags & ~O_DIRECTORY);
			goto out;
		}
		fd = openat(pfd, name, flags | O_NOFOLLOW, mode & ~(mode_t)BENEATH_SETID);
		if (fd < 0) {
			ret = errno == ENXIO ? not_a_file(path)
					     : cb_beneath_fail("open", path, errno);
			goto out;
		}
	} else {
		int probe = open_resolved(root, path, O_PATH, 0);

		if (probe < 0) {
			ret = cb_beneath_fail("open", path, -probe);
			goto out;
		}
		ret = fstat(probe, &st) < 0 ? cb_beneath_fail("stat", path, errno)
					    : open_type_ok(path, &st, flags);
		close(probe);
		if (ret < 0)
			goto out;
		fd = open_resolved(root, path, flags, 0);
		if (fd < 0) {
			ret = fd == -ENXIO ? not_a_file(path) : cb_beneath_fail("open", path, -fd);
			goto out;
		}
	}
	/* Swapped for something else between the look and the open: O_NONBLOCK kept the open
	 * from blocking, and this refuses what it opened. */
	if (fstat(fd, &st) < 0) {
		ret = cb_beneath_fail("stat", path, errno);
		goto out;
	}
	if ((ret = open_type_ok(path, &st, flags)) < 0)
		goto out;
	if (!want_nonblock && fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) < 0) {
		ret = cb_beneath_fail("open", path, errno);
		goto out;
	}
	ret = fd;
	fd = -1;
out:
	if (fd >= 0)
		close(fd);
	if (pfd >= 0)
		close(pfd);
	return ret;
}

int cb_beneath_mkdir(int root, const char *path, mode_t mode)
{
	const char *name;
	int pfd = cb_beneath_parent(root, path, &name), ret = 0;

	if (pfd < 0)
		return pfd;
	if (mkdirat(pfd, name, mode & ~(mode_t)BENEATH_SETID) < 0)
		ret = cb_beneath_fail("mkdir", path, errno);
	close(pfd);
	return ret;
}

int cb_beneath_mkdirs(int root, const char *path, mode_t mode)
{
	const char *s;
	char comp[NAME_MAX + 1];
	int dir, ret;

	if ((ret = cb_beneath_check(path)) < 0)
		return ret;
	if ((dir = open_resolved(root, ".", O_PATH | O_DIRECTORY, 0)) < 0)
		return cb_beneath_fail("mkdir", path, -dir);
	/* One component at a time from a held directory fd: what was checked is what is used. */
	for (s = path; *s;) {
		size_t n = strcspn(s, "/");
		int next;

		memcpy(comp, s, n);
		comp[n] = '\0';
		s += n;
		while (*s == '/')
			s++;
		if (!n || !strcmp(comp, "."))
			continue;
		next = open_resolved(dir, comp, O_PATH | O_DIRECTORY, 0);
		if (next == -ENOENT) {
			if (mkdirat(dir, comp, mode & ~(mode_t)BENEATH_SETID) < 0 &&
			    errno != EEXIST) {
				ret = cb_beneath_fail("mkdir", path, errno);
				break;
			}
			next = open_resolved(dir, comp, O_PATH | O_DIRECTORY, 0);
		}
		if (next < 0) {
			ret = cb_beneath_fail("mkdir", path, -next);
			break;
		}
		close(dir);
		dir = next;
	}
	close(dir);
	return ret;
}

int cb_beneath_mknod(int root, const char *path, mode_t mode, dev_t dev)
{
	const char *name;
	int pfd = cb_beneath_parent(root, path, &name), ret = 0;

	if (pfd < 0)
		return pfd;
	if (mknodat(pfd, name, mode & ~(mode_t)BENEATH_SETID, dev) < 0)
		ret = cb_beneath_fail("mknod", path, errno);
	close(pfd);
	return ret;
}

int cb_beneath_symlink(int root, const char *target, const char *path)
{
	const char *name;
	int pfd = cb_beneath_parent(root, path, &name), ret = 0;

	if (pfd < 0)
		return pfd;
	if (symlinkat(target, pfd, name) < 0)
		ret = cb_beneath_fail("symlink", path, errno);
	close(pfd);
	return ret;
}

int cb_beneath_readlink(int root, const char *path, char *buf, size_t size)
{
	const char *name;
	int pfd = cb_beneath_parent(root, path, &name);
	ssize_t n;

	if (pfd < 0)
		return pfd;
	n = size ? readlinkat(pfd, name, buf, size - 1) : -1;
	if (n < 0) {
		int err = size ? errno : EINVAL;

		close(pfd);
		if (err == EINVAL)
			return cb_error_set(EINVAL, "readlink %s: not a symlink (any more)", path);
		return cb_beneath_fail("readlink", path, err);
	}
	buf[n] = '\0';
	close(pfd);
	return (int)n;
}

/* mode without the setuid/setgid bits that st's owner may not have (see cb_beneath_setid).
 * A directory's setgid only passes its group on to new entries: it is kept. */
static mode_t setid_filter(mode_t mode, const struct stat *st, const struct cb_beneath_setid *s)
{
	int uid_in = s && s->count && st->st_uid >= s->first && st->st_uid - s->first < s->count;
	int gid_in = s && s->count && st->st_gid >= s->first && st->st_gid - s->first < s->count;

	if (!uid_in || S_ISDIR(st->st_mode))
		mode &= ~(mode_t)S_ISUID;
	if (!gid_in && !S_ISDIR(st->st_mode))
		mode &= ~(mode_t)S_ISGID;
	return mode;
}

/* chmod of the inode an O_PATH fd holds (never a symlink: checked by the caller). */
static int chmod_pinned(int fd, mode_t mode)
{
	char proc[64];

	if (!chmod_fallback()) {
		if (syscall(SYS_fchmodat2, fd, "", mode, AT_EMPTY_PATH) == 0)
			return 0;
		if (errno != ENOSYS)
			return -errno;
	}
	/* Before fchmodat2 (Linux 6.6): the fd's /proc link reaches exactly the pinned inode,
	 * whatever the name in its directory points to now. */
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
	return chmod(proc, mode) < 0 ? -errno : 0;
}

int cb_beneath_chmod(int root, const char *path, mode_t mode, const struct cb_beneath_setid *setid)
{
	const char *name;
	struct stat st;
	int pfd, fd = -1, ret;

	if (path && !strcmp(path, ".")) {
		if (fstat(root, &st) < 0)
			return cb_beneath_fail("chmod", path, errno);
		ret = chmod_pinned(root, setid_filter(mode, &st, setid));
		return ret < 0 ? cb_beneath_fail("chmod", path, -ret) : 0;
	}
	if ((pfd = cb_beneath_parent(root, path, &name)) < 0)
		return pfd;
	fd = openat(pfd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		ret = cb_beneath_fail("chmod", path, errno);
		goto out;
	}
	if (fstat(fd, &st) < 0) {
		ret = cb_beneath_fail("chmod", path, errno);
		goto out;
	}
	if (S_ISLNK(st.st_mode)) {
		ret = cb_error_set(ELOOP, "chmod %s: a symlink (not followed)", path);
		goto out;
	}
	ret = chmod_pinned(fd, setid_filter(mode, &st, setid));
	if (ret < 0)
		ret = cb_beneath_fail("chmod", path, -ret);
out:
	if (fd >= 0)
		close(fd);
	close(pfd);
	return ret;
}

int cb_beneath_fchmod(int fd, const char *path, mode_t mode, const struct cb_beneath_setid *setid)
{
	struct stat st;

	if (fstat(fd, &st) < 0 || fchmod(fd, setid_filter(mode, &st, setid)) < 0)
		return cb_beneath_fail("chmod", path, errno);
	return 0;
}

int cb_beneath_chown(int root, const char *path, uid_t uid, gid_t gid)
{
	const char *name;
	int pfd = cb_beneath_parent(root, path, &name), ret = 0;

	if (pfd < 0)
		return pfd;
	if (fchownat(pfd, name, uid, gid, AT_SYMLINK_NOFOLLOW) < 0)
		ret = cb_beneath_fail("chown", path, errno);
	close(pfd);
	return ret;
}

int cb_beneath_utimens(int root, const char *path, const struct timespec ts[2])
{
	const char *name;
	int pfd = cb_beneath_parent(root, path, &name), ret = 0;

	if (pfd < 0)
		return pfd;
	if (utimensat(pfd, name, ts, AT_SYMLINK_NOFOLLOW) < 0)
		ret = cb_beneath_fail("utimens", path, errno);
	close(pfd);
	return ret;
}

int cb_beneath_rename(int root, const char *from, const char *to, unsigned flags)
{
	const char *fname, *tname;
	int fpd = cb_beneath_parent(root, from, &fname), tpd = -1, ret = 0;

	if (fpd < 0)
		return fpd;
	if ((tpd = cb_beneath_parent(root, to, &tname)) < 0) {
		ret = tpd;
		goto out;
	}
	if (syscall(SYS_renameat2, fpd, fname, tpd, tname, flags) < 0)
		ret = cb_error_set(errno, "rename %s to %s: %s", from, to, strerror(errno));
out:
	if (tpd >= 0)
		close(tpd);
	close(fpd);
	return ret;
}

int cb_beneath_unlink(int root, const char *path, int flags)
{
	const char *name;
	int pfd = cb_beneath_parent(root, path, &name), ret = 0;

	if (pfd < 0)
		return pfd;
	if (unlinkat(pfd, name, flags) < 0)
		ret = cb_beneath_fail(flags & AT_REMOVEDIR ? "rmdir" : "unlink", path, errno);
	close(pfd);
	return ret;
}

int cb_beneath_read_file(int root, const char *path, off_t off, size_t max, void **data, size_t *n,
			 off_t *size)
{
	size_t have = 0, cap;
	char *buf = NULL;
	struct stat st;
	int fd, ret = 0;

	*data = NULL;
	*n = 0;
	if (off < 0)
		return cb_error_set(EINVAL, "read %s: negative offset", path);
	if ((fd = cb_beneath_open(root, path, O_RDONLY, 0)) < 0)
		return fd;
	if (fstat(fd, &st) < 0) {
		ret = cb_beneath_fail("read", path, errno);
		goto out;
	}
	*size = st.st_size;
	/* Sized for what the file holds now; it may grow while it is read. */
	cap = st.st_size > off ? (size_t)(st.st_size - off) : 0;
	cap = (cap < max ? cap : max) + 1;
	if (!(buf = malloc(cap))) {
		ret = cb_error_set(ENOMEM, "read %s: out of memory", path);
		goto out;
	}
	while (have < max) {
		size_t room;
		ssize_t r;

		if (have + 1 == cap) {
			char *grown = realloc(buf, cap * 2);

			if (!grown) {
				ret = cb_error_set(ENOMEM, "read %s: out of memory", path);
				goto out;
			}
			buf = grown;
			cap *= 2;
		}
		room = cap - 1 - have < max - have ? cap - 1 - have : max - have;
		r = pread(fd, buf + have, room, off + (off_t)have);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			ret = cb_beneath_fail("read", path, errno);
			goto out;
		}
		if (r == 0)
			break;
		have += (size_t)r;
	}
	buf[have] = '\0';
	*data = buf;
	*n = have;
	buf = NULL;
out:
	free(buf);
	close(fd);
	return ret;
}

int cb_beneath_write_file(int root, const char *path, off_t off, const void *data, size_t len,
			  int truncate, mode_t mode)
{
	const char *slash = path ? strrchr(path, '/') : NULL;
	size_t done = 0;
	int fd, ret = 0;

	if (off < 0)
		return cb_error_set(EINVAL, "write %s: negative offset", path);
	if ((ret = cb_beneath_check(path)) < 0)
		return ret;
	if (slash) {
		char *dir = strndup(path, (size_t)(slash - path));

		if (!dir)
			return cb_error_set(ENOMEM, "write %s: out of memory", path);
		ret = cb_beneath_mkdirs(root, dir, 0755);
		free(dir);
		if (ret < 0)
			return cb_error_wrap(ret, "write %s", path);
	}
	fd = cb_beneath_open(root, path, O_WRONLY | O_CREAT | (truncate ? O_TRUNC : 0),
			     mode ? mode : 0644);
	if (fd < 0)
		return fd;
	while (done < len) {
		ssize_t w = pwrite(fd, (const char *)data + done, len - done, off + (off_t)done);

		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0) {
			ret = cb_beneath_fail("write", path, errno);
			break;
		}
		done += (size_t)w;
	}
	if (close(fd) < 0 && !ret)
		ret = cb_beneath_fail("write", path, errno);
	return ret;
}

int cb_beneath_gone(int err)
{
	if (err < 0)
		err = -err;
	return err == ENOENT || err == ENOTDIR || err == ELOOP || err == EXDEV;
}

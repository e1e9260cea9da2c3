/* The upper layer's on-disk format, the same as overlayfs's: whiteouts are 0/0 character
 * devices, opaque directories carry trusted.overlay.opaque="y". */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "ov.h"

/* Whether a node of this mode and device number would be a whiteout. */
int ov_node_is_whiteout(mode_t mode, dev_t rdev)
{
	return S_ISCHR(mode) && rdev == makedev(0, 0);
}

/* Whether st describes a whiteout. */
int ov_is_whiteout(const struct stat *st)
{
	return ov_node_is_whiteout(st->st_mode, st->st_rdev);
}

/* lstat of path relative to a layer root; 0 or -errno. */
int ov_lstat(int rootfd, const char *path, struct stat *st)
{
	if (ov_fstatat(rootfd, path, st, AT_SYMLINK_NOFOLLOW) < 0)
		return -errno;
	return 0;
}

/* 1 if the directory at path (relative to the layer root rootfd) is opaque, 0 if not; errors
 * count as not opaque. */
int ov_is_opaque(int rootfd, const char *path)
{
	char *full, v[2];
	int held, r;

	if (ov_proc_path(rootfd, path, &full, &held) < 0)
		return 0;
	r = lgetxattr(full, OV_OPAQUE_XATTR, v, sizeof(v)) == 1 && v[0] == 'y';
	ov_proc_path_free(full, held);
	return r;
}

/* Marks the directory at path opaque; 0 or -errno. */
int ov_set_opaque(int rootfd, const char *path)
{
	char *full;
	int held, r = ov_proc_path(rootfd, path, &full, &held);

	if (r < 0)
		return r;
	r = lsetxattr(full, OV_OPAQUE_XATTR, "y", 1, 0) < 0 ? -errno : 0;
	ov_proc_path_free(full, held);
	return r;
}

/* Creates a whiteout at path, where nothing may exist; 0 or -errno. */
int ov_make_whiteout(int rootfd, const char *path)
{
	return ov_mknodat(rootfd, path, S_IFCHR | 0, makedev(0, 0)) < 0 ? -errno : 0;
}

/* Atomically replaces the non-directory at path with a whiteout (a crash leaves either the
 * old file or the whiteout, never neither); 0 or -errno. */
int ov_whiteout_replace(int rootfd, const char *path)
{
	static _Atomic unsigned long counter;
	char *tmp;
	const char *slash = strrchr(path, '/');
	int dirlen = slash ? (int)(slash - path) + 1 : 0, r;

	if (asprintf(&tmp, "%.*s.cbwh.%d.%lu", dirlen, path, (int)getpid(),
		     (unsigned long)atomic_fetch_add(&counter, 1)) < 0)
		return -ENOMEM;
	r = ov_make_whiteout(rootfd, tmp);
	if (r == 0 && ov_renameat(rootfd, tmp, path, 0) < 0) {
		r = -errno;
		ov_unlinkat(rootfd, tmp, 0);
	}
	free(tmp);
	return r;
}

/* Removes every whiteout in the upper directory at path, so that an empty-looking directory
 * can be removed or replaced. Returns 0, -ENOTEMPTY if something else is in it, or -errno. */
int ov_clear_whiteouts(int rootfd, const char *path)
{
	int fd = ov_openat(rootfd, path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC, 0), r = 0;
	DIR *d;
	struct dirent *de;

	if (fd < 0)
		return -errno;
	d = fdopendir(fd);
	if (!d) {
		r = -errno;
		close(fd);
		return r;
	}
	while ((de = readdir(d))) {
		struct stat st;
		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		if (fstatat(fd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
			r = -errno;
			break;
		}
		if (!ov_is_whiteout(&st)) {
			r = -ENOTEMPTY;
			break;
		}
		if (unlinkat(fd, de->d_name, 0) < 0) {
			r = -errno;
			break;
		}
	}
	closedir(d);
	return r;
}

/* Whether an xattr name belongs to the overlay itself, which programs neither see nor set. */
int ov_name_is_private(const char *xattr_name)
{
	return strncmp(xattr_name, OV_PRIVATE_PREFIX, sizeof(OV_PRIVATE_PREFIX) - 1) == 0;
}

/* The last component of a relative path. */
const char *ov_base_name(const char *path)
{
	const char *s = strrchr(path, '/');

	return s ? s + 1 : path;
}

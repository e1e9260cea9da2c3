/* Whole trees beneath a root, by directory fd and never by whole path (a tree can be deeper
 * than PATH_MAX): the walk and rm -rf, through no symlink and into no other mount. */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "util/beneath.h"

/* rm -rf of name in the directory dirfd (on device dev); path is for messages. Each level is
 * entered through an fd of the directory itself, so a symlink swapped in for it meanwhile is
 * at most unlinked, never walked. */
static int remove_at(int parent, const char *name, dev_t dev, const char *path)
{
	struct dirent *de;
	struct stat st;
	DIR *dir;
	int fd, ret = 0;

	if (unlinkat(parent, name, 0) == 0 || errno == ENOENT)
		return 0;
	if (errno != EISDIR && errno != EPERM)
		return cb_beneath_fail("remove", path, errno);
	fd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0) {
		/* Replaced by a non-directory since the unlink: try once more. */
		if ((errno == ENOTDIR || errno == ELOOP) && unlinkat(parent, name, 0) == 0)
			return 0;
		return errno == ENOENT ? 0 : cb_beneath_fail("remove", path, errno);
	}
	if (fstat(fd, &st) < 0)
		ret = cb_beneath_fail("remove", path, errno);
	else if (st.st_dev != dev)
		ret =
		    cb_error_set(EBUSY, "remove %s: %s is another mount; not entered", path, name);
	if (ret) {
		close(fd);
		return ret;
	}
	dir = fdopendir(fd);
	if (!dir) {
		close(fd);
		return cb_beneath_fail("remove", path, errno);
	}
	while (!ret && (errno = 0, de = readdir(dir))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		ret = remove_at(dirfd(dir), de->d_name, dev, path);
	}
	closedir(dir);
	if (!ret && unlinkat(parent, name, AT_REMOVEDIR) < 0 && errno != ENOENT)
		ret = cb_beneath_fail("remove", path, errno);
	return ret;
}

struct walk {
	int (*visit)(int dirfd, const char *name, const char *path, const struct stat *st,
		     void *arg);
	void *arg;
	dev_t dev;
	char *path; /* the path of the directory being read, grown as the walk goes down */
	size_t cap;
};

static int walk_dir(struct walk *w, int fd, size_t len)
{
	DIR *dir = fdopendir(fd);
	struct dirent *de;
	int ret = 0;

	if (!dir) {
		ret = cb_beneath_fail("walk", len ? w->path : ".", errno);
		close(fd);
		return ret;
	}
	while (!ret && (errno = 0, de = readdir(dir))) {
		size_t l = strlen(de->d_name), at = len ? len + 1 : 0;
		struct stat st;
		int sub;

		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (at + l + 1 > w->cap) {
			size_t cap = (at + l + 1) * 2;
			char *grown = realloc(w->path, cap);

			if (!grown) {
				ret = cb_error_set(ENOMEM, "walk: out of memory");
				break;
			}
			w->path = grown;
			w->cap = cap;
		}
		if (len)
			w->path[len] = '/';
		memcpy(w->path + at, de->d_name, l + 1);
		if (fstatat(dirfd(dir), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
			if (errno != ENOENT) /* gone meanwhile: nothing to visit */
				ret = cb_beneath_fail("walk", w->path, errno);
			continue;
		}
		ret = w->visit(dirfd(dir), de->d_name, w->path, &st, w->arg);
		if (ret || !S_ISDIR(st.st_mode) || st.st_dev != w->dev)
			continue;
		sub = openat(dirfd(dir), de->d_name,
			     O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
		if (sub < 0) {
			if (errno != ENOENT)
				ret = cb_beneath_fail("walk", w->path, errno);
			continue;
		}
		ret = walk_dir(w, sub, at + l);
		w->path[len] = '\0';
	}
	if (!ret && errno)
		ret = cb_beneath_fail("walk", len ? w->path : ".", errno);
	closedir(dir);
	return ret;
}

/* See beneath.h. */
int cb_beneath_walk(int root,
		    int (*visit)(int dirfd, const char *name, const char *path,
				 const struct stat *st, void *arg),
		    void *arg)
{
	struct walk w = {.visit = visit, .arg = arg};
	struct stat st;
	int fd = openat(root, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC), ret;

	if (fd < 0)
		return cb_beneath_fail("walk", ".", errno);
	if (fstat(fd, &st) < 0) {
		ret = cb_beneath_fail("walk", ".", errno);
		close(fd);
		return ret;
	}
	w.dev = st.st_dev;
	ret = walk_dir(&w, fd, 0);
	free(w.path);
	return ret;
}

/* See beneath.h. */
int cb_beneath_remove_tree(int root, const char *path)
{
	const char *name;
	struct stat st;
	int pfd = cb_beneath_parent(root, path, &name), ret;

	if (pfd < 0)
		return cb_beneath_gone(pfd) ? 0 : pfd;
	if (fstat(pfd, &st) < 0)
		ret = cb_beneath_fail("remove", path, errno);
	else
		ret = remove_at(pfd, name, st.st_dev, path);
	close(pfd);
	return ret;
}

/* The host id range of a workspace's sandbox: 65536 uids/gids of its own, [base, base+65536),
 * allocated once under a lock of $COWBOX_HOME and kept in <workspace dir>/ids. */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "cowbox/workspace.h"
#include "util/beneath.h"
#include "util/smallfile.h"

/* 1 if base is a slot of the id range (CB_WS_IDS_* in cowbox/workspace.h). */
static int cb_ws_ids_valid(unsigned long base)
{
	return base >= CB_WS_IDS_FIRST && base % CB_WS_IDS_SIZE == 0 &&
	       base + CB_WS_IDS_SIZE <= CB_WS_IDS_END;
}

/* Reads the base kept in dir: 0 with *base set, -ENOENT when there is none yet. */
static int ids_read(const char *dir, unsigned long *base)
{
	char buf[32], *end;
	int n = cb_smallfile_read(dir, "ids", buf, sizeof(buf));

	if (n == 0)
		return cb_error_set(EINVAL, "%s/ids: empty", dir);
	if (n < 0)
		return n;
	*base = strtoul(buf, &end, 10);
	if ((*end && *end != '\n') || !cb_ws_ids_valid(*base))
		return cb_error_set(EINVAL, "%s/ids: '%s' is not an id range base", dir, buf);
	return 0;
}

int cb_ws_ids_get(const char *dir, unsigned long *base)
{
	*base = 0;
	return ids_read(dir, base);
}

/* The lowest slot no workspace under home/workspaces holds. */
static int ids_pick(const char *home, unsigned long *base)
{
	char path[4096];
	size_t nslots = (CB_WS_IDS_END - CB_WS_IDS_FIRST) / CB_WS_IDS_SIZE;
	unsigned char *used = calloc(nslots, 1);
	DIR *d;
	struct dirent *de;
	int rc = 0;

	if (!used)
		return cb_error_set(ENOMEM, "out of memory");
	snprintf(path, sizeof(path), "%s/workspaces", home);
	d = opendir(path);
	while (d && (de = readdir(d))) {
		unsigned long b;
		if (de->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "%s/workspaces/%s", home, de->d_name);
		if (ids_read(path, &b) == 0)
			used[(b - CB_WS_IDS_FIRST) / CB_WS_IDS_SIZE] = 1;
	}
	if (d)
		closedir(d);
	cb_error_clear();
	size_t i = 0;
	while (i < nslots && used[i])
		i++;
	if (i == nslots)
		rc = cb_error_set(ENOSPC, "no free id range left for a workspace (%zu in use)",
				  nslots);
	else
		*base = CB_WS_IDS_FIRST + i * CB_WS_IDS_SIZE;
	free(used);
	return rc;
}

int cb_ws_ids_ensure(const char *dir, unsigned long *base)
{
	char *home = NULL, lock[4096], text[32];
	int lock_fd = -1, rc;

	if ((rc = cb_ws_ids_get(dir, base)) != -ENOENT)
		return rc;
	if ((rc = cb_ws_home(&home)) < 0)
		return rc;
	snprintf(lock, sizeof(lock), "%s/ids.lock", home);
	lock_fd = open(lock, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (lock_fd < 0 || flock(lock_fd, LOCK_EX) < 0) {
		rc = cb_error_set(errno, "lock %s: %s", lock, strerror(errno));
		goto out;
	}
	/* another daemon of the same workspace may have won the race */
	if ((rc = cb_ws_ids_get(dir, base)) != -ENOENT)
		goto out;
	if ((rc = ids_pick(home, base)) < 0)
		goto out;
	snprintf(text, sizeof(text), "%lu\n", *base);
	rc = cb_smallfile_write(dir, "ids", text, 0644);
out:
	if (lock_fd >= 0)
		close(lock_fd);
	free(home);
	if (rc < 0)
		*base = 0;
	return rc;
}

/* Moves the owner of name in dirfd (stat st) into the range at *base. */
static int shift_one(int dirfd, const char *name, const char *path, const struct stat *st,
		     void *arg)
{
	unsigned long base = *(const unsigned long *)arg;
	uid_t uid = st->st_uid < CB_WS_IDS_SIZE ? (uid_t)(base + st->st_uid) : st->st_uid;
	gid_t gid = st->st_gid < CB_WS_IDS_SIZE ? (gid_t)(base + st->st_gid) : st->st_gid;

	if (uid == st->st_uid && gid == st->st_gid)
		return 0;
	/* chown clears set-id bits: the mode goes back on afterwards, now that the owner is one
	 * of the range's */
	if (fchownat(dirfd, name, uid, gid, AT_SYMLINK_NOFOLLOW) < 0 ||
	    (!S_ISLNK(st->st_mode) && (st->st_mode & 06000) &&
	     fchmodat(dirfd, name, st->st_mode & 07777, 0) < 0))
		return cb_error_set(errno, "%s: %s", path, strerror(errno));
	return 0;
}

int cb_ws_ids_shift_tree(const char *top, unsigned long base)
{
	int fd = open(top, O_RDONLY | O_DIRECTORY | O_CLOEXEC), rc;
	struct stat st;

	if (fd < 0 || fstat(fd, &st) < 0) {
		rc = cb_error_set(errno, "%s: %s", top, strerror(errno));
		goto out;
	}
	rc = shift_one(fd, ".", top, &st, &base);
	if (!rc)
		rc = cb_beneath_walk(fd, shift_one, &base);
	if (rc)
		rc = cb_error_wrap(rc, "%s", top);
out:
	if (fd >= 0)
		close(fd);
	return rc;
}

/* The persistent home (<workspace dir>/home, /home/cowbox inside): under a disk quota it is its
 * own ext4 filesystem in <workspace dir>/home.img on a loop device, capped at the quota. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"
#include "cowbox/error.h"
#include "util/beneath.h"
#include "util/loopfs.h"

#define HOME_EXT4_MAGIC 0xEF53
/* The home's inodes: enough for caches of many small files, few enough that the inode tables
 * of a 10 GiB default cost little (they are never zeroed: lazy init, noinit_itable). */
#define HOME_MAX_INODES 262144ULL

unsigned long long cb_backend_home_cap(const struct cb_backend_options *o)
{
	struct cb_backend_limits lim;

	cb_backend_limits_of(o, &lim);
	return lim.home_bytes;
}

/* Is dir/home a mount of an ext4 (the image's) rather than the plain directory? */
static int home_mounted(const char *dir, const char *home)
{
	(void)dir;
	return cb_loopfs_mounted(home);
}

/* The image on a loop device at home, sticky and writable by all, like /tmp: any user
 * option's user keeps its files there. */
static int home_mount(const char *img, const char *home)
{
	int rc = cb_loopfs_mount("home", img, home);

	if (!rc && chmod(home, 01777) < 0)
		rc = cb_error_set(errno, "home: chmod %s: %s", home, strerror(errno));
	return rc;
}

/* A home made before it had a cap (a plain directory with files): its files are moved into
 * the new filesystem by cp -a while no command runs (the daemon is starting its backend). */
static int home_migrate(const char *old, const char *home)
{
	char src[4300];
	int status = 0;
	pid_t pid;

	snprintf(src, sizeof(src), "%.4200s/.", old);
	char *argv[] = {"cp", "-a", "--no-dereference", src, (char *)home, NULL};
	if ((pid = fork()) == 0) {
		execvp("cp", argv);
		_exit(127);
	}
	if (pid < 0)
		return cb_error_set(errno, "home: fork for cp: %s", strerror(errno));
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	if (!WIFEXITED(status) || WEXITSTATUS(status))
		return cb_error_set(ENOSPC,
				    "home: copying the old home %s into its capped filesystem "
				    "failed (does it hold more than the disk quota?)",
				    old);
	return 0;
}

int cb_backend_home_ready(struct cb_backend *b)
{
	unsigned long long cap = cb_backend_home_cap(&b->opt);
	char home[4200], img[4200], lock[4200], old[4200];
	int rc = 0, lockfd = -1, fresh = 0;
	struct stat st;

	snprintf(home, sizeof(home), "%s/home", b->dir);
	if (mkdir(home, 0700) < 0 && errno != EEXIST)
		return cb_error_set(errno, "mkdir %s: %s", home, strerror(errno));
	if (!cap || geteuid() != 0) {
		/* no quota, or no root to mount with: a plain directory (docs/security.md) */
		if (!home_mounted(b->dir, home) && chmod(home, 01777) < 0)
			return cb_error_set(errno, "chmod %s: %s", home, strerror(errno));
		return 0;
	}
	if (home_mounted(b->dir, home))
		return 0;
	snprintf(img, sizeof(img), "%s/home.img", b->dir);
	snprintf(lock, sizeof(lock), "%s/home.lock", b->dir);
	/* the daemon and cowbox exec REF (join) may both get here: one mounts */
	if ((lockfd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600)) < 0 ||
	    flock(lockfd, LOCK_EX) < 0) {
		rc = cb_error_set(errno, "home: lock %s: %s", lock, strerror(errno));
		goto out;
	}
	if (home_mounted(b->dir, home))
		goto out;
	if (lstat(img, &st) < 0) {
		struct cb_backend_limits lim;
		unsigned long long inodes;
		cb_backend_limits_of(&b->opt, &lim);
		inodes = lim.disk_inodes;
		if (inodes > HOME_MAX_INODES || !inodes)
			inodes = HOME_MAX_INODES;
		if (inodes > cap / 16384) /* one per 16 KiB at most: room for the tables */
			inodes = cap / 16384;
		if (inodes < 1024)
			inodes = 1024;
		if ((rc = cb_loopfs_make("home", img, cap, inodes)) < 0)
			goto out;
		fresh = 1;
	} else if (!S_ISREG(st.st_mode)) {
		rc = cb_error_set(EINVAL, "home: %s is not a regular file", img);
		goto out;
	}
	/* an old home's files: moved aside first, so the mount point is empty */
	snprintf(old, sizeof(old), "%s/home.old", b->dir);
	if (fresh && rmdir(home) < 0 && errno == ENOTEMPTY) {
		if (rename(home, old) < 0 || mkdir(home, 0700) < 0) {
			rc = cb_error_set(errno, "home: move %s aside: %s", home, strerror(errno));
			goto out;
		}
	} else if (fresh && mkdir(home, 0700) < 0 && errno != EEXIST) {
		rc = cb_error_set(errno, "mkdir %s: %s", home, strerror(errno));
		goto out;
	}
	if ((rc = home_mount(img, home)) < 0)
		goto out;
	if (fresh) {
		char lf[4300];

		snprintf(lf, sizeof(lf), "%.4200s/lost+found", home);
		rmdir(lf); /* mkfs's, empty: the home starts as empty as a plain one */
	}
	if (lstat(old, &st) == 0 && S_ISDIR(st.st_mode)) {
		if ((rc = home_migrate(old, home)) < 0)
			goto out;
		int dirfd = open(b->dir, O_PATH | O_DIRECTORY | O_CLOEXEC);

		/* the sandbox made that tree: removed beneath the workspace's directory only */
		if (dirfd < 0 || cb_beneath_remove_tree(dirfd, "home.old") < 0)
			cb_error_clear(); /* copied already; left over, it costs disk only */
		if (dirfd >= 0)
			close(dirfd);
	}
out:
	if (lockfd >= 0)
		close(lockfd);
	return rc;
}

int cb_backend_home_open(struct cb_backend *b)
{
	char home[4200];
	struct statfs fs;
	int rc, fd;

	if ((rc = cb_backend_home_ready(b)) < 0)
		return rc;
	snprintf(home, sizeof(home), "%s/home", b->dir);
	if ((fd = open(home, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0)
		return cb_error_set(errno, "home: open %s: %s", home, strerror(errno));
	/* a daemon stop may have unmounted it since: never the plain directory under a cap */
	if (cb_backend_home_cap(&b->opt) && geteuid() == 0 &&
	    (fstatfs(fd, &fs) < 0 || fs.f_type != HOME_EXT4_MAGIC)) {
		close(fd);
		return cb_error_set(ESTALE,
				    "home: %s is no longer its capped filesystem (the "
				    "workspace is stopping?)",
				    home);
	}
	return fd;
}

void cb_backend_home_release(const char *dir)
{
	char home[4200];

	snprintf(home, sizeof(home), "%s/home", dir);
	cb_loopfs_release(home); /* the loop device goes with its last user */
}

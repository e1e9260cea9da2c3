/* The upper layer under a disk quota: its own ext4 in <dir>/upper.img, mounted at <dir>/upper,
 * so that the kernel enforces the cap at write(2) and the mount keeps FUSE passthrough. */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "cowbox/workspace.h"
#include "util/beneath.h"
#include "util/loopfs.h"

/* The cap an image was made for, on the image file itself: "bytes inodes". */
#define UPPER_CAP_XATTR "user.cowbox.cap"

struct upper_paths {
	char upper[4200], img[4200], lock[4200], stage[4200], stage_img[4200], old[4200];
};

static void upper_paths_of(const char *dir, struct upper_paths *p)
{
	snprintf(p->upper, sizeof(p->upper), "%.4000s/upper", dir);
	snprintf(p->img, sizeof(p->img), "%.4000s/upper.img", dir);
	snprintf(p->lock, sizeof(p->lock), "%.4000s/upper.lock", dir);
	snprintf(p->stage, sizeof(p->stage), "%.4000s/upper.new", dir);
	snprintf(p->stage_img, sizeof(p->stage_img), "%.4000s/upper.img.new", dir);
	snprintf(p->old, sizeof(p->old), "%.4000s/upper.old", dir);
}

static int upper_lock(const struct upper_paths *p)
{
	int fd = open(p->lock, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);

	if (fd < 0 || flock(fd, LOCK_EX) < 0) {
		int rc = cb_error_set(errno, "upper: lock %s: %s", p->lock, strerror(errno));

		if (fd >= 0)
			close(fd);
		return rc;
	}
	return fd;
}

/* The cap img was made for (0 0 when there is no image or it says none). */
static void upper_image_cap(const char *img, unsigned long long *bytes, unsigned long long *inodes)
{
	char v[64];
	ssize_t n = lgetxattr(img, UPPER_CAP_XATTR, v, sizeof(v) - 1);

	*bytes = *inodes = 0;
	if (n <= 0)
		return;
	v[n] = '\0';
	if (sscanf(v, "%llu %llu", bytes, inodes) != 2)
		*bytes = *inodes = 0;
}

static int upper_empty(const char *path)
{
	DIR *d = opendir(path);
	struct dirent *de;
	int empty = 1;

	while (d && empty && (de = readdir(d)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
			empty = 0;
	if (d)
		closedir(d);
	return empty;
}

/* Removes what a migration killed midway left: the staging mount and image, and a plain
 * upper/ moved aside (kept back as upper/ when no image took its place, else deleted). */
static void upper_recover(const char *dir, const struct upper_paths *p)
{
	struct stat st;

	cb_loopfs_release(p->stage);
	rmdir(p->stage);
	unlink(p->stage_img);
	if (lstat(p->old, &st) < 0 || !S_ISDIR(st.st_mode))
		return;
	if (lstat(p->img, &st) < 0) {
		rmdir(p->upper); /* empty: the mount point made for the image */
		if (rename(p->old, p->upper) < 0)
			cb_error_clear();
		return;
	}
	int dirfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);

	/* the sandbox made that tree: removed beneath the workspace's directory only */
	if (dirfd < 0 || cb_beneath_remove_tree(dirfd, "upper.old") < 0)
		cb_error_clear(); /* copied already; left over, it costs disk only */
	if (dirfd >= 0)
		close(dirfd);
}

/* Make the staging image for the cap and mount it at the staging directory, sized so that
 * its filesystem holds the cap: ext4's tables and journal come on top (df shows the cap). */
static int upper_stage(const struct upper_paths *p, unsigned long long bytes,
		       unsigned long long inodes)
{
	unsigned long long size, ino = inodes ? inodes + 64 : bytes / 16384;
	struct statvfs sv;
	int rc;

	if (ino > bytes / 4096)
		ino = bytes / 4096; /* more would only be tables: the bytes run out first */
	if (ino < 1024)
		ino = 1024;
	/* a first guess of the tables and journal (a 10 GiB layer: 3.4%), then scaled */
	size = bytes + ino * 256 + bytes / 128;
	if (mkdir(p->stage, 0700) < 0 && errno != EEXIST)
		return cb_error_set(errno, "upper: mkdir %s: %s", p->stage, strerror(errno));
	for (int pass = 0; pass < 3; pass++) {
		unsigned long long total;

		if ((rc = cb_loopfs_make("upper", p->stage_img, size, ino)) < 0 ||
		    (rc = cb_loopfs_mount("upper", p->stage_img, p->stage)) < 0)
			return rc;
		if (statvfs(p->stage, &sv) < 0)
			return cb_error_set(errno, "upper: statvfs %s: %s", p->stage,
					    strerror(errno));
		total = (unsigned long long)sv.f_blocks * sv.f_frsize;
		/* never more than the cap, and at most 0.5% + 256 KiB below it */
		if (pass == 2 || !total ||
		    (total <= bytes && bytes - total <= bytes / 200 + (256ULL << 10)))
			break;
		/* the journal and tables change in steps: corrected by what was missed */
		size = size + bytes > total ? size + bytes - total : size / 2;
		cb_loopfs_release(p->stage);
		unlink(p->stage_img);
	}
	char lf[4300];

	snprintf(lf, sizeof(lf), "%.4200s/lost+found", p->stage);
	rmdir(lf); /* mkfs's, empty: the layer starts as empty as a plain one */
	return 0;
}

/* Put the image with that cap in place at upper/ (its files copied from the plain directory
 * or the image of another cap it was): O(what upper/ holds), once. */
static int upper_migrate(const char *dir, const struct upper_paths *p, unsigned long long bytes,
			 unsigned long long inodes, int from_image)
{
	char cap[64];
	struct stat st;
	int rc;

	if (stat(p->upper, &st) < 0)
		return cb_error_set(errno, "upper: stat %s: %s", p->upper, strerror(errno));
	if ((rc = upper_stage(p, bytes, inodes)) < 0)
		goto fail;
	if (!upper_empty(p->upper))
		rc = cb_loopfs_fill("upper", p->upper, p->stage);
	else if (chown(p->stage, st.st_uid, st.st_gid) < 0 ||
		 chmod(p->stage, st.st_mode & 07777) < 0)
		rc = cb_error_set(errno, "upper: %s: %s", p->stage, strerror(errno));
	snprintf(cap, sizeof(cap), "%llu %llu", bytes, inodes);
	if (!rc && setxattr(p->stage_img, UPPER_CAP_XATTR, cap, strlen(cap), 0) < 0)
		rc = cb_error_set(errno, "upper: mark %s: %s", p->stage_img, strerror(errno));
	if (rc)
		goto fail;
	cb_loopfs_release(p->stage);
	rmdir(p->stage);
	/* the switch: the old tree aside, the new image in place (a crash in between is what
	 * upper_recover undoes or finishes) */
	if (from_image) {
		cb_loopfs_release(p->upper);
	} else if (rename(p->upper, p->old) < 0 || mkdir(p->upper, 0700) < 0) {
		rc = cb_error_set(errno, "upper: move %s aside: %s", p->upper, strerror(errno));
		goto fail;
	}
	if (rename(p->stage_img, p->img) < 0) {
		rc = cb_error_set(errno, "upper: rename %s: %s", p->stage_img, strerror(errno));
		goto fail;
	}
	/* the image is whole (marked after the copy): unmounted, it is retried at the next
	 * start, and never the plain directory meanwhile */
	if ((rc = cb_loopfs_mount("upper", p->img, p->upper)) < 0)
		return -EIO;
	upper_recover(dir, p);
	return 0;
fail:
	upper_recover(dir, p);
	if (from_image && !cb_loopfs_mounted(p->upper) &&
	    cb_loopfs_mount("upper", p->img, p->upper) < 0)
		return -EIO; /* neither image mounted: nothing may serve upper/ */
	return rc;
}

int cb_ws_upper_image(const char *dir, unsigned long long bytes, unsigned long long inodes)
{
	const char *env = getenv("COWBOX_UPPER_IMAGE");
	unsigned long long had_bytes, had_inodes;
	struct upper_paths p;
	struct statvfs sv;
	struct stat st;
	int lockfd, rc = 1, have;

	upper_paths_of(dir, &p);
	/* no cap, or the FUSE layer's counting asked for: an image made before still holds
	 * the files (and caps them at its own size) */
	if (!bytes || (env && !strcmp(env, "0")))
		return (rc = cb_ws_upper_attach(dir, NULL)) < 0 ? rc : 0;
	if (!cb_loopfs_available()) {
		/* an image made by a root daemon holds the files: never the empty directory */
		if (cb_ws_upper_imaged(dir))
			return (rc = cb_ws_upper_attach(dir, NULL)) < 0 ? rc : 0;
		cb_error_set(EPERM, "upper: no loop devices here (not root, or no "
				    "/dev/loop-control)");
		return 0;
	}
	if ((lockfd = upper_lock(&p)) < 0)
		return lockfd;
	upper_recover(dir, &p);
	have = lstat(p.img, &st) == 0 && S_ISREG(st.st_mode);
	upper_image_cap(p.img, &had_bytes, &had_inodes);
	if (have && !cb_loopfs_mounted(p.upper)) {
		if (!upper_empty(p.upper)) {
			rc = cb_error_set(ENOTEMPTY,
					  "upper: %s holds files while its image %s is not "
					  "mounted; cowbox fsck %s names them",
					  p.upper, p.img, dir);
			goto out;
		}
		if ((rc = cb_loopfs_mount("upper", p.img, p.upper)) < 0)
			goto out;
		rc = 1;
	}
	if (have && had_bytes == bytes && had_inodes == inodes)
		goto out;
	/* none yet, or made for another cap (options changed): a new one, filled. Only where
	 * the host's filesystem has room for all of it now: a sparse image past what the disk
	 * holds would take writes the disk then cannot (EIO at writeback, not ENOSPC at
	 * write(2)), so a smaller disk is counted by the mount, which sees its ENOSPC. */
	if (statvfs(dir, &sv) == 0 &&
	    (unsigned long long)sv.f_bavail * sv.f_frsize < bytes + bytes / 16) {
		cb_error_set(ENOSPC,
			     "upper: the disk of %s has %llu MiB free, less than the quota's %llu "
			     "MiB",
			     dir, (unsigned long long)sv.f_bavail * sv.f_frsize >> 20, bytes >> 20);
		rc = 0;
		goto out;
	}
	rc = upper_migrate(dir, &p, bytes, inodes, have);
	if (rc == -EIO)
		goto out;
	rc = rc < 0 ? 0 : 1; /* a layer too full for the cap: the FUSE layer counts instead */
out:
	close(lockfd);
	return rc;
}

int cb_ws_upper_attach(const char *dir, int *attached)
{
	struct upper_paths p;
	struct stat st;
	int lockfd, rc = 0;

	if (attached)
		*attached = 0;
	upper_paths_of(dir, &p);
	if (lstat(p.img, &st) < 0 || cb_loopfs_mounted(p.upper))
		return 0;
	if (!cb_loopfs_available())
		return cb_error_set(EPERM,
				    "upper: %s is an image, and loop devices cannot be used here "
				    "(not root?)",
				    p.img);
	if ((lockfd = upper_lock(&p)) < 0)
		return lockfd;
	if (!cb_loopfs_mounted(p.upper)) {
		if (!upper_empty(p.upper))
			rc = cb_error_set(ENOTEMPTY,
					  "upper: %s holds files while its image %s is not "
					  "mounted",
					  p.upper, p.img);
		else if (!(rc = cb_loopfs_mount("upper", p.img, p.upper)) && attached)
			*attached = 1;
	}
	close(lockfd);
	return rc;
}

void cb_ws_upper_release(const char *dir)
{
	char upper[4200];

	snprintf(upper, sizeof(upper), "%.4000s/upper", dir);
	cb_loopfs_release(upper);
}

int cb_ws_upper_imaged(const char *dir)
{
	char img[4200];
	struct stat st;

	snprintf(img, sizeof(img), "%.4000s/upper.img", dir);
	return lstat(img, &st) == 0 && S_ISREG(st.st_mode);
}

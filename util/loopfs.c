/* Filesystems in image files on loop devices (see loopfs.h): the home's and the upper
 * layer's caps, enforced by the kernel at write(2) rather than counted by cowbox. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <linux/loop.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "loopfs.h"

#define LOOPFS_EXT4_MAGIC 0xEF53

int cb_loopfs_available(void)
{
	return geteuid() == 0 && access("/dev/loop-control", R_OK | W_OK) == 0;
}

/* mkfs.ext4 on the (sparse) image file of size bytes: lazy tables (never zeroed, so a
 * 10 GiB image costs a few MiB and a tenth of a second), no reserved blocks. */
static int loopfs_mkfs(const char *what, const char *img, unsigned long long bytes,
		       unsigned long long inodes)
{
	char n[32], size[32];
	int status = 0;
	pid_t pid;

	snprintf(n, sizeof(n), "%llu", inodes);
	snprintf(size, sizeof(size), "%lluk", bytes >> 10);
	char *argv[] = {"mkfs.ext4", "-q", "-F", "-m", "0", "-N", n,
			/* whatever the size, what a host's ext4 gives: 4 KiB of xattrs a file,
			 * nanosecond times (256-byte inodes; a small image would get 128) */
			"-b", "4096", "-I", "256", "-E",
			"lazy_itable_init=1,lazy_journal_init=1,nodiscard,root_owner=0:0",
			(char *)img, size, NULL};
	pid = fork();
	if (pid == 0) {
		int null = open("/dev/null", O_RDWR);

		if (null >= 0) {
			dup2(null, 0);
			dup2(null, 1);
		}
		execvp("mkfs.ext4", argv);
		execv("/usr/sbin/mkfs.ext4", argv);
		execv("/sbin/mkfs.ext4", argv);
		_exit(127);
	}
	if (pid < 0)
		return cb_error_set(errno, "%s: fork for mkfs.ext4: %s", what, strerror(errno));
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	if (!WIFEXITED(status) || WEXITSTATUS(status))
		return cb_error_set(EIO, "%s: mkfs.ext4 %s failed (status %d; install e2fsprogs)",
				    what, img, status);
	return 0;
}

int cb_loopfs_make(const char *what, const char *img, unsigned long long bytes,
		   unsigned long long inodes)
{
	int fd = open(img, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600), rc;

	if (fd < 0 || ftruncate(fd, (off_t)bytes) < 0) {
		rc = cb_error_set(errno, "%s: create %s: %s", what, img, strerror(errno));
		if (fd >= 0) {
			close(fd);
			unlink(img);
		}
		return rc;
	}
	close(fd);
	if ((rc = loopfs_mkfs(what, img, bytes, inodes)) < 0)
		unlink(img);
	return rc;
}

/* A loop device img is attached to already (its filesystem alive in some mount namespace's
 * copy of a mount we let go of): its number, else -1. */
static int loopfs_attached(int fd)
{
	struct stat st;
	glob_t g;
	int found = -1;

	if (fstat(fd, &st) < 0 || glob("/sys/block/loop*", 0, NULL, &g) != 0)
		return -1;
	for (size_t i = 0; i < g.gl_pathc && found < 0; i++) {
		struct loop_info64 info;
		char dev[64];
		int n, lfd;

		if (sscanf(g.gl_pathv[i], "/sys/block/loop%d", &n) != 1)
			continue;
		snprintf(dev, sizeof(dev), "/dev/loop%d", n);
		if ((lfd = open(dev, O_RDONLY | O_CLOEXEC)) < 0)
			continue;
		if (ioctl(lfd, LOOP_GET_STATUS64, &info) == 0 && info.lo_inode == st.st_ino &&
		    info.lo_device == st.st_dev)
			found = n;
		close(lfd);
	}
	globfree(&g);
	return found;
}

int cb_loopfs_mount(const char *what, const char *img, const char *dir)
{
	char dev[64];
	int ctl = -1, loop = -1, fd = -1, rc = 0, n;

	if ((fd = open(img, O_RDWR | O_CLOEXEC | O_NOFOLLOW)) < 0) {
		rc = cb_error_set(errno, "%s: open %s: %s", what, img, strerror(errno));
		goto out;
	}
	/* Its filesystem still alive (a copy of our old mount in another mount namespace keeps
	 * it, dirty pages and all): mounted again from the same device, it is the same
	 * filesystem; a second device would be a second ext4 on one image, each overwriting
	 * the other. */
	if ((n = loopfs_attached(fd)) >= 0) {
		snprintf(dev, sizeof(dev), "/dev/loop%d", n);
		if (mount(dev, dir, "ext4", MS_NOSUID | MS_NODEV | MS_NOATIME, "noinit_itable") ==
		    0)
			goto out;
		/* detached meanwhile (its last user went): a device of its own, below */
	}
	if ((ctl = open("/dev/loop-control", O_RDWR | O_CLOEXEC)) < 0) {
		rc = cb_error_set(errno,
				  "%s: /dev/loop-control: %s (a filesystem capped at the disk "
				  "quota is an image on a loop device)",
				  what, strerror(errno));
		goto out;
	}
	for (int tries = 0, dio = 1; tries < 16; tries++) {
		struct loop_config cfg = {.fd = (unsigned)fd};

		/* direct I/O to the image: no second copy of every page in the host's cache,
		 * and flushes that do not rewrite it all (where the host's filesystem can) */
		cfg.info.lo_flags = LO_FLAGS_AUTOCLEAR | (dio ? LO_FLAGS_DIRECT_IO : 0);
		if ((n = ioctl(ctl, LOOP_CTL_GET_FREE)) < 0) {
			rc = cb_error_set(errno, "%s: a free loop device: %s", what,
					  strerror(errno));
			goto out;
		}
		snprintf(dev, sizeof(dev), "/dev/loop%d", n);
		if ((loop = open(dev, O_RDWR | O_CLOEXEC)) < 0) {
			rc = cb_error_set(errno, "%s: open %s: %s", what, dev, strerror(errno));
			goto out;
		}
		if (ioctl(loop, LOOP_CONFIGURE, &cfg) == 0)
			break;
		if (errno == EINVAL && dio) {
			dio = 0; /* the image's filesystem has no O_DIRECT: through its cache */
			rc = 0;
		} else
			rc = errno == EBUSY ? 0
					    : cb_error_set(errno, "%s: attach %s to %s: %s", what,
							   img, dev, strerror(errno));
		close(loop);
		loop = -1;
		if (rc)
			goto out; /* EBUSY: another process took it meanwhile; the next one */
	}
	if (loop < 0) {
		rc = cb_error_set(EBUSY, "%s: no free loop device for %s", what, img);
		goto out;
	}
	if (mount(dev, dir, "ext4", MS_NOSUID | MS_NODEV | MS_NOATIME, "noinit_itable") < 0)
		rc = cb_error_set(errno, "%s: mount %s (%s) at %s: %s", what, img, dev, dir,
				  strerror(errno));
out:
	if (loop >= 0)
		close(loop); /* the mount holds the device; autoclear frees it with the mount */
	if (ctl >= 0)
		close(ctl);
	if (fd >= 0)
		close(fd);
	return rc;
}

int cb_loopfs_mounted(const char *dir)
{
	char parent[4200];
	struct stat sp, sd;
	struct statfs fs;

	snprintf(parent, sizeof(parent), "%s/..", dir);
	return stat(parent, &sp) == 0 && lstat(dir, &sd) == 0 && S_ISDIR(sd.st_mode) &&
	       sp.st_dev != sd.st_dev && statfs(dir, &fs) == 0 && fs.f_type == LOOPFS_EXT4_MAGIC;
}

void cb_loopfs_release(const char *dir)
{
	if (cb_loopfs_mounted(dir))
		umount2(dir, MNT_DETACH);
}

int cb_loopfs_fill(const char *what, const char *src, const char *dst)
{
	char from[4300];
	int status = 0;
	pid_t pid;

	snprintf(from, sizeof(from), "%.4200s/.", src);
	char *argv[] = {"cp", "-a", "--no-dereference", from, (char *)dst, NULL};
	if ((pid = fork()) == 0) {
		execvp("cp", argv);
		_exit(127);
	}
	if (pid < 0)
		return cb_error_set(errno, "%s: fork for cp: %s", what, strerror(errno));
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	if (!WIFEXITED(status) || WEXITSTATUS(status))
		return cb_error_set(ENOSPC,
				    "%s: copying %s into its capped filesystem failed (does it "
				    "hold more than the disk quota?)",
				    what, src);
	return 0;
}

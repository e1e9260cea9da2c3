/* Mounts and daemons of workspaces as the system sees them: FUSE mounts in mountinfo, the
 * daemon holding the lock, and clearing what a daemon that died left behind. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "cowbox/workspace.h"
#include "ws.h"

/* mountinfo escapes space, tab, newline and backslash as \ooo. */
static void unescape_octal(char *s)
{
	char *w = s;

	for (char *r = s; *r; r++) {
		if (r[0] == '\\' && r[1] >= '0' && r[1] <= '7' && r[2] && r[3]) {
			*w++ = (char)((r[1] - '0') * 64 + (r[2] - '0') * 8 + (r[3] - '0'));
			r += 3;
		} else {
			*w++ = *r;
		}
	}
	*w = '\0';
}

int cb_ws_fuse_mount_source(const char *path, char *source, size_t size)
{
	FILE *f = fopen("/proc/self/mountinfo", "re");
	char *line = NULL;
	size_t cap = 0;
	int found = 0;

	if (!f)
		return 0;
	while (!found && getline(&line, &cap, f) > 0) {
		char mnt[4096], *sep = strstr(line, " - ");
		char fstype[64], src[512];

		if (!sep || sscanf(line, "%*s %*s %*s %*s %4095s", mnt) != 1 ||
		    sscanf(sep + 3, "%63s %511s", fstype, src) != 2)
			continue;
		unescape_octal(mnt);
		found = !strcmp(mnt, path) && !strncmp(fstype, "fuse", 4);
		if (found && source) {
			unescape_octal(src);
			snprintf(source, size, "%s", src);
		}
	}
	free(line);
	fclose(f);
	return found;
}

int cb_ws_is_fuse_mount(const char *path)
{
	return cb_ws_fuse_mount_source(path, NULL, 0);
}

int cb_ws_unmount(const char *path)
{
	pid_t pid;
	int status;

	if (!cb_ws_is_fuse_mount(path))
		return 0;
	if (geteuid() == 0) {
		if (umount2(path, MNT_DETACH) == 0)
			return 0;
		return cb_error_set(errno, "umount %s: %s", path, strerror(errno));
	}
	pid = fork();
	if (pid < 0)
		return cb_error_set(errno, "fork: %s", strerror(errno));
	if (pid == 0) {
		execlp("fusermount3", "fusermount3", "-u", "-z", path, (char *)NULL);
		_exit(127);
	}
	if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status))
		return cb_error_set(EBUSY, "fusermount3 -u -z %s failed", path);
	return 0;
}

/* The device minor of the FUSE mount at path (its connection's number under fusectl), or
 * -1 if there is none. */
static int fuse_mount_minor(const char *path)
{
	FILE *f = fopen("/proc/self/mountinfo", "re");
	char *line = NULL;
	size_t cap = 0;
	int minor = -1;

	while (f && minor < 0 && getline(&line, &cap, f) > 0) {
		char mnt[4096], fstype[64], *sep = strstr(line, " - ");
		unsigned maj, min;

		if (!sep || sscanf(line, "%*s %*s %u:%u %*s %4095s", &maj, &min, mnt) != 3 ||
		    sscanf(sep + 3, "%63s", fstype) != 1)
			continue;
		unescape_octal(mnt);
		if (!strcmp(mnt, path) && !strncmp(fstype, "fuse", 4))
			minor = (int)min;
	}
	free(line);
	if (f)
		fclose(f);
	return minor;
}

/* What /proc/PID/status says of pid: 0 when it is gone (errno tells why), else 1 with its
 * state letter, thread count and pending signals. */
static int pid_status(pid_t pid, char *state, int *threads, unsigned long long *pending)
{
	char path[64], line[256];
	FILE *f;

	*state = 0;
	*threads = 0;
	*pending = 0;
	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	if (!(f = fopen(path, "re")))
		return 0;
	while (fgets(line, sizeof(line), f)) {
		unsigned long long v;

		if (sscanf(line, "State: %c", state) == 1)
			continue;
		if (sscanf(line, "Threads: %d", threads) == 1)
			continue;
		if (sscanf(line, "ShdPnd: %llx", &v) == 1 || sscanf(line, "SigPnd: %llx", &v) == 1)
			*pending |= v;
	}
	fclose(f);
	return 1;
}

int cb_ws_pid_dying(pid_t pid)
{
	unsigned long long pending;
	int threads;
	char state;

	/* Gone while its lock is held: what holds it is what it left, its workers, and they
	 * only stay when they cannot exit (waiting on its dead mount). */
	if (!pid_status(pid, &state, &threads, &pending))
		return errno == ENOENT;
	/* A leader that exited while threads remain, or a SIGKILL not yet acted on. */
	return (state == 'Z' && threads > 0) || (pending & (1ULL << (SIGKILL - 1)));
}

int cb_ws_pid_serving(pid_t pid)
{
	unsigned long long pending;
	int threads;
	char state;

	if (!pid_status(pid, &state, &threads, &pending) || state == 'Z' || state == 'X')
		return 0;
	return !(pending & (1ULL << (SIGKILL - 1)));
}

int cb_ws_fuse_abort(const char *path)
{
	const char *ctl = "/sys/fs/fuse/connections";
	char abort_path[128];
	int minor = fuse_mount_minor(path), fd, rc = 0;

	if (minor < 0)
		return 0;
	snprintf(abort_path, sizeof(abort_path), "%s/%d/abort", ctl, minor);
	if (access(abort_path, F_OK) < 0 && mount("fusectl", ctl, "fusectl", 0, NULL) < 0 &&
	    errno != EBUSY)
		rc = cb_error_set(errno, "mount fusectl on %s: %s", ctl, strerror(errno));
	fd = open(abort_path, O_WRONLY | O_CLOEXEC);
	if (fd < 0 || write(fd, "1", 1) != 1)
		rc = cb_error_set(errno, "abort FUSE connection %d (%s): %s", minor, abort_path,
				  strerror(errno));
	if (fd >= 0)
		close(fd);
	/* Aborted or not, take the mount away: nothing can be served there any more. */
	if (umount2(path, MNT_DETACH) < 0 && !rc)
		rc = cb_error_set(errno, "umount %s: %s", path, strerror(errno));
	return rc;
}

/* The lock file holds "PID\nMOUNTPOINT\n", written by the daemon once it holds the flock; a
 * lock we can take ourselves means nobody is serving. */
int cb_ws_daemon(const char *ref, pid_t *pid, char **mountpoint)
{
	char *path = NULL, buf[4200];
	int fd = -1, rc;
	ssize_t n;

	*pid = 0;
	*mountpoint = NULL;
	if ((rc = cb_ws_path(ref, "lock", &path)))
		return rc;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		rc =
		    errno == ENOENT ? 0 : cb_error_set(errno, "open %s: %s", path, strerror(errno));
		goto out;
	}
	if (flock(fd, LOCK_SH | LOCK_NB) == 0)
		goto out; /* free: no daemon */
	if (errno != EWOULDBLOCK) {
		rc = cb_error_set(errno, "flock %s: %s", path, strerror(errno));
		goto out;
	}
	n = pread(fd, buf, sizeof(buf) - 1, 0);
	buf[n > 0 ? n : 0] = '\0';
	*pid = (pid_t)strtol(buf, NULL, 10);
	if (*pid <= 0)
		*pid = -1; /* held, but the daemon has not written its pid yet */
	char *nl = strchr(buf, '\n');

	if (nl && nl[1]) {
		char *end = strchr(nl + 1, '\n');

		if (end)
			*end = '\0';
		*mountpoint = strdup(nl + 1);
	}
out:
	if (fd >= 0)
		close(fd);
	free(path);
	return rc;
}

/* The mount point a dead daemon recorded in the lock, if a mount of this workspace (source
 * "cowbox:<ref>") is still there: what a crash with `mount REF DIR` leaves behind. */
char *ws_dead_mountpoint(const char *ref)
{
	char *path = NULL, buf[4200], src[512], ours[64], *mnt = NULL;
	int fd;
	ssize_t n;

	if (cb_ws_path(ref, "lock", &path))
		return NULL;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	free(path);
	if (fd < 0)
		return NULL;
	n = pread(fd, buf, sizeof(buf) - 1, 0);
	close(fd);
	buf[n > 0 ? n : 0] = '\0';
	char *nl = strchr(buf, '\n'), *end = nl ? strchr(nl + 1, '\n') : NULL;

	if (!end || nl[1] != '/')
		return NULL;
	*end = '\0';
	snprintf(ours, sizeof(ours), "cowbox:%s", ref);
	if (cb_ws_fuse_mount_source(nl + 1, src, sizeof(src)) && !strcmp(src, ours))
		mnt = strdup(nl + 1);
	return mnt;
}

int cb_ws_clear_stale(const char *ref)
{
	char *lock = NULL, *sock = NULL, *dir = NULL, *real = NULL, *mnt = NULL, *dead = NULL;
	int fd = -1, rc;

	if ((rc = cb_ws_path(ref, "lock", &lock)) ||
	    (rc = cb_ws_path(ref, "control.sock", &sock)) || (rc = cb_ws_path(ref, NULL, &dir)))
		goto out;
	fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0) {
		rc = cb_error_set(errno, "open %s: %s", lock, strerror(errno));
		goto out;
	}
	/* Holding the lock, nothing can be starting: what is left is a dead daemon's. */
	if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
		rc = errno == EWOULDBLOCK
			 ? cb_error_set(EBUSY, "workspace %s has a running daemon", ref)
			 : cb_error_set(errno, "flock %s: %s", lock, strerror(errno));
		goto out;
	}
	real = realpath(dir, NULL);
	if ((rc = ws_pathf(&mnt, "%s/mnt", real ? real : dir)) || (rc = cb_ws_unmount(mnt)))
		goto out;
	dead = ws_dead_mountpoint(ref);
	if (dead && (rc = cb_ws_unmount(dead)))
		goto out;
	if (unlink(sock) < 0 && errno != ENOENT)
		rc = cb_error_set(errno, "remove %s: %s", sock, strerror(errno));
out:
	if (fd >= 0)
		close(fd);
	free(dead);
	free(mnt);
	free(real);
	free(dir);
	free(sock);
	free(lock);
	return rc;
}

/* The exec path's look-up of a workspace whose daemon serves it: names/ links, the lock file
 * and the mount table, no SQLite (cb_ws_resolve and cb_daemon_ensure open meta.db). */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "cowbox/workspace_fast.h"
#include "ws.h"

/* The name whose names/ link points at ref, or NULL. A scan of names/: one readlink per
 * workspace, cheaper than opening meta.db until there are thousands. */
static char *name_of(const char *home, const char *ref)
{
	char *dir = NULL, *found = NULL;
	if (ws_pathf(&dir, "%s/names", home))
		return NULL;
	DIR *d = opendir(dir);
	struct dirent *e;
	while (d && !found && (e = readdir(d))) {
		char target[64];
		if (e->d_name[0] == '.')
			continue;
		ssize_t n = readlinkat(dirfd(d), e->d_name, target, sizeof target - 1);
		if (n == CB_WS_REF_LEN && !memcmp(target, ref, CB_WS_REF_LEN))
			found = strdup(e->d_name);
	}
	if (d)
		closedir(d);
	free(dir);
	return found;
}

/* 1 if pid runs and is not a zombie. A daemon killed -9 whose parent (PID 1 here) does not
 * reap it stays a zombie: kill(pid, 0) still succeeds, while its mount is dead and its
 * children may hold the lock a moment longer. */
static int daemon_alive(pid_t pid)
{
	char path[64], buf[512];
	ssize_t n;
	int fd;

	snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
	if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
		return 0;
	n = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = '\0';
	/* "pid (comm) S ...": the state follows the last ')' (comm may hold one) */
	char *paren = strrchr(buf, ')');
	return paren && paren[1] == ' ' && paren[2] && paren[2] != 'Z' && paren[2] != 'X';
}

/* The daemon's mount point when the lock is held exclusively by a live daemon (a `ls` probe
 * holds it shared, `rm` of a dead one holds it with no live pid) and a FUSE mount of this
 * workspace is at the recorded path. NULL otherwise. */
static char *served_mountpoint(const char *dir, const char *ref)
{
	char path[4200], buf[4200], src[512], ours[64], *mnt = NULL;
	snprintf(path, sizeof path, "%s/lock", dir);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return NULL;
	if (flock(fd, LOCK_SH | LOCK_NB) == 0 || errno != EWOULDBLOCK)
		goto out; /* free or shared: no daemon holds it */
	ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
	buf[n > 0 ? n : 0] = '\0';
	long pid = strtol(buf, NULL, 10);
	char *nl = strchr(buf, '\n'), *end = nl ? strchr(nl + 1, '\n') : NULL;
	if (pid <= 0 || !end || nl[1] != '/' || !daemon_alive((pid_t)pid))
		goto out;
	*end = '\0';
	snprintf(ours, sizeof ours, "cowbox:%s", ref);
	if (cb_ws_fuse_mount_source(nl + 1, src, sizeof src) && !strcmp(src, ours))
		mnt = strdup(nl + 1);
out:
	close(fd);
	return mnt;
}

int cb_ws_find_served(const char *arg, char ref[CB_WS_REF_LEN + 1], char **mountpoint, char **name)
{
	char *home = NULL, *dir = NULL;
	struct stat st;
	int rc = 0, by_ref = cb_ws_ref_syntax(arg);

	ref[0] = '\0';
	*mountpoint = *name = NULL;
	if (!arg || (!by_ref && cb_ws_name_check(arg))) {
		cb_error_clear();
		return 0;
	}
	if (cb_ws_home(&home) < 0) {
		cb_error_clear();
		return 0;
	}
	if (by_ref)
		memcpy(ref, arg, CB_WS_REF_LEN + 1);
	else if (ws_name_lookup(home, arg, ref) < 0)
		goto out;
	if (ws_pathf(&dir, "%s/workspaces/%s", home, ref) || stat(dir, &st) < 0 ||
	    !S_ISDIR(st.st_mode) || !(*mountpoint = served_mountpoint(dir, ref)))
		goto out;
	*name = by_ref ? name_of(home, ref) : strdup(arg);
	if (!*name && !(*name = strdup(ref))) {
		rc = cb_error_set(ENOMEM, "out of memory");
		goto out;
	}
	rc = 1;
out:
	if (rc != 1) {
		if (rc == 0)
			cb_error_clear();
		free(*mountpoint);
		*mountpoint = NULL;
		ref[0] = '\0';
	}
	free(dir);
	free(home);
	return rc;
}

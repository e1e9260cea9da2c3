/* What a workspace is doing (state, daemon, mount, size) and taking it away: info, list and
 * remove. The mount and lock helpers they use are in workspace_mount.c. */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "cowbox/grow.h"
#include "cowbox/journal.h"
#include "cowbox/workspace.h"
#include "util/beneath.h"
#include "util/loopfs.h"
#include "ws.h"

const char *cb_ws_state_name(enum cb_ws_state state)
{
	switch (state) {
	case CB_WS_MOUNTED:
		return "mounted";
	case CB_WS_STALE:
		return "stale";
	case CB_WS_INCOMPLETE:
		return "incomplete";
	case CB_WS_BROKEN:
		return "broken";
	default:
		return "unmounted";
	}
}

/* 1 if dir/upper holds nothing (the agent never wrote anything there), else 0. */
static int ws_upper_empty(const char *db_path)
{
	char *upper = NULL, *slash;
	struct dirent *de;
	DIR *d;
	int empty = 1;

	if (ws_pathf(&upper, "%s", db_path))
		return 0;
	slash = strrchr(upper, '/');
	if (slash)
		*slash = '\0';
	if (ws_pathf(&slash, "%s/upper", upper)) {
		free(upper);
		return 0;
	}
	d = opendir(slash);
	/* its own filesystem, not mounted now: the image holds the work */
	if (!cb_loopfs_mounted(slash) && cb_ws_upper_imaged(upper))
		empty = 0;
	while (d && empty && (de = readdir(d)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
			empty = 0;
	if (d)
		closedir(d);
	free(slash);
	free(upper);
	return empty;
}

/* The advice for a meta.db that cannot be used: never "remove it" while upper/ holds the
 * agent's work; fsck --repair rebuilds the database and keeps every file. */
static int ws_db_damaged(const char *db_path, const char *what)
{
	int empty = ws_upper_empty(db_path);

	return cb_error_set(EUCLEAN,
			    "%s: %s; the workspace's files (upper/) are not touched by this: "
			    "'cowbox fsck REF --repair' rebuilds the database as a workspace with "
			    "no turns, keeping them%s",
			    db_path, what,
			    empty ? " (upper/ is empty: if the workspace was never used, 'cowbox "
				    "rm REF' removes it)"
				  : "");
}

int ws_open_complete(const char *db_path, struct cb_db **out)
{
	struct cb_db *db = NULL;
	struct stat st;
	char *v = NULL;
	int rc;

	*out = NULL;
	if (stat(db_path, &st) < 0)
		return errno == ENOENT
			   ? ws_db_damaged(db_path, ws_upper_empty(db_path)
							? "the database is missing (the "
							  "workspace was not fully created, or "
							  "lost it)"
							: "the database is missing")
			   : cb_error_set(errno, "%s: %s", db_path, strerror(errno));
	/* An empty file would be taken for a new database (and get a fresh schema): it is the
	 * remains of one that lost its contents. */
	if (st.st_size == 0)
		return ws_db_damaged(db_path, "the database is empty (0 bytes)");
	if ((rc = cb_db_open(db_path, &db)))
		return rc == -EUCLEAN ? ws_db_damaged(db_path, cb_error_message()) : rc;
	rc = cb_db_meta_get(db, "created", &v);
	if (rc == -ENOENT)
		rc = ws_upper_empty(db_path)
			 ? cb_error_set(EUCLEAN,
					"%s has no creation mark: the workspace was not fully "
					"created (interrupted?); remove it with 'cowbox rm REF'",
					db_path)
			 : ws_db_damaged(db_path, "the database has no creation mark");
	free(v);
	if (rc)
		cb_db_close(db);
	else
		*out = db;
	return rc;
}

int ws_check_complete(const char *db_path)
{
	struct cb_db *db;
	int rc = ws_open_complete(db_path, &db);

	cb_db_close(db);
	return rc;
}

static int du_visit(int dirfd, const char *name, const char *path, const struct stat *st, void *arg)
{
	(void)dirfd;
	(void)name;
	(void)path;
	*(long long *)arg += (long long)st->st_blocks * 512;
	return 0;
}

static long long upper_size(const char *dir)
{
	char *upper = NULL;
	long long total = 0;
	struct stat st;
	int fd;

	if (ws_pathf(&upper, "%s/upper", dir))
		return 0;
	/* its own filesystem, not mounted now: what its image takes on disk */
	if (!cb_loopfs_mounted(upper) && cb_ws_upper_imaged(dir)) {
		free(upper);
		if (ws_pathf(&upper, "%s/upper.img", dir))
			return 0;
		total = stat(upper, &st) == 0 ? (long long)st.st_blocks * 512 : 0;
		free(upper);
		return total;
	}
	fd = open(upper, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	free(upper);
	if (fd < 0)
		return 0;
	if (fstat(fd, &st) == 0)
		total = (long long)st.st_blocks * 512;
	cb_beneath_walk(fd, du_visit, &total); /* a size as far as it could be measured */
	close(fd);
	return total;
}

void cb_ws_info_free(struct cb_ws_info *info)
{
	if (!info)
		return;
	free(info->name);
	free(info->base);
	free(info->dir);
	free(info->mountpoint);
	memset(info, 0, sizeof(*info));
}

/* Describes a ref directory that exists, complete or not (list shows interrupted ones). */
static int ws_describe(const char *ref, struct cb_ws_info *out)
{
	struct cb_db *db = NULL;
	char *dbpath = NULL, *sock = NULL;
	int rc;

	memset(out, 0, sizeof(*out));
	memcpy(out->ref, ref, CB_WS_REF_LEN + 1);
	if ((rc = cb_ws_path(ref, NULL, &out->dir)) || (rc = cb_ws_path(ref, "meta.db", &dbpath)))
		goto out;
	rc = ws_open_complete(dbpath, &db);
	if (rc) {
		out->state = rc == -EUCLEAN ? CB_WS_INCOMPLETE : CB_WS_BROKEN;
		rc = 0;
		goto out;
	}
	cb_db_meta_get(db, "name", &out->name);
	cb_db_meta_get(db, "base", &out->base);
	char *in_place = NULL;

	if (cb_db_meta_get(db, "in_place", &in_place) == 0)
		out->in_place = !strcmp(in_place, "1");
	free(in_place);
	cb_error_clear();
	if ((rc = cb_ws_daemon(ref, &out->daemon_pid, &out->mountpoint)))
		goto out;
	if (out->daemon_pid > 0 && !cb_ws_pid_serving(out->daemon_pid))
		out->daemon_pid = 0; /* killed: what is left of it is stale */
	if (!out->mountpoint) {
		char *real = realpath(out->dir, NULL);

		rc = ws_pathf(&out->mountpoint, "%s/mnt", real ? real : out->dir);
		free(real);
		if (rc)
			goto out;
	}
	char *dead = out->daemon_pid ? NULL : ws_dead_mountpoint(ref);

	if (dead) {
		free(out->mountpoint);
		out->mountpoint = dead;
	}
	if (out->daemon_pid) {
		out->state = CB_WS_MOUNTED;
	} else {
		if ((rc = cb_ws_path(ref, "control.sock", &sock)))
			goto out;
		out->state = cb_ws_is_fuse_mount(out->mountpoint) || access(sock, F_OK) == 0
				 ? CB_WS_STALE
				 : CB_WS_UNMOUNTED;
	}
	out->upper_bytes = upper_size(out->dir);
out:
	if (rc)
		cb_ws_info_free(out);
	cb_db_close(db);
	free(dbpath);
	free(sock);
	return rc;
}

int cb_ws_info(const char *ref, struct cb_ws_info *out)
{
	char checked[CB_WS_REF_LEN + 1];
	int rc = cb_ws_resolve(ref, checked);

	memset(out, 0, sizeof(*out));
	return rc ? rc : ws_describe(checked, out);
}

static int ref_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

int cb_ws_list(int (*fn)(const struct cb_ws_info *info, void *arg), void *arg)
{
	char *home = NULL, *dir = NULL, **refs = NULL;
	size_t n = 0, cap = 0;
	struct dirent *de;
	DIR *d = NULL;
	int rc;

	if ((rc = cb_ws_home(&home)) || (rc = ws_pathf(&dir, "%s/workspaces", home)))
		goto out;
	cb_ws_clean_unpublished();
	d = opendir(dir);
	if (!d) {
		rc = errno == ENOENT ? 0 : cb_error_set(errno, "open %s: %s", dir, strerror(errno));
		goto out;
	}
	while ((de = readdir(d))) {
		if (!cb_ws_ref_syntax(de->d_name))
			continue;
		if ((rc = cb_grow(&refs, &cap, n, sizeof(*refs), 16, "workspace list")))
			goto out;
		if (!(refs[n] = strdup(de->d_name))) {
			rc = cb_error_set(ENOMEM, "out of memory");
			goto out;
		}
		n++;
	}
	if (n)
		qsort(refs, n, sizeof(*refs), ref_cmp);
	for (size_t i = 0; i < n && !rc; i++) {
		struct cb_ws_info info;

		if (ws_describe(refs[i], &info))
			continue; /* removed meanwhile */
		rc = fn(&info, arg);
		cb_ws_info_free(&info);
	}
out:
	for (size_t i = 0; i < n; i++)
		free(refs[i]);
	free(refs);
	if (d)
		closedir(d);
	free(dir);
	free(home);
	return rc;
}

int ws_delete_tree(const char *dir)
{
	const char *slash = strrchr(dir, '/');
	char *parent = slash ? strndup(dir, (size_t)(slash - dir)) : strdup(".");
	int pfd, rc;

	if (!parent)
		return cb_error_set(ENOMEM, "delete %s: out of memory", dir);
	/* The workspace's directory is ours; what is below it (upper/ above all) the sandbox
	 * wrote: removed beneath the parent's fd, no symlink in it ever followed. */
	pfd = open(*parent ? parent : "/", O_PATH | O_DIRECTORY | O_CLOEXEC);
	free(parent);
	if (pfd < 0)
		return errno == ENOENT ? 0
				       : cb_error_set(errno, "delete %s: %s", dir, strerror(errno));
	rc = cb_beneath_remove_tree(pfd, slash ? slash + 1 : dir);
	close(pfd);
	return rc ? cb_error_wrap(rc, "delete %s", dir) : 0;
}

static void sleep_ms(long ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};

	nanosleep(&ts, NULL);
}

/* SIGTERM lets the daemon unmount cleanly; SIGKILL 10 s later covers a wedged one. A daemon
 * still starting (lock held, pid not written yet) is signalled once its pid shows. */
static int ws_stop_daemon(const char *ref)
{
	char *mnt = NULL;
	pid_t pid;
	int rc, waited = 0, termed_at = -1;

	while (!(rc = cb_ws_daemon(ref, &pid, &mnt)) && pid) {
		free(mnt);
		mnt = NULL;
		if (pid > 0 && termed_at < 0) {
			kill(pid, SIGTERM);
			termed_at = waited;
		}
		if (pid > 0 && termed_at >= 0 && waited - termed_at == 10000)
			kill(pid, SIGKILL);
		if (waited > 20000)
			return cb_error_set(EBUSY, "workspace %s: daemon pid %d does not stop", ref,
					    (int)pid);
		sleep_ms(50);
		waited += 50;
	}
	free(mnt);
	return rc;
}

int cb_ws_remove(const char *arg)
{
	char ref[CB_WS_REF_LEN + 1];
	char *home = NULL, *dir = NULL, *trash = NULL, *link = NULL, *mnt = NULL;
	struct cb_db *db = NULL;
	char *name = NULL, *dbpath = NULL;
	int rc;

	if ((rc = cb_ws_home(&home)))
		return rc;
	cb_ws_clean_unpublished();
	if (cb_ws_ref_syntax(arg)) {
		memcpy(ref, arg, sizeof(ref));
	} else if ((rc = cb_ws_resolve(arg, ref))) {
		goto out;
	}
	if ((rc = ws_pathf(&dir, "%s/workspaces/%s", home, ref)))
		goto out;
	if (access(dir, F_OK) < 0)
		goto out; /* already gone: quiet */
	if ((rc = ws_stop_daemon(ref)))
		goto out;
	/* Unmount whatever a dead daemon left at the default mount point. */
	if ((rc = ws_pathf(&mnt, "%s/mnt", dir)))
		goto out;
	char *real = realpath(dir, NULL);

	if (real) {
		free(mnt);
		rc = ws_pathf(&mnt, "%s/mnt", real);
		free(real);
		if (rc)
			goto out;
	}
	if ((rc = cb_ws_unmount(mnt)))
		goto out;
	char *dead = ws_dead_mountpoint(ref);

	rc = dead ? cb_ws_unmount(dead) : 0;
	free(dead);
	if (rc)
		goto out;
	if (!(rc = ws_pathf(&dbpath, "%s/meta.db", dir)) && access(dbpath, F_OK) == 0 &&
	    cb_db_open(dbpath, &db) == 0 && cb_db_meta_get(db, "name", &name) == 0) {
		char owner[CB_WS_REF_LEN + 1];

		/* Only drop the name if it still points here. */
		if (ws_name_lookup(home, name, owner) == 0 && !strcmp(owner, ref) &&
		    !ws_pathf(&link, "%s/names/%s", home, name))
			unlink(link);
	}
	cb_db_close(db);
	db = NULL;
	cb_error_clear();
	rc = 0;
	/* The persistent home's own filesystem (backends/home.c) that a killed daemon left
	 * mounted: detached first, so the delete below stays on the workspace's disk. */
	if ((rc = ws_pathf(&trash, "%s/home", dir)))
		goto out;
	struct stat dir_st, home_st;

	if (stat(dir, &dir_st) == 0 && lstat(trash, &home_st) == 0 && S_ISDIR(home_st.st_mode) &&
	    home_st.st_dev != dir_st.st_dev)
		umount2(trash, MNT_DETACH);
	free(trash);
	trash = NULL;
	cb_ws_upper_release(dir); /* the upper layer's own filesystem, the same way */
	/* Rename first so that a crash mid-delete leaves no half workspace under its ref. */
	if ((rc = ws_pathf(&trash, "%s/workspaces/.trash-%s", home, ref)))
		goto out;
	if (rename(dir, trash) < 0) {
		rc = cb_error_set(errno, "rename %s: %s", dir, strerror(errno));
		goto out;
	}
	rc = ws_delete_tree(trash);
out:
	cb_db_close(db);
	free(name);
	free(dbpath);
	free(mnt);
	free(link);
	free(trash);
	free(dir);
	free(home);
	return rc;
}

/* cb_ws_apply: the changes between two recorded turns written onto a folder outside the
 * workspace, after checking that folder still holds what the first turn recorded. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cowbox/apply.h"
#include "cowbox/workspace.h"
#include "cowbox/error.h"
#include "cowbox/grow.h"
#include "cowbox/turns.h"
#include "turns_int.h"
#include "util/beneath.h"

/* Add "path: why" to the result's conflicts. */
static int conflict(struct cb_ws_apply_result *res, size_t *cap, const char *path, const char *why)
{
	int rc = cb_grow(&res->conflicts, cap, res->nconflicts, sizeof(char *), 16, "apply");

	if (rc)
		return rc;
	if (asprintf(&res->conflicts[res->nconflicts], "%s: %s", path, why) < 0)
		return cb_error_set(ENOMEM, "apply: out of memory");
	res->nconflicts++;
	return 0;
}

/* 1 if the folder's entry at path is e (type, content, target; the mode too with mode set),
 * 0 if not, -errno when it cannot be read. */
static int apply_is(int root, const char *path, const struct cb_entry *e, int mode)
{
	char link[4096];
	struct cb_hash h;
	struct stat st;
	long long size;
	int rc, fd;

	rc = cb_beneath_stat(root, path, &st);
	if (rc < 0)
		return cb_beneath_gone(rc) ? e->type == CB_ENTRY_ABSENT : rc;
	if (mode && e->type != CB_ENTRY_SYMLINK && (st.st_mode & 07777) != e->mode)
		return 0;
	switch (e->type) {
	case CB_ENTRY_DIR:
		return S_ISDIR(st.st_mode);
	case CB_ENTRY_SYMLINK:
		if (!S_ISLNK(st.st_mode))
			return 0;
		if ((rc = cb_beneath_readlink(root, path, link, sizeof(link))) < 0)
			return rc;
		return e->target && !strcmp(link, e->target);
	case CB_ENTRY_FILE:
		if (!S_ISREG(st.st_mode) || st.st_size != e->size)
			return 0;
		if ((fd = cb_beneath_open(root, path, O_RDONLY, 0)) < 0)
			return fd;
		rc = cb_ws_hash_fd(fd, -1, &h, &size);
		close(fd);
		return rc < 0 ? rc : !memcmp(h.sha256, e->sha256, sizeof(h.sha256));
	default:
		return 0;
	}
}

static const char *type_name(const struct cb_entry *e)
{
	switch (e->type) {
	case CB_ENTRY_FILE:
		return "a file";
	case CB_ENTRY_DIR:
		return "a directory";
	case CB_ENTRY_SYMLINK:
		return "a symlink";
	default:
		return "absent";
	}
}

/* Copy e's content from the base (when it holds it) or its blob into fd, checked. */
static int apply_content(struct cb_turns *t, const struct cb_entry *e, int fd)
{
	char hex[2 * CB_XXH128_LEN + 1], what[4200];
	int src, rc = -ENOENT;

	if (t->base_fd >= 0 && ws_base_holds(t, e->path, e->xxh3) == 1 &&
	    (src = cb_beneath_open(t->base_fd, e->path, O_RDONLY, 0)) >= 0) {
		snprintf(what, sizeof(what), "base file %s", e->path);
		rc = cb_ws_copy_checked(src, fd, e, what);
		close(src);
		if (rc != -EBADMSG)
			return rc;
	}
	cb_error_clear();
	cb_hex(e->xxh3, CB_XXH128_LEN, hex);
	if ((src = cb_ws_blob_open(t->blob_fd, e->xxh3)) < 0)
		return cb_error_wrap(src, "apply: content of %s", e->path);
	snprintf(what, sizeof(what), "blob %s", hex);
	rc = cb_ws_copy_checked(src, fd, e, what);
	close(src);
	return rc;
}

/* ---- temporary files: named for their origin, listed before they exist ---- */

/* A temporary file of apply is "NAME.cowbox-apply-REF" beside NAME (or, when that would be
 * longer than a name may be, ".cowbox-apply-REF-HASH" with a hash of NAME): anyone who finds
 * one in their folder sees what made it, and the same apply run again over the same path
 * replaces it. Before it is made, its path is appended to the workspace's "apply.pending"
 * (the first line: the pid of the applier and the target folder), so that a run killed with
 * -9 leaves nothing that the daemon's next start or fsck cannot find and remove
 * (cb_ws_apply_sweep) without walking the user's folder. */
#define APPLY_TMP     ".cowbox-apply-"
#define APPLY_PENDING "apply.pending"

struct apply_log {
	int fd; /* apply.pending, or -1: then no temporary file is made at all */
	char ref[CB_WS_REF_LEN + 1];
};

/* The temporary name for path (malloc'd), from the workspace's ref. */
static char *apply_tmp_name(const struct apply_log *log, const char *path)
{
	const char *slash = strrchr(path, '/'), *name = slash ? slash + 1 : path;
	int dirlen = slash ? (int)(slash - path + 1) : 0;
	unsigned long long h = 1469598103934665603ULL;
	char *tmp = NULL;

	if (strlen(name) + strlen(APPLY_TMP) + strlen(log->ref) <= NAME_MAX) {
		if (asprintf(&tmp, "%s" APPLY_TMP "%s", path, log->ref) < 0)
			tmp = NULL;
		return tmp;
	}
	for (const char *c = name; *c; c++)
		h = (h ^ (unsigned char)*c) * 1099511628211ULL;
	if (asprintf(&tmp, "%.*s" APPLY_TMP "%s-%016llx", dirlen, path, log->ref, h) < 0)
		tmp = NULL;
	return tmp;
}

/* 1 if name (a last component) is a temporary file of apply by workspace ref. */
static int apply_tmp_named(const char *name, const char *ref)
{
	const char *at = strstr(name, APPLY_TMP);

	return at && !strncmp(at + strlen(APPLY_TMP), ref, strlen(ref));
}

/* Start the list: the previous run's (if any) is swept first, by the caller. */
static int apply_log_open(struct apply_log *log, const char *ws_dir, const char *target)
{
	char *path = NULL, *line = NULL;
	const char *base = strrchr(ws_dir, '/');
	int rc = 0, n;

	log->fd = -1;
	snprintf(log->ref, sizeof(log->ref), "%s", base ? base + 1 : ws_dir);
	if (asprintf(&path, "%s/" APPLY_PENDING, ws_dir) < 0 ||
	    (n = asprintf(&line, "%d\t%s\n", (int)getpid(), target)) < 0) {
		rc = cb_error_set(ENOMEM, "apply: out of memory");
		goto out;
	}
	log->fd =
	    open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (log->fd < 0)
		rc = cb_error_set(errno, "apply: %s: %s", path, strerror(errno));
	else if (write(log->fd, line, (size_t)n) != n)
		rc = cb_error_set(errno ? errno : EIO, "apply: write %s: %s", path,
				  strerror(errno ? errno : EIO));
out:
	if (rc && log->fd >= 0) {
		close(log->fd);
		log->fd = -1;
		unlink(path);
	}
	free(path);
	free(line);
	return rc;
}

/* One temporary path into the list before it is made: one write(2), NUL-terminated. */
static int apply_log_add(struct apply_log *log, const char *tmp)
{
	size_t n = strlen(tmp) + 1;

	if (write(log->fd, tmp, n) != (ssize_t)n)
		return cb_error_set(errno ? errno : EIO, "apply: record %s: %s", tmp,
				    strerror(errno ? errno : EIO));
	return 0;
}

/* A run that ended (done or failed, its temporaries removed) needs no list. */
static void apply_log_close(struct apply_log *log, const char *ws_dir)
{
	char *path = NULL;

	if (log->fd < 0)
		return;
	close(log->fd);
	log->fd = -1;
	if (asprintf(&path, "%s/" APPLY_PENDING, ws_dir) >= 0)
		unlink(path);
	free(path);
}

/* See apply.h. */
int cb_ws_apply_sweep(const char *ws_dir, int (*fn)(const char *path, void *arg), void *arg)
{
	char *path = NULL, *buf = NULL, *target, *nl, *p, ref[CB_WS_REF_LEN + 1];
	const char *base = strrchr(ws_dir, '/');
	struct stat st;
	size_t len = 0;
	FILE *f = NULL;
	int rc = 0, root = -1, pid, removed = 0;

	snprintf(ref, sizeof(ref), "%s", base ? base + 1 : ws_dir);
	if (asprintf(&path, "%s/" APPLY_PENDING, ws_dir) < 0)
		return cb_error_set(ENOMEM, "apply: out of memory");
	f = fopen(path, "re");
	if (!f) {
		rc = errno == ENOENT ? 0 : cb_error_set(errno, "%s: %s", path, strerror(errno));
		goto out;
	}
	if (fstat(fileno(f), &st) < 0 || !(buf = calloc(1, (size_t)st.st_size + 1))) {
		rc = cb_error_set(ENOMEM, "%s: out of memory", path);
		goto out;
	}
	len = fread(buf, 1, (size_t)st.st_size, f);
	nl = memchr(buf, '\n', len);
	/* A run still going (fsck beside a live daemon, or on a thread of this one) keeps its
	 * list and its files: a run that ended removed its list itself. A daemon killed -9 that
	 * no one has reaped yet (PID 1 here reaps nothing) is a zombie kill(pid, 0) still finds:
	 * it writes no more, so it counts as gone. */
	if (!nl || sscanf(buf, "%d\t", &pid) != 1 ||
	    (pid > 0 && (pid == getpid() || cb_ws_pid_serving(pid))))
		goto out;
	*nl = '\0';
	target = strchr(buf, '\t');
	if (!target || (root = open(target + 1, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
		goto drop; /* the folder is gone: so are its temporaries */
	for (p = nl + 1; p < buf + len && !rc; p += strlen(p) + 1) {
		const char *last = strrchr(p, '/');
		char *full = NULL;

		/* only what this workspace's apply named as its own, beneath the target */
		if (!*p || !apply_tmp_named(last ? last + 1 : p, ref) ||
		    cb_beneath_stat(root, p, &st) < 0) {
			cb_error_clear();
			continue;
		}
		if ((rc = cb_beneath_remove_tree(root, p)) < 0)
			break;
		removed++;
		if (fn && asprintf(&full, "%s/%s", target + 1, p) >= 0)
			rc = fn(full, arg);
		free(full);
	}
drop:
	if (!rc && unlink(path) < 0 && errno != ENOENT)
		rc = cb_error_set(errno, "%s: unlink: %s", path, strerror(errno));
out:
	if (f)
		fclose(f);
	if (root >= 0)
		close(root);
	free(buf);
	free(path);
	return rc < 0 ? rc : removed;
}

/* e's file or symlink made under a temporary name beside path, then renamed over it; a
 * file as a hard link of anchor when one is given (its group's name that holds it). */
static int apply_write(struct cb_turns *t, struct apply_log *log, int root,
		       const struct cb_entry *e, const char *anchor)
{
	char *tmp;
	int fd, rc;

	/* On the heap: a path may be longer than PATH_MAX (util/beneath resolves it in pieces). */
	if (!(tmp = apply_tmp_name(log, e->path)))
		return cb_error_set(ENOMEM, "apply %s: out of memory", e->path);
	if ((rc = apply_log_add(log, tmp)))
		goto out;
	cb_beneath_remove_tree(root, tmp);
	cb_error_clear();
	if (anchor) {
		rc = ws_link_at(root, anchor, tmp);
	} else if (e->type == CB_ENTRY_SYMLINK) {
		rc = cb_beneath_symlink(root, e->target ? e->target : "", tmp);
		/* its own time (a rename keeps it); owners are not given back in a host folder */
		if (!rc && e->has_mtime) {
			struct cb_entry at = *e;

			at.path = tmp;
			rc = ws_restore_time_at(root, &at);
		}
	} else {
		fd = cb_beneath_open(root, tmp, O_RDWR | O_CREAT | O_EXCL, 0600);
		if (fd < 0) {
			rc = fd;
			goto out;
		}
		rc = apply_content(t, e, fd);
		if (!rc)
			rc = cb_beneath_fchmod(fd, e->path, e->mode, NULL);
		/* the user.* xattrs (an ACL names the sandbox's ids, which mean nothing in a
		 * folder of the host) and the time the turn recorded, if any */
		if (!rc)
			rc = ws_restore_xattrs(fd, e, -1, 0, 0);
		if (!rc)
			rc = ws_restore_mtime(fd, e, -1);
		if (!rc && fsync(fd) < 0)
			rc = cb_error_set(errno, "fsync: %s", strerror(errno));
		close(fd);
	}
	/* A directory in the way (a type change) goes first: rename cannot replace it. */
	if (!rc) {
		struct stat st;

		if (cb_beneath_stat(root, e->path, &st) == 0 && S_ISDIR(st.st_mode))
			rc = cb_beneath_remove_tree(root, e->path);
		else
			cb_error_clear();
	}
	if (!rc)
		rc = cb_beneath_rename(root, tmp, e->path, 0);
	if (rc) {
		int keep = rc;

		cb_beneath_remove_tree(root, tmp);
		rc = keep;
	}
out:
	free(tmp);
	return rc ? cb_error_wrap(rc, "apply %s", e->path) : 0;
}

/* The name e (a file of hard-link group e->link at turn b) is to be a link of: another name
 * of the group this run wrote, else one apply leaves alone that holds e's content already
 * (written: the paths written so far; diff: to find what is still to be written). */
static int apply_anchor(struct cb_turns *t, long long b, int root, const struct cb_entry *e,
			const struct cb_diff *diff, const char *done,
			const struct ws_pathset *written, char **anchor)
{
	struct ws_pathset group = {0};
	int rc;

	*anchor = NULL;
	if (e->type != CB_ENTRY_FILE || !e->link)
		return 0;
	rc = ws_link_group(t, b, e->link, &group);
	for (size_t i = 0; i < group.n && !rc && !*anchor; i++) {
		const char *m = group.p[i].path;
		int pending = 0, is;

		if (!strcmp(m, e->path))
			continue;
		for (size_t j = 0; j < written->n && !*anchor; j++)
			if (!strcmp(written->p[j].path, m) && !(*anchor = strdup(m)))
				rc = cb_error_set(ENOMEM, "apply: out of memory");
		for (size_t j = 0; j < diff->n && !pending && !*anchor; j++)
			pending =
			    !done[j] && diff->ev[j].new.path && !strcmp(diff->ev[j].new.path, m);
		if (*anchor || pending || rc)
			continue;
		is = apply_is(root, m, e, 0);
		if (is < 0)
			rc = is;
		else if (is && !(*anchor = strdup(m)))
			rc = cb_error_set(ENOMEM, "apply: out of memory");
	}
	ws_pathset_free(&group);
	return rc;
}

/* Last, deepest first: every directory of turn b that apply made or wrote in (done[i]: event
 * i was left alone) gets the time b recorded (none recorded: left as it is). */
static int apply_dir_times(struct cb_turns *t, long long b, int root, const struct cb_diff *diff,
			   const char *done)
{
	struct ws_pathset dirs = {0};
	struct cb_entry e = {0};
	int rc = 0;

	for (size_t i = 0; i < diff->n && !rc; i++) {
		const struct cb_entry *ev =
		    diff->ev[i].new.path ? &diff->ev[i].new : &diff->ev[i].old;
		const char *slash = strrchr(ev->path, '/');
		char *parent;

		if (done[i])
			continue;
		if (ev->type == CB_ENTRY_DIR)
			rc = ws_pathset_add(&dirs, ev->path, 0, NULL);
		if (rc || !slash)
			continue;
		if (!(parent = strndup(ev->path, (size_t)(slash - ev->path))))
			rc = cb_error_set(ENOMEM, "apply: out of memory");
		else
			rc = ws_pathset_add(&dirs, parent, 0, NULL);
		free(parent);
	}
	ws_pathset_sort(&dirs);
	for (size_t i = dirs.n; i-- > 0 && !rc;) {
		rc = ws_entry_at(t, dirs.p[i].path, b, &e);
		if (!rc && e.type == CB_ENTRY_DIR)
			rc = ws_restore_time_at(root, &e);
	}
	cb_entry_clear(&e);
	ws_pathset_free(&dirs);
	return rc ? cb_error_wrap(rc, "apply") : 0;
}

void cb_ws_apply_result_free(struct cb_ws_apply_result *res)
{
	for (size_t i = 0; i < res->nconflicts; i++)
		free(res->conflicts[i]);
	free(res->conflicts);
	memset(res, 0, sizeof(*res));
}

int cb_ws_apply(struct cb_turns *t, long long a, long long b, const char *target,
		struct cb_ws_apply_result *res)
{
	struct apply_log log = {.fd = -1};
	struct ws_pathset written = {0}; /* files of hard-link groups, as written */
	struct cb_diff diff = {0};
	char *done = NULL, why[256], *ws_dir = NULL, *slash;
	size_t cap = 0, i;
	int root = -1, rc;

	memset(res, 0, sizeof(*res));
	/* the workspace's directory holds its database (and the list of temporaries) */
	if (!(ws_dir = strdup(t->db_path)))
		return cb_error_set(ENOMEM, "apply: out of memory");
	if ((slash = strrchr(ws_dir, '/')))
		*slash = '\0';
	root = open(target, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (root < 0) {
		rc = cb_error_set(errno, "apply: target %s: %s", target, strerror(errno));
		goto out;
	}
	if ((rc = cb_ws_diff(t, a, b, NULL, 0, &diff)) < 0)
		goto out;
	if (diff.n && !(done = calloc(diff.n, 1))) {
		rc = cb_error_set(ENOMEM, "apply: out of memory");
		goto out;
	}
	/* Check everything before writing anything. */
	for (i = 0; i < diff.n; i++) {
		const struct cb_diff_event *ev = &diff.ev[i];
		int is_new = apply_is(root, ev->new.path ? ev->new.path : ev->old.path, &ev->new,
				      ev->kind == CB_DIFF_MODE_CHANGED);
		const char *path = ev->new.path ? ev->new.path : ev->old.path;

		if (is_new < 0) {
			rc = cb_error_wrap(is_new, "apply: %s/%s", target, path);
			goto out;
		}
		/* already as turn b has it */
		if (is_new) {
			done[i] = 1;
			res->unchanged++;
			continue;
		}
		int is_old = apply_is(root, path, &ev->old, 0);

		if (is_old < 0) {
			rc = cb_error_wrap(is_old, "apply: %s/%s", target, path);
			goto out;
		}
		if (!is_old) {
			snprintf(why, sizeof(why),
				 "changed since turn %lld (expected %s as recorded there)", a,
				 type_name(&ev->old));
			if ((rc = conflict(res, &cap, path, why)))
				goto out;
		}
	}
	if (res->nconflicts) {
		rc = cb_error_set(EEXIST, "apply: %zu path%s of %s changed since turn %lld: %s%s",
				  res->nconflicts, res->nconflicts == 1 ? "" : "s", target, a,
				  res->conflicts[0], res->nconflicts > 1 ? ", ..." : "");
		goto out;
	}
	/* What an earlier run killed midway left goes before this run lists its own. */
	if ((rc = cb_ws_apply_sweep(ws_dir, NULL, NULL)) < 0 ||
	    (rc = apply_log_open(&log, ws_dir, target)))
		goto out;
	/* Deletions and type changes away from a directory, deepest first. */
	for (i = diff.n; i-- > 0;) {
		const struct cb_diff_event *ev = &diff.ev[i];

		if (done[i] || ev->new.type != CB_ENTRY_ABSENT)
			continue;
		if ((rc = cb_beneath_remove_tree(root, ev->old.path)) < 0) {
			rc = cb_error_wrap(rc, "apply: remove %s", ev->old.path);
			goto out;
		}
		res->deleted++;
	}
	for (i = 0; i < diff.n; i++) {
		const struct cb_diff_event *ev = &diff.ev[i];
		const struct cb_entry *e = &ev->new;

		if (done[i] || e->type == CB_ENTRY_ABSENT)
			continue;
		/* the mode, user.* xattrs and (not a directory's yet) time of what stays */
		if (ev->kind == CB_DIFF_MODE_CHANGED && e->type != CB_ENTRY_SYMLINK)
			rc = ws_restore_meta_at(root, e, -1, 0, NULL, e->type == CB_ENTRY_FILE);
		else if (e->type == CB_ENTRY_DIR) {
			if (ev->old.type != CB_ENTRY_ABSENT)
				cb_beneath_remove_tree(root, e->path);
			rc = cb_beneath_mkdir(root, e->path, e->mode);
			/* its user.* xattrs (the mode again: mkdir's went through the umask);
			 * its time once everything in it is written */
			if (!rc)
				rc = ws_restore_meta_at(root, e, -1, 0, NULL, 0);
		} else {
			char *anchor = NULL;

			rc = apply_anchor(t, b, root, e, &diff, done, &written, &anchor);
			if (!rc)
				rc = apply_write(t, &log, root, e, anchor);
			free(anchor);
			if (!rc && e->link)
				rc = ws_pathset_add(&written, e->path, 0, NULL);
		}
		if (rc < 0) {
			rc = cb_error_wrap(rc, "apply: %s/%s", target, e->path);
			goto out;
		}
		res->written++;
	}
	rc = apply_dir_times(t, b, root, &diff, done);
out:
	apply_log_close(&log, ws_dir);
	free(done);
	free(ws_dir);
	ws_pathset_free(&written);
	cb_ws_diff_free(&diff);
	if (root >= 0)
		close(root);
	return rc;
}

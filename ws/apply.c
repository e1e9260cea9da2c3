/* cb_ws_apply: the changes between two recorded turns written onto a folder outside the
 * workspace, after checking that folder still holds what the first turn recorded. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
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

/* e's file or symlink made under a temporary name beside path, then renamed over it. The
 * name is the same on every run (not per process), so that a run killed between the two
 * leaves at most one such file per path, removed by the next run over that path. */
static int apply_write(struct cb_turns *t, int root, const struct cb_entry *e)
{
	char *tmp = NULL;
	int fd, rc;

	/* On the heap: a path may be longer than PATH_MAX (util/beneath resolves it in pieces). */
	if (asprintf(&tmp, "%s.cowbox-apply", e->path) < 0)
		return cb_error_set(ENOMEM, "apply %s: out of memory", e->path);
	cb_beneath_remove_tree(root, tmp);
	cb_error_clear();
	if (e->type == CB_ENTRY_SYMLINK) {
		rc = cb_beneath_symlink(root, e->target ? e->target : "", tmp);
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
			rc = ws_restore_xattrs(fd, e, -1, 0);
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
	struct cb_diff diff = {0};
	char *done = NULL, why[256];
	size_t cap = 0, i;
	int root = -1, rc;

	memset(res, 0, sizeof(*res));
	root = open(target, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (root < 0)
		return cb_error_set(errno, "apply: target %s: %s", target, strerror(errno));
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
		if (ev->kind == CB_DIFF_MODE_CHANGED && e->type != CB_ENTRY_SYMLINK)
			rc = cb_beneath_chmod(root, e->path, e->mode, NULL);
		else if (e->type == CB_ENTRY_DIR) {
			if (ev->old.type != CB_ENTRY_ABSENT)
				cb_beneath_remove_tree(root, e->path);
			rc = cb_beneath_mkdir(root, e->path, e->mode);
		} else
			rc = apply_write(t, root, e);
		if (rc < 0) {
			rc = cb_error_wrap(rc, "apply: %s/%s", target, e->path);
			goto out;
		}
		res->written++;
	}
	rc = 0;
out:
	free(done);
	cb_ws_diff_free(&diff);
	close(root);
	return rc;
}

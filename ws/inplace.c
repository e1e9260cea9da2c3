/* In-place workspaces: the checks on the user's folder and its recording as turn 0 (a frozen
 * base map and a blob of every file), done once when the workspace is created. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cowbox/error.h"
#include "cowbox/turn_store.h"
#include "turns_int.h"
#include "ws.h"

/* 1 if path is dir or lies below it (both real paths). */
static int path_within(const char *path, const char *dir)
{
	size_t n = strlen(dir);

	if (n == 1 && dir[0] == '/')
		return 1;
	return !strncmp(path, dir, n) && (path[n] == '\0' || path[n] == '/');
}

/* Stops the listing at an in-place workspace over the same folder (two mounts writing one
 * folder would each see the other's changes as made behind its back). */
static int same_folder(const struct cb_ws_info *info, void *arg)
{
	const char *folder = arg;

	if (!info->in_place || !info->base || strcmp(info->base, folder))
		return 0;
	return cb_error_set(EBUSY, "in place: %s is already the folder of workspace %s%s%s%s",
			    folder, info->ref, info->name ? " (" : "", info->name ? info->name : "",
			    info->name ? ")" : "");
}

struct overlap {
	const char *path;
	char *found; /* "<folder> (workspace <ref>)", malloc'd */
};

static int folder_overlaps(const struct cb_ws_info *info, void *arg)
{
	struct overlap *o = arg;

	if (!info->in_place || !info->base ||
	    !(path_within(o->path, info->base) || path_within(info->base, o->path)))
		return 0;
	if (asprintf(&o->found, "%s (workspace %s)", info->base, info->ref) < 0)
		o->found = NULL;
	return 1;
}

int cb_ws_in_place_overlap(const char *path, char **found)
{
	struct overlap o = {.path = path};
	int rc = cb_ws_list(folder_overlaps, &o);

	*found = o.found;
	if (rc == 1 && !o.found)
		return cb_error_set(ENOMEM, "out of memory");
	return rc;
}

int ws_in_place_check(const char *folder, const char *home)
{
	char *real_home = realpath(home, NULL);
	const char *h = real_home ? real_home : home;
	int rc = 0;

	if (!strcmp(folder, "/"))
		rc = cb_error_set(EINVAL, "in place: refusing / as the folder");
	else if (path_within(folder, h) || path_within(h, folder))
		rc = cb_error_set(EINVAL,
				  "in place: %s %s cowbox's own state (%s); give a folder "
				  "outside it",
				  folder, path_within(folder, h) ? "is inside" : "holds", h);
	else if (real_home)
		rc = cb_ws_list(same_folder, (void *)folder);
	free(real_home);
	return rc;
}

/* Keep turn 0's bytes of one file as a blob, checked against the hashes the walk recorded:
 * a file rewritten between the walk and this copy fails the creation, never records a
 * content no blob holds. */
static int keep_file(const struct cb_entry *e, long long from, long long until, void *arg)
{
	struct cb_turns *t = arg;
	char tmp[64] = "";
	int src = -1, dst = -1, ret;

	(void)from;
	(void)until;
	if (cb_ws_blob_has(t->blob_fd, e->xxh3))
		return 0;
	src = cb_beneath_open(t->base_fd, e->path, O_RDONLY | O_NONBLOCK | O_NOCTTY, 0);
	if (src < 0) {
		ret = cb_error_wrap(src, "in place: keep %s", e->path);
		goto out;
	}
	dst = cb_ws_blob_tmp(t->blob_fd, tmp);
	if (dst < 0) {
		ret = dst;
		tmp[0] = '\0';
		goto out;
	}
	ret = cb_ws_copy_checked(src, dst, e, "the folder's file");
	if (ret) {
		ret = cb_error_wrap(ret,
				    "in place: %s changed while it was recorded; create the "
				    "workspace again",
				    e->path);
		goto out;
	}
	close(dst);
	dst = -1;
	ret = cb_ws_blob_publish(t->blob_fd, tmp, e->xxh3);
	tmp[0] = '\0';
out:
	if (src >= 0)
		close(src);
	if (dst >= 0)
		close(dst);
	if (tmp[0])
		unlinkat(t->blob_fd, tmp, 0);
	return ret;
}

int ws_in_place_mark(const char *dir)
{
	char *p = NULL;
	int rc = ws_pathf(&p, "%s/in_place", dir), fd;

	if (rc)
		return rc;
	fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		rc = cb_error_set(errno, "write %s: %s", p, strerror(errno));
	else
		close(fd);
	free(p);
	return rc;
}

int ws_in_place_marked(const char *dir)
{
	char *p = NULL;
	int marked;

	if (ws_pathf(&p, "%s/in_place", dir)) {
		cb_error_clear();
		return 0;
	}
	marked = access(p, F_OK) == 0;
	free(p);
	return marked;
}

int ws_in_place_record(const char *dir, const char *folder)
{
	char *db = NULL, *blobs = NULL;
	struct cb_turns *t = NULL;
	int rc;

	if ((rc = ws_pathf(&db, "%s/meta.db", dir)) || (rc = ws_pathf(&blobs, "%s/blobs", dir)))
		goto out;
	struct cb_turns_config cfg = {.db_path = db, .blob_dir = blobs, .base_dir = folder};

	if ((rc = cb_turns_open(&cfg, &t)) || (rc = cb_db_turns_in_place_set(t->db)))
		goto out;
	t->in_place = 1;
	/* The map of turn 0 (the base map, frozen): the first snapshot finds it built. */
	if ((rc = ws_map_ensure(t)))
		goto out;
	rc = cb_db_turns_base_files(t->db, keep_file, t);
out:
	cb_turns_close(t);
	free(blobs);
	free(db);
	return rc ? cb_error_wrap(rc, "record %s", folder) : 0;
}

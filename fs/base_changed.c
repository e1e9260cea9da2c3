/* A base changed behind the overlay's back: the kernel is told to forget what it cached of
 * the changed paths (their entries, attributes and pages, and their directories' listings). */
#include "config.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "ov.h"

struct inval {
	fuse_ino_t ino;	   /* an inode to forget (attributes, pages, a directory's listing) */
	fuse_ino_t parent; /* with name: an entry to forget; 0: none */
	char *name;
};

static int path_in(const char *path, const char *const *paths, size_t n)
{
	size_t lo = 0, hi = n;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		int c = strcmp(path, paths[mid]);

		if (!c)
			return 1;
		if (c < 0)
			hi = mid;
		else
			lo = mid + 1;
	}
	return 0;
}

/* 1 if some changed path is directly inside dir ("" for the root). */
static int dir_of_one(const char *dir, const char *const *paths, size_t n)
{
	size_t len = strlen(dir);

	for (size_t i = 0; i < n; i++) {
		const char *slash = strrchr(paths[i], '/');
		size_t plen = slash ? (size_t)(slash - paths[i]) : 0;

		if (plen == len && !strncmp(paths[i], dir, len))
			return 1;
	}
	return 0;
}

static fuse_ino_t ino_of(const struct ov_inode *in)
{
	return in->is_root ? FUSE_ROOT_ID : (fuse_ino_t)(uintptr_t)in;
}

static int inval_add(struct inval **v, size_t *n, size_t *cap, fuse_ino_t ino, fuse_ino_t parent,
		     const char *name)
{
	if (*n == *cap) {
		size_t ncap = *cap ? 2 * *cap : 16;
		struct inval *grown = realloc(*v, ncap * sizeof(**v));

		if (!grown)
			return -1;
		*v = grown;
		*cap = ncap;
	}
	(*v)[*n].ino = ino;
	(*v)[*n].parent = parent;
	(*v)[*n].name = name ? strdup(name) : NULL;
	if (name && !(*v)[*n].name)
		return -1;
	(*n)++;
	return 0;
}

void cb_overlay_base_changed(struct cb_overlay *ov, const char *const *paths, size_t n)
{
	struct inval *v = NULL;
	size_t nv = 0, cap = 0;
	char *buf;

	if (!ov || !ov->se || !n)
		return;
	/* Collected under the locks, told to the kernel after: a notification can make the
	 * kernel send requests (forget) that take them. */
	cb_rwlock_read(&ov->tab.ns);
	cb_mutex_lock(&ov->tab.lock);
	for (struct ov_inode *in = ov->tab.all; in; in = in->all_next) {
		if (!in->nlookup && !in->is_root)
			continue;
		if (in->is_root) {
			if (dir_of_one("", paths, n) &&
			    inval_add(&v, &nv, &cap, FUSE_ROOT_ID, 0, NULL))
				break;
			continue;
		}
		for (const struct ov_name *nm = in->names; nm; nm = nm->next) {
			int changed, listing;

			if (ov_path_of_name(&ov->tab, nm, &buf) < 0)
				continue;
			changed = path_in(buf, paths, n);
			listing = S_ISDIR(in->type) && dir_of_one(buf, paths, n);
			free(buf);
			if ((changed || listing) &&
			    inval_add(&v, &nv, &cap, ino_of(in), changed ? ino_of(nm->parent) : 0,
				      changed ? nm->name : NULL))
				goto done;
		}
	}
done:
	cb_mutex_unlock(&ov->tab.lock);
	cb_rwlock_unlock(&ov->tab.ns);
	for (size_t i = 0; i < nv; i++) {
		fuse_lowlevel_notify_inval_inode(ov->se, v[i].ino, 0, 0);
		if (v[i].name)
			fuse_lowlevel_notify_inval_entry(ov->se, v[i].parent, v[i].name,
							 strlen(v[i].name));
		free(v[i].name);
	}
	free(v);
}

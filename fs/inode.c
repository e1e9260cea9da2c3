/* The overlay's inode table: inodes keyed by their identity in the layer that holds them,
 * each with parent pointers and names instead of an fd, so any number of inodes costs no fds.
 *
 * INVARIANTS (asserted in a checked build, util/lock.h):
 *   - t->lock guards the identity hash, every inode's nlookup and refs, and the list of all
 *     inodes. A hashed inode's (dev, rino) is unique in the hash.
 *   - t->ns guards names and parents: a path is built holding either side, a name is removed
 *     or moved only under the write side (and t->lock, for the parent's refs). Appending a
 *     name (a lookup, a link) needs only the read side and t->lock: the first name, the one
 *     paths are built from, never changes that way, and every reader of the whole list holds
 *     t->lock or the write side.
 *   - refs counts the names whose parent is this inode; an inode with nlookup 0 and refs 0 is
 *     reachable from no request and no path, so it is freed (ov_inode_release) under t->lock
 *     alone, and freeing it may leave its parent unreferenced in turn.
 *   - the root is never freed before ov_table_free_all, which runs alone (unmount). */
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <stddef.h>

#include "ov.h"

static size_t ov_hash(dev_t dev, ino_t rino, size_t n)
{
	uint64_t h = (uint64_t)rino * 0x9E3779B97F4A7C15ull ^ (uint64_t)dev * 0xC2B2AE3D27D4EB4Full;
	return (size_t)(h >> 17) & (n - 1);
}

/* An empty table with its locks; returns 0 or -ENOMEM. */
int ov_table_init(struct ov_table *t)
{
	cb_mutex_init(&t->lock, NULL);
	cb_rwlock_init(&t->ns, NULL);
	t->nbuckets = 1024;
	t->count = 0;
	t->all = NULL;
	t->buckets = calloc(t->nbuckets, sizeof(*t->buckets));
	return t->buckets ? 0 : -ENOMEM;
}

static void ov_inode_free(struct ov_table *t, struct ov_inode *in)
{
	struct ov_name *n = in->names, *next;

	if (in->all_prev)
		in->all_prev->all_next = in->all_next;
	else if (t->all == in)
		t->all = in->all_next;
	if (in->all_next)
		in->all_next->all_prev = in->all_prev;

	for (; n; n = next) {
		next = n->next;
		free(n->name);
		free(n);
	}
	if (in->keep_fd >= 0) {
		struct stat st;

		/* the last reference to an unlinked file: its bytes are freed now */
		if (in->quota_deferred && fstat(in->keep_fd, &st) == 0) {
			struct cb_overlay *ov =
			    (struct cb_overlay *)((char *)t - offsetof(struct cb_overlay, tab));

			st.st_nlink = 1;
			ov_quota_gone(ov, &st);
		}
		close(in->keep_fd);
	}
	cb_mutex_destroy(&in->lock);
	free(in);
}

static void ov_table_free(struct ov_table *t)
{
	free(t->buckets);
	t->buckets = NULL;
	t->nbuckets = t->count = 0;
}

/* The inode whose bytes are (dev, rino) in their layer, or NULL. */
struct ov_inode *ov_table_find(struct ov_table *t, dev_t dev, ino_t rino)
{
	struct ov_inode *in;

	CB_ASSERT_HELD(&t->lock);
	in = t->buckets[ov_hash(dev, rino, t->nbuckets)];
	for (; in; in = in->hnext)
		if (in->rino == rino && in->dev == dev)
			return in;
	return NULL;
}

static void ov_table_grow(struct ov_table *t)
{
	size_t n = t->nbuckets * 2, i;
	struct ov_inode **b = calloc(n, sizeof(*b));

	if (!b)
		return; /* longer chains, still correct */
	for (i = 0; i < t->nbuckets; i++) {
		struct ov_inode *in = t->buckets[i], *next;
		for (; in; in = next) {
			size_t h = ov_hash(in->dev, in->rino, n);
			next = in->hnext;
			in->hnext = b[h];
			b[h] = in;
		}
	}
	free(t->buckets);
	t->buckets = b;
	t->nbuckets = n;
}

/* Adds in under its (dev, rino); the key must not be present. Caller holds t->lock. */
void ov_table_insert(struct ov_table *t, struct ov_inode *in)
{
	size_t h;

	CB_ASSERT_HELD(&t->lock);
	if (t->count >= t->nbuckets)
		ov_table_grow(t);
	h = ov_hash(in->dev, in->rino, t->nbuckets);
	in->hnext = t->buckets[h];
	t->buckets[h] = in;
	in->hashed = 1;
	t->count++;
}

/* Takes in out of the hash (its identity changes or it lost its last name); idempotent.
 * Caller holds t->lock. */
void ov_table_remove(struct ov_table *t, struct ov_inode *in)
{
	struct ov_inode **p;

	CB_ASSERT_HELD(&t->lock);
	if (!in->hashed)
		return;
	p = &t->buckets[ov_hash(in->dev, in->rino, t->nbuckets)];
	for (; *p; p = &(*p)->hnext) {
		if (*p == in) {
			*p = in->hnext;
			in->hnext = NULL;
			in->hashed = 0;
			t->count--;
			return;
		}
	}
}

/* A new inode for a file found in layer with stat st (its reported inode number is st's);
 * no names, no references yet. NULL when out of memory. */
struct ov_inode *ov_inode_new(int layer, const struct stat *st)
{
	struct ov_inode *in = calloc(1, sizeof(*in));

	if (!in)
		return NULL;
	atomic_init(&in->layer, layer);
	in->dev = st->st_dev;
	in->rino = st->st_ino;
	in->st_ino = st->st_ino;
	in->type = st->st_mode & S_IFMT;
	in->keep_fd = -1;
	atomic_init(&in->write_gen, 0);
	atomic_init(&in->meta_gen, 0);
	cb_mutex_init(&in->lock, NULL);
	return in;
}

/* Whether in is known under parent/name. Caller holds t->lock. */
int ov_inode_has_name(struct ov_table *t, const struct ov_inode *in, const struct ov_inode *parent,
		      const char *name)
{
	const struct ov_name *n;

	CB_ASSERT_HELD(&t->lock);
	for (n = in->names; n; n = n->next)
		if (n->parent == parent && strcmp(n->name, name) == 0)
			return 1;
	return 0;
}

/* Records parent/name as a name of in (appended: the first name stays the one paths use)
 * and takes a reference on parent. Returns 0 or -ENOMEM. Caller holds t->ns (either side)
 * and t->lock. */
int ov_inode_add_name(struct ov_table *t, struct ov_inode *in, struct ov_inode *parent,
		      const char *name)
{
	struct ov_name *n, **p;

	CB_ASSERT_READING(&t->ns);
	CB_ASSERT_HELD(&t->lock);
	n = calloc(1, sizeof(*n));
	if (!n || !(n->name = strdup(name))) {
		free(n);
		return -ENOMEM;
	}
	n->parent = parent;
	if (parent)
		parent->refs++;
	for (p = &in->names; *p; p = &(*p)->next)
		;
	*p = n;
	return 0;
}

/* Forgets parent/name as a name of in and drops the reference on parent (the caller
 * releases parent if that was the last). Returns 0, or -ENOENT if it was not a name. Caller
 * holds t->ns for writing and t->lock. */
int ov_inode_drop_name(struct ov_table *t, struct ov_inode *in, const struct ov_inode *parent,
		       const char *name)
{
	struct ov_name **p, *n;

	CB_ASSERT_WRITING(&t->ns);
	CB_ASSERT_HELD(&t->lock);
	for (p = &in->names; *p; p = &(*p)->next) {
		n = *p;
		if (n->parent == parent && strcmp(n->name, name) == 0) {
			*p = n->next;
			if (n->parent)
				n->parent->refs--;
			free(n->name);
			free(n);
			return 0;
		}
	}
	return -ENOENT;
}

/* Moves the name oldparent/oldname of in to newparent/newname. Returns 0, -ENOENT if in had
 * no such name, -ENOMEM. Caller holds t->ns for writing and t->lock, and releases oldparent
 * afterwards. */
int ov_inode_rename_name(struct ov_table *t, struct ov_inode *in, struct ov_inode *oldparent,
			 const char *oldname, struct ov_inode *newparent, const char *newname)
{
	struct ov_name *n;
	char *copy;

	CB_ASSERT_WRITING(&t->ns);
	CB_ASSERT_HELD(&t->lock);
	for (n = in->names; n; n = n->next) {
		if (n->parent == oldparent && strcmp(n->name, oldname) == 0)
			break;
	}
	if (!n)
		return -ENOENT;
	copy = strdup(newname);
	if (!copy)
		return -ENOMEM;
	free(n->name);
	n->name = copy;
	if (oldparent)
		oldparent->refs--;
	newparent->refs++;
	n->parent = newparent;
	return 0;
}

/* The layer-relative path of name n, then "/" and child when child is not NULL: a malloc'd
 * string in *out (of any length: a tree can be deeper than PATH_MAX). Returns its length,
 * -ENOMEM, or -ENOENT if a directory on the way has lost its name (removed while referenced). */
static int ov_path_build(const struct ov_name *n, const char *child, char **out)
{
	const struct ov_name *c;
	size_t len = child ? strlen(child) : 0, at;
	char *buf;

	*out = NULL;
	/* first the length, walking up; then the names, written from the end */
	for (c = n; c; c = c->parent->is_root ? NULL : c->parent->names) {
		len += strlen(c->name) + (len ? 1 : 0);
		if (!c->parent->is_root && !c->parent->names)
			return -ENOENT;
	}
	if (len > INT_MAX - 1 || !(buf = malloc(len + 1)))
		return -ENOMEM;
	at = len;
	buf[at] = '\0';
	if (child) {
		at -= strlen(child);
		memcpy(buf + at, child, strlen(child));
	}
	for (c = n; c; c = c->parent->is_root ? NULL : c->parent->names) {
		size_t l = strlen(c->name);

		if (at < len)
			buf[--at] = '/';
		at -= l;
		memcpy(buf + at, c->name, l);
	}
	*out = buf;
	return (int)len;
}

/* The layer-relative path of name n in *out (malloc'd; see ov_path_build). Caller holds
 * t->ns (either side). */
int ov_path_of_name(struct ov_table *t, const struct ov_name *n, char **out)
{
	CB_ASSERT_READING(&t->ns);
	return ov_path_build(n, NULL, out);
}

/* The path of in, or of in's child called child when child is not NULL, malloc'd in *out
 * ("." for the root itself). Returns the length or a negative errno (see ov_path_build).
 * Caller holds t->ns (either side). */
int ov_path(struct ov_table *t, const struct ov_inode *in, const char *child, char **out)
{
	CB_ASSERT_READING(&t->ns);
	*out = NULL;
	if (in->is_root) {
		*out = strdup(child ? child : ".");
		return *out ? (int)strlen(*out) : -ENOMEM;
	}
	if (!in->names)
		return -ENOENT;
	return ov_path_build(in->names, child, out);
}

/* Frees in if nothing refers to it any more (no kernel lookups, no child names), then goes
 * on with parents that this left unreferenced. Caller holds t->lock (see INVARIANTS: an
 * unreferenced inode is out of every other thread's reach, so no ns lock is needed). The
 * root is never freed here. */
void ov_inode_release(struct ov_table *t, struct ov_inode *in)
{
	CB_ASSERT_HELD(&t->lock);
	while (in && !in->is_root && in->nlookup == 0 && in->refs == 0) {
		struct ov_inode *next = NULL;
		struct ov_name *n;

		ov_table_remove(t, in);
		while ((n = in->names)) {
			struct ov_inode *p = n->parent;
			in->names = n->next;
			p->refs--;
			free(n->name);
			free(n);
			if (p->refs == 0 && p->nlookup == 0 && !p->is_root) {
				if (next && next != p)
					ov_inode_release(t, next);
				next = p;
			}
		}
		ov_inode_free(t, in);
		in = next;
	}
}

/* Frees every inode left, hashed or not, the table and its locks (unmount: nothing else runs). */
void ov_table_free_all(struct ov_table *t)
{
	while (t->all)
		ov_inode_free(t, t->all);
	ov_table_free(t);
	cb_rwlock_destroy(&t->ns);
	cb_mutex_destroy(&t->lock);
}

/* Puts a new inode on the list of all inodes, which ov_table_free_all frees. Caller holds
 * t->lock. */
void ov_table_track(struct ov_table *t, struct ov_inode *in)
{
	CB_ASSERT_HELD(&t->lock);
	in->all_prev = NULL;
	in->all_next = t->all;
	if (t->all)
		t->all->all_prev = in;
	t->all = in;
}
